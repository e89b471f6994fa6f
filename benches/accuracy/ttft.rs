//! Time to first token: speedtap's `time_to_first_token_ms` against the
//! client's own stopwatch (request written → first frame holding token 0).
//!
//! The two clocks start at different moments on purpose: speedtap's at
//! upstream dispatch (inside the proxy), the client's when it writes the
//! request, and the client also sees the first token one proxy hop later.
//! So the error is expected slightly negative; what matters is that it
//! stays within the target whatever the protocol and schedule. speedtap
//! publishes whole milliseconds (truncated), which adds up to -1 ms.

use std::fmt::Write;

use speedtap::model::ApiKind;
use speedtap::model::CallStatus;

use crate::rig::{CallSpec, Rig};
use crate::stats::Summary;

/// Target: |speedtap − client| within this many ms.
pub const TARGET_MS: f64 = 2.0;

/// The output after the first token hardly matters here: a short, fast
/// tail keeps each call quick.
const TOKENS: u64 = 20;
const TPS: u64 = 200;

pub struct Row {
    pub api: ApiKind,
    pub scheduled_ms: u64,
    pub client_ms: f64,
    pub speedtap_ms: u64,
    /// speedtap − client, ms.
    pub error_ms: f64,
}

fn scenarios(full: bool) -> Vec<(ApiKind, u64)> {
    if !full {
        return vec![
            (ApiKind::OpenaiChat, 100),
            (ApiKind::AnthropicMessages, 100),
        ];
    }
    let mut s = Vec::new();
    for ttft in [50, 250, 1000] {
        for api in ApiKind::METERED {
            s.push((api, ttft));
        }
    }
    s
}

pub async fn run(rig: &mut Rig, full: bool) -> Vec<Row> {
    let mut rows = Vec::new();
    for (api, ttft) in scenarios(full) {
        let spec = CallSpec {
            api,
            model: format!("ttft-{api}"),
            sim: vec![
                ("x-sim-ttft-ms", ttft.to_string()),
                ("x-sim-tps", TPS.to_string()),
                ("x-sim-tokens", TOKENS.to_string()),
            ],
        };
        let r = rig.call(&spec).await;
        assert_eq!(r.status, CallStatus::Ok, "{api} ttft {ttft}");
        let client_ms = r.client_ttft_ms.expect("the client saw token 0");
        let speedtap_ms = r
            .settled
            .time_to_first_token_ms
            .expect("speedtap measured a TTFT");
        rows.push(Row {
            api,
            scheduled_ms: ttft,
            client_ms,
            speedtap_ms,
            error_ms: speedtap_ms as f64 - client_ms,
        });
    }
    rows
}

pub fn summary(rows: &[Row]) -> Summary {
    Summary::of(&rows.iter().map(|r| r.error_ms).collect::<Vec<_>>())
}

pub fn section(rows: &[Row]) -> String {
    let s = summary(rows);
    let mut md = String::new();
    let _ = writeln!(md, "## Time to first token\n");
    let _ = writeln!(
        md,
        "speedtap's `time_to_first_token_ms` minus the client's stopwatch (request \
         written → first frame with token 0), {} calls, {TOKENS} tokens at {TPS} tok/s \
         after the scheduled wait. Target: within ±{TARGET_MS} ms.\n",
        s.n
    );
    let _ = writeln!(
        md,
        "**median |error| {:.2} ms, max |error| {:.2} ms, signed median {:+.2} ms: {}**\n",
        s.median_abs,
        s.max_abs,
        s.median,
        verdict(s.max_abs <= TARGET_MS)
    );
    let _ = writeln!(
        md,
        "| API | scheduled ms | client ms | speedtap ms | error ms |"
    );
    let _ = writeln!(md, "|---|---:|---:|---:|---:|");
    for r in rows {
        let _ = writeln!(
            md,
            "| {} | {} | {:.2} | {} | {:+.2} |",
            r.api, r.scheduled_ms, r.client_ms, r.speedtap_ms, r.error_ms
        );
    }
    md
}

pub fn verdict(met: bool) -> &'static str {
    if met {
        "target met"
    } else {
        "TARGET MISSED"
    }
}
