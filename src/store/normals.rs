//! Each route's normal (`meter::normals`), rebuilt from the stored calls
//! at start, so "slow for this route and model" and the waits' "usually
//! 4.0 s" survive a restart instead of starting again from the fixed
//! threshold.
//!
//! Nothing new is stored: the normal is a decayed fit over the calls that
//! settled well, and every input it learns from is a column of `calls`
//! already. The newest [`REPLAYED_PER_MODEL`] such calls of each (route,
//! model) are replayed, oldest first, exactly as the call actors taught
//! them live. One input is not stored: the raw (uncalibrated) prompt
//! estimate, which the prompt calibration factor learns from; that factor
//! starts again at 1 and is relearned from the first call that reports
//! its prompt count.

use rusqlite::Connection;

use crate::meter::normals::{Normals, Observation};
use crate::model::StartKind;

/// Calls replayed per (route, model). The normal weighs each older call
/// by 0.8 at every newer one, so the 40th newest weighs 0.8^39, about
/// 0.02%: older ones would change nothing that shows.
pub const REPLAYED_PER_MODEL: u32 = 40;

/// The normals taught by the stored calls: status `ok`, with a model and
/// a time to first token, not flagged `capture_gap` (the same calls the
/// live engine learns from).
pub(crate) fn load(conn: &Connection) -> rusqlite::Result<Normals> {
    let mut stmt = conn.prepare_cached(
        "SELECT route, model, ttft_ms, prefill_tokens, cached_tokens, input_tokens,
                prompt_tokens_estimated, start, load_ms, prefill_ms, queued_ms,
                queue_position
         FROM (
             SELECT *, row_number() OVER (
                 PARTITION BY route, model ORDER BY started_at_ms DESC, pk DESC
             ) AS newest
             FROM calls
             WHERE status = 'ok' AND model IS NOT NULL AND ttft_ms IS NOT NULL
               AND capture_gap = 0
         )
         WHERE newest <= ?1
         ORDER BY started_at_ms, pk",
    )?;
    let mut normals = Normals::new();
    let mut rows = stmt.query([REPLAYED_PER_MODEL])?;
    while let Some(row) = rows.next()? {
        let route: String = row.get(0)?;
        let model: String = row.get(1)?;
        let prefill_tokens: Option<u64> = row.get(3)?;
        let cached: Option<u64> = row.get(4)?;
        let input_tokens: Option<u64> = row.get(5)?;
        let estimated: Option<u64> = row.get(6)?;
        let start: Option<String> = row.get(7)?;
        let prefill_ms: Option<f64> = row.get(9)?;
        // As `CallActor::learn`: the server's whole prompt count
        // (processed plus cached), else its usage count, else the
        // calibrated request estimate.
        let server_prompt = prefill_tokens
            .map(|n| n + cached.unwrap_or(0))
            .or(input_tokens);
        let observation = Observation {
            ttft_ms: row.get(2)?,
            prompt_tokens: server_prompt.or(estimated),
            cold: start.as_deref() == Some(StartKind::Cold.as_str()),
            load_ms: row.get(8)?,
            prefill: prefill_tokens.zip(prefill_ms),
            prompt_estimate: None,
            queued: row
                .get::<_, Option<u64>>(10)?
                .map(|ms| {
                    Ok::<_, rusqlite::Error>((ms, row.get::<_, Option<u32>>(11)?.unwrap_or(0)))
                })
                .transpose()?,
        };
        normals.observe(&route, &model, &observation);
    }
    Ok(normals)
}
