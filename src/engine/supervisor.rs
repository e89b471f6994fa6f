//! `Supervisor`: the one actor that owns the engine's shared state: the
//! route calibration table, the active calls, the ring of recent calls
//! (and a small one apart for the unmetered ones), the global meter with its hourly high/low and publishing cadence, and the
//! subscribers.
//!
//! Publishing follows tokio-console's aggregator: per-call snapshots are
//! forwarded as they come (they are already spaced by the call meters),
//! global stats go out on a timer whose period the global meter decides
//! (1 s while streams are active, 10 s when idle). Subscribers get
//! `try_send`: one that is full or gone is dropped, never waited on.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use actix::{Actor, AsyncContext, Context, Handler, MessageResult, SpawnHandle};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::messages::*;
use super::metrics::Metrics;
use super::relay::Legs;
use crate::meter::calibration::CalibrationTable;
use crate::meter::global::{GlobalMeter, ACTIVE_CADENCE};
use crate::model::Stats;
use crate::model::TokenSource;
use crate::model::{ApiKind, Call, CallStatus, EngineEvent, SeenBy};
use crate::model::{HistoryDoc, HistoryPoint};
use crate::store::StoreWriter;

/// How many settled calls the supervisor keeps for the API. The contract
/// asks for at least 1,000.
pub const RECENT_CALLS: usize = 2_000;

/// How many settled unmetered calls (passed through, not measured: a
/// client polling `/api/tags` every few seconds, an encoded response) are
/// kept, apart from [`RECENT_CALLS`]: the noise of a busy day must not push
/// the real calls out, and a few hundred show what is polling.
pub const RECENT_UNMETERED: usize = 200;

/// Whether a settled call was passed through without being measured: a
/// path no decoder knows (whatever became of it) or an `unmetered` one.
/// Such calls are kept and listed apart (see [`RECENT_UNMETERED`]).
pub fn is_unmetered(call: &Call) -> bool {
    call.identity.api == ApiKind::Unknown || call.status == CallStatus::Unmetered
}

/// Default bound of a subscriber's queue. At 1 Hz stats plus 4 snapshots
/// per second per call, this absorbs several seconds of a busy engine.
pub const SUBSCRIBER_CAPACITY: usize = 4_096;

pub struct Supervisor {
    calibration: Arc<RwLock<CalibrationTable>>,
    active: HashMap<u64, Call>,
    recent: VecDeque<(u64, Call)>,
    /// Settled unmetered calls, kept apart (see [`RECENT_UNMETERED`]).
    recent_unmetered: VecDeque<(u64, Call)>,
    global: GlobalMeter,
    subscribers: Vec<mpsc::Sender<EngineEvent>>,
    metrics: Arc<Metrics>,
    last_stats: Stats,
    next_publish: Option<(SpawnHandle, Instant)>,
    /// Subscribers dropped for being too slow (diagnostics).
    dropped_subscribers: u64,
    /// Where settled calls are made durable; `None` runs in memory.
    store: Option<Arc<StoreWriter>>,
    /// Calls that ended and wait for the store to confirm them (listed in
    /// flight meanwhile), by id: their sequence number and final record.
    pending: HashMap<String, (u64, Call)>,
    /// Published readings with a real tps, for the last-hour chart:
    /// (unix ms, tps), oldest first, at most one per publish.
    chart: VecDeque<HistoryPoint>,
    /// Relays' legs and the client calls they belong to (see
    /// [`crate::engine::relay`]).
    legs: Legs,
}

/// How far back the chart's history reaches.
pub const CHART_WINDOW: Duration = Duration::from_secs(60 * 60);

impl Supervisor {
    pub fn new(calibration: Arc<RwLock<CalibrationTable>>, metrics: Arc<Metrics>) -> Self {
        let mut global = GlobalMeter::new();
        let last_stats = global.sample(Instant::now());
        Supervisor {
            calibration,
            active: HashMap::new(),
            recent: VecDeque::with_capacity(RECENT_CALLS),
            recent_unmetered: VecDeque::with_capacity(RECENT_UNMETERED),
            global,
            subscribers: Vec::new(),
            metrics,
            last_stats,
            next_publish: None,
            dropped_subscribers: 0,
            store: None,
            pending: HashMap::new(),
            chart: VecDeque::new(),
            legs: Legs::default(),
        }
    }

    fn broadcast(&mut self, event: EngineEvent) {
        let mut dropped = 0;
        // Only a reader that fell behind (its queue full) is counted as
        // dropped; one that went away (an SSE client that disconnected)
        // is simply let go.
        self.subscribers
            .retain(|tx| match tx.try_send(event.clone()) {
                Ok(()) => true,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    dropped += 1;
                    false
                }
                Err(mpsc::error::TrySendError::Closed(_)) => false,
            });
        if dropped > 0 {
            self.dropped_subscribers += dropped;
            self.metrics.add_dropped_subscribers(dropped);
        }
    }

    /// The latest reading, with the count of dropped subscribers as of now.
    fn stats(&self) -> Stats {
        Stats {
            dropped_subscribers: self.dropped_subscribers,
            capture_dropped_packets: self.metrics.capture_dropped(),
            ..self.last_stats.clone()
        }
    }

    /// Samples the global meter, publishes the reading and re-arms the
    /// timer at the cadence the meter asks for.
    fn publish_stats(&mut self, ctx: &mut Context<Self>) {
        let now = Instant::now();
        self.last_stats = self.global.sample(now);
        self.last_stats.dropped_subscribers = self.dropped_subscribers;
        self.last_stats.capture_dropped_packets = self.metrics.capture_dropped();
        let legs = self.active.keys().filter(|s| self.legs.is_leg(**s)).count();
        self.metrics.set_active_calls(self.active.len() - legs);
        self.metrics.set_stats(&self.last_stats);
        self.record_chart_point();
        let stats = self.last_stats.clone();
        self.broadcast(EngineEvent::Stats(stats));
        // A call still waiting for its first token has had no token, so the
        // meter alone would call this idle; but the tray's "waiting 3.2 s"
        // must move each second, so any call in flight keeps 1 Hz.
        let every = if self.active.is_empty() {
            self.global.publish_interval(now)
        } else {
            ACTIVE_CADENCE
        };
        self.schedule_publish(ctx, every);
    }

    /// Appends the latest reading to the chart when it has a real tps,
    /// and forgets points older than [`CHART_WINDOW`].
    fn record_chart_point(&mut self) {
        let now_ms = unix_ms(SystemTime::now());
        let horizon = now_ms.saturating_sub(CHART_WINDOW.as_millis() as u64);
        while self.chart.front().is_some_and(|p| p.t < horizon) {
            self.chart.pop_front();
        }
        if let Some(tps) = self.last_stats.tps {
            self.chart.push_back(HistoryPoint { t: now_ms, tps });
        }
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

    /// A call ended. With a store it waits (listed in flight, with its
    /// final snapshot) until the writer confirms it is durable, so a crash
    /// never loses a call the API reported settled; without one it settles
    /// at once.
    /// A demo call or a relay's leg is never stored: it settles at once,
    /// kept only in the recent calls for the live views.
    fn finish_call(&mut self, seq: u64, call: Call) {
        let kept = !call.identity.demo && call.details.relay.is_none();
        let Some(store) = self.store.as_ref().filter(|_| kept) else {
            self.settle(seq, call);
            return;
        };
        self.global.remove(seq);
        store.record(call.clone());
        let mut listed = call.clone();
        listed.status = CallStatus::InFlight;
        self.active.insert(seq, listed);
        self.pending.insert(call.identity.id.clone(), (seq, call));
    }

    fn settle(&mut self, seq: u64, call: Call) {
        self.active.remove(&seq);
        self.global.remove(seq);
        let (ring, cap) = if is_unmetered(&call) {
            (&mut self.recent_unmetered, RECENT_UNMETERED)
        } else {
            (&mut self.recent, RECENT_CALLS)
        };
        if ring.len() == cap {
            ring.pop_front();
        }
        ring.push_back((seq, call.clone()));
        if call.details.relay.is_none() {
            self.metrics.record_settled(&call);
        }
        self.broadcast(EngineEvent::Settled(call));
    }

    /// Every call, in flight and recent, newest (latest dispatched, highest
    /// sequence number) first; the unmetered ones only with `unmetered`.
    ///
    /// All sets are sorted together: the recent rings are in settling
    /// order, which is not dispatch order whenever a later, shorter call
    /// finishes before an earlier one, so merging them as if they were
    /// sorted would list such calls out of order. At most `RECENT_CALLS`
    /// plus `RECENT_UNMETERED` plus the in-flight calls, per API request:
    /// cheap.
    fn all_calls_newest_first(&self, unmetered: bool) -> impl Iterator<Item = &Call> {
        let active = self
            .active
            .iter()
            .filter(|(_, call)| unmetered || !self.is_pending_unmetered(call));
        let unmetered_ring = self.recent_unmetered.iter().filter(|_| unmetered);
        let mut all: Vec<(u64, &Call)> = active
            .map(|(seq, call)| (*seq, call))
            .chain(self.recent.iter().map(|(seq, call)| (*seq, call)))
            .chain(unmetered_ring.map(|(seq, call)| (*seq, call)))
            .collect();
        all.sort_unstable_by_key(|&(seq, _)| std::cmp::Reverse(seq));
        all.into_iter().map(|(_, call)| call)
    }

    /// Whether `call`, listed in flight, is an unmetered one waiting for
    /// the store (listed as `in_flight` meanwhile; its final record says).
    fn is_pending_unmetered(&self, call: &Call) -> bool {
        self.pending
            .get(&call.identity.id)
            .is_some_and(|(_, fin)| is_unmetered(fin))
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
    fn handle(&mut self, msg: CallOpened, ctx: &mut Self::Context) {
        // Leave the idle cadence: this call's wait should be visible.
        self.schedule_publish(ctx, ACTIVE_CADENCE);
        if let Some(speed) = msg.call.speed.clone() {
            self.broadcast(EngineEvent::Speed {
                call: msg.call.identity.clone(),
                speed,
                seen_by: msg.call.details.seen_by,
            });
        }
        self.active.insert(msg.seq, msg.call);
    }
}

impl Handler<CallProgress> for Supervisor {
    type Result = ();
    fn handle(&mut self, msg: CallProgress, ctx: &mut Self::Context) {
        let was_active = self.global.is_active(Instant::now());
        if let Some(at) = msg.last_output_at.filter(|_| !self.legs.is_leg(msg.seq)) {
            let estimated = msg.speed.token_source == TokenSource::Estimated;
            self.global
                .observe(msg.seq, msg.speed.output_tokens_per_second, estimated, at);
        }
        // The interceptor is the one `CallOpened` named: the actor sends
        // that before any progress, on the same mailbox.
        let mut seen_by = SeenBy::default();
        if let Some(call) = self.active.get_mut(&msg.seq) {
            call.identity = msg.identity.clone();
            call.speed = Some(msg.speed.clone());
            seen_by = call.details.seen_by;
        }
        self.broadcast(EngineEvent::Speed {
            call: msg.identity,
            speed: msg.speed,
            seen_by,
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
    fn handle(&mut self, mut msg: CallClosed, _: &mut Self::Context) {
        if let (Some(ratio), Some(model)) = (msg.calibration_ratio, &msg.call.identity.model) {
            if let Ok(mut table) = self.calibration.write() {
                table.observe(&msg.call.identity.route, model, ratio);
                if let Some(store) = &self.store {
                    store.save_calibration(table.clone());
                }
            }
        }
        if let Some(speed) = msg.call.speed.clone() {
            // The hour's high and low take settled rates only, and a
            // relay's leg only once (its client's call has the rate).
            let leg = msg.call.details.relay.is_some();
            if let (CallStatus::Ok, Some(rate), false) =
                (msg.call.status, speed.output_tokens_per_second, leg)
            {
                self.global.record_settled(rate, Instant::now());
            }
            self.broadcast(EngineEvent::Speed {
                call: msg.call.identity.clone(),
                speed,
                seen_by: msg.call.details.seen_by,
            });
        }
        if msg.call.details.relay.is_some() {
            let active = &self.active;
            self.legs
                .leg_settled(msg.seq, msg.call.clone(), |s| active.contains_key(&s));
        } else {
            self.legs.complete(msg.seq, &mut msg.call);
        }
        self.finish_call(msg.seq, msg.call);
    }
}

impl Handler<LegFound> for Supervisor {
    type Result = ();
    fn handle(&mut self, msg: LegFound, _: &mut Self::Context) {
        self.global.remove(msg.seq);
        if let Some(call) = self.active.get_mut(&msg.seq) {
            call.details.relay = Some(msg.relay.clone());
        }
        self.legs.found(msg.seq, &msg.relay, self.active.iter());
    }
}

impl Handler<CallDiscarded> for Supervisor {
    type Result = ();
    fn handle(&mut self, msg: CallDiscarded, _: &mut Self::Context) {
        self.active.remove(&msg.seq);
        self.global.remove(msg.seq);
    }
}

impl Handler<PassedThrough> for Supervisor {
    type Result = ();
    fn handle(&mut self, msg: PassedThrough, _: &mut Self::Context) {
        self.finish_call(msg.seq, msg.call);
    }
}

impl Handler<AttachStore> for Supervisor {
    type Result = ();
    fn handle(&mut self, msg: AttachStore, _: &mut Self::Context) {
        self.store = Some(msg.0);
    }
}

impl Handler<SeedHour> for Supervisor {
    type Result = ();
    /// Stored rates go in as if settled at their own time (an `Instant`
    /// as far back as their wall-clock age), so they roll out of the hour
    /// when they would have; each is also a chart point, ahead of the
    /// readings made since start.
    fn handle(&mut self, msg: SeedHour, _: &mut Self::Context) {
        let (now, now_ms) = (Instant::now(), unix_ms(SystemTime::now()));
        let horizon = now_ms.saturating_sub(CHART_WINDOW.as_millis() as u64);
        let mut seeded = VecDeque::new();
        for (t, tps) in msg.0.into_iter().filter(|(t, _)| *t >= horizon) {
            let age = Duration::from_millis(now_ms.saturating_sub(t));
            if let Some(at) = now.checked_sub(age) {
                self.global.record_settled(tps, at);
            }
            seeded.push_back(HistoryPoint { t, tps });
        }
        seeded.extend(self.chart.drain(..));
        self.chart = seeded;
        self.last_stats = self.global.peek(now);
    }
}

impl Handler<DetachStore> for Supervisor {
    type Result = Option<Arc<StoreWriter>>;
    fn handle(&mut self, _: DetachStore, _: &mut Self::Context) -> Self::Result {
        self.store.take()
    }
}

impl Handler<Persisted> for Supervisor {
    type Result = ();
    fn handle(&mut self, msg: Persisted, _: &mut Self::Context) {
        for id in msg.ids {
            if let Some((seq, call)) = self.pending.remove(&id) {
                self.settle(seq, call);
            }
        }
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
            .all_calls_newest_first(q.unmetered)
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
        self.all_calls_newest_first(true)
            .find(|c| c.identity.id == msg.0)
            .cloned()
    }
}

impl Handler<GetStats> for Supervisor {
    type Result = MessageResult<GetStats>;
    fn handle(&mut self, _: GetStats, _: &mut Self::Context) -> Self::Result {
        MessageResult(self.stats())
    }
}

impl Handler<GetHistory> for Supervisor {
    type Result = MessageResult<GetHistory>;
    fn handle(&mut self, _: GetHistory, _: &mut Self::Context) -> Self::Result {
        MessageResult(HistoryDoc {
            points: self.chart.iter().copied().collect(),
        })
    }
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
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

#[cfg(test)]
pub(crate) mod tests {
    //! Supervisor tests under a paused clock, plus the helpers the notifier
    //! and call actor tests share (`run_paused`, `advance`, `flush`).

    use std::future::Future;

    use actix::{Addr, System};
    use tokio::sync::mpsc::error::TryRecvError;

    use super::*;
    use crate::model::ApiKind;
    use crate::model::CallsQuery;
    use crate::model::{CallIdentity, CallStatus, SlowFirstToken};
    use crate::model::{Phase, Snapshot};

    /// The clock moves in steps this small, so a timer fires within one
    /// step of its deadline and arrival times are known to the step.
    pub(crate) const STEP: Duration = Duration::from_millis(10);

    /// Runs `f` as an actix system on a current-thread runtime whose clock
    /// starts paused. Starting paused (rather than `pause()` inside
    /// `#[actix::test]`) puts the timer wheel's origin on the test's first
    /// instant, so every instant is a whole number of milliseconds past it
    /// and a timer fires exactly at its deadline, not up to 1 ms later.
    pub(crate) fn run_paused<F: Future>(f: F) -> F::Output {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .expect("test runtime");
        System::with_tokio_rt(move || rt).block_on(f)
    }

    /// Lets every actor that is ready run, including chains of messages
    /// (actor to actor to channel), without moving the clock.
    pub(crate) async fn flush() {
        for _ in 0..16 {
            tokio::task::yield_now().await;
        }
    }

    /// Moves the paused clock forward by `by` in [`STEP`]s, letting the
    /// actors react after each step. Whatever was sent before is handled
    /// first, at the current instant (actors started or messages sent with
    /// `do_send` just before are not a step late).
    pub(crate) async fn advance(by: Duration) {
        flush().await;
        let mut left = by;
        while !left.is_zero() {
            let step = left.min(STEP);
            tokio::time::advance(step).await;
            flush().await;
            left -= step;
        }
    }

    /// Moves the paused clock forward to `t0 + at_ms` (never back).
    pub(crate) async fn advance_to(t0: Instant, at_ms: u64) {
        let target = t0 + Duration::from_millis(at_ms);
        advance(target.saturating_duration_since(Instant::now())).await;
    }

    /// Virtual milliseconds since `t0`.
    pub(crate) fn ms_since(t0: Instant) -> u64 {
        Instant::now().duration_since(t0).as_millis() as u64
    }

    pub(crate) fn identity(seq: u64, route: &str) -> CallIdentity {
        CallIdentity {
            id: format!("c-{seq:06}"),
            route: route.into(),
            api: ApiKind::OpenaiChat,
            model: Some("m".into()),
            started_at: String::new(),
            demo: false,
        }
    }

    fn speed(output_tokens: u64) -> Snapshot {
        Snapshot {
            stalled_ms: None,
            phase: Phase::Responding,
            is_final: false,
            elapsed_ms: 0,
            time_to_first_token_ms: Some(100),
            output_tokens,
            output_tokens_per_second: None,
            token_source: TokenSource::Estimated,
            wait: None,
        }
    }

    fn call(seq: u64, route: &str, status: CallStatus) -> Call {
        Call {
            identity: identity(seq, route),
            status,
            http_status: Some(200),
            speed: Some(speed(0)),
            input_tokens: None,
            details: Default::default(),
        }
    }

    fn start() -> Addr<Supervisor> {
        Supervisor::new(Arc::default(), Arc::new(Metrics::new())).start()
    }

    async fn subscribe(sup: &Addr<Supervisor>, capacity: usize) -> mpsc::Receiver<EngineEvent> {
        sup.send(Subscribe { capacity }).await.expect("supervisor")
    }

    /// Steps the clock until `t0 + until_ms`, returning the virtual time
    /// (ms since `t0`) of every `Stats` that arrived, and whether it had a
    /// `tps`. Other events are skipped.
    async fn stats_until(
        rx: &mut mpsc::Receiver<EngineEvent>,
        t0: Instant,
        until_ms: u64,
    ) -> Vec<(u64, bool)> {
        let mut seen = Vec::new();
        while ms_since(t0) < until_ms {
            advance(STEP).await;
            while let Ok(event) = rx.try_recv() {
                if let EngineEvent::Stats(s) = event {
                    seen.push((ms_since(t0), s.tps_available));
                }
            }
        }
        seen
    }

    fn times(stats: &[(u64, bool)]) -> Vec<u64> {
        stats.iter().map(|(t, _)| *t).collect()
    }

    /// A call starts streaming now: opened, then its first output. Awaited,
    /// so the supervisor handles it at this very instant.
    async fn open_with_output(sup: &Addr<Supervisor>, seq: u64, tokens: u64) {
        sup.send(CallOpened {
            seq,
            call: call(seq, "a", CallStatus::InFlight),
        })
        .await
        .expect("supervisor");
        progress(sup, seq, tokens).await;
    }

    /// The call's output reached `tokens`, now, at its own live rate of
    /// 10 tok/s.
    async fn progress(sup: &Addr<Supervisor>, seq: u64, tokens: u64) {
        sup.send(CallProgress {
            seq,
            identity: identity(seq, "a"),
            speed: Snapshot {
                stalled_ms: None,
                output_tokens_per_second: Some(10.0),
                ..speed(tokens)
            },
            last_output_at: Some(Instant::now()),
        })
        .await
        .expect("supervisor");
    }

    fn ids(calls: &[Call]) -> Vec<&str> {
        calls.iter().map(|c| c.identity.id.as_str()).collect()
    }

    async fn calls(sup: &Addr<Supervisor>, limit: usize, route: Option<&str>) -> Vec<Call> {
        sup.send(GetCalls(CallsQuery {
            limit,
            route: route.map(str::to_owned),
            unmetered: true,
        }))
        .await
        .expect("supervisor")
    }

    #[test]
    fn idle_stats_every_10_s_and_traffic_brings_the_first_reading_within_1_s() {
        run_paused(async {
            let t0 = Instant::now();
            let sup = start();
            let mut rx = subscribe(&sup, 64).await;
            // A new subscriber starts from the current reading.
            assert!(matches!(rx.try_recv(), Ok(EngineEvent::Stats(_))));

            let idle = stats_until(&mut rx, t0, 35_000).await;
            assert_eq!(
                idle,
                vec![(10_000, false), (20_000, false), (30_000, false)]
            );

            // Traffic at 35 s: the idle tick was due at 40 s; the first
            // reading comes 1 s after the first output instead.
            open_with_output(&sup, 1, 5).await;
            let burst = stats_until(&mut rx, t0, 38_500).await;
            assert_eq!(times(&burst), vec![36_000, 37_000, 38_000]);
        });
    }

    #[test]
    fn a_call_waiting_for_its_first_token_keeps_the_1_hz_cadence() {
        run_paused(async {
            let t0 = Instant::now();
            let sup = start();
            let mut rx = subscribe(&sup, 64).await;
            let _ = rx.try_recv();
            advance_to(t0, 12_000).await;
            // Drop the idle reading of 10 s.
            while rx.try_recv().is_ok() {}
            // Opened, no token yet (a slow prefill): the tray's "waiting
            // N s" must move every second, not every 10 s.
            sup.send(CallOpened {
                seq: 1,
                call: call(1, "a", CallStatus::InFlight),
            })
            .await
            .expect("supervisor");
            let waiting = stats_until(&mut rx, t0, 16_500).await;
            assert_eq!(times(&waiting), vec![13_000, 14_000, 15_000, 16_000]);
            assert!(waiting.iter().all(|(_, tps)| !tps), "no rate while waiting");
        });
    }

    #[test]
    fn active_stats_every_second_until_a_minute_after_the_last_token_then_10_s() {
        run_paused(async {
            let t0 = Instant::now();
            let sup = start();
            let mut rx = subscribe(&sup, 256).await;
            let _ = rx.try_recv();

            advance_to(t0, 5_000).await;
            open_with_output(&sup, 1, 5).await;
            // Tokens every 500 ms until 15 s, then the call ends.
            let mut seen = Vec::new();
            for k in 1..=20u64 {
                seen.extend(stats_until(&mut rx, t0, 5_000 + k * 500).await);
                progress(&sup, 1, 5 + 5 * k).await;
            }
            let last_token_ms = ms_since(t0);
            assert_eq!(last_token_ms, 15_000);
            seen.extend(stats_until(&mut rx, t0, 15_500).await);
            let mut closed = call(1, "a", CallStatus::Ok);
            closed.speed = Some(speed(105));
            sup.send(CallClosed {
                seq: 1,
                call: closed,
                calibration_ratio: None,
            })
            .await
            .unwrap();
            seen.extend(stats_until(&mut rx, t0, 100_500).await);

            // 1 Hz from the first second of traffic while a stream is
            // active: every reading then has a rate.
            let active: Vec<_> = seen.iter().filter(|(t, _)| *t <= 15_000).collect();
            assert_eq!(
                active.iter().map(|(t, _)| *t).collect::<Vec<_>>(),
                (6..=15).map(|s| s * 1_000).collect::<Vec<_>>()
            );
            assert!(active.iter().all(|(_, tps)| *tps), "{active:?}");
            // After the call ended: still 1 Hz (without a rate) while the
            // last token is under a minute old (up to 74 s); the reading at
            // 75 s finds it a minute old and backs off to 10 s.
            let mut expected: Vec<u64> = (16..=75).map(|s| s * 1_000).collect();
            expected.extend([85_000, 95_000]);
            let after: Vec<_> = seen.iter().filter(|(t, _)| *t > 15_000).collect();
            assert_eq!(after.iter().map(|(t, _)| *t).collect::<Vec<_>>(), expected);
            assert!(after.iter().all(|(_, tps)| !tps), "{after:?}");
        });
    }

    #[test]
    fn a_subscriber_that_is_full_is_dropped_and_the_others_keep_receiving() {
        run_paused(async {
            let sup = start();
            // Capacity 1, already holding the initial reading, never read.
            let mut slow = subscribe(&sup, 1).await;
            let mut kept_up = subscribe(&sup, 1).await;
            let mut roomy = subscribe(&sup, 64).await;
            assert!(matches!(kept_up.try_recv(), Ok(EngineEvent::Stats(_))));
            assert!(matches!(roomy.try_recv(), Ok(EngineEvent::Stats(_))));

            let alarm = |route: &str| {
                EngineEvent::SlowFirstToken(SlowFirstToken {
                    call: identity(1, route),
                    waited_ms: 5_000,
                    threshold_ms: 5_000,
                    reason: None,
                    usual_ms: None,
                })
            };
            for route in ["x", "y"] {
                sup.send(Broadcast(alarm(route))).await.unwrap();
                assert_eq!(kept_up.try_recv(), Ok(alarm(route)));
                assert_eq!(roomy.try_recv(), Ok(alarm(route)));
            }
            // The slow one kept what it had, then its channel ends: the
            // supervisor let go of its sender.
            assert!(matches!(slow.try_recv(), Ok(EngineEvent::Stats(_))));
            assert_eq!(slow.try_recv(), Err(TryRecvError::Disconnected));
            // The others are still subscribed (empty, not closed).
            assert_eq!(kept_up.try_recv(), Err(TryRecvError::Empty));
            assert_eq!(roomy.try_recv(), Err(TryRecvError::Empty));
            // The drop is shown, not just counted.
            assert_eq!(sup.send(GetStats).await.unwrap().dropped_subscribers, 1);
        });
    }

    #[test]
    fn a_reader_that_went_away_is_let_go_without_being_counted_as_dropped() {
        run_paused(async {
            let sup = start();
            let gone = subscribe(&sup, 64).await;
            let mut kept = subscribe(&sup, 64).await;
            drop(gone);
            let alarm = EngineEvent::SlowFirstToken(SlowFirstToken {
                call: identity(1, "x"),
                waited_ms: 5_000,
                threshold_ms: 5_000,
                reason: None,
                usual_ms: None,
            });
            sup.send(Broadcast(alarm.clone())).await.unwrap();
            assert!(matches!(kept.try_recv(), Ok(EngineEvent::Stats(_))));
            assert_eq!(kept.try_recv(), Ok(alarm));
            assert_eq!(sup.send(GetStats).await.unwrap().dropped_subscribers, 0);
        });
    }

    #[test]
    fn calls_come_newest_first_merging_in_flight_and_recent_with_route_and_limit() {
        run_paused(async {
            let sup = start();
            for seq in 1..=6 {
                let route = if seq % 2 == 1 { "a" } else { "b" };
                sup.do_send(CallOpened {
                    seq,
                    call: call(seq, route, CallStatus::InFlight),
                });
            }
            // Settled out of dispatch order, as concurrent calls do: a
            // later, shorter call finishes before an earlier one.
            for (seq, route) in [(2, "b"), (1, "a"), (4, "b")] {
                sup.do_send(CallClosed {
                    seq,
                    call: call(seq, route, CallStatus::Ok),
                    calibration_ratio: None,
                });
            }

            let all = calls(&sup, 100, None).await;
            assert_eq!(
                ids(&all),
                ["c-000006", "c-000005", "c-000004", "c-000003", "c-000002", "c-000001"]
            );
            let statuses: Vec<_> = all.iter().map(|c| c.status).collect();
            use CallStatus::{InFlight, Ok};
            assert_eq!(statuses, [InFlight, InFlight, Ok, InFlight, Ok, Ok]);

            assert_eq!(
                ids(&calls(&sup, 100, Some("a")).await),
                ["c-000005", "c-000003", "c-000001"]
            );
            assert_eq!(ids(&calls(&sup, 2, None).await), ["c-000006", "c-000005"]);
            assert_eq!(
                ids(&calls(&sup, 2, Some("b")).await),
                ["c-000006", "c-000004"]
            );
            assert!(calls(&sup, 100, Some("nope")).await.is_empty());
            assert!(calls(&sup, 0, None).await.is_empty());

            let one = sup.send(GetCall("c-000004".into())).await.unwrap();
            assert_eq!(one.map(|c| c.status), Some(CallStatus::Ok));
            let one = sup.send(GetCall("c-000003".into())).await.unwrap();
            assert_eq!(one.map(|c| c.status), Some(CallStatus::InFlight));
            assert_eq!(sup.send(GetCall("c-000007".into())).await.unwrap(), None);
        });
    }

    #[test]
    fn the_recent_ring_keeps_the_latest_recent_calls_settled() {
        run_paused(async {
            let sup = start();
            let total = RECENT_CALLS as u64 + 3;
            for seq in 1..=total {
                sup.do_send(PassedThrough {
                    seq,
                    call: call(seq, "a", CallStatus::Ok),
                });
            }
            let all = calls(&sup, usize::MAX, None).await;
            assert_eq!(all.len(), RECENT_CALLS);
            assert_eq!(all[0].identity.id, format!("c-{total:06}"));
            assert_eq!(all[RECENT_CALLS - 1].identity.id, "c-000004");
            assert_eq!(sup.send(GetCall("c-000003".into())).await.unwrap(), None);
            assert!(sup
                .send(GetCall("c-000004".into()))
                .await
                .unwrap()
                .is_some());
        });
    }

    /// 2,100 polls of a path no decoder knows, around one real call: the
    /// real call stays listed, the polls keep a ring of their own and are
    /// listed only when asked for.
    #[test]
    fn unmetered_calls_never_push_a_real_call_out_and_are_listed_on_request() {
        run_paused(async {
            let sup = start();
            let poll = |seq: u64| {
                let mut c = call(seq, "a", CallStatus::Unmetered);
                c.identity.api = ApiKind::Unknown;
                c.speed = None;
                PassedThrough { seq, call: c }
            };
            sup.do_send(poll(1));
            sup.do_send(CallClosed {
                seq: 2,
                call: call(2, "a", CallStatus::Ok),
                calibration_ratio: None,
            });
            for seq in 3..=2_102 {
                sup.do_send(poll(seq));
            }
            let query = |unmetered: bool| {
                GetCalls(CallsQuery {
                    limit: usize::MAX,
                    route: None,
                    unmetered,
                })
            };
            let real = sup.send(query(false)).await.unwrap();
            assert_eq!(ids(&real), ["c-000002"]);
            let all = sup.send(query(true)).await.unwrap();
            assert_eq!(all.len(), RECENT_UNMETERED + 1);
            assert_eq!(all[0].identity.id, "c-002102");
            assert!(all.iter().any(|c| c.identity.id == "c-000002"));
            // One call by id is found whichever ring holds it.
            let one = sup.send(GetCall("c-002102".into())).await.unwrap();
            assert_eq!(one.map(|c| c.status), Some(CallStatus::Unmetered));
        });
    }

    #[test]
    fn a_closed_call_with_a_ratio_calibrates_its_route_and_model_only() {
        run_paused(async {
            let sup = start();
            let closed = |seq: u64, route: &str, model: Option<&str>, ratio: Option<f64>| {
                let mut call = call(seq, route, CallStatus::Ok);
                call.identity.model = model.map(str::to_owned);
                CallClosed {
                    seq,
                    call,
                    calibration_ratio: ratio,
                }
            };
            sup.do_send(closed(1, "a", Some("m"), Some(1.25)));
            // No model named: nothing to key the factor on.
            sup.do_send(closed(2, "a", None, Some(1.5)));
            // No plausible ratio: nothing learned.
            sup.do_send(closed(3, "b", Some("m"), None));
            let table = sup.send(GetCalibration).await.unwrap();
            assert_eq!(table.len(), 1);
            assert_eq!(table.factor("a", "m"), 1.25);
            assert_eq!(table.factor("a", "other"), 1.0);
            assert_eq!(table.factor("b", "m"), 1.0);

            // A second observation moves it to the midpoint.
            sup.do_send(closed(4, "a", Some("m"), Some(0.75)));
            let table = sup.send(GetCalibration).await.unwrap();
            assert_eq!(table.factor("a", "m"), 1.0);
            assert_eq!(table.entries().next().map(|e| e.observations), Some(2));
        });
    }
}
