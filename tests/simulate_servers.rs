//! The simulator behaves like the servers speedtap polls: Ollama's model
//! residency (`/api/ps`, `load_duration`, keep-alive expiry, cutting an
//! over-long prompt) and llama-server's slots (`/slots` prefill progress,
//! the FIFO queue, `/props`, `/metrics`, the context refusal, draft counts).
//!
//! Every test runs the server in-process on a paused tokio clock: time only
//! moves when every task waits, so each wait, load and expiry lands on its
//! exact scheduled instant and the assertions are equalities, not bounds.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use speedtap::simulate::{Overflow, SimConfig, SimServer};
use tokio::net::TcpStream;
use tokio::time::{sleep, sleep_until, Instant};

const MS: Duration = Duration::from_millis(1);

/// One exchange: status, body text, and when the first and last body
/// frames arrived after the request was sent.
#[derive(Debug)]
struct Reply {
    status: u16,
    body: String,
    first_frame: Duration,
    last_frame: Duration,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).expect("JSON body")
    }

    /// The last NDJSON line (Ollama's `done: true`).
    fn last_line(&self) -> Value {
        let line = self.body.lines().last().expect("a line");
        serde_json::from_str(line).expect("JSON line")
    }

    /// The last SSE `data:` payload that is JSON.
    fn last_sse_json(&self) -> Value {
        self.body
            .split("\n\n")
            .filter_map(|b| b.strip_prefix("data: "))
            .filter_map(|d| serde_json::from_str::<Value>(d).ok())
            .last()
            .expect("an SSE JSON event")
    }
}

async fn call(
    addr: SocketAddr,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Reply {
    let stream = TcpStream::connect(addr).await.unwrap();
    stream.set_nodelay(true).unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "127.0.0.1");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(Full::new(Bytes::from(body.to_owned()))).unwrap();
    let t0 = Instant::now();
    let response = sender.send_request(req).await.unwrap();
    let status = response.status().as_u16();
    let mut body = response.into_body();
    let mut text = Vec::new();
    let (mut first, mut last) = (None, Duration::ZERO);
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.unwrap().into_data() {
            first.get_or_insert(t0.elapsed());
            last = t0.elapsed();
            text.extend_from_slice(&data);
        }
    }
    Reply {
        status,
        body: String::from_utf8(text).unwrap(),
        first_frame: first.unwrap_or(last),
        last_frame: last,
    }
}

async fn post(addr: SocketAddr, path: &str, headers: &[(&str, &str)], body: &str) -> Reply {
    call(addr, Method::POST, path, headers, body).await
}

async fn get(addr: SocketAddr, path: &str) -> Value {
    let reply = call(addr, Method::GET, path, &[], "").await;
    assert_eq!(reply.status, 200, "{path}: {}", reply.body);
    reply.json()
}

async fn metric(addr: SocketAddr, name: &str) -> f64 {
    let reply = call(addr, Method::GET, "/metrics", &[], "").await;
    let prefix = format!("llamacpp:{name} ");
    reply
        .body
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("{name} missing from {}", reply.body))
        .parse()
        .unwrap()
}

/// A short, fast script so only the behaviour under test takes time:
/// base ttft 100 ms, 10 tokens at 100 tok/s (first at 100 ms, last at
/// 190 ms after the prompt is done).
fn config() -> SimConfig {
    SimConfig {
        ttft: Duration::from_millis(100),
        tokens_per_second: 100.0,
        tokens: 10,
        ..SimConfig::default()
    }
}

async fn start(config: SimConfig) -> (SimServer, SocketAddr) {
    let server = SimServer::start("127.0.0.1:0", config).await.unwrap();
    let addr = server.local_addr();
    (server, addr)
}

const CHAT: &str = r#"{"model":"qwen3:8b","messages":[]}"#;

#[tokio::test(start_paused = true)]
async fn a_model_is_listed_by_api_ps_only_once_its_load_time_has_passed() {
    let (_server, addr) = start(SimConfig {
        load_time: Duration::from_secs(3),
        ..config()
    })
    .await;
    assert_eq!(get(addr, "/api/ps").await["models"], Value::Array(vec![]));
    let t0 = Instant::now();
    let first_call = tokio::spawn(post(addr, "/api/chat", &[], CHAT));
    sleep_until(t0 + Duration::from_secs(2)).await;
    assert_eq!(
        get(addr, "/api/ps").await["models"],
        Value::Array(vec![]),
        "still loading"
    );
    sleep_until(t0 + Duration::from_secs(3)).await;
    let raw = call(addr, Method::GET, "/api/ps", &[], "").await.body;
    // api/types.go ProcessModelResponse field order.
    let at: Vec<usize> = [
        "name",
        "model",
        "size",
        "digest",
        "details",
        "expires_at",
        "size_vram",
        "context_length",
    ]
    .iter()
    .map(|k| {
        raw.find(&format!("\"{k}\":"))
            .unwrap_or_else(|| panic!("{k}: {raw}"))
    })
    .collect();
    assert!(at.windows(2).all(|w| w[0] < w[1]), "{raw}");
    let ps: Value = serde_json::from_str(&raw).unwrap();
    let m = &ps["models"][0];
    assert_eq!(m["name"], "qwen3:8b");
    assert_eq!(m["size"], m["size_vram"], "all on the GPU by default");
    assert_eq!(m["context_length"], 131_072);
    let reply = first_call.await.unwrap();
    // TTFT = load 3 s + base ttft 100 ms.
    assert_eq!(reply.first_frame, Duration::from_millis(3100));
    assert_eq!(reply.last_line()["load_duration"], 3_000_000_000u64);
}

#[tokio::test(start_paused = true)]
async fn a_model_expires_after_keep_alive_and_the_next_call_loads_it_again() {
    let (_server, addr) = start(SimConfig {
        load_time: Duration::from_secs(2),
        keep_alive: Some(Duration::from_secs(10)),
        ..config()
    })
    .await;
    let cold = post(addr, "/api/chat", &[], CHAT).await;
    assert_eq!(cold.first_frame, Duration::from_millis(2100));
    let ended = Instant::now();
    let warm = post(addr, "/api/chat", &[], CHAT).await;
    assert_eq!(
        warm.first_frame,
        Duration::from_millis(100),
        "warm: no load"
    );
    assert!(warm.last_line().get("load_duration").is_none());
    let ended = ended.max(Instant::now());
    sleep_until(ended + Duration::from_millis(9_999)).await;
    assert_eq!(get(addr, "/api/ps").await["models"][0]["name"], "qwen3:8b");
    sleep_until(ended + Duration::from_secs(10)).await;
    assert_eq!(get(addr, "/api/ps").await["models"], Value::Array(vec![]));
    let again = post(addr, "/api/chat", &[], CHAT).await;
    assert_eq!(
        again.first_frame,
        Duration::from_millis(2100),
        "loads again"
    );
    assert_eq!(again.last_line()["load_duration"], 2_000_000_000u64);
}

#[tokio::test(start_paused = true)]
async fn a_request_keep_alive_of_zero_unloads_the_model_when_its_call_ends() {
    let (_server, addr) = start(config()).await;
    let body = r#"{"model":"m","keep_alive":0}"#;
    post(addr, "/api/generate", &[], body).await;
    assert_eq!(get(addr, "/api/ps").await["models"], Value::Array(vec![]));
    post(
        addr,
        "/api/generate",
        &[],
        r#"{"model":"m","keep_alive":"1m"}"#,
    )
    .await;
    let done = Instant::now();
    let ps = get(addr, "/api/ps").await;
    let expires = ps["models"][0]["expires_at"].as_str().unwrap().to_owned();
    sleep_until(done + Duration::from_secs(60)).await;
    assert_eq!(get(addr, "/api/ps").await["models"], Value::Array(vec![]));
    assert!(expires.ends_with('Z'), "{expires}");
}

#[tokio::test(start_paused = true)]
async fn api_ps_shows_where_the_model_runs_through_size_vram() {
    let (_server, addr) = start(SimConfig {
        model_size: 1000,
        ..config()
    })
    .await;
    post(
        addr,
        "/api/chat",
        &[("x-sim-vram-fraction", "0.25")],
        r#"{"model":"split"}"#,
    )
    .await;
    post(
        addr,
        "/api/chat",
        &[("x-sim-vram-fraction", "0")],
        r#"{"model":"cpu"}"#,
    )
    .await;
    let ps = get(addr, "/api/ps").await;
    let vram = |name: &str| {
        ps["models"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == name)
            .map(|m| {
                (
                    m["size"].as_u64().unwrap(),
                    m["size_vram"].as_u64().unwrap(),
                )
            })
    };
    assert_eq!(vram("split"), Some((1000, 250)));
    assert_eq!(vram("cpu"), Some((1000, 0)));
    // Longest remaining time first: "cpu" was used last.
    assert_eq!(ps["models"][0]["name"], "cpu");
}

#[tokio::test(start_paused = true)]
async fn with_one_slot_a_second_call_is_queued_until_the_first_finishes() {
    let (_server, addr) = start(SimConfig {
        slots: Some(1),
        ..config()
    })
    .await;
    let t0 = Instant::now();
    let body = r#"{"stream":true}"#;
    let a = tokio::spawn(post(addr, "/v1/chat/completions", &[], body));
    sleep(MS).await;
    let b = tokio::spawn(post(addr, "/v1/chat/completions", &[], body));
    sleep_until(t0 + Duration::from_millis(50)).await;
    assert_eq!(metric(addr, "requests_processing").await, 1.0);
    assert_eq!(metric(addr, "requests_deferred").await, 1.0);
    let slots = get(addr, "/slots").await;
    assert_eq!(slots.as_array().unwrap().len(), 1);
    assert_eq!(slots[0]["is_processing"], true);
    let a = a.await.unwrap();
    let b = b.await.unwrap();
    // A: first token at 100 ms, last (10th) at 190 ms; B arrived at 1 ms
    // and starts when A's slot frees at 190 ms: its TTFT is 189 + 100 ms.
    assert_eq!(a.first_frame, Duration::from_millis(100));
    assert_eq!(a.last_frame, Duration::from_millis(190));
    assert_eq!(b.first_frame, Duration::from_millis(289));
    assert_eq!(metric(addr, "requests_deferred").await, 0.0);
    assert_eq!(metric(addr, "requests_processing").await, 0.0);
}

#[tokio::test(start_paused = true)]
async fn slots_show_prompt_progress_rising_linearly_during_a_long_prefill() {
    let (_server, addr) = start(SimConfig {
        slots: Some(2),
        n_ctx: 4096,
        prefill_tokens_per_second: Some(100.0),
        ..config()
    })
    .await;
    let t0 = Instant::now();
    let headers: &'static [(&str, &str)] = &[("x-sim-prompt-tokens", "1000")];
    let call = tokio::spawn(post(addr, "/completion", headers, r#"{"stream":true}"#));
    let mut seen = Vec::new();
    for at in [2_500, 5_000, 7_500] {
        sleep_until(t0 + Duration::from_millis(at)).await;
        let slots = get(addr, "/slots").await;
        let s = &slots[0];
        assert_eq!(s["is_processing"], true);
        assert_eq!(s["n_ctx"], 4096);
        assert_eq!(s["n_prompt_tokens"], 1000);
        assert_eq!(s["next_token"][0]["n_decoded"], 0);
        seen.push(s["n_prompt_tokens_processed"].as_u64().unwrap());
        assert_eq!(slots[1]["is_processing"], false, "the other slot idles");
    }
    assert_eq!(seen, [250, 500, 750]);
    sleep_until(t0 + Duration::from_millis(10_150)).await;
    let s = &get(addr, "/slots").await[0];
    assert_eq!(s["n_prompt_tokens_processed"], 1000);
    assert_eq!(s["next_token"][0]["n_decoded"], 6, "tokens at 100..150 ms");
    let reply = call.await.unwrap();
    // TTFT = prefill 10 s + base ttft 100 ms.
    assert_eq!(reply.first_frame, Duration::from_millis(10_100));
    let last = reply.last_sse_json();
    assert_eq!(last["tokens_evaluated"], 1000);
}

#[tokio::test(start_paused = true)]
async fn timings_report_the_prefill_as_prompt_n_and_prompt_ms() {
    let (_server, addr) = start(SimConfig {
        server_timings: true,
        prefill_tokens_per_second: Some(500.0),
        ..config()
    })
    .await;
    let headers = [("x-sim-prompt-tokens", "1000")];
    let reply = post(addr, "/v1/chat/completions", &headers, "{}").await;
    let t = &reply.json()["timings"];
    assert_eq!(t["prompt_n"], 1000);
    // Prefill 2 s + base ttft 100 ms.
    assert_eq!(t["prompt_ms"], 2100.0);
    assert_eq!(reply.json()["usage"]["prompt_tokens"], 1000);
}

#[tokio::test(start_paused = true)]
async fn ttft_adds_the_load_the_queue_the_prefill_and_the_base_ttft() {
    let (_server, addr) = start(SimConfig {
        slots: Some(1),
        load_time: Duration::from_secs(1),
        prefill_tokens_per_second: Some(1000.0),
        server_timings: true,
        ..config()
    })
    .await;
    let headers: &'static [(&str, &str)] = &[("x-sim-prompt-tokens", "500")];
    let a = tokio::spawn(post(addr, "/api/chat", headers, CHAT));
    let b = tokio::spawn(post(addr, "/api/chat", headers, CHAT));
    let (a, b) = (a.await.unwrap(), b.await.unwrap());
    let (first, second) = if a.first_frame < b.first_frame {
        (a, b)
    } else {
        (b, a)
    };
    // First: load 1 s + prefill 0.5 s + ttft 0.1 s; its last token 90 ms later.
    assert_eq!(first.first_frame, Duration::from_millis(1600));
    assert_eq!(first.last_frame, Duration::from_millis(1690));
    // Second: waited for the same load, then queued until 1690 ms.
    assert_eq!(second.first_frame, Duration::from_millis(1690 + 600));
    let done = second.last_line();
    assert_eq!(done["load_duration"], 1_000_000_000u64);
    assert_eq!(done["prompt_eval_duration"], 600_000_000u64);
    assert_eq!(done["total_duration"], 2_380_000_000u64);
}

#[tokio::test(start_paused = true)]
async fn llama_server_refuses_a_prompt_at_or_over_the_context_size_with_its_real_error() {
    let (_server, addr) = start(SimConfig {
        n_ctx: 2048,
        ..config()
    })
    .await;
    let over = post(
        addr,
        "/v1/chat/completions",
        &[("x-sim-prompt-tokens", "2048")],
        r#"{"stream":true}"#,
    )
    .await;
    assert_eq!(over.status, 400);
    assert_eq!(
        over.body,
        r#"{"error":{"code":400,"message":"request (2048 tokens) exceeds the available context size (2048 tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":2048,"n_ctx":2048}}"#
    );
    let fits = post(
        addr,
        "/v1/chat/completions",
        &[("x-sim-prompt-tokens", "2047")],
        "{}",
    )
    .await;
    assert_eq!(fits.status, 200);
    assert_eq!(fits.json()["usage"]["prompt_tokens"], 2047);
}

#[tokio::test(start_paused = true)]
async fn ollama_cuts_a_prompt_over_the_context_size_and_reports_the_cut_count() {
    let (_server, addr) = start(SimConfig {
        n_ctx: 2048,
        prefill_tokens_per_second: Some(1024.0),
        ..config()
    })
    .await;
    let headers = [("x-sim-prompt-tokens", "5000")];
    let reply = post(addr, "/api/chat", &headers, CHAT).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.last_line()["prompt_eval_count"], 2048);
    // Only the cut prompt is processed: 2048 / 1024 = 2 s of prefill.
    assert_eq!(reply.first_frame, Duration::from_millis(2100));
    let ps = get(addr, "/api/ps").await;
    assert_eq!(ps["models"][0]["context_length"], 2048);
}

#[tokio::test(start_paused = true)]
async fn the_overflow_switch_makes_any_route_refuse_or_cut() {
    let (_server, addr) = start(SimConfig {
        n_ctx: 100,
        overflow: Overflow::Refuse,
        ..config()
    })
    .await;
    let big = ("x-sim-prompt-tokens", "150");
    let refused = post(addr, "/api/chat", &[big], CHAT).await;
    assert_eq!(refused.status, 400);
    assert!(refused.json()["error"]
        .as_str()
        .unwrap()
        .contains("context length"));
    let cut = post(
        addr,
        "/v1/chat/completions",
        &[big, ("x-sim-overflow", "truncate")],
        "{}",
    )
    .await;
    assert_eq!(cut.status, 200);
    assert_eq!(cut.json()["usage"]["prompt_tokens"], 100);
}

#[tokio::test(start_paused = true)]
async fn llama_cpp_timings_carry_draft_counts_at_the_configured_acceptance() {
    let (_server, addr) = start(SimConfig {
        server_timings: true,
        tokens: 20,
        draft_acceptance: Some(0.75),
        ..config()
    })
    .await;
    let t = post(addr, "/v1/chat/completions", &[], "{}").await.json()["timings"].clone();
    assert_eq!(
        (t["draft_n"].as_u64(), t["draft_n_accepted"].as_u64()),
        (Some(20), Some(15))
    );
    let none = post(
        addr,
        "/completion",
        &[("x-sim-draft-acceptance", "0.5")],
        "{}",
    )
    .await;
    assert_eq!(none.json()["timings"]["draft_n_accepted"], 10);
    assert_eq!(get(addr, "/slots").await[0]["speculative"], true);
    assert_eq!(
        metric(addr, "spec_decode_num_draft_tokens_total").await,
        40.0
    );
    assert_eq!(
        metric(addr, "spec_decode_num_accepted_tokens_total").await,
        25.0
    );

    let (_plain, plain) = start(SimConfig {
        server_timings: true,
        ..config()
    })
    .await;
    let t = post(plain, "/v1/chat/completions", &[], "{}").await.json()["timings"].clone();
    assert!(t.get("draft_n").is_none() && t.get("draft_n_accepted").is_none());
}

#[tokio::test(start_paused = true)]
async fn props_give_the_context_size_the_slot_count_and_the_model_path() {
    let (_server, addr) = start(SimConfig {
        slots: Some(4),
        n_ctx: 8192,
        ..config()
    })
    .await;
    let props = get(addr, "/props").await;
    assert_eq!(props["default_generation_settings"]["n_ctx"], 8192);
    assert_eq!(props["total_slots"], 4);
    assert_eq!(props["model_path"], "models/sim-model.gguf");
    assert_eq!(get(addr, "/slots").await.as_array().unwrap().len(), 4);
}

#[tokio::test(start_paused = true)]
async fn metrics_count_finished_calls_under_llama_servers_names() {
    let (_server, addr) = start(SimConfig {
        prefill_tokens_per_second: Some(1000.0),
        ..config()
    })
    .await;
    let headers = [("x-sim-prompt-tokens", "300")];
    post(addr, "/v1/chat/completions", &headers, "{}").await;
    post(addr, "/v1/chat/completions", &headers, "{}").await;
    let reply = call(addr, Method::GET, "/metrics", &[], "").await;
    assert!(reply
        .body
        .contains("# TYPE llamacpp:requests_deferred gauge\n"));
    assert!(reply
        .body
        .contains("# TYPE llamacpp:prompt_tokens_total counter\n"));
    assert_eq!(metric(addr, "prompt_tokens_total").await, 600.0);
    assert_eq!(metric(addr, "tokens_predicted_total").await, 20.0);
    // Each prompt: 0.3 s prefill + 0.1 s base ttft.
    assert_eq!(metric(addr, "prompt_seconds_total").await, 0.8);
    assert_eq!(metric(addr, "tokens_predicted_seconds_total").await, 0.18);
    assert_eq!(metric(addr, "n_tokens_max").await, 310.0);
}
