//! What metering costs per streamed frame, and per published snapshot.
//!
//! Two groups:
//! - `call_metering`: one whole call through `CallMetering` (what a call
//!   actor drives): response head, then every body read as a frame with
//!   its arrival time, then `finish`. Each frame is decoded, its text
//!   buffered, and tokenized (o200k, the default estimator) whenever a
//!   snapshot is due, exactly as in the engine. Throughput is
//!   `Throughput::Elements(frames)`, so criterion's elem/s is frames per
//!   second per core and its time divided by the frame count is the cost
//!   of one frame. Arrival times are synthetic (a `tokio::time::Instant`
//!   base plus offsets, no sleeping): the first frame at 200 ms, then one
//!   every 20 ms (50 tok/s, a typical local model), so a snapshot (and a
//!   tokenizer pass over ~12 frames of text) is due every 250 ms of stream
//!   time. `openai_chat_flush_every_frame` spaces frames 260 ms apart
//!   instead: every frame publishes and tokenizes its own text, the worst
//!   case per frame.
//! - `publish`: what one published snapshot costs downstream of the meter.
//!   `supervisor_call_progress` sends `CallProgress` messages to the real
//!   `Supervisor` actor (global meter update, active-call update, one
//!   `EngineEvent::Speed` cloned to one subscriber, which a task drains as
//!   the SSE endpoint would), timed with `iter_custom` from the first send
//!   until a request-reply message queued behind them returns.
//!   `sse_speed_frame` is the serialisation of that event for
//!   `GET /api/v1/events` (`speedtap::api::sse::frame`, JSON included).
//!
//! Bodies: `bodies` (real captures where they exist, simulator output for
//! Ollama and TGI). Under `cargo test --benches` criterion runs each
//! benchmark once.

// The 80-line limit is for product code; a bench may read as one long script.
#![allow(clippy::too_many_lines)]
#![allow(clippy::unwrap_used)] // a test (or bench) may unwrap: a panic is its failure report

mod bodies;

use std::hint::black_box;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant as StdInstant};

use actix::{Actor, System, SystemRunner};
use criterion::{Criterion, Throughput};
use speedtap::api::sse;
use speedtap::engine::messages::{CallOpened, CallProgress, GetStats, Subscribe};
use speedtap::engine::metrics::Metrics;
use speedtap::engine::supervisor::Supervisor;
use speedtap::meter::calibration::CalibrationTable;
use speedtap::meter::pipeline::{CallMetering, ResponseHead, StreamEnd};
use speedtap::model::{Call, CallIdentity, CallStatus, EngineEvent};
use speedtap::model::{Phase, Snapshot, TokenSource};
use speedtap::tokens::{default_estimator, O200kEstimator, TokenEstimator};
use tokio::time::Instant;

use bodies::Body;

/// Dispatch to the first frame.
const FIRST_FRAME: Duration = Duration::from_millis(200);

/// Frame spacing at 50 tok/s.
const TYPICAL_GAP: Duration = Duration::from_millis(20);

/// Longer than the 250 ms snapshot interval: every frame publishes.
const FLUSH_GAP: Duration = Duration::from_millis(260);

/// One whole call through `CallMetering`; returns the number of snapshots
/// published (kept, so nothing is optimised away).
fn meter_call(body: &Body, estimator: &Arc<dyn TokenEstimator>, gap: Duration) -> u64 {
    let t0 = Instant::now();
    let mut m = CallMetering::new(t0, estimator.clone());
    let mut published = u64::from(black_box(m.start()).elapsed_ms == 0);
    m.on_response_head(&ResponseHead {
        status: 200,
        api: body.api,
        framing: body.framing,
        model: Some(body.model.to_owned()),
        calibration: 1.0,
        sniff: false,
    });
    let mut at = t0 + FIRST_FRAME;
    for read in &body.reads {
        if m.on_frame(read, at).is_some() {
            published += 1;
        }
        at += gap;
    }
    let report = m.finish(StreamEnd::Complete, at);
    black_box(report.snapshot.output_tokens);
    published
}

fn identity() -> CallIdentity {
    CallIdentity {
        id: "c-000001".into(),
        route: "bench".into(),
        api: speedtap::model::ApiKind::OpenaiChat,
        model: Some("qwen3:8b".into()),
        started_at: "2026-01-01T00:00:00.000Z".into(),
        demo: false,
    }
}

fn live_snapshot(tokens: u64) -> Snapshot {
    Snapshot {
        stalled_ms: None,
        phase: Phase::Responding,
        is_final: false,
        elapsed_ms: 1234,
        time_to_first_token_ms: Some(312),
        output_tokens: tokens,
        output_tokens_per_second: Some(41.7),
        token_source: TokenSource::Estimated,
        wait: None,
    }
}

/// `iters` `CallProgress` messages through a running `Supervisor` with one
/// subscriber being drained; the time from the first send until a
/// `GetStats` queued behind them is answered (the mailbox is FIFO).
fn supervisor_batch(system: &mut SystemRunner, iters: u64) -> Duration {
    system.block_on(async move {
        let calibration = Arc::new(RwLock::new(CalibrationTable::new()));
        let sup = Supervisor::new(calibration, Arc::new(Metrics::new())).start();
        let mut rx = sup
            .send(Subscribe { capacity: 4096 })
            .await
            .expect("supervisor");
        let drain = actix::spawn(async move { while rx.recv().await.is_some() {} });
        let id = identity();
        sup.send(CallOpened {
            seq: 1,
            call: Call {
                identity: id.clone(),
                status: CallStatus::InFlight,
                http_status: Some(200),
                speed: Some(live_snapshot(0)),
                input_tokens: None,
                details: Default::default(),
            },
        })
        .await
        .expect("supervisor");
        let t0 = Instant::now();
        let start = StdInstant::now();
        for i in 0..iters {
            sup.do_send(CallProgress {
                seq: 1,
                identity: id.clone(),
                speed: live_snapshot(i + 1),
                last_output_at: Some(t0 + Duration::from_micros(i)),
            });
        }
        let _ = sup.send(GetStats).await.expect("supervisor");
        let elapsed = start.elapsed();
        System::current().stop();
        drain.abort();
        elapsed
    })
}

fn main() {
    // Build the BPE tables before anything is timed.
    O200kEstimator::warm_up();
    let estimator = default_estimator();
    let corpus = bodies::corpus();

    let mut criterion = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .without_plots()
        .configure_from_args();
    {
        let mut group = criterion.benchmark_group("call_metering");
        for body in &corpus {
            group.throughput(Throughput::Elements(body.reads.len() as u64));
            group.bench_function(body.api.as_str(), |b| {
                b.iter(|| meter_call(black_box(body), &estimator, TYPICAL_GAP))
            });
        }
        let chat = &corpus[0];
        assert_eq!(chat.api, speedtap::model::ApiKind::OpenaiChat);
        group.throughput(Throughput::Elements(chat.reads.len() as u64));
        group.bench_function("openai_chat_flush_every_frame", |b| {
            b.iter(|| meter_call(black_box(chat), &estimator, FLUSH_GAP))
        });
        group.finish();
    }
    {
        let mut group = criterion.benchmark_group("publish");
        group.throughput(Throughput::Elements(1));
        group.bench_function("supervisor_call_progress", |b| {
            b.iter_custom(|iters| supervisor_batch(&mut System::new(), iters))
        });
        let event = EngineEvent::Speed {
            call: identity(),
            speed: live_snapshot(201),
            seen_by: speedtap::model::SeenBy::Proxy,
        };
        group.bench_function("sse_speed_frame", |b| {
            b.iter(|| sse::frame(black_box(&event)))
        });
        group.finish();
    }
    criterion.final_summary();
}
