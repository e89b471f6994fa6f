//! The database schema and its migrations.
//!
//! The schema version lives in SQLite's own `PRAGMA user_version` (0 for a
//! file speedtap never touched). [`MIGRATIONS`]`[i]` takes a database from
//! version `i` to `i + 1`; each runs in its own transaction together with the
//! `user_version` bump, so a crash mid-migration leaves the file at the old
//! version, never half-migrated.
//!
//! Rules for adding a migration:
//! - never edit a migration that has shipped: append a new one (an
//!   `ALTER TABLE`, a new index, a table rebuild...);
//! - the frozen copy of every shipped schema lives in `tests/fixtures/`, and
//!   `tests/store.rs` checks that upgrading it gives exactly the schema a
//!   fresh file gets.
//!
//! What is never stored, by design: prompt or completion text and request
//! or response headers. The only request-derived strings are the model name
//! and the client name (derived from the User-Agent by the engine).

use rusqlite::Connection;

/// Migration 1: the first schema.
///
/// `calls` holds one row per settled call. Times are kept twice: unix ms
/// (`*_ms`, for filters, ordering and retention) and the RFC 3339 string the
/// engine published (returned unchanged). The final snapshot is flattened into
/// columns (all NULL when the call had none, i.e. unmetered), and so is the
/// TTFT breakdown, so aggregates and exports need no JSON. `UNIQUE (id,
/// started_at)` makes inserts idempotent: ids restart at `c-000001` with
/// every engine run, the start time tells runs apart.
pub const MIGRATION_1: &str = "
CREATE TABLE calls (
    pk                        INTEGER PRIMARY KEY,
    id                        TEXT    NOT NULL,
    started_at                TEXT    NOT NULL,
    started_at_ms             INTEGER NOT NULL,
    route                     TEXT    NOT NULL,
    api                       TEXT    NOT NULL,
    model                     TEXT,
    client                    TEXT,
    status                    TEXT    NOT NULL,
    http_status               INTEGER,
    settled_at                TEXT,
    settled_at_ms             INTEGER,
    phase                     TEXT,
    is_final                  INTEGER,
    elapsed_ms                INTEGER,
    ttft_ms                   INTEGER,
    output_tokens             INTEGER,
    output_tokens_per_second  REAL,
    token_source              TEXT,
    input_tokens              INTEGER,
    load_ms                   REAL,
    prefill_ms                REAL,
    prefill_tokens            INTEGER,
    cached_tokens             INTEGER,
    prefill_tokens_per_second REAL,
    other_ms                  REAL,
    one_burst                 INTEGER NOT NULL DEFAULT 0,
    unstreamed_reasoning      INTEGER NOT NULL DEFAULT 0,
    UNIQUE (id, started_at)
);
CREATE INDEX calls_started ON calls (started_at_ms);
CREATE INDEX calls_model   ON calls (model, started_at_ms);
CREATE INDEX calls_route   ON calls (route, started_at_ms);
CREATE INDEX calls_client  ON calls (client, started_at_ms);
CREATE INDEX calls_status  ON calls (status, started_at_ms);

CREATE TABLE calibration (
    route         TEXT    NOT NULL,
    model         TEXT    NOT NULL,
    factor        REAL    NOT NULL,
    observations  INTEGER NOT NULL,
    updated_at    TEXT    NOT NULL,
    updated_at_ms INTEGER NOT NULL,
    PRIMARY KEY (route, model)
) WITHOUT ROWID;
";

/// Migration 2: how each call was seen (`proxy` or `capture`), and the
/// capture's gap flag. Rows from before capture existed were all seen by
/// the proxy, hence the default.
pub const MIGRATION_2: &str = "
ALTER TABLE calls ADD COLUMN seen_by     TEXT    NOT NULL DEFAULT 'proxy';
ALTER TABLE calls ADD COLUMN capture_gap INTEGER NOT NULL DEFAULT 0;
";

/// Migration 3: why each call waited and the facts the server told about
/// it (`docs/api.md`, "Call details"): the last wait explanation before
/// the first token, a cut prompt, context use, speculative decoding
/// counts, where the model ran, cold or warm start, a recognised error
/// cause and the prompt size estimated from the request. All NULL on rows
/// from before: not known.
pub const MIGRATION_3: &str = "
ALTER TABLE calls ADD COLUMN wait_reason              TEXT;
ALTER TABLE calls ADD COLUMN wait_position            INTEGER;
ALTER TABLE calls ADD COLUMN wait_progress            REAL;
ALTER TABLE calls ADD COLUMN wait_eta_ms              INTEGER;
ALTER TABLE calls ADD COLUMN wait_usual_ms            INTEGER;
ALTER TABLE calls ADD COLUMN wait_prompt_tokens       INTEGER;
ALTER TABLE calls ADD COLUMN truncated_request_tokens INTEGER;
ALTER TABLE calls ADD COLUMN truncated_server_tokens  INTEGER;
ALTER TABLE calls ADD COLUMN truncated_context_size   INTEGER;
ALTER TABLE calls ADD COLUMN context_size             INTEGER;
ALTER TABLE calls ADD COLUMN context_used             INTEGER;
ALTER TABLE calls ADD COLUMN draft_n                  INTEGER;
ALTER TABLE calls ADD COLUMN draft_accepted           INTEGER;
ALTER TABLE calls ADD COLUMN placement                TEXT;
ALTER TABLE calls ADD COLUMN model_bytes              INTEGER;
ALTER TABLE calls ADD COLUMN vram_bytes               INTEGER;
ALTER TABLE calls ADD COLUMN start                    TEXT;
ALTER TABLE calls ADD COLUMN error                    TEXT;
ALTER TABLE calls ADD COLUMN prompt_tokens_estimated  INTEGER;
";

/// Migration 4: what each call waited for in the server's queue
/// (`docs/api.md`, "Call details"): the time it was explained queued and
/// the most calls ahead of it. NULL on rows from before: not known.
pub const MIGRATION_4: &str = "
ALTER TABLE calls ADD COLUMN queued_ms      INTEGER;
ALTER TABLE calls ADD COLUMN queue_position INTEGER;
";

/// Migration 5: the server's version with every call, and what a call
/// spent reasoning (`docs/api.md`, "Call details"). NULL on rows from
/// before: not known.
pub const MIGRATION_5: &str = "
ALTER TABLE calls ADD COLUMN server_version             TEXT;
ALTER TABLE calls ADD COLUMN reasoning_tokens           INTEGER;
ALTER TABLE calls ADD COLUMN reasoning_tokens_estimated INTEGER NOT NULL DEFAULT 0;
ALTER TABLE calls ADD COLUMN reasoning_ms               INTEGER;
";

/// Migration 6: a settled call's slowdown against its usual decode rate
/// (`docs/api.md`, "Slowdown"), as its JSON. NULL: not slow, not judged,
/// or a row from before.
pub const MIGRATION_6: &str = "
ALTER TABLE calls ADD COLUMN slowdown TEXT;
";

/// Migration 7: the model the server's answer named (`docs/api.md`,
/// "Call details"). NULL: named none, or a row from before.
pub const MIGRATION_7: &str = "
ALTER TABLE calls ADD COLUMN response_model TEXT;
";

/// Migration 8: the slow-first-token limit a call was held to, and the
/// usual it was learned from (`docs/api.md`, "Call details"). NULL: no
/// limit applied, the fixed one (usual), or a row from before.
pub const MIGRATION_8: &str = "
ALTER TABLE calls ADD COLUMN slow_after_ms       INTEGER;
ALTER TABLE calls ADD COLUMN slow_after_usual_ms INTEGER;
";

/// Migration 9: how a call went wrong and the stalls it had
/// (`docs/api.md`, "Call details": `failure`, `stalls`...). NULL: it
/// ended well, never stalled, or a row from before.
pub const MIGRATION_9: &str = "
ALTER TABLE calls ADD COLUMN failure_kind                 TEXT;
ALTER TABLE calls ADD COLUMN failure_after_tokens         INTEGER;
ALTER TABLE calls ADD COLUMN failure_message              TEXT;
ALTER TABLE calls ADD COLUMN stalls                       INTEGER;
ALTER TABLE calls ADD COLUMN stalled_ms                   INTEGER;
ALTER TABLE calls ADD COLUMN longest_stall_ms             INTEGER;
ALTER TABLE calls ADD COLUMN longest_stall_after_token    INTEGER;
ALTER TABLE calls ADD COLUMN tps_excluding_stalls         REAL;
";

/// Every migration, in order: `MIGRATIONS[i]` upgrades version `i` to `i + 1`.
pub const MIGRATIONS: &[&str] = &[
    MIGRATION_1,
    MIGRATION_2,
    MIGRATION_3,
    MIGRATION_4,
    MIGRATION_5,
    MIGRATION_6,
    MIGRATION_7,
    MIGRATION_8,
    MIGRATION_9,
];

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// What [`migrate`] found wrong.
#[derive(Debug)]
pub enum MigrateError {
    /// The file was written by a newer speedtap.
    TooNew { found: i64 },
    /// SQLite refused a step.
    Sqlite {
        step: String,
        source: rusqlite::Error,
    },
}

/// Brings the database up to [`SCHEMA_VERSION`]; returns the version found.
///
/// A file at a newer version is refused rather than opened: an older
/// speedtap writing rows a newer one doesn't expect could corrupt its data.
pub fn migrate(conn: &mut Connection) -> Result<i64, MigrateError> {
    let found = user_version(conn).map_err(|source| MigrateError::Sqlite {
        step: "reading the schema version".into(),
        source,
    })?;
    if found > SCHEMA_VERSION {
        return Err(MigrateError::TooNew { found });
    }
    for (from, sql) in MIGRATIONS.iter().enumerate().skip(found.max(0) as usize) {
        let to = from as i64 + 1;
        let step = || format!("migrating the schema from version {from} to {to}");
        let tx = conn.transaction().map_err(|source| MigrateError::Sqlite {
            step: step(),
            source,
        })?;
        tx.execute_batch(sql)
            .and_then(|()| tx.pragma_update(None, "user_version", to))
            .and_then(|()| tx.commit())
            .map_err(|source| MigrateError::Sqlite {
                step: step(),
                source,
            })?;
    }
    Ok(found)
}

/// `PRAGMA user_version`.
pub fn user_version(conn: &Connection) -> rusqlite::Result<i64> {
    conn.pragma_query_value(None, "user_version", |row| row.get(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_database_gets_every_migration() {
        let mut conn = Connection::open_in_memory().unwrap();
        assert_eq!(migrate(&mut conn).unwrap(), 0);
        assert_eq!(user_version(&conn).unwrap(), SCHEMA_VERSION);
        // Running it again is a no-op.
        assert_eq!(migrate(&mut conn).unwrap(), SCHEMA_VERSION);
    }

    #[test]
    fn newer_schema_is_refused() {
        let mut conn = Connection::open_in_memory().unwrap();
        conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
            .unwrap();
        assert!(matches!(
            migrate(&mut conn),
            Err(MigrateError::TooNew { found }) if found == SCHEMA_VERSION + 1
        ));
    }
}
