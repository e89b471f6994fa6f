//! Reading calls back: history, per-model aggregates, and the streaming scan
//! exports use.

use rusqlite::types::Value;
use rusqlite::{params_from_iter, Connection};

use super::record::{self, COLUMNS};
use super::{Store, StoreError};
use crate::model::snapshot::round_rate;
use crate::model::{Call, CallStatus, FailureKind, StartKind};
use crate::model::{DepthDoc, DepthPoint, DepthQuery};
use crate::model::{HistoryFilter, ModelSummary};

/// Row order of a scan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Order {
    NewestFirst,
    OldestFirst,
}

/// The WHERE clause (with a leading ` WHERE `, or empty) and its parameters.
fn where_clause(filter: &HistoryFilter) -> (String, Vec<Value>) {
    let mut conds: Vec<&str> = Vec::new();
    let mut args: Vec<Value> = Vec::new();
    let mut text = |column_eq: &'static str, column_null: &'static str, v: &Option<String>| match v
    {
        None => {}
        Some(s) if s.is_empty() => conds.push(column_null),
        Some(s) => {
            conds.push(column_eq);
            args.push(Value::Text(s.clone()));
        }
    };
    text("model = ?", "model IS NULL", &filter.model);
    text("client = ?", "client IS NULL", &filter.client);
    if let Some(route) = &filter.route {
        conds.push("route = ?");
        args.push(Value::Text(route.clone()));
    }
    if let Some(status) = filter.status {
        conds.push("status = ?");
        args.push(Value::Text(status.as_str().to_owned()));
    }
    if let Some(since) = filter.since_ms {
        conds.push("started_at_ms >= ?");
        args.push(Value::Integer(clamp_i64(since)));
    }
    if let Some(until) = filter.until_ms {
        conds.push("started_at_ms < ?");
        args.push(Value::Integer(clamp_i64(until)));
    }
    if conds.is_empty() {
        (String::new(), args)
    } else {
        (format!(" WHERE {}", conds.join(" AND ")), args)
    }
}

fn clamp_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Calls the filter selects, in `order` (ties broken by insertion order),
/// at most `filter.limit` of them, one at a time: exports stream through
/// this without holding the history in memory.
pub(crate) fn for_each_call(
    store: &Store,
    filter: &HistoryFilter,
    order: Order,
    mut each: impl FnMut(Call) -> Result<(), StoreError>,
) -> Result<u64, StoreError> {
    let (where_sql, mut args) = where_clause(filter);
    let dir = match order {
        Order::NewestFirst => "DESC",
        Order::OldestFirst => "ASC",
    };
    let limit = filter
        .limit
        .map_or(-1, |l| i64::try_from(l).unwrap_or(i64::MAX));
    args.push(Value::Integer(limit));
    let sql = format!(
        "SELECT {COLUMNS} FROM calls{where_sql} ORDER BY started_at_ms {dir}, pk {dir} LIMIT ?"
    );
    let err = |source| store.db.err("cannot read the history", source);
    let mut stmt = store.conn.prepare(&sql).map_err(err)?;
    let mut rows = stmt.query(params_from_iter(args)).map_err(err)?;
    let mut n = 0;
    while let Some(row) = rows.next().map_err(err)? {
        let call = record::from_row(row).map_err(|e| StoreError::Corrupt {
            db: store.db.clone(),
            message: e.to_string(),
        })?;
        each(call)?;
        n += 1;
    }
    Ok(n)
}

impl Store {
    /// The calls `filter` selects, newest first (by `started_at`; calls
    /// started in the same millisecond, most recently stored first).
    pub fn history(&self, filter: &HistoryFilter) -> Result<Vec<Call>, StoreError> {
        let mut out = Vec::new();
        for_each_call(self, filter, Order::NewestFirst, |c| {
            out.push(c);
            Ok(())
        })?;
        Ok(out)
    }

    /// Per (model, route) figures over the calls `filter` selects (its
    /// `limit` is ignored), sorted by model, then route. Calls that named no
    /// model form the group with model `""`.
    ///
    /// - `calls`: every selected call, whatever its status;
    /// - the figures are computed over the calls that ended `ok` only (an
    ///   abandoned or failed call's numbers describe the failure, not the
    ///   model): `ttft_ms_*` over those with a TTFT (a non-streamed response
    ///   counts, with TTFT = time to the response, as docs/metering.md
    ///   defines it) that were neither queued nor cold (like with like:
    ///   a queue wait or a load is not the model's speed; cold starts are
    ///   counted apart in `cold_calls` and `cold_ttft_ms_p50`, the calls
    ///   that queued and were not cold in `queued_calls` and
    ///   `queued_ttft_ms_p50`: a call that queued for a load is a cold
    ///   start, so the three groups never share a call), `tps_*` over those
    ///   with a settled decode rate
    ///   (one-burst outputs have none; `tps_p10` is the slow tail),
    ///   `prefill_tps_p50` over those whose server reported a prefill rate
    ///   for a prompt of at least [`MIN_PREFILL_TOKENS`] tokens (a short
    ///   prompt's rate is mostly fixed overhead);
    /// - percentiles use linear interpolation between closest ranks (the
    ///   "R-7" method: numpy's and Excel `PERCENTILE.INC`'s default): sort the
    ///   n values x₀ ≤ … ≤ xₙ₋₁, let h = (n − 1)·p; the percentile is
    ///   x⌊h⌋ + (h − ⌊h⌋)·(x⌊h⌋₊₁ − x⌊h⌋). So p50 is the usual median (the
    ///   mean of the two middle values when n is even), one value is its
    ///   own p50 and p90, and no figure is ever outside the observed range;
    /// - every figure is rounded to one decimal, like the contract's rates;
    /// - `last_seen`: the newest selected call's `started_at`.
    pub fn models(&self, filter: &HistoryFilter) -> Result<Vec<ModelSummary>, StoreError> {
        models(&self.conn, filter).map_err(|source| self.db.err("cannot summarise models", source))
    }

    /// The depth curve of one model: its `ok` calls with a settled rate and
    /// a known context use, oldest first (at most [`MAX_DEPTH_POINTS`], the
    /// newest), with the least-squares line through them.
    pub fn depth(&self, q: &DepthQuery) -> Result<DepthDoc, StoreError> {
        let points = depth_points(&self.conn, q)
            .map_err(|source| self.db.err("cannot read the depth curve", source))?;
        Ok(DepthDoc::fitted(q.model.clone(), points))
    }
}

/// The most points one depth curve carries.
pub const MAX_DEPTH_POINTS: usize = 5_000;

fn depth_points(conn: &rusqlite::Connection, q: &DepthQuery) -> rusqlite::Result<Vec<DepthPoint>> {
    let mut stmt = conn.prepare_cached(
        "SELECT context_used, output_tokens_per_second FROM calls \
         WHERE model = ?1 AND status = 'ok' AND context_used IS NOT NULL \
           AND output_tokens_per_second IS NOT NULL \
           AND (?2 IS NULL OR route = ?2) \
           AND (?3 IS NULL OR started_at_ms >= ?3) \
           AND (?4 IS NULL OR started_at_ms < ?4) \
         ORDER BY started_at_ms DESC, pk DESC LIMIT ?5",
    )?;
    let rows = stmt.query_map(
        rusqlite::params![
            q.model,
            q.route,
            q.since_ms,
            q.until_ms,
            MAX_DEPTH_POINTS as i64
        ],
        |row| {
            Ok(DepthPoint {
                context_tokens: row.get(0)?,
                tokens_per_second: row.get(1)?,
            })
        },
    )?;
    let mut points = rows.collect::<rusqlite::Result<Vec<_>>>()?;
    points.reverse();
    Ok(points)
}

/// The shortest prompt whose prefill rate enters `prefill_tps_p50`: the
/// one the normals learn from.
pub use crate::meter::normals::MIN_PREFILL_TOKENS;

/// The samples of one (model, route) group while scanning.
#[derive(Default)]
struct Group {
    model: String,
    route: String,
    calls: u64,
    ok_calls: u64,
    /// Calls that failed (a client that left is no failure).
    failed_calls: u64,
    /// TTFTs of calls neither queued nor cold.
    ttft: Vec<f64>,
    /// TTFTs of cold starts.
    cold_ttft: Vec<f64>,
    /// Calls that queued and were not cold.
    queued_calls: u64,
    /// TTFTs of those.
    queued_ttft: Vec<f64>,
    tps: Vec<f64>,
    prefill_tps: Vec<f64>,
    /// Reasoning tokens of the calls that reasoned.
    reasoning: Vec<f64>,
    /// Some of those are speedtap's estimates.
    reasoning_estimated: bool,
    last_seen_ms: i64,
    last_seen: String,
}

impl Group {
    fn finish(mut self) -> ModelSummary {
        let pct = |v: &mut Vec<f64>, p: f64| percentile(v, p).map(round_rate);
        ModelSummary {
            ttft_ms_p50: pct(&mut self.ttft, 0.5),
            ttft_ms_p90: pct(&mut self.ttft, 0.9),
            tps_p50: pct(&mut self.tps, 0.5),
            tps_p90: pct(&mut self.tps, 0.9),
            tps_p10: pct(&mut self.tps, 0.1),
            cold_calls: self.cold_ttft.len() as u64,
            cold_ttft_ms_p50: pct(&mut self.cold_ttft, 0.5),
            queued_calls: self.queued_calls,
            queued_ttft_ms_p50: pct(&mut self.queued_ttft, 0.5),
            prefill_tps_p50: pct(&mut self.prefill_tps, 0.5),
            reasoning_calls: self.reasoning.len() as u64,
            reasoning_tokens_p50: pct(&mut self.reasoning, 0.5),
            reasoning_tokens_estimated: self.reasoning_estimated,
            model: self.model,
            route: self.route,
            calls: self.calls,
            ok_calls: self.ok_calls,
            failed_calls: self.failed_calls,
            last_seen: self.last_seen,
        }
    }
}

impl Group {
    /// Sorts one `ok` call's figures into like with like.
    fn take_ok(&mut self, row: &rusqlite::Row<'_>) -> rusqlite::Result<()> {
        let cold = row.get::<_, Option<String>>(8)?.as_deref() == Some(StartKind::Cold.as_str());
        let queued = row.get::<_, Option<i64>>(9)?.is_some();
        if queued && !cold {
            self.queued_calls += 1;
        }
        if let Some(ttft) = row.get::<_, Option<i64>>(3)? {
            match (cold, queued) {
                (true, _) => self.cold_ttft.push(ttft as f64),
                (false, false) => self.ttft.push(ttft as f64),
                (false, true) => self.queued_ttft.push(ttft as f64),
            }
        }
        self.tps
            .extend(row.get::<_, Option<f64>>(4)?.filter(|v| v.is_finite()));
        let long_prompt = row
            .get::<_, Option<i64>>(10)?
            .is_some_and(|n| n >= MIN_PREFILL_TOKENS as i64);
        if long_prompt {
            self.prefill_tps
                .extend(row.get::<_, Option<f64>>(5)?.filter(|v| v.is_finite()));
        }
        if let Some(tokens) = row.get::<_, Option<i64>>(11)?.filter(|n| *n > 0) {
            self.reasoning.push(tokens as f64);
            self.reasoning_estimated |= row.get::<_, i64>(12)? != 0;
        }
        Ok(())
    }
}

fn models(conn: &Connection, filter: &HistoryFilter) -> rusqlite::Result<Vec<ModelSummary>> {
    let (where_sql, args) = where_clause(filter);
    // `coalesce(model, '')` groups model-less calls; the index on
    // (model, started_at_ms) serves the ORDER BY when no other filter does.
    let sql = format!(
        "SELECT coalesce(model, ''), route, status, ttft_ms, output_tokens_per_second,
                prefill_tokens_per_second, started_at_ms, started_at, start, queued_ms,
                prefill_tokens, reasoning_tokens, reasoning_tokens_estimated, failure_kind
         FROM calls{where_sql} ORDER BY coalesce(model, ''), route"
    );
    let mut stmt = conn.prepare(&sql)?;
    let mut rows = stmt.query(params_from_iter(args))?;
    let ok = CallStatus::Ok.as_str();
    let mut out = Vec::new();
    let mut group: Option<Group> = None;
    while let Some(row) = rows.next()? {
        let model: String = row.get(0)?;
        let route: String = row.get(1)?;
        let same = group
            .as_ref()
            .is_some_and(|g| g.model == model && g.route == route);
        if !same {
            out.extend(group.take().map(Group::finish));
            group = Some(Group {
                model,
                route,
                last_seen_ms: i64::MIN,
                ..Group::default()
            });
        }
        let Some(g) = group.as_mut() else { continue };
        g.calls += 1;
        let started_ms: i64 = row.get(6)?;
        if started_ms > g.last_seen_ms {
            g.last_seen_ms = started_ms;
            g.last_seen = row.get(7)?;
        }
        let status = row.get_ref(2)?.as_str()?;
        if failed(status, row.get::<_, Option<String>>(13)?.as_deref()) {
            g.failed_calls += 1;
        }
        if status != ok {
            continue;
        }
        g.ok_calls += 1;
        g.take_ok(row)?;
    }
    out.extend(group.map(Group::finish));
    Ok(out)
}

/// Whether a stored call failed: its failure's kind says so (a client that
/// left did not fail); a row from before failures were kept failed when
/// its status was `upstream_error`.
fn failed(status: &str, failure_kind: Option<&str>) -> bool {
    match failure_kind {
        Some(kind) => kind != FailureKind::ClientLeft.as_str(),
        None => status == CallStatus::UpstreamError.as_str(),
    }
}

/// The `p` quantile (0 ≤ p ≤ 1) of `values` by linear interpolation between
/// closest ranks (R-7, see [`Store::models`]); `None` when empty. Sorts
/// `values` in place.
pub fn percentile(values: &mut [f64], p: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let h = (values.len() - 1) as f64 * p.clamp(0.0, 1.0);
    let lo = h.floor() as usize;
    let hi = (lo + 1).min(values.len() - 1);
    Some(values[lo] + (h - lo as f64) * (values[hi] - values[lo]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_interpolates_between_closest_ranks() {
        assert_eq!(percentile(&mut [], 0.5), None);
        assert_eq!(percentile(&mut [7.0], 0.5), Some(7.0));
        assert_eq!(percentile(&mut [7.0], 0.9), Some(7.0));
        // Even count: the mean of the middle two.
        assert_eq!(percentile(&mut [4.0, 1.0, 3.0, 2.0], 0.5), Some(2.5));
        // n = 5: h = 4 × 0.9 = 3.6 → 40 + 0.6 × (50 − 40) = 46.
        assert_eq!(
            percentile(&mut [50.0, 10.0, 30.0, 20.0, 40.0], 0.9),
            Some(46.0)
        );
        // n = 11 (0..=10): h = 9 exactly → 9.
        let mut v: Vec<f64> = (0..=10).map(f64::from).collect();
        assert_eq!(percentile(&mut v, 0.9), Some(9.0));
        assert_eq!(percentile(&mut v, 0.0), Some(0.0));
        assert_eq!(percentile(&mut v, 1.0), Some(10.0));
    }

    #[test]
    fn where_clause_treats_empty_names_as_absent_ones() {
        let f = HistoryFilter {
            model: Some(String::new()),
            client: Some("curl".into()),
            since_ms: Some(5),
            ..HistoryFilter::default()
        };
        let (sql, args) = where_clause(&f);
        assert_eq!(
            sql,
            " WHERE model IS NULL AND client = ? AND started_at_ms >= ?"
        );
        assert_eq!(args, vec![Value::Text("curl".into()), Value::Integer(5)]);
        assert_eq!(where_clause(&HistoryFilter::default()).0, "");
    }
}
