//! The live rate: a short sliding window over (time, tokens so far) pairs
//! (`docs/metering.md` "The live rate").
//!
//! The per-call meter pushes one pair after every flush; the rate is read
//! from the window's two ends. The window is kept short so the live number
//! follows the current decode speed, and it never reaches back before the
//! first output, so the wait for the first token never dilutes it.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use super::limits::{MIN_FINAL_RATE_TOKENS, MIN_RATE_SPAN, RATE_WINDOW};
use crate::model::snapshot::round_rate;

/// The one rule every rate speedtap shows passes (`docs/metering.md`,
/// "One rule for every rate shown"): at least [`MIN_FINAL_RATE_TOKENS`]
/// tokens, timed over at least [`MIN_RATE_SPAN`] of output. A single
/// burst has no span and fails it. The per-call meter applies it to its
/// live and its settled rates, and everything else shown (the global
/// reading, the tray label, the sparkline, the hour's high and low) is
/// made only of those rates, so the rule is written here once.
pub fn is_timed(tokens: f64, span: Duration) -> bool {
    tokens >= MIN_FINAL_RATE_TOKENS as f64 && span >= MIN_RATE_SPAN
}

/// The sliding window behind the live rate. Pure: time is passed in.
#[derive(Clone, Debug, Default)]
pub struct RateWindow {
    /// (flush time, calibrated tokens so far), oldest first.
    entries: VecDeque<(Instant, f64)>,
}

impl RateWindow {
    /// An empty window (no rate yet).
    pub fn new() -> Self {
        Self::default()
    }

    /// After each flush: push (now, calibrated tokens so far). Drops oldest
    /// entries while more than two remain and the second-oldest is at least
    /// `RATE_WINDOW` old.
    ///
    /// The drop test looks at the *second*-oldest entry so that, after the
    /// drop, the oldest remaining entry is still at least `RATE_WINDOW` old
    /// (or there are only two): the span never shrinks below the window just
    /// because flushes are sparse.
    pub fn push(&mut self, now: Instant, tokens: f64) {
        self.entries.push_back((now, tokens));
        while self.entries.len() > 2
            && now.saturating_duration_since(self.entries[1].0) >= RATE_WINDOW
        {
            self.entries.pop_front();
        }
    }

    /// The live rate per `docs/metering.md` "The live rate", rounded to one decimal, or
    /// `None`. `first_output` is the time of the first output.
    ///
    /// - window span (newest minus oldest) >= `MIN_RATE_SPAN`:
    ///   (newest tokens - oldest tokens) / span;
    /// - else, newest minus the first output >= `MIN_RATE_SPAN`:
    ///   newest tokens / that span;
    /// - else none.
    ///
    /// A zero or negative token delta or span gives no rate. When the window
    /// spans enough time but its token delta is zero (a stalled stream), the
    /// answer is "no rate", not the since-first-output fallback: the stream
    /// is not producing now, and an average would say it is. A rate that
    /// rounds to 0.0 is also reported as none, so a published rate is never a
    /// zero a consumer could mistake for "measured as stopped".
    pub fn rate(&self, first_output: Option<Instant>) -> Option<f64> {
        let &(newest_at, newest_tokens) = self.entries.back()?;
        let &(oldest_at, oldest_tokens) = self.entries.front()?;
        let span = newest_at.saturating_duration_since(oldest_at);
        let rate = if span >= MIN_RATE_SPAN {
            per_second(newest_tokens - oldest_tokens, span)?
        } else {
            let since_first = newest_at.saturating_duration_since(first_output?);
            if since_first < MIN_RATE_SPAN {
                return None;
            }
            per_second(newest_tokens, since_first)?
        };
        let rounded = round_rate(rate);
        (rounded > 0.0).then_some(rounded)
    }

    /// How many entries the window holds now.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing was pushed (since the last [`RateWindow::clear`]).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Forgets every entry: used when the meaning of "tokens so far" changes
    /// (the live count switches from the estimate to the server's own count),
    /// so a delta never mixes the two.
    pub fn clear(&mut self) {
        self.entries.clear();
    }
}

/// `tokens / span` in tokens per second, or `None` when either is not
/// positive (or the count is not a number).
fn per_second(tokens: f64, span: Duration) -> Option<f64> {
    let secs = span.as_secs_f64();
    (tokens.is_finite() && tokens > 0.0 && secs > 0.0).then(|| tokens / secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(t0: Instant, ms: u64) -> Instant {
        t0 + Duration::from_millis(ms)
    }

    #[test]
    fn empty_window_has_no_rate() {
        let t0 = Instant::now();
        let w = RateWindow::new();
        assert!(w.is_empty());
        assert_eq!(w.rate(Some(t0)), None);
    }

    #[test]
    fn drops_oldest_while_second_oldest_is_a_full_window_old() {
        let t0 = Instant::now();
        let mut w = RateWindow::new();
        w.push(at(t0, 0), 0.0);
        w.push(at(t0, 1000), 100.0);
        w.push(at(t0, 2000), 200.0);
        // Second-oldest (1 s) is only 1 s old: nothing dropped.
        assert_eq!(w.len(), 3);
        w.push(at(t0, 3000), 300.0);
        // Second-oldest (1 s) is now 2 s old: the 0 s entry goes; then the
        // second-oldest is 2 s, 1 s old: stop.
        assert_eq!(w.len(), 3);
        // Oldest is now 1 s: (300 - 100) / 2 s.
        assert_eq!(w.rate(Some(t0)), Some(100.0));
    }

    #[test]
    fn just_under_a_full_window_keeps_the_oldest() {
        let t0 = Instant::now();
        let mut w = RateWindow::new();
        w.push(at(t0, 0), 0.0);
        w.push(at(t0, 1000), 10.0);
        w.push(at(t0, 2999), 50.0);
        assert_eq!(w.len(), 3);
        // Spans the full 2.999 s: (50 - 0) / 2.999 = 16.67.
        assert_eq!(w.rate(Some(t0)), Some(16.7));
    }

    #[test]
    fn never_drops_below_two_entries() {
        let t0 = Instant::now();
        let mut w = RateWindow::new();
        w.push(at(t0, 0), 0.0);
        w.push(at(t0, 10_000), 100.0);
        assert_eq!(w.len(), 2);
        w.push(at(t0, 30_000), 300.0);
        // Two old entries: the oldest goes, the (now oldest) 10 s one stays.
        assert_eq!(w.len(), 2);
        assert_eq!(w.rate(Some(t0)), Some(10.0));
    }

    #[test]
    fn short_window_falls_back_to_tokens_since_first_output() {
        let t0 = Instant::now();
        let mut w = RateWindow::new();
        w.push(at(t0, 200), 10.0);
        w.push(at(t0, 600), 50.0);
        // Window spans 400 ms (< 500); newest minus first output (0) is
        // 600 ms: 50 / 0.6.
        assert_eq!(w.rate(Some(t0)), Some(83.3));
        // First output too recent as well: no rate.
        assert_eq!(w.rate(Some(at(t0, 200))), None);
        // Unknown first output: no fallback.
        assert_eq!(w.rate(None), None);
    }

    #[test]
    fn minimum_span_is_inclusive() {
        let t0 = Instant::now();
        let mut w = RateWindow::new();
        w.push(at(t0, 0), 10.0);
        w.push(at(t0, 499), 60.0);
        assert_eq!(w.rate(Some(t0)), None);
        w.push(at(t0, 500), 60.0);
        assert_eq!(w.rate(Some(t0)), Some(100.0));
    }

    #[test]
    fn a_single_entry_uses_the_first_output_span() {
        let t0 = Instant::now();
        let mut w = RateWindow::new();
        w.push(at(t0, 1000), 25.0);
        assert_eq!(w.rate(Some(t0)), Some(25.0));
        assert_eq!(w.rate(Some(at(t0, 600))), None);
    }

    #[test]
    fn zero_or_negative_delta_gives_no_rate() {
        let t0 = Instant::now();
        let mut w = RateWindow::new();
        w.push(at(t0, 0), 10.0);
        w.push(at(t0, 1000), 10.0);
        // Stalled: no rate, and no fallback to 10 tokens / 1 s.
        assert_eq!(w.rate(Some(t0)), None);
        let mut w = RateWindow::new();
        w.push(at(t0, 0), 10.0);
        w.push(at(t0, 1000), 4.0);
        assert_eq!(w.rate(Some(t0)), None);
    }

    #[test]
    fn zero_tokens_since_first_output_gives_no_rate() {
        let t0 = Instant::now();
        let mut w = RateWindow::new();
        w.push(at(t0, 100), 0.0);
        w.push(at(t0, 300), 0.0);
        assert_eq!(w.rate(Some(t0)), None);
    }

    #[test]
    fn rates_round_to_one_decimal_and_never_to_zero() {
        let t0 = Instant::now();
        let mut w = RateWindow::new();
        w.push(at(t0, 0), 0.0);
        w.push(at(t0, 3000), 100.0);
        assert_eq!(w.rate(Some(t0)), Some(33.3));
        let mut w = RateWindow::new();
        w.push(at(t0, 0), 0.0);
        w.push(at(t0, 100_000), 1.0);
        // 0.01 tok/s rounds to 0.0: reported as no rate.
        assert_eq!(w.rate(Some(t0)), None);
    }

    #[test]
    fn a_rate_needs_twenty_tokens_over_half_a_second() {
        assert!(is_timed(20.0, Duration::from_millis(500)));
        assert!(!is_timed(19.9, Duration::from_secs(3)));
        assert!(!is_timed(300.0, Duration::from_millis(30)), "one burst");
        assert!(!is_timed(300.0, Duration::ZERO));
    }

    #[test]
    fn clear_forgets_everything() {
        let t0 = Instant::now();
        let mut w = RateWindow::new();
        w.push(at(t0, 0), 0.0);
        w.push(at(t0, 1000), 50.0);
        w.clear();
        assert!(w.is_empty());
        assert_eq!(w.rate(Some(t0)), None);
    }
}
