//! Fault injection: each test puts one fault between a client, the proxy
//! (an in-process engine with one route) and an upstream, and checks that
//! the bytes that can still get through are exact, that the call ends with
//! the status `docs/metering.md` gives it, and that nothing leaks
//! (calls in flight, sockets, descriptors). The table in
//! `docs/reliability.md` ("Fault injection") lists them.
//!
//! - `upstream`: what a broken or unusual upstream does (reset, invalid
//!   UTF-8, a 10 MB line, gzip, HTTP/1.0, 1xx, trailers).
//! - `stall`: a stalled upstream, on paused time (no real minute is slept).
//! - `client`: clients that go away at each stage of a call.
//! - `connections`: slowloris heads and connection floods.
//! - `store`: a history database that can't be written.
//!
//! The upstream here is a raw socket ([`wire::RawUpstream`]) so a test
//! controls every byte and every way a connection ends.

// The 80-line limit is for product code; a test may read as one long script.
#![allow(clippy::too_many_lines)]
#![allow(clippy::unwrap_used)] // a test (or bench) may unwrap: a panic is its failure report

// The one shared support module (tests/util); this binary's root sits
// in tests/faults/, so the path names it.
#[path = "../util/mod.rs"]
mod util;

use util::{proxy as proxy_support, wire};

mod client;
mod connections;
mod end_marker;
mod long_request;
mod stall;
mod store;
mod upstream;

use std::time::Duration;

use speedtap::model::{Call, CallsQuery, EngineEvent, EngineQueries};

use speedtap::host::RunningEngine;
use tokio::time::Instant;

/// How long a test waits for the engine to settle calls (real time).
pub const SETTLE: Duration = Duration::from_secs(20);

/// Every call the engine knows, newest first.
pub async fn all_calls(engine: &RunningEngine) -> Vec<Call> {
    engine
        .handle
        .calls(CallsQuery {
            limit: usize::MAX,
            route: None,
            unmetered: true,
        })
        .await
}

/// Waits until the engine knows at least `n` calls and none is in flight
/// (the "active calls back to 0" check); returns them, newest first.
/// Subscribes before each check, so a settle can't slip in between.
pub async fn quiescent(engine: &RunningEngine, n: usize) -> Vec<Call> {
    let deadline = Instant::now() + SETTLE;
    loop {
        let mut events = engine.handle.subscribe().await;
        let calls = all_calls(engine).await;
        if calls.len() >= n && calls.iter().all(|c| c.status.is_settled()) {
            return calls;
        }
        assert!(
            Instant::now() < deadline,
            "calls did not settle: {calls:#?}"
        );
        loop {
            match tokio::time::timeout_at(deadline, events.recv()).await {
                Ok(Some(EngineEvent::Settled(_))) => break,
                Ok(Some(_)) => {}
                // A lagging subscriber is dropped: subscribe again.
                Ok(None) => break,
                Err(_) => panic!("calls did not settle: {calls:#?}"),
            }
        }
    }
}

pub use wire::open_fds;
