//! The meters: pure metric maths with time passed in, no I/O.
//!
//! - [`snapshot`](crate::model::snapshot): the published shape;
//! - [`rate`]: the live sliding-window rate;
//! - [`call`]: the per-call meter (`docs/metering.md` "One call");
//! - [`calibration`]: the per-(route, model) tokenizer-drift factors;
//! - [`global`]: the all-streams meter with its hourly high/low (`docs/metering.md` "All calls");
//! - [`normals`]: each route and model's usual time to first token (`docs/metering.md` "Why a call waits");
//! - [`liveness`]: stalled and silent, live (`docs/metering.md` "Stalled, and alive");
//! - [`prompt_fit`]: the prompt-size calibration, a fixed overhead plus a per-token factor;
//! - [`prompt_progress`]: the wait the server's in-band prefill progress explains;
//! - [`reasoning`]: a call's reasoning time and tokens, split from its answer;
//! - [`slowdown`]: a settled call's decode rate against its usual, and why it was slow (`docs/metering.md` "The slowdown explained");
//! - [`waited`]: the time a call spent in its server's queue, for its record.

pub mod calibration;
pub mod call;
pub mod global;
pub mod limits;
pub mod liveness;
pub mod normals;
pub mod pipeline;
pub mod prompt_fit;
pub mod prompt_progress;
pub mod rate;
pub mod reasoning;
pub mod slowdown;
pub mod slowdown_notice;
pub mod waited;
