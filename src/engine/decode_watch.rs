//! `DecodeWatch`: the engine's shared handle for the slowdown rule
//! (`docs/metering.md`, "The slowdown explained"). It owns every route's
//! usual decode rates ([`DecodeUsuals`], shared by all call actors as the
//! normals are) and counts the calls streaming on each route, so a settled
//! call knows how many others streamed beside it, at most at once.
//!
//! The count is exact without sampling: it only rises when a call starts
//! streaming, so at each start every call already streaming on the route
//! raises its own most-at-once to the new number of others.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError, RwLock};

use crate::meter::slowdown::{DecodeCall, DecodeUsuals, Evidence};
use crate::model::Slowdown;

/// Every route's usual decode rates and its streaming calls.
#[derive(Debug, Default)]
pub struct DecodeWatch {
    usuals: RwLock<DecodeUsuals>,
    /// Per route: each streaming call's sequence number and the most
    /// other calls that streamed at once beside it so far.
    streaming: Mutex<HashMap<String, HashMap<u64, u32>>>,
}

impl DecodeWatch {
    pub fn new() -> DecodeWatch {
        DecodeWatch::default()
    }

    /// A watch starting from `usuals` (the store's, rebuilt at start).
    pub fn with_usuals(usuals: DecodeUsuals) -> DecodeWatch {
        DecodeWatch {
            usuals: RwLock::new(usuals),
            ..DecodeWatch::default()
        }
    }

    fn streaming(&self) -> MutexGuard<'_, HashMap<String, HashMap<u64, u32>>> {
        self.streaming
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Call `seq` on `route` starts streaming (its first output). Starting
    /// twice is one start.
    pub fn stream_started(&self, route: &str, seq: u64) {
        let mut streaming = self.streaming();
        let calls = streaming.entry(route.to_owned()).or_default();
        if calls.contains_key(&seq) {
            return;
        }
        let others = calls.len() as u32;
        for beside in calls.values_mut() {
            *beside = (*beside).max(others);
        }
        calls.insert(seq, others);
    }

    /// Call `seq` on `route` stopped streaming: the most other calls that
    /// streamed at once beside it (0 if it never started).
    pub fn stream_ended(&self, route: &str, seq: u64) -> u32 {
        let mut streaming = self.streaming();
        let Some(calls) = streaming.get_mut(route) else {
            return 0;
        };
        let beside = calls.remove(&seq).unwrap_or(0);
        if calls.is_empty() {
            streaming.remove(route);
        }
        beside
    }

    /// Judges a settled ok call's decode rate against its usual, then lets
    /// it teach the usual: its slowdown, if any.
    pub fn settle(&self, call: &DecodeCall<'_>, evidence: &Evidence) -> Option<Slowdown> {
        let mut usuals = self.usuals.write().unwrap_or_else(PoisonError::into_inner);
        let slowdown = usuals.judge(call, evidence);
        usuals.learn(call, slowdown.as_ref());
        slowdown
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_counts_the_most_others_that_streamed_at_once_beside_it() {
        let w = DecodeWatch::new();
        w.stream_started("r", 1);
        w.stream_started("r", 2);
        w.stream_started("r", 3);
        assert_eq!(w.stream_ended("r", 2), 2, "two others streamed beside it");
        w.stream_started("other-route", 9);
        w.stream_started("r", 4);
        assert_eq!(w.stream_ended("r", 3), 2);
        assert_eq!(
            w.stream_ended("r", 4),
            2,
            "calls 1 and 3 streamed beside it"
        );
        w.stream_started("r", 5);
        assert_eq!(w.stream_ended("r", 5), 1, "only call 1 was left beside it");
        assert_eq!(w.stream_ended("r", 1), 2);
        assert_eq!(w.stream_ended("other-route", 9), 0);
    }

    #[test]
    fn a_call_that_never_streamed_ends_with_no_others_and_a_second_start_is_one_start() {
        let w = DecodeWatch::new();
        assert_eq!(w.stream_ended("r", 7), 0);
        w.stream_started("r", 1);
        w.stream_started("r", 1);
        assert_eq!(w.stream_ended("r", 1), 0);
    }
}
