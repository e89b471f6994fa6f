//! The global meter: one reading over every active stream
//! (`docs/metering.md` "All calls: the global meter"), plus the aggregate throughput speedtap adds
//! (exact numbers where a server gives them).
//!
//! The supervisor feeds it each call's running token total as snapshots are
//! published ([`GlobalMeter::observe`]), tells it when a call ends
//! ([`GlobalMeter::remove`]) and asks for a reading at the publishing cadence
//! ([`GlobalMeter::sample`], [`GlobalMeter::publish_interval`]). Everything is
//! pure: no clock is read here, every time is passed in, so tests can walk a
//! virtual hour exactly.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use tokio::time::Instant;

use crate::model::snapshot::round_rate;
pub use crate::model::Stats;

/// A stream with no new token for this long leaves the active set (and so
/// stops pulling the mean down with a rate that no longer describes anything).
pub const STALE: Duration = Duration::from_secs(60);

/// How far back `high` and `low` look: the rolling window of readings.
pub const HISTORY: Duration = Duration::from_secs(60 * 60);

/// Readings below this many tokens/s don't count towards `high`/`low`: a
/// stream that barely started (or a stalled one) would otherwise pin `low`
/// near zero and make it meaningless.
pub const HIGH_LOW_FLOOR: f64 = 1.0;

/// The publishing cadence while any stream has had a token within [`STALE`].
pub const ACTIVE_CADENCE: Duration = Duration::from_secs(1);

/// The publishing cadence when idle: the publisher backs off, nothing moves.
pub const IDLE_CADENCE: Duration = Duration::from_secs(10);

/// What the meter knows about one stream.
#[derive(Clone, Copy, Debug)]
struct StreamState {
    /// Output + reasoning tokens so far, as last reported.
    tokens: u64,
    /// Whether `tokens` is an estimate (not a settled count).
    estimated: bool,
    /// Time of the first observed token.
    first_at: Instant,
    /// Time of the latest token.
    last_at: Instant,
}

impl StreamState {
    /// The reference rule, to the letter: (output + reasoning tokens) /
    /// (last token time - first token time). Note that `tokens` is the whole
    /// running total, including the tokens already counted at the first
    /// observed time; the reference divides the total by the span, and so do
    /// we, so readings match the chat UI this mirrors. (Counting only the
    /// tokens after the first observation would read lower on short streams.)
    /// No rate until two distinct times exist, and a zero rate is no rate.
    fn rate(&self) -> Option<f64> {
        let span = self.last_at.saturating_duration_since(self.first_at);
        if span.is_zero() || self.tokens == 0 {
            return None;
        }
        Some(self.tokens as f64 / span.as_secs_f64())
    }

    fn is_live(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.last_at) < STALE
    }
}

/// One entry of the high/low history: the readings of at most one
/// [`ACTIVE_CADENCE`] folded together.
///
/// At the 1 Hz cadence every entry holds exactly one reading. If something
/// samples faster (say, an API request calling [`GlobalMeter::sample`]
/// between ticks), readings within one cadence of an entry's first reading
/// are merged into it, keeping their max and min, so the history stays
/// bounded at about `HISTORY / ACTIVE_CADENCE` entries and high/low stay
/// exact. A merged entry expires with its newest reading: an extreme can
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
    /// Readings >= [`HIGH_LOW_FLOOR`], oldest first. Readings below the
    /// floor are not stored: they could never become `high` or `low`.
    history: VecDeque<Reading>,
    /// The latest token of any stream, ended ones included, for the cadence.
    last_token_at: Option<Instant>,
}

impl GlobalMeter {
    /// An empty meter: no streams, no history, idle.
    pub fn new() -> Self {
        Self::default()
    }

    /// A stream's running totals: `tokens` = output + reasoning tokens so far,
    /// `estimated` = whether that count is an estimate, `at` = the time of the
    /// latest token. Starts tracking the stream on its first call.
    ///
    /// Choices where the reference is silent:
    /// - `tokens == 0` for an unknown stream is ignored: no token has arrived,
    ///   so there is no first token time to start from.
    /// - The latest count wins even if lower than before (a settled provider
    ///   count may undercut the estimate); times only move forward, and only
    ///   a report of more tokens counts as a new token time, so a repeated
    ///   report doesn't stretch the span or keep a stalled stream alive.
    /// - A report after [`remove`](Self::remove) starts a new stream; the
    ///   caller sends the final report before removing.
    pub fn observe(&mut self, stream: u64, tokens: u64, estimated: bool, at: Instant) {
        match self.streams.get_mut(&stream) {
            None => {
                if tokens == 0 {
                    return;
                }
                self.streams.insert(
                    stream,
                    StreamState {
                        tokens,
                        estimated,
                        first_at: at,
                        last_at: at,
                    },
                );
            }
            Some(s) => {
                let more = tokens > s.tokens;
                s.tokens = tokens;
                s.estimated = estimated;
                if !more {
                    return;
                }
                s.last_at = s.last_at.max(at);
            }
        }
        self.last_token_at = Some(self.last_token_at.map_or(at, |t| t.max(at)));
    }

    /// The stream ended: it leaves the active set (its last token still
    /// counts for the cadence, see [`publish_interval`](Self::publish_interval)).
    pub fn remove(&mut self, stream: u64) {
        self.streams.remove(&stream);
    }

    /// The reading at `now`, recorded into the history when it has a real
    /// `tps`. Call it once per publish; use [`peek`](Self::peek) for
    /// reading without recording.
    ///
    /// Drops streams with no token for [`STALE`] (exactly 60 s is stale) and
    /// history older than [`HISTORY`] (exactly 60 min is gone). `high`/`low`
    /// include this reading. Rates are averaged and summed unrounded; only
    /// the published numbers are rounded to one decimal, and the history
    /// stores what was published.
    pub fn sample(&mut self, now: Instant) -> Stats {
        self.streams.retain(|_, s| s.is_live(now));
        self.prune_history(now);
        let mut stats = self.current(now);
        if let Some(tps) = stats.tps {
            self.record(tps, now);
        }
        // High/low describe the last hour, not this moment: they stay
        // published while no stream has a rate, until they age out.
        stats.high = self.high();
        stats.low = self.low();
        stats
    }

    /// The reading at `now` without recording it or dropping anything: for
    /// an API request between publishing ticks.
    pub fn peek(&self, now: Instant) -> Stats {
        let mut stats = self.current(now);
        let live = self.history.iter().filter(|r| Self::in_window(r, now));
        let (mut high, mut low) = (None::<f64>, None::<f64>);
        for r in live {
            high = Some(high.map_or(r.high, |h| h.max(r.high)));
            low = Some(low.map_or(r.low, |l| l.min(r.low)));
        }
        if let Some(tps) = stats.tps.filter(|&t| t >= HIGH_LOW_FLOOR) {
            high = Some(high.map_or(tps, |h| h.max(tps)));
            low = Some(low.map_or(tps, |l| l.min(tps)));
        }
        stats.high = high;
        stats.low = low;
        stats
    }

    /// The publishing cadence: [`ACTIVE_CADENCE`] while any stream (ended
    /// ones included) has had a token within [`STALE`], else
    /// [`IDLE_CADENCE`]. Counting ended streams keeps the 1 Hz beat for a
    /// minute after a call finishes, as the reference says "any stream has
    /// had a token"; those samples have no `tps` and so are not recorded.
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
            if let Some(rate) = s.rate().filter(|&r| r > 0.0) {
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

    fn record(&mut self, tps: f64, now: Instant) {
        if tps < HIGH_LOW_FLOOR {
            return;
        }
        if let Some(last) = self.history.back_mut() {
            if now.saturating_duration_since(last.first_at) < ACTIVE_CADENCE {
                last.last_at = last.last_at.max(now);
                last.high = last.high.max(tps);
                last.low = last.low.min(tps);
                return;
            }
        }
        self.history.push_back(Reading {
            first_at: now,
            last_at: now,
            high: tps,
            low: tps,
        });
    }

    fn high(&self) -> Option<f64> {
        self.history.iter().map(|r| r.high).reduce(f64::max)
    }

    fn low(&self) -> Option<f64> {
        self.history.iter().map(|r| r.low).reduce(f64::min)
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

    /// One stream whose reference rate (total / span) is exactly `rate`:
    /// 1 token at `start`, `rate * end_s` tokens at `start + end_s` seconds.
    fn steady(m: &mut GlobalMeter, id: u64, start: Instant, rate: u64, end_s: u64) {
        m.observe(id, 1, false, start);
        m.observe(id, rate * end_s, false, start + secs(end_s));
    }

    #[test]
    fn mean_of_two_streams_and_aggregate_sum() {
        let t0 = Instant::now();
        let mut m = GlobalMeter::new();
        // A: 100 tokens over 3 s (t0+1 .. t0+4) = 33.333.. tok/s
        m.observe(1, 10, false, t0 + secs(1));
        m.observe(1, 100, false, t0 + secs(4));
        // B: 50 tokens over 2 s = 25 tok/s
        m.observe(2, 5, false, t0 + secs(2));
        m.observe(2, 50, false, t0 + secs(4));
        let s = m.sample(t0 + secs(5));
        assert_eq!(s.tps, Some(29.2)); // (33.333 + 25) / 2 = 29.1666
        assert_eq!(s.aggregate_tps, Some(58.3)); // 58.333
        assert!(s.tps_available);
        assert!(!s.estimated);
        assert_eq!(s.active, 2);
        assert_eq!((s.high, s.low), (Some(29.2), Some(29.2)));
    }

    #[test]
    fn rate_divides_the_whole_total_by_the_span() {
        // The reference to the letter: 40 tokens at t0+1 s, 60 at t0+3 s →
        // 60 / 2 s = 30, not (60 - 40) / 2 s = 10.
        let t0 = Instant::now();
        let mut m = GlobalMeter::new();
        m.observe(7, 40, false, t0 + secs(1));
        m.observe(7, 60, false, t0 + secs(3));
        assert_eq!(m.sample(t0 + secs(3)).tps, Some(30.0));
    }

    #[test]
    fn a_stream_with_one_time_has_no_rate() {
        let t0 = Instant::now();
        let mut m = GlobalMeter::new();
        m.observe(1, 12, true, t0);
        m.observe(1, 30, true, t0); // more tokens, same time: still one time
        let s = m.sample(t0 + ms(500));
        assert_eq!(s.tps, None);
        assert!(!s.tps_available);
        assert_eq!(s.aggregate_tps, None);
        assert!(!s.estimated, "nothing is claimed without a number");
        assert_eq!(s.active, 1);
        assert_eq!((s.high, s.low), (None, None));
        assert_eq!(m.history_len(), 0);
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(
            json,
            r#"{"tps_available":false,"estimated":false,"active":1,"dropped_subscribers":0,"capture_dropped_packets":0}"#
        );
    }

    #[test]
    fn streams_without_rate_do_not_pull_the_mean_down() {
        let t0 = Instant::now();
        let mut m = GlobalMeter::new();
        steady(&mut m, 1, t0, 40, 2); // 80 / 2 s = 40
        m.observe(2, 3, false, t0 + secs(2)); // one time only
        let s = m.sample(t0 + secs(2));
        assert_eq!(s.tps, Some(40.0));
        assert_eq!(s.aggregate_tps, Some(40.0));
        assert_eq!(s.active, 2);
    }

    #[test]
    fn zero_tokens_do_not_start_a_stream() {
        let t0 = Instant::now();
        let mut m = GlobalMeter::new();
        m.observe(1, 0, true, t0);
        assert_eq!(m.sample(t0).active, 0);
        assert!(!m.is_active(t0));
    }

    #[test]
    fn stale_stream_dropped_at_exactly_sixty_seconds() {
        let t0 = Instant::now();
        let mut m = GlobalMeter::new();
        steady(&mut m, 1, t0, 20, 2); // last token at t0 + 2 s; 40 / 2 s = 20
        let last = t0 + secs(2);

        let kept = m.sample(last + ms(59_900));
        assert_eq!(kept.active, 1);
        assert_eq!(kept.tps, Some(20.0));

        let dropped = m.sample(last + secs(60));
        assert_eq!(dropped.active, 0);
        assert_eq!(dropped.tps, None);
        assert!(!dropped.tps_available);
        // The earlier reading still stands in the hourly window.
        assert_eq!((dropped.high, dropped.low), (Some(20.0), Some(20.0)));
    }

    #[test]
    fn repeated_report_without_new_tokens_does_not_keep_a_stream_alive() {
        let t0 = Instant::now();
        let mut m = GlobalMeter::new();
        steady(&mut m, 1, t0, 10, 2);
        m.observe(1, 20, false, t0 + secs(30)); // same total, later time
        assert_eq!(m.sample(t0 + secs(62)).active, 0);
    }

    #[test]
    fn removed_stream_leaves_the_active_set() {
        let t0 = Instant::now();
        let mut m = GlobalMeter::new();
        steady(&mut m, 1, t0, 10, 2);
        steady(&mut m, 2, t0, 30, 2);
        m.remove(1);
        let s = m.sample(t0 + secs(2));
        assert_eq!(s.active, 1);
        assert_eq!(s.tps, Some(30.0));
        assert_eq!(s.aggregate_tps, Some(30.0));
    }

    #[test]
    fn high_low_roll_over_a_virtual_hour() {
        let t0 = Instant::now();
        let mut m = GlobalMeter::new();
        // Minute 0: a stream at 50 tok/s → reading 50.0.
        steady(&mut m, 1, t0, 50, 1);
        let s = m.sample(t0 + secs(1));
        assert_eq!((s.tps, s.high, s.low), (Some(50.0), Some(50.0), Some(50.0)));
        m.remove(1);

        // Minute 30: a stream at 20 tok/s → low 20, high still 50.
        let t30 = t0 + secs(30 * 60);
        steady(&mut m, 2, t30, 20, 1);
        let s = m.sample(t30 + secs(1));
        assert_eq!((s.high, s.low), (Some(50.0), Some(20.0)));
        m.remove(2);

        // Minute 59:59 after the first reading (taken at t0 + 1 s): still in.
        let t_edge = t0 + secs(1) + secs(60 * 60) - ms(1);
        steady(&mut m, 3, t_edge - secs(1), 30, 1);
        let s = m.sample(t_edge);
        assert_eq!((s.high, s.low), (Some(50.0), Some(20.0)));
        m.remove(3);

        // Exactly 60 min after the minute-0 reading: it is gone.
        let t60 = t0 + secs(1) + secs(60 * 60);
        steady(&mut m, 4, t60 - secs(1), 30, 1);
        let s = m.sample(t60);
        assert_eq!((s.high, s.low), (Some(30.0), Some(20.0)));
        m.remove(4);

        // 60 min after the minute-30 reading, idle: only the 30.0 readings
        // (merged, 1 ms apart) are left, and they age out 60 min after t60.
        let s = m.sample(t30 + secs(1) + secs(60 * 60));
        assert_eq!((s.high, s.low), (Some(30.0), Some(30.0)));
        let s = m.sample(t60 + secs(60 * 60));
        assert_eq!((s.high, s.low), (None, None));
        assert_eq!(m.history_len(), 0);
    }

    #[test]
    fn readings_below_the_floor_are_ignored_for_high_low() {
        let t0 = Instant::now();
        let mut m = GlobalMeter::new();
        // 9 tokens over 10 s = 0.9 tok/s: a real tps, but below the floor.
        m.observe(1, 1, false, t0);
        m.observe(1, 9, false, t0 + secs(10));
        let s = m.sample(t0 + secs(10));
        assert_eq!(s.tps, Some(0.9));
        assert!(s.tps_available);
        assert_eq!((s.high, s.low), (None, None));
        // 10 tokens over 10 s = 1.0: at the floor, counts.
        m.observe(1, 10, false, t0 + secs(10));
        let s = m.sample(t0 + secs(11));
        assert_eq!(s.tps, Some(1.0));
        assert_eq!((s.high, s.low), (Some(1.0), Some(1.0)));
    }

    #[test]
    fn cadence_switches_at_the_sixty_second_boundary() {
        let t0 = Instant::now();
        let mut m = GlobalMeter::new();
        assert_eq!(m.publish_interval(t0), IDLE_CADENCE);
        assert!(!m.is_active(t0));
        m.observe(1, 5, true, t0);
        assert_eq!(m.publish_interval(t0), ACTIVE_CADENCE);
        assert_eq!(m.publish_interval(t0 + ms(59_900)), ACTIVE_CADENCE);
        assert_eq!(m.publish_interval(t0 + secs(60)), IDLE_CADENCE);
        // A new token brings the fast beat back.
        m.observe(1, 6, true, t0 + secs(70));
        assert_eq!(m.publish_interval(t0 + secs(70)), ACTIVE_CADENCE);
        assert!(m.is_active(t0 + secs(129)));
        assert!(!m.is_active(t0 + secs(130)));
    }

    #[test]
    fn cadence_stays_fast_for_a_minute_after_a_stream_ends() {
        let t0 = Instant::now();
        let mut m = GlobalMeter::new();
        steady(&mut m, 1, t0, 10, 2);
        assert_eq!(m.sample(t0 + secs(2)).tps, Some(10.0));
        m.remove(1);
        assert_eq!(m.publish_interval(t0 + secs(30)), ACTIVE_CADENCE);
        let s = m.sample(t0 + secs(30));
        assert_eq!((s.tps, s.active), (None, 0));
        assert_eq!(m.history_len(), 1, "the idle sample added no reading");
        assert_eq!(m.publish_interval(t0 + secs(62)), IDLE_CADENCE);
    }

    #[test]
    fn estimated_when_any_contributing_stream_is_estimated() {
        let t0 = Instant::now();
        let mut m = GlobalMeter::new();
        steady(&mut m, 1, t0, 10, 2);
        // An estimated stream with no rate doesn't contribute.
        m.observe(2, 4, true, t0 + secs(2));
        assert!(!m.sample(t0 + secs(2)).estimated);
        // Once it has a rate, the number rests partly on an estimate.
        m.observe(2, 40, true, t0 + secs(4));
        let s = m.sample(t0 + secs(4));
        assert!(s.estimated);
        assert_eq!(s.tps, Some(15.0)); // (20/2 + 40/2) / 2
                                       // Settled: the count is exact again.
        m.observe(2, 40, false, t0 + secs(4));
        assert!(!m.sample(t0 + secs(4)).estimated);
    }

    #[test]
    fn faster_sampling_keeps_history_bounded_and_high_low_exact() {
        let t0 = Instant::now();
        let mut m = GlobalMeter::new();
        m.observe(1, 1, false, t0);
        // 10 samples a second for 2 minutes, the rate drifting each time.
        let mut max = f64::MIN;
        let mut min = f64::MAX;
        for i in 1..=1200u64 {
            let at = t0 + ms(100 * i);
            m.observe(1, 40 * i + (i * 7) % 37, false, at); // monotonic
            let s = m.sample(at);
            let tps = s.tps.unwrap();
            max = max.max(tps);
            min = min.min(tps);
            assert_eq!((s.high, s.low), (Some(max), Some(min)), "sample {i}");
        }
        assert!(m.history_len() <= 121, "{}", m.history_len());
    }

    #[test]
    fn history_stays_within_an_hour_of_one_hertz_samples() {
        let t0 = Instant::now();
        let mut m = GlobalMeter::new();
        m.observe(1, 1, false, t0);
        for i in 1..=7200u64 {
            let at = t0 + secs(i);
            m.observe(1, 5 * i, false, at);
            m.sample(at);
        }
        assert_eq!(m.history_len(), 3600);
    }

    #[test]
    fn peek_does_not_record() {
        let t0 = Instant::now();
        let mut m = GlobalMeter::new();
        steady(&mut m, 1, t0, 25, 2);
        let p = m.peek(t0 + secs(2));
        assert_eq!((p.tps, p.high, p.low), (Some(25.0), Some(25.0), Some(25.0)));
        assert_eq!(m.history_len(), 0);
        assert_eq!(m.sample(t0 + secs(2)), p);
        assert_eq!(m.history_len(), 1);
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
