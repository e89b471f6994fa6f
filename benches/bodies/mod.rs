//! The response bodies the decode and meter benchmarks feed: one per
//! metered API, each as the socket reads delivered it.
//!
//! Where a real capture exists (`tests/fixtures/real`, recorded from a
//! real llama-server or llama-cpp-python with a raw-socket client), its
//! `body_b64` reads are used as they were recorded: real JSON shapes, real
//! read boundaries. Ollama and TGI have no real capture (no Ollama or TGI
//! server can be installed here, see `scripts/real-llm-server`), so their bodies
//! come from the in-process simulator (`speedtap::simulate::SimServer`, the
//! same wire writers `speedtap simulate` uses), read frame by frame with a
//! hyper client: one token per read, which is how those servers write at
//! ordinary speeds.
//!
//! A directory module so cargo does not take it for a bench target; each
//! bench declares `mod bodies;`.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use speedtap::decode::detect::BodyFraming;
use speedtap::model::ApiKind;
use speedtap::simulate::{SimConfig, SimServer};

/// One response body, ready to feed to a `StreamDecoder`.
pub struct Body {
    pub api: ApiKind,
    pub framing: BodyFraming,
    /// The request's model (a hint for inline-think handling).
    pub model: &'static str,
    /// Where it came from, for the report: `real llama-server/NAME` or
    /// `simulator`.
    pub source: String,
    /// The body as the reads delivered it; concatenated, the whole body.
    pub reads: Vec<Vec<u8>>,
}

impl Body {
    /// Body bytes in total.
    pub fn len(&self) -> usize {
        self.reads.iter().map(Vec::len).sum()
    }

    /// The whole body in one piece.
    pub fn whole(&self) -> Vec<u8> {
        self.reads.concat()
    }
}

/// Real captures, one per API that has one. The longest streamed capture of
/// each API was picked, so per-call fixed costs weigh least.
const REAL: [(ApiKind, BodyFraming, &str, &str); 5] = [
    (
        ApiKind::OpenaiChat,
        BodyFraming::Sse,
        "llama-server",
        "chat_stream_200tok",
    ),
    (
        ApiKind::OpenaiCompletions,
        BodyFraming::Sse,
        "llama-cpp-python",
        "completions_stream_200tok",
    ),
    (
        ApiKind::OpenaiResponses,
        BodyFraming::Sse,
        "llama-server",
        "responses_stream",
    ),
    (
        ApiKind::AnthropicMessages,
        BodyFraming::Sse,
        "llama-server",
        "anthropic_messages_stream",
    ),
    (
        ApiKind::LlamacppCompletion,
        BodyFraming::Sse,
        "llama-server",
        "native_completion_stream",
    ),
];

/// Simulated bodies for the APIs without a real capture: (api, framing,
/// path, request body).
const SIMULATED: [(ApiKind, BodyFraming, &str, &str); 3] = [
    (
        ApiKind::OllamaChat,
        BodyFraming::Ndjson,
        "/api/chat",
        r#"{"model":"bench","messages":[{"role":"user","content":"hi"}],"stream":true}"#,
    ),
    (
        ApiKind::OllamaGenerate,
        BodyFraming::Ndjson,
        "/api/generate",
        r#"{"model":"bench","prompt":"hi","stream":true}"#,
    ),
    (
        ApiKind::TgiGenerate,
        BodyFraming::Sse,
        "/generate_stream",
        r#"{"inputs":"hi","parameters":{"max_new_tokens":200}}"#,
    ),
];

/// Tokens per simulated body: about the size of the real 200-token
/// captures.
const SIM_TOKENS: u64 = 200;

pub fn fixtures_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/real")
}

/// Every benchmark body: the real ones, then the simulated ones, in
/// `ApiKind::METERED` order.
pub fn corpus() -> Vec<Body> {
    let mut all: Vec<Body> = REAL
        .iter()
        .map(|&(api, framing, set, name)| Body {
            api,
            framing,
            model: "SmolLM2-135M-Instruct",
            source: format!("real {set}/{name}"),
            reads: capture_reads(set, name),
        })
        .collect();
    all.extend(simulated());
    all.sort_by_key(|b| ApiKind::METERED.iter().position(|k| *k == b.api));
    all
}

/// A capture's body reads (`body_b64` of each `NAME.chunks.jsonl` line),
/// empty reads (head-only reads) dropped.
pub fn capture_reads(set: &str, name: &str) -> Vec<Vec<u8>> {
    let path = fixtures_root()
        .join(set)
        .join(format!("{name}.chunks.jsonl"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (the captures live in tests/fixtures/real)",
            path.display()
        )
    });
    let b64 = base64::engine::general_purpose::STANDARD;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let row: serde_json::Value = serde_json::from_str(l).expect("chunk line parses");
            b64.decode(row["body_b64"].as_str().expect("body_b64"))
                .expect("body_b64 decodes")
        })
        .filter(|r| !r.is_empty())
        .collect()
}

/// Records the simulated bodies from an in-process simulator, as fast as
/// it writes (no first-token wait, a very high rate): the bytes and the
/// frame boundaries do not depend on the schedule.
fn simulated() -> Vec<Body> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(async {
        let sim = SimServer::start("127.0.0.1:0", SimConfig::default())
            .await
            .expect("simulator starts");
        let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
        let mut out = Vec::new();
        for &(api, framing, path, request) in &SIMULATED {
            let req = http::Request::post(format!("{}{path}", sim.base_url()))
                .header("content-type", "application/json")
                .header("x-sim-ttft-ms", "0")
                .header("x-sim-tps", "1000000")
                .header("x-sim-tokens", SIM_TOKENS.to_string())
                .header("x-sim-usage", "true")
                .header("x-sim-server-timings", "true")
                .body(Full::new(Bytes::from_static(request.as_bytes())))
                .expect("request");
            let resp = client.request(req).await.expect("simulator answers");
            assert!(resp.status().is_success(), "{path}: {}", resp.status());
            let mut body = resp.into_body();
            let mut reads = Vec::new();
            while let Some(frame) = body.frame().await {
                if let Ok(data) = frame.expect("body frame").into_data() {
                    reads.push(data.to_vec());
                }
            }
            out.push(Body {
                api,
                framing,
                model: "bench",
                source: format!("simulator {path}, {SIM_TOKENS} tokens"),
                reads,
            });
        }
        sim.shutdown().await;
        out
    })
}
