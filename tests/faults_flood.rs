//! 10,000 connections opened and dropped against one route: bare connects,
//! partial request heads, and requests broken off mid-body. The proxy keeps
//! serving, every call that started ends `abandoned`, and this process's
//! descriptors (`/proc/self/fd`: client, proxy and upstream all live here)
//! return to where they were.
//!
//! A test binary of its own, with a single test: descriptors are counted
//! process-wide, so nothing else may run beside it.

// The 80-line limit is for product code; a test may read as one long script.
#![allow(clippy::too_many_lines)]
#![allow(clippy::unwrap_used)] // a test (or bench) may unwrap: a panic is its failure report

mod util;

use util::{proxy as proxy_support, wire};

use std::sync::Arc;
use std::time::Duration;

use speedtap::model::{CallStatus, CallsQuery, EngineQueries};

use speedtap::host::RunningEngine;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;

use wire::{chat_events, open_fds, whole_chat_call, RawUpstream, CHAT, SSE_HEAD};

const CONNECTIONS: usize = 10_000;
/// Every tenth connection breaks off a metered request mid-body.
const PARTIAL_BODY_EVERY: usize = 10;
const AT_ONCE: usize = 200;

async fn normal_call(engine: &RunningEngine) {
    whole_chat_call(engine.routes[0].listen, 5).await;
}

/// One connection, dropped after sending what `kind` says.
async fn open_and_drop(addr: std::net::SocketAddr, i: usize) {
    let Ok(mut s) = TcpStream::connect(addr).await else {
        return;
    };
    let bytes: Vec<u8> = if i % PARTIAL_BODY_EVERY == 0 {
        // A full head announcing more body than is sent.
        let mut r = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\n\
             Content-Type: application/json\r\nContent-Length: 4096\r\n\r\n"
        )
        .into_bytes();
        r.extend_from_slice(&CHAT.as_bytes()[..30]);
        r
    } else if i % 2 == 0 {
        format!("POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Le").into_bytes()
    } else {
        Vec::new()
    };
    let _ = s.write_all(&bytes).await;
    if i % PARTIAL_BODY_EVERY == 0 {
        // Let the proxy start the call before the client leaves.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_dropped_connections_leak_nothing() {
    let up = RawUpstream::start(|mut c| async move {
        while let Some(req) = c.head().await {
            let body = c.body(&req).await;
            if !body.complete {
                return;
            }
            let _ = c.write(SSE_HEAD).await;
            for e in chat_events(5) {
                let _ = c.chunk(&e).await;
            }
            let _ = c.write(b"0\r\n\r\n").await;
        }
    })
    .await;
    let engine = proxy_support::engine_with(&up.url(), |o| {
        o.estimator = Arc::new(speedtap::tokens::WordCounter)
    })
    .await;
    let addr = engine.routes[0].listen;
    // Warm up (lazily opened files, the first call's actors), then
    // take the baseline.
    normal_call(&engine).await;
    let baseline = open_fds();

    let t0 = Instant::now();
    let slots = Arc::new(Semaphore::new(AT_ONCE));
    let mut set = JoinSet::new();
    for i in 0..CONNECTIONS {
        let permit = slots.clone().acquire_owned().await.unwrap();
        set.spawn(async move {
            open_and_drop(addr, i).await;
            drop(permit);
        });
        while set.try_join_next().is_some() {}
    }
    while set.join_next().await.is_some() {}
    let flood = t0.elapsed();

    // Still serving.
    normal_call(&engine).await;

    // Every call that started (the partial bodies that reached the
    // upstream stage) has ended, abandoned; none is in flight.
    let deadline = Instant::now() + Duration::from_secs(30);
    let calls = loop {
        let calls = engine
            .handle
            .calls(CallsQuery {
                limit: usize::MAX,
                route: None,
                unmetered: true,
            })
            .await;
        if calls.iter().all(|c| c.status.is_settled()) {
            break calls;
        }
        assert!(Instant::now() < deadline, "calls left in flight");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let ok = calls.iter().filter(|c| c.status == CallStatus::Ok).count();
    assert_eq!(ok, 2, "only the two normal calls completed");
    assert!(
        calls
            .iter()
            .all(|c| matches!(c.status, CallStatus::Ok | CallStatus::Abandoned)),
        "{:?}",
        calls.iter().map(|c| c.status).collect::<Vec<_>>()
    );

    // Descriptors back to the baseline (upstream connections close as their
    // calls settle, the sockets of dropped clients as the proxy sees them go).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = open_fds();
        if now <= baseline + 4 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "descriptors leaked: {now} open, {baseline} at the start"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!(
        "{CONNECTIONS} connections in {flood:?}; {} calls abandoned; fds {baseline} -> {}",
        calls.len() - ok,
        open_fds()
    );
    engine.shutdown(Duration::from_secs(1)).await;
}
