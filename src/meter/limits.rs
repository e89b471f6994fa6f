//! The per-call meter's named constants, in one place.
//!
//! Every value is the reference value from `docs/metering.md` "One call";
//! change one only together with that page, since published numbers (when a
//! rate appears, when calibration learns) depend on them.

use std::ops::RangeInclusive;
use std::time::Duration;

/// Live snapshots are at least this far apart unless the phase changes
/// ("Clock and phases": `SNAPSHOT_INTERVAL` = 250 ms). Also the
/// tokenizing cadence: text is only tokenized when a snapshot is due.
pub const SNAPSHOT_INTERVAL: Duration = Duration::from_millis(250);

/// The live rate window drops its oldest entries while more than two remain
/// and the second-oldest is at least this old ("The live rate":
/// `RATE_WINDOW` = 2 s).
pub const RATE_WINDOW: Duration = Duration::from_secs(2);

/// A rate needs a time span of at least this much, live and final
/// ("The live rate" and "Settling": `MIN_RATE_SPAN` = 500 ms).
pub const MIN_RATE_SPAN: Duration = Duration::from_millis(500);

/// A final rate needs at least this many tokens, whether it is the client-side
/// decode rate or the server's own timings ("Settling":
/// `MIN_FINAL_RATE_TOKENS` = 20, and "at least 20 tokens" for server timings).
pub const MIN_FINAL_RATE_TOKENS: u64 = 20;

/// The ratio exact / raw estimate counts as plausible tokenizer drift when it
/// lies in this band, both ends included ("Settling": "ratio within
/// [0.6, 1.6]"). Outside it, the stream did not show all of the output.
pub const DRIFT_BAND: RangeInclusive<f64> = 0.6..=1.6;

/// Calibration learns only from calls whose raw estimate is at least this
/// many tokens ("Settling": "raw_estimate >= 20"): on shorter
/// outputs one token of difference swings the ratio too far.
pub const MIN_CALIBRATION_ESTIMATE: u64 = 20;
