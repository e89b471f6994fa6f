//! Is a call stuck or working? The two live readings of a call's silence
//! (`docs/metering.md`, "Stalled, and alive"):
//!
//! - `stalled_ms`: a call that has streamed output and has been silent
//!   longer than max([`STALL_FLOOR`], [`STALL_GAPS`] x its median gap
//!   between outputs) is stalled; the reading is the time since its last
//!   output, and it is absent again once output resumes;
//! - `silent_ms`: a call awaiting its first token, the time since the
//!   server last showed life for it (a body frame such as a ping or a
//!   `prompt_progress` chunk, a change in its telemetry), or since
//!   dispatch when it showed none.
//!
//! Pure: fed the arrival time of each output and each sign of life; it
//! never reads the clock. A sign of life is never an output: pings and
//! progress chunks say the server works, not that it answered.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use crate::model::{Wait, WaitReason};

/// No call is stalled before this much silence, however fast it streamed.
pub const STALL_FLOOR: Duration = Duration::from_secs(3);

/// A silence this many times the call's median gap between outputs is a
/// stall (when longer than [`STALL_FLOOR`]).
pub const STALL_GAPS: u32 = 10;

/// The median is taken over the latest gaps only, so a call's memory stays
/// bounded however long it streams, and its threshold follows its pace.
const GAPS_KEPT: usize = 64;

/// One call's silences, as its outputs and signs of life arrive.
#[derive(Clone, Debug)]
pub struct Liveness {
    dispatched_at: Instant,
    last_sign_at: Option<Instant>,
    last_output_at: Option<Instant>,
    /// The latest gaps between consecutive outputs, oldest first.
    gaps: VecDeque<Duration>,
}

impl Liveness {
    /// A call dispatched at `dispatched_at`, silent so far.
    pub fn new(dispatched_at: Instant) -> Liveness {
        Liveness {
            dispatched_at,
            last_sign_at: None,
            last_output_at: None,
            gaps: VecDeque::new(),
        }
    }

    /// The server showed life for the call at `at` (a body frame, a change
    /// in its telemetry). Not an output.
    pub fn on_sign(&mut self, at: Instant) {
        if self.last_sign_at.is_none_or(|last| at > last) {
            self.last_sign_at = Some(at);
        }
    }

    /// An output arrived at `at` (in arrival order). It is also a sign of
    /// life.
    pub fn on_output(&mut self, at: Instant) {
        if let Some(last) = self.last_output_at {
            if at <= last {
                return;
            }
            if self.gaps.len() == GAPS_KEPT {
                self.gaps.pop_front();
            }
            self.gaps.push_back(at - last);
        }
        self.last_output_at = Some(at);
        self.on_sign(at);
    }

    /// The silence that makes this call stalled: max([`STALL_FLOOR`],
    /// [`STALL_GAPS`] x its median gap). The floor alone until two outputs
    /// gave a gap.
    pub fn stall_threshold(&self) -> Duration {
        let mut gaps: Vec<Duration> = self.gaps.iter().copied().collect();
        if gaps.is_empty() {
            return STALL_FLOOR;
        }
        gaps.sort_unstable();
        let median = gaps[gaps.len() / 2];
        STALL_FLOOR.max(median.saturating_mul(STALL_GAPS))
    }

    /// At `now`: the time since the last output, when the call has
    /// streamed and that silence is longer than its threshold.
    pub fn stalled_ms(&self, now: Instant) -> Option<u64> {
        let silence = now.saturating_duration_since(self.last_output_at?);
        (silence > self.stall_threshold()).then_some(silence.as_millis() as u64)
    }

    /// At `now`: the time since the server last showed life for the call,
    /// or since dispatch when it showed none.
    pub fn silent_ms(&self, now: Instant) -> u64 {
        let since = self.last_sign_at.unwrap_or(self.dispatched_at);
        now.saturating_duration_since(since).as_millis() as u64
    }
}

/// Whether a new explanation of a call's wait is a sign of life: its
/// prefill progress moved (`/slots`, `prompt_progress`), or the server
/// started or finished loading its model (`/api/ps`). A queue position
/// that moves is other calls' progress, and an `unknown` is no news.
pub fn shows_life(before: Option<&Wait>, after: &Wait) -> bool {
    let Some(before) = before else {
        return after.reason == WaitReason::LoadingModel
            || (after.reason == WaitReason::Prefilling && after.progress.is_some_and(|p| p > 0.0));
    };
    let loading = |w: &Wait| w.reason == WaitReason::LoadingModel;
    if loading(before) != loading(after) && after.reason != WaitReason::Unknown {
        return true;
    }
    after.reason == WaitReason::Prefilling
        && after.progress.is_some()
        && after.progress != before.progress
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefill(progress: Option<f64>) -> Wait {
        Wait {
            progress,
            ..Wait::new(WaitReason::Prefilling)
        }
    }

    #[test]
    fn prefill_progress_that_moves_and_a_load_are_signs_of_life() {
        assert!(shows_life(None, &prefill(Some(0.2))));
        assert!(!shows_life(None, &prefill(Some(0.0))));
        assert!(shows_life(Some(&prefill(Some(0.2))), &prefill(Some(0.4))));
        assert!(!shows_life(Some(&prefill(Some(0.4))), &prefill(Some(0.4))));
        let loading = Wait::new(WaitReason::LoadingModel);
        assert!(shows_life(None, &loading));
        assert!(shows_life(Some(&loading), &prefill(None)), "loaded");
        assert!(!shows_life(Some(&loading), &loading));
    }

    #[test]
    fn a_queue_that_moves_or_an_unknown_wait_is_no_sign_of_life() {
        let queued = |n| Wait {
            position: Some(n),
            ..Wait::new(WaitReason::Queued)
        };
        assert!(!shows_life(None, &queued(2)));
        assert!(!shows_life(Some(&queued(2)), &queued(1)));
        assert!(!shows_life(None, &Wait::new(WaitReason::Unknown)));
        let loading = Wait::new(WaitReason::LoadingModel);
        assert!(!shows_life(Some(&loading), &Wait::new(WaitReason::Unknown)));
    }

    fn at(t0: Instant, ms: u64) -> Instant {
        t0 + Duration::from_millis(ms)
    }

    /// Outputs every `every_ms` from `from_ms`, `n` of them.
    fn stream(l: &mut Liveness, t0: Instant, from_ms: u64, every_ms: u64, n: u64) {
        for i in 0..n {
            l.on_output(at(t0, from_ms + i * every_ms));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_fast_stream_silent_for_5_s_is_stalled_while_it_lasts_and_not_after() {
        let t0 = Instant::now();
        let mut l = Liveness::new(t0);
        // 20 tok/s: a 50 ms median gap, so the 3 s floor rules.
        stream(&mut l, t0, 500, 50, 20); // last output at 1 450 ms
        assert_eq!(l.stall_threshold(), STALL_FLOOR);
        assert_eq!(l.stalled_ms(at(t0, 4_450)), None, "3 s exactly is not more");
        assert_eq!(l.stalled_ms(at(t0, 4_451)), Some(3_001));
        assert_eq!(l.stalled_ms(at(t0, 6_449)), Some(4_999));
        // Output resumes: no longer stalled.
        l.on_output(at(t0, 6_450));
        assert_eq!(l.stalled_ms(at(t0, 6_500)), None);
        assert_eq!(l.stalled_ms(at(t0, 9_000)), None);
    }

    #[test]
    fn a_slow_stream_is_judged_against_ten_times_its_median_gap() {
        let t0 = Instant::now();
        let mut l = Liveness::new(t0);
        // One output a second: 10 s of silence is its normal worst case.
        stream(&mut l, t0, 0, 1_000, 6); // last at 5 000 ms
        assert_eq!(l.stall_threshold(), Duration::from_secs(10));
        assert_eq!(l.stalled_ms(at(t0, 12_000)), None);
        assert_eq!(l.stalled_ms(at(t0, 15_001)), Some(10_001));
    }

    #[test]
    fn one_long_gap_does_not_move_the_median() {
        let t0 = Instant::now();
        let mut l = Liveness::new(t0);
        stream(&mut l, t0, 0, 100, 10); // last at 900 ms
        l.on_output(at(t0, 60_000)); // a minute's stall, then on
        stream(&mut l, t0, 60_100, 100, 5);
        assert_eq!(l.stall_threshold(), STALL_FLOOR);
    }

    #[test]
    fn a_call_without_output_is_never_stalled() {
        let t0 = Instant::now();
        let mut l = Liveness::new(t0);
        l.on_sign(at(t0, 100));
        assert_eq!(l.stalled_ms(at(t0, 60_000)), None);
    }

    #[tokio::test(start_paused = true)]
    async fn pings_every_half_second_keep_the_silence_under_a_second() {
        let t0 = Instant::now();
        let mut l = Liveness::new(t0);
        for i in 1..8 {
            l.on_sign(at(t0, i * 500));
            let now = at(t0, i * 500 + 499);
            assert!(l.silent_ms(now) < 1_000, "at {:?}", now - t0);
            // A ping is no output: still nothing to stall on.
            assert_eq!(l.stalled_ms(now), None);
        }
    }

    #[test]
    fn without_a_sign_of_life_the_silence_grows_from_dispatch() {
        let t0 = Instant::now();
        let l = Liveness::new(t0);
        assert_eq!(l.silent_ms(at(t0, 1_000)), 1_000);
        assert_eq!(l.silent_ms(at(t0, 30_000)), 30_000);
    }

    #[test]
    fn a_late_stamped_sign_never_moves_the_last_one_back() {
        let t0 = Instant::now();
        let mut l = Liveness::new(t0);
        l.on_sign(at(t0, 2_000));
        l.on_sign(at(t0, 1_000));
        assert_eq!(l.silent_ms(at(t0, 2_500)), 500);
    }
}
