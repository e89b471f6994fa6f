//! The protocol decides a call's end, not the transport. For each of the
//! eight streaming protocols, through the real proxy: the upstream sends
//! the stream and its terminal marker, then ends its connection in the
//! worst way for the meter (never sending its end of body until the client
//! has gone, resetting, or going silent until the idle timeout fires). The
//! call must be `ok` with a rate every time. A client that hangs up one
//! frame before the marker still leaves an `abandoned` call.
//!
//! No timing luck: each test orders its events with signals (the client
//! reads the marker before anything ends the connection, the upstream
//! holds until the proxy has closed), never with sleeps; the only pacing
//! is the stream's own schedule, which gives the client-clock rate a span
//! to measure.

use std::sync::Arc;
use std::time::Duration;

use speedtap::model::CallStatus;

use speedtap::host::RunningEngine;
use tokio::io::{AsyncBufReadExt, AsyncReadExt};
use tokio::sync::Notify;

/// One signal per protocol (by its index in [`scripts`]): its client has
/// read the marker. A [`Notify`] keeps the one permit until its upstream
/// connection waits for it.
type Signals = Arc<Vec<Notify>>;

fn signals() -> Signals {
    Arc::new(scripts().iter().map(|_| Notify::new()).collect())
}

fn index_of(path: &str) -> Option<usize> {
    scripts().iter().position(|s| s.path == path)
}

use crate::proxy_support::engine_with;
use crate::quiescent;
use crate::wire::{post, Conn, RawUpstream};

/// Tokens each stream carries, one word per frame.
const TOKENS: usize = 30;
/// Time between frames: 29 gaps of 25 ms span 725 ms, over the 500 ms the
/// client-clock rate needs.
const PACE: Duration = Duration::from_millis(25);

/// One protocol's exchange, as an upstream writes it.
struct Script {
    path: &'static str,
    request: String,
    content_type: &'static str,
    /// The streamed output, one token per frame.
    body: Vec<Vec<u8>>,
    /// The frames that end the stream; the last holds the terminal marker.
    end: Vec<Vec<u8>>,
}

fn sse(event: Option<&str>, data: &str) -> Vec<u8> {
    match event {
        Some(e) => format!("event: {e}\ndata: {data}\n\n").into_bytes(),
        None => format!("data: {data}\n\n").into_bytes(),
    }
}

fn ndjson(line: &str) -> Vec<u8> {
    format!("{line}\n").into_bytes()
}

/// The eight protocols, each with `model: "m"` asked for `stream`.
fn scripts() -> Vec<Script> {
    let repeat = |frame: Vec<u8>| vec![frame; TOKENS];
    vec![
        Script {
            path: "/v1/chat/completions",
            request: r#"{"messages":[],"model":"m","stream":true}"#.into(),
            content_type: "text/event-stream",
            body: repeat(sse(
                None,
                r#"{"choices":[{"index":0,"delta":{"content":" the"}}]}"#,
            )),
            end: vec![
                sse(
                    None,
                    r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
                ),
                sse(None, "[DONE]"),
            ],
        },
        Script {
            path: "/v1/completions",
            request: r#"{"prompt":"x","model":"m","stream":true}"#.into(),
            content_type: "text/event-stream",
            body: repeat(sse(None, r#"{"choices":[{"text":" the","index":0}]}"#)),
            end: vec![
                sse(
                    None,
                    r#"{"choices":[{"text":"","index":0,"finish_reason":"stop"}]}"#,
                ),
                sse(None, "[DONE]"),
            ],
        },
        Script {
            path: "/v1/responses",
            request: r#"{"input":"x","model":"m","stream":true}"#.into(),
            content_type: "text/event-stream",
            body: repeat(sse(
                Some("response.output_text.delta"),
                r#"{"type":"response.output_text.delta","delta":" the"}"#,
            )),
            end: vec![sse(
                Some("response.completed"),
                r#"{"type":"response.completed","response":{"id":"r","status":"completed"}}"#,
            )],
        },
        Script {
            path: "/v1/messages",
            request: r#"{"max_tokens":64,"messages":[],"model":"m","stream":true}"#.into(),
            content_type: "text/event-stream",
            body: repeat(sse(
                Some("content_block_delta"),
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" the"}}"#,
            )),
            end: vec![
                sse(
                    Some("content_block_stop"),
                    r#"{"type":"content_block_stop","index":0}"#,
                ),
                sse(Some("message_stop"), r#"{"type":"message_stop"}"#),
            ],
        },
        Script {
            path: "/api/chat",
            request: r#"{"messages":[],"model":"m"}"#.into(),
            content_type: "application/x-ndjson",
            body: repeat(ndjson(
                r#"{"model":"m","message":{"role":"assistant","content":" the"},"done":false}"#,
            )),
            end: vec![ndjson(
                r#"{"model":"m","message":{"role":"assistant","content":""},"done":true}"#,
            )],
        },
        Script {
            path: "/api/generate",
            request: r#"{"prompt":"x","model":"m"}"#.into(),
            content_type: "application/x-ndjson",
            body: repeat(ndjson(r#"{"model":"m","response":" the","done":false}"#)),
            end: vec![ndjson(r#"{"model":"m","response":"","done":true}"#)],
        },
        Script {
            path: "/completion",
            request: r#"{"prompt":"x","model":"m","stream":true}"#.into(),
            content_type: "text/event-stream",
            body: repeat(sse(None, r#"{"index":0,"content":" the","stop":false}"#)),
            end: vec![sse(None, r#"{"index":0,"content":"","stop":true}"#)],
        },
        Script {
            path: "/generate_stream",
            request: r#"{"inputs":"x","model":"m"}"#.into(),
            content_type: "text/event-stream",
            body: repeat(sse(
                None,
                r#"{"index":0,"token":{"id":1,"text":" the","logprob":0.0,"special":false},"generated_text":null,"details":null}"#,
            )),
            end: vec![sse(
                None,
                &format!(
                    r#"{{"index":1,"token":{{"id":2,"text":"","logprob":0.0,"special":true}},"generated_text":"x","details":{{"finish_reason":"eos_token","generated_tokens":{TOKENS}}}}}"#
                ),
            )],
        },
    ]
}

/// How the upstream ends its connection once its frames are out.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Ending {
    /// Sends the whole stream, then never its end of body: it waits until
    /// the proxy closes the connection (the client left first).
    HoldUntilClosed,
    /// Sends the whole stream, waits until the client has read the marker,
    /// then resets the connection.
    ResetAfterMarker,
    /// Sends the stream without its end frames, then waits until the proxy
    /// closes the connection.
    HoldBeforeMarker,
}

/// An upstream that plays each request's script (chosen by its path) and
/// ends as `ending` says. `marker_read` is raised by each client.
async fn upstream(ending: Ending, marker_read: Signals) -> RawUpstream {
    RawUpstream::start(move |mut c| {
        let marker_read = marker_read.clone();
        async move {
            let Some(req) = c.head().await else { return };
            let _ = c.body(&req).await;
            let path = req.line.split_whitespace().nth(1).unwrap_or("").to_owned();
            let Some(index) = index_of(&path) else { return };
            let script = scripts().swap_remove(index);
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: {}\r\nTransfer-Encoding: chunked\r\n\r\n",
                script.content_type
            );
            if c.write(head.as_bytes()).await.is_err() {
                return;
            }
            let mut pace = tokio::time::interval(PACE);
            for frame in &script.body {
                pace.tick().await;
                if c.chunk(frame).await.is_err() {
                    return;
                }
            }
            if ending != Ending::HoldBeforeMarker {
                for frame in &script.end {
                    if c.chunk(frame).await.is_err() {
                        return;
                    }
                }
            }
            match ending {
                Ending::HoldUntilClosed | Ending::HoldBeforeMarker => c.closed().await,
                Ending::ResetAfterMarker => {
                    marker_read[index].notified().await;
                    c.reset();
                }
            }
        }
    })
    .await
}

/// Reads a chunked body chunk by chunk until the bytes received end with
/// `until`; returns false if the body ended or failed first.
async fn read_until(c: &mut Conn, until: &[u8]) -> bool {
    let mut got = Vec::new();
    loop {
        let mut line = String::new();
        match c.io.read_line(&mut line).await {
            Ok(0) | Err(_) => return false,
            Ok(_) => {}
        }
        let Ok(size) = usize::from_str_radix(line.trim_end(), 16) else {
            return false;
        };
        if size == 0 {
            return false;
        }
        let start = got.len();
        got.resize(start + size + 2, 0);
        if c.io.read_exact(&mut got[start..]).await.is_err() {
            return false;
        }
        got.truncate(start + size);
        if got.ends_with(until) {
            return true;
        }
    }
}

/// Reads whatever else comes until the connection ends.
async fn drain(mut c: Conn) {
    let mut buf = [0u8; 4096];
    while let Ok(n) = c.io.read(&mut buf).await {
        if n == 0 {
            return;
        }
    }
}

/// What the client does once it has read up to `until`.
#[derive(Clone, Copy, PartialEq)]
enum Client {
    /// Hangs up at once (the `openai` SDK at `[DONE]`).
    HangsUp,
    /// Tells the upstream, then reads on until the connection ends.
    ReadsOn,
}

/// One call per protocol, concurrently: each client reads up to the last
/// byte of `until(script)`, then acts as `client` says.
async fn run(
    engine: &RunningEngine,
    marker_read: Signals,
    until: fn(&Script) -> Vec<u8>,
    client: Client,
) {
    let addr = engine.routes[0].listen;
    let mut tasks = Vec::new();
    for (index, script) in scripts().into_iter().enumerate() {
        let marker_read = marker_read.clone();
        tasks.push(tokio::spawn(async move {
            let mut c = Conn::connect(addr).await;
            c.write(&post(addr, script.path, &script.request, &[]))
                .await
                .unwrap();
            let head = c.head().await.expect("response head");
            assert_eq!(head.status(), 200, "{}", script.path);
            let until = until(&script);
            assert!(
                read_until(&mut c, &until).await,
                "{}: stream ended early",
                script.path
            );
            match client {
                Client::HangsUp => drop(c),
                Client::ReadsOn => {
                    marker_read[index].notify_one();
                    drain(c).await;
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

fn marker(s: &Script) -> Vec<u8> {
    s.end.last().cloned().unwrap_or_default()
}

fn last_token(s: &Script) -> Vec<u8> {
    s.body.last().cloned().unwrap_or_default()
}

/// Checks that every protocol's call came out `expected`, with a rate when
/// it is `ok`.
async fn assert_calls(engine: &RunningEngine, expected: CallStatus) {
    let calls = quiescent(engine, scripts().len()).await;
    assert_eq!(calls.len(), scripts().len());
    for call in &calls {
        let api = call.identity.api;
        assert_eq!(call.status, expected, "{api}: {call:#?}");
        assert_eq!(call.identity.model.as_deref(), Some("m"), "{api}");
        let speed = call.speed.as_ref().expect("metered");
        if expected == CallStatus::Ok {
            let rate = speed.output_tokens_per_second.expect("a settled rate");
            assert!(rate > 0.0, "{api}: {rate}");
            assert_eq!(speed.output_tokens, TOKENS as u64, "{api}");
        } else {
            assert_eq!(speed.output_tokens_per_second, None, "{api}");
        }
    }
}

async fn engine(up: &RawUpstream, idle: Option<Duration>) -> RunningEngine {
    engine_with(&up.url(), |o| {
        o.estimator = Arc::new(speedtap::tokens::WordCounter);
        o.proxy_limits.idle_timeout = idle;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_hangs_up_at_the_marker_before_the_end_of_body_leaves_an_ok_call() {
    let signal = signals();
    let up = upstream(Ending::HoldUntilClosed, signal.clone()).await;
    let engine = engine(&up, None).await;
    run(&engine, signal, marker, Client::HangsUp).await;
    assert_calls(&engine, CallStatus::Ok).await;
    engine.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_reset_after_the_marker_leaves_an_ok_call() {
    let signal = signals();
    let up = upstream(Ending::ResetAfterMarker, signal.clone()).await;
    let engine = engine(&up, None).await;
    run(&engine, signal, marker, Client::ReadsOn).await;
    assert_calls(&engine, CallStatus::Ok).await;
    engine.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_idle_timeout_firing_after_the_marker_leaves_an_ok_call() {
    let signal = signals();
    let up = upstream(Ending::HoldUntilClosed, signal.clone()).await;
    let engine = engine(&up, Some(Duration::from_millis(300))).await;
    run(&engine, signal, marker, Client::ReadsOn).await;
    assert_calls(&engine, CallStatus::Ok).await;
    engine.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_hangs_up_one_frame_before_the_marker_leaves_an_abandoned_call() {
    let signal = signals();
    let up = upstream(Ending::HoldBeforeMarker, signal.clone()).await;
    let engine = engine(&up, None).await;
    run(&engine, signal, last_token, Client::HangsUp).await;
    assert_calls(&engine, CallStatus::Abandoned).await;
    engine.shutdown(Duration::from_secs(1)).await;
}
