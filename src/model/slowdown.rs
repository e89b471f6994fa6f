//! Why a settled call decoded slower than usual: the contract shape of
//! `slowdown` (`docs/api.md`, "Slowdown"; the rule is in
//! `docs/metering.md`, "The slowdown explained").
//!
//! A cause is named only from evidence the server or the engine gave; with
//! none, the cause is `unknown`, never a guess.

use serde::{Deserialize, Serialize};

/// A call whose decode rate fell below the usual for its route, model and
/// context depth.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Slowdown {
    /// The usual decode rate it is judged against, tokens per second (one
    /// decimal).
    pub usual_tps: f64,
    /// The call's rate over the usual (two decimals), below 0.75.
    pub ratio: f64,
    /// What the evidence names, at least one (`unknown` alone without any).
    pub causes: Vec<SlowdownCause>,
}

/// One named reason for a slowdown.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum SlowdownCause {
    /// The server reports the model partly off the GPU (Ollama `size_vram
    /// < size`).
    CpuOffload {
        /// The share of the model in CPU memory, 0..=1 (two decimals).
        cpu_share: f64,
    },
    /// The server's version differs from the one the usual was learned on.
    ServerChanged {
        /// The version the usual was learned on.
        from: String,
        /// The version this call ran on.
        to: String,
    },
    /// Other calls streamed on the same server during this one.
    Concurrent {
        /// How many other calls, at most at once.
        calls: u32,
    },
    /// Speculative decoding accepted less of the draft model's tokens
    /// than usual (llama.cpp `draft_n_accepted / draft_n`).
    DraftAcceptance {
        /// The usual accepted share, learned with the usual rate, 0..=1
        /// (two decimals).
        usual: f64,
        /// This call's accepted share, 0..=1 (two decimals).
        now: f64,
    },
    /// No evidence names a cause.
    Unknown,
}
