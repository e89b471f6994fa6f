//! Broken or unusual upstreams. Each test checks the bytes the client gets
//! against the bytes the upstream wrote, and the call's final status.

use std::time::Duration;

use speedtap::model::CallStatus;
use tokio::sync::mpsc;

use crate::proxy_support::engine_with;
use crate::quiescent;
use crate::wire::{chat_events, post, Conn, RawUpstream, CHAT, SSE_HEAD};

/// An engine in front of `up`, counting tokens by words (fast, exact).
async fn engine_for(up: &RawUpstream) -> speedtap::host::RunningEngine {
    engine_with(&up.url(), |o| {
        o.estimator = std::sync::Arc::new(speedtap::tokens::WordCounter)
    })
    .await
}

/// Sends one streaming chat request on a fresh connection and reads the
/// response as the client sees it.
async fn chat(
    engine: &speedtap::host::RunningEngine,
    extra: &[(&str, &str)],
) -> (crate::wire::Head, crate::wire::Body) {
    let addr = engine.routes[0].listen;
    let mut c = Conn::connect(addr).await;
    c.write(&post(addr, "/v1/chat/completions", CHAT, extra))
        .await
        .unwrap();
    let head = c.head().await.expect("response head");
    let body = c.body(&head).await;
    (head, body)
}

/// Upstream handler: read the request, send `head`, then each of `frames`
/// as its own chunk (or raw write when `raw`), then end per `end`.
#[derive(Clone, Copy, PartialEq)]
enum End {
    /// The last chunk and a clean connection.
    Clean,
    /// TCP reset after the frames.
    Reset,
    /// FIN after the frames (an HTTP/1.0 close-delimited body).
    Close,
}

async fn serve(mut c: Conn, head: &'static [u8], frames: Vec<Vec<u8>>, chunked: bool, end: End) {
    let Some(req) = c.head().await else { return };
    let _ = c.body(&req).await;
    if c.write(head).await.is_err() {
        return;
    }
    for f in &frames {
        let sent = if chunked {
            c.chunk(f).await
        } else {
            c.write(f).await
        };
        if sent.is_err() {
            return;
        }
        tokio::task::yield_now().await;
    }
    match end {
        End::Clean => {
            let _ = c.write(b"0\r\n\r\n").await;
            c.closed().await;
        }
        End::Reset => c.reset(),
        End::Close => drop(c),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_reset_mid_stream_truncates_the_client_and_ends_the_call() {
    let frames: Vec<Vec<u8>> = chat_events(40).into_iter().take(10).collect();
    let sent: Vec<u8> = frames.concat();
    let up =
        RawUpstream::start(move |c| serve(c, SSE_HEAD, frames.clone(), true, End::Reset)).await;
    let engine = engine_for(&up).await;
    let (head, body) = chat(&engine, &[]).await;
    assert_eq!(head.status(), 200);
    assert!(!body.complete, "the client must see the stream cut");
    assert!(
        sent.starts_with(&body.bytes),
        "what arrived must be a prefix of what was sent"
    );
    let calls = quiescent(&engine, 1).await;
    assert!(
        matches!(
            calls[0].status,
            CallStatus::Abandoned | CallStatus::UpstreamError
        ),
        "{:?}",
        calls[0].status
    );
    assert!(calls[0].speed.as_ref().unwrap().is_final);
    engine.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_utf8_passes_byte_exact_and_the_call_settles() {
    // Invalid sequences in content and in a comment, a code point split
    // across chunks, a bare continuation byte.
    let frames: Vec<Vec<u8>> = vec![
        b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\" caf\xC3".to_vec(),
        b"\xA9 \xFF\xFE bad \x80\"}}]}\n\n: \xC0\xAF comment\n\n".to_vec(),
        b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\" ok \xF0\x9F".to_vec(),
        b"\xA6\x80\"}}]}\r\n\r".to_vec(),
        b"\n".to_vec(),
    ]
    .into_iter()
    .chain(chat_events(3))
    .collect();
    let sent = frames.concat();
    let up =
        RawUpstream::start(move |c| serve(c, SSE_HEAD, frames.clone(), true, End::Clean)).await;
    let engine = engine_for(&up).await;
    let (head, body) = chat(&engine, &[]).await;
    assert_eq!(head.status(), 200);
    assert!(body.complete);
    assert_eq!(body.bytes, sent, "bytes changed on the way");
    let calls = quiescent(&engine, 1).await;
    assert_eq!(calls[0].status, CallStatus::Ok);
    assert!(calls[0].speed.as_ref().unwrap().output_tokens >= 3);
    engine.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ten_megabyte_sse_line_passes_and_is_metered() {
    // One `data:` line of 10 MiB of words, sent in 64 KiB chunks that cut
    // it anywhere, then the end of the stream.
    let words = " the quick brown fox";
    let mut line = b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"".to_vec();
    while line.len() < 10 * 1024 * 1024 {
        line.extend_from_slice(words.as_bytes());
    }
    line.extend_from_slice(b"\"}}]}\n\n");
    let mut frames: Vec<Vec<u8>> = line.chunks(64 * 1024).map(<[u8]>::to_vec).collect();
    frames.extend(chat_events(0));
    let sent = frames.concat();
    let up =
        RawUpstream::start(move |c| serve(c, SSE_HEAD, frames.clone(), true, End::Clean)).await;
    let engine = engine_for(&up).await;
    let (head, body) = chat(&engine, &[]).await;
    assert_eq!(head.status(), 200);
    assert!(body.complete);
    assert!(body.bytes == sent, "bytes changed on the way");
    let calls = quiescent(&engine, 1).await;
    assert_eq!(calls[0].status, CallStatus::Ok);
    let tokens = calls[0].speed.as_ref().unwrap().output_tokens;
    assert!(tokens > 2_000_000, "the line was metered: {tokens}");
    engine.shutdown(Duration::from_secs(1)).await;
}

/// A gzip member holding `data` in stored (uncompressed) deflate blocks:
/// a valid `Content-Encoding: gzip` body without a compression library.
fn gzip_stored(data: &[u8]) -> Vec<u8> {
    let mut out = vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];
    let blocks: Vec<&[u8]> = data.chunks(65_535).collect();
    for (i, block) in blocks.iter().enumerate() {
        out.push(u8::from(i + 1 == blocks.len()));
        let len = block.len() as u16;
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&(!len).to_le_bytes());
        out.extend_from_slice(block);
    }
    out.extend_from_slice(&crc32(data).to_le_bytes());
    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
    out
}

fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = (crc >> 1) ^ (0xEDB8_8320 & (!(crc & 1)).wrapping_add(1));
        }
    }
    !crc
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gzip_body_passes_untouched_and_the_call_is_unmetered() {
    const HEAD: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\
        Content-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n";
    let gz = gzip_stored(&chat_events(20).concat());
    let frames: Vec<Vec<u8>> = gz.chunks(97).map(<[u8]>::to_vec).collect();
    let (seen_tx, mut seen_rx) = mpsc::unbounded_channel();
    let up = RawUpstream::start(move |mut c| {
        let frames = frames.clone();
        let seen_tx = seen_tx.clone();
        async move {
            let Some(req) = c.head().await else { return };
            let _ = c.body(&req).await;
            let _ = seen_tx.send(req.header("accept-encoding").map(str::to_owned));
            let _ = c.write(HEAD).await;
            for f in &frames {
                let _ = c.chunk(f).await;
            }
            let _ = c.write(b"0\r\n\r\n").await;
            c.closed().await;
        }
    })
    .await;
    let engine = engine_for(&up).await;
    let (head, body) = chat(&engine, &[("Accept-Encoding", "gzip")]).await;
    // Metered requests ask for identity; this upstream compresses anyway.
    assert_eq!(seen_rx.recv().await.unwrap().as_deref(), Some("identity"));
    assert_eq!(head.status(), 200);
    assert_eq!(head.header("content-encoding"), Some("gzip"));
    assert!(body.complete);
    assert_eq!(body.bytes, gzip_stored(&chat_events(20).concat()));
    let calls = quiescent(&engine, 1).await;
    assert_eq!(calls[0].status, CallStatus::Unmetered);
    assert_eq!(calls[0].http_status, Some(200));
    engine.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_1_0_close_delimited_body_passes_and_settles() {
    const HEAD: &[u8] = b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n";
    let frames = chat_events(30);
    let sent = frames.concat();
    let up = RawUpstream::start(move |c| serve(c, HEAD, frames.clone(), false, End::Close)).await;
    let engine = engine_for(&up).await;
    let (head, body) = chat(&engine, &[]).await;
    assert_eq!(head.status(), 200);
    // The client's hop stays HTTP/1.1, chunked and open.
    assert!(head.line.starts_with("HTTP/1.1 "), "{head:?}");
    assert_eq!(head.header("transfer-encoding"), Some("chunked"));
    assert!(body.complete, "a close-delimited end is a clean end");
    assert_eq!(body.bytes, sent);
    let calls = quiescent(&engine, 1).await;
    assert_eq!(calls[0].status, CallStatus::Ok);
    assert_eq!(calls[0].speed.as_ref().unwrap().output_tokens, 30);
    engine.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expect_100_continue_and_informational_responses_pass() {
    // The upstream answers `Expect: 100-continue` with a 100, and sends a
    // 103 Early Hints before its final response.
    let frames = chat_events(10);
    let sent = frames.concat();
    let (seen_tx, mut seen_rx) = mpsc::unbounded_channel();
    let up = RawUpstream::start(move |mut c| {
        let frames = frames.clone();
        let seen_tx = seen_tx.clone();
        async move {
            let Some(req) = c.head().await else { return };
            if req.header("expect").is_some() {
                let _ = c.write(b"HTTP/1.1 100 Continue\r\n\r\n").await;
            }
            let body = c.body(&req).await;
            let _ = seen_tx.send(body.bytes);
            let _ = c
                .write(b"HTTP/1.1 103 Early Hints\r\nLink: </x>; rel=preload\r\n\r\n")
                .await;
            let _ = c.write(SSE_HEAD).await;
            for f in &frames {
                let _ = c.chunk(f).await;
            }
            let _ = c.write(b"0\r\n\r\n").await;
            c.closed().await;
        }
    })
    .await;
    let engine = engine_for(&up).await;
    let addr = engine.routes[0].listen;
    let mut c = Conn::connect(addr).await;
    let request = post(
        addr,
        "/v1/chat/completions",
        CHAT,
        &[("Expect", "100-continue")],
    );
    let split = request.len() - CHAT.len();
    c.write(&request[..split]).await.unwrap();
    // The proxy says 100 Continue before the client sends its body.
    let interim = c.head().await.expect("interim response");
    assert_eq!(interim.status(), 100, "{interim:?}");
    c.write(&request[split..]).await.unwrap();
    let head = c.head().await.expect("final head");
    assert_eq!(head.status(), 200, "{head:?}");
    let body = c.body(&head).await;
    assert!(body.complete);
    assert_eq!(body.bytes, sent);
    assert_eq!(seen_rx.recv().await.unwrap(), CHAT.as_bytes());
    let calls = quiescent(&engine, 1).await;
    assert_eq!(calls[0].status, CallStatus::Ok);
    engine.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_trailers_pass_when_the_client_accepts_them() {
    const HEAD: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\
        Trailer: x-checksum\r\nTransfer-Encoding: chunked\r\n\r\n";
    let frames = chat_events(5);
    let sent = frames.concat();
    let (seen_tx, mut seen_rx) = mpsc::unbounded_channel();
    let up = RawUpstream::start(move |mut c| {
        let frames = frames.clone();
        let seen_tx = seen_tx.clone();
        async move {
            while let Some(req) = c.head().await {
                let _ = c.body(&req).await;
                let _ = seen_tx.send(req.header("te").map(str::to_owned));
                let _ = c.write(HEAD).await;
                for f in &frames {
                    let _ = c.chunk(f).await;
                }
                let _ = c.write(b"0\r\nx-checksum: abc123\r\n\r\n").await;
            }
        }
    })
    .await;
    let engine = engine_for(&up).await;

    let (head, body) = chat(&engine, &[("TE", "trailers")]).await;
    assert_eq!(seen_rx.recv().await.unwrap().as_deref(), Some("trailers"));
    assert_eq!(head.status(), 200);
    assert!(body.complete);
    assert_eq!(body.bytes, sent);
    assert_eq!(
        body.trailers,
        vec![("x-checksum".to_owned(), "abc123".to_owned())]
    );

    // A client that did not ask for trailers gets none, and the same body.
    let (_, body) = chat(&engine, &[]).await;
    assert_eq!(seen_rx.recv().await.unwrap(), None);
    assert!(body.complete);
    assert_eq!(body.bytes, sent);
    assert!(body.trailers.is_empty());

    let calls = quiescent(&engine, 2).await;
    assert!(
        calls.iter().all(|c| c.status == CallStatus::Ok),
        "{calls:#?}"
    );
    engine.shutdown(Duration::from_secs(1)).await;
}
