//! The embedded store (the history behind docs/api.md's history endpoints): opening,
//! migrations, history queries, per-model aggregates, calibration, pruning,
//! export round trips, the batching writer, its disk-full path, and crash
//! safety under `kill -9`.

use std::collections::{BTreeSet, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use rusqlite::Connection;
use speedtap::meter::calibration::CalibrationTable;
use speedtap::meter::normals::{Normals, Observation};
use speedtap::model::time::ms_to_rfc3339;
use speedtap::model::ApiKind;
use speedtap::model::{Call, CallDetails, CallIdentity, CallStatus, TtftBreakdown};
use speedtap::model::{ExportFormat, HistoryFilter, ModelSummary};
use speedtap::model::{Phase, Snapshot, StartKind, TokenSource};
use speedtap::store::{export, parse_export, Store, StoreError, StoreWriter};

// ---------------------------------------------------------------- helpers

/// A directory removed when dropped (no tempfile crate in the tree).
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        static N: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "speedtap-store-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// 2026-11-30T10:42:07.123Z
const T0: u64 = 1_796_035_327_123;
const DAY_MS: u64 = 86_400_000;

/// A settled call: `ok` with a final snapshot unless `status` says
/// otherwise (unmetered calls have no snapshot).
fn call(id: &str, started_ms: u64, route: &str, model: Option<&str>, status: CallStatus) -> Call {
    let speed = (status != CallStatus::Unmetered).then(|| Snapshot {
        stalled_ms: None,
        phase: Phase::Complete,
        is_final: true,
        elapsed_ms: 2000,
        time_to_first_token_ms: Some(250),
        output_tokens: 80,
        output_tokens_per_second: (status == CallStatus::Ok).then_some(45.5),
        token_source: TokenSource::Server,
        wait: None,
    });
    Call {
        identity: CallIdentity {
            id: id.into(),
            route: route.into(),
            api: if status == CallStatus::Unmetered {
                ApiKind::Unknown
            } else {
                ApiKind::OpenaiChat
            },
            model: model.map(Into::into),
            started_at: ms_to_rfc3339(started_ms),
            demo: false,
        },
        status,
        http_status: Some(if status == CallStatus::UpstreamError {
            500
        } else {
            200
        }),
        speed,
        input_tokens: Some(37),
        details: CallDetails {
            client: Some("openai-python".into()),
            ttft_breakdown: None,
            one_burst: false,
            unstreamed_reasoning: false,
            settled_at: Some(ms_to_rfc3339(started_ms + 2000)),
            ..CallDetails::default()
        },
    }
}

fn ok(id: &str, started_ms: u64) -> Call {
    call(id, started_ms, "ollama", Some("qwen3:8b"), CallStatus::Ok)
}

/// Sets the final snapshot's TTFT and rate.
fn with_speed(mut c: Call, ttft: Option<u64>, tps: Option<f64>) -> Call {
    let s = c.speed.as_mut().unwrap();
    s.time_to_first_token_ms = ttft;
    s.output_tokens_per_second = tps;
    c
}

fn ids(calls: &[Call]) -> Vec<&str> {
    calls.iter().map(|c| c.identity.id.as_str()).collect()
}

/// Every table and index definition, for comparing schemas.
fn schema_of(conn: &Connection) -> BTreeSet<String> {
    let mut stmt = conn
        .prepare("SELECT type || ' ' || name || ': ' || coalesce(sql, '') FROM sqlite_master")
        .unwrap();
    let rows = stmt.query_map([], |r| r.get::<_, String>(0)).unwrap();
    rows.map(Result::unwrap).collect()
}

#[cfg(unix)]
fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// Everything `tracing` logs in this test binary, for the warning checks
/// (the writer logs from its own thread, so a thread-local subscriber
/// wouldn't see it).
fn log() -> &'static Arc<Mutex<Vec<u8>>> {
    static LOG: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOG.get_or_init(|| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&buf);
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .with_writer(move || LogWriter(Arc::clone(&sink)))
            .finish();
        tracing::subscriber::set_global_default(subscriber).unwrap();
        buf
    })
}

struct LogWriter(Arc<Mutex<Vec<u8>>>);

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn log_lines_with(needle: &str) -> Vec<String> {
    let log = log().lock().unwrap();
    String::from_utf8_lossy(&log)
        .lines()
        .filter(|l| l.contains(needle))
        .map(str::to_owned)
        .collect()
}

/// Every (id, persisted) a writer reported, in order.
type Reports = Arc<Mutex<Vec<(String, bool)>>>;

/// A writer whose callback records every (id, persisted) it is given.
fn spawn_recording(store: Store) -> (StoreWriter, Reports) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&seen);
    let writer = StoreWriter::spawn(
        store,
        Box::new(move |ids, persisted| {
            sink.lock()
                .unwrap()
                .extend(ids.into_iter().map(|id| (id, persisted)));
        }),
    );
    (writer, seen)
}

// ---------------------------------------------------------------- opening

#[cfg(unix)]
#[test]
fn open_creates_private_dirs_and_file_in_wal_mode() {
    let tmp = TempDir::new("open");
    let path = tmp.path("data/speedtap/speedtap.sqlite3");
    let mut store = Store::open(&path).unwrap();
    store.insert_calls(&[ok("c-000001", T0)]).unwrap();
    assert_eq!(mode(&path), 0o600);
    // SQLite gives the WAL the main file's mode.
    assert_eq!(mode(&path.with_file_name("speedtap.sqlite3-wal")), 0o600);
    assert_eq!(mode(&tmp.path("data")), 0o700);
    assert_eq!(mode(&tmp.path("data/speedtap")), 0o700);

    let other = Connection::open(&path).unwrap();
    let journal: String = other
        .pragma_query_value(None, "journal_mode", |r| r.get(0))
        .unwrap();
    assert_eq!(journal, "wal");
    let auto_vacuum: i64 = other
        .pragma_query_value(None, "auto_vacuum", |r| r.get(0))
        .unwrap();
    assert_eq!(auto_vacuum, 2, "incremental");
    assert_eq!(store.path(), Some(path.as_path()));
}

#[test]
fn open_errors_name_the_file() {
    let tmp = TempDir::new("errors");
    let junk = tmp.path("junk.sqlite3");
    std::fs::write(
        &junk,
        b"this is not a database, just text that is long enough",
    )
    .unwrap();
    let err = Store::open(&junk).unwrap_err().to_string();
    assert!(err.contains(&junk.display().to_string()), "{err}");

    let file = tmp.path("file");
    std::fs::write(&file, b"").unwrap();
    let under_file = file.join("sub/db.sqlite3");
    let err = Store::open(&under_file).unwrap_err();
    assert!(matches!(err, StoreError::CreateDir { .. }), "{err:?}");
    assert!(
        err.to_string()
            .contains(&file.join("sub").display().to_string()),
        "{err}"
    );
}

#[test]
fn open_existing_never_creates_a_database_and_only_reads() {
    let tmp = TempDir::new("existing");
    let missing = tmp.path("sub/none.sqlite3");
    let err = Store::open_existing(&missing).unwrap_err();
    assert!(matches!(err, StoreError::Missing { .. }), "{err:?}");
    assert!(
        err.to_string().contains(&missing.display().to_string()),
        "{err}"
    );
    assert!(!missing.exists() && !tmp.path("sub").exists());

    let path = tmp.path("db.sqlite3");
    Store::open(&path)
        .unwrap()
        .insert_calls(&[ok("c-1", T0)])
        .unwrap();
    let mut reader = Store::open_existing(&path).unwrap();
    assert_eq!(
        ids(&reader.history(&HistoryFilter::default()).unwrap()),
        ["c-1"]
    );
    let err = reader.insert_calls(&[ok("c-2", T0 + 1)]).unwrap_err();
    assert!(err.to_string().contains("readonly"), "{err}");
    assert_eq!(Store::open(&path).unwrap().count_calls().unwrap(), 1);
}

// ---------------------------------------------------------------- migrations

#[test]
fn migrates_an_empty_file() {
    let tmp = TempDir::new("empty");
    let path = tmp.path("empty.sqlite3");
    std::fs::write(&path, b"").unwrap();
    let store = Store::open(&path).unwrap();
    assert_eq!(store.count_calls().unwrap(), 0);
    drop(store);
    let conn = Connection::open(&path).unwrap();
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap();
    assert_eq!(version, speedtap::store::schema::SCHEMA_VERSION);
    assert!(schema_of(&conn)
        .iter()
        .any(|s| s.starts_with("table calls:")));
}

#[test]
fn migrates_a_v1_file_keeping_its_data_and_matching_a_fresh_schema() {
    let tmp = TempDir::new("v1");
    let old = tmp.path("v1.sqlite3");
    {
        let conn = Connection::open(&old).unwrap();
        conn.execute_batch(include_str!("fixtures/store_v1.sql"))
            .unwrap();
    }
    let store = Store::open(&old).unwrap();
    let calls = store.history(&HistoryFilter::default()).unwrap();
    assert_eq!(ids(&calls), ["c-000002", "c-000001"]);
    let first = &calls[1];
    assert_eq!(first.identity.started_at, "2026-11-30T10:42:07.123Z");
    assert_eq!(first.identity.api, ApiKind::OllamaChat);
    assert_eq!(first.status, CallStatus::Ok);
    let speed = first.speed.as_ref().unwrap();
    assert_eq!(speed.time_to_first_token_ms, Some(312));
    assert_eq!(speed.output_tokens_per_second, Some(41.7));
    assert_eq!(
        first
            .details
            .ttft_breakdown
            .as_ref()
            .unwrap()
            .prefill_tokens_per_second,
        Some(205.6)
    );
    assert_eq!(first.details.client.as_deref(), Some("ollama-python"));
    assert!(calls[0].speed.is_none());
    assert_eq!(calls[0].identity.model, None);
    assert_eq!(
        store
            .load_calibration()
            .unwrap()
            .factor("ollama", "qwen3:8b"),
        1.25
    );
    drop(store);

    let fresh = tmp.path("fresh.sqlite3");
    drop(Store::open(&fresh).unwrap());
    assert_eq!(
        schema_of(&Connection::open(&old).unwrap()),
        schema_of(&Connection::open(&fresh).unwrap())
    );
}

#[test]
fn a_newer_schema_is_refused_with_a_clear_message() {
    let tmp = TempDir::new("newer");
    let path = tmp.path("newer.sqlite3");
    Connection::open(&path)
        .unwrap()
        .pragma_update(None, "user_version", 99)
        .unwrap();
    let err = Store::open(&path).unwrap_err();
    assert!(
        matches!(err, StoreError::TooNew { found: 99, .. }),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains(&path.display().to_string()) && msg.contains("upgrade speedtap"),
        "{msg}"
    );
    // Refused before touching it: still in its rollback-journal mode.
    let journal: String = Connection::open(&path)
        .unwrap()
        .pragma_query_value(None, "journal_mode", |r| r.get(0))
        .unwrap();
    assert_eq!(journal, "delete");
}

// ---------------------------------------------------------------- history

fn seeded_history() -> Store {
    let mut store = Store::open_in_memory().unwrap();
    let mut curl = call(
        "c-4",
        T0 + 4000,
        "llama",
        Some("gemma3"),
        CallStatus::Abandoned,
    );
    curl.details.client = Some("curl".into());
    store
        .insert_calls(&[
            ok("c-1", T0 + 1000),
            call("c-2", T0 + 2000, "llama", Some("gemma3"), CallStatus::Ok),
            call(
                "c-3",
                T0 + 3000,
                "ollama",
                Some("qwen3:8b"),
                CallStatus::UpstreamError,
            ),
            curl,
            call("c-5", T0 + 5000, "ollama", None, CallStatus::Unmetered),
            // Same millisecond as c-5, stored later: listed before it.
            ok("c-6", T0 + 5000),
        ])
        .unwrap();
    store
}

#[test]
fn history_is_newest_first_and_filters_combine() {
    let store = seeded_history();
    let all = store.history(&HistoryFilter::default()).unwrap();
    assert_eq!(ids(&all), ["c-6", "c-5", "c-4", "c-3", "c-2", "c-1"]);

    let q = |f: HistoryFilter| ids(&store.history(&f).unwrap()).join(" ");
    assert_eq!(
        q(HistoryFilter {
            model: Some("qwen3:8b".into()),
            ..Default::default()
        }),
        "c-6 c-3 c-1"
    );
    assert_eq!(
        q(HistoryFilter {
            model: Some(String::new()),
            ..Default::default()
        }),
        "c-5"
    );
    assert_eq!(
        q(HistoryFilter {
            route: Some("llama".into()),
            ..Default::default()
        }),
        "c-4 c-2"
    );
    assert_eq!(
        q(HistoryFilter {
            client: Some("curl".into()),
            ..Default::default()
        }),
        "c-4"
    );
    assert_eq!(
        q(HistoryFilter {
            status: Some(CallStatus::Ok),
            ..Default::default()
        }),
        "c-6 c-2 c-1"
    );
    // since inclusive, until exclusive.
    assert_eq!(
        q(HistoryFilter {
            since_ms: Some(T0 + 2000),
            until_ms: Some(T0 + 4000),
            ..Default::default()
        }),
        "c-3 c-2"
    );
    assert_eq!(
        q(HistoryFilter {
            route: Some("ollama".into()),
            model: Some("qwen3:8b".into()),
            status: Some(CallStatus::Ok),
            since_ms: Some(T0 + 1001),
            ..Default::default()
        }),
        "c-6"
    );
    assert_eq!(
        q(HistoryFilter {
            limit: Some(2),
            ..Default::default()
        }),
        "c-6 c-5"
    );
    assert_eq!(
        q(HistoryFilter {
            limit: Some(0),
            ..Default::default()
        }),
        ""
    );
    assert_eq!(
        q(HistoryFilter {
            model: Some("nope".into()),
            ..Default::default()
        }),
        ""
    );
}

#[test]
fn history_returns_exactly_what_was_stored() {
    let mut store = Store::open_in_memory().unwrap();
    let mut rich = ok("c-000042", T0);
    rich.details.ttft_breakdown = Some(TtftBreakdown {
        load_ms: Some(1500.25),
        prefill_ms: Some(180.0),
        prefill_tokens: Some(512),
        cached_tokens: Some(64),
        prefill_tokens_per_second: Some(2844.4),
        other_ms: None,
    });
    rich.details.one_burst = true;
    rich.details.unstreamed_reasoning = true;
    rich.http_status = None;
    rich.input_tokens = None;
    let unmetered = call("c-000043", T0 + 1, "ollama", None, CallStatus::Unmetered);
    store
        .insert_calls(&[rich.clone(), unmetered.clone()])
        .unwrap();
    assert_eq!(
        store.history(&HistoryFilter::default()).unwrap(),
        vec![unmetered, rich]
    );
}

#[test]
fn empty_names_and_empty_breakdowns_are_stored_as_absent() {
    let mut store = Store::open_in_memory().unwrap();
    let mut c = ok("c-1", T0);
    c.identity.model = Some(String::new());
    c.details.client = Some(String::new());
    c.details.ttft_breakdown = Some(TtftBreakdown::default());
    store.insert_calls(&[c]).unwrap();
    let back = &store.history(&HistoryFilter::default()).unwrap()[0];
    assert_eq!(back.identity.model, None);
    assert_eq!(back.details.client, None);
    assert_eq!(back.details.ttft_breakdown, None);
}

#[test]
fn inserting_the_same_call_twice_keeps_one() {
    let mut store = Store::open_in_memory().unwrap();
    let batch = [ok("c-000001", T0), ok("c-000002", T0 + 10)];
    store.insert_calls(&batch).unwrap();
    store.insert_calls(&batch).unwrap();
    // Same id in a later engine run (ids restart): a different call.
    store.insert_calls(&[ok("c-000001", T0 + DAY_MS)]).unwrap();
    assert_eq!(store.count_calls().unwrap(), 3);
}

// ---------------------------------------------------------------- calibration

#[test]
fn calibration_round_trips_and_survives_reopening() {
    let tmp = TempDir::new("calibration");
    let path = tmp.path("db.sqlite3");
    let mut table = CalibrationTable::new();
    table.observe("ollama", "qwen3:8b", 1.5);
    table.observe("ollama", "qwen3:8b", 1.0);
    table.observe("llama", "gemma3", 0.8);
    {
        let mut store = Store::open(&path).unwrap();
        assert!(store.load_calibration().unwrap().is_empty());
        store.save_calibration(&table).unwrap();
        assert_eq!(store.load_calibration().unwrap(), table);
    }
    let store = Store::open(&path).unwrap();
    let loaded = store.load_calibration().unwrap();
    assert_eq!(loaded, table);
    assert_eq!(loaded.factor("ollama", "qwen3:8b"), 1.25);
    assert_eq!(loaded.entries().map(|e| e.observations).sum::<u64>(), 3);
}

#[test]
fn the_routes_normals_are_rebuilt_from_the_newest_well_settled_calls() {
    let tmp = TempDir::new("normals");
    let path = tmp.path("db.sqlite3");
    // 45 calls of one model: the TTFT is 200 ms plus 1 ms per prompt
    // token, every fifth a cold start with its load time; the newest 40
    // are replayed.
    let mut calls = Vec::new();
    let mut expected = Normals::new();
    for i in 0..45u64 {
        let prompt = 500 + 100 * (i % 7);
        let cold = i % 5 == 0;
        let load = if cold { 3_000.0 } else { 0.0 };
        let ttft = 200 + prompt + load as u64;
        let mut c = with_speed(ok(&format!("c{i}"), 1_000 + i * 10_000), Some(ttft), None);
        c.input_tokens = Some(prompt);
        c.details.start = Some(if cold {
            StartKind::Cold
        } else {
            StartKind::Warm
        });
        c.details.ttft_breakdown = Some(TtftBreakdown {
            load_ms: cold.then_some(load),
            prefill_ms: Some(prompt as f64 / 2.0),
            prefill_tokens: Some(prompt),
            cached_tokens: None,
            prefill_tokens_per_second: Some(2_000.0),
            other_ms: None,
        });
        if i >= 5 {
            expected.observe(
                "ollama",
                "qwen3:8b",
                &Observation {
                    ttft_ms: ttft,
                    prompt_tokens: Some(prompt),
                    cold,
                    load_ms: cold.then_some(load),
                    prefill: Some((prompt, prompt as f64 / 2.0)),
                    prompt_estimate: None,
                    queued: None,
                },
            );
        }
        calls.push(c);
    }
    // Not learned from, as live: a call cut short, one with a capture
    // gap, one without a first token.
    let t = 1_000 + 50 * 10_000;
    calls.push(with_speed(
        call("cut", t, "ollama", Some("qwen3:8b"), CallStatus::Abandoned),
        Some(99_000),
        None,
    ));
    let mut gap = with_speed(ok("gap", t + 1), Some(99_000), None);
    gap.details.capture_gap = true;
    calls.push(gap);
    calls.push(with_speed(ok("none", t + 2), None, None));
    // Another model keeps its own normal.
    for i in 0..3u64 {
        calls.push(with_speed(
            call(
                &format!("g{i}"),
                t + 10 + i,
                "llama",
                Some("gemma3"),
                CallStatus::Ok,
            ),
            Some(900),
            None,
        ));
    }
    Store::open(&path).unwrap().insert_calls(&calls).unwrap();

    let loaded = Store::open(&path).unwrap().load_normals().unwrap();
    let normal = loaded.get("ollama", "qwen3:8b").expect("learned");
    assert_eq!(normal.observations, 40);
    assert_eq!(Some(normal), expected.get("ollama", "qwen3:8b"));
    assert_eq!(
        loaded.usual_ttft_ms("ollama", "qwen3:8b", Some(1_000), false),
        Some(1_200)
    );
    assert_eq!(loaded.usual_load_ms("ollama", "qwen3:8b"), Some(3_000));
    assert_eq!(
        loaded.usual_ttft_ms("llama", "gemma3", None, false),
        Some(900)
    );
    // A fresh file has none.
    let fresh = Store::open(&tmp.path("fresh.sqlite3"))
        .unwrap()
        .load_normals()
        .unwrap();
    assert!(fresh.get("ollama", "qwen3:8b").is_none());
}

#[test]
fn the_usual_decode_rates_are_rebuilt_from_the_stored_calls_as_they_were_taught_live() {
    use speedtap::meter::slowdown::{DecodeCall, Evidence};
    use speedtap::model::{Slowdown, SlowdownCause};
    let tmp = TempDir::new("decode-usuals");
    let path = tmp.path("calls.sqlite3");
    let on = |mut c: Call, version: &str| {
        c.details.server_version = Some(version.into());
        c
    };
    // Five ok calls at 40 tok/s on 0.32.13 (37 prompt tokens: the first
    // depth bucket) make the usual, with 80% of their drafts accepted.
    let mut calls: Vec<Call> = (0..5u64)
        .map(|i| {
            let mut c = on(
                with_speed(ok(&format!("q{i}"), T0 + i * 10_000), Some(250), Some(40.0)),
                "0.32.13",
            );
            c.details.draft = Some(speedtap::model::DraftCounts {
                drafted: 50,
                accepted: 40,
            });
            c
        })
        .collect();
    // A call slowed by a passing cause (judged so live) taught nothing,
    // and a call with a capture gap is not judged at all.
    let mut offloaded = on(
        with_speed(ok("off", T0 + 60_000), Some(250), Some(10.0)),
        "0.32.13",
    );
    offloaded.details.slowdown = Some(Slowdown {
        usual_tps: 40.0,
        ratio: 0.25,
        causes: vec![SlowdownCause::CpuOffload { cpu_share: 0.4 }],
    });
    calls.push(offloaded);
    let mut gap = on(
        with_speed(ok("gap", T0 + 70_000), Some(250), Some(4.0)),
        "0.32.13",
    );
    gap.details.capture_gap = true;
    calls.push(gap);
    // Another model's calls and a failed call teach their own or nothing.
    calls.push(with_speed(
        call("g", T0 + 80_000, "ollama", Some("gemma3"), CallStatus::Ok),
        Some(250),
        Some(90.0),
    ));
    calls.push(call(
        "err",
        T0 + 90_000,
        "ollama",
        Some("qwen3:8b"),
        CallStatus::UpstreamError,
    ));
    Store::open(&path).unwrap().insert_calls(&calls).unwrap();

    let usuals = Store::open(&path).unwrap().load_decode_usuals().unwrap();
    let at = |tps: f64, version: &'static str| DecodeCall {
        route: "ollama",
        model: "qwen3:8b",
        depth: Some(37),
        tps,
        version: Some(version),
        draft_acceptance: None,
    };
    let slow = usuals
        .judge(&at(12.0, "0.32.13"), &Evidence::default())
        .expect("a slowdown right after the restart");
    assert_eq!(
        slow.usual_tps, 40.0,
        "neither the offload nor the gap taught it"
    );
    assert_eq!(slow.ratio, 0.3);
    assert_eq!(slow.causes, [SlowdownCause::Unknown]);
    // So does the usual draft acceptance.
    let drafting = DecodeCall {
        draft_acceptance: Some(0.3),
        ..at(12.0, "0.32.13")
    };
    assert_eq!(
        usuals
            .judge(&drafting, &Evidence::default())
            .unwrap()
            .causes,
        [SlowdownCause::DraftAcceptance {
            usual: 0.8,
            now: 0.3
        }]
    );
    // The version the usual was learned on survives too.
    let upgraded = usuals
        .judge(&at(12.0, "0.33.2"), &Evidence::default())
        .unwrap();
    assert_eq!(
        upgraded.causes,
        [SlowdownCause::ServerChanged {
            from: "0.32.13".into(),
            to: "0.33.2".into()
        }]
    );
    assert_eq!(
        usuals.judge(&at(39.0, "0.32.13"), &Evidence::default()),
        None
    );
    // Another depth bucket, and a model with a single call, have no usual.
    let deep = DecodeCall {
        depth: Some(20_000),
        ..at(12.0, "0.32.13")
    };
    assert_eq!(usuals.judge(&deep, &Evidence::default()), None);
    let gemma = DecodeCall {
        model: "gemma3",
        ..at(10.0, "0.32.13")
    };
    assert_eq!(usuals.judge(&gemma, &Evidence::default()), None);
    // A fresh file has none.
    let fresh = Store::open(&tmp.path("fresh.sqlite3"))
        .unwrap()
        .load_decode_usuals()
        .unwrap();
    assert_eq!(
        fresh.judge(&at(12.0, "0.32.13"), &Evidence::default()),
        None
    );
}

// ---------------------------------------------------------------- models

#[test]
fn models_medians_and_p90_match_hand_computed_values() {
    let mut store = Store::open_in_memory().unwrap();
    let q = |id: &str, at: u64| ok(id, T0 + at);
    let mut calls = vec![
        // qwen3:8b on ollama: five ok calls.
        with_speed(q("a1", 10), Some(300), Some(30.0)),
        with_speed(q("a2", 20), Some(100), Some(12.5)),
        with_speed(q("a3", 30), Some(1000), Some(41.0)),
        with_speed(q("a4", 40), Some(200), Some(20.0)),
        // One burst: TTFT but no rate.
        with_speed(q("a5", 50), Some(400), None),
        // Not ok: counted in `calls`, not in the figures.
        with_speed(
            call(
                "a6",
                T0 + 60,
                "ollama",
                Some("qwen3:8b"),
                CallStatus::Abandoned,
            ),
            Some(5000),
            Some(1.0),
        ),
        call(
            "a7",
            T0 + 70,
            "ollama",
            Some("qwen3:8b"),
            CallStatus::UpstreamError,
        ),
        // No model named, on llama: two ok calls.
        with_speed(
            call("b1", T0 + 5, "llama", None, CallStatus::Ok),
            Some(80),
            Some(55.0),
        ),
        with_speed(
            call("b2", T0 + 6, "llama", None, CallStatus::Ok),
            Some(120),
            Some(65.0),
        ),
        // qwen3:8b on vllm: only a failure.
        call(
            "c1",
            T0 + 1,
            "vllm",
            Some("qwen3:8b"),
            CallStatus::UpstreamError,
        ),
    ];
    for (call, prefill) in calls
        .iter_mut()
        .zip([Some(250.0), Some(100.0), None, Some(400.0)])
    {
        call.details.ttft_breakdown = prefill.map(|p| TtftBreakdown {
            prefill_tokens_per_second: Some(p),
            prefill_tokens: Some(512),
            ..TtftBreakdown::default()
        });
    }
    // An abandoned call's prefill rate is not in the sample either.
    calls[5].details.ttft_breakdown = Some(TtftBreakdown {
        prefill_tokens_per_second: Some(9999.0),
        prefill_tokens: Some(4_000),
        ..TtftBreakdown::default()
    });
    // Three ok calls reasoned (one counted by speedtap's estimate); the
    // abandoned one's reasoning is not an answer's.
    for (i, tokens) in [(0, 1_800), (1, 600), (2, 1_200), (5, 9_000)] {
        calls[i].details.reasoning_tokens = Some(tokens);
    }
    calls[1].details.reasoning_tokens_estimated = true;
    store.insert_calls(&calls).unwrap();

    let models = store.models(&HistoryFilter::default()).unwrap();
    assert_eq!(
        models,
        vec![
            ModelSummary {
                model: String::new(),
                route: "llama".into(),
                calls: 2,
                ok_calls: 2,
                failed_calls: 0,
                // TTFT [80, 120]: p50 h = 0.5 → 100; p90 h = 0.9 → 80 + 0.9 × 40 = 116.
                ttft_ms_p50: Some(100.0),
                ttft_ms_p90: Some(116.0),
                // Rates [55, 65]: p50 60; p90 55 + 0.9 × 10 = 64.
                tps_p50: Some(60.0),
                tps_p90: Some(64.0),
                // p10 55 + 0.1 × 10 = 56: the slow tail.
                tps_p10: Some(56.0),
                cold_calls: 0,
                cold_ttft_ms_p50: None,
                queued_calls: 0,
                queued_ttft_ms_p50: None,
                prefill_tps_p50: None,
                reasoning_tokens_p50: None,
                reasoning_calls: 0,
                reasoning_tokens_estimated: false,
                last_seen: ms_to_rfc3339(T0 + 6),
            },
            ModelSummary {
                model: "qwen3:8b".into(),
                route: "ollama".into(),
                calls: 7,
                ok_calls: 5,
                // a7's upstream error; a6 was abandoned, no failure kept.
                failed_calls: 1,
                // TTFT of the ok calls sorted [100, 200, 300, 400, 1000]:
                // p50 h = 4 × 0.5 = 2 → 300; p90 h = 3.6 → 400 + 0.6 × 600 = 760.
                ttft_ms_p50: Some(300.0),
                ttft_ms_p90: Some(760.0),
                // Rates sorted [12.5, 20, 30, 41] (a5 has none):
                // p50 h = 1.5 → 20 + 0.5 × 10 = 25; p90 h = 2.7 → 30 + 0.7 × 11 = 37.7.
                tps_p50: Some(25.0),
                tps_p90: Some(37.7),
                // p10 h = 0.3 → 12.5 + 0.3 × 7.5 = 14.75, rounded half up.
                tps_p10: Some(14.8),
                cold_calls: 0,
                cold_ttft_ms_p50: None,
                queued_calls: 0,
                queued_ttft_ms_p50: None,
                // Prefill sorted [100, 250, 400]: p50 = 250.
                prefill_tps_p50: Some(250.0),
                // Reasoning of the ok calls sorted [600, 1200, 1800]: p50 1200.
                reasoning_tokens_p50: Some(1_200.0),
                reasoning_calls: 3,
                reasoning_tokens_estimated: true,
                // The newest call, even though it failed.
                last_seen: ms_to_rfc3339(T0 + 70),
            },
            ModelSummary {
                model: "qwen3:8b".into(),
                route: "vllm".into(),
                calls: 1,
                ok_calls: 0,
                failed_calls: 1,
                ttft_ms_p50: None,
                ttft_ms_p90: None,
                tps_p50: None,
                tps_p90: None,
                tps_p10: None,
                cold_calls: 0,
                cold_ttft_ms_p50: None,
                queued_calls: 0,
                queued_ttft_ms_p50: None,
                prefill_tps_p50: None,
                reasoning_tokens_p50: None,
                reasoning_calls: 0,
                reasoning_tokens_estimated: false,
                last_seen: ms_to_rfc3339(T0 + 1),
            },
        ]
    );

    // Filters apply before grouping: since T0 + 30 leaves a3, a4, a5 (ok),
    // a6 and a7 on ollama. TTFT sorted [200, 400, 1000]: p50 400, p90
    // h = 1.8 → 400 + 0.8 × 600 = 880. Rates sorted [20, 41]: p50 30.5, p90
    // 20 + 0.9 × 21 = 38.9. Prefill: a4's 400 alone.
    let recent = store
        .models(&HistoryFilter {
            route: Some("ollama".into()),
            since_ms: Some(T0 + 30),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(recent.len(), 1);
    assert_eq!((recent[0].calls, recent[0].ok_calls), (5, 3));
    assert_eq!(
        (recent[0].ttft_ms_p50, recent[0].ttft_ms_p90),
        (Some(400.0), Some(880.0))
    );
    assert_eq!(
        (recent[0].tps_p50, recent[0].tps_p90),
        (Some(30.5), Some(38.9))
    );
    assert_eq!(recent[0].prefill_tps_p50, Some(400.0));
    // a3 alone reasoned among them, counted by the server.
    assert_eq!(
        (
            recent[0].reasoning_tokens_p50,
            recent[0].reasoning_calls,
            recent[0].reasoning_tokens_estimated
        ),
        (Some(1_200.0), 1, false)
    );

    let json = serde_json::to_value(&models[2]).unwrap();
    assert_eq!(
        json,
        serde_json::json!({"model": "qwen3:8b", "route": "vllm", "calls": 1, "ok_calls": 0,
                           "failed_calls": 1, "last_seen": ms_to_rfc3339(T0 + 1)})
    );
}

#[test]
fn history_compares_like_with_like_queued_and_cold_calls_apart_long_prompts_only() {
    let mut store = Store::open_in_memory().unwrap();
    let warm = |id: &str, at: u64, ttft: u64| {
        with_speed(
            call(id, at, "ollama", Some("gemma3"), CallStatus::Ok),
            Some(ttft),
            Some(40.0),
        )
    };
    let mut calls = vec![
        warm("w1", T0, 800),
        warm("w2", T0 + 1, 900),
        warm("w3", T0 + 2, 1_000),
    ];
    // Three cold starts and two calls that waited in the queue.
    for (i, ttft) in [7_000, 6_500, 7_500].into_iter().enumerate() {
        let mut c = warm(&format!("cold{i}"), T0 + 10 + i as u64, ttft);
        c.details.start = Some(StartKind::Cold);
        calls.push(c);
    }
    for (i, ttft) in [8_800, 22_000].into_iter().enumerate() {
        let mut c = warm(&format!("q{i}"), T0 + 20 + i as u64, ttft);
        c.details.queued_ms = Some(ttft - 900);
        c.details.queue_position = Some(1 + i as u32);
        calls.push(c);
    }
    // A call that queued while the model loaded is a cold start: counted
    // once, with the cold ones.
    let mut both = warm("cold-queued", T0 + 30, 9_000);
    both.details.start = Some(StartKind::Cold);
    both.details.queued_ms = Some(2_000);
    both.details.queue_position = Some(1);
    calls.push(both);
    // Prefill rates: a 30-token prompt's 33 tok/s is overhead, not speed.
    for (c, (tokens, rate)) in calls
        .iter_mut()
        .zip([(30, 33.0), (4_000, 3_352.0), (600, 3_000.0)])
    {
        c.details.ttft_breakdown = Some(TtftBreakdown {
            prefill_tokens: Some(tokens),
            prefill_tokens_per_second: Some(rate),
            ..TtftBreakdown::default()
        });
    }
    store.insert_calls(&calls).unwrap();
    let models = store.models(&HistoryFilter::default()).unwrap();
    let m = &models[0];
    assert_eq!(m.ok_calls, 9);
    assert_eq!((m.ttft_ms_p50, m.ttft_ms_p90), (Some(900.0), Some(980.0)));
    // Cold: 6,500, 7,000, 7,500 and 9,000; the median of the middle two.
    assert_eq!((m.cold_calls, m.cold_ttft_ms_p50), (4, Some(7_250.0)));
    // Queued, not cold: 8,800 and 22,000.
    assert_eq!((m.queued_calls, m.queued_ttft_ms_p50), (2, Some(15_400.0)));
    // The median of 3,352 and 3,000.
    assert_eq!(m.prefill_tps_p50, Some(3_176.0));
    let json = serde_json::to_value(m).unwrap();
    assert_eq!(json["cold_calls"], 4);
    assert_eq!(json["queued_calls"], 2);
    assert_eq!(json["queued_ttft_ms_p50"], 15_400.0);
    assert_eq!(json["tps_p10"], 40.0);
}

// ---------------------------------------------------------------- prune

#[test]
fn prune_by_age_keeps_the_retention_window() {
    let tmp = TempDir::new("prune-age");
    let mut store = Store::open(&tmp.path("db.sqlite3")).unwrap();
    let now = T0 + 10 * DAY_MS;
    let calls: Vec<_> = (0..10)
        .map(|d| ok(&format!("c-{d}"), now - d * DAY_MS))
        .collect();
    store.insert_calls(&calls).unwrap();
    let report = store
        .prune(now, Duration::from_millis(5 * DAY_MS), u64::MAX)
        .unwrap();
    // Days 0..=5 ago stay (exactly 5 days old is still inside), 6..=9 go.
    assert_eq!((report.by_age, report.by_size), (4, 0));
    assert_eq!(
        ids(&store.history(&HistoryFilter::default()).unwrap()),
        ["c-0", "c-1", "c-2", "c-3", "c-4", "c-5"]
    );
    // Nothing more to do the second time.
    let again = store
        .prune(now, Duration::from_millis(5 * DAY_MS), u64::MAX)
        .unwrap();
    assert_eq!(again.removed(), 0);
}

#[test]
fn prune_by_size_drops_the_oldest_and_shrinks_the_file() {
    let tmp = TempDir::new("prune-size");
    let path = tmp.path("db.sqlite3");
    let mut store = Store::open(&path).unwrap();
    let calls: Vec<_> = (0..6000u64)
        .map(|i| ok(&format!("c-{i:06}"), T0 + i))
        .collect();
    store.insert_calls(&calls).unwrap();
    store.checkpoint().unwrap();
    let full = std::fs::metadata(&path).unwrap().len();
    assert!(
        full > 500_000,
        "6000 calls should take more than 500 kB, took {full}"
    );

    let cap = full / 3;
    let report = store
        .prune(T0, Duration::from_secs(365 * 86_400), cap)
        .unwrap();
    assert_eq!(report.by_age, 0);
    assert!(report.by_size > 0);
    assert!(!report.full_vacuum);
    assert_eq!(report.bytes_before, full);
    assert!(report.bytes_after <= cap, "{report:?} cap {cap}");
    let on_disk = std::fs::metadata(&path).unwrap().len();
    assert!(on_disk <= cap, "file is {on_disk} bytes, cap {cap}");
    let left = store.count_calls().unwrap();
    assert_eq!(left + report.by_size, 6000);
    // Roughly a third is left (not everything was thrown away).
    assert!(left > 1000, "only {left} calls left");
    // The survivors are the newest.
    let oldest_left = store
        .history(&HistoryFilter::default())
        .unwrap()
        .last()
        .unwrap()
        .identity
        .id
        .clone();
    assert_eq!(oldest_left, format!("c-{:06}", report.by_size));
}

#[test]
fn prune_vacuums_a_file_created_without_incremental_auto_vacuum_once() {
    let tmp = TempDir::new("prune-v1");
    let path = tmp.path("v1.sqlite3");
    Connection::open(&path)
        .unwrap()
        .execute_batch(include_str!("fixtures/store_v1.sql"))
        .unwrap();
    let mut store = Store::open(&path).unwrap();
    let calls: Vec<_> = (0..3000u64)
        .map(|i| ok(&format!("c-{i:06}"), T0 + i))
        .collect();
    store.insert_calls(&calls).unwrap();
    store.checkpoint().unwrap();
    let full = std::fs::metadata(&path).unwrap().len();
    let report = store
        .prune(T0, Duration::from_secs(86_400), full / 3)
        .unwrap();
    assert!(report.full_vacuum, "{report:?}");
    assert!(std::fs::metadata(&path).unwrap().len() <= full / 3);
    let auto_vacuum: i64 = Connection::open(&path)
        .unwrap()
        .pragma_query_value(None, "auto_vacuum", |r| r.get(0))
        .unwrap();
    assert_eq!(
        auto_vacuum, 2,
        "now incremental: later prunes need no VACUUM"
    );
}

// ---------------------------------------------------------------- export

fn varied_calls() -> Vec<Call> {
    let mut rich = ok("c-000001", T0);
    rich.identity.model = Some("weird, \"quoted\"\nmodel".into());
    rich.details.client = Some("app, v2".into());
    rich.details.ttft_breakdown = Some(TtftBreakdown {
        load_ms: Some(1500.25),
        prefill_ms: Some(180.0),
        prefill_tokens: Some(512),
        cached_tokens: Some(0),
        prefill_tokens_per_second: Some(2844.4),
        other_ms: Some(0.1),
    });
    rich.details.unstreamed_reasoning = true;
    rich.details.queued_ms = Some(8_100);
    rich.details.queue_position = Some(2);
    let mut burst = with_speed(ok("c-000002", T0 + 1), Some(900), None);
    burst.details.one_burst = true;
    burst.details.settled_at = None;
    let mut estimated = ok("c-000003", T0 + 2);
    estimated.speed.as_mut().unwrap().token_source = TokenSource::Estimated;
    estimated.input_tokens = None;
    vec![
        rich,
        burst,
        estimated,
        call("c-000004", T0 + 3, "llama", None, CallStatus::Unmetered),
        call(
            "c-000005",
            T0 + 4,
            "llama",
            Some("gemma3"),
            CallStatus::UpstreamError,
        ),
        call(
            "c-000006",
            T0 + 5,
            "llama",
            Some("gemma3"),
            CallStatus::Abandoned,
        ),
    ]
}

#[test]
fn csv_and_jsonl_exports_round_trip() {
    let mut store = Store::open_in_memory().unwrap();
    let calls = varied_calls();
    store.insert_calls(&calls).unwrap();
    for format in [ExportFormat::Csv, ExportFormat::Jsonl] {
        let mut out = Vec::new();
        let n = export(&store, &HistoryFilter::default(), format, &mut out).unwrap();
        assert_eq!(n, 6);
        let back = parse_export(format, &mut out.as_slice()).unwrap();
        // Oldest first, exactly as stored.
        assert_eq!(back, calls, "{format:?}");
    }
}

#[test]
fn csv_export_has_the_documented_header_and_flat_rows() {
    let mut store = Store::open_in_memory().unwrap();
    store.insert_calls(&varied_calls()).unwrap();
    let mut out = Vec::new();
    let filter = HistoryFilter {
        model: Some("gemma3".into()),
        ..Default::default()
    };
    assert_eq!(
        export(&store, &filter, ExportFormat::Csv, &mut out).unwrap(),
        2
    );
    let text = String::from_utf8(out).unwrap();
    let lines: Vec<&str> = text.split("\r\n").collect();
    assert_eq!(
        lines[0],
        "id,route,api,model,client,status,http_status,started_at,settled_at,elapsed_ms,ttft_ms,\
         output_tokens,output_tokens_per_second,token_source,input_tokens,load_ms,prefill_ms,\
         prefill_tokens,cached_tokens,prefill_tokens_per_second,other_ms,one_burst,\
         unstreamed_reasoning,seen_by,capture_gap,wait_reason,wait_position,wait_progress,\
         wait_eta_ms,wait_usual_ms,wait_prompt_tokens,truncated_request_tokens,\
         truncated_server_tokens,truncated_context_size,context_size,context_used,draft_n,\
         draft_accepted,placement,model_bytes,vram_bytes,start,error,prompt_tokens_estimated,\
         queued_ms,queue_position,server_version,reasoning_tokens,reasoning_tokens_estimated,\
         reasoning_ms,slowdown,response_model,slow_after_ms,slow_after_usual_ms,failure_kind,\
         failure_after_tokens,failure_message,stalls,stalled_ms,longest_stall_ms,\
         longest_stall_after_token,output_tokens_per_second_excluding_stalls"
    );
    assert_eq!(
        lines[1],
        format!(
            "c-000005,llama,openai_chat,gemma3,openai-python,upstream_error,500,{},{},2000,250,80,,\
             server,37,,,,,,,false,false,proxy,false,,,,,,,,,,,,,,,,,,,,,,,,false,,,,,,,,,,,,,",
            ms_to_rfc3339(T0 + 4),
            ms_to_rfc3339(T0 + 2004)
        )
    );
    assert_eq!(lines.len(), 4, "two rows and the final CRLF");
    assert_eq!(lines[3], "");
}

#[test]
fn jsonl_export_is_one_flat_object_per_line() {
    let mut store = Store::open_in_memory().unwrap();
    store.insert_calls(&varied_calls()).unwrap();
    let mut out = Vec::new();
    let filter = HistoryFilter {
        since_ms: Some(T0 + 5),
        ..Default::default()
    };
    export(&store, &filter, ExportFormat::Jsonl, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert_eq!(text.lines().count(), 1);
    let v: serde_json::Value = serde_json::from_str(text.trim_end()).unwrap();
    assert_eq!(v["id"], "c-000006");
    assert_eq!(v["status"], "abandoned");
    assert_eq!(v["client"], "openai-python");
    assert_eq!(v["speed"]["time_to_first_token_ms"], 250);
    // Unset flags are left out, exactly as the API's `Call` writes them...
    assert_eq!(v.get("one_burst"), None);
    assert_eq!(v.get("unstreamed_reasoning"), None);
    // ...and set ones are there, once (no duplicate keys from the details).
    let mut out = Vec::new();
    export(
        &store,
        &HistoryFilter::default(),
        ExportFormat::Jsonl,
        &mut out,
    )
    .unwrap();
    let text = String::from_utf8(out).unwrap();
    let burst = text.lines().find(|l| l.contains("c-000002")).unwrap();
    assert_eq!(burst.matches("\"one_burst\"").count(), 1, "{burst}");
    let v: serde_json::Value = serde_json::from_str(burst).unwrap();
    assert_eq!(v["one_burst"], true);
    assert_eq!(v.get("settled_at"), None);
}

// ---------------------------------------------------------------- writer

#[test]
fn writer_batches_and_reports_every_call_exactly_once() {
    let tmp = TempDir::new("writer");
    let path = tmp.path("db.sqlite3");
    let (writer, seen) = spawn_recording(Store::open(&path).unwrap());
    let n = 1000u64;
    for i in 0..n {
        writer.record(ok(&format!("c-{i:06}"), T0 + i));
    }
    writer.flush();
    // After flush: every call reported, durable, readable by another
    // connection.
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    assert_eq!(seen.len() as u64, n, "one report per call");
    assert!(seen.iter().all(|(_, persisted)| *persisted));
    let unique: HashSet<&str> = seen.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(unique.len() as u64, n);
    assert_eq!(Store::open(&path).unwrap().count_calls().unwrap(), n);
    let stats = writer.stats();
    assert_eq!(stats.calls_written, n);
    // 1000 calls in at most 512 per batch: at least 2 transactions; "few",
    // not one per call, even on a loaded machine.
    assert!(
        (2..=10).contains(&stats.transactions),
        "{} transactions for {n} calls",
        stats.transactions
    );

    // A calibration snapshot goes through the same thread.
    let mut table = CalibrationTable::new();
    table.observe("ollama", "qwen3:8b", 1.2);
    writer.save_calibration(table.clone());
    writer.flush();
    assert_eq!(
        Store::open(&path).unwrap().load_calibration().unwrap(),
        table
    );

    // Shutdown commits what is still pending.
    writer.record(ok("c-last", T0 + n));
    writer.shutdown();
    assert_eq!(Store::open(&path).unwrap().count_calls().unwrap(), n + 1);
}

#[test]
fn writer_prunes_on_its_own_thread() {
    let tmp = TempDir::new("writer-prune");
    let path = tmp.path("db.sqlite3");
    let (writer, _seen) = spawn_recording(Store::open(&path).unwrap());
    writer.record(ok("old", T0));
    writer.record(ok("new", T0 + 2 * DAY_MS));
    // Prune commits the pending calls first, then deletes the old one.
    let report = writer
        .prune(T0 + 2 * DAY_MS, Duration::from_millis(DAY_MS), u64::MAX)
        .unwrap();
    assert_eq!(report.by_age, 1);
    let left = Store::open(&path)
        .unwrap()
        .history(&HistoryFilter::default())
        .unwrap();
    assert_eq!(ids(&left), ["new"]);
}

#[test]
fn writer_survives_a_full_disk_and_recovers() {
    log();
    let tmp = TempDir::new("full");
    let path = tmp.path("db.sqlite3");
    let (writer, seen) = spawn_recording(Store::open(&path).unwrap());
    for i in 0..100 {
        writer.record(ok(&format!("a-{i}"), T0 + i));
    }
    writer.flush();

    // Freeze the file at its current size: the next write that needs a new
    // page fails with SQLITE_FULL, as on a full disk (root can't be stopped
    // by file modes, but this works for anyone).
    let pages = writer.with_store(|s| s.page_count().unwrap()).unwrap();
    writer
        .with_store(move |s| s.set_max_page_count(pages).unwrap())
        .unwrap();
    for i in 0..300 {
        writer.record(ok(&format!("b-{i}"), T0 + 1000 + i));
    }
    writer.flush();
    for i in 0..50 {
        writer.record(ok(&format!("c-{i}"), T0 + 2000 + i));
    }
    writer.flush();
    {
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 450);
        assert!(seen[..100].iter().all(|(_, p)| *p));
        assert!(seen[100..].iter().all(|(_, p)| !*p), "reported unpersisted");
    }
    let stats = writer.stats();
    assert!(stats.failed_transactions >= 2);
    assert_eq!(stats.calls_reported_unpersisted, 350);
    let db = path.display().to_string();
    let warnings: Vec<_> = log_lines_with(&db)
        .into_iter()
        .filter(|l| l.contains("WARN"))
        .collect();
    assert_eq!(warnings.len(), 1, "one warning per episode: {warnings:#?}");
    assert!(warnings[0].contains("full"), "{}", warnings[0]);

    // The condition clears: held calls are written with the next batch.
    writer
        .with_store(|s| s.set_max_page_count(u64::MAX).unwrap())
        .unwrap();
    for i in 0..10 {
        writer.record(ok(&format!("d-{i}"), T0 + 3000 + i));
    }
    writer.flush();
    assert_eq!(seen.lock().unwrap().len(), 460);
    assert!(seen.lock().unwrap()[450..].iter().all(|(_, p)| *p));
    assert_eq!(Store::open(&path).unwrap().count_calls().unwrap(), 460);
    assert!(log_lines_with(&db)
        .iter()
        .any(|l| l.contains("writes work again")));
    writer.shutdown();
}

// ---------------------------------------------------------------- crash safety

const CRASH_CHILD_ENV: &str = "SPEEDTAP_STORE_CRASH_CHILD_DB";
const PERSISTED: &str = "persisted ";

/// The child half of `kill_9_loses_no_call_reported_persisted`: writes
/// calls through a `StoreWriter` as fast as it commits them and prints each
/// id once reported durable, until killed. Ignored in normal runs; the
/// parent runs it with `--ignored --exact`.
#[test]
#[ignore = "child process of kill_9_loses_no_call_reported_persisted"]
fn crash_child_writes_until_killed() {
    let Some(path) = std::env::var_os(CRASH_CHILD_ENV) else {
        return;
    };
    let persisted = Arc::new(AtomicU64::new(0));
    let count = Arc::clone(&persisted);
    let writer = StoreWriter::spawn(
        Store::open(Path::new(&path)).unwrap(),
        Box::new(move |ids, ok| {
            assert!(ok, "the child's writes should not fail");
            let mut text = String::new();
            for id in &ids {
                text.push_str(PERSISTED);
                text.push_str(id);
                text.push('\n');
            }
            // Straight to fd 1, past the test harness's capture.
            let mut out = std::io::stdout().lock();
            out.write_all(text.as_bytes()).unwrap();
            out.flush().unwrap();
            count.fetch_add(ids.len() as u64, Ordering::Relaxed);
        }),
    );
    for i in 0..5_000_000u64 {
        writer.record(ok(&format!("k-{i:07}"), T0 + i));
        // Back-pressure without sleeping: stay at most a few batches ahead.
        while i.saturating_sub(persisted.load(Ordering::Relaxed)) > 4096 {
            std::thread::yield_now();
        }
    }
}

#[cfg(unix)]
#[test]
fn kill_9_loses_no_call_reported_persisted() {
    use std::os::unix::process::ExitStatusExt;
    use std::process::{Command, Stdio};

    let tmp = TempDir::new("crash");
    let path = tmp.path("db.sqlite3");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            // The child's full name in this binary (its module path).
            concat!(module_path!(), "::crash_child_writes_until_killed")
                .split_once("::")
                .map_or("crash_child_writes_until_killed", |(_, name)| name),
            "--nocapture",
        ])
        .env(CRASH_CHILD_ENV, &path)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut reader = BufReader::new(child.stdout.take().unwrap());
    let mut reported = Vec::new();
    let mut line = String::new();
    // Kill it mid-stream, once it has reported a few batches.
    while reported.len() < 3000 {
        line.clear();
        let n = reader.read_line(&mut line).unwrap();
        assert!(n > 0, "child ended early after {} ids", reported.len());
        if let Some(id) = line.strip_prefix(PERSISTED) {
            reported.push(id.trim_end().to_owned());
        }
    }
    child.kill().unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.signal(), Some(9), "killed, not exited: {status:?}");
    // Whatever it had reported before dying, in full lines.
    loop {
        line.clear();
        if reader.read_line(&mut line).unwrap() == 0 {
            break;
        }
        if let (Some(id), true) = (line.strip_prefix(PERSISTED), line.ends_with('\n')) {
            reported.push(id.trim_end().to_owned());
        }
    }

    let store = Store::open(&path).unwrap();
    let stored: HashSet<String> = store
        .history(&HistoryFilter::default())
        .unwrap()
        .into_iter()
        .map(|c| c.identity.id)
        .collect();
    let missing: Vec<_> = reported.iter().filter(|id| !stored.contains(*id)).collect();
    assert!(
        missing.is_empty(),
        "{} reported ids lost, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(5)]
    );
    let ok: String = Connection::open(&path)
        .unwrap()
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(ok, "ok");
}

/// A call with every wait-explanation fact set.
fn with_facts(mut c: Call, context_used: u64, tps: f64) -> Call {
    use speedtap::model::{
        ContextUse, DraftCounts, Placement, PromptTruncation, StartKind, Wait, WaitReason,
    };
    c.details.wait = Some(Wait {
        progress: Some(0.625),
        eta_ms: Some(1200),
        usual_ms: Some(3000),
        prompt_tokens: Some(9000),
        ..Wait::new(WaitReason::Prefilling)
    });
    c.details.prompt_truncated = Some(PromptTruncation {
        request_tokens: 9000,
        server_tokens: 2048,
        context_size: Some(2048),
    });
    c.details.context = Some(ContextUse {
        size: Some(8192),
        used: context_used,
    });
    c.details.draft = Some(DraftCounts {
        drafted: 120,
        accepted: 96,
    });
    c.details.placement = Some(Placement::Split);
    c.details.model_bytes = Some(5_000_000_000);
    c.details.vram_bytes = Some(3_000_000_000);
    c.details.start = Some(StartKind::Cold);
    c.details.error = Some("the prompt is over the server's context size".into());
    c.details.prompt_tokens_estimated = Some(9000);
    c.speed.as_mut().unwrap().output_tokens_per_second = Some(tps);
    c
}

#[test]
fn the_wait_and_the_server_facts_round_trip_through_the_store_and_both_exports() {
    let mut store = Store::open_in_memory().unwrap();
    let rich = with_facts(ok("c-000001", T0), 3100, 41.5);
    let plain = ok("c-000002", T0 + 1);
    store.insert_calls(&[rich.clone(), plain.clone()]).unwrap();
    assert_eq!(
        store.history(&HistoryFilter::default()).unwrap(),
        vec![plain.clone(), rich.clone()]
    );
    for format in [ExportFormat::Csv, ExportFormat::Jsonl] {
        let mut out = Vec::new();
        export(&store, &HistoryFilter::default(), format, &mut out).unwrap();
        assert_eq!(
            parse_export(format, &mut out.as_slice()).unwrap(),
            vec![rich.clone(), plain.clone()],
            "{format:?}"
        );
    }
}

#[test]
fn a_slowdown_with_its_causes_round_trips_through_the_store_and_both_exports() {
    use speedtap::model::{Slowdown, SlowdownCause};
    let mut store = Store::open_in_memory().unwrap();
    let mut slow = with_facts(ok("c-000001", T0), 3100, 12.0);
    slow.details.slowdown = Some(Slowdown {
        usual_tps: 40.2,
        ratio: 0.3,
        causes: vec![
            SlowdownCause::CpuOffload { cpu_share: 0.29 },
            SlowdownCause::ServerChanged {
                from: "0.32.13".into(),
                to: "0.33.2, \"rc\"".into(),
            },
            SlowdownCause::Concurrent { calls: 2 },
        ],
    });
    let plain = ok("c-000002", T0 + 1);
    store.insert_calls(&[slow.clone(), plain.clone()]).unwrap();
    assert_eq!(
        store.history(&HistoryFilter::default()).unwrap(),
        vec![plain.clone(), slow.clone()]
    );
    for format in [ExportFormat::Csv, ExportFormat::Jsonl] {
        let mut out = Vec::new();
        export(&store, &HistoryFilter::default(), format, &mut out).unwrap();
        assert_eq!(
            parse_export(format, &mut out.as_slice()).unwrap(),
            vec![slow.clone(), plain.clone()],
            "{format:?}"
        );
    }
}

#[test]
fn the_model_the_answer_named_round_trips_through_the_store_and_both_exports() {
    let mut store = Store::open_in_memory().unwrap();
    let mut answered = ok("c-000001", T0);
    answered.details.response_model = Some("qwen3:8b-q4_K_M".into());
    let unnamed = ok("c-000002", T0 + 1);
    store
        .insert_calls(&[answered.clone(), unnamed.clone()])
        .unwrap();
    assert_eq!(
        store.history(&HistoryFilter::default()).unwrap(),
        vec![unnamed.clone(), answered.clone()]
    );
    for format in [ExportFormat::Csv, ExportFormat::Jsonl] {
        let mut out = Vec::new();
        export(&store, &HistoryFilter::default(), format, &mut out).unwrap();
        assert_eq!(
            parse_export(format, &mut out.as_slice()).unwrap(),
            vec![answered.clone(), unnamed.clone()],
            "{format:?}"
        );
    }
}

#[test]
fn the_depth_curve_has_one_point_per_settled_call_with_a_rate_and_a_depth() {
    use speedtap::model::DepthQuery;
    let mut store = Store::open_in_memory().unwrap();
    let mut calls = Vec::new();
    for (i, (depth, tps)) in [(1000, 44.0), (2000, 43.0), (3000, 42.0), (4000, 41.0)]
        .into_iter()
        .enumerate()
    {
        calls.push(with_facts(
            ok(&format!("c-{i:06}"), T0 + i as u64),
            depth,
            tps,
        ));
    }
    // No depth known, another model, another route: not on the curve.
    calls.push(ok("c-000010", T0 + 10));
    calls.push(with_facts(
        call("c-000011", T0 + 11, "ollama", Some("other"), CallStatus::Ok),
        500,
        10.0,
    ));
    calls.push(with_facts(
        call(
            "c-000012",
            T0 + 12,
            "llama",
            Some("qwen3:8b"),
            CallStatus::Ok,
        ),
        500,
        10.0,
    ));
    store.insert_calls(&calls).unwrap();
    let doc = store
        .depth(&DepthQuery {
            model: "qwen3:8b".into(),
            route: Some("ollama".into()),
            ..DepthQuery::default()
        })
        .unwrap();
    assert_eq!(
        doc.points
            .iter()
            .map(|p| p.context_tokens)
            .collect::<Vec<_>>(),
        [1000, 2000, 3000, 4000]
    );
    let fit = doc.fit.unwrap();
    assert!(
        (fit.a - 45.0).abs() < 1e-6 && (fit.b + 0.001).abs() < 1e-9,
        "{fit:?}"
    );
    let all_routes = store
        .depth(&DepthQuery {
            model: "qwen3:8b".into(),
            ..DepthQuery::default()
        })
        .unwrap();
    assert_eq!(all_routes.points.len(), 5);
}
