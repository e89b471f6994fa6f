//! The `speedtap` binary as a user runs it: exit codes and messages for bad
//! usage, a taken port, the `--json` lines and the control API's SSE stream
//! through a real `speedtap simulate` upstream, and clean stops on
//! SIGTERM/SIGINT (`docs/api.md`).
//!
//! Every process gets port 0 wherever the CLI allows it (routes, the API,
//! `simulate --listen`), and the test reads the real addresses from what the
//! process prints. The HTTP clients are raw `TcpStream`s speaking HTTP/1.1,
//! so what is checked is the bytes on the wire, not a client library's view.
//! The JSON is checked as plain `serde_json::Value`s against the contract's
//! field names, not by deserialising into the crate's own types (which would
//! accept whatever the crate happens to write).
//!
//! Waiting is always "until this happens or a deadline passes": lines are
//! read by threads and handed over through channels.

use crate::util::process::{self, read_announcement, speedtap, start_simulate, Proc, Run, STARTUP};
use crate::util::raw_http;

use std::collections::BTreeSet;
use std::io::{BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use raw_http::{connect, read_body, read_chunk, read_head, request};

/// How long a process may take to fail on bad usage (it should be instant).
const QUICK_EXIT: Duration = Duration::from_secs(15);

// ---------------------------------------------------------------------------
// Processes (the shared helpers are in tests/util/process.rs)
// ---------------------------------------------------------------------------

/// A fresh, empty scratch directory for one CLI test.
fn scratch(test: &str) -> PathBuf {
    process::scratch("cli", test)
}

/// What a process that should stop on its own left behind.
struct Finished {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs `speedtap ARGS` expecting it to exit by itself, quickly.
fn run_to_exit(dir: &std::path::Path, args: &[&str]) -> Finished {
    let mut p = Proc::spawn(speedtap(dir, args));
    let (status, _) = p.wait_exit_timed(QUICK_EXIT);
    Finished {
        code: status.code(),
        stdout: p.stdout.finish_lines().join("\n"),
        stderr: p.stderr.finish_lines().join("\n"),
    }
}

/// A running `speedtap run --no-db` with one route `sim` to `upstream`.
fn start_run(dir: &std::path::Path, upstream: SocketAddr) -> Run {
    process::start_run_with(dir, upstream, &["--no-db"], &[])
}

// ---------------------------------------------------------------------------
// HTTP/1.1 by hand
// ---------------------------------------------------------------------------

/// A streamed chat completion as a client sends it.
fn chat_request_body() -> String {
    json!({
        "model": "sim-model",
        "stream": true,
        "messages": [{"role": "user", "content": "Count to a hundred."}]
    })
    .to_string()
}

/// Streams one chat completion through `proxy` to the end.
fn stream_chat(proxy: SocketAddr) -> (u16, String, bool) {
    let mut stream = connect(proxy);
    stream
        .write_all(&request(
            "POST",
            proxy,
            "/v1/chat/completions",
            chat_request_body().as_bytes(),
            &[],
        ))
        .unwrap();
    let mut r = BufReader::new(stream);
    let head = read_head(&mut r).expect("a response head");
    let (body, complete) = read_body(&mut r, &head);
    (
        head.status,
        String::from_utf8_lossy(&body).into_owned(),
        complete,
    )
}

/// One Server-Sent Event.
#[derive(Debug, Clone)]
struct Sse {
    event: String,
    data: String,
}

/// Subscribes to `GET /api/v1/events`; returns once the response head is
/// in (the API subscribes before it answers, so nothing published after
/// this is missed) with a channel of the events.
fn subscribe_events(api: SocketAddr) -> Receiver<Sse> {
    let mut stream = connect(api);
    stream
        .write_all(format!("GET /api/v1/events HTTP/1.1\r\nHost: {api}\r\n\r\n").as_bytes())
        .unwrap();
    let mut r = BufReader::new(stream);
    let head = read_head(&mut r).expect("the events response head");
    assert_eq!(head.status, 200);
    assert!(
        head.header("content-type")
            .is_some_and(|v| v.starts_with("text/event-stream")),
        "content-type {:?}",
        head.header("content-type")
    );
    let chunked = head
        .header("transfer-encoding")
        .is_some_and(|v| v.eq_ignore_ascii_case("chunked"));
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let mut pending = Vec::<u8>::new();
        let (mut event, mut data) = (String::new(), Vec::<String>::new());
        loop {
            let bytes = if chunked {
                match read_chunk(&mut r) {
                    Ok(Some(b)) => b,
                    _ => return,
                }
            } else {
                let mut buf = vec![0; 4096];
                match r.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf[..n].to_vec(),
                }
            };
            pending.extend_from_slice(&bytes);
            while let Some(nl) = pending.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = pending.drain(..=nl).collect();
                let line = String::from_utf8_lossy(&line);
                let line = line.trim_end_matches(['\n', '\r']);
                if line.is_empty() {
                    if !data.is_empty() || !event.is_empty() {
                        let sse = Sse {
                            event: std::mem::take(&mut event),
                            data: std::mem::take(&mut data).join("\n"),
                        };
                        if tx.send(sse).is_err() {
                            return;
                        }
                    }
                } else if let Some(v) = line.strip_prefix("event:") {
                    event = v.trim_start().to_string();
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push(v.strip_prefix(' ').unwrap_or(v).to_string());
                }
                // `:` comments (keep-alives) and other fields are skipped.
            }
        }
    });
    rx
}

// ---------------------------------------------------------------------------
// The contract's shapes
// ---------------------------------------------------------------------------

const PHASES: [&str; 5] = [
    "awaiting_first_token",
    "reasoning",
    "responding",
    "calling_tool",
    "complete",
];
const TOKEN_SOURCES: [&str; 3] = ["estimated", "provider", "server"];
const APIS: [&str; 9] = [
    "openai_chat",
    "openai_completions",
    "openai_responses",
    "anthropic_messages",
    "ollama_chat",
    "ollama_generate",
    "llamacpp_completion",
    "tgi_generate",
    "unknown",
];

fn keys(v: &Value) -> BTreeSet<&str> {
    v.as_object()
        .unwrap_or_else(|| panic!("not an object: {v}"))
        .keys()
        .map(String::as_str)
        .collect()
}

/// Checks that `v`'s keys hold every `required` one and nothing outside
/// `required` + `optional`.
fn check_keys(v: &Value, required: &[&str], optional: &[&str], ctx: &str) {
    let have = keys(v);
    for k in required {
        assert!(have.contains(k), "{ctx}: `{k}` missing from {v}");
    }
    for k in &have {
        assert!(
            required.contains(k) || optional.contains(k),
            "{ctx}: unexpected key `{k}` in {v}"
        );
    }
}

/// `2026-11-30T10:42:07.123Z`.
fn is_rfc3339_millis_utc(s: &str) -> bool {
    let pattern = b"dddd-dd-ddTdd:dd:dd.dddZ";
    s.len() == pattern.len()
        && s.bytes().zip(pattern).all(|(c, &p)| match p {
            b'd' => c.is_ascii_digit(),
            _ => c == p,
        })
}

fn check_identity(call: &Value, ctx: &str) {
    check_keys(call, &["id", "route", "api", "started_at"], &["model"], ctx);
    assert!(
        call["id"].as_str().is_some_and(|s| !s.is_empty()),
        "{ctx}: id"
    );
    assert!(call["route"].is_string(), "{ctx}: route");
    assert!(
        call["api"].as_str().is_some_and(|a| APIS.contains(&a)),
        "{ctx}: api {}",
        call["api"]
    );
    assert!(
        call["started_at"]
            .as_str()
            .is_some_and(is_rfc3339_millis_utc),
        "{ctx}: started_at {}",
        call["started_at"]
    );
    if let Some(model) = call.get("model") {
        assert!(model.is_string(), "{ctx}: model {model}");
    }
}

fn check_snapshot(speed: &Value, ctx: &str) {
    check_keys(
        speed,
        &[
            "phase",
            "is_final",
            "elapsed_ms",
            "output_tokens",
            "token_source",
        ],
        &["time_to_first_token_ms", "output_tokens_per_second", "wait"],
        ctx,
    );
    assert!(
        speed["phase"].as_str().is_some_and(|p| PHASES.contains(&p)),
        "{ctx}: phase {}",
        speed["phase"]
    );
    assert!(speed["is_final"].is_boolean(), "{ctx}: is_final");
    assert!(speed["elapsed_ms"].is_u64(), "{ctx}: elapsed_ms");
    assert!(speed["output_tokens"].is_u64(), "{ctx}: output_tokens");
    assert!(
        speed["token_source"]
            .as_str()
            .is_some_and(|s| TOKEN_SOURCES.contains(&s)),
        "{ctx}: token_source {}",
        speed["token_source"]
    );
    if let Some(t) = speed.get("time_to_first_token_ms") {
        assert!(t.is_u64(), "{ctx}: time_to_first_token_ms {t}");
    }
    if let Some(r) = speed.get("output_tokens_per_second") {
        assert!(
            r.as_f64().is_some_and(|r| r.is_finite() && r >= 0.0),
            "{ctx}: output_tokens_per_second {r}"
        );
    }
}

/// `{"call": CallIdentity, "speed": Snapshot, "seen_by": ...}`: a `--json`
/// line and an SSE `speed` frame alike.
fn check_speed_event(text: &str, ctx: &str) -> Value {
    let v: Value =
        serde_json::from_str(text).unwrap_or_else(|e| panic!("{ctx}: not JSON ({e}): {text}"));
    check_keys(&v, &["call", "speed", "seen_by"], &[], ctx);
    assert_eq!(v["seen_by"], "proxy", "{ctx}: a proxied call");
    check_identity(&v["call"], ctx);
    check_snapshot(&v["speed"], ctx);
    v
}

fn check_stats(text: &str) {
    let v: Value =
        serde_json::from_str(text).unwrap_or_else(|e| panic!("stats: not JSON ({e}): {text}"));
    check_keys(
        &v,
        &[
            "tps_available",
            "estimated",
            "active",
            "dropped_subscribers",
            "capture_dropped_packets",
        ],
        &["tps", "high", "low", "aggregate_tps"],
        "stats",
    );
    assert!(v["estimated"].is_boolean(), "stats: {v}");
    assert!(v["active"].is_u64(), "stats: {v}");
    let available = v["tps_available"]
        .as_bool()
        .unwrap_or_else(|| panic!("stats: {v}"));
    // `tps` is absent exactly when it is not available.
    assert_eq!(v.get("tps").is_some(), available, "stats: {v}");
    for k in ["tps", "high", "low", "aggregate_tps"] {
        if let Some(x) = v.get(k) {
            assert!(
                x.as_f64().is_some_and(|x| x.is_finite() && x >= 0.0),
                "stats: {k} {x}"
            );
        }
    }
}

fn call_id(event: &Value) -> &str {
    event["call"]["id"].as_str().unwrap()
}

fn is_final(event: &Value) -> bool {
    event["speed"]["is_final"] == true
}

/// A call's events in order: exactly one final, and it comes last; time and
/// token count never go backwards.
fn check_call_sequence(events: &[&Value], ctx: &str) {
    assert!(!events.is_empty(), "{ctx}: no events");
    // docs/metering.md: the first snapshot is published at dispatch.
    assert_eq!(
        events[0]["speed"]["phase"], "awaiting_first_token",
        "{ctx}: the first snapshot was lost: {events:?}"
    );
    let finals = events.iter().filter(|e| is_final(e)).count();
    assert_eq!(finals, 1, "{ctx}: {finals} final snapshots in {events:?}");
    assert!(
        is_final(events.last().unwrap()),
        "{ctx}: the last snapshot is not final: {events:?}"
    );
    for pair in events.windows(2) {
        let (a, b) = (&pair[0]["speed"], &pair[1]["speed"]);
        assert!(
            a["elapsed_ms"].as_u64() <= b["elapsed_ms"].as_u64(),
            "{ctx}: elapsed_ms went back: {a} then {b}"
        );
        assert!(
            a["output_tokens"].as_u64() <= b["output_tokens"].as_u64(),
            "{ctx}: output_tokens went back: {a} then {b}"
        );
    }
}

// ---------------------------------------------------------------------------
// Bad usage and config: exit 2, naming the flag or the line
// ---------------------------------------------------------------------------

/// A config whose routes and API take any free port; `extra` lines go at
/// the end of the route entry.
fn config_text(upstream: &str, extra: &str) -> String {
    format!(
        "# speedtap test config\n\
         slow_ttft_ms = 2000\n\
         api = \"127.0.0.1:0\"\n\
         \n\
         [[route]]\n\
         name = \"fromfile\"\n\
         listen = \"127.0.0.1:0\"\n\
         upstream = \"{upstream}\"\n\
         {extra}"
    )
}

#[test]
fn config_file_errors_exit_2_naming_the_file_and_line() {
    let dir = scratch("config_errors");
    let cases = [
        // (file name, text, the line named)
        (
            "syntax.toml",
            config_text("http://127.0.0.1:9", "this line is not toml\n"),
            9,
        ),
        (
            "unknown_key.toml",
            config_text("http://127.0.0.1:9", "colour = \"red\"\n"),
            9,
        ),
        ("bad_upstream.toml", config_text("ftp://127.0.0.1:9", ""), 8),
        (
            "bad_top_level.toml",
            format!("retries = 3\n{}", config_text("http://127.0.0.1:9", "")),
            1,
        ),
    ];
    for (name, text, line) in cases {
        let path = dir.join(name);
        std::fs::write(&path, &text).unwrap();
        let out = run_to_exit(
            &dir,
            &["run", "--no-db", "--config", path.to_str().unwrap()],
        );
        assert_eq!(out.code, Some(2), "{name}: stderr {}", out.stderr);
        assert!(
            out.stderr.contains(path.to_str().unwrap()),
            "{name}: the message doesn't name the file: {}",
            out.stderr
        );
        assert!(
            out.stderr.contains(&format!("line {line}:")),
            "{name}: the message doesn't name line {line}: {}",
            out.stderr
        );
        assert!(out.stdout.is_empty(), "{name}: stdout {}", out.stdout);
    }
}

#[test]
fn missing_config_file_exits_2_naming_it() {
    let dir = scratch("missing_config");
    let path = dir.join("nowhere.toml");
    let out = run_to_exit(
        &dir,
        &["run", "--no-db", "--config", path.to_str().unwrap()],
    );
    assert_eq!(out.code, Some(2), "stderr {}", out.stderr);
    assert!(out.stderr.contains("nowhere.toml"), "{}", out.stderr);
}

/// A route forwarding to speedtap's own listener would loop each request
/// through the proxy until memory runs out: it is refused before anything
/// binds, naming the route and where it was given (the file's `upstream`
/// line, or the flag).
#[test]
fn a_route_whose_upstream_is_its_own_listener_is_refused_at_start() {
    let dir = scratch("self_loop");
    let path = dir.join("loop.toml");
    let text = "api = \"127.0.0.1:0\"\n\n[[route]]\nname = \"looped\"\n\
                listen = \"127.0.0.1:9311\"\nupstream = \"http://localhost:9311\"\n";
    std::fs::write(&path, text).unwrap();
    let out = run_to_exit(
        &dir,
        &["run", "--no-db", "--config", path.to_str().unwrap()],
    );
    assert_eq!(out.code, Some(2), "stderr {}", out.stderr);
    for fragment in [
        path.to_str().unwrap(),
        "line 6:",
        "route \"looped\"",
        "loop back into speedtap",
    ] {
        assert!(
            out.stderr.contains(fragment),
            "{fragment:?}: {}",
            out.stderr
        );
    }
    let out = run_to_exit(
        &dir,
        &[
            "run",
            "--no-db",
            "--api",
            "127.0.0.1:0",
            "--route",
            "looped=127.0.0.1:9312=http://127.0.0.1:9312",
        ],
    );
    assert_eq!(out.code, Some(2), "stderr {}", out.stderr);
    for fragment in ["--route looped", "loop back into speedtap"] {
        assert!(
            out.stderr.contains(fragment),
            "{fragment:?}: {}",
            out.stderr
        );
    }
    assert!(
        !out.stderr.contains("speedtap: route "),
        "started a route: {}",
        out.stderr
    );
}

/// A capture-only route (`--route NAME=UPSTREAM`, no listen
/// address) with the capture off would measure nothing: exit 2, naming the
/// route and both fixes.
#[test]
fn a_capture_only_route_without_capture_exits_2_naming_the_route_and_the_fix() {
    let dir = scratch("capture_only_without_capture");
    let out = run_to_exit(
        &dir,
        &[
            "run",
            "--no-db",
            "--api",
            "127.0.0.1:0",
            "--route",
            "direct=http://127.0.0.1:9",
        ],
    );
    assert_eq!(out.code, Some(2), "stderr {}", out.stderr);
    for fragment in [
        "--route direct=http://127.0.0.1:9",
        "the capture is off",
        "add --capture",
        "--route direct=LISTEN=UPSTREAM",
    ] {
        assert!(
            out.stderr.contains(fragment),
            "{fragment:?}: {}",
            out.stderr
        );
    }
}

/// The good version of the files above starts: the errors were the lines',
/// and routes and the API from a file come up.
#[cfg(unix)]
#[test]
fn valid_config_file_starts_its_routes_and_stops_on_sigterm() {
    let dir = scratch("config_valid");
    let path = dir.join("good.toml");
    std::fs::write(&path, config_text("http://127.0.0.1:9", "")).unwrap();
    let mut p = Proc::spawn(speedtap(
        &dir,
        &[
            "run",
            "--no-db",
            "--json",
            "--config",
            path.to_str().unwrap(),
        ],
    ));
    let (proxy, api) = read_announcement(&p, "fromfile");
    assert_ne!(proxy.port(), 0);
    assert_ne!(api.port(), 0);
    p.signal("TERM");
    let (status, took) = p.wait_exit_timed(Duration::from_secs(6));
    assert_eq!(
        status.code(),
        Some(0),
        "stderr {:?}",
        p.stderr.finish_lines()
    );
    assert!(took <= Duration::from_secs(6));
}

/// A script or service manager stops speedtap as soon as it has printed
/// its start lines: that is a clean stop (exit 0), not death by the
/// signal's default action.
#[cfg(unix)]
#[test]
fn a_stop_signal_right_after_the_start_lines_is_a_clean_stop() {
    let dir = scratch("signal_at_start");
    for (i, signal) in ["TERM", "INT", "TERM", "INT"].into_iter().enumerate() {
        let mut p = Proc::spawn(speedtap(
            &dir,
            &[
                "run",
                "--no-db",
                "--json",
                "--api",
                "127.0.0.1:0",
                "--route",
                "a=127.0.0.1:0=http://127.0.0.1:9",
            ],
        ));
        read_announcement(&p, "a");
        p.signal(signal);
        let (status, _) = p.wait_exit_timed(Duration::from_secs(6));
        assert_eq!(
            status.code(),
            Some(0),
            "run {i}, SIG{signal}: {status}; stderr {:?}",
            p.stderr.finish_lines()
        );
    }
}

#[test]
fn bad_flags_exit_2_naming_the_flag() {
    let dir = scratch("bad_flags");
    // (args, fragments the message must hold)
    let cases: [(&[&str], &[&str]); 8] = [
        (
            &[
                "run",
                "--no-db",
                "--api",
                "127.0.0.1:0",
                "--route",
                "nonsense",
            ],
            &["--route", "NAME=LISTEN=UPSTREAM"],
        ),
        (
            &[
                "run",
                "--no-db",
                "--api",
                "127.0.0.1:0",
                "--route",
                "a=127.0.0.1:0=ftp://127.0.0.1:9",
            ],
            &["--route", "ftp://"],
        ),
        (
            &[
                "run",
                "--no-db",
                "--api",
                "127.0.0.1:0",
                "--route",
                "a=not-an-address=http://127.0.0.1:9",
            ],
            &["--route", "not-an-address"],
        ),
        (
            &[
                "run",
                "--db",
                "x.sqlite3",
                "--no-db",
                "--api",
                "127.0.0.1:0",
                "--route",
                "a=127.0.0.1:0=http://127.0.0.1:9",
            ],
            &["--db", "--no-db"],
        ),
        (
            &[
                "run",
                "--no-db",
                "--api",
                "127.0.0.1:0",
                "--route",
                "a=0.0.0.0:0=http://127.0.0.1:9",
            ],
            &["--route a", "0.0.0.0", "--allow-remote"],
        ),
        (
            &[
                "run",
                "--no-db",
                "--api",
                "0.0.0.0:0",
                "--route",
                "a=127.0.0.1:0=http://127.0.0.1:9",
            ],
            &["--api", "0.0.0.0", "--allow-remote"],
        ),
        (
            &[
                "run",
                "--no-db",
                "--slow-ttft-ms",
                "0",
                "--api",
                "127.0.0.1:0",
                "--route",
                "a=127.0.0.1:0=http://127.0.0.1:9",
            ],
            &["--slow-ttft-ms"],
        ),
        (
            &["simulate", "--listen", "127.0.0.1:0", "--tps", "0"],
            &["--tps"],
        ),
    ];
    for (args, fragments) in cases {
        let out = run_to_exit(&dir, args);
        assert_eq!(out.code, Some(2), "{args:?}: stderr {}", out.stderr);
        for f in fragments {
            assert!(
                out.stderr.contains(f),
                "{args:?}: {f:?} missing from {}",
                out.stderr
            );
        }
        assert!(
            !out.stderr.contains("speedtap: route "),
            "{args:?}: started a route: {}",
            out.stderr
        );
    }
}

/// `--allow-remote` is what the message asks for, and with it the same
/// wildcard route starts.
#[cfg(unix)]
#[test]
fn allow_remote_lets_a_wildcard_route_start() {
    let dir = scratch("allow_remote");
    let mut p = Proc::spawn(speedtap(
        &dir,
        &[
            "run",
            "--no-db",
            "--json",
            "--allow-remote",
            "--api",
            "127.0.0.1:0",
            "--route",
            "wide=0.0.0.0:0=http://127.0.0.1:9",
        ],
    ));
    let (proxy, _) = read_announcement(&p, "wide");
    assert!(proxy.ip().is_unspecified(), "{proxy}");
    p.signal("TERM");
    let (status, _) = p.wait_exit_timed(Duration::from_secs(6));
    assert_eq!(
        status.code(),
        Some(0),
        "stderr {:?}",
        p.stderr.finish_lines()
    );
}

// ---------------------------------------------------------------------------
// Runtime failures: exit 1, naming what failed
// ---------------------------------------------------------------------------

#[test]
fn taken_ports_exit_1_naming_the_address() {
    let dir = scratch("taken_port");
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();

    let route = format!("a={addr}=http://127.0.0.1:9");
    let out = run_to_exit(
        &dir,
        &["run", "--no-db", "--api", "127.0.0.1:0", "--route", &route],
    );
    assert_eq!(out.code, Some(1), "route: stderr {}", out.stderr);
    assert!(out.stderr.contains(&addr), "route: {}", out.stderr);

    let out = run_to_exit(
        &dir,
        &[
            "run",
            "--no-db",
            "--api",
            &addr,
            "--route",
            "a=127.0.0.1:0=http://127.0.0.1:9",
        ],
    );
    assert_eq!(out.code, Some(1), "api: stderr {}", out.stderr);
    assert!(out.stderr.contains(&addr), "api: {}", out.stderr);

    let out = run_to_exit(&dir, &["simulate", "--listen", &addr]);
    assert_eq!(out.code, Some(1), "simulate: stderr {}", out.stderr);
    assert!(out.stderr.contains(&addr), "simulate: {}", out.stderr);
    drop(taken);
}

/// A store that can't be opened (here its directory is a regular file, the
/// same `open` failure a read-only or full disk gives, and one that holds
/// for root too) leaves history off with one warning naming the file; the
/// proxy still starts and meters in memory.
#[cfg(unix)]
#[test]
fn an_unopenable_store_warns_and_the_proxy_still_runs() {
    let dir = scratch("unopenable_store");
    let (_sim, upstream) =
        start_simulate(&dir, &["--tokens", "20", "--tps", "500", "--ttft-ms", "0"]);
    let blocker = dir.join("not-a-dir");
    std::fs::write(&blocker, b"a file where the data dir should be").unwrap();
    let db = blocker.join("speedtap.sqlite3");
    let route = format!("sim=127.0.0.1:0=http://{upstream}");
    let mut p = Proc::spawn(speedtap(
        &dir,
        &[
            "run",
            "--json",
            "--db",
            db.to_str().unwrap(),
            "--api",
            "127.0.0.1:0",
            "--route",
            &route,
        ],
    ));
    let (proxy, api) = read_announcement(&p, "sim");
    let warning = p
        .stderr
        .lines_so_far()
        .into_iter()
        .find(|l| l.contains("history is off"))
        .expect("a warning that history is off");
    assert!(warning.contains(db.to_str().unwrap()), "{warning}");

    let (status, body, complete) = stream_chat(proxy);
    assert_eq!(status, 200);
    assert!(complete && body.contains("[DONE]"), "{body}");
    let settled = p.stdout.wait_for("the settled call line", STARTUP, |l| {
        serde_json::from_str::<Value>(l).is_ok_and(|v| is_final(&v))
    });
    let settled: Value = serde_json::from_str(&settled).unwrap();
    assert_eq!(settled["speed"]["phase"], "complete", "{settled}");
    assert_eq!(settled["speed"]["output_tokens"], 20, "{settled}");

    let mut s = connect(api);
    s.write_all(&request("GET", api, "/api/v1/history", b"", &[]))
        .unwrap();
    let mut r = BufReader::new(s);
    let head = read_head(&mut r).unwrap();
    assert_ne!(head.status, 200, "no history without a store");

    p.signal("TERM");
    let (status, _) = p.wait_exit_timed(Duration::from_secs(10));
    assert_eq!(
        status.code(),
        Some(0),
        "stderr {:?}",
        p.stderr.finish_lines()
    );
}

// ---------------------------------------------------------------------------
// A real stream through `speedtap run`
// ---------------------------------------------------------------------------

/// Answer tokens per simulated call; `--usage` makes the count exact.
const SIM_TOKENS: u64 = 60;

#[cfg(unix)]
#[test]
fn json_lines_and_sse_events_follow_the_contract_and_sigterm_stops_cleanly() {
    let dir = scratch("json_and_sse");
    let tokens = SIM_TOKENS.to_string();
    let (_sim, sim_addr) = start_simulate(
        &dir,
        &[
            "--ttft-ms",
            "50",
            "--tps",
            "200",
            "--tokens",
            &tokens,
            "--usage",
        ],
    );
    let mut run = start_run(&dir, sim_addr);

    // Call 1, then its final line on stdout.
    let (status, body, complete) = stream_chat(run.proxy);
    assert_eq!(status, 200, "{body}");
    assert!(complete && body.contains("data: [DONE]"), "{body}");
    let final_line = run
        .proc
        .stdout
        .wait_for("call 1's final line", STARTUP, |l| {
            serde_json::from_str::<Value>(l).is_ok_and(|v| is_final(&v))
        });
    let first_id = call_id(&check_speed_event(&final_line, "stdout")).to_string();

    // Call 2 with the event stream open.
    let events = subscribe_events(run.api);
    let (status, body, complete) = stream_chat(run.proxy);
    assert_eq!(status, 200, "{body}");
    assert!(complete && body.contains("data: [DONE]"), "{body}");

    let mut speed_frames: Vec<Value> = Vec::new();
    let mut stats_frames = 0;
    let mut second_final = false;
    let deadline = Instant::now() + STARTUP;
    while !(second_final && stats_frames > 0) {
        let left = deadline.saturating_duration_since(Instant::now());
        let sse = events.recv_timeout(left).unwrap_or_else(|e| {
            panic!("{e:?} before call 2's final speed frame and a stats frame; got {speed_frames:?}, {stats_frames} stats")
        });
        match sse.event.as_str() {
            "speed" => {
                let v = check_speed_event(&sse.data, "sse speed");
                assert_ne!(call_id(&v), first_id, "call 1 was already settled: {v}");
                second_final |= is_final(&v);
                speed_frames.push(v);
            }
            "stats" => {
                check_stats(&sse.data);
                stats_frames += 1;
            }
            _ => {}
        }
    }
    let second_id = call_id(&speed_frames[0]).to_string();
    assert!(
        speed_frames.iter().all(|v| call_id(v) == second_id),
        "{speed_frames:?}"
    );
    check_call_sequence(&speed_frames.iter().collect::<Vec<_>>(), "sse");

    // A clean stop, with the event stream still open.
    run.proc.signal("TERM");
    let (status, took) = run.proc.wait_exit_timed(Duration::from_secs(6));
    let stderr = run.proc.stderr.finish_lines();
    assert_eq!(status.code(), Some(0), "stderr {stderr:?}");
    assert!(took <= Duration::from_secs(6), "took {took:?}");

    // Every stdout line, whole.
    let lines = run.proc.stdout.finish_lines();
    let parsed: Vec<Value> = lines
        .iter()
        .map(|l| check_speed_event(l, &format!("stdout line {l}")))
        .collect();
    let ids: BTreeSet<&str> = parsed.iter().map(call_id).collect();
    assert_eq!(
        ids,
        BTreeSet::from([first_id.as_str(), second_id.as_str()]),
        "{lines:?}"
    );
    for id in &ids {
        let events: Vec<&Value> = parsed.iter().filter(|v| call_id(v) == *id).collect();
        check_call_sequence(&events, id);
        for v in &events {
            assert_eq!(v["call"]["route"], "sim", "{v}");
            assert_eq!(v["call"]["api"], "openai_chat", "{v}");
            if let Some(model) = v["call"].get("model") {
                assert_eq!(model, "sim-model", "{v}");
            }
        }
        let last = events.last().unwrap();
        assert_eq!(last["call"]["model"], "sim-model", "{last}");
        assert_eq!(last["speed"]["phase"], "complete", "{last}");
        assert_eq!(last["speed"]["output_tokens"], SIM_TOKENS, "{last}");
        assert!(
            last["speed"].get("time_to_first_token_ms").is_some(),
            "{last}"
        );
    }
    // The SSE stream and stdout carry the same snapshots of call 2.
    let stdout_second: Vec<&Value> = parsed.iter().filter(|v| call_id(v) == second_id).collect();
    let sse_second: Vec<&Value> = speed_frames.iter().collect();
    assert_eq!(stdout_second, sse_second);
}

/// The drain's deadline cuts a stream longer than the grace period: the
/// route's connections are dropped with it, so the call settles as
/// abandoned and its last `--json` line is final.
#[cfg(unix)]
#[test]
fn sigint_drains_an_in_flight_stream_and_settles_it() {
    let dir = scratch("sigint_in_flight");
    // 100 tokens at 5 tokens/s: a 20 s stream, longer than the drain.
    let (_sim, sim_addr) =
        start_simulate(&dir, &["--ttft-ms", "100", "--tps", "5", "--tokens", "100"]);
    let mut run = start_run(&dir, sim_addr);
    let proxy = run.proxy;
    let client = thread::spawn(move || stream_chat(proxy));

    let responding = run
        .proc
        .stdout
        .wait_for("the first token", STARTUP, |l| l.contains("\"responding\""));
    let v = check_speed_event(&responding, "stdout");
    let id = call_id(&v).to_string();

    run.proc.signal("INT");
    let (status, took) = run.proc.wait_exit_timed(SHUTDOWN_LIMIT);
    let stderr = run.proc.stderr.finish_lines();
    assert_eq!(status.code(), Some(0), "stderr {stderr:?}");
    // The contract drains in-flight calls for up to 5 s: this one outlasts
    // that, so the stop waits (most of) the grace rather than cutting it.
    assert!(took >= Duration::from_secs(4), "stopped after {took:?}");

    let lines = run.proc.stdout.finish_lines();
    let parsed: Vec<Value> = lines
        .iter()
        .map(|l| check_speed_event(l, &format!("stdout line {l}")))
        .collect();
    let events: Vec<&Value> = parsed.iter().filter(|v| call_id(v) == id).collect();
    check_call_sequence(&events, &id);
    let last = events.last().unwrap();
    assert_eq!(last["speed"]["phase"], "complete", "{last}");
    assert!(
        last["speed"]["output_tokens"].as_u64() < Some(100),
        "the stream was cut, yet: {last}"
    );

    // The client's stream ended (cut) when speedtap stopped.
    let (status, body, complete) = client.join().unwrap();
    assert_eq!(status, 200);
    assert!(!body.contains("[DONE]"), "{body}");
    assert!(!complete, "a cut stream ended like a whole one: {body}");
    assert!(
        body.contains("data: {"),
        "no token reached the client: {body}"
    );
}

/// The 5 s drain plus a margin for a loaded machine.
const SHUTDOWN_LIMIT: Duration = Duration::from_secs(8);

// ---------------------------------------------------------------------------
// Version and help
// ---------------------------------------------------------------------------

#[test]
fn version_prints_the_package_version() {
    let dir = scratch("version");
    let out = run_to_exit(&dir, &["--version"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(
        out.stdout.trim(),
        format!("speedtap {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn run_help_lists_every_contract_flag() {
    let dir = scratch("help");
    let out = run_to_exit(&dir, &["run", "--help"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    for flag in [
        "--config",
        "--route",
        "--api",
        "--db",
        "--no-db",
        "--slow-ttft-ms",
        "--json",
        "--allow-remote",
    ] {
        let listed = out
            .stdout
            .split(|c: char| c.is_whitespace() || c == ',' || c == '=' || c == '[' || c == ']')
            .any(|w| w == flag);
        assert!(listed, "{flag} missing from:\n{}", out.stdout);
    }
}

#[test]
fn an_unknown_subcommand_or_flag_exits_2() {
    let dir = scratch("unknown");
    for args in [&["frobnicate"][..], &["run", "--frobnicate"][..]] {
        let out = run_to_exit(&dir, args);
        assert_eq!(out.code, Some(2), "{args:?}: {}", out.stderr);
        assert!(
            out.stderr.contains("frobnicate"),
            "{args:?}: {}",
            out.stderr
        );
    }
}
