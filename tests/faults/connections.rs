//! Slowloris clients: heads trickled a byte at a time, and heads too large
//! to buffer. Their connections are bounded in time (`header_read_timeout`)
//! and memory (`max_buf_size`), and other clients are served meanwhile.
//! The connection flood (10,000 connections, descriptor count) is in
//! `tests/faults_flood.rs`: it counts this process's descriptors, which
//! other tests running beside it would disturb.

use std::time::Duration;

use speedtap::model::CallStatus;

use speedtap::host::RunningEngine;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::proxy_support::engine_with;
use crate::quiescent;
use crate::wire::{chat_events, whole_chat_call, RawUpstream, SSE_HEAD};

const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(1);

async fn upstream() -> RawUpstream {
    RawUpstream::start(|mut c| async move {
        while let Some(req) = c.head().await {
            let _ = c.body(&req).await;
            let _ = c.write(SSE_HEAD).await;
            for e in chat_events(20) {
                let _ = c.chunk(&e).await;
            }
            let _ = c.write(b"0\r\n\r\n").await;
        }
    })
    .await
}

async fn engine(up: &RawUpstream, max_connections: usize) -> RunningEngine {
    engine_with(&up.url(), |o| {
        o.estimator = std::sync::Arc::new(speedtap::tokens::WordCounter);
        o.proxy_limits.header_read_timeout = HEADER_READ_TIMEOUT;
        o.proxy_limits.max_connections = max_connections;
    })
    .await
}

/// One normal streaming call; panics unless it arrives whole.
async fn normal_call(engine: &RunningEngine) {
    whole_chat_call(engine.routes[0].listen, 20).await;
}

/// A slowloris: the start of a head, then one byte every 100 ms until the
/// proxy closes the connection. Returns how long the proxy kept it.
async fn slowloris(addr: std::net::SocketAddr) -> Duration {
    use tokio::io::AsyncWriteExt;
    let t0 = Instant::now();
    let mut s = TcpStream::connect(addr).await.unwrap();
    let start = format!("POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nX-Slow: ");
    if s.write_all(start.as_bytes()).await.is_err() {
        return t0.elapsed();
    }
    let mut buf = [0u8; 1024];
    loop {
        tokio::select! {
            read = s.read(&mut buf) => match read {
                // Closed (possibly after a 408): done.
                Ok(0) | Err(_) => return t0.elapsed(),
                Ok(_) => {}
            },
            _ = tokio::time::sleep(Duration::from_millis(100)) => {
                if s.write_all(b"a").await.is_err() {
                    return t0.elapsed();
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_heads_are_cut_and_other_clients_are_served() {
    let up = upstream().await;
    let engine = engine(
        &up,
        speedtap::engine::proxy::limits::DEFAULT_MAX_CONNECTIONS,
    )
    .await;
    let addr = engine.routes[0].listen;
    let mut loris = JoinSet::new();
    for _ in 0..200 {
        loris.spawn(slowloris(addr));
    }
    // Give them time to connect and start trickling, then serve a client.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t0 = Instant::now();
    normal_call(&engine).await;
    assert!(
        t0.elapsed() < HEADER_READ_TIMEOUT,
        "a normal call waited for the slowloris: {:?}",
        t0.elapsed()
    );
    // Every slowloris connection is cut once its head is overdue, however
    // steadily it trickles.
    let deadline = Instant::now() + HEADER_READ_TIMEOUT * 10;
    while let Some(kept) = tokio::time::timeout_at(deadline, loris.join_next())
        .await
        .expect("slowloris connections were never cut")
    {
        let kept = kept.unwrap();
        assert!(
            kept >= HEADER_READ_TIMEOUT && kept < HEADER_READ_TIMEOUT * 10,
            "slowloris kept {kept:?}"
        );
    }
    normal_call(&engine).await;
    let calls = quiescent(&engine, 2).await;
    assert_eq!(calls.len(), 2, "a slowloris head never became a call");
    assert!(calls.iter().all(|c| c.status == CallStatus::Ok));
    engine.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_head_is_refused_without_buffering_it() {
    use tokio::io::AsyncWriteExt;
    let up = upstream().await;
    let engine = engine(
        &up,
        speedtap::engine::proxy::limits::DEFAULT_MAX_CONNECTIONS,
    )
    .await;
    let addr = engine.routes[0].listen;
    let mut s = TcpStream::connect(addr).await.unwrap();
    let start = format!("POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nX-Big: ");
    s.write_all(start.as_bytes()).await.unwrap();
    // Up to 4 MiB of one header line; the proxy must answer (431) or close
    // long before taking it all.
    let mut sent = 0usize;
    let line = vec![b'a'; 64 * 1024];
    while sent < 4 * 1024 * 1024 {
        if s.write_all(&line).await.is_err() {
            break;
        }
        sent += line.len();
    }
    let mut reply = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut reply)).await;
    let reply = String::from_utf8_lossy(&reply);
    assert!(
        reply.is_empty() || reply.starts_with("HTTP/1.1 431"),
        "{reply}"
    );
    normal_call(&engine).await;
    engine.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connection_cap_queues_new_clients_instead_of_refusing_them() {
    let up = upstream().await;
    let engine = engine(&up, 20).await;
    let addr = engine.routes[0].listen;
    let mut loris = JoinSet::new();
    for _ in 0..20 {
        loris.spawn(slowloris(addr));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The 21st client waits in the backlog until the header timeout frees
    // a slot, then is served in full.
    let t0 = Instant::now();
    normal_call(&engine).await;
    let waited = t0.elapsed();
    assert!(
        waited >= HEADER_READ_TIMEOUT / 2,
        "the cap did not hold: served after {waited:?}"
    );
    let deadline = Instant::now() + HEADER_READ_TIMEOUT * 10;
    while tokio::time::timeout_at(deadline, loris.join_next())
        .await
        .expect("slowloris connections were never cut")
        .is_some()
    {}
    engine.shutdown(Duration::from_secs(1)).await;
}
