//! How often a route with waiting calls is looked at, so that looking never
//! silences what the server sends its own clients (`docs/metering.md`,
//! "Watching never changes the watched").
//!
//! llama-server answers `/slots` and `/metrics` from its task queue, and
//! every result it hands out wakes every HTTP thread that awaits one; each
//! of those restarts its wait, and a stream sends its keep-alive ping
//! (`--sse-ping-interval`) only when a whole wait ends with nothing. So a
//! look every 0.5 s silenced the pings of every waiting stream: measured on
//! the real server with a 1 s ping interval, 10 pings in a 13 s prefill
//! unwatched, none with `/slots` read every 0.5 s, and one every 1.5 s
//! with it read every 1.5 s.
//!
//! So, where the server's looks go through its task queue (it publishes
//! `/slots`):
//! - a call whose stream carries the server's own progress
//!   (`prompt_progress`) needs no look at all: the stream says more;
//! - once pings were seen (on this call, or earlier ones on the route), a
//!   look comes at most every [`PING_ROOM`] ping gaps, so pings flow
//!   between looks (at most 1.5 gaps apart instead of 1);
//! - with no ping seen yet, looks come at most every [`QUIET_LOOK`] (room
//!   for a ping each second, llama-server's current default), and back
//!   off as the wait grows (half the time waited), so that a server
//!   pinging less often (30 s in older versions) still gets its pings
//!   through a long prefill.
//!
//! Servers whose telemetry does not go through their generation queue
//! (Ollama's `/api/ps`, vLLM's `/metrics`) are looked at every
//! [`super::POLL_INTERVAL`], as before. Pure: fed the signs and `now`.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use super::POLL_INTERVAL;

/// The shortest time between two looks at a server whose looks go through
/// its task queue, with no ping seen: room for a ping every second.
pub const QUIET_LOOK: Duration = Duration::from_millis(1500);

/// With pings seen every `g`, a look comes at most every this many `g`.
pub const PING_ROOM: f64 = 2.5;

/// With no ping seen, a look waits at least this share of the time the
/// longest-waiting call has waited.
const BACKOFF_SHARE: f64 = 0.5;

/// What one waiting call's stream has shown before its first token.
#[derive(Clone, Debug, Default)]
struct InBand {
    /// The server streams its own prompt progress for it.
    progress: bool,
    last_ping_at: Option<Instant>,
    /// The shortest gap between two of its pings: the server's interval
    /// (longer gaps span a look, or a batch that held the server).
    ping_gap: Option<Duration>,
}

/// The signs in the waiting calls' streams, and the route's ping gap.
#[derive(Clone, Debug, Default)]
pub struct Pace {
    calls: HashMap<u64, InBand>,
    /// The ping gap of the latest call on the route that showed one.
    route_ping_gap: Option<Duration>,
}

impl Pace {
    /// The stream of call `seq` showed a sign before its first token at
    /// `at`: a ping, or the server's own progress.
    pub fn on_sign(&mut self, seq: u64, at: Instant, progress: bool) {
        let call = self.calls.entry(seq).or_default();
        if progress {
            call.progress = true;
            return;
        }
        if let Some(last) = call.last_ping_at.filter(|last| at > *last) {
            let gap = at - last;
            call.ping_gap = Some(call.ping_gap.map_or(gap, |g| g.min(gap)));
            self.route_ping_gap = call.ping_gap;
        }
        call.last_ping_at = Some(at);
    }

    /// Call `seq` is no longer waiting (or gone).
    pub fn forget(&mut self, seq: u64) {
        self.calls.remove(&seq);
    }

    /// How long until the next look, given the waiting calls' dispatch
    /// times, whether the server's looks go through its task queue, and
    /// `now`; `None` when no waiting call needs one.
    pub fn next_look(
        &self,
        waiting: impl IntoIterator<Item = (u64, Instant)>,
        queued_looks: bool,
        now: Instant,
    ) -> Option<Duration> {
        let needing: Vec<(u64, Instant)> = waiting
            .into_iter()
            .filter(|(seq, _)| !self.calls.get(seq).is_some_and(|c| c.progress))
            .collect();
        if needing.is_empty() {
            return None;
        }
        if !queued_looks {
            return Some(POLL_INTERVAL);
        }
        let seen_gap = needing
            .iter()
            .filter_map(|(seq, _)| self.calls.get(seq).and_then(|c| c.ping_gap))
            .max()
            .or(self.route_ping_gap);
        if let Some(gap) = seen_gap {
            return Some(QUIET_LOOK.max(gap.mul_f64(PING_ROOM)));
        }
        let waited = needing
            .iter()
            .map(|(_, dispatched)| now.saturating_duration_since(*dispatched))
            .max()
            .unwrap_or_default();
        Some(QUIET_LOOK.max(waited.mul_f64(BACKOFF_SHARE)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn a_server_whose_looks_do_not_queue_is_looked_at_every_poll_interval() {
        let t0 = Instant::now();
        let pace = Pace::default();
        assert_eq!(
            pace.next_look([(1, t0)], false, t0 + 20 * S),
            Some(POLL_INTERVAL)
        );
    }

    #[test]
    fn no_waiting_call_needs_no_look() {
        let t0 = Instant::now();
        assert_eq!(Pace::default().next_look([], true, t0), None);
    }

    #[test]
    fn a_call_with_the_servers_own_progress_in_its_stream_needs_no_look() {
        let t0 = Instant::now();
        let mut pace = Pace::default();
        pace.on_sign(1, t0 + S, true);
        assert_eq!(pace.next_look([(1, t0)], true, t0 + 2 * S), None);
        // Another waiting call without it still gets its looks.
        assert!(pace
            .next_look([(1, t0), (2, t0)], true, t0 + 2 * S)
            .is_some());
    }

    #[test]
    fn with_no_ping_seen_looks_leave_room_for_one_each_second_and_back_off() {
        let t0 = Instant::now();
        let pace = Pace::default();
        assert_eq!(pace.next_look([(1, t0)], true, t0), Some(QUIET_LOOK));
        assert_eq!(
            pace.next_look([(1, t0)], true, t0 + 2 * S),
            Some(QUIET_LOOK)
        );
        // 70 s into a silent wait, a look waits 35 s: a server pinging
        // every 30 s gets its ping through.
        assert_eq!(pace.next_look([(1, t0)], true, t0 + 70 * S), Some(35 * S));
    }

    #[test]
    fn pings_seen_every_second_space_looks_two_and_a_half_seconds_apart() {
        let t0 = Instant::now();
        let mut pace = Pace::default();
        pace.on_sign(1, t0 + S, false);
        pace.on_sign(1, t0 + 2 * S, false);
        // A gap that spanned a look is longer: the shortest is the interval.
        pace.on_sign(1, t0 + 3500 * Duration::from_millis(1), false);
        assert_eq!(
            pace.next_look([(1, t0)], true, t0 + 4 * S),
            Some(Duration::from_millis(2500))
        );
    }

    #[test]
    fn a_routes_ping_gap_outlives_the_call_it_was_seen_on() {
        let t0 = Instant::now();
        let mut pace = Pace::default();
        pace.on_sign(1, t0 + 2 * S, false);
        pace.on_sign(1, t0 + 4 * S, false);
        pace.forget(1);
        assert_eq!(pace.next_look([(2, t0)], true, t0 + 10 * S), Some(5 * S));
    }
}
