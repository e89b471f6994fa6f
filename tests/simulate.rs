//! Integration tests of `speedtap::simulate` over real sockets on
//! 127.0.0.1: every route streamed and whole, parsed by an independent
//! decoder written here, with its schedule checked against the clock.
//!
//! Timing bounds: a token can never arrive before its deadline (the server
//! measures from request arrival, which is after the client's send), so
//! lower bounds are exact; upper bounds allow `SLACK` for a loaded 2-core
//! machine. Schedules are short: ttft 50 ms, 20 tokens at 200 tok/s.

#![allow(clippy::unwrap_used)] // a test (or bench) may unwrap: a panic is its failure report

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use speedtap::simulate::{SimConfig, SimServer, WORDS};
use speedtap::tokens::{O200kEstimator, TokenEstimator};
use tokio::net::TcpStream;

const TTFT: Duration = Duration::from_millis(50);
const TPS: f64 = 200.0;
const REASONING: u64 = 4;
const ANSWER: u64 = 16;
const TOTAL: u64 = REASONING + ANSWER;
const SLACK: Duration = Duration::from_millis(75);

fn config() -> SimConfig {
    SimConfig {
        ttft: TTFT,
        tokens_per_second: TPS,
        tokens: ANSWER,
        reasoning_tokens: REASONING,
        ..SimConfig::default()
    }
}

/// When token `i` is due after the request was sent (at the earliest).
fn due(i: u64) -> Duration {
    TTFT + Duration::from_secs_f64(i as f64 / TPS)
}

/// The words of output tokens `from..to`, concatenated.
fn words(from: u64, to: u64) -> String {
    (from..to)
        .map(|i| WORDS[(i % WORDS.len() as u64) as usize])
        .collect()
}

// ---------------------------------------------------------------- client

/// One HTTP exchange as the client saw it.
struct Exchange {
    status: StatusCode,
    headers: HeaderMap,
    /// Response head arrival, since the request was sent.
    head_at: Duration,
    /// Every body frame with its arrival time since the request was sent.
    frames: Vec<(Duration, Bytes)>,
    /// The body error, if the body did not end cleanly.
    error: Option<String>,
}

impl Exchange {
    fn body(&self) -> String {
        let mut all = Vec::new();
        for (_, f) in &self.frames {
            all.extend_from_slice(f);
        }
        String::from_utf8(all).expect("utf-8 body")
    }

    fn content_type(&self) -> &str {
        self.headers
            .get("content-type")
            .map(|v| v.to_str().unwrap())
            .unwrap_or("")
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.body()).expect("JSON body")
    }
}

async fn connect(
    addr: SocketAddr,
) -> (
    hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    tokio::task::JoinHandle<()>,
) {
    let stream = TcpStream::connect(addr).await.unwrap();
    stream.set_nodelay(true).unwrap();
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    let task = tokio::spawn(async move {
        let _ = conn.await;
    });
    (sender, task)
}

fn build(method: Method, path: &str, headers: &[(&str, &str)], body: &str) -> Request<Full<Bytes>> {
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "127.0.0.1")
        .header("content-type", "application/json");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.body(Full::new(Bytes::from(body.to_owned()))).unwrap()
}

async fn request(
    addr: SocketAddr,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Exchange {
    let (mut sender, _conn) = connect(addr).await;
    let req = build(method, path, headers, body);
    let t0 = Instant::now();
    let response = sender.send_request(req).await.unwrap();
    let head_at = t0.elapsed();
    let (parts, mut body) = response.into_parts();
    let mut frames = Vec::new();
    let mut error = None;
    loop {
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    frames.push((t0.elapsed(), data));
                }
            }
            Some(Err(e)) => {
                error = Some(e.to_string());
                break;
            }
            None => break,
        }
    }
    Exchange {
        status: parts.status,
        headers: parts.headers,
        head_at,
        frames,
        error,
    }
}

async fn post(addr: SocketAddr, path: &str, headers: &[(&str, &str)], body: &str) -> Exchange {
    request(addr, Method::POST, path, headers, body).await
}

async fn get(addr: SocketAddr, path: &str) -> Exchange {
    request(addr, Method::GET, path, &[], "").await
}

// ---------------------------------------------------------------- decoder

/// What an independent reading of a reply finds.
#[derive(Debug, Default)]
struct Decoded {
    reasoning: String,
    answer: String,
    /// Output tokens as reported (usage / counts).
    output_tokens: Option<u64>,
    /// Server timings object (llama.cpp) or Ollama durations, when present.
    timings: Option<Value>,
    /// The protocol's terminal marker was seen.
    terminal: bool,
    /// An in-protocol error was seen.
    error: bool,
    /// SSE keep-alive comments seen.
    pings: usize,
    /// Token-bearing events.
    token_events: usize,
}

impl Decoded {
    /// Text with inline `<think>…</think>`: the part inside goes to reasoning.
    fn push_inline(&mut self, text: &str) {
        let mut rest = text;
        while !rest.is_empty() {
            let in_think = self.reasoning_open();
            if in_think {
                match rest.find("</think>") {
                    Some(end) => {
                        self.reasoning.push_str(&rest[..end]);
                        self.reasoning.push('\u{1}'); // closed marker
                        rest = &rest[end + "</think>".len()..];
                    }
                    None => {
                        self.reasoning.push_str(rest);
                        rest = "";
                    }
                }
            } else if let Some(r) = rest.strip_prefix("<think>") {
                self.reasoning.push('\u{0}'); // open marker
                rest = r;
            } else {
                self.answer.push_str(rest);
                rest = "";
            }
        }
    }

    fn reasoning_open(&self) -> bool {
        self.reasoning.starts_with('\u{0}') && !self.reasoning.ends_with('\u{1}')
    }

    /// The reasoning text without the inline markers.
    fn reasoning_text(&self) -> String {
        self.reasoning.replace(['\u{0}', '\u{1}'], "")
    }
}

/// SSE events of a body: (event name, data). Comments are counted.
fn sse(body: &str) -> (Vec<(Option<String>, String)>, usize) {
    let mut events = Vec::new();
    let mut pings = 0;
    for block in body.split("\n\n").filter(|b| !b.is_empty()) {
        let mut name = None;
        let mut data = Vec::new();
        for line in block.lines() {
            if line.starts_with(':') {
                pings += 1;
            } else if let Some(e) = line.strip_prefix("event:") {
                name = Some(e.trim_start().to_owned());
            } else if let Some(d) = line.strip_prefix("data:") {
                data.push(d.strip_prefix(' ').unwrap_or(d).to_owned());
            } else {
                panic!("unexpected SSE line {line:?}");
            }
        }
        if !data.is_empty() {
            events.push((name, data.join("\n")));
        }
    }
    (events, pings)
}

fn decode_stream(path: &str, body: &str) -> Decoded {
    let mut d = Decoded::default();
    if path.starts_with("/api/") {
        assert!(body.ends_with('\n'), "NDJSON ends with a newline");
        for line in body.lines() {
            let v: Value = serde_json::from_str(line).expect(line);
            if v.get("error").is_some() {
                d.error = true;
                continue;
            }
            let (content, thinking) = if path == "/api/chat" {
                (&v["message"]["content"], &v["message"]["thinking"])
            } else {
                (&v["response"], &v["thinking"])
            };
            let (c, t) = (
                content.as_str().unwrap_or(""),
                thinking.as_str().unwrap_or(""),
            );
            if !c.is_empty() || !t.is_empty() {
                d.token_events += 1;
            }
            d.reasoning.push_str(t);
            d.answer.push_str(c);
            if v["done"] == true {
                d.terminal = true;
                d.output_tokens = v["eval_count"].as_u64();
                if v.get("eval_duration").is_some() {
                    d.timings = Some(v.clone());
                }
            }
        }
        return d;
    }
    let (events, pings) = sse(body);
    d.pings = pings;
    for (name, data) in events {
        if data == "[DONE]" {
            d.terminal = true;
            continue;
        }
        let v: Value = serde_json::from_str(&data).expect(&data);
        if v.get("error").is_some() || name.as_deref() == Some("error") {
            d.error = true;
            continue;
        }
        if let Some(t) = v.get("timings") {
            d.timings = Some(t.clone());
        }
        match path {
            "/v1/chat/completions" => {
                assert_eq!(v["object"], "chat.completion.chunk");
                if let Some(c) = v["choices"].as_array().and_then(|c| c.first()) {
                    let delta = &c["delta"];
                    let r = delta["reasoning_content"].as_str().unwrap_or("");
                    let a = delta["content"].as_str().unwrap_or("");
                    if !r.is_empty() || !a.is_empty() {
                        d.token_events += 1;
                    }
                    d.reasoning.push_str(r);
                    d.answer.push_str(a);
                }
                if let Some(u) = v.get("usage") {
                    assert_eq!(
                        v["choices"],
                        Value::Array(vec![]),
                        "usage chunk has no choices"
                    );
                    d.output_tokens = u["completion_tokens"].as_u64();
                }
            }
            "/v1/completions" => {
                assert_eq!(v["object"], "text_completion");
                if let Some(c) = v["choices"].as_array().and_then(|c| c.first()) {
                    let t = c["text"].as_str().unwrap();
                    if !t.is_empty() {
                        d.token_events += 1;
                    }
                    d.push_inline(t);
                }
                if let Some(u) = v.get("usage") {
                    d.output_tokens = u["completion_tokens"].as_u64();
                }
            }
            "/v1/responses" => {
                assert_eq!(name.as_deref(), v["type"].as_str());
                match v["type"].as_str().unwrap() {
                    "response.reasoning_text.delta" => {
                        d.token_events += 1;
                        d.reasoning.push_str(v["delta"].as_str().unwrap());
                    }
                    "response.output_text.delta" => {
                        d.token_events += 1;
                        d.answer.push_str(v["delta"].as_str().unwrap());
                    }
                    "response.completed" => {
                        d.terminal = true;
                        d.output_tokens = v["response"]["usage"]["output_tokens"].as_u64();
                    }
                    _ => {}
                }
            }
            "/v1/messages" => {
                assert_eq!(name.as_deref(), v["type"].as_str());
                match v["type"].as_str().unwrap() {
                    "content_block_delta" => match v["delta"]["type"].as_str().unwrap() {
                        "thinking_delta" => {
                            d.token_events += 1;
                            d.reasoning
                                .push_str(v["delta"]["thinking"].as_str().unwrap());
                        }
                        "text_delta" => {
                            d.token_events += 1;
                            d.answer.push_str(v["delta"]["text"].as_str().unwrap());
                        }
                        _ => {}
                    },
                    "message_delta" => d.output_tokens = v["usage"]["output_tokens"].as_u64(),
                    "message_stop" => d.terminal = true,
                    _ => {}
                }
            }
            "/completion" => {
                let c = v["content"].as_str().unwrap();
                if !c.is_empty() {
                    d.token_events += 1;
                }
                d.push_inline(c);
                if v["stop"] == true {
                    d.terminal = true;
                    d.output_tokens = v["tokens_predicted"].as_u64();
                }
            }
            "/generate_stream" => {
                if v["token"]["special"] == false {
                    d.token_events += 1;
                    d.push_inline(v["token"]["text"].as_str().unwrap());
                }
                if !v["details"].is_null() {
                    d.terminal = true;
                    d.output_tokens = v["details"]["generated_tokens"].as_u64();
                }
            }
            other => panic!("no decoder for {other}"),
        }
    }
    d
}

fn decode_whole(path: &str, v: &Value) -> Decoded {
    let mut d = Decoded {
        terminal: true,
        ..Decoded::default()
    };
    match path {
        "/v1/chat/completions" => {
            assert_eq!(v["object"], "chat.completion");
            let m = &v["choices"][0]["message"];
            d.reasoning = m["reasoning_content"].as_str().unwrap_or("").to_owned();
            d.answer = m["content"].as_str().unwrap().to_owned();
            d.output_tokens = v["usage"]["completion_tokens"].as_u64();
            d.timings = v.get("timings").cloned();
        }
        "/v1/completions" => {
            d.push_inline(v["choices"][0]["text"].as_str().unwrap());
            d.output_tokens = v["usage"]["completion_tokens"].as_u64();
            d.timings = v.get("timings").cloned();
        }
        "/v1/responses" => {
            assert_eq!(v["status"], "completed");
            for item in v["output"].as_array().unwrap() {
                let text = item["content"][0]["text"].as_str().unwrap_or("");
                match item["type"].as_str().unwrap() {
                    "reasoning" => d.reasoning.push_str(text),
                    "message" => d.answer.push_str(text),
                    t => panic!("item {t}"),
                }
            }
            d.output_tokens = v["usage"]["output_tokens"].as_u64();
            d.timings = v.get("timings").cloned();
        }
        "/v1/messages" => {
            assert_eq!(v["type"], "message");
            for block in v["content"].as_array().unwrap() {
                match block["type"].as_str().unwrap() {
                    "thinking" => d.reasoning.push_str(block["thinking"].as_str().unwrap()),
                    "text" => d.answer.push_str(block["text"].as_str().unwrap()),
                    t => panic!("block {t}"),
                }
            }
            d.output_tokens = v["usage"]["output_tokens"].as_u64();
        }
        "/api/chat" | "/api/generate" => {
            assert_eq!(v["done"], true);
            let (c, t) = if path == "/api/chat" {
                (&v["message"]["content"], &v["message"]["thinking"])
            } else {
                (&v["response"], &v["thinking"])
            };
            d.answer = c.as_str().unwrap().to_owned();
            d.reasoning = t.as_str().unwrap_or("").to_owned();
            d.output_tokens = v["eval_count"].as_u64();
            if v.get("eval_duration").is_some() {
                d.timings = Some(v.clone());
            }
        }
        "/completion" => {
            assert_eq!(v["stop"], true);
            d.push_inline(v["content"].as_str().unwrap());
            d.output_tokens = v["tokens_predicted"].as_u64();
            d.timings = v.get("timings").cloned();
        }
        "/generate" => {
            d.push_inline(v["generated_text"].as_str().unwrap());
            d.output_tokens = v["details"]["generated_tokens"].as_u64();
        }
        other => panic!("no decoder for {other}"),
    }
    d
}

/// Every generation route with a minimal request body for it.
const ROUTES: [(&str, &str); 9] = [
    (
        "/v1/chat/completions",
        r#"{"model":"m","messages":[{"role":"user","content":"hi"}]"#,
    ),
    ("/v1/completions", r#"{"model":"m","prompt":"hi""#),
    ("/v1/responses", r#"{"model":"m","input":"hi""#),
    (
        "/v1/messages",
        r#"{"model":"m","max_tokens":64,"messages":[{"role":"user","content":"hi"}]"#,
    ),
    (
        "/api/chat",
        r#"{"model":"m","messages":[{"role":"user","content":"hi"}]"#,
    ),
    ("/api/generate", r#"{"model":"m","prompt":"hi""#),
    ("/completion", r#"{"prompt":"hi""#),
    ("/generate_stream", r#"{"inputs":"hi""#),
    ("/generate", r#"{"inputs":"hi""#),
];

/// The request body for `path`, with `stream` set when the route has the flag.
fn body_for(path: &str, stream: bool, extra: &str) -> String {
    let (_, open) = ROUTES.iter().find(|(p, _)| *p == path).unwrap();
    let stream = if path.starts_with("/generate") {
        String::new()
    } else {
        format!(",\"stream\":{stream}")
    };
    format!("{open}{stream}{extra}}}")
}

/// Whether a route's usage count is sent in a plain stream (without
/// `include_usage` or the usage switch).
fn counts_by_default(path: &str) -> bool {
    !matches!(path, "/v1/chat/completions" | "/v1/completions")
}

fn check_text(d: &Decoded, reasoning: u64, answer: u64) {
    assert_eq!(d.reasoning_text(), words(0, reasoning), "reasoning text");
    assert_eq!(
        d.answer,
        words(reasoning, reasoning + answer),
        "answer text"
    );
    let all = format!("{}{}", d.reasoning_text(), d.answer);
    assert_eq!(O200kEstimator.count_tokens(&all), reasoning + answer);
}

fn check_stream_timing(x: &Exchange, tokens: u64, pings: usize) {
    let token_frames = &x.frames[pings..];
    assert_eq!(token_frames.len() as u64, tokens, "one frame per token");
    for (i, (at, _)) in token_frames.iter().enumerate() {
        assert!(
            *at >= due(i as u64),
            "token {i} at {at:?}, due {:?}",
            due(i as u64)
        );
    }
    let last = token_frames.last().unwrap().0;
    assert!(last <= due(tokens - 1) + SLACK, "last token at {last:?}");
}

// ---------------------------------------------------------------- tests

#[test]
fn every_word_is_one_o200k_token() {
    for w in WORDS {
        assert_eq!(O200kEstimator.count_tokens(w), 1, "{w:?}");
    }
    assert_eq!(
        O200kEstimator.count_tokens(&WORDS.concat()),
        WORDS.len() as u64
    );
    // And the cycle: twice round plus a bit.
    let n = 2 * WORDS.len() as u64 + 3;
    assert_eq!(O200kEstimator.count_tokens(&words(0, n)), n);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_streams_on_schedule() {
    let server = SimServer::start("127.0.0.1:0", config()).await.unwrap();
    let addr = server.local_addr();
    for (path, _) in ROUTES {
        if path == "/generate" {
            continue;
        }
        let x = post(addr, path, &[], &body_for(path, true, "")).await;
        assert_eq!(x.status, 200, "{path}");
        assert!(x.error.is_none(), "{path}: {:?}", x.error);
        let expected = if path.starts_with("/api/") {
            "application/x-ndjson"
        } else {
            "text/event-stream"
        };
        assert_eq!(x.content_type(), expected, "{path}");
        assert!(
            x.headers.get("content-length").is_none(),
            "{path} streams chunked"
        );
        let d = decode_stream(path, &x.body());
        check_text(&d, REASONING, ANSWER);
        assert_eq!(d.token_events as u64, TOTAL, "{path}");
        assert!(d.terminal && !d.error, "{path}: {d:?}");
        assert!(d.timings.is_none(), "{path}: timings only when asked");
        if counts_by_default(path) {
            assert_eq!(d.output_tokens, Some(TOTAL), "{path}");
        } else {
            assert_eq!(
                d.output_tokens, None,
                "{path}: usage only with include_usage"
            );
        }
        check_stream_timing(&x, TOTAL, 0);
    }
    assert_eq!(server.cancelled_streams(), 0);
    assert_eq!(server.active_streams(), 0);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_answers_whole() {
    let server = SimServer::start("127.0.0.1:0", config()).await.unwrap();
    let addr = server.local_addr();
    for (path, _) in ROUTES {
        if path == "/generate_stream" {
            continue;
        }
        let x = post(addr, path, &[], &body_for(path, false, "")).await;
        assert_eq!(x.status, 200, "{path}");
        assert!(x.content_type().starts_with("application/json"), "{path}");
        assert!(
            x.head_at >= due(TOTAL - 1),
            "{path}: whole reply after the schedule"
        );
        assert!(
            x.head_at <= due(TOTAL - 1) + SLACK,
            "{path}: {:?}",
            x.head_at
        );
        let v = x.json();
        if path.starts_with("/v1/") || path.starts_with("/api/") {
            assert_eq!(v["model"], "m", "{path} echoes the model");
        }
        let d = decode_whole(path, &v);
        check_text(&d, REASONING, ANSWER);
        assert_eq!(d.output_tokens, Some(TOTAL), "{path}");
        assert!(d.timings.is_none(), "{path}");
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_timings_and_factor_on_every_route() {
    let server = SimServer::start("127.0.0.1:0", config()).await.unwrap();
    let addr = server.local_addr();
    let headers = [
        ("x-sim-usage", "true"),
        ("x-sim-server-timings", "true"),
        ("x-sim-usage-factor", "1.5"),
    ];
    let exact = 30; // round(20 * 1.5)
    for (path, _) in ROUTES {
        for stream in [true, false] {
            if (path == "/generate" && stream) || (path == "/generate_stream" && !stream) {
                continue;
            }
            let x = post(addr, path, &headers, &body_for(path, stream, "")).await;
            assert_eq!(x.status, 200, "{path}");
            let d = if stream {
                decode_stream(path, &x.body())
            } else {
                decode_whole(path, &x.json())
            };
            check_text(&d, REASONING, ANSWER);
            assert_eq!(d.output_tokens, Some(exact), "{path} stream={stream}");
            match path {
                "/v1/chat/completions" | "/v1/completions" | "/v1/responses" | "/completion" => {
                    let t = d
                        .timings
                        .as_ref()
                        .unwrap_or_else(|| panic!("{path} timings"));
                    assert_eq!(t["predicted_n"], exact);
                    let ms = t["predicted_ms"].as_f64().unwrap();
                    let scheduled = (TOTAL - 1) as f64 / TPS * 1000.0;
                    // Measured, so a late first wake-up shortens it.
                    assert!(
                        (ms - scheduled).abs() <= SLACK.as_millis() as f64,
                        "{path}: {ms}"
                    );
                    assert!(t["prompt_ms"].as_f64().unwrap() >= TTFT.as_millis() as f64 - 1.0);
                }
                "/api/chat" | "/api/generate" => {
                    let t = d
                        .timings
                        .as_ref()
                        .unwrap_or_else(|| panic!("{path} durations"));
                    let ns = t["eval_duration"].as_u64().unwrap();
                    let scheduled = (TOTAL - 1) as f64 / TPS * 1e9;
                    assert!(
                        (ns as f64 - scheduled).abs() <= SLACK.as_nanos() as f64,
                        "{path}: {ns}"
                    );
                    assert!(t["total_duration"].as_u64().unwrap() >= ns);
                }
                "/generate" => {
                    assert_eq!(x.headers["x-generated-tokens"], "30");
                    assert!(x.headers.get("x-time-per-token").is_some());
                }
                _ => {}
            }
        }
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn include_usage_adds_the_usage_chunk() {
    let server = SimServer::start("127.0.0.1:0", config()).await.unwrap();
    let addr = server.local_addr();
    for path in ["/v1/chat/completions", "/v1/completions"] {
        let body = body_for(path, true, r#","stream_options":{"include_usage":true}"#);
        let x = post(addr, path, &[], &body).await;
        let d = decode_stream(path, &x.body());
        assert_eq!(d.output_tokens, Some(TOTAL), "{path}");
        // The usage chunk comes right before [DONE], with the closing frame.
        let last_frame = String::from_utf8(x.frames.last().unwrap().1.to_vec()).unwrap();
        assert!(last_frame.contains(r#""choices":[]"#), "{last_frame}");
        assert!(last_frame.ends_with("data: [DONE]\n\n"));
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_defaults_and_model_echo() {
    let server = SimServer::start("127.0.0.1:0", config()).await.unwrap();
    let addr = server.local_addr();
    // Ollama native streams unless told not to.
    let x = post(addr, "/api/chat", &[], r#"{"model":"qwen3:8b"}"#).await;
    assert_eq!(x.content_type(), "application/x-ndjson");
    let first: Value = serde_json::from_str(x.body().lines().next().unwrap()).unwrap();
    assert_eq!(first["model"], "qwen3:8b");
    // OpenAI-style and llama.cpp native don't.
    for path in ["/v1/chat/completions", "/completion"] {
        let x = post(addr, path, &[], "{}").await;
        assert!(x.content_type().starts_with("application/json"), "{path}");
    }
    let x = post(addr, "/v1/chat/completions", &[], "{}").await;
    assert_eq!(x.json()["model"], "sim-model");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_override_the_schedule() {
    let server = SimServer::start("127.0.0.1:0", config()).await.unwrap();
    let addr = server.local_addr();
    let headers = [
        ("x-sim-ttft-ms", "120"),
        ("x-sim-tps", "100"),
        ("x-sim-tokens", "5"),
        ("x-sim-reasoning", "0"),
    ];
    let x = post(
        addr,
        "/v1/messages",
        &headers,
        &body_for("/v1/messages", true, ""),
    )
    .await;
    let d = decode_stream("/v1/messages", &x.body());
    check_text(&d, 0, 5);
    assert_eq!(d.output_tokens, Some(5));
    assert_eq!(x.frames.len(), 5);
    assert!(
        x.frames[0].0 >= Duration::from_millis(120),
        "{:?}",
        x.frames[0].0
    );
    let last = x.frames[4].0;
    assert!(
        last >= Duration::from_millis(160) && last <= Duration::from_millis(160) + SLACK,
        "{last:?}"
    );

    let x = post(addr, "/v1/messages", &[("x-sim-tps", "0")], "{}").await;
    assert_eq!(x.status, 400);
    assert!(x.body().contains("x-sim"), "{}", x.body());
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_fault_replies_after_ttft() {
    let server = SimServer::start("127.0.0.1:0", config()).await.unwrap();
    let addr = server.local_addr();
    for (path, stream) in [
        ("/v1/chat/completions", true),
        ("/v1/messages", true),
        ("/api/chat", false),
    ] {
        let x = post(
            addr,
            path,
            &[("x-sim-status", "503")],
            &body_for(path, stream, ""),
        )
        .await;
        assert_eq!(x.status, 503, "{path}");
        assert!(x.content_type().starts_with("application/json"));
        assert!(x.head_at >= TTFT, "{path}: {:?}", x.head_at);
        let v = x.json();
        assert!(v.get("error").is_some(), "{path}: {v}");
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_after_gives_an_incomplete_body() {
    let server = SimServer::start("127.0.0.1:0", config()).await.unwrap();
    let addr = server.local_addr();
    for path in [
        "/v1/chat/completions",
        "/v1/messages",
        "/api/generate",
        "/generate_stream",
    ] {
        let x = post(
            addr,
            path,
            &[("x-sim-cut-after", "3")],
            &body_for(path, true, ""),
        )
        .await;
        assert_eq!(x.status, 200, "{path}");
        assert!(x.error.is_some(), "{path}: the client must see the cut");
        let d = decode_stream(path, &x.body());
        assert_eq!(d.token_events, 3, "{path}");
        assert_eq!(format!("{}{}", d.reasoning_text(), d.answer), words(0, 3));
        assert!(!d.terminal, "{path}: no terminal events after a cut");
        // The cut comes when token 3 would have been due.
        let done = x.frames.last().unwrap().0;
        assert!(done >= due(2), "{path}");
    }
    // A whole reply is cut too: the client gets no complete response.
    let (mut sender, _conn) = connect(addr).await;
    let req = build(
        Method::POST,
        "/v1/chat/completions",
        &[("x-sim-cut-after", "3")],
        "{}",
    );
    match sender.send_request(req).await {
        Err(e) => assert!(e.is_incomplete_message(), "{e}"),
        Ok(response) => assert!(response.into_body().collect().await.is_err()),
    }
    assert_eq!(
        server.cancelled_streams(),
        0,
        "our own cuts are not hang-ups"
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_after_sends_the_protocol_error_and_ends_cleanly() {
    let server = SimServer::start("127.0.0.1:0", config()).await.unwrap();
    let addr = server.local_addr();
    for (path, _) in ROUTES {
        if path == "/generate" {
            continue;
        }
        let x = post(
            addr,
            path,
            &[("x-sim-error-after", "5")],
            &body_for(path, true, ""),
        )
        .await;
        assert_eq!(x.status, 200, "{path}");
        assert!(x.error.is_none(), "{path}: clean end");
        let d = decode_stream(path, &x.body());
        assert!(d.error, "{path}: error event");
        assert!(!d.terminal, "{path}: no terminal marker");
        assert_eq!(d.token_events, 5, "{path}");
    }
    let x = post(addr, "/v1/messages", &[("x-sim-error-after", "5")], "{}").await;
    assert_eq!(x.status, 500);
    assert_eq!(x.json()["type"], "error");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalives_precede_the_first_token() {
    let server = SimServer::start("127.0.0.1:0", config()).await.unwrap();
    let addr = server.local_addr();
    let headers = [("x-sim-ttft-ms", "100"), ("x-sim-keepalive-ms", "30")];
    let x = post(
        addr,
        "/v1/chat/completions",
        &headers,
        &body_for("/v1/chat/completions", true, ""),
    )
    .await;
    let body = x.body();
    assert!(
        body.starts_with(": ping\n\n: ping\n\n: ping\n\ndata: "),
        "{}",
        &body[..60]
    );
    let d = decode_stream("/v1/chat/completions", &body);
    assert_eq!(d.pings, 3);
    check_text(&d, REASONING, ANSWER);
    // Pings are their own frames, at 30, 60, 90 ms.
    for (i, (at, frame)) in x.frames[..3].iter().enumerate() {
        assert_eq!(&frame[..], b": ping\n\n");
        assert!(*at >= Duration::from_millis(30 * (i as u64 + 1)));
    }
    // NDJSON gets none.
    let x = post(addr, "/api/chat", &headers, "{}").await;
    assert!(!x.body().contains("ping"));
    server.shutdown().await;
}

/// Waits (bounded) until `cond` holds; the server notices a hang-up
/// asynchronously, so this polls instead of sleeping a fixed time.
async fn eventually(mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    cond()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_disconnect_cancels_the_stream() {
    let server = SimServer::start("127.0.0.1:0", config()).await.unwrap();
    let addr = server.local_addr();
    for path in ["/v1/chat/completions", "/api/chat"] {
        let before = server.cancelled_streams();
        let (mut sender, conn) = connect(addr).await;
        let req = build(
            Method::POST,
            path,
            &[("x-sim-tokens", "100000"), ("x-sim-tps", "20")],
            &body_for(path, true, ""),
        );
        let response = sender.send_request(req).await.unwrap();
        let mut body = response.into_body();
        let first = body.frame().await.unwrap().unwrap();
        assert!(first.is_data());
        assert_eq!(server.active_streams(), 1);
        // Hang up: drop everything and close the socket.
        drop(body);
        drop(sender);
        conn.abort();
        assert!(
            eventually(|| server.cancelled_streams() == before + 1 && server.active_streams() == 0)
                .await,
            "{path}: cancelled {} active {}",
            server.cancelled_streams(),
            server.active_streams()
        );
    }
    // A whole reply abandoned mid-wait counts too.
    let (mut sender, conn) = connect(addr).await;
    let req = build(
        Method::POST,
        "/v1/chat/completions",
        &[("x-sim-ttft-ms", "60000")],
        "{}",
    );
    let pending = tokio::spawn(async move { sender.send_request(req).await.map(|_| ()) });
    assert!(eventually(|| server.active_streams() == 1).await);
    pending.abort();
    conn.abort();
    assert!(eventually(|| server.cancelled_streams() == 3 && server.active_streams() == 0).await);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_and_not_found() {
    let server = SimServer::start("127.0.0.1:0", config()).await.unwrap();
    let addr = server.local_addr();
    assert!(server.base_url().starts_with("http://127.0.0.1:"));
    assert_eq!(server.base_url(), format!("http://{addr}"));

    let x = get(addr, "/health").await;
    assert_eq!(
        (x.status, x.json()),
        (StatusCode::OK, serde_json::json!({"status":"ok"}))
    );
    let v = get(addr, "/v1/models").await.json();
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], "sim-model");
    let v = get(addr, "/api/tags").await.json();
    assert_eq!(v["models"][0]["name"], "sim-model");
    let v = get(addr, "/api/version").await.json();
    assert!(v["version"].is_string());

    for (method, path) in [
        (Method::GET, "/nope"),
        (Method::POST, "/v2/chat"),
        (Method::GET, "/v1/chat/completions"),
    ] {
        let x = request(addr, method, path, &[], "").await;
        assert_eq!(x.status, 404, "{path}");
        assert!(x.json().get("error").is_some());
    }
    let x = post(addr, "/v1/chat/completions", &[], "{not json").await;
    assert_eq!(x.status, 400);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_stops_serving() {
    let server = SimServer::start("127.0.0.1:0", config()).await.unwrap();
    let addr = server.local_addr();
    assert_eq!(get(addr, "/health").await.status, 200);
    server.shutdown().await;
    assert!(TcpStream::connect(addr).await.is_err());

    let bad = SimConfig {
        tokens_per_second: 0.0,
        ..config()
    };
    let err = SimServer::start("127.0.0.1:0", bad).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
}
