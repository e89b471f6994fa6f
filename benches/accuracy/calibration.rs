//! Live estimate before and after one calibrating call.
//!
//! The simulator's words are one o200k token each, and
//! `x-sim-usage-factor: 1.3` makes its usage receipt count 30 % more: a
//! server tokenizer that differs from o200k by a known factor. On a fresh
//! (route, model), the first call's live `output_tokens` is the raw o200k
//! count (factor 1.0), about 23 % under the receipt; settling teaches the
//! route the ratio (docs/metering.md, "Calibration"; `meter::calibration`),
//! and the next call's live counts are multiplied by it.
//!
//! Two errors per call, both of the last live snapshot (the one just
//! before the final receipt):
//! - literal: last live `output_tokens` / settled provider count − 1. It
//!   also includes the snapshot's lag: live snapshots are at least 250 ms
//!   apart, so the last one misses the tokens that arrived after it (up to
//!   a quarter second of output);
//! - lag-corrected (the target applies to this one): against the provider
//!   count of the tokens streamed by that snapshot, `settled * k / N`,
//!   where `k = round((elapsed_ms − ttft_ms) * tps / 1000) + 1` is how many
//!   tokens had arrived (speedtap's own two timestamps, one token every
//!   `1/tps` after the first) and `N` the scheduled tokens.

use std::fmt::Write;

use speedtap::model::ApiKind;
use speedtap::model::CallStatus;

use crate::rig::{CallSpec, Rig};
use crate::stats::Summary;
use crate::ttft::verdict;

/// Target: |lag-corrected error| within this many percent after one
/// calibrating call.
pub const TARGET_PCT: f64 = 5.0;

/// The simulated server's tokenizer drift.
pub const FACTOR: f64 = 1.3;

pub struct Row {
    pub api: ApiKind,
    /// 1: first call on the (route, model); 2: after one calibrating call.
    pub call: u8,
    /// The route's factor when the call started.
    pub factor: f64,
    pub settled: u64,
    pub last_live: u64,
    pub streamed_at_snapshot: u64,
    pub tokens: u64,
    pub literal_pct: f64,
    pub corrected_pct: f64,
}

fn scenarios(full: bool) -> Vec<(ApiKind, u64, f64)> {
    if !full {
        return vec![(ApiKind::OpenaiChat, 100, 100.0)];
    }
    [
        ApiKind::OpenaiChat,
        ApiKind::AnthropicMessages,
        ApiKind::OpenaiResponses,
        ApiKind::OllamaChat,
        ApiKind::LlamacppCompletion,
    ]
    .into_iter()
    .map(|api| (api, 200, 100.0))
    .collect()
}

pub async fn run(rig: &mut Rig, full: bool) -> Vec<Row> {
    let mut rows = Vec::new();
    for (api, tokens, tps) in scenarios(full) {
        let model = format!("calibration-{api}");
        for call in [1u8, 2] {
            let factor = rig.factor(&model).await;
            let spec = CallSpec {
                api,
                model: model.clone(),
                sim: vec![
                    ("x-sim-ttft-ms", "50".into()),
                    ("x-sim-tps", tps.to_string()),
                    ("x-sim-tokens", tokens.to_string()),
                    ("x-sim-usage", "true".into()),
                    ("x-sim-usage-factor", FACTOR.to_string()),
                ],
            };
            let r = rig.call(&spec).await;
            assert_eq!(r.status, CallStatus::Ok, "{api} call {call}");
            let last = r
                .live
                .iter()
                .rev()
                .find(|s| s.output_tokens > 0)
                .unwrap_or_else(|| panic!("{api} call {call}: no live snapshot with output"));
            let ttft = last.time_to_first_token_ms.expect("live TTFT") as f64;
            let since_first = last.elapsed_ms as f64 - ttft;
            let k = ((since_first * tps / 1000.0).round() as u64 + 1).min(tokens);
            let settled = r.settled.output_tokens;
            let expected = settled as f64 * k as f64 / tokens as f64;
            rows.push(Row {
                api,
                call,
                factor,
                settled,
                last_live: last.output_tokens,
                streamed_at_snapshot: k,
                tokens,
                literal_pct: (last.output_tokens as f64 / settled as f64 - 1.0) * 100.0,
                corrected_pct: (last.output_tokens as f64 / expected - 1.0) * 100.0,
            });
        }
    }
    rows
}

/// Lag-corrected errors of the calls made after one calibrating call.
pub fn calibrated_summary(rows: &[Row]) -> Summary {
    let xs: Vec<f64> = rows
        .iter()
        .filter(|r| r.call == 2)
        .map(|r| r.corrected_pct)
        .collect();
    Summary::of(&xs)
}

/// Lag-corrected errors of the first calls on a fresh (route, model).
pub fn uncalibrated_summary(rows: &[Row]) -> Summary {
    let xs: Vec<f64> = rows
        .iter()
        .filter(|r| r.call == 1)
        .map(|r| r.corrected_pct)
        .collect();
    Summary::of(&xs)
}

pub fn section(rows: &[Row]) -> String {
    let after = calibrated_summary(rows);
    let before = uncalibrated_summary(rows);
    let mut md = String::new();
    let _ = writeln!(md, "## Live estimate and calibration\n");
    let _ = writeln!(
        md,
        "The last live `output_tokens` (just before the final receipt) against the \
         provider's count, with `x-sim-usage-factor: {FACTOR}` (the server counts {:.0} % \
         more than o200k). Call 1 is the first on a fresh (route, model); call 2 follows \
         one calibrating call. *Literal* compares with the settled count and so includes \
         the last snapshot's lag (snapshots are ≥ 250 ms apart); *lag-corrected* compares \
         with the provider count of the tokens streamed by that snapshot. Target after one \
         calibrating call: lag-corrected within ±{TARGET_PCT} %.\n",
        (FACTOR - 1.0) * 100.0
    );
    let _ = writeln!(
        md,
        "**before calibration: median |error| {:.1} %; after one calibrating call: median \
         |error| {:.2} %, max |error| {:.2} %: {}**\n",
        before.median_abs,
        after.median_abs,
        after.max_abs,
        verdict(after.max_abs <= TARGET_PCT)
    );
    let _ = writeln!(
        md,
        "| API | call | route factor | settled (provider) | last live | streamed by then / N | literal % | lag-corrected % |"
    );
    let _ = writeln!(md, "|---|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        let _ = writeln!(
            md,
            "| {} | {} | {:.3} | {} | {} | {} / {} | {:+.2} | {:+.2} |",
            r.api,
            r.call,
            r.factor,
            r.settled,
            r.last_live,
            r.streamed_at_snapshot,
            r.tokens,
            r.literal_pct,
            r.corrected_pct
        );
    }
    md
}
