//! The main comparison: every arm through the same three workloads,
//! interleaved in rounds with the arm order rotating each round, so that
//! noise on this shared machine (other jobs, frequency changes) lands on
//! all arms alike.
//!
//! Workloads, per arm per round:
//! - `ttft`: short streams one after another, for clean times to first
//!   token (no other stream competing);
//! - `single`: one stream at 500 tokens/s (a fast local model);
//! - `multi`: 32 streams at 40 tokens/s, starts spread over one tick (a
//!   batching server with many users; the load the earlier in-process
//!   measurement found +3 ms p99 on).
//!
//! CPU per million streamed tokens is taken over `single` and `multi` only
//! (the streaming work; `ttft` is all connection setup), from the proxy
//! tree's CPU time just before and after them. A streamed token is one
//! chunk, as local servers send one token per chunk.

use std::time::Duration;

use crate::arms::{Arm, ArmKind};
use crate::client;
use crate::stats::Samples;
use crate::upstream::{Sent, Shape};
use crate::verify::{self, MeterCheck};

/// The sizes of one run.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    pub rounds: usize,
    pub ttft_streams: usize,
    pub single_duration: Duration,
    pub multi_streams: usize,
    pub multi_duration: Duration,
}

impl Plan {
    pub fn full() -> Plan {
        Plan {
            rounds: 5,
            ttft_streams: 20,
            single_duration: Duration::from_secs(2),
            multi_streams: 32,
            multi_duration: Duration::from_secs(2),
        }
    }

    pub fn smoke() -> Plan {
        Plan {
            rounds: 1,
            ttft_streams: 3,
            single_duration: Duration::from_millis(200),
            multi_streams: 4,
            multi_duration: Duration::from_millis(250),
        }
    }

    fn shapes(&self, arm: ArmKind) -> [Shape; 3] {
        let shape = |chunks: usize, interval: Duration, what: &str| Shape {
            chunks,
            interval,
            tag: format!("{what}-{}", arm.name()),
        };
        let per = |d: Duration, rate: u32| (d.as_secs_f64() * rate as f64).round() as usize;
        [
            shape(4, Duration::from_millis(1), "ttft"),
            shape(
                per(self.single_duration, 500),
                Duration::from_micros(2_000),
                "single",
            ),
            shape(
                per(self.multi_duration, 40),
                Duration::from_micros(25_000),
                "multi",
            ),
        ]
    }
}

/// What one arm collected over all rounds.
#[derive(Default, Clone)]
pub struct ArmResult {
    pub ttft: Samples,
    pub single: Samples,
    pub multi: Samples,
    /// Proxy CPU seconds over the streaming workloads.
    pub cpu_secs: f64,
    /// Chunks that arrived in the streaming workloads.
    pub chunks: u64,
    /// Proxy context switches over the streaming workloads.
    pub ctx_switches: u64,
    pub peak_rss: Option<u64>,
    /// speedtap only.
    pub meter: Option<MeterCheck>,
}

impl ArmResult {
    /// CPU seconds per million streamed tokens (NaN for direct, whose
    /// CPU is the harness's own).
    pub fn cpu_per_m(&self, kind: ArmKind) -> f64 {
        if kind == ArmKind::Direct || self.chunks == 0 {
            f64::NAN
        } else {
            self.cpu_secs / self.chunks as f64 * 1e6
        }
    }

    /// Proxy context switches per streamed token (NaN for direct).
    pub fn switches_per_token(&self, kind: ArmKind) -> f64 {
        if kind == ArmKind::Direct || self.chunks == 0 {
            f64::NAN
        } else {
            self.ctx_switches as f64 / self.chunks as f64
        }
    }
}

/// Runs `plan` over `arms`; results in the same order as `arms`.
pub async fn run(plan: &Plan, arms: &mut [Arm], sent: &Sent) -> Vec<ArmResult> {
    let mut results: Vec<ArmResult> = arms.iter().map(|_| ArmResult::default()).collect();
    for round in 0..plan.rounds {
        let mut order: Vec<usize> = (0..arms.len()).collect();
        order.rotate_left(round % arms.len().max(1));
        let names: Vec<&str> = order.iter().map(|&i| arms[i].kind.name()).collect();
        println!(
            "compare: round {}/{}: {}",
            round + 1,
            plan.rounds,
            names.join(", ")
        );
        for &i in &order {
            let arm = &arms[i];
            let r = &mut results[i];
            let [ttft, single, multi] = plan.shapes(arm.kind);
            client::run_sequential(arm.addr, plan.ttft_streams, &ttft, &mut r.ttft).await;
            let cpu0 = arm.cpu_secs();
            let cs0 = arm.ctx_switches();
            let before = r.single.chunk_ns.len() + r.multi.chunk_ns.len();
            client::run_batch(arm.addr, 1, &single, Duration::ZERO, &mut r.single).await;
            client::run_batch(
                arm.addr,
                plan.multi_streams,
                &multi,
                multi.interval,
                &mut r.multi,
            )
            .await;
            r.cpu_secs += arm.cpu_secs() - cpu0;
            r.ctx_switches += arm.ctx_switches().saturating_sub(cs0);
            r.chunks += (r.single.chunk_ns.len() + r.multi.chunk_ns.len() - before) as u64;
        }
    }
    for (arm, r) in arms.iter_mut().zip(results.iter_mut()) {
        r.peak_rss = arm.peak_rss();
        let shapes = plan.shapes(arm.kind);
        if let (true, Some(api)) = (arm.kind.meters(), arm.api) {
            let mut all = MeterCheck::default();
            for (shape, samples) in shapes.iter().zip([&r.ttft, &r.single, &r.multi]) {
                let contents = sent.take(&shape.model());
                let c = verify::check(
                    api,
                    &shape.model(),
                    samples.streams,
                    &contents,
                    Duration::from_secs(30),
                )
                .await;
                all.merge(&c);
            }
            r.meter = Some(all);
        } else {
            for shape in &shapes {
                sent.take(&shape.model());
            }
        }
    }
    results
}
