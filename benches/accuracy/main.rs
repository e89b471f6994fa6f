//! Accuracy harness: does speedtap report the truth?
//!
//! Against the scripted upstream (`speedtap::simulate::SimServer`, whose
//! `x-sim-*` headers set a known TTFT, rate, token count and tokenizer
//! drift) with speedtap in the path (an in-process `Engine`, see `rig` for
//! why), it measures, over several protocols and schedules:
//! - [`ttft`]: reported TTFT against the client's own stopwatch;
//! - [`rate`]: the settled rate against the schedule;
//! - [`calibration`]: the last live token estimate against the provider's
//!   count, before and after one calibrating call.
//!
//! It prints a Markdown report and writes it to
//! `target/bench-report/accuracy.md`, with the real-server figures that
//! `tests/real_server.rs` leaves in `target/bench-report/real-server.md`
//! appended when that file exists.
//!
//! `cargo bench --bench accuracy` runs the full set (about two minutes,
//! mostly the scheduled streams themselves). Without `--bench` (what
//! `cargo test --benches` does) it is a smoke run: a couple of calls per
//! measure, and it fails unless the report was written and every error is
//! within a generous multiple of its target (the machine may be busy).

// The 80-line limit is for product code; a bench may read as one long script.
#![allow(clippy::too_many_lines)]
#![allow(clippy::unwrap_used)] // a test (or bench) may unwrap: a panic is its failure report

mod calibration;
mod protocols;
mod rate;
mod rig;
mod stats;
mod ttft;

use std::fmt::Write;
use std::path::{Path, PathBuf};

/// Smoke bounds: a loaded 2-core CI box can delay a timer by several ms.
const SMOKE_TTFT_MS: f64 = 25.0;
const SMOKE_RATE_PCT: f64 = 5.0;
const SMOKE_CALIBRATED_PCT: f64 = 15.0;

fn report_dir() -> PathBuf {
    // CARGO_TARGET_TMPDIR is `<target>/tmp`; the report goes beside it.
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .map(|t| t.join("bench-report"))
        .expect("target dir")
}

/// What the machine was and how loaded it was, for the report's header.
fn machine() -> String {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let load = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".into());
    format!("{cpus} CPUs ({model}), load average {load} when the run ended")
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let has = |flag: &str| args.iter().any(|a| a == flag);
    let full = has("--bench") && !has("--test") && !has("--list");
    if has("--list") {
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let (ttft_rows, rate_rows, calibration_rows) = runtime.block_on(async {
        let mut rig = rig::Rig::start().await;
        let t = ttft::run(&mut rig, full).await;
        let r = rate::run(&mut rig, full).await;
        let c = calibration::run(&mut rig, full).await;
        rig.shutdown().await;
        (t, r, c)
    });

    let mut md = String::new();
    let _ = writeln!(md, "# speedtap accuracy report\n");
    let _ = writeln!(
        md,
        "{} run (`cargo bench --bench accuracy`{}), scripted upstream \
         (`speedtap::simulate`) behind an in-process speedtap engine; {}.\n",
        if full { "Full" } else { "Smoke" },
        if full { "" } else { " without `--bench`" },
        machine()
    );
    md.push_str(&ttft::section(&ttft_rows));
    md.push('\n');
    md.push_str(&rate::section(&rate_rows));
    md.push('\n');
    md.push_str(&calibration::section(&calibration_rows));
    md.push('\n');
    let dir = report_dir();
    let real = dir.join("real-server.md");
    match std::fs::read_to_string(&real) {
        Ok(text) => {
            let _ = writeln!(md, "## Real local model server\n");
            let _ = writeln!(
                md,
                "From the last run of `tests/real_server.rs` \
                 (`scripts/real-server-check`), as it left \
                 `target/bench-report/real-server.md`:\n"
            );
            md.push_str(&text);
        }
        Err(_) => {
            let _ = writeln!(
                md,
                "## Real local model server\n\nNot run here: `scripts/real-server-check` \
                 writes `target/bench-report/real-server.md`, which this report includes."
            );
        }
    }
    print!("{md}");
    std::fs::create_dir_all(&dir).expect("create target/bench-report");
    let out = dir.join("accuracy.md");
    std::fs::write(&out, &md).expect("write the report");
    eprintln!("accuracy: report written to {}", out.display());

    if !full {
        let written = std::fs::read_to_string(&out).expect("report readable");
        assert!(
            written.contains("## Time to first token"),
            "report incomplete"
        );
        let t = ttft::summary(&ttft_rows);
        assert!(
            t.max_abs <= SMOKE_TTFT_MS,
            "TTFT error {:.2} ms over the smoke bound",
            t.max_abs
        );
        let r = rate::clock_summary(&rate_rows);
        assert!(
            r.max_abs <= SMOKE_RATE_PCT,
            "rate error {:.3} % over the smoke bound",
            r.max_abs
        );
        let c = calibration::calibrated_summary(&calibration_rows);
        assert!(
            c.max_abs <= SMOKE_CALIBRATED_PCT,
            "calibrated estimate error {:.2} % over the smoke bound",
            c.max_abs
        );
        // The premise: without calibration the estimate is far off, so
        // the calibrated figure above shows calibration at work.
        let u = calibration::uncalibrated_summary(&calibration_rows);
        assert!(
            u.median < -10.0,
            "the first call should under-count by ~23 %, got {:+.2} %",
            u.median
        );
        eprintln!("accuracy: smoke run within bounds");
    }
}
