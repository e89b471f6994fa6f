//! The global meter: one reading over every active stream
//! (`docs/metering.md` "All calls: the global meter"), plus the aggregate
//! throughput and the hour's high and low.
//!
//! It computes no rate of its own. A stream's rate is the call's own live
//! rate, as the per-call meter published it under the one rule every rate
//! shown passes ([`super::rate::is_timed`]: at least 20 tokens over at
//! least 500 ms, so a single burst has none; the call actor drops it on a
//! capture gap). So the headline can never read above the calls it comes
//! from, and a burst or a gap moves nothing. The hour's high and low come
//! from settled per-call rates only ([`GlobalMeter::record_settled`]),
//! never from a live reading taken before the call's count was settled.
//!
//! The supervisor feeds it each call's live rate as snapshots are
//! published ([`GlobalMeter::observe`]), tells it when a call ends
//! ([`GlobalMeter::remove`]) and what the call settled at, and asks for a
//! reading at the publishing cadence ([`GlobalMeter::sample`],
//! [`GlobalMeter::publish_interval`]). Everything is pure: no clock is
//! read here, every time is passed in, so tests can walk a virtual hour
//! exactly.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use tokio::time::Instant;

use crate::model::snapshot::round_rate;
pub use crate::model::Stats;

/// A stream with no new token for this long leaves the active set (and so
/// stops pulling the mean down with a rate that no longer describes anything).
pub const STALE: Duration = Duration::from_secs(60);

/// How far back `high` and `low` look: the rolling window of settled rates.
pub const HISTORY: Duration = Duration::from_secs(60 * 60);

/// Settled rates below this many tokens/s don't count towards `high`/`low`:
/// a crawl would pin `low` near zero and make it meaningless.
pub const HIGH_LOW_FLOOR: f64 = 1.0;

/// The publishing cadence while any stream has had a token within [`STALE`].
pub const ACTIVE_CADENCE: Duration = Duration::from_secs(1);

/// The publishing cadence when idle: the publisher backs off, nothing moves.
pub const IDLE_CADENCE: Duration = Duration::from_secs(10);

/// What the meter knows about one stream.
#[derive(Clone, Copy, Debug)]
struct StreamState {
    /// The call's own live rate, as last published; `None` while the call
    /// has none (too few tokens, too short a span, one burst, a gap).
    rate: Option<f64>,
    /// Whether `rate` rests on an estimated count.
    estimated: bool,
    /// Time of the latest token.
    last_at: Instant,
}

impl StreamState {
    fn is_live(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.last_at) < STALE
    }
}

/// One entry of the high/low history: the settled rates of at most one
/// [`ACTIVE_CADENCE`] folded together, keeping their max and min, so the
/// history stays bounded however many calls settle and high/low stay
/// exact. A merged entry expires with its newest rate: an extreme can
/// linger up to one cadence past the hour, but never leaves early.
#[derive(Clone, Copy, Debug)]
struct Reading {
    first_at: Instant,
    last_at: Instant,
    high: f64,
    low: f64,
}

/// The all-streams meter. See the module docs.
#[derive(Debug, Default)]
pub struct GlobalMeter {
    streams: HashMap<u64, StreamState>,
    /// Settled rates >= [`HIGH_LOW_FLOOR`], oldest first.
    history: VecDeque<Reading>,
    /// The latest token of any stream, ended ones included, for the cadence.
    last_token_at: Option<Instant>,
}

impl GlobalMeter {
    /// An empty meter: no streams, no history, idle.
    pub fn new() -> Self {
        Self::default()
    }

    /// A stream's latest published snapshot: its own live `rate` (absent
    /// while the call has none), whether that rate rests on an
    /// `estimated` count, and `at`, the time of its latest token. Starts
    /// tracking the stream on its first report; the caller reports only
    /// streams that have had a token. Times only move forward, so a repeated
    /// report doesn't stretch a stalled stream's life.
    pub fn observe(&mut self, stream: u64, rate: Option<f64>, estimated: bool, at: Instant) {
        let s = self.streams.entry(stream).or_insert(StreamState {
            rate,
            estimated,
            last_at: at,
        });
        s.rate = rate.filter(|r| r.is_finite() && *r > 0.0);
        s.estimated = estimated;
        s.last_at = s.last_at.max(at);
        self.last_token_at = Some(self.last_token_at.map_or(at, |t| t.max(at)));
    }

    /// The stream ended: it leaves the active set (its last token still
    /// counts for the cadence, see [`publish_interval`](Self::publish_interval)).
    pub fn remove(&mut self, stream: u64) {
        self.streams.remove(&stream);
    }

    /// A call settled `ok` with its own final rate (already judged by the
    /// per-call rules: absent for a burst, a short span, few tokens or a
    /// capture gap): the only input of the hour's high and low.
    pub fn record_settled(&mut self, rate: f64, now: Instant) {
        if !rate.is_finite() || rate < HIGH_LOW_FLOOR {
            return;
        }
        self.prune_history(now);
        if let Some(last) = self.history.back_mut() {
            if now.saturating_duration_since(last.first_at) < ACTIVE_CADENCE {
                last.last_at = last.last_at.max(now);
                last.high = last.high.max(rate);
                last.low = last.low.min(rate);
                return;
            }
        }
        self.history.push_back(Reading {
            first_at: now,
            last_at: now,
            high: rate,
            low: rate,
        });
    }

    /// The reading at `now`. Drops streams with no token for [`STALE`]
    /// (exactly 60 s is stale) and settled rates older than [`HISTORY`]
    /// (exactly 60 min is gone). Rates are averaged and summed unrounded;
    /// only the published numbers are rounded to one decimal.
    pub fn sample(&mut self, now: Instant) -> Stats {
        self.streams.retain(|_, s| s.is_live(now));
        self.prune_history(now);
        self.peek(now)
    }

    /// The reading at `now` without dropping anything: for an API request
    /// between publishing ticks. High/low describe the last hour, not this
    /// moment: they stay published while nothing streams, until they age out.
    pub fn peek(&self, now: Instant) -> Stats {
        let mut stats = self.current(now);
        let live = self.history.iter().filter(|r| Self::in_window(r, now));
        let (mut high, mut low) = (None::<f64>, None::<f64>);
        for r in live {
            high = Some(high.map_or(r.high, |h| h.max(r.high)));
            low = Some(low.map_or(r.low, |l| l.min(r.low)));
        }
        stats.high = high;
        stats.low = low;
        stats
    }

    /// The publishing cadence: [`ACTIVE_CADENCE`] while any stream (ended
    /// ones included) has had a token within [`STALE`], else
    /// [`IDLE_CADENCE`]. Counting ended streams keeps the 1 Hz beat for a
    /// minute after a call finishes.
    pub fn publish_interval(&self, now: Instant) -> Duration {
        if self.is_active(now) {
            ACTIVE_CADENCE
        } else {
            IDLE_CADENCE
        }
    }

    /// Whether any stream has had a token within [`STALE`] of `now`.
    pub fn is_active(&self, now: Instant) -> bool {
        self.last_token_at
            .is_some_and(|t| now.saturating_duration_since(t) < STALE)
    }

    /// Number of entries in the high/low history (for bounds checks).
    pub fn history_len(&self) -> usize {
        self.history.len()
    }

    /// The live part of a reading at `now`, without high/low.
    fn current(&self, now: Instant) -> Stats {
        let mut sum = 0.0;
        let mut n = 0usize;
        let mut estimated = false;
        let mut active = 0usize;
        for s in self.streams.values().filter(|s| s.is_live(now)) {
            active += 1;
            if let Some(rate) = s.rate {
                sum += rate;
                n += 1;
                estimated |= s.estimated;
            }
        }
        let (tps, aggregate_tps) = if n == 0 {
            (None, None)
        } else {
            (Some(round_rate(sum / n as f64)), Some(round_rate(sum)))
        };
        Stats {
            tps,
            tps_available: tps.is_some(),
            estimated,
            high: None,
            low: None,
            active,
            aggregate_tps,
            dropped_subscribers: 0,
            capture_dropped_packets: 0,
        }
    }

    fn in_window(r: &Reading, now: Instant) -> bool {
        now.saturating_duration_since(r.last_at) < HISTORY
    }

    fn prune_history(&mut self, now: Instant) {
        while self
            .history
            .front()
            .is_some_and(|r| !Self::in_window(r, now))
        {
            self.history.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn the_reading_is_the_mean_of_the_calls_own_rates_and_the_aggregate_their_sum() {
        let t0 = Instant::now();
        let mut m = GlobalMeter::new();
        m.observe(1, Some(33.3), false, t0 + secs(4));
        m.observe(2, Some(25.0), false, t0 + secs(4));
        let s = m.sample(t0 + secs(5));
        assert_eq!(s.tps, Some(29.2)); // (33.3 + 25) / 2 = 29.15
        assert_eq!(s.aggregate_tps, Some(58.3));
        assert!(s.tps_available);
        assert!(!s.estimated);
        assert_eq!(s.active, 2);
        // Live readings never make the hour's high or low.
        assert_eq!((s.high, s.low), (None, None));
    }

    #[test]
    fn no_reading_is_above_the_fastest_calls_own_rate() {
        // The issue's headline of 43.6 beside two rows at 40.0: the
        // reading is made of the rows' own rates, so it can't be.
        let t0 = Instant::now();
        let mut m = GlobalMeter::new();
        m.observe(1, Some(40.0), false, t0);
        m.observe(2, Some(40.0), false, t0);
        assert_eq!(m.sample(t0 + ms(300)).tps, Some(40.0));
    }

    #[test]
    fn a_stream_without_a_rate_is_active_but_moves_no_figure() {
        // A burst: the call has tokens but no honest rate.
        let t0 = Instant::now();
        let mut m = GlobalMeter::new();
        m.observe(1, None, true, t0);
        m.observe(1, None, true, t0 + ms(30));
        let s = m.sample(t0 + secs(3));
        assert_eq!((s.tps, s.aggregate_tps, s.high), (None, None, None));
        assert!(!s.tps_available);
        assert!(!s.estimated, "nothing is claimed without a number");
        assert_eq!(s.active, 1);
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(
            json,
            r#"{"tps_available":false,"estimated":false,"active":1,"dropped_subscribers":0,"capture_dropped_packets":0}"#
        );
        // Beside a stream with a rate, it doesn't pull the mean down.
        m.observe(2, Some(40.0), false, t0 + secs(3));
        assert_eq!(m.sample(t0 + secs(3)).tps, Some(40.0));
    }

    #[test]
    fn a_rate_the_call_withdrew_leaves_the_reading() {
        let t0 = Instant::now();
        let mut m = GlobalMeter::new();
        m.observe(1, Some(40.0), false, t0);
        m.observe(1, None, false, t0 + secs(1));
        assert_eq!(m.sample(t0 + secs(1)).tps, None);
    }

    #[test]
    fn stale_stream_dropped_at_exactly_sixty_seconds() {
        let t0 = Instant::now();
        let mut m = GlobalMeter::new();
        m.observe(1, Some(20.0), false, t0);
        let kept = m.sample(t0 + ms(59_900));
        assert_eq!((kept.active, kept.tps), (1, Some(20.0)));
        let dropped = m.sample(t0 + secs(60));
        assert_eq!((dropped.active, dropped.tps), (0, None));
        assert!(!dropped.tps_available);
    }

    #[test]
    fn repeated_report_without_new_tokens_does_not_keep_a_stream_alive() {
        let t0 = Instant::now();
        let mut m = GlobalMeter::new();
        m.observe(1, Some(10.0), false, t0 + secs(2));
        // Reported again later, with the same latest token time.
        m.observe(1, Some(10.0), false, t0 + secs(2));
        assert_eq!(m.sample(t0 + secs(62)).active, 0);
    }

    #[test]
    fn removed_stream_leaves_the_active_set() {
        let t0 = Instant::now();
        let mut m = GlobalMeter::new();
        m.observe(1, Some(10.0), false, t0);
        m.observe(2, Some(30.0), false, t0);
        m.remove(1);
        let s = m.sample(t0 + secs(2));
        assert_eq!(
            (s.active, s.tps, s.aggregate_tps),
            (1, Some(30.0), Some(30.0))
        );
    }

    #[test]
    fn the_hours_high_and_low_come_from_settled_rates_only() {
        let t0 = Instant::now();
        let mut m = GlobalMeter::new();
        // A live first reading above the call's settled rate moves nothing.
        m.observe(1, Some(43.7), true, t0);
        assert_eq!(m.sample(t0 + secs(1)).high, None);
        m.remove(1);
        m.record_settled(40.0, t0 + secs(3));
        let s = m.sample(t0 + secs(3));
        assert_eq!((s.high, s.low), (Some(40.0), Some(40.0)));
        m.record_settled(15.0, t0 + secs(10));
        let s = m.peek(t0 + secs(10));
        assert_eq!((s.high, s.low), (Some(40.0), Some(15.0)));
    }

    #[test]
    fn settled_rates_roll_out_of_the_hour() {
        let t0 = Instant::now();
        let mut m = GlobalMeter::new();
        m.record_settled(50.0, t0);
        m.record_settled(20.0, t0 + secs(30 * 60));
        let s = m.sample(t0 + secs(60 * 60) - ms(1));
        assert_eq!((s.high, s.low), (Some(50.0), Some(20.0)));
        // Exactly an hour after the 50: gone.
        let s = m.sample(t0 + secs(60 * 60));
        assert_eq!((s.high, s.low), (Some(20.0), Some(20.0)));
        let s = m.sample(t0 + secs(90 * 60));
        assert_eq!((s.high, s.low), (None, None));
        assert_eq!(m.history_len(), 0);
    }

    #[test]
    fn settled_rates_below_the_floor_or_not_numbers_are_ignored() {
        let t0 = Instant::now();
        let mut m = GlobalMeter::new();
        m.record_settled(0.9, t0);
        m.record_settled(f64::NAN, t0);
        assert_eq!(m.sample(t0).high, None);
        m.record_settled(1.0, t0);
        assert_eq!(m.sample(t0).low, Some(1.0));
    }

    #[test]
    fn many_settled_calls_keep_the_history_bounded_and_high_low_exact() {
        let t0 = Instant::now();
        let mut m = GlobalMeter::new();
        let (mut max, mut min) = (f64::MIN, f64::MAX);
        // Ten calls settling a second for two minutes.
        for i in 1..=1200u64 {
            let rate = 10.0 + ((i * 7) % 37) as f64;
            m.record_settled(rate, t0 + ms(100 * i));
            max = max.max(rate);
            min = min.min(rate);
            let s = m.peek(t0 + ms(100 * i));
            assert_eq!((s.high, s.low), (Some(max), Some(min)), "call {i}");
        }
        assert!(m.history_len() <= 121, "{}", m.history_len());
    }

    #[test]
    fn cadence_switches_at_the_sixty_second_boundary() {
        let t0 = Instant::now();
        let mut m = GlobalMeter::new();
        assert_eq!(m.publish_interval(t0), IDLE_CADENCE);
        assert!(!m.is_active(t0));
        m.observe(1, None, true, t0);
        assert_eq!(m.publish_interval(t0), ACTIVE_CADENCE);
        assert_eq!(m.publish_interval(t0 + ms(59_900)), ACTIVE_CADENCE);
        assert_eq!(m.publish_interval(t0 + secs(60)), IDLE_CADENCE);
        // A new token brings the fast beat back.
        m.observe(1, None, true, t0 + secs(70));
        assert_eq!(m.publish_interval(t0 + secs(70)), ACTIVE_CADENCE);
        assert!(m.is_active(t0 + secs(129)));
        assert!(!m.is_active(t0 + secs(130)));
    }

    #[test]
    fn cadence_stays_fast_for_a_minute_after_a_stream_ends() {
        let t0 = Instant::now();
        let mut m = GlobalMeter::new();
        m.observe(1, Some(10.0), false, t0 + secs(2));
        m.remove(1);
        assert_eq!(m.publish_interval(t0 + secs(30)), ACTIVE_CADENCE);
        let s = m.sample(t0 + secs(30));
        assert_eq!((s.tps, s.active), (None, 0));
        assert_eq!(m.publish_interval(t0 + secs(62)), IDLE_CADENCE);
    }

    #[test]
    fn estimated_when_any_contributing_stream_is_estimated() {
        let t0 = Instant::now();
        let mut m = GlobalMeter::new();
        m.observe(1, Some(10.0), false, t0);
        // An estimated stream with no rate doesn't contribute.
        m.observe(2, None, true, t0);
        assert!(!m.sample(t0).estimated);
        m.observe(2, Some(20.0), true, t0 + secs(2));
        let s = m.sample(t0 + secs(2));
        assert!(s.estimated);
        assert_eq!(s.tps, Some(15.0));
        // The server's own count: exact again.
        m.observe(2, Some(20.0), false, t0 + secs(2));
        assert!(!m.sample(t0 + secs(2)).estimated);
    }

    #[test]
    fn serde_matches_the_contract_example() {
        let s = Stats {
            tps: Some(47.3),
            tps_available: true,
            estimated: false,
            high: Some(52.1),
            low: Some(31.4),
            active: 1,
            aggregate_tps: Some(47.3),
            dropped_subscribers: 0,
            capture_dropped_packets: 0,
        };
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(
            json,
            r#"{"tps":47.3,"tps_available":true,"estimated":false,"high":52.1,"low":31.4,"active":1,"aggregate_tps":47.3,"dropped_subscribers":0,"capture_dropped_packets":0}"#
        );
        let back: Stats = serde_json::from_str(&json).unwrap();
        assert_eq!(back, s);
    }

    #[test]
    fn serde_skips_absent_fields_and_reads_them_back_as_absent() {
        let s = Stats {
            tps: None,
            tps_available: false,
            estimated: false,
            high: Some(12.5),
            low: None,
            active: 0,
            aggregate_tps: None,
            dropped_subscribers: 0,
            capture_dropped_packets: 0,
        };
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(
            json,
            r#"{"tps_available":false,"estimated":false,"high":12.5,"active":0,"dropped_subscribers":0,"capture_dropped_packets":0}"#
        );
        let back: Stats = serde_json::from_str(&json).unwrap();
        assert_eq!(back, s);
    }
}
