//! The embedded store: every settled call and the route calibration table,
//! in one SQLite file (`--db`), so history, per-model comparison and export
//! survive restarts (`docs/api.md`, "GET /api/v1/history").
//!
//! # Pieces
//! - [`Store`]: one SQLite connection; opening runs the [`schema`]
//!   migrations. Writes ([`Store::insert_calls`], [`Store::save_calibration`],
//!   [`Store::prune`]) and reads ([`Store::history`], [`Store::models`],
//!   [`export::export`], [`Store::load_normals`],
//!   [`Store::load_decode_usuals`]).
//! - [`StoreWriter`]: the thread that owns the writing `Store`, so the proxy
//!   path never touches the disk: calls are batched into one transaction per
//!   [`writer::BATCH_WINDOW`] or [`writer::BATCH_MAX`] calls, and reported
//!   back once durable.
//! - Readers (the control API, `speedtap export`) open their own `Store` on
//!   the same path: WAL lets them read while the writer commits.
//!
//! # Durability
//! WAL with `synchronous = FULL`: every committed transaction is fsynced to
//! the WAL before the commit returns, so a call reported persisted survives a
//! `kill -9` of the process *and* a power cut or OS crash. `NORMAL` would
//! survive the process crash too (the WAL write reaches the OS before the
//! commit returns) but could lose the last commits on power loss; batching
//! makes the fsync cheap (one per batch, at most ~20 a second), so FULL costs
//! little. `benches/store.rs` measures the throughput.
//!
//! # Privacy
//! Never any prompt or completion text, never headers: the only strings that
//! come from a request are the model name and the client name the engine
//! derived from the User-Agent. The file is created mode 0600 (its `-wal` and
//! `-shm` files inherit that mode from it) in a directory created 0700.

mod calibration;
pub mod decode_usuals;
pub mod export;
pub mod normals;
mod prune;
mod query;
mod record;
pub mod schema;
pub mod writer;

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

use crate::meter::calibration::CalibrationTable;
use crate::meter::normals::Normals;
use crate::meter::slowdown::DecodeUsuals;
use crate::model::Call;

pub use export::{export, parse_export};
pub use prune::PruneReport;
pub use record::parse_time;
pub use writer::{OnPersisted, StoreWriter, WriterStats};

/// How long a connection waits for another one's lock before giving up
/// (readers and the writer share the file; a checkpoint briefly locks it).
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The WAL is truncated back to this size after a checkpoint, so one burst
/// of writes doesn't leave a large `-wal` file behind forever.
pub const JOURNAL_SIZE_LIMIT: u64 = 8 * 1024 * 1024;

/// Everything that can go wrong with the store. Every message names the
/// database file it is about.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot create the directory {} for the history database: {source}", dir.display())]
    CreateDir { dir: PathBuf, source: io::Error },
    #[error("cannot create the history database {}: {source}", path.display())]
    CreateFile { path: PathBuf, source: io::Error },
    /// [`Store::open_existing`] found no file: nothing was ever stored there.
    #[error(
        "no history database at {}: nothing has been recorded there (speedtap run stores \
         calls in it unless --no-db is given)",
        path.display()
    )]
    Missing { path: PathBuf },
    #[error("history database {db}: {what}: {source}")]
    Sqlite {
        db: DbName,
        what: String,
        source: rusqlite::Error,
    },
    #[error(
        "the history database {db} has schema version {found}, newer than this speedtap \
         understands ({supported}): upgrade speedtap or point --db at another file"
    )]
    TooNew {
        db: DbName,
        found: i64,
        supported: i64,
    },
    #[error("history database {db}: {message}")]
    Unsupported { db: DbName, message: String },
    #[error("history database {db}: a stored call is unreadable: {message}")]
    Corrupt { db: DbName, message: String },
    #[error("cannot write the export: {0}")]
    ExportWrite(#[source] io::Error),
    #[error("cannot read the export, line {line}: {message}")]
    ExportParse { line: u64, message: String },
    #[error(
        "invalid time {0:?}: expected unix milliseconds or an RFC 3339 UTC time such as \
         2026-11-30T10:42:07Z"
    )]
    InvalidTime(String),
    #[error("the writer thread of the history database {db} has stopped")]
    WriterStopped { db: DbName },
}

/// The file a [`Store`] works on, for messages: its path, or `:memory:`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DbName(String);

impl fmt::Display for DbName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One SQLite connection on the store's file. Not `Sync`: one thread uses a
/// `Store` at a time (the [`StoreWriter`] thread, or a reader behind a
/// mutex); several `Store`s may be open on one file.
pub struct Store {
    conn: Connection,
    db: DbName,
    path: Option<PathBuf>,
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store").field("db", &self.db).finish()
    }
}

impl Store {
    /// Opens or creates the database at `path`.
    ///
    /// Creates missing parent directories (mode 0700) and the file itself
    /// (mode 0600) before SQLite opens it, so no byte is ever written to a
    /// file others can read; an existing file keeps the mode it has. Then:
    /// WAL, `synchronous = FULL` (see the module doc), foreign keys on,
    /// [`BUSY_TIMEOUT`], and the [`schema`] migrations.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            create_private_dir(dir).map_err(|source| StoreError::CreateDir {
                dir: dir.to_owned(),
                source,
            })?;
        }
        create_private_file(path).map_err(|source| StoreError::CreateFile {
            path: path.to_owned(),
            source,
        })?;
        let db = DbName(path.display().to_string());
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn =
            Connection::open_with_flags(path, flags).map_err(|source| StoreError::Sqlite {
                db: db.clone(),
                what: "cannot open".into(),
                source,
            })?;
        Store::configure(conn, db, Some(path.to_owned()))
    }

    /// Opens an existing database for reading (`speedtap export`), and
    /// never creates one: a reader pointed at the wrong path must say so
    /// ([`StoreError::Missing`]) rather than leave an empty database behind
    /// that would then "export" nothing.
    ///
    /// The file is opened like [`Store::open`] does, which writes nothing to
    /// a file of the current schema (`tests/export_cli.rs` checks the bytes);
    /// a file of an older schema is migrated first, as the next `speedtap
    /// run` would do anyway (this version's queries need the current
    /// schema). After that the connection is `query_only`: nothing done
    /// through this store writes to the file.
    pub fn open_existing(path: &Path) -> Result<Store, StoreError> {
        match std::fs::metadata(path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(StoreError::Missing {
                    path: path.to_owned(),
                })
            }
            // Anything else (a directory, no permission...) is reported by
            // the open below, in SQLite's words, naming the file.
            _ => {}
        }
        let store = Store::open(path)?;
        store
            .conn
            .pragma_update(None, "query_only", true)
            .map_err(|source| store.db.err("cannot make the connection read-only", source))?;
        Ok(store)
    }

    /// A database in memory, gone when dropped (`--no-db`, tests).
    pub fn open_in_memory() -> Result<Store, StoreError> {
        let db = DbName(":memory:".into());
        let conn = Connection::open_in_memory().map_err(|source| StoreError::Sqlite {
            db: db.clone(),
            what: "cannot open".into(),
            source,
        })?;
        Store::configure(conn, db, None)
    }

    fn configure(
        mut conn: Connection,
        db: DbName,
        path: Option<PathBuf>,
    ) -> Result<Store, StoreError> {
        let sqlite = |what: &str| {
            let db = db.clone();
            let what = what.to_owned();
            move |source| StoreError::Sqlite { db, what, source }
        };
        conn.busy_timeout(BUSY_TIMEOUT)
            .map_err(sqlite("cannot set the busy timeout"))?;
        // Refuse a newer file before any pragma below could write to it.
        let found =
            schema::user_version(&conn).map_err(sqlite("cannot read the schema version"))?;
        if found > schema::SCHEMA_VERSION {
            return Err(StoreError::TooNew {
                db,
                found,
                supported: schema::SCHEMA_VERSION,
            });
        }
        // Lets pruning give freed pages back to the file system without a
        // full VACUUM (see `Store::prune`). It only takes on a database that
        // has no table yet, and only before the switch to WAL writes the
        // header. Only set when not already in force: setting it rewrites the
        // header even when the value is unchanged, and a reader
        // ([`Store::open_existing`]) must not write.
        let auto_vacuum: i64 = conn
            .pragma_query_value(None, "auto_vacuum", |row| row.get(0))
            .map_err(sqlite("cannot read auto_vacuum"))?;
        if auto_vacuum != prune::INCREMENTAL {
            conn.pragma_update(None, "auto_vacuum", "INCREMENTAL")
                .map_err(sqlite("cannot set auto_vacuum"))?;
        }
        // Returns the mode now in force: `memory` for an in-memory database,
        // which has no file to journal to.
        let mode: String = conn
            .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))
            .map_err(sqlite("cannot switch to WAL"))?;
        if path.is_some() && !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::Unsupported {
                db,
                message: format!(
                    "SQLite can't use WAL here (journal mode is {mode}); is the file on a \
                     network file system?"
                ),
            });
        }
        conn.execute_batch(&format!(
            "PRAGMA synchronous = FULL;
             PRAGMA foreign_keys = ON;
             PRAGMA journal_size_limit = {JOURNAL_SIZE_LIMIT};"
        ))
        .map_err(sqlite("cannot configure the connection"))?;
        schema::migrate(&mut conn).map_err(|e| match e {
            schema::MigrateError::TooNew { found } => StoreError::TooNew {
                db: db.clone(),
                found,
                supported: schema::SCHEMA_VERSION,
            },
            schema::MigrateError::Sqlite { step, source } => StoreError::Sqlite {
                db: db.clone(),
                what: step,
                source,
            },
        })?;
        Ok(Store { conn, db, path })
    }

    /// The file this store works on (`None` in memory).
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The file's name for messages (its path, or `:memory:`).
    pub fn name(&self) -> &DbName {
        &self.db
    }

    /// Stores settled calls in one transaction: all or none.
    ///
    /// Idempotent: a call already stored (same `id` and `started_at`) is
    /// left as it is, so retrying a batch never duplicates. Normalised on the
    /// way in: an empty model or client name is stored as absent, and a TTFT
    /// breakdown in which nothing was reported as no breakdown.
    pub fn insert_calls(&mut self, calls: &[Call]) -> Result<(), StoreError> {
        let tx = self
            .conn
            .transaction()
            .map_err(|source| self.db.err("cannot begin a transaction", source))?;
        record::insert_calls(&tx, calls)
            .map_err(|source| self.db.err("cannot store calls", source))?;
        tx.commit()
            .map_err(|source| self.db.err("cannot commit stored calls", source))
    }

    /// Replaces the stored calibration table with `table`: one row per
    /// (route, model); a row's `updated_at` moves only when its factor or
    /// observation count changed.
    pub fn save_calibration(&mut self, table: &CalibrationTable) -> Result<(), StoreError> {
        let tx = self
            .conn
            .transaction()
            .map_err(|source| self.db.err("cannot begin a transaction", source))?;
        calibration::save(&tx, table, std::time::SystemTime::now())
            .map_err(|source| self.db.err("cannot save the calibration table", source))?;
        tx.commit()
            .map_err(|source| self.db.err("cannot commit the calibration table", source))
    }

    /// The stored calibration table (empty when nothing was learned yet).
    /// Corrupt factors (outside the drift band) are dropped, as
    /// [`CalibrationTable::insert`](crate::meter::calibration::CalibrationTable::insert) does.
    pub fn load_calibration(&self) -> Result<CalibrationTable, StoreError> {
        calibration::load(&self.conn)
            .map_err(|source| self.db.err("cannot load the calibration table", source))
    }

    /// Each route and model's normal, rebuilt from the stored calls
    /// ([`normals`]), so the slow rule and the waits' usual times survive
    /// a restart.
    pub fn load_normals(&self) -> Result<Normals, StoreError> {
        normals::load(&self.conn)
            .map_err(|source| self.db.err("cannot rebuild the routes' normals", source))
    }

    /// Each route's usual decode rates, rebuilt from the stored calls
    /// ([`decode_usuals`]), so the slowdown rule judges the first calls
    /// after a restart.
    pub fn load_decode_usuals(&self) -> Result<DecodeUsuals, StoreError> {
        decode_usuals::load(&self.conn)
            .map_err(|source| self.db.err("cannot rebuild the usual decode rates", source))
    }

    /// How many calls are stored.
    pub fn count_calls(&self) -> Result<u64, StoreError> {
        self.conn
            .query_row("SELECT count(*) FROM calls", [], |r| r.get(0))
            .map_err(|source| self.db.err("cannot count calls", source))
    }

    /// Sets SQLite's `max_page_count` for this connection: a hard ceiling on
    /// the file's size in pages, past which writes fail exactly as on a full
    /// disk (`SQLITE_FULL`). `u64::MAX` (clamped by SQLite) lifts it. Tests
    /// use it to exercise the disk-full path, which works even as root.
    pub fn set_max_page_count(&mut self, pages: u64) -> Result<u64, StoreError> {
        let pages = i64::try_from(pages).unwrap_or(i64::MAX);
        self.conn
            .pragma_update_and_check(None, "max_page_count", pages, |r| r.get(0))
            .map_err(|source| self.db.err("cannot set max_page_count", source))
    }

    /// The database's size in pages right now.
    pub fn page_count(&self) -> Result<u64, StoreError> {
        self.conn
            .pragma_query_value(None, "page_count", |r| r.get(0))
            .map_err(|source| self.db.err("cannot read page_count", source))
    }
}

impl DbName {
    fn err(&self, what: &str, source: rusqlite::Error) -> StoreError {
        StoreError::Sqlite {
            db: self.clone(),
            what: what.to_owned(),
            source,
        }
    }
}

/// `mkdir -p` with mode 0700 for the directories it creates (the data dir
/// holds nothing but speedtap's own files).
fn create_private_dir(dir: &Path) -> io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(0o700);
    }
    builder.create(dir)
}

/// Creates the (empty) database file with mode 0600 unless it exists.
/// SQLite would create it with 0644 & !umask, and its `-wal` and `-shm`
/// files copy the main file's mode, so this is what keeps all three private.
fn create_private_file(path: &Path) -> io::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    match options.open(path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}
