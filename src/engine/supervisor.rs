//! `Supervisor`: the one actor that owns the engine's shared state: the
//! route calibration table, the active calls, the ring of recent calls, the
//! global meter with its hourly high/low and publishing cadence, and the
//! subscribers.
//!
//! Publishing follows tokio-console's aggregator: per-call snapshots are
//! forwarded as they come (they are already spaced by the call meters),
//! global stats go out on a timer whose period the global meter decides
//! (1 s while streams are active, 10 s when idle). Subscribers get
//! `try_send`: one that is full or gone is dropped, never waited on.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use actix::prelude::*;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::messages::*;
use super::metrics::Metrics;
use super::model::{Call, EngineEvent};
use crate::meter::calibration::CalibrationTable;
use crate::meter::global::{GlobalMeter, Stats};
use crate::meter::TokenSource;

/// How many settled calls the supervisor keeps for the API. The contract
/// asks for at least 1,000.
pub const RECENT_CALLS: usize = 2_000;

/// Default bound of a subscriber's queue. At 1 Hz stats plus 4 snapshots
/// per second per call, this absorbs several seconds of a busy engine.
pub const SUBSCRIBER_CAPACITY: usize = 4_096;

pub struct Supervisor {
    calibration: Arc<RwLock<CalibrationTable>>,
    active: HashMap<u64, Call>,
    recent: VecDeque<(u64, Call)>,
    global: GlobalMeter,
    subscribers: Vec<mpsc::Sender<EngineEvent>>,
    metrics: Arc<Metrics>,
    last_stats: Stats,
    next_publish: Option<(SpawnHandle, Instant)>,
    /// Subscribers dropped for being too slow (diagnostics).
    dropped_subscribers: u64,
}

impl Supervisor {
    pub fn new(calibration: Arc<RwLock<CalibrationTable>>, metrics: Arc<Metrics>) -> Self {
        let mut global = GlobalMeter::new();
        let last_stats = global.sample(Instant::now());
        Supervisor {
            calibration,
            active: HashMap::new(),
            recent: VecDeque::with_capacity(RECENT_CALLS),
            global,
            subscribers: Vec::new(),
            metrics,
            last_stats,
            next_publish: None,
            dropped_subscribers: 0,
        }
    }

    fn broadcast(&mut self, event: EngineEvent) {
        let mut dropped = 0;
        self.subscribers
            .retain(|tx| match tx.try_send(event.clone()) {
                Ok(()) => true,
                Err(_) => {
                    dropped += 1;
                    false
                }
            });
        self.dropped_subscribers += dropped;
    }

    /// Samples the global meter, publishes the reading and re-arms the
    /// timer at the cadence the meter asks for.
    fn publish_stats(&mut self, ctx: &mut Context<Self>) {
        let now = Instant::now();
        self.last_stats = self.global.sample(now);
        self.metrics.set_active_calls(self.active.len());
        self.metrics.set_stats(&self.last_stats);
        let stats = self.last_stats.clone();
        self.broadcast(EngineEvent::Stats(stats));
        self.schedule_publish(ctx, self.global.publish_interval(now));
    }

    fn schedule_publish(&mut self, ctx: &mut Context<Self>, after: Duration) {
        let at = Instant::now() + after;
        if let Some((handle, due)) = self.next_publish.take() {
            if due <= at {
                self.next_publish = Some((handle, due));
                return;
            }
            ctx.cancel_future(handle);
        }
        let handle = ctx.run_later(after, |act, ctx| {
            act.next_publish = None;
            act.publish_stats(ctx);
        });
        self.next_publish = Some((handle, at));
    }

    fn settle(&mut self, seq: u64, call: Call) {
        self.active.remove(&seq);
        self.global.remove(seq);
        if self.recent.len() == RECENT_CALLS {
            self.recent.pop_front();
        }
        self.recent.push_back((seq, call.clone()));
        self.metrics.record_settled(&call);
        self.broadcast(EngineEvent::Settled(call));
    }

    fn all_calls_newest_first(&self) -> impl Iterator<Item = &Call> {
        let mut active: Vec<(&u64, &Call)> = self.active.iter().collect();
        active.sort_by(|a, b| b.0.cmp(a.0));
        // In-flight calls are newer than or interleaved with recent ones;
        // merge by sequence number.
        let mut recent = self.recent.iter().rev().peekable();
        let mut active = active.into_iter().peekable();
        std::iter::from_fn(move || match (active.peek(), recent.peek()) {
            (Some((a, _)), Some((r, _))) => {
                if **a > *r {
                    active.next().map(|(_, c)| c)
                } else {
                    recent.next().map(|(_, c)| c)
                }
            }
            (Some(_), None) => active.next().map(|(_, c)| c),
            (None, Some(_)) => recent.next().map(|(_, c)| c),
            (None, None) => None,
        })
    }
}

impl Actor for Supervisor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        // Calls carry thousands of messages per second at scale.
        ctx.set_mailbox_capacity(usize::MAX >> 4);
        self.publish_stats(ctx);
    }
}

impl Handler<CallOpened> for Supervisor {
    type Result = ();
    fn handle(&mut self, msg: CallOpened, _: &mut Self::Context) {
        if let Some(speed) = msg.call.speed.clone() {
            self.broadcast(EngineEvent::Speed {
                call: msg.call.identity.clone(),
                speed,
            });
        }
        self.active.insert(msg.seq, msg.call);
    }
}

impl Handler<CallProgress> for Supervisor {
    type Result = ();
    fn handle(&mut self, msg: CallProgress, ctx: &mut Self::Context) {
        let was_active = self.global.is_active(Instant::now());
        if let Some(at) = msg.last_output_at {
            let estimated = msg.speed.token_source == TokenSource::Estimated;
            self.global
                .observe(msg.seq, msg.speed.output_tokens, estimated, at);
        }
        if let Some(call) = self.active.get_mut(&msg.seq) {
            call.identity = msg.identity.clone();
            call.speed = Some(msg.speed.clone());
        }
        self.broadcast(EngineEvent::Speed {
            call: msg.identity,
            speed: msg.speed,
        });
        if !was_active && self.global.is_active(Instant::now()) {
            // Leave the idle cadence at once: the first reading of a burst
            // of traffic shouldn't wait up to 10 s.
            self.schedule_publish(ctx, Duration::from_secs(1));
        }
    }
}

impl Handler<CallClosed> for Supervisor {
    type Result = ();
    fn handle(&mut self, msg: CallClosed, _: &mut Self::Context) {
        if let (Some(ratio), Some(model)) = (msg.calibration_ratio, &msg.call.identity.model) {
            if let Ok(mut table) = self.calibration.write() {
                table.observe(&msg.call.identity.route, model, ratio);
            }
        }
        if let Some(speed) = msg.call.speed.clone() {
            self.broadcast(EngineEvent::Speed {
                call: msg.call.identity.clone(),
                speed,
            });
        }
        self.settle(msg.seq, msg.call);
    }
}

impl Handler<PassedThrough> for Supervisor {
    type Result = ();
    fn handle(&mut self, msg: PassedThrough, _: &mut Self::Context) {
        self.settle(msg.seq, msg.call);
    }
}

impl Handler<Broadcast> for Supervisor {
    type Result = ();
    fn handle(&mut self, msg: Broadcast, _: &mut Self::Context) {
        self.broadcast(msg.0);
    }
}

impl Handler<Subscribe> for Supervisor {
    type Result = MessageResult<Subscribe>;
    fn handle(&mut self, msg: Subscribe, _: &mut Self::Context) -> Self::Result {
        let (tx, rx) = mpsc::channel(msg.capacity.max(1));
        // A new subscriber starts from the current reading.
        let _ = tx.try_send(EngineEvent::Stats(self.last_stats.clone()));
        self.subscribers.push(tx);
        MessageResult(rx)
    }
}

impl Handler<GetCalls> for Supervisor {
    type Result = MessageResult<GetCalls>;
    fn handle(&mut self, msg: GetCalls, _: &mut Self::Context) -> Self::Result {
        let q = msg.0;
        let calls = self
            .all_calls_newest_first()
            .filter(|c| q.route.as_deref().is_none_or(|r| c.identity.route == r))
            .take(q.limit)
            .cloned()
            .collect();
        MessageResult(calls)
    }
}

impl Handler<GetCall> for Supervisor {
    type Result = Option<Call>;
    fn handle(&mut self, msg: GetCall, _: &mut Self::Context) -> Option<Call> {
        self.all_calls_newest_first()
            .find(|c| c.identity.id == msg.0)
            .cloned()
    }
}

impl Handler<GetStats> for Supervisor {
    type Result = MessageResult<GetStats>;
    fn handle(&mut self, _: GetStats, _: &mut Self::Context) -> Self::Result {
        MessageResult(self.last_stats.clone())
    }
}

impl Handler<GetCalibration> for Supervisor {
    type Result = MessageResult<GetCalibration>;
    fn handle(&mut self, _: GetCalibration, _: &mut Self::Context) -> Self::Result {
        MessageResult(
            self.calibration
                .read()
                .map(|t| t.clone())
                .unwrap_or_default(),
        )
    }
}
