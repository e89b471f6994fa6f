//! The writer thread: owns the writing [`Store`] so the proxy path never
//! waits on the disk, batches settled calls into few transactions, and tells
//! the engine when each call is durable.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::{DbName, PruneReport, Store, StoreError};
use crate::meter::calibration::CalibrationTable;
use crate::model::Call;

/// How long the first call of a batch waits for company before the batch
/// is committed: bounds both the transactions per second (≤ 20) and how late
/// a call is reported settled.
pub const BATCH_WINDOW: Duration = Duration::from_millis(50);

/// A batch this big is committed at once, without waiting for the window.
pub const BATCH_MAX: usize = 512;

/// After a failed write, how long until the held calls are retried when
/// nothing new arrives to trigger it.
pub const RETRY_INTERVAL: Duration = Duration::from_secs(5);

/// The most calls held in memory while writes fail; beyond it the oldest
/// held calls are dropped (they were already reported `persisted = false`).
/// About 300 bytes each: a few MB at most.
pub const HELD_MAX: usize = 10_000;

/// The engine's callback: the ids of a batch, and whether they are durable
/// (`true`) or could not be written (`false`: the engine settles them
/// anyway; the writer keeps them and retries). Called on the writer thread,
/// exactly once per recorded call, in batches; must not block for long.
pub type OnPersisted = Box<dyn Fn(Vec<String>, bool) + Send>;

/// Counters, for tests, benches and a status line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriterStats {
    /// Transactions committed.
    pub transactions: u64,
    /// Transactions that failed (each was rolled back).
    pub failed_transactions: u64,
    /// Calls written (including held calls written on a retry).
    pub calls_written: u64,
    /// Calls reported `persisted = false`.
    pub calls_reported_unpersisted: u64,
    /// Held calls dropped because more than [`HELD_MAX`] were waiting.
    pub calls_dropped: u64,
}

#[derive(Default)]
struct Counters {
    transactions: AtomicU64,
    failed_transactions: AtomicU64,
    calls_written: AtomicU64,
    calls_reported_unpersisted: AtomicU64,
    calls_dropped: AtomicU64,
}

impl Counters {
    fn snapshot(&self) -> WriterStats {
        WriterStats {
            transactions: self.transactions.load(Ordering::Relaxed),
            failed_transactions: self.failed_transactions.load(Ordering::Relaxed),
            calls_written: self.calls_written.load(Ordering::Relaxed),
            calls_reported_unpersisted: self.calls_reported_unpersisted.load(Ordering::Relaxed),
            calls_dropped: self.calls_dropped.load(Ordering::Relaxed),
        }
    }
}

type StoreJob = Box<dyn FnOnce(&mut Store) + Send>;

/// Nearly every message is a `Call`, so boxing it (clippy's advice for the
/// size gap) would only add an allocation per call.
#[allow(clippy::large_enum_variant)]
enum Msg {
    Call(Call),
    Calibration(CalibrationTable),
    Flush(mpsc::SyncSender<()>),
    WithStore(StoreJob),
    Shutdown,
}

/// Handle to the writer thread. Cheap to share (`Sync`); dropping it (or
/// [`shutdown`](Self::shutdown)) commits what was sent and joins the thread.
pub struct StoreWriter {
    tx: mpsc::Sender<Msg>,
    thread: Option<JoinHandle<()>>,
    counters: Arc<Counters>,
    db: DbName,
    /// Shared with the thread, so a call sent after the thread is gone is
    /// still reported (unpersisted) exactly once.
    report: Reporter,
}

impl std::fmt::Debug for StoreWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreWriter").field("db", &self.db).finish()
    }
}

impl StoreWriter {
    /// Moves `store` to a new thread (`speedtap-store`) that writes what
    /// [`record`](Self::record) and [`save_calibration`](Self::save_calibration)
    /// send, and reports each call through `on_persisted`.
    pub fn spawn(store: Store, on_persisted: OnPersisted) -> StoreWriter {
        let (tx, rx) = mpsc::channel();
        let counters = Arc::new(Counters::default());
        let db = store.name().clone();
        let report = Reporter(Arc::new(Mutex::new(on_persisted)));
        let worker = Worker {
            store,
            report: report.clone(),
            counters: Arc::clone(&counters),
            pending: Vec::new(),
            held: Vec::new(),
            calibration: None,
            deadline: None,
            retry_at: None,
            failing: false,
        };
        let thread = std::thread::Builder::new()
            .name("speedtap-store".into())
            .spawn(move || worker.run(rx))
            .map_err(|e| tracing::warn!("cannot start the history database writer thread: {e}"))
            .ok();
        StoreWriter {
            tx,
            thread,
            counters,
            db,
            report,
        }
    }

    /// Queues a settled call. Never blocks (the channel is unbounded). If
    /// the thread is gone (it could not start), the call is reported
    /// unpersisted right away, so the engine still settles it.
    pub fn record(&self, call: Call) {
        if let Err(mpsc::SendError(Msg::Call(call))) = self.tx.send(Msg::Call(call)) {
            self.counters
                .calls_reported_unpersisted
                .fetch_add(1, Ordering::Relaxed);
            self.report.call(vec![call.identity.id], false);
        }
    }

    /// Queues a calibration snapshot; only the latest unsaved one is written
    /// (in the same transaction as the calls of its batch).
    pub fn save_calibration(&self, table: CalibrationTable) {
        let _ = self.tx.send(Msg::Calibration(table));
    }

    /// Blocks until everything sent before it has been committed (or its
    /// commit has failed and been reported), and `on_persisted` has run for
    /// every call sent before it.
    pub fn flush(&self) {
        let (done_tx, done_rx) = mpsc::sync_channel(1);
        if self.tx.send(Msg::Flush(done_tx)).is_ok() {
            let _ = done_rx.recv();
        }
    }

    /// Runs `job` on the writer thread with the writing store, after
    /// committing what was sent before it, and returns its result: pruning,
    /// checkpoints, test hooks (e.g. [`Store::set_max_page_count`]).
    pub fn with_store<T: Send + 'static>(
        &self,
        job: impl FnOnce(&mut Store) -> T + Send + 'static,
    ) -> Result<T, StoreError> {
        let (done_tx, done_rx) = mpsc::sync_channel(1);
        let job: StoreJob = Box::new(move |store| {
            let _ = done_tx.send(job(store));
        });
        self.tx
            .send(Msg::WithStore(job))
            .map_err(|_| StoreError::WriterStopped {
                db: self.db.clone(),
            })?;
        done_rx.recv().map_err(|_| StoreError::WriterStopped {
            db: self.db.clone(),
        })
    }

    /// [`Store::prune`] on the writer thread.
    pub fn prune(
        &self,
        now_unix_ms: u64,
        retention: Duration,
        max_bytes: u64,
    ) -> Result<PruneReport, StoreError> {
        self.with_store(move |s| s.prune(now_unix_ms, retention, max_bytes))?
    }

    /// The writer's counters so far.
    pub fn stats(&self) -> WriterStats {
        self.counters.snapshot()
    }

    /// Commits what was sent and stops the thread.
    pub fn shutdown(self) {
        drop(self);
    }
}

impl Drop for StoreWriter {
    fn drop(&mut self) {
        let _ = self.tx.send(Msg::Shutdown);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The engine's callback, callable from the thread and from
/// [`StoreWriter::record`].
#[derive(Clone)]
struct Reporter(Arc<Mutex<OnPersisted>>);

impl Reporter {
    /// Runs the callback; a panic in it is logged, not allowed to stop the
    /// writer thread (which would strand every later call).
    fn call(&self, ids: Vec<String>, persisted: bool) {
        let callback = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if catch_unwind(AssertUnwindSafe(|| callback(ids, persisted))).is_err() {
            tracing::error!("history database: the on_persisted callback panicked");
        }
    }
}

/// The thread's state.
struct Worker {
    store: Store,
    report: Reporter,
    counters: Arc<Counters>,
    /// Calls received and not yet tried.
    pending: Vec<Call>,
    /// Calls whose write failed: already reported unpersisted, retried with
    /// every later write.
    held: Vec<Call>,
    /// The latest calibration snapshot not yet written.
    calibration: Option<CalibrationTable>,
    /// When the current batch must be committed.
    deadline: Option<Instant>,
    /// When to retry held data if nothing else triggers a write.
    retry_at: Option<Instant>,
    /// Writes are failing (warned once per episode).
    failing: bool,
}

impl Worker {
    fn run(mut self, rx: mpsc::Receiver<Msg>) {
        loop {
            let wake = match (self.deadline, self.retry_at) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let msg = match wake {
                None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
                Some(at) => rx.recv_timeout(at.saturating_duration_since(Instant::now())),
            };
            match msg {
                Ok(Msg::Call(call)) => {
                    self.pending.push(call);
                    self.deadline
                        .get_or_insert_with(|| Instant::now() + BATCH_WINDOW);
                    if self.pending.len() >= BATCH_MAX {
                        self.commit();
                    }
                }
                Ok(Msg::Calibration(table)) => {
                    self.calibration = Some(table);
                    self.deadline
                        .get_or_insert_with(|| Instant::now() + BATCH_WINDOW);
                }
                Ok(Msg::Flush(done)) => {
                    self.commit();
                    let _ = done.send(());
                }
                Ok(Msg::WithStore(job)) => {
                    self.commit();
                    let store = &mut self.store;
                    if catch_unwind(AssertUnwindSafe(|| job(store))).is_err() {
                        tracing::error!("history database {}: a store job panicked", self.db());
                    }
                }
                Err(RecvTimeoutError::Timeout) => self.commit(),
                Ok(Msg::Shutdown) | Err(RecvTimeoutError::Disconnected) => {
                    self.commit();
                    if !self.held.is_empty() {
                        tracing::warn!(
                            "history database {}: {} calls could not be written and are lost",
                            self.store.name(),
                            self.held.len()
                        );
                    }
                    return;
                }
            }
        }
    }

    /// Writes held calls, pending calls and the pending calibration in one
    /// transaction, then reports the pending calls.
    fn commit(&mut self) {
        self.deadline = None;
        self.retry_at = None;
        if self.pending.is_empty() && self.held.is_empty() && self.calibration.is_none() {
            return;
        }
        let result = self.write();
        let ids: Vec<String> = self.pending.iter().map(|c| c.identity.id.clone()).collect();
        match result {
            Ok(()) => {
                let written = (self.held.len() + self.pending.len()) as u64;
                self.counters.transactions.fetch_add(1, Ordering::Relaxed);
                self.counters
                    .calls_written
                    .fetch_add(written, Ordering::Relaxed);
                if self.failing {
                    tracing::info!(
                        "history database {}: writes work again; {} held calls written",
                        self.store.name(),
                        self.held.len()
                    );
                    self.failing = false;
                }
                self.held.clear();
                self.pending.clear();
                self.calibration = None;
                if !ids.is_empty() {
                    self.report.call(ids, true);
                }
            }
            Err(err) => {
                self.counters
                    .failed_transactions
                    .fetch_add(1, Ordering::Relaxed);
                if !self.failing {
                    tracing::warn!(
                        "cannot write to the history database: {err}; calls are kept in \
                         memory (up to {HELD_MAX}) and retried"
                    );
                    self.failing = true;
                } else {
                    tracing::debug!("history database write failed again: {err}");
                }
                self.held.append(&mut self.pending);
                let excess = self.held.len().saturating_sub(HELD_MAX);
                if excess > 0 {
                    self.held.drain(..excess);
                    self.counters
                        .calls_dropped
                        .fetch_add(excess as u64, Ordering::Relaxed);
                }
                self.retry_at = Some(Instant::now() + RETRY_INTERVAL);
                if !ids.is_empty() {
                    self.counters
                        .calls_reported_unpersisted
                        .fetch_add(ids.len() as u64, Ordering::Relaxed);
                    self.report.call(ids, false);
                }
            }
        }
    }

    fn db(&self) -> &DbName {
        self.store.name()
    }

    fn write(&mut self) -> Result<(), StoreError> {
        let db = self.store.db.clone();
        let err = |what: &str| {
            let db = db.clone();
            let what = what.to_owned();
            move |source| StoreError::Sqlite { db, what, source }
        };
        let tx = self
            .store
            .conn
            .transaction()
            .map_err(err("cannot begin a transaction"))?;
        super::record::insert_calls(&tx, &self.held).map_err(err("cannot store calls"))?;
        super::record::insert_calls(&tx, &self.pending).map_err(err("cannot store calls"))?;
        if let Some(table) = &self.calibration {
            super::calibration::save(&tx, table, std::time::SystemTime::now())
                .map_err(err("cannot save the calibration table"))?;
        }
        tx.commit().map_err(err("cannot commit"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ApiKind;
    use crate::model::{CallIdentity, CallStatus};

    fn call(id: &str) -> Call {
        Call {
            identity: CallIdentity {
                id: id.into(),
                route: "r".into(),
                api: ApiKind::OpenaiChat,
                model: None,
                started_at: "2026-11-30T10:42:07.123Z".into(),
                demo: false,
            },
            status: CallStatus::Ok,
            http_status: Some(200),
            speed: None,
            input_tokens: None,
            details: Default::default(),
        }
    }

    #[test]
    fn the_handle_can_be_shared_between_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<StoreWriter>();
    }

    #[test]
    fn a_panicking_callback_does_not_stop_the_writer() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&seen);
        let writer = StoreWriter::spawn(
            Store::open_in_memory().unwrap(),
            Box::new(move |ids, persisted| {
                let first = ids[0] == "a";
                sink.lock()
                    .unwrap()
                    .extend(ids.into_iter().map(|id| (id, persisted)));
                assert!(!first, "the engine's callback blew up");
            }),
        );
        writer.record(call("a"));
        writer.flush();
        writer.record(call("b"));
        writer.flush();
        let count = writer.with_store(|s| s.count_calls().unwrap()).unwrap();
        assert_eq!(count, 2);
        assert_eq!(
            *seen.lock().unwrap(),
            vec![("a".to_owned(), true), ("b".to_owned(), true)]
        );
    }

    #[test]
    fn a_panicking_job_does_not_stop_the_writer() {
        let writer = StoreWriter::spawn(Store::open_in_memory().unwrap(), Box::new(|_, _| {}));
        let failed = writer.with_store(|_| -> u64 { panic!("job blew up") });
        assert!(matches!(failed, Err(StoreError::WriterStopped { .. })));
        writer.record(call("a"));
        assert_eq!(writer.with_store(|s| s.count_calls().unwrap()).unwrap(), 1);
    }
}
