//! Support for `tests/security.rs`: an upstream that answers every
//! protocol speedtap meters with a marker as the completion text (the
//! scripted simulator only ever says its word list), and records the
//! credentials it was sent, so a test can check that they reached it and
//! went nowhere else.
//!
//! The upstream runs on a runtime of its own in a background thread, so the
//! tests that use it stay plain synchronous code around a child process.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

/// `x-marker-mode`: how the upstream answers.
pub const MODE: &str = "x-marker-mode";
/// `x-marker-delay-ms`: the wait before the first output frame.
pub const DELAY_MS: &str = "x-marker-delay-ms";

/// How one request is answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// The protocol's stream: output with the marker (in text, reasoning
    /// and tool-call arguments where the protocol has them), then its end.
    Stream,
    /// The protocol's non-streamed JSON answer with the marker.
    Whole,
    /// A 400 whose JSON error message holds the marker.
    Status,
    /// A stream whose in-protocol error event holds the marker.
    StreamError,
}

impl Mode {
    pub fn header(self) -> &'static str {
        match self {
            Mode::Stream => "stream",
            Mode::Whole => "whole",
            Mode::Status => "status",
            Mode::StreamError => "stream-error",
        }
    }

    fn parse(s: &str) -> Mode {
        match s {
            "whole" => Mode::Whole,
            "status" => Mode::Status,
            "stream-error" => Mode::StreamError,
            _ => Mode::Stream,
        }
    }
}

/// The upstream, running until the process ends.
pub struct MarkerUpstream {
    pub addr: SocketAddr,
    /// The request headers of every request it got, lower-case names.
    pub seen: Arc<Mutex<Vec<HashMap<String, String>>>>,
}

impl MarkerUpstream {
    /// Starts the upstream; every answer carries `marker`.
    pub fn start(marker: &str) -> MarkerUpstream {
        let seen: Arc<Mutex<Vec<HashMap<String, String>>>> = Arc::default();
        let (tx, rx) = std::sync::mpsc::channel();
        let marker = marker.to_string();
        let seen2 = seen.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
                tx.send(listener.local_addr().unwrap()).unwrap();
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        continue;
                    };
                    let marker = marker.clone();
                    let seen = seen2.clone();
                    tokio::spawn(async move {
                        let service =
                            service_fn(move |req| answer(req, marker.clone(), seen.clone()));
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                    });
                }
            });
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the marker upstream starts");
        MarkerUpstream { addr, seen }
    }
}

type Body = BoxBody<Bytes, Infallible>;

async fn answer(
    req: Request<Incoming>,
    marker: String,
    seen: Arc<Mutex<Vec<HashMap<String, String>>>>,
) -> Result<Response<Body>, Infallible> {
    let headers: HashMap<String, String> = req
        .headers()
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let mode = Mode::parse(headers.get(MODE).map_or("", |v| v.as_str()));
    let delay = headers
        .get(DELAY_MS)
        .and_then(|v| v.parse().ok())
        .map(Duration::from_millis)
        .unwrap_or(Duration::ZERO);
    seen.lock().unwrap().push(headers);
    let path = req.uri().path().to_string();
    // Read the request to its end, as a server does.
    let _ = req.into_body().collect().await;

    let m = marker.as_str();
    let resp = match mode {
        Mode::Status => json_response(
            StatusCode::BAD_REQUEST,
            json!({"error": {"message": format!("{m} is not a valid prompt"),
                             "type": "invalid_request_error"}}),
        ),
        Mode::Whole => json_response(StatusCode::OK, whole(&path, m)),
        Mode::Stream | Mode::StreamError => {
            let (content_type, frames) = stream(&path, m, mode == Mode::StreamError);
            streamed(content_type, frames, delay)
        }
    };
    Ok(resp)
}

fn json_response(status: StatusCode, v: Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(v.to_string())).boxed())
        .unwrap()
}

/// Sends `frames` one by one, the first after `delay`.
fn streamed(content_type: &str, frames: Vec<String>, delay: Duration) -> Response<Body> {
    let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, Infallible>>(16);
    tokio::spawn(async move {
        tokio::time::sleep(delay).await;
        for f in frames {
            if tx.send(Ok(Frame::data(Bytes::from(f)))).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    let body = StreamBody::new(tokio_stream_from(rx));
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", content_type)
        .body(BodyExt::boxed(body))
        .unwrap()
}

/// An `mpsc::Receiver` as a `Stream`, without a tokio-stream dependency.
fn tokio_stream_from<T>(rx: mpsc::Receiver<T>) -> impl futures_util::Stream<Item = T> {
    futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|v| (v, rx)) })
}

fn sse(v: Value) -> String {
    format!("data: {v}\n\n")
}

fn sse_event(event: &str, v: Value) -> String {
    format!("event: {event}\ndata: {v}\n\n")
}

fn line(v: Value) -> String {
    format!("{v}\n")
}

/// The content type and frames of the protocol at `path`, with `m` as
/// reasoning, text and tool-call arguments where the protocol has them;
/// `error` ends it with the protocol's in-stream error naming `m` instead.
fn stream(path: &str, m: &str, error: bool) -> (&'static str, Vec<String>) {
    const SSE: &str = "text/event-stream";
    const NDJSON: &str = "application/x-ndjson";
    let args = json!({"query": m}).to_string();
    match path {
        "/v1/chat/completions" => {
            let chunk = |delta: Value, finish: Value| {
                sse(
                    json!({"id": "chatcmpl-1", "object": "chat.completion.chunk",
                           "created": 1, "model": "marker-model",
                           "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}),
                )
            };
            let mut f = vec![
                chunk(json!({"role": "assistant", "content": ""}), Value::Null),
                chunk(json!({"reasoning_content": m}), Value::Null),
                chunk(json!({"content": m}), Value::Null),
                chunk(
                    json!({"tool_calls": [{"index": 0, "id": "call-1", "type": "function",
                                           "function": {"name": "lookup", "arguments": args}}]}),
                    Value::Null,
                ),
            ];
            if error {
                f.push(sse(
                    json!({"error": {"message": m, "type": "server_error"}}),
                ));
            } else {
                f.push(chunk(json!({}), json!("stop")));
                f.push(sse(
                    json!({"id": "chatcmpl-1", "object": "chat.completion.chunk",
                                  "created": 1, "model": "marker-model", "choices": [],
                                  "usage": {"prompt_tokens": 5, "completion_tokens": 9,
                                            "total_tokens": 14}}),
                ));
                f.push("data: [DONE]\n\n".into());
            }
            (SSE, f)
        }
        "/v1/completions" => {
            let mut f = vec![sse(json!({"id": "cmpl-1", "object": "text_completion",
                                        "model": "marker-model",
                                        "choices": [{"index": 0, "text": m, "finish_reason": null}]}))];
            if error {
                f.push(sse(json!({"error": {"message": m}})));
            } else {
                f.push(sse(json!({"id": "cmpl-1", "object": "text_completion",
                                  "model": "marker-model",
                                  "choices": [{"index": 0, "text": "", "finish_reason": "stop"}]})));
                f.push("data: [DONE]\n\n".into());
            }
            (SSE, f)
        }
        "/v1/responses" => {
            let mut f = vec![
                sse_event(
                    "response.created",
                    json!({"type": "response.created",
                           "response": {"id": "resp-1", "status": "in_progress", "model": "marker-model"}}),
                ),
                sse_event(
                    "response.reasoning_text.delta",
                    json!({"type": "response.reasoning_text.delta", "delta": m}),
                ),
                sse_event(
                    "response.output_text.delta",
                    json!({"type": "response.output_text.delta", "delta": m}),
                ),
                sse_event(
                    "response.function_call_arguments.delta",
                    json!({"type": "response.function_call_arguments.delta", "delta": args}),
                ),
            ];
            if error {
                f.push(sse_event("error", json!({"type": "error", "message": m})));
            } else {
                f.push(sse_event(
                    "response.completed",
                    json!({"type": "response.completed",
                           "response": {"id": "resp-1", "status": "completed", "model": "marker-model",
                                        "usage": {"input_tokens": 5, "output_tokens": 9, "total_tokens": 14}}}),
                ));
            }
            (SSE, f)
        }
        "/v1/messages" => {
            let mut f = vec![
                sse_event(
                    "message_start",
                    json!({"type": "message_start",
                           "message": {"id": "msg-1", "type": "message", "role": "assistant",
                                       "model": "marker-model", "content": [],
                                       "usage": {"input_tokens": 5, "output_tokens": 1}}}),
                ),
                sse_event(
                    "content_block_start",
                    json!({"type": "content_block_start", "index": 0,
                           "content_block": {"type": "thinking", "thinking": ""}}),
                ),
                sse_event(
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": 0,
                           "delta": {"type": "thinking_delta", "thinking": m}}),
                ),
                sse_event(
                    "content_block_stop",
                    json!({"type": "content_block_stop", "index": 0}),
                ),
                sse_event(
                    "content_block_start",
                    json!({"type": "content_block_start", "index": 1,
                           "content_block": {"type": "text", "text": ""}}),
                ),
                sse_event(
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": 1,
                           "delta": {"type": "text_delta", "text": m}}),
                ),
                sse_event(
                    "content_block_stop",
                    json!({"type": "content_block_stop", "index": 1}),
                ),
                sse_event(
                    "content_block_start",
                    json!({"type": "content_block_start", "index": 2,
                           "content_block": {"type": "tool_use", "id": "tu-1", "name": "lookup", "input": {}}}),
                ),
                sse_event(
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": 2,
                           "delta": {"type": "input_json_delta", "partial_json": args}}),
                ),
                sse_event(
                    "content_block_stop",
                    json!({"type": "content_block_stop", "index": 2}),
                ),
            ];
            if error {
                f.push(sse_event(
                    "error",
                    json!({"type": "error", "error": {"type": "overloaded_error", "message": m}}),
                ));
            } else {
                f.push(sse_event(
                    "message_delta",
                    json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                           "usage": {"output_tokens": 9}}),
                ));
                f.push(sse_event("message_stop", json!({"type": "message_stop"})));
            }
            (SSE, f)
        }
        "/api/chat" => {
            let mut f = vec![
                line(
                    json!({"model": "marker-model", "created_at": "2026-01-01T00:00:00Z",
                            "message": {"role": "assistant", "content": "", "thinking": m}, "done": false}),
                ),
                line(
                    json!({"model": "marker-model", "created_at": "2026-01-01T00:00:00Z",
                            "message": {"role": "assistant", "content": m}, "done": false}),
                ),
            ];
            if error {
                f.push(line(json!({"error": m})));
            } else {
                f.push(line(
                    json!({"model": "marker-model", "created_at": "2026-01-01T00:00:00Z",
                                   "message": {"role": "assistant", "content": ""}, "done": true,
                                   "done_reason": "stop", "prompt_eval_count": 5, "eval_count": 9,
                                   "eval_duration": 90_000_000u64}),
                ));
            }
            (NDJSON, f)
        }
        "/api/generate" => {
            let mut f = vec![line(
                json!({"model": "marker-model", "created_at": "2026-01-01T00:00:00Z",
                       "response": m, "done": false}),
            )];
            if error {
                f.push(line(json!({"error": m})));
            } else {
                f.push(line(
                    json!({"model": "marker-model", "created_at": "2026-01-01T00:00:00Z",
                                   "response": "", "done": true, "done_reason": "stop",
                                   "prompt_eval_count": 5, "eval_count": 9,
                                   "eval_duration": 90_000_000u64}),
                ));
            }
            (NDJSON, f)
        }
        "/completion" => {
            let mut f = vec![sse(json!({"content": m, "stop": false}))];
            if error {
                f.push(sse(
                    json!({"error": {"code": 500, "message": m, "type": "server_error"}}),
                ));
            } else {
                f.push(sse(
                    json!({"content": "", "stop": true, "tokens_predicted": 9,
                                  "tokens_evaluated": 5}),
                ));
            }
            (SSE, f)
        }
        // TGI: `/generate_stream` (and anything else).
        _ => {
            let mut f = vec![format!(
                "data:{}\n\n",
                json!({"index": 1, "token": {"id": 1, "text": m, "logprob": 0.0, "special": false},
                       "generated_text": null, "details": null})
            )];
            if error {
                f.push(format!(
                    "data:{}\n\n",
                    json!({"error": m, "error_type": "generation"})
                ));
            } else {
                f.push(format!(
                    "data:{}\n\n",
                    json!({"index": 2, "token": {"id": 2, "text": "", "logprob": 0.0, "special": true},
                           "generated_text": m,
                           "details": {"finish_reason": "eos_token", "generated_tokens": 2}})
                ));
            }
            ("text/event-stream", f)
        }
    }
}

/// The non-streamed answer of the protocol at `path`, with `m` as text.
fn whole(path: &str, m: &str) -> Value {
    match path {
        "/v1/chat/completions" => json!({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "marker-model",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": m,
                                                 "reasoning_content": m},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14}}),
        "/v1/messages" => json!({
            "id": "msg-1", "type": "message", "role": "assistant", "model": "marker-model",
            "content": [{"type": "text", "text": m}], "stop_reason": "end_turn",
            "usage": {"input_tokens": 5, "output_tokens": 9}}),
        "/api/chat" => json!({
            "model": "marker-model", "created_at": "2026-01-01T00:00:00Z",
            "message": {"role": "assistant", "content": m}, "done": true, "done_reason": "stop",
            "prompt_eval_count": 5, "eval_count": 9, "eval_duration": 90_000_000u64}),
        _ => json!([{"generated_text": m}]),
    }
}
