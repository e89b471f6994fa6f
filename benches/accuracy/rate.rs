//! Settled rate against the schedule: the simulator writes token `i` at
//! `ttft + i / tps` against absolute deadlines, so the true decode rate is
//! exactly `x-sim-tps`.
//!
//! Two kinds of call:
//! - clock-based (the rate speedtap measures itself:
//!   `(tokens - 1) / (last output - first output)`), every API at 20, 50
//!   and 200 tok/s for about 1.5 s of output, alternately without a usage
//!   receipt (tokens estimated, source `estimated`) and with one (source
//!   `provider`, factor 1.0);
//! - server timings (`x-sim-server-timings`, source `server`): the rate is
//!   the server's `tokens / generation time`. The simulator, like
//!   llama.cpp, times generation from the first token to the last, so its
//!   own figure is `N / ((N - 1) / tps)`, above the schedule by `1/(N-1)`:
//!   these rows show what speedtap reports against the schedule, and that
//!   bias, not a metering error. 200 tokens keep it at 0.5 %.

use std::fmt::Write;

use speedtap::model::ApiKind;
use speedtap::model::CallStatus;
use speedtap::model::TokenSource;

use crate::rig::{CallSpec, Rig};
use crate::stats::Summary;
use crate::ttft::verdict;

/// Target: |settled / tps − 1| within this many percent (clock-based).
pub const TARGET_PCT: f64 = 1.0;

/// Output time per clock-based call.
const OUTPUT_SECS: f64 = 1.5;

/// APIs whose simulated stream carries server timings.
const TIMED_APIS: [ApiKind; 5] = [
    ApiKind::OpenaiChat,
    ApiKind::OpenaiCompletions,
    ApiKind::OpenaiResponses,
    ApiKind::LlamacppCompletion,
    ApiKind::OllamaChat,
];

pub struct Row {
    pub api: ApiKind,
    pub tps: f64,
    pub tokens: u64,
    pub source: TokenSource,
    pub settled: f64,
    /// settled / tps − 1, percent.
    pub error_pct: f64,
}

struct Scenario {
    api: ApiKind,
    tps: f64,
    tokens: u64,
    usage: bool,
    timings: bool,
}

fn scenarios(full: bool) -> Vec<Scenario> {
    if !full {
        return vec![
            Scenario {
                api: ApiKind::OpenaiChat,
                tps: 50.0,
                tokens: 40,
                usage: false,
                timings: false,
            },
            Scenario {
                api: ApiKind::OllamaChat,
                tps: 100.0,
                tokens: 60,
                usage: true,
                timings: false,
            },
        ];
    }
    let mut s = Vec::new();
    let mut usage = false;
    for tps in [20.0, 50.0, 200.0] {
        for api in ApiKind::METERED {
            s.push(Scenario {
                api,
                tps,
                tokens: (tps * OUTPUT_SECS).round() as u64,
                usage,
                timings: false,
            });
            usage = !usage;
        }
    }
    for api in TIMED_APIS {
        s.push(Scenario {
            api,
            tps: 100.0,
            tokens: 200,
            usage: false,
            timings: true,
        });
    }
    s
}

pub async fn run(rig: &mut Rig, full: bool) -> Vec<Row> {
    let mut rows = Vec::new();
    for sc in scenarios(full) {
        let spec = CallSpec {
            api: sc.api,
            model: format!("rate-{}", sc.api),
            sim: vec![
                ("x-sim-ttft-ms", "50".into()),
                ("x-sim-tps", sc.tps.to_string()),
                ("x-sim-tokens", sc.tokens.to_string()),
                ("x-sim-usage", sc.usage.to_string()),
                ("x-sim-server-timings", sc.timings.to_string()),
            ],
        };
        let r = rig.call(&spec).await;
        assert_eq!(r.status, CallStatus::Ok, "{} at {} tok/s", sc.api, sc.tps);
        let settled = r
            .settled
            .output_tokens_per_second
            .unwrap_or_else(|| panic!("{} at {} tok/s: no settled rate", sc.api, sc.tps));
        rows.push(Row {
            api: sc.api,
            tps: sc.tps,
            tokens: sc.tokens,
            source: r.settled.token_source,
            settled,
            error_pct: (settled / sc.tps - 1.0) * 100.0,
        });
    }
    rows
}

/// Clock-based rows only (sources `estimated` and `provider`): the ones
/// the target applies to.
pub fn clock_summary(rows: &[Row]) -> Summary {
    let xs: Vec<f64> = rows
        .iter()
        .filter(|r| r.source != TokenSource::Server)
        .map(|r| r.error_pct)
        .collect();
    Summary::of(&xs)
}

pub fn section(rows: &[Row]) -> String {
    let s = clock_summary(rows);
    let mut md = String::new();
    let _ = writeln!(md, "## Settled rate\n");
    let _ = writeln!(
        md,
        "The settled `output_tokens_per_second` against the schedule (`x-sim-tps`). \
         Target for the rate speedtap measures by its own clock (sources `estimated` \
         and `provider`): within ±{TARGET_PCT} %. Rows with source `server` report the \
         simulated server's own figure, `N / ((N-1)/tps)`, {:.2} % above the schedule \
         for N = 200 by the server's formula.\n",
        100.0 / 199.0
    );
    let _ = writeln!(
        md,
        "**clock-based, {} calls: median |error| {:.3} %, max |error| {:.3} %, signed \
         median {:+.3} %: {}**\n",
        s.n,
        s.median_abs,
        s.max_abs,
        s.median,
        verdict(s.max_abs <= TARGET_PCT)
    );
    let _ = writeln!(
        md,
        "| API | tps | tokens | source | settled tok/s | error % |"
    );
    let _ = writeln!(md, "|---|---:|---:|---|---:|---:|");
    for r in rows {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {:.1} | {:+.3} |",
            r.api,
            r.tps,
            r.tokens,
            r.source.as_str(),
            r.settled,
            r.error_pct
        );
    }
    md
}
