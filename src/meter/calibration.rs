//! Route calibration: one tokenizer-drift factor per (route, model)
//! (`docs/metering.md` "Calibration").
//!
//! Live counts come from our tokenizer (o200k_base), which is not the local
//! model's. Each settled call with an exact count tells us how far off the
//! estimate was; the factor learned from those makes the next call's live
//! numbers converge on the server's own tokenizer. Pure and serialisable:
//! persisting it (JSON, SQLite rows) is the store's business.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::limits::{DRIFT_BAND, MIN_CALIBRATION_ESTIMATE};

/// One learned factor, in the shape it is persisted and listed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CalibrationEntry {
    /// The route name (as configured, e.g. `ollama`).
    pub route: String,
    /// The model as the request named it.
    pub model: String,
    /// Multiplies the raw estimate: exact ≈ raw × factor.
    pub factor: f64,
    /// How many settled calls taught it (1 = set by the first observation).
    pub observations: u64,
}

/// The factor and its history for one (route, model).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Learned {
    factor: f64,
    observations: u64,
}

/// One factor per (route, model), default 1.0.
///
/// Serialises as a list of [`CalibrationEntry`] (sorted by route, then
/// model), so a store can persist it as JSON or as one row per entry.
/// Invariant: every factor lies in [`DRIFT_BAND`], because it is only ever
/// set from, or averaged with, in-band ratios; entries that break it are
/// refused (see [`CalibrationTable::insert`]).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(from = "Vec<CalibrationEntry>", into = "Vec<CalibrationEntry>")]
pub struct CalibrationTable {
    /// route → model → learned factor. Nested so lookups take `&str`.
    routes: BTreeMap<String, BTreeMap<String, Learned>>,
}

impl CalibrationTable {
    /// An empty table: every factor is 1.0.
    pub fn new() -> Self {
        Self::default()
    }

    /// The factor for this (route, model); 1.0 when nothing was learned yet.
    pub fn factor(&self, route: &str, model: &str) -> f64 {
        self.routes
            .get(route)
            .and_then(|models| models.get(model))
            .map_or(1.0, |l| l.factor)
    }

    /// A plausible exact/raw ratio from a settled call: the first observation
    /// sets the factor, later ones move it to the midpoint of old and new.
    ///
    /// The call meter only hands over plausible ratios
    /// ([`plausible_drift`]); a ratio outside [`DRIFT_BAND`] (or NaN) is
    /// ignored here too, so a caller's mistake can't push a factor that
    /// would multiply every later estimate by something absurd.
    pub fn observe(&mut self, route: &str, model: &str, ratio: f64) {
        if !DRIFT_BAND.contains(&ratio) {
            return;
        }
        let slot = self
            .routes
            .entry(route.to_owned())
            .or_default()
            .entry(model.to_owned())
            .or_insert(Learned {
                factor: ratio,
                observations: 0,
            });
        if slot.observations > 0 {
            slot.factor = (slot.factor + ratio) / 2.0;
        }
        slot.observations = slot.observations.saturating_add(1);
    }

    /// Every learned factor, sorted by route, then model.
    pub fn entries(&self) -> impl Iterator<Item = CalibrationEntry> + '_ {
        self.routes.iter().flat_map(|(route, models)| {
            models.iter().map(move |(model, l)| CalibrationEntry {
                route: route.clone(),
                model: model.clone(),
                factor: l.factor,
                observations: l.observations,
            })
        })
    }

    /// Loads one entry (from a store), replacing what the table held for that
    /// (route, model). An entry whose factor is outside [`DRIFT_BAND`] (or not
    /// a number) is refused: learning can't produce one, so it is corrupt,
    /// and 1.0 is a safer guess than it.
    pub fn insert(&mut self, entry: CalibrationEntry) {
        if !DRIFT_BAND.contains(&entry.factor) {
            return;
        }
        self.routes.entry(entry.route).or_default().insert(
            entry.model,
            Learned {
                factor: entry.factor,
                observations: entry.observations,
            },
        );
    }

    /// How many (route, model) factors were learned.
    pub fn len(&self) -> usize {
        self.routes.values().map(BTreeMap::len).sum()
    }

    /// Whether nothing was learned (every factor is 1.0).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl From<Vec<CalibrationEntry>> for CalibrationTable {
    fn from(entries: Vec<CalibrationEntry>) -> Self {
        let mut table = Self::new();
        for entry in entries {
            table.insert(entry);
        }
        table
    }
}

impl From<CalibrationTable> for Vec<CalibrationEntry> {
    fn from(table: CalibrationTable) -> Self {
        table.entries().collect()
    }
}

/// The ratio exact / raw estimate when it is a plausible tokenizer drift
/// (`docs/metering.md` "Settling"): `raw_estimate >= MIN_CALIBRATION_ESTIMATE` and the
/// ratio within [`DRIFT_BAND`], both ends included. `None` otherwise: a
/// ratio outside the band means output the stream never showed (unstreamed
/// reasoning, for example), and a short estimate makes the ratio noise.
/// `raw_estimate` is the uncalibrated tokenizer count.
pub fn plausible_drift(exact: u64, raw_estimate: u64) -> Option<f64> {
    if raw_estimate < MIN_CALIBRATION_ESTIMATE {
        return None;
    }
    let ratio = exact as f64 / raw_estimate as f64;
    DRIFT_BAND.contains(&ratio).then_some(ratio)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_route_or_model_reads_one() {
        let t = CalibrationTable::new();
        assert_eq!(t.factor("ollama", "qwen3:8b"), 1.0);
        assert!(t.is_empty());
    }

    #[test]
    fn first_observation_sets_later_ones_take_the_midpoint() {
        let mut t = CalibrationTable::new();
        t.observe("A", "m", 1.5);
        assert_eq!(t.factor("A", "m"), 1.5);
        t.observe("A", "m", 1.0);
        assert_eq!(t.factor("A", "m"), 1.25);
        t.observe("A", "m", 0.75);
        assert_eq!(t.factor("A", "m"), 1.0);
        let e: Vec<_> = t.entries().collect();
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].observations, 3);
    }

    #[test]
    fn factors_are_per_route_and_model() {
        let mut t = CalibrationTable::new();
        t.observe("A", "m", 1.5);
        assert_eq!(t.factor("A", "m"), 1.5);
        assert_eq!(t.factor("B", "m"), 1.0);
        assert_eq!(t.factor("A", "other"), 1.0);
        t.observe("B", "m", 0.8);
        assert_eq!(t.factor("A", "m"), 1.5);
        assert_eq!(t.factor("B", "m"), 0.8);
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn out_of_band_observations_are_ignored() {
        let mut t = CalibrationTable::new();
        t.observe("A", "m", 36.0);
        t.observe("A", "m", 0.59);
        t.observe("A", "m", f64::NAN);
        assert!(t.is_empty());
        t.observe("A", "m", 1.2);
        t.observe("A", "m", 1.61);
        assert_eq!(t.factor("A", "m"), 1.2);
    }

    #[test]
    fn drift_band_edges_are_inclusive() {
        assert_eq!(plausible_drift(12, 20), Some(0.6));
        assert_eq!(plausible_drift(32, 20), Some(1.6));
        assert_eq!(plausible_drift(60, 100), Some(0.6));
        assert_eq!(plausible_drift(160, 100), Some(1.6));
        assert_eq!(plausible_drift(59, 100), None);
        assert_eq!(plausible_drift(161, 100), None);
        assert_eq!(plausible_drift(2000, 55), None);
    }

    #[test]
    fn raw_estimate_below_twenty_never_calibrates() {
        assert_eq!(plausible_drift(19, 19), None);
        assert_eq!(plausible_drift(25, 19), None);
        assert_eq!(plausible_drift(20, 20), Some(1.0));
        assert_eq!(plausible_drift(0, 0), None);
    }

    #[test]
    fn serde_round_trip_as_a_list_of_entries() {
        let mut t = CalibrationTable::new();
        t.observe("ollama", "qwen3:8b", 1.5);
        t.observe("ollama", "qwen3:8b", 1.0);
        t.observe("llama", "gemma", 0.9);
        let json = serde_json::to_value(&t).unwrap();
        assert_eq!(
            json,
            serde_json::json!([
                {"route": "llama", "model": "gemma", "factor": 0.9, "observations": 1},
                {"route": "ollama", "model": "qwen3:8b", "factor": 1.25, "observations": 2},
            ])
        );
        let back: CalibrationTable = serde_json::from_value(json).unwrap();
        assert_eq!(back, t);
        assert_eq!(back.factor("ollama", "qwen3:8b"), 1.25);
    }

    #[test]
    fn insert_loads_and_refuses_corrupt_factors() {
        let mut t = CalibrationTable::new();
        t.insert(CalibrationEntry {
            route: "A".into(),
            model: "m".into(),
            factor: 1.5,
            observations: 7,
        });
        t.insert(CalibrationEntry {
            route: "A".into(),
            model: "bad".into(),
            factor: 0.0,
            observations: 1,
        });
        t.insert(CalibrationEntry {
            route: "A".into(),
            model: "nan".into(),
            factor: f64::NAN,
            observations: 1,
        });
        assert_eq!(t.len(), 1);
        assert_eq!(t.factor("A", "m"), 1.5);
        assert_eq!(t.factor("A", "bad"), 1.0);
        // A loaded factor keeps learning with the midpoint rule.
        t.observe("A", "m", 1.0);
        assert_eq!(t.factor("A", "m"), 1.25);
        assert_eq!(t.entries().next().unwrap().observations, 8);
    }
}
