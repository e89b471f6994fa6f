//! The Markdown report: what ran, the per-arm table, the sweep, and the
//! targets with a verdict each. Also the smoke run's completeness check.
//!
//! Every latency is an "added" figure (the arm's percentile minus the
//! direct connection's in the same run) except on the `direct` row, which
//! shows the absolute floor. A figure that could not be measured prints
//! as `n/a`, never as 0.

use std::fmt::Write;

use crate::arms::ArmKind;
use crate::rounds::{ArmResult, Plan};
use crate::stats::Summary;
use crate::sweep::{Cell, Level, SweepPlan, RATE};
use crate::verify::{MeterCheck, TOLERANCE};

/// The machine, as the report names it.
pub struct Machine {
    pub cpu: String,
    pub cores: usize,
    pub kernel: String,
}

impl Machine {
    pub fn detect() -> Machine {
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|t| {
                t.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, v)| v.trim().to_owned())
            })
            .unwrap_or_else(|| "unknown CPU".into());
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_owned())
            .unwrap_or_default();
        Machine {
            cpu,
            cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
            kernel,
        }
    }
}

/// The 1-minute load average now.
pub fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".into())
}

/// One arm as the report sees it: what ran (or why not) and its results.
pub struct ArmRow {
    pub kind: ArmKind,
    /// `Ok(version)` or `Err(reason it was skipped)`.
    pub status: Result<String, String>,
    pub result: Option<ArmResult>,
}

/// Everything one run produced.
pub struct Report {
    pub full: bool,
    pub command: String,
    pub machine: Machine,
    pub load_before: String,
    pub load_after: String,
    pub elapsed_s: f64,
    /// CPU seconds of this process (client and upstream) over the run.
    pub harness_cpu_s: f64,
    pub plan: Plan,
    pub sweep_plan: SweepPlan,
    pub arms: Vec<ArmRow>,
    /// The arms of the sweep, in cell order.
    pub sweep_arms: Vec<ArmKind>,
    pub sweep: Vec<Level>,
    /// Plot files written (relative names), or why none were.
    pub plots: Result<Vec<String>, String>,
}

/// The three latency summaries of one arm.
pub struct Sums {
    pub ttft: Summary,
    pub single: Summary,
    pub multi: Summary,
}

impl Sums {
    pub fn of(r: &ArmResult) -> Sums {
        Sums {
            ttft: r.ttft.summary(),
            single: r.single.summary(),
            multi: r.multi.summary(),
        }
    }

    /// [ttft p50, ttft p90, single p50, single p99, multi p50, multi p99], µs.
    pub fn figures(&self) -> [f64; 6] {
        [
            self.ttft.ttft_us(50.0),
            self.ttft.ttft_us(90.0),
            self.single.chunk_us(50.0),
            self.single.chunk_us(99.0),
            self.multi.chunk_us(50.0),
            self.multi.chunk_us(99.0),
        ]
    }
}

/// A duration in µs, signed when `signed`, switching to ms from 1 ms.
pub fn dur(us: f64, signed: bool) -> String {
    if us.is_nan() {
        return "n/a".into();
    }
    let sign = if signed && us >= 0.0 { "+" } else { "" };
    if us.abs() >= 1_000.0 {
        format!("{sign}{:.2} ms", us / 1_000.0)
    } else {
        format!("{sign}{us:.0} µs")
    }
}

fn num(x: f64, digits: usize) -> String {
    if x.is_nan() {
        "n/a".into()
    } else {
        format!("{x:.digits$}")
    }
}

fn mb(bytes: Option<u64>) -> String {
    bytes.map_or("n/a".into(), |b| format!("{:.0} MB", b as f64 / 1e6))
}

fn meter_text(m: &MeterCheck) -> String {
    format!(
        "{}/{} ok, {}/{} within {:.0}% (worst {})",
        m.ok,
        m.streams,
        m.within,
        m.streams,
        TOLERANCE * 100.0,
        if m.worst_err_pct.is_finite() {
            format!("{:.2}%", m.worst_err_pct)
        } else {
            "unmatched".into()
        }
    )
}

impl Report {
    fn row(&self, kind: ArmKind) -> Option<(&ArmResult, Sums)> {
        let r = self.arms.iter().find(|a| a.kind == kind)?.result.as_ref()?;
        Some((r, Sums::of(r)))
    }

    /// Added figures of `kind` vs direct, as in [`Sums::figures`].
    pub fn added(&self, kind: ArmKind) -> Option<[f64; 6]> {
        let (_, d) = self.row(ArmKind::Direct)?;
        let (_, a) = self.row(kind)?;
        let (d, a) = (d.figures(), a.figures());
        Some(std::array::from_fn(|i| a[i] - d[i]))
    }

    fn cpu_per_m(&self, kind: ArmKind) -> f64 {
        self.row(kind).map_or(f64::NAN, |(r, _)| r.cpu_per_m(kind))
    }

    fn sweep_col(&self, kind: ArmKind) -> Option<usize> {
        self.sweep_arms.iter().position(|k| *k == kind)
    }

    /// Added p50 and p99 of `kind` at one level.
    fn sweep_added(&self, level: &Level, kind: ArmKind) -> Option<(f64, f64)> {
        let d = level.cells.get(self.sweep_col(ArmKind::Direct)?)?;
        let a = level.cells.get(self.sweep_col(kind)?)?;
        let (d, a) = (d.samples.summary(), a.samples.summary());
        Some((
            a.chunk_us(50.0) - d.chunk_us(50.0),
            a.chunk_us(99.0) - d.chunk_us(99.0),
        ))
    }

    /// Points (streams, absolute per-chunk p99 µs) for the sweep plot.
    pub fn sweep_series(&self, kind: ArmKind) -> Vec<(usize, f64)> {
        let Some(col) = self.sweep_col(kind) else {
            return Vec::new();
        };
        self.sweep
            .iter()
            .filter_map(|l| {
                Some((
                    l.streams,
                    l.cells.get(col)?.samples.summary().chunk_us(99.0),
                ))
            })
            .filter(|(_, v)| !v.is_nan())
            .collect()
    }

    pub fn render(&self) -> String {
        let mut s = String::new();
        let p = &self.plan;
        let _ = writeln!(
            s,
            "Run: {} ({}), {:.0} s. Machine: {}, {} cores, Linux {}; load average {} before, {} after. \
             The harness itself (client and upstream, sharing the cores) used {:.0} CPU s. \
             Arms interleaved in {} round(s), the order rotating each round. Command: `{}`.\n",
            if self.full { "full" } else { "smoke" },
            if cfg!(debug_assertions) { "debug build" } else { "release build" },
            self.elapsed_s,
            self.machine.cpu,
            self.machine.cores,
            self.machine.kernel,
            self.load_before,
            self.load_after,
            self.harness_cpu_s,
            p.rounds,
            self.command
        );
        let _ = writeln!(s, "| arm | what ran |\n|---|---|");
        for a in &self.arms {
            let what = match &a.status {
                Ok(v) => v.clone(),
                Err(reason) => format!("skipped ({reason})"),
            };
            let _ = writeln!(s, "| {} | {} |", a.kind.name(), what);
        }
        let _ = writeln!(
            s,
            "\nWorkloads per arm and round: {} sequential 4-token streams (TTFT); one stream at \
             500 tok/s for {:.1} s; {} streams at 40 tok/s for {:.1} s, starts spread over 25 ms. \
             `direct` shows absolute values; the other rows are added vs direct (difference of \
             percentiles). CPU is the proxy's process tree (utime+stime, children included) over \
             the two streaming workloads, per million streamed tokens (one token per chunk); \
             context switches are all its threads' (voluntary and not) over the same workloads; \
             peak RSS is VmHWM summed over the tree.\n",
            p.ttft_streams,
            p.single_duration.as_secs_f64(),
            p.multi_streams,
            p.multi_duration.as_secs_f64()
        );
        let _ = writeln!(
            s,
            "| arm | TTFT p50 | TTFT p90 | chunk p50, 1×500/s | chunk p99, 1×500/s | chunk p50, {m}×40/s | chunk p99, {m}×40/s | CPU s / M tokens | context switches / token | peak RSS | incomplete streams |\n|---|---|---|---|---|---|---|---|---|---|---|",
            m = p.multi_streams
        );
        for a in &self.arms {
            let Some((r, sums)) = self.row(a.kind) else {
                let _ = writeln!(s, "| {} | skipped ||||||||||", a.kind.name());
                continue;
            };
            let direct = a.kind == ArmKind::Direct;
            let f = if direct {
                sums.figures()
            } else {
                self.added(a.kind).unwrap_or([f64::NAN; 6])
            };
            let cells: Vec<String> = f.iter().map(|v| dur(*v, !direct)).collect();
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                a.kind.name(),
                cells[0],
                cells[1],
                cells[2],
                cells[3],
                cells[4],
                cells[5],
                if direct {
                    "(harness)".into()
                } else {
                    num(r.cpu_per_m(a.kind), 1)
                },
                if direct {
                    "(harness)".into()
                } else {
                    num(r.switches_per_token(a.kind), 2)
                },
                if direct {
                    "(harness)".into()
                } else {
                    mb(r.peak_rss)
                },
                r.ttft.bad + r.single.bad + r.multi.bad
            );
        }
        if let Some((r, _)) = self.row(ArmKind::Speedtap) {
            if let Some(m) = &r.meter {
                let _ = writeln!(
                    s,
                    "\nspeedtap metering over these workloads: {}.",
                    meter_text(m)
                );
            }
        }
        if let Some((r, _)) = self.row(ArmKind::Capture) {
            if let Some(m) = &r.meter {
                let _ = writeln!(
                    s,
                    "\ncapture metering over these workloads (the client streaming straight to \
                     the upstream; CPU above is speedtap's process plus its capture helper's): \
                     {}; {} of {} stored calls seen by capture, {} flagged capture_gap.",
                    meter_text(m),
                    m.captured,
                    m.stored,
                    m.gaps
                );
            }
        }
        self.render_sweep(&mut s);
        self.render_capture_sweep(&mut s);
        self.render_targets(&mut s);
        match &self.plots {
            Ok(files) if !files.is_empty() => {
                let _ = writeln!(s, "\nPlots: {}.", files.join(", "));
            }
            Ok(_) => {}
            Err(why) => {
                let _ = writeln!(s, "\nPlots: none ({why}).");
            }
        }
        s
    }

    fn render_sweep(&self, s: &mut String) {
        if self.sweep.is_empty() {
            return;
        }
        let sp = &self.sweep_plan;
        let _ = writeln!(
            s,
            "\n### Concurrency sweep\n\nN streams at {RATE} tok/s, {} tokens each, starts spread \
             over {:.1} s, {} round(s) per level; arms: {}. Added = arm's percentile minus \
             direct's at the same level.\n",
            sp.chunks,
            sp.stagger.as_secs_f64(),
            sp.rounds,
            self.sweep_arms
                .iter()
                .map(|k| k.name())
                .collect::<Vec<_>>()
                .join(", ")
        );
        let _ = writeln!(
            s,
            "| streams | direct p50 / p99 | nginx added p50 / p99 | speedtap added p50 / p99 | nginx CPU s/M | speedtap CPU s/M | speedtap RSS | speedtap metered | incomplete (direct/nginx/speedtap) |\n|---|---|---|---|---|---|---|---|---|"
        );
        for level in &self.sweep {
            let cell = |k: ArmKind| self.sweep_col(k).and_then(|i| level.cells.get(i));
            let pair = |k: ArmKind| {
                self.sweep_added(level, k)
                    .map_or("skipped".into(), |(a, b)| {
                        format!("{} / {}", dur(a, true), dur(b, true))
                    })
            };
            let direct = cell(ArmKind::Direct).map_or("n/a".into(), |c| {
                let sm = c.samples.summary();
                format!(
                    "{} / {}",
                    dur(sm.chunk_us(50.0), false),
                    dur(sm.chunk_us(99.0), false)
                )
            });
            let cpu = |k: ArmKind| {
                cell(k).map_or("n/a".into(), |c| {
                    let n = c.samples.chunk_ns.len();
                    // Under 0.1 s (10 clock ticks) the figure is mostly
                    // rounding: too few tokens at this level.
                    if n == 0 || c.cpu_secs < 0.1 {
                        "(too short)".into()
                    } else {
                        num(c.cpu_secs / n as f64 * 1e6, 1)
                    }
                })
            };
            let bad = |k: ArmKind| cell(k).map_or("-".into(), |c| c.samples.bad.to_string());
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {}/{}/{} |",
                level.streams,
                direct,
                pair(ArmKind::Nginx),
                pair(ArmKind::Speedtap),
                cpu(ArmKind::Nginx),
                cpu(ArmKind::Speedtap),
                cell(ArmKind::Speedtap).map_or("n/a".into(), |c| mb(c.peak_rss)),
                cell(ArmKind::Speedtap)
                    .and_then(|c| c.meter.as_ref())
                    .map_or("n/a".into(), meter_text),
                bad(ArmKind::Direct),
                bad(ArmKind::Nginx),
                bad(ArmKind::Speedtap)
            );
        }
    }

    /// The capture arm in the sweep: its CPU beside the proxy's, and what
    /// it lost.
    fn render_capture_sweep(&self, s: &mut String) {
        let Some(col) = self.sweep_col(ArmKind::Capture) else {
            return;
        };
        if self.sweep.is_empty() {
            return;
        }
        let _ = writeln!(
            s,
            "\n#### Capture arm in the sweep\n\nThe client streams straight to the upstream; \
             speedtap (`--capture`, a capture-only route) meters what its helper reads off the \
             loopback interface. CPU is speedtap's process tree (the helper included) per \
             million streamed tokens, beside the proxy arm's at the same level. Lost packets: \
             the kernel's, the interface's and the helper-to-engine queue's \
             (`capture_dropped_packets`), over the level's rounds.\n"
        );
        let _ = writeln!(
            s,
            "| streams | capture added p50 / p99 | capture CPU s/M | speedtap (proxy) CPU s/M | lost packets | calls with capture_gap | capture metered |\n|---|---|---|---|---|---|---|"
        );
        let cpu = |c: &Cell| {
            let n = c.samples.chunk_ns.len();
            if n == 0 || c.cpu_secs < 0.1 {
                "(too short)".into()
            } else {
                num(c.cpu_secs / n as f64 * 1e6, 1)
            }
        };
        for level in &self.sweep {
            let Some(cell) = level.cells.get(col) else {
                continue;
            };
            let proxy = self
                .sweep_col(ArmKind::Speedtap)
                .and_then(|i| level.cells.get(i))
                .map_or("n/a".into(), cpu);
            let added = self
                .sweep_added(level, ArmKind::Capture)
                .map_or("n/a".into(), |(a, b)| {
                    format!("{} / {}", dur(a, true), dur(b, true))
                });
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {} |",
                level.streams,
                added,
                cpu(cell),
                proxy,
                cell.drops.map_or("n/a".into(), |d| d.to_string()),
                cell.meter
                    .as_ref()
                    .map_or("n/a".into(), |m| m.gaps.to_string()),
                cell.meter.as_ref().map_or("n/a".into(), meter_text),
            );
        }
    }

    /// The capture arm's lost packets at the sweep level of `streams`.
    fn capture_drops_at(&self, streams: usize) -> Option<u64> {
        let col = self.sweep_col(ArmKind::Capture)?;
        self.sweep
            .iter()
            .find(|l| l.streams == streams)?
            .cells
            .get(col)?
            .drops
    }

    /// The targets with their measured figure and a verdict.
    pub fn targets(&self) -> Vec<(String, String, Option<bool>)> {
        let mut out = Vec::new();
        let st = self.added(ArmKind::Speedtap);
        let ng = self.added(ArmKind::Nginx);
        let lt = self.added(ArmKind::Litellm);
        let multi = format!("{}×40/s", self.plan.multi_streams);
        for (label, i) in [("1×500/s", 2), (multi.as_str(), 4)] {
            let (v, ok) = match (st, ng) {
                (Some(s), Some(n)) => {
                    let d = s[i] - n[i];
                    (
                        format!(
                            "speedtap {} vs nginx {}: {}",
                            dur(s[i], true),
                            dur(n[i], true),
                            dur(d, true)
                        ),
                        Some(d <= 50.0),
                    )
                }
                _ => ("n/a (an arm was skipped)".into(), None),
            };
            out.push((
                format!("added chunk p50 within 50 µs of nginx's ({label})"),
                v,
                ok,
            ));
        }
        for (label, i) in [("1×500/s", 3), (multi.as_str(), 5)] {
            let (v, ok) = match st {
                Some(s) => (dur(s[i], true), Some(s[i] < 500.0)),
                None => ("n/a".into(), None),
            };
            out.push((format!("added chunk p99 under 0.5 ms ({label})"), v, ok));
        }
        let (v, ok) = match (st, lt) {
            (Some(s), Some(l)) => {
                // A proxy adding nothing measurable has no ratio: clamp
                // the divisor at 1 µs and say so.
                let ratio = l[0] / s[0].max(1.0);
                (
                    format!(
                        "p50: LiteLLM {} / speedtap {} = {:.0}×",
                        dur(l[0], true),
                        dur(s[0], true),
                        ratio
                    ),
                    Some(ratio >= 20.0),
                )
            }
            _ => ("n/a (an arm was skipped)".into(), None),
        };
        out.push(("added TTFT at least 20× below LiteLLM's".into(), v, ok));
        let (cs, cn) = (
            self.cpu_per_m(ArmKind::Speedtap),
            self.cpu_per_m(ArmKind::Nginx),
        );
        // Under one clock tick (10 ms) of nginx CPU, as in a smoke run,
        // there is no ratio to speak of.
        let ratio = if cn > 0.0 { cs / cn } else { f64::NAN };
        out.push((
            "CPU per million streamed tokens at most 2× nginx's".into(),
            format!("{} vs {} s/M = {}×", num(cs, 1), num(cn, 1), num(ratio, 1)),
            (!ratio.is_nan()).then_some(ratio <= 2.0),
        ));
        let top = self.sweep.iter().max_by_key(|l| l.streams);
        let (v, ok) = match top.and_then(|l| {
            let (_, p99) = self.sweep_added(l, ArmKind::Speedtap)?;
            let meter = l
                .cells
                .get(self.sweep_col(ArmKind::Speedtap)?)?
                .meter
                .clone()?;
            Some((l.streams, p99, meter))
        }) {
            Some((n, p99, m)) => (
                format!(
                    "{n} streams: added p99 {}, metered {}",
                    dur(p99, true),
                    meter_text(&m)
                ),
                Some(n >= 2000 && p99 < 1_000.0 && m.all_good()),
            ),
            None => ("n/a".into(), None),
        };
        out.push((
            format!(
                "2,000 metered streams at 20 tok/s on {} cores: added p99 under 1 ms, all metered within 2%",
                self.machine.cores
            ),
            v,
            ok,
        ));
        if self.row(ArmKind::Capture).is_some() {
            let cc = self.cpu_per_m(ArmKind::Capture);
            let ratio = if cs > 0.0 { cc / cs } else { f64::NAN };
            out.push((
                "capture: CPU per million streamed tokens no more than the proxy's".into(),
                format!(
                    "capture {} vs speedtap proxy {} s/M = {}×",
                    num(cc, 1),
                    num(cs, 1),
                    num(ratio, 2)
                ),
                (!ratio.is_nan()).then_some(ratio <= 1.0),
            ));
            for n in [500, 2000] {
                let d = self.capture_drops_at(n);
                out.push((
                    if n == 500 {
                        "capture: no lost packets at 500 concurrent streams".into()
                    } else {
                        format!("capture: lost packets at {n} concurrent streams (reported)")
                    },
                    d.map_or("n/a (level not run)".into(), |d| d.to_string()),
                    if n == 500 { d.map(|d| d == 0) } else { None },
                ));
            }
        }
        out
    }

    fn render_targets(&self, s: &mut String) {
        let _ = writeln!(
            s,
            "\n### Targets\n\n| target | measured | met |\n|---|---|---|"
        );
        for (name, v, ok) in self.targets() {
            let verdict = match ok {
                Some(true) => "yes",
                Some(false) => "**no**",
                None => "n/a",
            };
            let _ = writeln!(s, "| {name} | {v} | {verdict} |");
        }
    }

    /// What the smoke run finds missing or wrong: every non-skipped arm
    /// must have every number, no incomplete stream, and speedtap every
    /// stream metered right.
    pub fn problems(&self, required: &[String]) -> Vec<String> {
        let mut out = Vec::new();
        for a in &self.arms {
            let name = a.kind.name();
            if let Err(reason) = &a.status {
                if required.iter().any(|r| r == name) {
                    out.push(format!("{name} is required but was skipped: {reason}"));
                }
                continue;
            }
            let Some((r, sums)) = self.row(a.kind) else {
                out.push(format!("{name}: no results"));
                continue;
            };
            if sums.figures().iter().any(|v| v.is_nan()) {
                out.push(format!("{name}: a latency figure is missing"));
            }
            let bad = r.ttft.bad + r.single.bad + r.multi.bad;
            if bad > 0 {
                let why: Vec<String> = [&r.ttft, &r.single, &r.multi]
                    .iter()
                    .map(|s| s.failure_text())
                    .filter(|t| !t.is_empty())
                    .collect();
                out.push(format!(
                    "{name}: {bad} incomplete stream(s): {}",
                    why.join("; ")
                ));
            }
            if a.kind != ArmKind::Direct {
                if r.cpu_per_m(a.kind).is_nan() {
                    out.push(format!("{name}: CPU per million tokens missing"));
                }
                if r.peak_rss.unwrap_or(0) == 0 {
                    out.push(format!("{name}: peak RSS missing"));
                }
            }
            if a.kind.meters() && !r.meter.as_ref().is_some_and(MeterCheck::all_good) {
                out.push(format!(
                    "{name}: metering wrong: {}",
                    r.meter.as_ref().map_or("not checked".into(), meter_text)
                ));
            }
        }
        for level in &self.sweep {
            for (kind, cell) in self.sweep_arms.iter().zip(&level.cells) {
                let sm = cell.samples.summary();
                if sm.chunk_us(50.0).is_nan() || sm.chunk_us(99.0).is_nan() {
                    out.push(format!(
                        "sweep {} streams, {}: latency missing",
                        level.streams,
                        kind.name()
                    ));
                }
                if cell.samples.bad > 0 {
                    out.push(format!(
                        "sweep {} streams, {}: {} incomplete stream(s): {}",
                        level.streams,
                        kind.name(),
                        cell.samples.bad,
                        cell.samples.failure_text()
                    ));
                }
                if kind.meters() && !cell.meter.as_ref().is_some_and(MeterCheck::all_good) {
                    out.push(format!(
                        "sweep {} streams, {}: metering wrong: {}",
                        level.streams,
                        kind.name(),
                        cell.meter.as_ref().map_or("not checked".into(), meter_text)
                    ));
                }
            }
        }
        if let Err(why) = &self.plots {
            out.push(format!("plots: {why}"));
        }
        out
    }
}
