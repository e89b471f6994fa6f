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
    /// Of those, the calls that failed (`failure`, a client that left
    /// aside): the errors column's count.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub failed_calls: u64,
    /// Median time to first token, ms, of calls neither queued nor cold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttft_ms_p50: Option<f64>,
    /// 90th percentile time to first token, ms, of the same calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttft_ms_p90: Option<f64>,
    /// Settled decode rate (output tokens per second).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tps_p50: Option<f64>,
    /// 90th percentile settled tokens per second (the fast tail).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tps_p90: Option<f64>,
    /// 10th percentile settled tokens per second: the slow tail, the
    /// same sense as `ttft_ms_p90`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tps_p10: Option<f64>,
    /// `ok` calls that were cold starts, kept out of `ttft_ms_*`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cold_calls: u64,
    /// Median time to first token of those cold starts, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cold_ttft_ms_p50: Option<f64>,
    /// `ok` calls that waited in the server's queue and were not cold
    /// starts (those count as cold), kept out of `ttft_ms_*`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub queued_calls: u64,
    /// Median time to first token of those queued calls, ms: queue wait
    /// included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queued_ttft_ms_p50: Option<f64>,
    /// Prompt processing rate, from the server's TTFT breakdown, of
    /// prompts of at least 512 tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill_tps_p50: Option<f64>,
    /// Median reasoning tokens per answer, over the `ok` calls that
    /// reasoned (`reasoning_tokens` above 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_tokens_p50: Option<f64>,
    /// `ok` calls that reasoned: the sample of `reasoning_tokens_p50`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub reasoning_calls: u64,
    /// Some of those counts are speedtap's estimates, not the server's.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reasoning_tokens_estimated: bool,
    /// `started_at` of the newest call in the group (RFC 3339).
    pub last_seen: String,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
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

/// `GET /api/v1/history/depth`: which settled calls feed the depth curve.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DepthQuery {
    /// The model (required; the curve is per model).
    pub model: String,
    /// Only calls of this route.
    pub route: Option<String>,
    /// Calls started at or after this unix time (ms).
    pub since_ms: Option<u64>,
    /// Calls started before this unix time (ms).
    pub until_ms: Option<u64>,
}

impl DepthQuery {
    /// The checks every front end applies: a model is named, and the
    /// window is not empty (the history filter's rule).
    pub fn check(&self) -> Result<(), String> {
        if self.model.trim().is_empty() {
            return Err("model is required: the depth curve is per model".to_owned());
        }
        HistoryFilter {
            since_ms: self.since_ms,
            until_ms: self.until_ms,
            ..HistoryFilter::default()
        }
        .check_window()
    }
}

/// One settled call on the depth curve.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct DepthPoint {
    /// How full the context was: prompt plus cached plus output tokens.
    pub context_tokens: u64,
    /// The call's settled decode rate.
    pub tokens_per_second: f64,
}

/// The least-squares line through the points: `tps = a + b * context_tokens`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DepthFit {
    /// Tokens per second at an empty context.
    pub a: f64,
    /// Change in tokens per second per context token (negative: slows as
    /// the context fills).
    pub b: f64,
    /// The fitted curve's shape: `linear`.
    pub kind: String,
}

/// The depth curve of one model: decode speed against context depth, from
/// real traffic.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DepthDoc {
    /// The model asked for.
    pub model: String,
    /// Settled calls with a rate and a known context depth, oldest first.
    pub points: Vec<DepthPoint>,
    /// The fitted line; `null` under 3 points (or when every point has the
    /// same depth).
    pub fit: Option<DepthFit>,
}

impl DepthDoc {
    /// The document for `points`, with its least-squares fit.
    pub fn fitted(model: String, points: Vec<DepthPoint>) -> DepthDoc {
        let fit = fit_line(&points);
        DepthDoc { model, points, fit }
    }
}

/// Ordinary least squares of tps on context tokens; `None` under 3 points
/// or without spread in depth.
pub fn fit_line(points: &[DepthPoint]) -> Option<DepthFit> {
    if points.len() < 3 {
        return None;
    }
    let n = points.len() as f64;
    let mx = points.iter().map(|p| p.context_tokens as f64).sum::<f64>() / n;
    let my = points.iter().map(|p| p.tokens_per_second).sum::<f64>() / n;
    let (mut sxx, mut sxy) = (0.0, 0.0);
    for p in points {
        let dx = p.context_tokens as f64 - mx;
        sxx += dx * dx;
        sxy += dx * (p.tokens_per_second - my);
    }
    if sxx <= 0.0 {
        return None;
    }
    let b = sxy / sxx;
    Some(DepthFit {
        a: my - b * mx,
        b,
        kind: "linear".to_owned(),
    })
}

#[cfg(test)]
mod depth_tests {
    use super::*;

    #[test]
    fn the_depth_fit_is_the_least_squares_line_and_absent_under_three_points() {
        let p = |c: u64, t: f64| DepthPoint {
            context_tokens: c,
            tokens_per_second: t,
        };
        let pts = vec![p(1000, 44.0), p(2000, 43.0), p(3000, 42.0), p(4000, 41.0)];
        let fit = fit_line(&pts).unwrap();
        assert!(
            (fit.a - 45.0).abs() < 1e-9 && (fit.b + 0.001).abs() < 1e-12,
            "{fit:?}"
        );
        assert_eq!(fit_line(&pts[..2]), None);
        assert_eq!(fit_line(&[p(5, 1.0), p(5, 2.0), p(5, 3.0)]), None);
        let doc = DepthDoc::fitted("m".into(), pts[..2].to_vec());
        assert_eq!(
            serde_json::to_value(&doc).unwrap(),
            serde_json::json!({"model": "m", "points": [
                {"context_tokens": 1000, "tokens_per_second": 44.0},
                {"context_tokens": 2000, "tokens_per_second": 43.0}], "fit": null})
        );
    }

    #[test]
    fn a_depth_query_needs_a_model_and_a_window_in_order() {
        assert!(DepthQuery::default().check().is_err());
        let q = DepthQuery {
            model: "m".into(),
            since_ms: Some(10),
            until_ms: Some(5),
            ..DepthQuery::default()
        };
        assert!(q.check().is_err());
        assert!(DepthQuery {
            model: "m".into(),
            ..DepthQuery::default()
        }
        .check()
        .is_ok());
    }
}
