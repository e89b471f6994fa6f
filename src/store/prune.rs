//! Retention and the size cap.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Store, StoreError};

/// The fewest calls one size-cap round deletes, so a cap just above the
/// current size doesn't take one round trip per call.
pub const PRUNE_CHUNK_MIN: u64 = 256;

/// `PRAGMA auto_vacuum` value for INCREMENTAL.
pub(crate) const INCREMENTAL: i64 = 2;

/// What [`Store::prune`] removed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PruneReport {
    /// Calls older than the retention.
    pub by_age: u64,
    /// The oldest calls, deleted to get under the size cap.
    pub by_size: u64,
    /// The database's size (pages × page size) before and after.
    pub bytes_before: u64,
    pub bytes_after: u64,
    /// A full `VACUUM` ran (only on a file without incremental auto-vacuum).
    pub full_vacuum: bool,
}

impl PruneReport {
    /// Calls deleted, for either reason.
    pub fn removed(&self) -> u64 {
        self.by_age + self.by_size
    }
}

/// Page accounting, from SQLite's own pragmas.
struct Pages {
    count: u64,
    free: u64,
    size: u64,
}

impl Pages {
    fn file_bytes(&self) -> u64 {
        self.count * self.size
    }

    /// What the rows and indexes take; free pages are reused before the
    /// file grows, so this is what the cap is compared with.
    fn used_bytes(&self) -> u64 {
        self.count.saturating_sub(self.free) * self.size
    }
}

impl Store {
    fn pages(&self) -> Result<Pages, StoreError> {
        let get = |name: &str| -> Result<u64, StoreError> {
            self.conn
                .pragma_query_value(None, name, |r| r.get(0))
                .map_err(|source| self.db.err("cannot read the database size", source))
        };
        Ok(Pages {
            count: get("page_count")?,
            free: get("freelist_count")?,
            size: get("page_size")?,
        })
    }

    fn delete_oldest(&mut self, n: u64) -> Result<u64, StoreError> {
        let n = i64::try_from(n).unwrap_or(i64::MAX);
        let deleted = self
            .conn
            .execute(
                "DELETE FROM calls WHERE pk IN
                     (SELECT pk FROM calls ORDER BY started_at_ms, pk LIMIT ?1)",
                [n],
            )
            .map_err(|source| self.db.err("cannot delete the oldest calls", source))?;
        Ok(deleted as u64)
    }

    /// Applies retention, then the size cap, then gives the space back.
    ///
    /// 1. Deletes the calls started before `now_unix_ms − retention`.
    /// 2. While the pages in use exceed `max_bytes`, deletes the oldest calls
    ///    in chunks sized from the average row size (at least
    ///    [`PRUNE_CHUNK_MIN`]), until under the cap or empty. The cap is on
    ///    the main file; the WAL beside it stays under
    ///    [`JOURNAL_SIZE_LIMIT`](super::JOURNAL_SIZE_LIMIT) after a checkpoint.
    /// 3. When anything was deleted, `PRAGMA incremental_vacuum` returns the
    ///    freed pages to the file system: [`Store::open`] creates every
    ///    database with `auto_vacuum = INCREMENTAL`, so this replaces a full
    ///    `VACUUM` (no second copy of the file, no long exclusive lock). A
    ///    file created some other way gets one full `VACUUM` (which also
    ///    switches it to incremental) once at least a quarter of its pages
    ///    are free.
    /// 4. A `wal_checkpoint(TRUNCATE)` writes it all into the main file and
    ///    empties the WAL (partial while a reader holds it; the next one
    ///    finishes).
    ///
    /// Each delete is its own transaction, so a crash midway leaves a
    /// consistent, partly pruned file.
    pub fn prune(
        &mut self,
        now_unix_ms: u64,
        retention: Duration,
        max_bytes: u64,
    ) -> Result<PruneReport, StoreError> {
        let before = self.pages()?;
        let mut report = PruneReport {
            bytes_before: before.file_bytes(),
            ..PruneReport::default()
        };
        let retention_ms = u64::try_from(retention.as_millis()).unwrap_or(u64::MAX);
        let cutoff = now_unix_ms.saturating_sub(retention_ms);
        report.by_age = self
            .conn
            .execute(
                "DELETE FROM calls WHERE started_at_ms < ?1",
                [i64::try_from(cutoff).unwrap_or(i64::MAX)],
            )
            .map_err(|source| self.db.err("cannot delete calls past retention", source))?
            as u64;

        loop {
            let pages = self.pages()?;
            let used = pages.used_bytes();
            if used <= max_bytes {
                break;
            }
            let rows = self.count_calls()?;
            if rows == 0 {
                break;
            }
            let per_row = (used / rows).max(1);
            let chunk = (used - max_bytes).div_ceil(per_row).max(PRUNE_CHUNK_MIN);
            let deleted = self.delete_oldest(chunk)?;
            report.by_size += deleted;
            if deleted == 0 {
                break;
            }
        }

        if report.removed() > 0 {
            let auto_vacuum: i64 = self
                .conn
                .pragma_query_value(None, "auto_vacuum", |r| r.get(0))
                .map_err(|source| self.db.err("cannot read auto_vacuum", source))?;
            let pages = self.pages()?;
            let freed = if auto_vacuum == INCREMENTAL {
                self.incremental_vacuum()
            } else if pages.free * 4 >= pages.count {
                report.full_vacuum = true;
                self.conn
                    .execute_batch("PRAGMA auto_vacuum = INCREMENTAL; VACUUM;")
            } else {
                Ok(())
            };
            freed.map_err(|source| self.db.err("cannot free deleted pages", source))?;
        }
        self.checkpoint()?;
        report.bytes_after = self.pages()?.file_bytes();
        Ok(report)
    }

    /// `PRAGMA incremental_vacuum` frees one page per step: it must be
    /// stepped to the end (`execute_batch` steps once).
    fn incremental_vacuum(&self) -> rusqlite::Result<()> {
        let mut stmt = self.conn.prepare("PRAGMA incremental_vacuum")?;
        let mut rows = stmt.query([])?;
        while rows.next()?.is_some() {}
        Ok(())
    }

    /// Writes the WAL into the main file and truncates it. Returns whether
    /// the checkpoint completed (false while a reader still needs old frames;
    /// a later one finishes the job). A no-op in memory.
    pub fn checkpoint(&mut self) -> Result<bool, StoreError> {
        if self.path.is_none() {
            return Ok(true);
        }
        let busy: i64 = self
            .conn
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get(0))
            .map_err(|source| self.db.err("cannot checkpoint the WAL", source))?;
        Ok(busy == 0)
    }
}
