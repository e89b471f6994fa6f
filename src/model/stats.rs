//! The global reading: the machine's tokens per second across its calls,
//! as `GET /api/v1/stats` and the `stats` events publish it.

use serde::{Deserialize, Serialize};

/// The stats payload of the contract (`GET /api/v1/stats`, SSE `event: stats`).
///
/// Field order is the contract's, so the serialised JSON reads the same as
/// its example. Absent numbers mean "not measured" and are skipped, never
/// sent as zero.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// Mean of the active streams' rates that exist and are > 0, one decimal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tps: Option<f64>,
    /// Whether `tps` exists; when false the UI hides the number rather than
    /// show 0 or a guess.
    pub tps_available: bool,
    /// True when any stream contributing to `tps` counts with estimates not
    /// yet settled. False when there is no `tps`: nothing is being claimed.
    pub estimated: bool,
    /// Highest reading >= [`HIGH_LOW_FLOOR`](crate::meter::global::HIGH_LOW_FLOOR) in the last [`HISTORY`](crate::meter::global::HISTORY).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub high: Option<f64>,
    /// Lowest reading >= [`HIGH_LOW_FLOOR`](crate::meter::global::HIGH_LOW_FLOOR) in the last [`HISTORY`](crate::meter::global::HISTORY).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub low: Option<f64>,
    /// Streams in the active set (not ended, a token within [`STALE`](crate::meter::global::STALE)),
    /// including those that have no rate yet.
    pub active: usize,
    /// Sum of the same per-stream rates as `tps`: the machine's total output
    /// throughput across concurrent calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aggregate_tps: Option<f64>,
    /// Event subscribers (SSE clients, the tray, the terminal view) the
    /// engine dropped since it started because they fell behind: the engine
    /// never waits for a reader, it drops it instead (a dropped reader
    /// reconnects and re-reads). Above 0 means some reader is too slow.
    #[serde(default)]
    pub dropped_subscribers: u64,
    /// Packets the passive capture lost since the engine started (kernel,
    /// interface and speedtap's own queue): calls they belonged to are
    /// flagged `capture_gap`. 0 when capture is off.
    #[serde(default)]
    pub capture_dropped_packets: u64,
}
