//! What a call waited for in the server's queue, kept for its settled
//! record (`docs/metering.md`, "Why a call waits", rule 4): the live
//! explanation moves on from `queued` to `prefilling`, and without this
//! tally the settled call would say only that it processed its prompt,
//! its queue time lumped into "the rest".
//!
//! Pure: the call actor passes each explanation with the time it came.

use tokio::time::Instant;

use crate::model::{Wait, WaitReason};

/// The queue time of one call, from the explanations of its wait.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QueueTally {
    /// An explanation was seen (the first one decides whether the queue
    /// counts from the dispatch).
    explained: bool,
    /// Since when the call is explained queued.
    since: Option<Instant>,
    /// Queued time already closed, in ms.
    closed_ms: u64,
    /// The most calls seen ahead of it.
    position: Option<u32>,
}

impl QueueTally {
    /// The wait explained at `now` for a call dispatched at `dispatched`.
    /// A first explanation that says queued counts from the dispatch: the
    /// call queued from its arrival, the first look only showed it.
    pub fn explained(&mut self, wait: &Wait, dispatched: Instant, now: Instant) {
        let first = !self.explained;
        self.explained = true;
        if wait.reason == WaitReason::Queued {
            if self.since.is_none() {
                self.since = Some(if first { dispatched } else { now });
            }
            self.position = self.position.max(wait.position);
        } else if wait.reason != WaitReason::Unknown {
            self.close(now);
        }
    }

    fn close(&mut self, at: Instant) {
        if let Some(since) = self.since.take() {
            self.closed_ms += at.saturating_duration_since(since).as_millis() as u64;
        }
    }

    /// The time queued, counting an open queue up to `first_token` (the
    /// call's first token, or its end): `None` when it was never queued.
    pub fn queued_ms(&self, first_token: Instant) -> Option<u64> {
        let open = self.since.map_or(0, |since| {
            first_token.saturating_duration_since(since).as_millis() as u64
        });
        (self.position.is_some() || self.since.is_some() || self.closed_ms > 0)
            .then_some(self.closed_ms + open)
    }

    /// The most calls that were ahead of it while it queued.
    pub fn position(&self) -> Option<u32> {
        self.position
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn queued(position: u32) -> Wait {
        Wait {
            position: Some(position),
            ..Wait::new(WaitReason::Queued)
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_queued_from_its_first_look_counts_its_queue_from_the_dispatch() {
        let t0 = Instant::now();
        let mut q = QueueTally::default();
        tokio::time::advance(Duration::from_millis(400)).await;
        q.explained(&queued(2), t0, Instant::now());
        tokio::time::advance(Duration::from_millis(2_000)).await;
        q.explained(&queued(1), t0, Instant::now());
        tokio::time::advance(Duration::from_millis(600)).await;
        // Unknown between looks does not end the queue; a prefill does.
        q.explained(&Wait::new(WaitReason::Unknown), t0, Instant::now());
        q.explained(&Wait::new(WaitReason::Prefilling), t0, Instant::now());
        tokio::time::advance(Duration::from_millis(900)).await;
        assert_eq!(q.queued_ms(Instant::now()), Some(3_000));
        assert_eq!(q.position(), Some(2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_queue_still_open_at_the_first_token_ends_there_and_an_unqueued_call_has_none() {
        let t0 = Instant::now();
        let mut q = QueueTally::default();
        q.explained(&Wait::new(WaitReason::Prefilling), t0, t0);
        tokio::time::advance(Duration::from_millis(500)).await;
        assert_eq!(q.queued_ms(Instant::now()), None);
        q.explained(&queued(1), t0, Instant::now());
        tokio::time::advance(Duration::from_millis(700)).await;
        assert_eq!(
            q.queued_ms(Instant::now()),
            Some(700),
            "from the look that showed it"
        );
    }
}
