//! Each route's usual decode rates (`meter::slowdown`), rebuilt from the
//! stored calls at start, so a model that got slower right after a restart
//! is still judged against the rate it had before it (`docs/metering.md`,
//! "The slowdown explained").
//!
//! Nothing new is stored: every input the usual learns from is a column
//! of `calls` already (the rate, the model, the server's prompt count for
//! the depth bucket, the server's version, and the call's own judged
//! `slowdown`, which says whether a passing cause kept it from teaching,
//! and its draft counts for the usual draft acceptance).
//! The newest [`REPLAYED_PER_MODEL`] such calls of each (route, model) are
//! replayed, oldest first, exactly as the call actors taught them live.

use rusqlite::Connection;

use crate::meter::slowdown::{draft_acceptance, DecodeCall, DecodeUsuals};
use crate::model::Slowdown;

/// Calls replayed per (route, model): enough for every depth bucket's
/// usual and a version switch-over in progress; the usual weighs each
/// older call by 0.8 at every newer one, so older ones change nothing
/// that shows.
pub const REPLAYED_PER_MODEL: u32 = 80;

/// The usuals taught by the stored calls: status `ok`, with a model and a
/// settled rate, not flagged `capture_gap` (the calls the live engine
/// judges; relay legs and the demo's calls are never stored).
pub(crate) fn load(conn: &Connection) -> rusqlite::Result<DecodeUsuals> {
    let mut stmt = conn.prepare_cached(
        "SELECT route, model, output_tokens_per_second, prefill_tokens, cached_tokens,
                input_tokens, server_version, slowdown, draft_n, draft_accepted
         FROM (
             SELECT *, row_number() OVER (
                 PARTITION BY route, model ORDER BY started_at_ms DESC, pk DESC
             ) AS newest
             FROM calls
             WHERE status = 'ok' AND model IS NOT NULL
               AND output_tokens_per_second IS NOT NULL AND capture_gap = 0
         )
         WHERE newest <= ?1
         ORDER BY started_at_ms, pk",
    )?;
    let mut usuals = DecodeUsuals::new();
    let mut rows = stmt.query([REPLAYED_PER_MODEL])?;
    while let Some(row) = rows.next()? {
        let route: String = row.get(0)?;
        let model: String = row.get(1)?;
        let prefill_tokens: Option<u64> = row.get(3)?;
        let cached: Option<u64> = row.get(4)?;
        let input_tokens: Option<u64> = row.get(5)?;
        let version: Option<String> = row.get(6)?;
        // A slowdown that can't be read teaches as none would.
        let judged: Option<Slowdown> = row
            .get::<_, Option<String>>(7)?
            .and_then(|json| serde_json::from_str(&json).ok());
        // As `CallActor::ending`: the server's whole prompt count
        // (processed plus cached), else its usage count.
        let depth = prefill_tokens
            .map(|n| n + cached.unwrap_or(0))
            .or(input_tokens);
        let call = DecodeCall {
            route: &route,
            model: &model,
            depth,
            tps: row.get(2)?,
            version: version.as_deref(),
            draft_acceptance: match (row.get::<_, Option<u64>>(8)?, row.get::<_, Option<u64>>(9)?) {
                (Some(drafted), Some(accepted)) => draft_acceptance(drafted, accepted),
                _ => None,
            },
        };
        usuals.learn(&call, judged.as_ref());
    }
    Ok(usuals)
}
