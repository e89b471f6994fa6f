//! Clients that go away: during their request body, while waiting for the
//! first token, and mid-stream. Each call ends `abandoned`, the upstream
//! connection is closed (so the server stops generating), and no call is
//! left in flight.

use std::time::Duration;

use speedtap::model::CallStatus;
use tokio::sync::mpsc;

use crate::proxy_support::engine_with;
use crate::quiescent;
use crate::wire::{chat_events, post, Conn, RawUpstream, CHAT, SSE_HEAD};

/// What the upstream reports to the test.
#[derive(Debug, PartialEq)]
enum Seen {
    /// It has the request head.
    Head,
    /// It has the whole request.
    Request,
    /// It has started streaming.
    Streaming,
    /// The proxy closed the connection.
    Closed,
}

/// Waits for the next report (bounded, so a missed close fails the test).
async fn next(rx: &mut mpsc::UnboundedReceiver<Seen>) -> Seen {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("the upstream reported in time")
        .expect("upstream alive")
}

/// An upstream that reads the request, then streams a token every 20 ms
/// for a minute, reporting each stage and the proxy's hang-up.
async fn start_upstream() -> (RawUpstream, mpsc::UnboundedReceiver<Seen>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let up = RawUpstream::start(move |mut c| {
        let tx = tx.clone();
        async move {
            let Some(req) = c.head().await else { return };
            let _ = tx.send(Seen::Head);
            let body = c.body(&req).await;
            if !body.complete {
                let _ = tx.send(Seen::Closed);
                return;
            }
            let _ = tx.send(Seen::Request);
            // Think for a while; a hang-up now shows as EOF.
            tokio::select! {
                _ = c.closed() => {
                    let _ = tx.send(Seen::Closed);
                    return;
                }
                _ = tokio::time::sleep(Duration::from_millis(300)) => {}
            }
            if c.write(SSE_HEAD).await.is_err() {
                let _ = tx.send(Seen::Closed);
                return;
            }
            let _ = tx.send(Seen::Streaming);
            for event in chat_events(3000) {
                if c.chunk(&event).await.is_err() {
                    let _ = tx.send(Seen::Closed);
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    })
    .await;
    (up, rx)
}

async fn engine(up: &RawUpstream) -> speedtap::host::RunningEngine {
    engine_with(&up.url(), |o| {
        o.estimator = std::sync::Arc::new(speedtap::tokens::WordCounter)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_aborting_its_request_body_abandons_the_call() {
    let (up, mut seen) = start_upstream().await;
    let engine = engine(&up).await;
    let addr = engine.routes[0].listen;
    let mut c = Conn::connect(addr).await;
    // Announce 1,000 bytes of body, send 20, then hang up.
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\n\
         Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    );
    c.write(head.as_bytes()).await.unwrap();
    c.write(&CHAT.as_bytes()[..20]).await.unwrap();
    assert_eq!(next(&mut seen).await, Seen::Head);
    drop(c);
    assert_eq!(next(&mut seen).await, Seen::Closed);
    let calls = quiescent(&engine, 1).await;
    assert_eq!(calls[0].status, CallStatus::Abandoned, "{:#?}", calls[0]);
    engine.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_leaving_during_the_first_token_wait_abandons_the_call() {
    let (up, mut seen) = start_upstream().await;
    let engine = engine(&up).await;
    let addr = engine.routes[0].listen;
    let mut c = Conn::connect(addr).await;
    c.write(&post(addr, "/v1/chat/completions", CHAT, &[]))
        .await
        .unwrap();
    assert_eq!(next(&mut seen).await, Seen::Head);
    assert_eq!(next(&mut seen).await, Seen::Request);
    drop(c);
    assert_eq!(next(&mut seen).await, Seen::Closed);
    let calls = quiescent(&engine, 1).await;
    assert_eq!(calls[0].status, CallStatus::Abandoned, "{:#?}", calls[0]);
    let speed = calls[0].speed.as_ref().unwrap();
    assert!(speed.is_final);
    assert_eq!(speed.time_to_first_token_ms, None);
    engine.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_leaving_mid_stream_abandons_the_call() {
    let (up, mut seen) = start_upstream().await;
    let engine = engine(&up).await;
    let addr = engine.routes[0].listen;
    let mut c = Conn::connect(addr).await;
    c.write(&post(addr, "/v1/chat/completions", CHAT, &[]))
        .await
        .unwrap();
    let head = c.head().await.expect("head");
    assert_eq!(head.status(), 200);
    // Read a few tokens' worth, then leave.
    let mut got = Vec::new();
    let mut buf = [0u8; 256];
    while got.windows(4).filter(|w| w == b" the").count() < 3 {
        use tokio::io::AsyncReadExt;
        let n = c.io.read(&mut buf).await.unwrap();
        assert!(n > 0, "stream ended early");
        got.extend_from_slice(&buf[..n]);
    }
    drop(c);
    assert_eq!(next(&mut seen).await, Seen::Head);
    assert_eq!(next(&mut seen).await, Seen::Request);
    assert_eq!(next(&mut seen).await, Seen::Streaming);
    assert_eq!(next(&mut seen).await, Seen::Closed);
    let calls = quiescent(&engine, 1).await;
    assert_eq!(calls[0].status, CallStatus::Abandoned, "{:#?}", calls[0]);
    assert!(calls[0].speed.as_ref().unwrap().output_tokens >= 3);
    engine.shutdown(Duration::from_secs(1)).await;
}

/// A request the decoders don't know (unmetered, no call actor) whose
/// client leaves while the upstream is still thinking is still recorded,
/// as `abandoned`, and the upstream connection is closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_leaving_an_unmetered_request_before_the_answer_abandons_it() {
    let (up, mut seen) = start_upstream().await;
    let engine = engine(&up).await;
    let addr = engine.routes[0].listen;
    let mut c = Conn::connect(addr).await;
    c.write(&post(addr, "/v1/not-a-model-endpoint", CHAT, &[]))
        .await
        .unwrap();
    assert_eq!(next(&mut seen).await, Seen::Head);
    assert_eq!(next(&mut seen).await, Seen::Request);
    drop(c);
    assert_eq!(next(&mut seen).await, Seen::Closed);
    let calls = quiescent(&engine, 1).await;
    assert_eq!(calls[0].status, CallStatus::Abandoned, "{:#?}", calls[0]);
    assert!(calls[0].speed.is_none(), "{:#?}", calls[0]);
    engine.shutdown(Duration::from_secs(1)).await;
}
