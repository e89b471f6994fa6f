//! The meters: pure metric maths with time passed in, no I/O.
//!
//! - [`snapshot`]: the published shape;
//! - [`rate`]: the live sliding-window rate;
//! - [`call`]: the per-call meter (metering-semantics section 1);
//! - [`calibration`]: the per-(route, model) tokenizer-drift factors;
//! - [`global`]: the all-streams meter with its hourly high/low (section 2).

pub mod calibration;
pub mod call;
pub mod global;
pub mod limits;
pub mod rate;
pub mod snapshot;

pub use snapshot::{Phase, Snapshot, TokenSource};
