//! The snapshot: the one shape every published measurement takes.
//!
//! Field names and enum spellings are part of the external contract
//! (`docs/api.md` "Snapshot", `docs/metering.md` "One call"): change them only with
//! a deprecation path. An absent optional field means "not measured"; no
//! consumer may read it as zero, which is why they are `Option`s that are
//! skipped when serialised rather than zeros.

use serde::{Deserialize, Serialize};

use super::wait::Wait;

/// What the model is doing now, as far as the stream shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Dispatched upstream, no non-empty output on any channel yet.
    AwaitingFirstToken,
    /// The latest output was reasoning ("thinking") text.
    Reasoning,
    /// The latest output was visible answer text.
    Responding,
    /// The latest output was tool-call arguments.
    CallingTool,
    /// The call ended (settled or abandoned).
    Complete,
}

impl Phase {
    /// The contract's spelling, e.g. `awaiting_first_token`.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::AwaitingFirstToken => "awaiting_first_token",
            Phase::Reasoning => "reasoning",
            Phase::Responding => "responding",
            Phase::CallingTool => "calling_tool",
            Phase::Complete => "complete",
        }
    }
}

/// Where a count (and, on a final snapshot, the rate) came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenSource {
    /// Counted by the tokenizer over streamed text, times the route's
    /// calibration factor.
    Estimated,
    /// The API's own usage receipt (`usage.completion_tokens`, ...).
    Provider,
    /// The inference server's own generation timings (llama.cpp `timings`,
    /// Ollama `eval_count` / `eval_duration`).
    Server,
}

impl TokenSource {
    /// The contract's spelling, e.g. `estimated`.
    pub fn as_str(self) -> &'static str {
        match self {
            TokenSource::Estimated => "estimated",
            TokenSource::Provider => "provider",
            TokenSource::Server => "server",
        }
    }
}

/// One published measurement of one call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// What the model is doing now.
    pub phase: Phase,
    /// The call ended; these are its settled numbers.
    pub is_final: bool,
    /// Milliseconds since the request was dispatched upstream.
    pub elapsed_ms: u64,
    /// Dispatch to the first non-empty output chunk, once there was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_to_first_token_ms: Option<u64>,
    /// Output so far: visible text, reasoning and tool-call arguments together.
    pub output_tokens: u64,
    /// Live: the sliding-window rate. Final: the settled decode rate. One
    /// decimal. Absent when it can't be measured honestly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_tokens_per_second: Option<f64>,
    /// Where `output_tokens` (final: the rate) came from.
    pub token_source: TokenSource,
    /// While awaiting the first token: why the call waits, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait: Option<Wait>,
    /// Live only: the call has streamed and has been silent longer than
    /// its stall threshold (max(3 s, 10x its median gap between outputs));
    /// milliseconds since its last output. Absent once output resumes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stalled_ms: Option<u64>,
}

/// Rounds a rate to the one decimal the contract publishes.
pub fn round_rate(rate: f64) -> f64 {
    (rate * 10.0).round() / 10.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serialises_with_contract_names_and_skips_absent_fields() {
        let s = Snapshot {
            stalled_ms: None,
            phase: Phase::AwaitingFirstToken,
            is_final: false,
            elapsed_ms: 0,
            time_to_first_token_ms: None,
            output_tokens: 0,
            output_tokens_per_second: None,
            token_source: TokenSource::Estimated,
            wait: None,
        };
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(
            json,
            r#"{"phase":"awaiting_first_token","is_final":false,"elapsed_ms":0,"output_tokens":0,"token_source":"estimated"}"#
        );
        let back: Snapshot = serde_json::from_str(&json).unwrap();
        assert_eq!(back, s);
    }

    #[test]
    fn phase_and_source_spellings_match_serde() {
        for p in [
            Phase::AwaitingFirstToken,
            Phase::Reasoning,
            Phase::Responding,
            Phase::CallingTool,
            Phase::Complete,
        ] {
            assert_eq!(serde_json::to_value(p).unwrap(), p.as_str());
        }
        for s in [
            TokenSource::Estimated,
            TokenSource::Provider,
            TokenSource::Server,
        ] {
            assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
        }
    }
}
