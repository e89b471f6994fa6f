//! Learns, per model, whether a route's server runs one call at a time
//! when it publishes no queue of its own (Ollama with one runner slot,
//! `OLLAMA_NUM_PARALLEL=1`): only then may a call that waits behind
//! another be called `queued` (`docs/metering.md`, "Why a call waits",
//! rule 2). The evidence is speedtap's own observation: calls for the
//! model overlapped in flight at least [`SERIAL_PAIRS`] times and never
//! streamed at the same time. One pair that streams together proves the
//! server parallel, for good.

use std::collections::HashMap;

/// Overlapping pairs, none of which streamed at the same time, before a
/// model is judged served one call at a time.
pub const SERIAL_PAIRS: u32 = 5;

/// Models learned per route: past this, new names are not learned (a
/// client naming a new model on every call cannot grow the table).
const MAX_MODELS: usize = 256;

/// What was seen of one model's overlapping calls.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Pairs {
    /// Pairs in flight together whose second call streamed only after the
    /// first had ended.
    serial: u32,
    /// Two calls streamed at the same time.
    parallel: bool,
}

/// The evidence for every model on one route.
#[derive(Clone, Debug, Default)]
pub struct SerialLearner {
    models: HashMap<String, Pairs>,
}

impl SerialLearner {
    fn entry(&mut self, model: &str) -> Option<&mut Pairs> {
        if !self.models.contains_key(model) && self.models.len() >= MAX_MODELS {
            return None;
        }
        Some(self.models.entry(model.to_owned()).or_default())
    }

    /// A call for `model` got its first token after `pairs` calls it was
    /// in flight with had streamed and ended.
    pub fn streamed_after(&mut self, model: &str, pairs: u32) {
        if pairs == 0 {
            return;
        }
        if let Some(p) = self.entry(model) {
            p.serial = p.serial.saturating_add(pairs);
        }
    }

    /// A call for `model` got its first token while another streamed.
    pub fn streamed_together(&mut self, model: &str) {
        if let Some(p) = self.entry(model) {
            p.parallel = true;
        }
    }

    /// Whether the server runs `model` one call at a time.
    pub fn is_serial(&self, model: &str) -> bool {
        self.models
            .get(model)
            .is_some_and(|p| !p.parallel && p.serial >= SERIAL_PAIRS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_is_serial_only_after_five_pairs_that_never_streamed_together() {
        let mut l = SerialLearner::default();
        l.streamed_after("m", 4);
        assert!(!l.is_serial("m"), "four pairs are not enough");
        l.streamed_after("m", 1);
        assert!(l.is_serial("m"));
        assert!(!l.is_serial("other"), "learned per model");
        l.streamed_together("m");
        assert!(
            !l.is_serial("m"),
            "one pair streaming together proves it parallel"
        );
        l.streamed_after("m", 50);
        assert!(!l.is_serial("m"), "for good");
    }

    #[test]
    fn the_table_stops_growing_at_its_cap() {
        let mut l = SerialLearner::default();
        for i in 0..MAX_MODELS + 10 {
            l.streamed_after(&format!("m{i}"), SERIAL_PAIRS);
        }
        assert_eq!(l.models.len(), MAX_MODELS);
        assert!(!l.is_serial(&format!("m{}", MAX_MODELS + 1)));
    }
}
