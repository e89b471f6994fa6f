//! The concurrency sweep: N streams at 20 tokens/s each, N from 1 to 2000,
//! through direct, nginx, speedtap and capture (LiteLLM is stopped by then:
//! it can't keep up with 32 streams, see the reference), with every
//! speedtap stream's metering checked, and the capture's lost packets
//! (kernel, interface and queue drops: the stats' `capture_dropped_packets`)
//! counted per level.
//!
//! Starts are spread over one second so the streams' ticks interleave
//! evenly over each 50 ms period instead of landing together; a stream
//! lasts `chunks` ticks. Within a level the arms run one after another,
//! their order rotating from level to level and round to round.

use std::time::Duration;

use crate::arms::{Arm, ArmKind};
use crate::client;
use crate::stats::Samples;
use crate::upstream::{Sent, Shape};
use crate::verify::{self, MeterCheck};

/// The sizes of one sweep.
#[derive(Clone, Debug)]
pub struct SweepPlan {
    pub levels: Vec<usize>,
    pub chunks: usize,
    pub stagger: Duration,
    pub rounds: usize,
}

/// Tokens per second of each stream.
pub const RATE: u32 = 20;

impl SweepPlan {
    pub fn full() -> SweepPlan {
        SweepPlan {
            levels: vec![1, 10, 100, 500, 1000, 2000],
            chunks: 100,
            stagger: Duration::from_secs(1),
            rounds: 2,
        }
    }

    pub fn smoke() -> SweepPlan {
        SweepPlan {
            levels: vec![1, 10],
            chunks: 10,
            stagger: Duration::from_millis(100),
            rounds: 1,
        }
    }
}

/// One arm at one level.
#[derive(Default, Clone)]
pub struct Cell {
    pub samples: Samples,
    pub cpu_secs: f64,
    /// speedtap only.
    pub meter: Option<MeterCheck>,
    /// The capture arm only: packets the capture lost at this level.
    pub drops: Option<u64>,
    /// Peak RSS of the process tree after this level (cumulative peak).
    pub peak_rss: Option<u64>,
}

/// One level: cells in the order of the arms passed to [`run`].
pub struct Level {
    pub streams: usize,
    pub cells: Vec<Cell>,
}

/// The capture arm's lost-packet counter now (`None` for other arms, or
/// when the stats can't be read).
async fn capture_drops(arm: &Arm) -> Option<u64> {
    if arm.kind != ArmKind::Capture {
        return None;
    }
    let (status, body) = client::get(arm.api?, "/api/v1/stats").await?;
    if status != 200 {
        return None;
    }
    serde_json::from_slice::<serde_json::Value>(&body)
        .ok()?
        .get("capture_dropped_packets")?
        .as_u64()
}

pub async fn run(plan: &SweepPlan, arms: &mut [&mut Arm], sent: &Sent) -> Vec<Level> {
    let mut out = Vec::new();
    for (li, &n) in plan.levels.iter().enumerate() {
        let mut cells: Vec<Cell> = arms.iter().map(|_| Cell::default()).collect();
        for round in 0..plan.rounds {
            let mut order: Vec<usize> = (0..arms.len()).collect();
            order.rotate_left((li + round) % arms.len().max(1));
            for &i in &order {
                let arm = &mut *arms[i];
                if let Err(e) = arm.check_alive() {
                    println!("compare: sweep: {} died: {e}", arm.kind.name());
                    continue;
                }
                let shape = Shape {
                    chunks: plan.chunks,
                    interval: Duration::from_secs(1) / RATE,
                    tag: format!("sweep{n}-{}-r{round}", arm.kind.name()),
                };
                let cell = &mut cells[i];
                let drops0 = capture_drops(arm).await;
                let cpu0 = arm.cpu_secs();
                let mut samples = Samples::default();
                client::run_batch(arm.addr, n, &shape, plan.stagger, &mut samples).await;
                cell.cpu_secs += arm.cpu_secs() - cpu0;
                let streams = samples.streams;
                let bad = samples.bad;
                let why = samples.failure_text();
                cell.samples.extend(samples);
                let contents = sent.take(&shape.model());
                if let (true, Some(api)) = (arm.kind.meters(), arm.api) {
                    let c = verify::check(
                        api,
                        &shape.model(),
                        streams,
                        &contents,
                        Duration::from_secs(60),
                    )
                    .await;
                    cell.meter.get_or_insert_with(Default::default).merge(&c);
                }
                // Read after the check: the calls are settled, so every
                // packet of them has been through the capture.
                if let (Some(a), Some(b)) = (drops0, capture_drops(arm).await) {
                    *cell.drops.get_or_insert(0) += b.saturating_sub(a);
                }
                println!(
                    "compare: sweep {n} streams, {}, round {}: {} incomplete{}",
                    arm.kind.name(),
                    round + 1,
                    bad,
                    if bad > 0 {
                        format!(" ({why})")
                    } else {
                        String::new()
                    }
                );
            }
        }
        for (cell, arm) in cells.iter_mut().zip(arms.iter()) {
            cell.peak_rss = arm.peak_rss();
        }
        out.push(Level { streams: n, cells });
    }
    out
}
