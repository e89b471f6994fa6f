//! The `calibration` table: one row per (route, model) factor.

use std::collections::BTreeSet;
use std::time::SystemTime;

use rusqlite::{params, Connection, Transaction};

use crate::model::time::ms_to_rfc3339;

use super::record::unix_ms;
use crate::meter::calibration::{CalibrationEntry, CalibrationTable};

/// Makes the table hold exactly `table`'s entries. Rows whose factor and
/// observation count are unchanged keep their `updated_at`, so it tells when
/// a factor last moved; rows the table no longer has are deleted.
pub(crate) fn save(
    tx: &Transaction<'_>,
    table: &CalibrationTable,
    now: SystemTime,
) -> rusqlite::Result<()> {
    let now_ms = unix_ms(now);
    let now_text = ms_to_rfc3339(now_ms);
    let keep: BTreeSet<(String, String)> = table.entries().map(|e| (e.route, e.model)).collect();
    let stored: Vec<(String, String)> = tx
        .prepare_cached("SELECT route, model FROM calibration")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    let mut delete =
        tx.prepare_cached("DELETE FROM calibration WHERE route = ?1 AND model = ?2")?;
    for key in stored.iter().filter(|k| !keep.contains(*k)) {
        delete.execute(params![key.0, key.1])?;
    }
    let mut upsert = tx.prepare_cached(
        "INSERT INTO calibration (route, model, factor, observations, updated_at, updated_at_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)
         ON CONFLICT (route, model) DO UPDATE SET
             factor = excluded.factor,
             observations = excluded.observations,
             updated_at = excluded.updated_at,
             updated_at_ms = excluded.updated_at_ms
         WHERE factor IS NOT excluded.factor OR observations IS NOT excluded.observations",
    )?;
    for e in table.entries() {
        upsert.execute(params![
            e.route,
            e.model,
            e.factor,
            e.observations,
            now_text,
            now_ms
        ])?;
    }
    Ok(())
}

/// The stored table; entries `CalibrationTable::insert` refuses (factors
/// outside the drift band) are dropped.
pub(crate) fn load(conn: &Connection) -> rusqlite::Result<CalibrationTable> {
    let mut stmt = conn.prepare_cached(
        "SELECT route, model, factor, observations FROM calibration ORDER BY route, model",
    )?;
    let entries = stmt
        .query_map([], |row| {
            Ok(CalibrationEntry {
                route: row.get(0)?,
                model: row.get(1)?,
                factor: row.get(2)?,
                observations: row.get(3)?,
            })
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(CalibrationTable::from(entries))
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;
    use crate::store::schema;

    fn db() -> Connection {
        let mut conn = Connection::open_in_memory().unwrap();
        schema::migrate(&mut conn).unwrap();
        conn
    }

    fn updated(conn: &Connection, model: &str) -> u64 {
        conn.query_row(
            "SELECT updated_at_ms FROM calibration WHERE model = ?1",
            [model],
            |r| r.get(0),
        )
        .unwrap()
    }

    #[test]
    fn save_replaces_the_table_and_keeps_unchanged_timestamps() {
        let mut conn = db();
        let t1 = UNIX_EPOCH + Duration::from_secs(1000);
        let t2 = t1 + Duration::from_secs(60);
        let mut table = CalibrationTable::new();
        table.observe("ollama", "a", 1.2);
        table.observe("ollama", "b", 0.9);
        let tx = conn.transaction().unwrap();
        save(&tx, &table, t1).unwrap();
        tx.commit().unwrap();
        assert_eq!(load(&conn).unwrap(), table);

        // b moves, a stays, c is new.
        table.observe("ollama", "b", 1.1);
        table.observe("llama", "c", 1.0);
        let tx = conn.transaction().unwrap();
        save(&tx, &table, t2).unwrap();
        tx.commit().unwrap();
        assert_eq!(load(&conn).unwrap(), table);
        assert_eq!(updated(&conn, "a"), 1_000_000);
        assert_eq!(updated(&conn, "b"), 1_060_000);
        assert_eq!(updated(&conn, "c"), 1_060_000);

        // An emptied table empties the rows.
        let tx = conn.transaction().unwrap();
        save(&tx, &CalibrationTable::new(), t2).unwrap();
        tx.commit().unwrap();
        assert!(load(&conn).unwrap().is_empty());
    }

    #[test]
    fn corrupt_rows_are_dropped_on_load() {
        let conn = db();
        conn.execute_batch(
            "INSERT INTO calibration VALUES ('r', 'ok', 1.3, 4, '', 0);
             INSERT INTO calibration VALUES ('r', 'bad', 40.0, 4, '', 0);",
        )
        .unwrap();
        let t = load(&conn).unwrap();
        assert_eq!(t.len(), 1);
        assert_eq!(t.factor("r", "ok"), 1.3);
        assert_eq!(t.factor("r", "bad"), 1.0);
    }
}
