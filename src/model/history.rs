//! Reading the store: which calls a query selects, the per-model figures,
//! the export formats, and the rules every front end checks a history
//! filter by.

use serde::{Deserialize, Serialize};

use super::call::CallStatus;
use super::time::{ms_to_rfc3339, parse_time};

/// The most calls one list query returns (`limit` is clamped to it).
pub const MAX_LIMIT: usize = 10_000;

/// Which calls a query returns. All set fields must match (AND).
///
/// `model: Some("")` (and `client: Some("")`) selects the calls that named
/// none, the way they are grouped in `Store::models`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HistoryFilter {
    /// Calls that named this model (`""`: calls that named none).
    pub model: Option<String>,
    /// Calls of this route.
    pub route: Option<String>,
    /// Calls made by this client app (`""`: calls with no known client).
    pub client: Option<String>,
    /// Calls started at or after this unix time (ms), inclusive.
    pub since_ms: Option<u64>,
    /// Calls started before this unix time (ms), exclusive, so consecutive
    /// windows `[a, b)`, `[b, c)` never count a call twice.
    pub until_ms: Option<u64>,
    /// Calls that ended with this status.
    pub status: Option<CallStatus>,
    /// At most this many calls (history and export; ignored by `models`).
    pub limit: Option<usize>,
}

/// Per (model, route) figures for the model comparison
/// (`GET /api/v1/models`). See `Store::models` for which calls each figure
/// is computed over and the percentile method. Absent figures had no sample.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub struct ModelSummary {
    /// The model the requests named; empty for calls that named none (an
    /// OpenAI-compatible server with one loaded model accepts that).
    pub model: String,
    /// The route the calls went through.
    pub route: String,
    /// Every call matching the filter, whatever its status.
    pub calls: u64,
    /// Of those, the calls that ended `ok`: the sample for the figures below.
    pub ok_calls: u64,
    /// Median time to first token, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttft_ms_p50: Option<f64>,
    /// 90th percentile time to first token, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttft_ms_p90: Option<f64>,
    /// Settled decode rate (output tokens per second).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tps_p50: Option<f64>,
    /// 90th percentile settled tokens per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tps_p90: Option<f64>,
    /// Prompt processing rate, from the server's TTFT breakdown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill_tps_p50: Option<f64>,
    /// `started_at` of the newest call in the group (RFC 3339).
    pub last_seen: String,
}

/// The two export formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExportFormat {
    /// RFC 4180: a header row, comma-separated, CRLF line ends, fields with
    /// a comma, quote or line break quoted. Absent values are empty fields.
    Csv,
    /// One [`Call`](super::Call) JSON object per line (its details flattened beside the
    /// contract's fields), exactly as the history API returns them. Like the
    /// API, absent values and unset flags (`one_burst`,
    /// `unstreamed_reasoning`) are left out rather than written as `null` or
    /// `false`.
    Jsonl,
}

impl std::str::FromStr for ExportFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "csv" => Ok(ExportFormat::Csv),
            "jsonl" | "ndjson" => Ok(ExportFormat::Jsonl),
            other => Err(format!(
                "unknown export format {other:?}: expected csv or jsonl"
            )),
        }
    }
}

/// `since`/`until` as a front end received them: unix milliseconds or an
/// RFC 3339 time. Empty is no bound. The error names the parameter.
pub fn time_bound(name: &str, value: &str) -> Result<Option<u64>, String> {
    if value.trim().is_empty() {
        return Ok(None);
    }
    parse_time(value).map(Some).map_err(|_| {
        format!(
            "{name} must be unix milliseconds or an RFC 3339 time such as \
             2026-11-30T10:42:07Z, got {value:?}"
        )
    })
}

impl HistoryFilter {
    /// Checks the time window: calls started in `[since, until)`, so
    /// `since` must be before `until` (an empty window is refused: swapped
    /// bounds are the likelier mistake). The rule every front end applies.
    pub fn check_window(&self) -> Result<(), String> {
        if let (Some(since), Some(until)) = (self.since_ms, self.until_ms) {
            if since >= until {
                return Err(format!(
                    "since must be before until (calls started in [since, until)), got since={} \
                     and until={}",
                    ms_to_rfc3339(since),
                    ms_to_rfc3339(until)
                ));
            }
        }
        Ok(())
    }
}
