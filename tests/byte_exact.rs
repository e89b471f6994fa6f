//! Byte-exactness at scale: 10,000 randomized responses streamed through
//! the proxy (an in-process engine with one route), each compared byte for
//! byte with what the upstream wrote, and each call checked settled with
//! the status it deserves.
//!
//! The responses cover the 8 APIs the decoders know (hand-built bodies in
//! each protocol's wire format, with multi-byte UTF-8 text, `\n` or `\r\n`
//! SSE line ends), unknown paths, garbage bodies under metered paths with
//! unknown content types or an SSE content type, and error statuses. Each
//! is cut into frames at random points, biased to fall inside UTF-8 code
//! points and inside `\r\n`, written as chunks (sometimes with the chunk's
//! own framing split across writes), as a Content-Length body, or as an
//! HTTP/1.0 close-delimited body, with random yields and 1 ms pauses
//! between frames. A handful carry a single 10 MiB line.
//!
//! The run is deterministic for a seed: `BYTE_EXACT_SEED=<n>` replays one;
//! the seed in use is printed at the start and in every failure.
//!
//! Calls are checked in batches of 1,000 because the engine keeps the most
//! recent 2,000 calls; each call is found by its client name (the
//! `User-Agent` product `bx-<case>`).

// The 80-line limit is for product code; a test may read as one long script.
#![allow(clippy::too_many_lines)]
#![allow(clippy::unwrap_used)] // a test (or bench) may unwrap: a panic is its failure report

mod util;

use util::{proxy as proxy_support, wire};

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use speedtap::model::{CallStatus, CallsQuery, EngineQueries};

use speedtap::host::RunningEngine;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;

use wire::{Conn, RawUpstream};

const CASES: usize = 10_000;
const BATCH: usize = 1_000;
/// Client connections streaming at once.
const WORKERS: usize = 64;
/// Cases that carry one 10 MiB line.
const HUGE: [usize; 4] = [17, 2_503, 5_011, 9_973];
const HUGE_LINE: usize = 10 * 1024 * 1024;
const DEFAULT_SEED: u64 = 0x5eed_b17e_e8ac_7001;

/// SplitMix64: small, fast, and the same everywhere.
#[derive(Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// Words as they appear inside a JSON string: multi-byte code points,
/// escapes, and plain words.
const WORDS: &[&str] = &[
    " the",
    " quick",
    " café",
    " naïve",
    " 日本語",
    " 🦀",
    " Ωμέγα",
    " ünïcödé",
    "\\n",
    " \\\"q\\\"",
    " a\\u00e9",
    " 😀👍",
    " ok",
    ",",
];

fn text(rng: &mut Rng, words: usize) -> String {
    (0..words).map(|_| *rng.pick(WORDS)).collect()
}

/// How the upstream frames the body on the wire.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Framing {
    Chunked,
    Length,
    /// HTTP/1.0, body delimited by closing the connection.
    Close,
}

/// The status a case's call must end with.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Expect {
    Ok,
    Unmetered,
    UpstreamError,
    /// Settled, but not `ok` (a garbage stream has no terminal marker).
    NotOk,
}

/// One scripted exchange.
struct Case {
    path: &'static str,
    request: String,
    status: u16,
    content_type: String,
    body: Vec<u8>,
    /// Split points into `body`, ascending, excluding 0 and the length.
    splits: Vec<usize>,
    framing: Framing,
    /// Per frame: 0 nothing, 1 yield, 2 sleep 1 ms.
    pauses: Vec<u8>,
    /// Chunked only: write a chunk's framing and data separately.
    split_chunk_writes: bool,
    expect: Expect,
}

/// One protocol's stream: path, request body, content type, events.
fn protocol_stream(
    rng: &mut Rng,
    api: usize,
    model: &str,
    huge: bool,
) -> (&'static str, String, String, Vec<u8>) {
    let eol = if rng.chance(0.3) { "\r\n" } else { "\n" };
    let n = if rng.chance(0.1) {
        1 + rng.below(400)
    } else {
        rng.below(40)
    };
    let piece = |rng: &mut Rng, i: usize| -> String {
        if huge && i == 0 {
            let mut t = String::with_capacity(HUGE_LINE);
            while t.len() < HUGE_LINE {
                let word = *rng.pick(WORDS);
                t.push_str(word);
            }
            t
        } else {
            let words = 1 + rng.below(4);
            text(rng, words)
        }
    };
    let n = if huge { n.max(1) } else { n };
    let sse = |events: Vec<String>| -> Vec<u8> {
        let mut out = String::new();
        for e in events {
            for line in e.split('\n') {
                out.push_str(line);
                out.push_str(eol);
            }
            out.push_str(eol);
        }
        out.into_bytes()
    };
    let ndjson = |lines: Vec<String>| -> Vec<u8> {
        let mut out = String::new();
        for l in lines {
            out.push_str(&l);
            out.push('\n');
        }
        out.into_bytes()
    };
    let sse_ct = if rng.chance(0.5) {
        "text/event-stream"
    } else {
        "text/event-stream; charset=utf-8"
    }
    .to_owned();
    match api {
        0 => {
            let mut ev = vec![
                r#"data: {"choices":[{"index":0,"delta":{"role":"assistant","content":null}}]}"#
                    .to_owned(),
            ];
            for i in 0..n {
                let t = piece(rng, i);
                ev.push(format!(r#"data: {{"choices":[{{"index":0,"delta":{{"content":"{t}"}},"finish_reason":null}}]}}"#));
            }
            ev.push(
                r#"data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#.to_owned(),
            );
            if rng.chance(0.5) {
                ev.push(format!(r#"data: {{"choices":[],"usage":{{"prompt_tokens":3,"completion_tokens":{n},"total_tokens":{}}}}}"#, n + 3));
            }
            ev.push("data: [DONE]".to_owned());
            (
                "/v1/chat/completions",
                format!(r#"{{"model":"{model}","stream":true,"messages":[]}}"#),
                sse_ct,
                sse(ev),
            )
        }
        1 => {
            let mut ev = Vec::new();
            for i in 0..n {
                let t = piece(rng, i);
                ev.push(format!(
                    r#"data: {{"choices":[{{"text":"{t}","index":0,"finish_reason":null}}]}}"#
                ));
            }
            ev.push(
                r#"data: {"choices":[{"text":"","index":0,"finish_reason":"stop"}]}"#.to_owned(),
            );
            ev.push("data: [DONE]".to_owned());
            (
                "/v1/completions",
                format!(r#"{{"model":"{model}","stream":true,"prompt":"x"}}"#),
                sse_ct,
                sse(ev),
            )
        }
        2 => {
            let mut ev = vec![r#"event: response.created
data: {"type":"response.created","response":{"id":"resp_1","status":"in_progress"}}"#
                .to_owned()];
            for i in 0..n {
                let t = piece(rng, i);
                ev.push(format!("event: response.output_text.delta\ndata: {{\"type\":\"response.output_text.delta\",\"delta\":\"{t}\"}}"));
            }
            ev.push(
                r#"event: response.completed
data: {"type":"response.completed","response":{"id":"resp_1","status":"completed"}}"#
                    .to_owned(),
            );
            (
                "/v1/responses",
                format!(r#"{{"model":"{model}","stream":true,"input":"x"}}"#),
                sse_ct,
                sse(ev),
            )
        }
        3 => {
            let mut ev = vec![
                r#"event: message_start
data: {"type":"message_start","message":{"id":"msg_1","role":"assistant","content":[],"usage":{"input_tokens":3,"output_tokens":1}}}"#.to_owned(),
                r#"event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#.to_owned(),
            ];
            for i in 0..n {
                let t = piece(rng, i);
                ev.push(format!("event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":\"{t}\"}}}}"));
            }
            ev.push(
                "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}"
                    .to_owned(),
            );
            ev.push("event: message_stop\ndata: {\"type\":\"message_stop\"}".to_owned());
            (
                "/v1/messages",
                format!(r#"{{"model":"{model}","stream":true,"max_tokens":64,"messages":[]}}"#),
                sse_ct,
                sse(ev),
            )
        }
        4 => {
            let mut lines = Vec::new();
            for i in 0..n {
                let t = piece(rng, i);
                lines.push(format!(r#"{{"model":"{model}","message":{{"role":"assistant","content":"{t}"}},"done":false}}"#));
            }
            lines.push(format!(r#"{{"model":"{model}","message":{{"role":"assistant","content":""}},"done":true,"eval_count":{n}}}"#));
            (
                "/api/chat",
                format!(r#"{{"model":"{model}","messages":[]}}"#),
                "application/x-ndjson".to_owned(),
                ndjson(lines),
            )
        }
        5 => {
            let mut lines = Vec::new();
            for i in 0..n {
                let t = piece(rng, i);
                lines.push(format!(
                    r#"{{"model":"{model}","response":"{t}","done":false}}"#
                ));
            }
            lines.push(format!(
                r#"{{"model":"{model}","response":"","done":true}}"#
            ));
            (
                "/api/generate",
                format!(r#"{{"model":"{model}","prompt":"x"}}"#),
                "application/x-ndjson".to_owned(),
                ndjson(lines),
            )
        }
        6 => {
            let mut ev = Vec::new();
            for i in 0..n {
                let t = piece(rng, i);
                ev.push(format!(
                    r#"data: {{"index":0,"content":"{t}","stop":false}}"#
                ));
            }
            ev.push(r#"data: {"index":0,"content":"","stop":true}"#.to_owned());
            (
                "/completion",
                format!(r#"{{"model":"{model}","prompt":"x","stream":true}}"#),
                sse_ct,
                sse(ev),
            )
        }
        _ => {
            let mut ev = Vec::new();
            for i in 0..n {
                let t = piece(rng, i);
                ev.push(format!(r#"data:{{"index":{i},"token":{{"id":1,"text":"{t}","logprob":0.0,"special":false}},"generated_text":null,"details":null}}"#));
            }
            ev.push(format!(r#"data:{{"index":{n},"token":{{"id":2,"text":"","logprob":0.0,"special":true}},"generated_text":"x","details":{{"finish_reason":"eos_token","generated_tokens":{n}}}}}"#));
            (
                "/generate_stream",
                format!(r#"{{"inputs":"x","model":"{model}"}}"#),
                sse_ct,
                sse(ev),
            )
        }
    }
}

fn garbage(rng: &mut Rng, huge: bool) -> Vec<u8> {
    let len = if huge {
        HUGE_LINE
    } else if rng.chance(0.05) {
        rng.below(1 << 20)
    } else {
        rng.below(4096)
    };
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        let x = rng.next().to_le_bytes();
        out.extend_from_slice(&x[..(len - out.len()).min(8)]);
    }
    if huge {
        // One line: no line breaks at all.
        for b in &mut out {
            if *b == b'\n' || *b == b'\r' {
                *b = b'x';
            }
        }
    }
    out
}

/// Split points: some uniform, some just inside a multi-byte code point,
/// some between `\r` and `\n`.
fn splits(rng: &mut Rng, body: &[u8]) -> Vec<usize> {
    if body.len() < 2 {
        return Vec::new();
    }
    let mut out = Vec::new();
    let big = body.len() > 256 * 1024;
    if big {
        // Large bodies: frames of 1 KiB to 256 KiB.
        let mut at = 0;
        loop {
            at += 1024 + rng.below(255 * 1024);
            if at >= body.len() {
                break;
            }
            out.push(at);
        }
    }
    let k = rng.below(1 + body.len().min(32));
    for _ in 0..k {
        let at = 1 + rng.below(body.len() - 1);
        let at = match rng.below(3) {
            // Inside a code point: just after a lead byte.
            0 => body[at..]
                .iter()
                .position(|b| *b >= 0xC0)
                .map_or(at, |p| at + p + 1),
            // Inside `\r\n`.
            1 => body[at..]
                .windows(2)
                .position(|w| w == b"\r\n")
                .map_or(at, |p| at + p + 1),
            _ => at,
        };
        if at > 0 && at < body.len() {
            out.push(at);
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

const GARBAGE_TYPES: &[&str] = &[
    "application/octet-stream",
    "text/plain",
    "image/png",
    "text/html; charset=utf-8",
    "application/x-garbage",
];

const UNKNOWN_PATHS: &[&str] = &["/v1/models", "/api/tags", "/health", "/v1/embeddings", "/"];

fn case(rng: &mut Rng, i: usize) -> Case {
    let huge = HUGE.contains(&i);
    let model = format!("m{}", rng.below(5));
    let kind = rng.below(100);
    let (path, request, status, content_type, body, expect) = if huge {
        match i % 4 {
            0 => {
                let (p, r, ct, b) = protocol_stream(rng, 0, &model, true);
                (p, r, 200, ct, b, Expect::Ok)
            }
            1 => {
                let (p, r, ct, b) = protocol_stream(rng, 4, &model, true);
                (p, r, 200, ct, b, Expect::Ok)
            }
            2 => {
                let (p, r, ct, b) = protocol_stream(rng, 6, &model, true);
                (p, r, 200, ct, b, Expect::Ok)
            }
            _ => (
                "/v1/chat/completions",
                format!(r#"{{"model":"{model}","stream":true}}"#),
                200,
                "application/octet-stream".to_owned(),
                garbage(rng, true),
                Expect::Unmetered,
            ),
        }
    } else if kind < 80 {
        let api = rng.below(8);
        let (p, r, ct, b) = protocol_stream(rng, api, &model, false);
        (p, r, 200, ct, b, Expect::Ok)
    } else if kind < 87 {
        // A metered path, a body nobody decodes.
        (
            "/v1/chat/completions",
            format!(r#"{{"model":"{model}","stream":true}}"#),
            200,
            rng.pick(GARBAGE_TYPES).to_string(),
            garbage(rng, false),
            Expect::Unmetered,
        )
    } else if kind < 92 {
        (
            *rng.pick(UNKNOWN_PATHS),
            "{}".to_owned(),
            200,
            rng.pick(GARBAGE_TYPES).to_string(),
            garbage(rng, false),
            Expect::Unmetered,
        )
    } else if kind < 96 {
        // Garbage that claims to be SSE: metered, never complete.
        let mut b = garbage(rng, false);
        b.retain(|c| *c != b':');
        (
            "/v1/chat/completions",
            format!(r#"{{"model":"{model}","stream":true}}"#),
            200,
            "text/event-stream".to_owned(),
            b,
            Expect::NotOk,
        )
    } else {
        let status = *rng.pick(&[400u16, 404, 429, 500, 503]);
        (
            "/v1/chat/completions",
            format!(r#"{{"model":"{model}","stream":true}}"#),
            status,
            "application/json".to_owned(),
            format!(
                r#"{{"error":{{"message":"fail{}","code":{status}}}}}"#,
                text(rng, 3)
            )
            .into_bytes(),
            Expect::UpstreamError,
        )
    };
    let splits = splits(rng, &body);
    let framing = match rng.below(10) {
        0..=6 => Framing::Chunked,
        7 | 8 => Framing::Length,
        _ => Framing::Close,
    };
    let pauses = (0..=splits.len())
        .map(|_| match rng.below(100) {
            0..=4 => 2,
            5..=49 => 1,
            _ => 0,
        })
        .collect();
    Case {
        path,
        request,
        status,
        content_type,
        body,
        splits,
        framing,
        pauses,
        split_chunk_writes: rng.chance(0.1),
        expect,
    }
}

impl Case {
    fn frames(&self) -> impl Iterator<Item = &[u8]> + '_ {
        let mut bounds = vec![0];
        bounds.extend_from_slice(&self.splits);
        bounds.push(self.body.len());
        (0..bounds.len() - 1)
            .map(move |i| &self.body[bounds[i]..bounds[i + 1]])
            .filter(|f| !f.is_empty())
    }
}

/// Writes case `c` as a response on `conn`. Returns false when the
/// connection must close afterwards.
async fn respond(conn: &mut Conn, c: &Case) -> std::io::Result<bool> {
    let reason = if c.status == 200 { "OK" } else { "Status" };
    let version = if c.framing == Framing::Close {
        "1.0"
    } else {
        "1.1"
    };
    let mut head = format!(
        "HTTP/{version} {} {reason}\r\nContent-Type: {}\r\n",
        c.status, c.content_type
    );
    match c.framing {
        Framing::Chunked => head.push_str("Transfer-Encoding: chunked\r\n"),
        Framing::Length => head.push_str(&format!("Content-Length: {}\r\n", c.body.len())),
        Framing::Close => {}
    }
    head.push_str("\r\n");
    conn.write(head.as_bytes()).await?;
    for (i, frame) in c.frames().enumerate() {
        match c.framing {
            Framing::Chunked if c.split_chunk_writes => {
                let size = format!("{:x}\r", frame.len());
                conn.write(size.as_bytes()).await?;
                let mut rest = b"\n".to_vec();
                rest.extend_from_slice(frame);
                rest.push(b'\r');
                conn.write(&rest).await?;
                conn.write(b"\n").await?;
            }
            Framing::Chunked => conn.chunk(frame).await?,
            _ => conn.write(frame).await?,
        }
        match c.pauses.get(i) {
            Some(2) => tokio::time::sleep(Duration::from_millis(1)).await,
            Some(1) => tokio::task::yield_now().await,
            _ => {}
        }
    }
    match c.framing {
        Framing::Chunked => {
            conn.write(b"0\r\n\r\n").await?;
            Ok(true)
        }
        Framing::Length => Ok(true),
        Framing::Close => Ok(false),
    }
}

async fn upstream(cases: Arc<Vec<Case>>) -> RawUpstream {
    RawUpstream::start(move |mut conn| {
        let cases = cases.clone();
        async move {
            while let Some(req) = conn.head().await {
                let _ = conn.body(&req).await;
                let Some(i) = req.header("x-case").and_then(|v| v.parse::<usize>().ok()) else {
                    return;
                };
                match respond(&mut conn, &cases[i]).await {
                    Ok(true) => {}
                    _ => return,
                }
            }
        }
    })
    .await
}

/// Streams cases `range` over one keep-alive connection, checking bytes.
async fn client(addr: std::net::SocketAddr, cases: Arc<Vec<Case>>, todo: Vec<usize>, seed: u64) {
    let mut conn = Conn::connect(addr).await;
    let mut prev = None;
    for i in todo {
        let c = &cases[i];
        let ua = format!("bx-{i}/1.0");
        let case_no = i.to_string();
        let req = wire::post(
            addr,
            c.path,
            &c.request,
            &[("User-Agent", &ua), ("X-Case", &case_no)],
        );
        conn.write(&req)
            .await
            .unwrap_or_else(|e| panic!("seed {seed:#x} case {i}: write: {e}"));
        let head = conn
            .head()
            .await
            .unwrap_or_else(|| {
                panic!(
                    "seed {seed:#x} case {i}: no response head ({} {:?} {} {} bytes; previous case {prev:?})",
                    c.path, c.framing, c.status, c.body.len()
                )
            });
        assert_eq!(head.status(), c.status, "seed {seed:#x} case {i}: {head:?}");
        let body = conn.body(&head).await;
        assert!(
            body.complete,
            "seed {seed:#x} case {i}: body cut ({:?})",
            c.framing
        );
        if body.bytes != c.body {
            let at = body
                .bytes
                .iter()
                .zip(&c.body)
                .position(|(a, b)| a != b)
                .unwrap_or(body.bytes.len().min(c.body.len()));
            panic!(
                "seed {seed:#x} case {i}: bytes differ at offset {at} (got {} bytes, sent {}; {:?}, {} frames)",
                body.bytes.len(),
                c.body.len(),
                c.framing,
                c.splits.len() + 1
            );
        }
        prev = Some((i, c.path, c.framing, c.status, c.content_type.clone()));
    }
}

/// Waits until every case in `batch` has a settled call, then checks each
/// status against the case's expectation.
async fn check_batch(
    engine: &RunningEngine,
    cases: &[Case],
    batch: std::ops::Range<usize>,
    seed: u64,
) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let calls = engine
            .handle
            .calls(CallsQuery {
                limit: 2 * BATCH,
                route: None,
                unmetered: true,
            })
            .await;
        let by_client: HashMap<String, CallStatus> = calls
            .iter()
            .filter_map(|c| c.details.client.clone().map(|n| (n, c.status)))
            .collect();
        let missing: Vec<usize> = batch
            .clone()
            .filter(|i| {
                !by_client
                    .get(&format!("bx-{i}"))
                    .is_some_and(|s| s.is_settled())
            })
            .collect();
        if missing.is_empty() {
            for i in batch.clone() {
                let status = by_client[&format!("bx-{i}")];
                let c = &cases[i];
                let fits = match c.expect {
                    Expect::Ok => status == CallStatus::Ok,
                    Expect::Unmetered => status == CallStatus::Unmetered,
                    Expect::UpstreamError => status == CallStatus::UpstreamError,
                    Expect::NotOk => {
                        matches!(status, CallStatus::Abandoned | CallStatus::UpstreamError)
                    }
                };
                assert!(
                    fits,
                    "seed {seed:#x} case {i} ({} {}): expected {:?}, call ended {status:?}",
                    c.path, c.content_type, c.expect
                );
            }
            return;
        }
        assert!(
            Instant::now() < deadline,
            "seed {seed:#x}: {} calls of batch {batch:?} never settled, e.g. case {}",
            missing.len(),
            missing[0]
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_random_streams_arrive_byte_exact() {
    let seed = std::env::var("BYTE_EXACT_SEED")
        .ok()
        .and_then(|s| {
            let s = s.trim_start_matches("0x");
            u64::from_str_radix(s, 16).ok()
        })
        .unwrap_or(DEFAULT_SEED);
    eprintln!("byte_exact: seed {seed:#x} (BYTE_EXACT_SEED={seed:x} replays it)");
    let t0 = std::time::Instant::now();
    let mut rng = Rng(seed);
    let cases: Arc<Vec<Case>> = Arc::new((0..CASES).map(|i| case(&mut rng, i)).collect());
    let bytes: usize = cases.iter().map(|c| c.body.len()).sum();
    let frames: usize = cases.iter().map(|c| c.splits.len() + 1).sum();

    let up = upstream(cases.clone()).await;
    let engine = proxy_support::engine_with(&up.url(), |o| {
        // Words, not BPE: this test is about bytes, and a 10 MiB line
        // through o200k in a debug build would dominate its run time.
        o.estimator = Arc::new(speedtap::tokens::WordCounter);
        o.metering_threads = 2;
    })
    .await;
    let addr = engine.routes[0].listen;

    for start in (0..CASES).step_by(BATCH) {
        let batch = start..(start + BATCH).min(CASES);
        let mut set = JoinSet::new();
        let slots = Arc::new(Semaphore::new(WORKERS));
        // Each worker takes every WORKERS-th case of the batch.
        for w in 0..WORKERS {
            let todo: Vec<usize> = batch.clone().skip(w).step_by(WORKERS).collect();
            let cases = cases.clone();
            let permit = slots.clone().acquire_owned().await.unwrap();
            set.spawn(async move {
                client(addr, cases, todo, seed).await;
                drop(permit);
            });
        }
        while let Some(done) = set.join_next().await {
            if let Err(e) = done {
                std::panic::resume_unwind(e.into_panic());
            }
        }
        check_batch(&engine, &cases, batch, seed).await;
    }
    eprintln!(
        "byte_exact: {CASES} streams, {} MiB in {frames} frames, in {:.1?}",
        bytes / (1024 * 1024),
        t0.elapsed()
    );
    engine.shutdown(Duration::from_secs(1)).await;
}
