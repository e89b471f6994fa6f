//! Long contexts: request bodies whose `messages` come before `model` and
//! `stream` (as the `openai` Python SDK writes them), 300 KB and 30 MB
//! long. The call keeps its model and its stream flag at any size.
//!
//! The upstream answers without a `Content-Type`, so the framing the meter
//! uses comes from the request's stream flag alone: a chat or Anthropic
//! stream is only decoded (and `ok` with its tokens) if `"stream": true`
//! was read, and an Ollama chat that ends its body with `"stream": false`
//! is only timed as one JSON reply if that `false` was read (its first
//! frame is then the first token; read as the Ollama default, a stream,
//! the first token would be its second frame, sent [`SECOND_FRAME_AFTER`]
//! later, at the end).

use std::time::Duration;

use speedtap::model::CallStatus;
use tokio::io::AsyncReadExt;

use crate::proxy_support::engine_with;
use crate::quiescent;
use crate::wire::{Conn, RawUpstream};

/// How long the Ollama reply waits between its two frames.
const SECOND_FRAME_AFTER: Duration = Duration::from_millis(500);

/// The client's writes while it sends the long part of a body.
const PIECE: usize = 64 * 1024;

struct LongCall {
    path: &'static str,
    /// What comes before the long content, and what closes the body.
    open: &'static str,
    close: &'static str,
}

const CALLS: [LongCall; 3] = [
    LongCall {
        path: "/v1/chat/completions",
        open: r#"{"messages":[{"role":"user","content":""#,
        close: r#""}],"model":"m","stream":true}"#,
    },
    LongCall {
        path: "/v1/messages",
        open: r#"{"max_tokens":64,"messages":[{"role":"user","content":""#,
        close: r#""}],"model":"m","stream":true}"#,
    },
    LongCall {
        path: "/api/chat",
        open: r#"{"messages":[{"role":"user","content":""#,
        close: r#""}],"model":"m","stream":false}"#,
    },
];

/// Reads and drops a request body of `len` bytes.
async fn discard(c: &mut Conn, mut len: usize) -> bool {
    let mut buf = vec![0u8; PIECE];
    while len > 0 {
        let want = len.min(buf.len());
        match c.io.read(&mut buf[..want]).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => len -= n,
        }
    }
    true
}

async fn upstream() -> RawUpstream {
    RawUpstream::start(|mut c| async move {
        let Some(req) = c.head().await else { return };
        let len: usize = req
            .header("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        if !discard(&mut c, len).await {
            return;
        }
        let path = req.line.split_whitespace().nth(1).unwrap_or("").to_owned();
        // No Content-Type: the request's stream flag decides the framing.
        let head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
        if c.write(head).await.is_err() {
            return;
        }
        let frames: Vec<&[u8]> = match path.as_str() {
            "/v1/chat/completions" => vec![
                b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"one two three\"}}]}\n\n",
                b"data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n",
            ],
            "/v1/messages" => vec![
                b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"one two three\"}}\n\n",
                b"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
            ],
            _ => vec![
                b"{\"model\":\"m\",",
                b"\"message\":{\"role\":\"assistant\",\"content\":\"one two three\"},\"done\":true}",
            ],
        };
        for (i, f) in frames.iter().enumerate() {
            if i == 1 && path == "/api/chat" {
                tokio::time::sleep(SECOND_FRAME_AFTER).await;
            }
            if c.chunk(f).await.is_err() {
                return;
            }
        }
        let _ = c.write(b"0\r\n\r\n").await;
        c.closed().await;
    })
    .await
}

/// Sends `call` with `long` bytes of content, written in pieces as a
/// client streams a big body, and reads the reply to its end.
async fn send(addr: std::net::SocketAddr, call: &LongCall, long: usize) {
    let len = call.open.len() + long + call.close.len();
    let mut c = Conn::connect(addr).await;
    let head = format!(
        "POST {} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {len}\r\n\r\n",
        call.path
    );
    c.write(head.as_bytes()).await.unwrap();
    c.write(call.open.as_bytes()).await.unwrap();
    let piece = vec![b'x'; PIECE];
    let mut left = long;
    while left > 0 {
        let n = left.min(PIECE);
        c.write(&piece[..n]).await.unwrap();
        left -= n;
    }
    c.write(call.close.as_bytes()).await.unwrap();
    let reply = c.head().await.expect("response head");
    assert_eq!(reply.status(), 200, "{}", call.path);
    let body = c.body(&reply).await;
    assert!(body.complete, "{}", call.path);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_and_stream_after_300_kb_and_30_mb_of_messages_are_kept() {
    let up = upstream().await;
    let engine = engine_with(&up.url(), |o| {
        o.estimator = std::sync::Arc::new(speedtap::tokens::WordCounter)
    })
    .await;
    let addr = engine.routes[0].listen;
    let mut tasks = Vec::new();
    for long in [300 * 1024, 30 * 1024 * 1024] {
        for call in &CALLS {
            tasks.push(tokio::spawn(send(addr, call, long)));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    let calls = quiescent(&engine, 6).await;
    assert_eq!(calls.len(), 6);
    for call in &calls {
        let api = call.identity.api;
        assert_eq!(call.status, CallStatus::Ok, "{api}: {call:#?}");
        assert_eq!(call.identity.model.as_deref(), Some("m"), "{api}");
        let speed = call.speed.as_ref().expect("metered");
        assert_eq!(speed.output_tokens, 3, "{api}: the reply was decoded");
        if api == speedtap::model::ApiKind::OllamaChat {
            // One JSON reply: its first frame is the first token, and the
            // call ends after the second. Read as a stream, the first
            // token would come with the second frame, at the end.
            let ttft = speed.time_to_first_token_ms.expect("a TTFT");
            let after_first = speed.elapsed_ms.saturating_sub(ttft);
            assert!(
                after_first >= SECOND_FRAME_AFTER.as_millis() as u64 - 50,
                "stream: false was read: TTFT {ttft} ms, ended at {} ms",
                speed.elapsed_ms
            );
        }
    }
    engine.shutdown(Duration::from_secs(1)).await;
}
