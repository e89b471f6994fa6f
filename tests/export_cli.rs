//! `speedtap export` as a user runs it: the real binary over a database
//! seeded through `speedtap::store::Store`. CSV and JSON Lines read back
//! (with `speedtap::store::parse_export`) to exactly the stored calls, the
//! filters select what they say, stdout carries only the export and stderr
//! one summary line, and the exit codes are the contract's: 2 for bad flags,
//! 1 for a database that is missing (never created) or unreadable.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use speedtap::model::time::ms_to_rfc3339;
use speedtap::model::ApiKind;
use speedtap::model::{Call, CallDetails, CallIdentity, CallStatus, TtftBreakdown};
use speedtap::model::{ExportFormat, HistoryFilter};
use speedtap::model::{Phase, Snapshot, TokenSource};
use speedtap::store::{parse_export, Store};

const BIN: &str = env!("CARGO_BIN_EXE_speedtap");

/// 2026-11-30T10:42:07.123Z
const T0: u64 = 1_796_035_327_123;
const HOUR_MS: u64 = 3_600_000;

/// A fresh, empty scratch directory for one test.
fn scratch(test: &str) -> PathBuf {
    crate::util::process::scratch("export_cli", test)
}

/// Runs `speedtap ARGS` to completion with the platform config and data
/// dirs pointed into `dir`, so a user's own files are never read.
fn speedtap(dir: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("XDG_CONFIG_HOME", dir.join("config"))
        .env("XDG_DATA_HOME", dir.join("data"))
        .env("HOME", dir)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout(out: &Output) -> String {
    String::from_utf8(out.stdout.clone()).unwrap()
}

/// An `ok` call with a final snapshot; tweak fields for variety.
fn call(id: &str, started_ms: u64, route: &str, model: Option<&str>, client: &str) -> Call {
    Call {
        identity: CallIdentity {
            id: id.into(),
            route: route.into(),
            api: ApiKind::OpenaiChat,
            model: model.map(Into::into),
            started_at: ms_to_rfc3339(started_ms),
            demo: false,
        },
        status: CallStatus::Ok,
        http_status: Some(200),
        speed: Some(Snapshot {
            stalled_ms: None,
            phase: Phase::Complete,
            is_final: true,
            elapsed_ms: 3000,
            time_to_first_token_ms: Some(240),
            output_tokens: 120,
            output_tokens_per_second: Some(43.2),
            token_source: TokenSource::Server,
            wait: None,
        }),
        input_tokens: Some(50),
        details: CallDetails {
            client: Some(client.into()),
            ttft_breakdown: None,
            one_burst: false,
            unstreamed_reasoning: false,
            settled_at: Some(ms_to_rfc3339(started_ms + 3000)),
            ..CallDetails::default()
        },
    }
}

/// Five calls an hour apart, oldest first: two models on `ollama`, one on
/// `llamacpp`, a call that named no model, a model name CSV must quote, a
/// TTFT breakdown, both flags, an unmetered and a failed call.
fn seeded_calls() -> Vec<Call> {
    let mut a = call("c-000001", T0, "ollama", Some("qwen3:8b"), "openai-python");
    a.details.ttft_breakdown = Some(TtftBreakdown {
        load_ms: Some(812.5),
        prefill_ms: Some(96.3),
        prefill_tokens: Some(50),
        cached_tokens: Some(0),
        prefill_tokens_per_second: Some(519.2),
        other_ms: Some(12.0),
    });
    let mut b = call(
        "c-000002",
        T0 + HOUR_MS,
        "ollama",
        Some("gemma3:12b"),
        "curl",
    );
    b.details.one_burst = true;
    b.speed.as_mut().unwrap().output_tokens_per_second = None;
    let mut c = call(
        "c-000003",
        T0 + 2 * HOUR_MS,
        "llamacpp",
        Some("odd, \"quoted\"\nname"),
        "openai-python",
    );
    c.details.unstreamed_reasoning = true;
    c.speed.as_mut().unwrap().token_source = TokenSource::Estimated;
    let mut d = call("c-000004", T0 + 3 * HOUR_MS, "llamacpp", None, "curl");
    d.identity.api = ApiKind::Unknown;
    d.status = CallStatus::Unmetered;
    d.speed = None;
    d.input_tokens = None;
    let mut e = call(
        "c-000005",
        T0 + 4 * HOUR_MS,
        "ollama",
        Some("qwen3:8b"),
        "openai-python",
    );
    e.status = CallStatus::UpstreamError;
    e.http_status = Some(500);
    e.speed.as_mut().unwrap().output_tokens_per_second = None;
    vec![a, b, c, d, e]
}

/// `dir/history.sqlite3` holding [`seeded_calls`]; the store is closed
/// before the binary runs.
fn seeded_db(dir: &Path) -> PathBuf {
    let path = dir.join("history.sqlite3");
    let mut store = Store::open(&path).unwrap();
    store.insert_calls(&seeded_calls()).unwrap();
    // What the store gives back is what an export must reproduce.
    let mut back = store.history(&HistoryFilter::default()).unwrap();
    back.reverse();
    assert_eq!(back, seeded_calls());
    path
}

fn format_of(name: &str) -> ExportFormat {
    name.parse().unwrap()
}

fn parse(format: &str, text: &str) -> Vec<Call> {
    parse_export(format_of(format), &mut text.as_bytes())
        .unwrap_or_else(|e| panic!("{format} export unreadable ({e}):\n{text}"))
}

fn ids(calls: &[Call]) -> Vec<&str> {
    calls.iter().map(|c| c.identity.id.as_str()).collect()
}

/// Exports with `args` (plus `--db db --format FORMAT`) in both formats;
/// checks both succeed, agree and say how many they wrote; returns the ids.
fn exported_ids(dir: &Path, db: &Path, args: &[&str]) -> Vec<String> {
    let mut per_format = Vec::new();
    for format in ["csv", "jsonl"] {
        let mut full = vec!["export", "--format", format, "--db", db.to_str().unwrap()];
        full.extend_from_slice(args);
        let out = speedtap(dir, &full);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stderr(&out));
        let calls = parse(format, &stdout(&out));
        let n = calls.len();
        let noun = if n == 1 { "call" } else { "calls" };
        assert_eq!(
            stderr(&out),
            format!(
                "speedtap: exported {n} {noun} to stdout from {}\n",
                db.display()
            ),
            "{args:?}"
        );
        per_format.push(ids(&calls).iter().map(|s| s.to_string()).collect());
    }
    assert_eq!(
        per_format[0], per_format[1],
        "csv and jsonl differ: {args:?}"
    );
    per_format.remove(0)
}

// ---------------------------------------------------------------- round trips

#[test]
fn csv_and_jsonl_read_back_to_the_stored_calls_oldest_first() {
    let dir = scratch("round_trip");
    let db = seeded_db(&dir);
    for format in ["csv", "jsonl"] {
        let out = speedtap(
            &dir,
            &["export", "--format", format, "--db", db.to_str().unwrap()],
        );
        assert_eq!(out.status.code(), Some(0), "{format}: {}", stderr(&out));
        assert_eq!(
            stderr(&out),
            format!(
                "speedtap: exported 5 calls to stdout from {}\n",
                db.display()
            )
        );
        let text = stdout(&out);
        assert_eq!(parse(format, &text), seeded_calls(), "{format}:\n{text}");
    }
}

#[test]
fn csv_has_its_header_and_jsonl_one_flat_call_per_line() {
    let dir = scratch("shapes");
    let db = seeded_db(&dir);
    let db = db.to_str().unwrap();

    let csv = stdout(&speedtap(&dir, &["export", "--format", "csv", "--db", db]));
    let header = csv.split("\r\n").next().unwrap();
    assert!(
        header.starts_with("id,route,api,model,client,status,http_status,started_at,"),
        "{header}"
    );
    // The model name with a comma, quotes and a line break is quoted.
    assert!(
        csv.contains("llamacpp,openai_chat,\"odd, \"\"quoted\"\"\nname\",openai-python,"),
        "{csv}"
    );

    let jsonl = stdout(&speedtap(
        &dir,
        &["export", "--format", "JSONL", "--db", db],
    ));
    let lines: Vec<&str> = jsonl.lines().collect();
    assert_eq!(lines.len(), 5);
    let first: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
    // The contract's fields and the details side by side, each once.
    assert_eq!(first["id"], "c-000001");
    assert_eq!(first["client"], "openai-python");
    assert_eq!(first["ttft_breakdown"]["prefill_tokens_per_second"], 519.2);
    assert_eq!(first["speed"]["time_to_first_token_ms"], 240);
    assert_eq!(lines[0].matches("\"client\"").count(), 1, "{}", lines[0]);
    let second: serde_json::Value = serde_json::from_str(lines[1]).unwrap();
    assert_eq!(second["one_burst"], true);
}

#[test]
fn output_goes_to_the_named_file_and_stdout_stays_empty() {
    let dir = scratch("output");
    let db = seeded_db(&dir);
    let file = dir.join("calls.jsonl");
    std::fs::write(&file, "old content that must be replaced\n").unwrap();
    let out = speedtap(
        &dir,
        &[
            "export",
            "--format",
            "jsonl",
            "--db",
            db.to_str().unwrap(),
            "--route",
            "ollama",
            "-o",
            file.to_str().unwrap(),
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(out.stdout.is_empty());
    assert_eq!(
        stderr(&out),
        format!(
            "speedtap: exported 3 calls to {} from {}\n",
            file.display(),
            db.display()
        )
    );
    let back = parse("jsonl", &std::fs::read_to_string(&file).unwrap());
    assert_eq!(ids(&back), ["c-000001", "c-000002", "c-000005"]);

    // Pointing --output at the database itself is refused before anything
    // is truncated.
    let before = std::fs::read(&db).unwrap();
    let out = speedtap(
        &dir,
        &[
            "export",
            "--format",
            "csv",
            "--db",
            db.to_str().unwrap(),
            "--output",
            db.to_str().unwrap(),
        ],
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--output"), "{}", stderr(&out));
    assert!(
        std::fs::read(&db).unwrap() == before,
        "the database changed"
    );
}

// ---------------------------------------------------------------- filters

#[test]
fn filters_select_by_model_route_client_and_time() {
    let dir = scratch("filters");
    let db = seeded_db(&dir);
    let cases: &[(&[&str], &[&str])] = &[
        (
            &[],
            &["c-000001", "c-000002", "c-000003", "c-000004", "c-000005"],
        ),
        (&["--model", "qwen3:8b"], &["c-000001", "c-000005"]),
        // An empty model selects the calls that named none.
        (&["--model", ""], &["c-000004"]),
        (&["--route", "llamacpp"], &["c-000003", "c-000004"]),
        (&["--client", "curl"], &["c-000002", "c-000004"]),
        (
            &["--route", "ollama", "--client", "openai-python"],
            &["c-000001", "c-000005"],
        ),
        (&["--model", "no-such-model"], &[]),
        // since is inclusive, until exclusive: [T0 + 1 h, T0 + 3 h).
        (
            &[
                "--since",
                "2026-11-30T11:42:07.123Z",
                "--until",
                "2026-11-30T13:42:07.123Z",
            ],
            &["c-000002", "c-000003"],
        ),
        // Unix milliseconds work too, and RFC 3339 without fractions.
        (&["--since", "1796049727123"], &["c-000005"]),
        (&["--until", "2026-11-30T11:00:00Z"], &["c-000001"]),
    ];
    for (args, want) in cases {
        assert_eq!(exported_ids(&dir, &db, args), *want, "{args:?}");
    }
}

// ---------------------------------------------------------------- errors

#[test]
fn bad_flags_exit_2_naming_the_flag_and_write_nothing() {
    let dir = scratch("bad_flags");
    let db = seeded_db(&dir);
    let db = db.to_str().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (&["--since", "yesterday"], "--since"),
        (&["--until", "2026-13-45T99:00:00Z"], "--until"),
        (&["--since=-5"], "--since"),
        (
            &[
                "--since",
                "2026-11-30T12:00:00Z",
                "--until",
                "2026-11-30T11:00:00Z",
            ],
            "--since",
        ),
    ];
    for (extra, flag) in cases {
        let mut args = vec!["export", "--format", "csv", "--db", db];
        args.extend_from_slice(extra);
        let out = speedtap(&dir, &args);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(flag), "{extra:?}: {}", stderr(&out));
        assert!(out.stdout.is_empty(), "{extra:?}");
    }
    let out = speedtap(&dir, &["export", "--format", "xml", "--db", db]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--format"), "{}", stderr(&out));
    let out = speedtap(&dir, &["export", "--db", db]);
    assert_eq!(out.status.code(), Some(2), "--format is required");
}

#[test]
fn a_missing_database_exits_1_naming_it_and_is_not_created() {
    let dir = scratch("missing");
    let db = dir.join("sub").join("nothing-here.sqlite3");
    let out = speedtap(
        &dir,
        &["export", "--format", "csv", "--db", db.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains(&db.display().to_string()), "{err}");
    assert!(err.contains("no history database"), "{err}");
    assert!(out.stdout.is_empty());
    assert!(!db.exists() && !dir.join("sub").exists());

    // The default path (in the platform data dir) is not created either.
    let out = speedtap(&dir, &["export", "--format", "jsonl"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let default_db = dir.join("data").join("speedtap").join("speedtap.sqlite3");
    assert!(
        stderr(&out).contains(&default_db.display().to_string()),
        "{}",
        stderr(&out)
    );
    assert!(!dir.join("data").exists());
}

#[test]
fn a_file_that_is_not_a_database_exits_1_naming_it() {
    let dir = scratch("not_a_db");
    let junk = dir.join("notes.txt");
    std::fs::write(
        &junk,
        "not a database, just some text long enough to read\n",
    )
    .unwrap();
    let out = speedtap(
        &dir,
        &["export", "--format", "csv", "--db", junk.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&junk.display().to_string()),
        "{}",
        stderr(&out)
    );
    assert!(out.stdout.is_empty());
}

// ---------------------------------------------------------------- which db

#[test]
fn without_db_the_config_files_db_then_the_platform_default_is_read() {
    let dir = scratch("which_db");
    // The platform default: XDG_DATA_HOME/speedtap/speedtap.sqlite3.
    let default_db = dir.join("data").join("speedtap").join("speedtap.sqlite3");
    std::fs::create_dir_all(default_db.parent().unwrap()).unwrap();
    let mut store = Store::open(&default_db).unwrap();
    store.insert_calls(&seeded_calls()[..2]).unwrap();
    drop(store);
    let out = speedtap(&dir, &["export", "--format", "csv"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(ids(&parse("csv", &stdout(&out))), ["c-000001", "c-000002"]);

    // A config file's `db` (relative to the file) wins over the default,
    // whether named with --config or found at the platform path.
    seeded_db(&dir);
    let config = dir.join("config").join("speedtap");
    std::fs::create_dir_all(&config).unwrap();
    let config = config.join("speedtap.toml");
    std::fs::write(&config, "db = \"../../history.sqlite3\"\n").unwrap();
    for args in [
        vec!["export", "--format", "csv"],
        vec![
            "export",
            "--format",
            "csv",
            "--config",
            config.to_str().unwrap(),
        ],
    ] {
        let out = speedtap(&dir, &args);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stderr(&out));
        assert_eq!(parse("csv", &stdout(&out)).len(), 5, "{args:?}");
    }
    // --db wins over both.
    let out = speedtap(
        &dir,
        &[
            "export",
            "--format",
            "csv",
            "--db",
            default_db.to_str().unwrap(),
        ],
    );
    assert_eq!(parse("csv", &stdout(&out)).len(), 2);

    // `db = false` means memory only: nothing to export, a usage error.
    std::fs::write(&config, "db = false\n").unwrap();
    let out = speedtap(&dir, &["export", "--format", "csv"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("memory only"), "{}", stderr(&out));
}

#[test]
fn exporting_leaves_the_database_file_unchanged() {
    let dir = scratch("read_only");
    let db = seeded_db(&dir);
    let before = std::fs::read(&db).unwrap();
    let out = speedtap(
        &dir,
        &["export", "--format", "jsonl", "--db", db.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // Not a byte differs: opening for export wrote nothing (not even the
    // header's change counter).
    assert!(
        std::fs::read(&db).unwrap() == before,
        "the database changed"
    );
    assert_eq!(Store::open(&db).unwrap().count_calls().unwrap(), 5);
}
