//! One `calls` row ↔ one [`Call`] (with its details), and the time
//! conversions.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::model::time::rfc3339_to_ms;

use rusqlite::{params, Row, Transaction};
use serde::de::DeserializeOwned;

use super::StoreError;
use crate::model::Snapshot;
use crate::model::{Call, CallDetails, CallIdentity, TtftBreakdown};
use crate::model::{ContextUse, DraftCounts, Failure, PromptTruncation, Wait};

/// The stored columns, in the order [`from_row`] reads them.
pub(crate) const COLUMNS: &str = "id, started_at, started_at_ms, route, api, model, client, \
    status, http_status, settled_at, settled_at_ms, phase, is_final, elapsed_ms, ttft_ms, \
    output_tokens, output_tokens_per_second, token_source, input_tokens, load_ms, prefill_ms, \
    prefill_tokens, cached_tokens, prefill_tokens_per_second, other_ms, one_burst, \
    unstreamed_reasoning, seen_by, capture_gap, wait_reason, wait_position, wait_progress, \
    wait_eta_ms, wait_usual_ms, wait_prompt_tokens, truncated_request_tokens, \
    truncated_server_tokens, truncated_context_size, context_size, context_used, draft_n, \
    draft_accepted, placement, model_bytes, vram_bytes, start, error, prompt_tokens_estimated, \
    queued_ms, queue_position, server_version, reasoning_tokens, reasoning_tokens_estimated, \
    reasoning_ms, slowdown, response_model, slow_after_ms, slow_after_usual_ms, \
    failure_kind, failure_after_tokens, failure_message, stalls, stalled_ms, longest_stall_ms, \
    longest_stall_after_token, tps_excluding_stalls";

/// The `INSERT` of every one of [`COLUMNS`], numbered in their order,
/// skipping a call already stored (same id and started_at).
fn insert_sql() -> String {
    let values: Vec<String> = (1..=COLUMNS.split(',').count())
        .map(|i| format!("?{i}"))
        .collect();
    format!(
        "INSERT INTO calls ({COLUMNS}) VALUES ({}) ON CONFLICT (id, started_at) DO NOTHING",
        values.join(", ")
    )
}

/// Inserts `calls`, skipping any already stored (same id and started_at).
#[expect(
    clippy::too_many_lines,
    reason = "one line per stored column, in COLUMNS order, until a column table drives the insert"
)]
pub(crate) fn insert_calls(tx: &Transaction<'_>, calls: &[Call]) -> rusqlite::Result<()> {
    let mut stmt = tx.prepare_cached(&insert_sql())?;
    for c in calls {
        let d = &c.details;
        let s = c.speed.as_ref();
        let b = d
            .ttft_breakdown
            .as_ref()
            .filter(|b| **b != TtftBreakdown::default());
        let started_at_ms = started_at_ms(c);
        let settled_at_ms = d.settled_at.as_deref().and_then(rfc3339_to_ms);
        let w = d.wait.as_ref();
        let t = d.prompt_truncated.as_ref();
        stmt.execute(params![
            c.identity.id,
            c.identity.started_at,
            started_at_ms,
            c.identity.route,
            c.identity.api.as_str(),
            non_empty(c.identity.model.as_deref()),
            non_empty(d.client.as_deref()),
            c.status.as_str(),
            c.http_status,
            d.settled_at,
            settled_at_ms,
            s.map(|s| s.phase.as_str()),
            s.map(|s| s.is_final),
            s.map(|s| s.elapsed_ms),
            s.and_then(|s| s.time_to_first_token_ms),
            s.map(|s| s.output_tokens),
            s.and_then(|s| s.output_tokens_per_second),
            s.map(|s| s.token_source.as_str()),
            c.input_tokens,
            b.and_then(|b| b.load_ms),
            b.and_then(|b| b.prefill_ms),
            b.and_then(|b| b.prefill_tokens),
            b.and_then(|b| b.cached_tokens),
            b.and_then(|b| b.prefill_tokens_per_second),
            b.and_then(|b| b.other_ms),
            d.one_burst,
            d.unstreamed_reasoning,
            d.seen_by.as_str(),
            d.capture_gap,
            w.map(|w| w.reason.as_str()),
            w.and_then(|w| w.position),
            w.and_then(|w| w.progress),
            w.and_then(|w| w.eta_ms),
            w.and_then(|w| w.usual_ms),
            w.and_then(|w| w.prompt_tokens),
            t.map(|t| t.request_tokens),
            t.map(|t| t.server_tokens),
            t.and_then(|t| t.context_size),
            d.context.as_ref().and_then(|c| c.size),
            d.context.as_ref().map(|c| c.used),
            d.draft.as_ref().map(|x| x.drafted),
            d.draft.as_ref().map(|x| x.accepted),
            d.placement.map(|p| p.as_str()),
            d.model_bytes,
            d.vram_bytes,
            d.start.map(|s| s.as_str()),
            d.error,
            d.prompt_tokens_estimated,
            d.queued_ms,
            d.queue_position,
            d.server_version,
            d.reasoning_tokens,
            d.reasoning_tokens_estimated,
            d.reasoning_ms,
            d.slowdown
                .as_ref()
                .and_then(|s| serde_json::to_string(s).ok()),
            non_empty(d.response_model.as_deref()),
            d.slow_after_ms,
            d.slow_after_usual_ms,
            d.failure.as_ref().map(|f| f.kind.as_str()),
            d.failure.as_ref().map(|f| f.after_tokens),
            d.failure.as_ref().and_then(|f| f.message.as_deref()),
            d.stalls,
            d.stalled_ms,
            d.longest_stall_ms,
            d.longest_stall_after_token,
            d.output_tokens_per_second_excluding_stalls,
        ])?;
    }
    Ok(())
}

/// The call's start in unix ms, the column history filters and retention
/// sort by.
fn started_at_ms(c: &Call) -> u64 {
    rfc3339_to_ms(&c.identity.started_at).unwrap_or_else(|| {
        // The engine always writes a valid time; if one ever isn't, keep
        // the call (sorted as the oldest, so retention drops it first)
        // rather than fail the whole batch.
        tracing::warn!(
            id = %c.identity.id,
            "stored call has an unreadable started_at {:?}; stored as 1970",
            c.identity.started_at
        );
        0
    })
}

fn non_empty(s: Option<&str>) -> Option<&str> {
    s.filter(|s| !s.is_empty())
}

/// Reads a row selected with [`COLUMNS`].
pub(crate) fn from_row(row: &Row<'_>) -> rusqlite::Result<Call> {
    let speed = snapshot_from_row(row)?;
    let breakdown = breakdown_from_row(row)?;
    Ok(Call {
        identity: CallIdentity {
            id: row.get(0)?,
            started_at: row.get(1)?,
            route: row.get(3)?,
            api: enum_from(row.get::<_, String>(4)?, 4)?,
            model: row.get(5)?,
            demo: false,
        },
        status: enum_from(row.get::<_, String>(7)?, 7)?,
        http_status: row.get(8)?,
        speed,
        input_tokens: row.get(18)?,
        details: details_from_row(row, breakdown)?,
    })
}

/// The final snapshot, stored exactly when `phase` is set.
fn snapshot_from_row(row: &Row<'_>) -> rusqlite::Result<Option<Snapshot>> {
    let phase: Option<String> = row.get(11)?;
    Ok(match phase {
        None => None,
        Some(phase) => Some(Snapshot {
            stalled_ms: None,
            phase: enum_from(phase, 11)?,
            is_final: row.get(12)?,
            elapsed_ms: row.get(13)?,
            time_to_first_token_ms: row.get(14)?,
            output_tokens: row.get(15)?,
            output_tokens_per_second: row.get(16)?,
            token_source: enum_from(row.get::<_, String>(17)?, 17)?,
            wait: None,
        }),
    })
}

/// The TTFT breakdown's six columns (all null: the default).
fn breakdown_from_row(row: &Row<'_>) -> rusqlite::Result<TtftBreakdown> {
    Ok(TtftBreakdown {
        load_ms: row.get(19)?,
        prefill_ms: row.get(20)?,
        prefill_tokens: row.get(21)?,
        cached_tokens: row.get(22)?,
        prefill_tokens_per_second: row.get(23)?,
        other_ms: row.get(24)?,
    })
}

/// The call's details, from `client`, `settled_at` and the columns after
/// the breakdown.
fn details_from_row(row: &Row<'_>, breakdown: TtftBreakdown) -> rusqlite::Result<CallDetails> {
    Ok(CallDetails {
        slow_after_ms: row.get(56)?,
        slow_after_usual_ms: row.get(57)?,
        client: row.get(6)?,
        ttft_breakdown: (breakdown != TtftBreakdown::default()).then_some(breakdown),
        one_burst: row.get(25)?,
        unstreamed_reasoning: row.get(26)?,
        settled_at: row.get(9)?,
        seen_by: enum_from(row.get::<_, String>(27)?, 27)?,
        capture_gap: row.get(28)?,
        wait: wait_from_row(row)?,
        prompt_truncated: match (row.get(35)?, row.get(36)?) {
            (Some(request_tokens), Some(server_tokens)) => Some(PromptTruncation {
                request_tokens,
                server_tokens,
                context_size: row.get(37)?,
            }),
            _ => None,
        },
        context: row.get::<_, Option<u64>>(39)?.map(|used| ContextUse {
            size: row.get(38).ok().flatten(),
            used,
        }),
        draft: match (row.get(40)?, row.get(41)?) {
            (Some(drafted), Some(accepted)) => Some(DraftCounts { drafted, accepted }),
            _ => None,
        },
        placement: row
            .get::<_, Option<String>>(42)?
            .map(|p| enum_from(p, 42))
            .transpose()?,
        model_bytes: row.get(43)?,
        vram_bytes: row.get(44)?,
        start: row
            .get::<_, Option<String>>(45)?
            .map(|p| enum_from(p, 45))
            .transpose()?,
        error: row.get(46)?,
        prompt_tokens_estimated: row.get(47)?,
        queued_ms: row.get(48)?,
        queue_position: row.get(49)?,
        // Legs of a relay are never stored.
        relay: None,
        server_version: row.get(50)?,
        reasoning_tokens: row.get(51)?,
        reasoning_tokens_estimated: row.get(52)?,
        reasoning_ms: row.get(53)?,
        slowdown: row
            .get::<_, Option<String>>(54)?
            .map(|json| json_from(&json, 54))
            .transpose()?,
        response_model: row.get(55)?,
        failure: match row.get::<_, Option<String>>(58)? {
            Some(kind) => Some(Failure {
                kind: enum_from(kind, 58)?,
                after_tokens: row.get::<_, Option<u64>>(59)?.unwrap_or(0),
                message: row.get(60)?,
            }),
            None => None,
        },
        stalls: row.get(61)?,
        stalled_ms: row.get(62)?,
        longest_stall_ms: row.get(63)?,
        longest_stall_after_token: row.get(64)?,
        output_tokens_per_second_excluding_stalls: row.get(65)?,
    })
}

/// The wait explanation, stored exactly when `wait_reason` is set.
fn wait_from_row(row: &Row<'_>) -> rusqlite::Result<Option<Wait>> {
    Ok(match row.get::<_, Option<String>>(29)? {
        None => None,
        Some(reason) => Some(Wait {
            reason: enum_from(reason, 29)?,
            position: row.get(30)?,
            progress: row.get(31)?,
            eta_ms: row.get(32)?,
            usual_ms: row.get(33)?,
            prompt_tokens: row.get(34)?,
            silent_ms: None,
            // Live only: not stored.
            progress_source: None,
        }),
    })
}

/// Parses a stored contract spelling (`ok`, `openai_chat`...) with the
/// type's own serde names, so the store can't drift from the contract.
pub(crate) fn enum_from<T: DeserializeOwned>(text: String, column: usize) -> rusqlite::Result<T> {
    serde_json::from_value(serde_json::Value::String(text)).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(column, rusqlite::types::Type::Text, Box::new(e))
    })
}

/// A JSON text column (`slowdown`) read back into its type.
fn json_from<T: DeserializeOwned>(json: &str, column: usize) -> rusqlite::Result<T> {
    serde_json::from_str(json).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(column, rusqlite::types::Type::Text, Box::new(e))
    })
}

/// A time filter as users type it (`since=`, `until=`, `--since`): unix
/// milliseconds (all digits) or an RFC 3339 UTC time.
pub fn parse_time(text: &str) -> Result<u64, StoreError> {
    crate::model::time::parse_time(text).map_err(|_| StoreError::InvalidTime(text.to_owned()))
}

/// Unix ms now (for `updated_at` columns; never used in a metric).
pub(crate) fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::time::ms_to_rfc3339;

    #[test]
    fn rfc3339_round_trips_through_unix_ms() {
        assert_eq!(rfc3339_to_ms("1970-01-01T00:00:01.500Z"), Some(1500));
        let ms = rfc3339_to_ms("2026-11-30T10:42:07.123Z").unwrap();
        assert_eq!(ms_to_rfc3339(ms), "2026-11-30T10:42:07.123Z");
        assert_eq!(rfc3339_to_ms("2026-11-30 10:42:07"), Some(ms - 123));
        assert_eq!(rfc3339_to_ms("yesterday"), None);
        assert_eq!(rfc3339_to_ms(""), None);
    }

    #[test]
    fn time_filters_accept_unix_ms_and_rfc3339() {
        assert_eq!(parse_time("1500").unwrap(), 1500);
        assert_eq!(parse_time("1970-01-01T00:00:02Z").unwrap(), 2000);
        let err = parse_time("last week").unwrap_err().to_string();
        assert!(err.contains("\"last week\""), "{err}");
        assert!(parse_time("").is_err());
        assert!(parse_time("99999999999999999999999").is_err());
    }
}
