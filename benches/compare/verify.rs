//! Did speedtap meter every stream, and count it right?
//!
//! The truth is what the upstream sent: the o200k token count of each
//! stream's whole content, counted here with tiktoken-rs directly (not
//! speedtap's estimator, which is what is being checked). speedtap's side
//! is its stored history (`GET /api/v1/history?model=...`; a call is only
//! there once settled and on disk), matched by the model name that tags
//! one measurement. Streams within one tag are interchangeable, so the two
//! sides are compared as sorted lists.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::arms::ROUTE;
use crate::client;

/// speedtap's counts must be within this fraction of the truth.
pub const TOLERANCE: f64 = 0.02;

/// The metering verdict for one tag.
#[derive(Clone, Debug, Default)]
pub struct MeterCheck {
    /// Streams the client ran through speedtap.
    pub streams: usize,
    /// Streams the upstream finished.
    pub sent: usize,
    /// Calls speedtap stored.
    pub stored: usize,
    /// Of those, status `ok`.
    pub ok: usize,
    /// Of the ok ones, output_tokens within [`TOLERANCE`] of the truth.
    pub within: usize,
    /// The largest relative count error seen, percent.
    pub worst_err_pct: f64,
    /// Stored calls the passive capture saw (`seen_by: capture`).
    pub captured: usize,
    /// Stored calls flagged `capture_gap` (packets lost).
    pub gaps: usize,
}

impl MeterCheck {
    /// Every stream stored, ok and counted within tolerance.
    pub fn all_good(&self) -> bool {
        self.streams > 0
            && self.stored == self.streams
            && self.ok == self.streams
            && self.within == self.streams
    }

    pub fn merge(&mut self, o: &MeterCheck) {
        self.streams += o.streams;
        self.sent += o.sent;
        self.stored += o.stored;
        self.ok += o.ok;
        self.within += o.within;
        self.worst_err_pct = self.worst_err_pct.max(o.worst_err_pct);
        self.captured += o.captured;
        self.gaps += o.gaps;
    }
}

/// o200k tokens of each content, sorted.
fn truth(contents: &[String]) -> Vec<u64> {
    let bpe = tiktoken_rs::o200k_base_singleton();
    let mut v: Vec<u64> = contents
        .iter()
        .map(|c| bpe.encode_ordinary(c).len() as u64)
        .collect();
    v.sort_unstable();
    v
}

/// Waits (up to `timeout`) for speedtap to store `streams` calls of
/// `model`, then compares their counts with what the upstream `sent`.
pub async fn check(
    api: SocketAddr,
    model: &str,
    streams: usize,
    sent: &[String],
    timeout: Duration,
) -> MeterCheck {
    let path = format!("/api/v1/history?route={ROUTE}&model={model}&limit=10000");
    let deadline = Instant::now() + timeout;
    let mut calls: Vec<serde_json::Value> = Vec::new();
    loop {
        if let Some((200, body)) = client::get(api, &path).await {
            if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&body) {
                calls = v["calls"].as_array().cloned().unwrap_or_default();
            }
        }
        if calls.len() >= streams || Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut counts: Vec<u64> = calls
        .iter()
        .filter(|c| c["status"] == "ok")
        .filter_map(|c| c["speed"]["output_tokens"].as_u64())
        .collect();
    counts.sort_unstable();
    let expected = truth(sent);
    let mut within = 0;
    let mut worst: f64 = 0.0;
    for (got, want) in counts.iter().zip(&expected) {
        let err = (*got as f64 - *want as f64).abs() / (*want).max(1) as f64;
        worst = worst.max(err * 100.0);
        if err <= TOLERANCE {
            within += 1;
        }
    }
    if counts.len() != expected.len() {
        worst = f64::INFINITY;
    }
    MeterCheck {
        streams,
        sent: sent.len(),
        stored: calls.len(),
        ok: calls.iter().filter(|c| c["status"] == "ok").count(),
        within,
        worst_err_pct: worst,
        captured: calls.iter().filter(|c| c["seen_by"] == "capture").count(),
        gaps: calls.iter().filter(|c| c["capture_gap"] == true).count(),
    }
}
