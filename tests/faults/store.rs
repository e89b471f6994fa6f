//! A history database that can't be written: calls are still proxied byte
//! for byte and settle in memory (`ok`, listed by the API), the writer says
//! so in one warning, and nothing crashes.
//!
//! How the faults are made, in process and without root:
//! - disk full: SQLite's `max_page_count` set to the pages the file has, so
//!   the next write that needs a page fails with `SQLITE_FULL`, the error
//!   SQLite returns on a full disk.
//! - read-only: the engine's writer gets a `query_only` connection to an
//!   existing file ([`Store::open_existing`]), so every write fails with
//!   `SQLITE_READONLY`, the error of a read-only file or file system. (A
//!   real read-only remount can't be made under an open database: the
//!   kernel refuses to remount a file system with files open for writing,
//!   and `chmod` doesn't stop descriptors already open, nor root.)
//!
//! The writer's path is the same whatever the error: calls are reported
//! unpersisted, the supervisor settles them in memory, the writer warns
//! once per failing episode and retries.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use speedtap::host::{Engine, EngineOptions, RunningEngine};
use speedtap::model::CallStatus;
use speedtap::model::RouteSpec;
use speedtap::store::Store;

use crate::quiescent;
use crate::wire::{chat_events, whole_chat_call, RawUpstream, SSE_HEAD};

/// Everything this binary logs at WARN and above (the whole process: the
/// writer warns from its own thread).
fn warnings() -> Arc<Mutex<Vec<u8>>> {
    static LOG: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOG.get_or_init(|| {
        let log = Arc::new(Mutex::new(Vec::new()));
        let sink = log.clone();
        let _ = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_ansi(false)
            .with_writer(move || Sink(sink.clone()))
            .try_init();
        log
    })
    .clone()
}

struct Sink(Arc<Mutex<Vec<u8>>>);

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// How many times the writer has warned that it can't write.
fn write_warnings() -> usize {
    let log = warnings();
    let text = String::from_utf8_lossy(&log.lock().unwrap()).into_owned();
    text.matches("cannot write to the history database").count()
}

/// A fresh, empty scratch directory for one test.
fn scratch(name: &str) -> PathBuf {
    crate::util::process::scratch("faults", name)
}

async fn engine_on(store: Store, upstream: &str, dir: &Path) -> RunningEngine {
    let route = RouteSpec::new("t", "127.0.0.1:0", upstream).unwrap();
    let mut options = EngineOptions::new(vec![route]);
    options.estimator = Arc::new(speedtap::tokens::WordCounter);
    options.config_path = Some(dir.join("speedtap.toml"));
    options.store = Some(store);
    Engine::start(options).await.unwrap()
}

async fn upstream() -> RawUpstream {
    RawUpstream::start(|mut c| async move {
        while let Some(req) = c.head().await {
            let _ = c.body(&req).await;
            let _ = c.write(SSE_HEAD).await;
            for e in chat_events(20) {
                let _ = c.chunk(&e).await;
            }
            let _ = c.write(b"0\r\n\r\n").await;
        }
    })
    .await
}

/// Sends `n` calls; each must arrive byte-exact. Then all must settle `ok`.
async fn calls_still_work(engine: &RunningEngine, n: usize) {
    let addr = engine.routes[0].listen;
    for _ in 0..n {
        whole_chat_call(addr, 20).await;
    }
    let calls = quiescent(engine, n).await;
    assert!(
        calls.iter().all(|c| c.status == CallStatus::Ok),
        "{calls:#?}"
    );
}

/// Waits (bounded) until the writer has warned `n` times in all.
async fn warned(n: usize) {
    let deadline = tokio::time::Instant::now() + crate::SETTLE;
    while write_warnings() < n {
        assert!(tokio::time::Instant::now() < deadline, "no warning");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_or_read_only_store_never_stops_calls() {
    warnings();
    let up = upstream().await;

    // Disk full.
    let dir = scratch("disk_full");
    let mut store = Store::open(&dir.join("speedtap.sqlite3")).unwrap();
    let pages = store.page_count().unwrap();
    store.set_max_page_count(pages).unwrap();
    let engine = engine_on(store, &up.url(), &dir).await;
    // Enough calls that the file must grow past its first pages.
    calls_still_work(&engine, 60).await;
    warned(1).await;
    calls_still_work(&engine, 5).await;
    assert_eq!(write_warnings(), 1, "one warning per failing episode");
    engine.shutdown(Duration::from_secs(1)).await;

    // Read-only.
    let dir = scratch("read_only");
    let path = dir.join("speedtap.sqlite3");
    drop(Store::open(&path).unwrap());
    let store = Store::open_existing(&path).unwrap();
    let engine = engine_on(store, &up.url(), &dir).await;
    calls_still_work(&engine, 20).await;
    warned(2).await;
    calls_still_work(&engine, 5).await;
    assert_eq!(write_warnings(), 2, "one warning for the read-only episode");
    engine.shutdown(Duration::from_secs(1)).await;
}
