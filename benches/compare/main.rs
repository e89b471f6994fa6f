//! speedtap against the proxies a local-LLM user would otherwise put in
//! the path, in one run: `cargo bench --bench compare`.
//!
//! One stamping upstream runs in this process (so one monotonic clock
//! times both ends), and the same streaming workload goes through each
//! arm, interleaved in rounds with the order rotating: `direct` (the
//! floor), `speedtap` (the real `speedtap run` binary, metering on),
//! `capture` (the same binary with `--capture`: the client streams straight
//! to a second port of the upstream, speedtap meters the packets),
//! `nginx` (plain streaming reverse proxy) and `litellm` (LiteLLM's proxy).
//! Then a concurrency sweep (1 to 2,000 streams at 20 tok/s) for direct,
//! nginx, speedtap and capture, checking that speedtap metered every stream
//! right and counting the capture's lost packets.
//!
//! Out: a Markdown report printed and written to
//! `target/bench-report/compare.md`, and PNG plots beside it. Arms that
//! can't be installed or started are reported as `skipped (reason)`.
//!
//! Modes:
//! - `cargo bench --bench compare` (cargo passes `--bench`): the full run;
//!   installs nginx (apt-get, as root or through `sudo -n`) and the LiteLLM
//!   venv (`target/bench-venv`) when missing.
//! - without `--bench` (`cargo test --bench compare`, `cargo test
//!   --all-targets`): a smoke run of a few streams and a sweep of [1, 10]
//!   that installs nothing unless `SPEEDTAP_BENCH_INSTALL=1`, and exits
//!   non-zero unless the report is complete: every non-skipped arm has all
//!   its numbers, no stream failed, and speedtap metered every stream
//!   within 2%. `SPEEDTAP_BENCH_REQUIRE=nginx,litellm,speedtap` also fails
//!   the run when one of those arms was skipped (`capture` too, when
//!   named: it needs `cargo build -p speedtap-capture` first, and root or
//!   the helper's `cap_net_raw`).
//!
//! For exploring and profiling, `SPEEDTAP_BENCH_ROUNDS=N` sets the rounds,
//! `SPEEDTAP_BENCH_LEVELS=100,2000` the sweep's levels,
//! `SPEEDTAP_BENCH_ARMS=direct,speedtap,capture` only those arms (the
//! others are reported as skipped),
//! `SPEEDTAP_BENCH_NGINX_KEEPALIVE=0` gives nginx no idle upstream
//! connections (a fresh one per request, as speedtap), and
//! `SPEEDTAP_BENCH_WRAP="perf record -g -o FILE --"` runs speedtap under a
//! wrapper command (its CPU figures then include the wrapper's).

// The 80-line limit is for product code; a bench may read as one long script.
#![allow(clippy::too_many_lines)]
#![allow(clippy::unwrap_used)] // a test (or bench) may unwrap: a panic is its failure report

mod arms;
mod client;
mod install;
mod plot;
mod procfs;
mod report;
mod rounds;
mod stats;
mod sweep;
mod upstream;
mod verify;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use arms::{Arm, ArmKind};
use report::{ArmRow, Machine, Report};
use rounds::Plan;
use stats::Samples;
use sweep::SweepPlan;
use upstream::{Sent, Shape};

/// Open files wanted: 2,000 streams are 4,000 sockets in this process
/// (client and upstream ends), plus headroom.
const NOFILE: u64 = 65_536;

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let _ = upstream::now_ns(); // fix the epoch
    match rlimit::increase_nofile_limit(NOFILE) {
        Ok(n) if n < 10_000 => println!(
            "compare: warning: only {n} open files allowed; the 2,000-stream level may fail"
        ),
        Ok(_) => {}
        Err(e) => println!("compare: warning: cannot raise the open-file limit: {e}"),
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let code = runtime.block_on(run(full));
    std::process::exit(code);
}

fn env_flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| v == "1")
}

/// A comma-separated list of numbers from the environment (empty when
/// unset or unparsable).
fn env_list(name: &str) -> Vec<usize> {
    std::env::var(name)
        .unwrap_or_default()
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect()
}

/// Arms named in `SPEEDTAP_BENCH_REQUIRE` (comma-separated).
fn required_arms() -> Vec<String> {
    std::env::var("SPEEDTAP_BENCH_REQUIRE")
        .unwrap_or_default()
        .split(',')
        .map(|s| s.trim().to_lowercase())
        .filter(|s| !s.is_empty())
        .collect()
}

/// Starts one arm, installing its program first when allowed.
async fn start_arm(
    kind: ArmKind,
    upstream: std::net::SocketAddr,
    capture_upstream: std::net::SocketAddr,
    install_allowed: bool,
) -> Result<Arm, String> {
    match kind {
        ArmKind::Direct => Ok(Arm::direct(upstream)),
        ArmKind::Speedtap => arms::start_speedtap(upstream, &arms::scratch("speedtap")),
        ArmKind::Capture => arms::start_capture(capture_upstream, &arms::scratch("capture")),
        ArmKind::Nginx => {
            let bin = tokio::task::spawn_blocking(move || install::ensure_nginx(install_allowed))
                .await
                .map_err(|e| e.to_string())??;
            arms::start_nginx(&bin, upstream, &arms::scratch("nginx")).await
        }
        ArmKind::Litellm => {
            let bin = tokio::task::spawn_blocking(move || install::ensure_litellm(install_allowed))
                .await
                .map_err(|e| e.to_string())??;
            arms::start_litellm(&bin, upstream, &arms::scratch("litellm")).await
        }
    }
}

/// A few unrecorded streams per arm: connection pools, caches, the
/// tokenizer's tables, Python's lazy imports.
async fn warm_up(arms: &[Arm], sent: &Sent) {
    for arm in arms {
        let shape = Shape {
            chunks: 20,
            interval: Duration::from_millis(2),
            tag: format!("warm-{}", arm.kind.name()),
        };
        let mut s = Samples::default();
        client::run_batch(arm.addr, 8, &shape, Duration::from_millis(2), &mut s).await;
        sent.take(&shape.model());
        if s.bad > 0 {
            println!(
                "compare: warning: warm-up through {}: {} of {} streams incomplete",
                arm.kind.name(),
                s.bad,
                s.streams
            );
        }
    }
}

async fn run(full: bool) -> i32 {
    let started = Instant::now();
    let install_allowed = full || env_flag("SPEEDTAP_BENCH_INSTALL");
    let required = required_arms();
    let load_before = report::load();
    let (mut plan, mut sweep_plan) = if full {
        (Plan::full(), SweepPlan::full())
    } else {
        (Plan::smoke(), SweepPlan::smoke())
    };
    // For exploring and profiling: fewer rounds, other sweep levels.
    if let Some(n) = env_list("SPEEDTAP_BENCH_ROUNDS").first() {
        plan.rounds = *n;
    }
    let levels = env_list("SPEEDTAP_BENCH_LEVELS");
    if !levels.is_empty() {
        sweep_plan.levels = levels;
    }
    println!(
        "compare: {} run, load average {load_before}{}",
        if full { "full" } else { "smoke" },
        if full {
            ""
        } else {
            " (pass --bench, as `cargo bench --bench compare` does, for the full one)"
        }
    );
    let (upstream, sent) = upstream::start().await;
    let capture_upstream = upstream::start_with(&sent).await;

    let mut running: Vec<Arm> = Vec::new();
    let mut statuses: Vec<(ArmKind, Result<String, String>)> = Vec::new();
    let only: Vec<String> = std::env::var("SPEEDTAP_BENCH_ARMS")
        .unwrap_or_default()
        .split(',')
        .map(|s| s.trim().to_lowercase())
        .filter(|s| !s.is_empty())
        .collect();
    for kind in ArmKind::ALL {
        if !only.is_empty() && !only.iter().any(|a| a == kind.name()) {
            let reason = "not in SPEEDTAP_BENCH_ARMS".to_owned();
            println!("compare: {}: skipped ({reason})", kind.name());
            statuses.push((kind, Err(reason)));
            continue;
        }
        match start_arm(kind, upstream, capture_upstream, install_allowed).await {
            Ok(arm) => {
                println!("compare: {}: {} on {}", kind.name(), arm.version, arm.addr);
                statuses.push((kind, Ok(arm.version.clone())));
                running.push(arm);
            }
            Err(reason) => {
                println!("compare: {}: skipped ({reason})", kind.name());
                statuses.push((kind, Err(reason)));
            }
        }
    }

    warm_up(&running, &sent).await;
    let results = rounds::run(&plan, &mut running, &sent).await;
    let mut rows: Vec<ArmRow> = statuses
        .into_iter()
        .map(|(kind, status)| ArmRow {
            kind,
            status,
            result: None,
        })
        .collect();
    for (arm, result) in running.iter_mut().zip(results) {
        if let Err(e) = arm.check_alive() {
            println!("compare: {} died during the rounds: {e}", arm.kind.name());
        }
        if let Some(row) = rows.iter_mut().find(|r| r.kind == arm.kind) {
            row.result = Some(result);
        }
    }

    // LiteLLM is not in the sweep; free its core and memory first.
    for arm in running.iter_mut().filter(|a| a.kind == ArmKind::Litellm) {
        arm.stop();
    }
    let mut swept: Vec<&mut Arm> = running
        .iter_mut()
        .filter(|a| {
            matches!(
                a.kind,
                ArmKind::Direct | ArmKind::Nginx | ArmKind::Speedtap | ArmKind::Capture
            )
        })
        .collect();
    let sweep_arms: Vec<ArmKind> = swept.iter().map(|a| a.kind).collect();
    let levels = sweep::run(&sweep_plan, &mut swept, &sent).await;
    for arm in running.iter_mut() {
        arm.stop();
    }

    let mut report = Report {
        full,
        command: if full {
            "cargo bench --bench compare".into()
        } else {
            "cargo test --bench compare".into()
        },
        machine: Machine::detect(),
        load_before,
        load_after: report::load(),
        elapsed_s: started.elapsed().as_secs_f64(),
        harness_cpu_s: procfs::self_cpu_secs(),
        plan,
        sweep_plan,
        arms: rows,
        sweep_arms,
        sweep: levels,
        plots: Ok(Vec::new()),
    };
    let dir: PathBuf = install::target_dir().join("bench-report");
    if let Err(e) = std::fs::create_dir_all(&dir) {
        println!("compare: cannot create {}: {e}", dir.display());
        return 1;
    }
    report.plots = plot::draw(&report, &dir);
    let text = format!("# Proxy comparison\n\n{}", report.render());
    let md = dir.join("compare.md");
    if let Err(e) = std::fs::write(&md, &text) {
        println!("compare: cannot write {}: {e}", md.display());
        return 1;
    }
    println!("\n{text}\ncompare: report written to {}", md.display());

    let problems = report.problems(&required);
    for p in &problems {
        println!("compare: problem: {p}");
    }
    // The full run reports what it measured whatever it is; only a
    // required arm that is missing fails it. The smoke run is a test.
    let required_missing = problems.iter().any(|p| p.contains("is required"));
    if (!full && !problems.is_empty()) || required_missing {
        println!("compare: FAILED ({} problem(s))", problems.len());
        1
    } else {
        println!("compare: ok");
        0
    }
}
