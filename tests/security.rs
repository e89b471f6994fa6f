//! Security properties of speedtap, each a test against the real binary
//! (or, for the in-process hook API, the engine):
//!
//! - It listens on loopback only unless told `--allow-remote` (flag or
//!   config file), for the proxy routes and the control API alike; and with
//!   it, the control API still answers loopback `Host`s only.
//! - The control API refuses non-loopback `Host` headers on every endpoint
//!   and method (DNS rebinding), never sends CORS permission (no
//!   `access-control-*` header, preflights included), and refuses writes
//!   that a cross-origin page could send without a preflight.
//! - A marker secret in the prompt, in the completion (text, reasoning,
//!   tool-call arguments, error messages), in `Authorization`, `x-api-key`,
//!   `api-key`, `Cookie` and the query string, through every protocol,
//!   reaches the upstream and the client and nothing else: not stdout or
//!   stderr at `RUST_LOG=trace`, not the data directory (SQLite database,
//!   WAL, anything else, read as bytes, while running and after exit), not
//!   any control API answer (calls, each call, stats, chart, routes,
//!   history, models, export in every format, metrics, settings, discover,
//!   the event stream), not the slow-first-token warning, and not what a
//!   slow-first-token hook is handed. This supersedes the narrower scan in
//!   `tests/store_engine.rs` (prompt and two headers, simulator output).
//! - Files are private: the data directory 0700, the database and its WAL
//!   and shared-memory files 0600, and a config file saved through the API
//!   0600, under a permissive umask (022).
//!
//! Crash output is not covered by a test: nothing a client or the API can
//! send makes `speedtap run` panic on purpose, and the binary installs no
//! panic hook of its own, so a panic prints Rust's default message (the
//! location and the panic's own text, no request data unless a panic
//! message formats some; none in `src/` does).

use crate::util::{raw_http, security as security_support, store_engine as store_engine_support};

use std::collections::BTreeSet;
use std::io::{BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::util::process::{speedtap, url_addr, Proc, BIN, STARTUP};
use raw_http::{read_body, read_head, try_connect};
use security_support::{MarkerUpstream, Mode, DELAY_MS, MODE};
use store_engine_support::{find, http, Protocol};

// ---------------------------------------------------------------------------
// Shared helpers
// ---------------------------------------------------------------------------

/// A fresh, empty scratch directory for one test.
fn scratch(test: &str) -> PathBuf {
    crate::util::process::scratch("security", test)
}

/// A `speedtap run` and the addresses it announced.
struct Run {
    proc: Proc,
    routes: Vec<SocketAddr>,
    api: SocketAddr,
}

/// Starts `cmd` (a `speedtap run`) and reads the announced addresses of
/// `routes` and of the API.
fn start(cmd: Command, routes: &[&str]) -> Run {
    let proc = Proc::spawn(cmd);
    let routes = routes
        .iter()
        .map(|name| {
            let prefix = format!("speedtap: route {name}: http://");
            let line = proc
                .stderr
                .wait_for("a route line", STARTUP, |l| l.starts_with(&prefix));
            url_addr(&line, &prefix)
        })
        .collect();
    let prefix = "speedtap: dashboard and control API on http://";
    let line = proc
        .stderr
        .wait_for("the API line", STARTUP, |l| l.starts_with(prefix));
    Run {
        proc,
        routes,
        api: url_addr(&line, prefix),
    }
}

/// Runs `speedtap ARGS` expecting a quick exit; its code and stderr.
fn run_to_exit(dir: &Path, args: &[&str]) -> (Option<i32>, String) {
    let mut p = Proc::spawn(speedtap(dir, args));
    let status = p.wait_exit(Duration::from_secs(20));
    (
        status.code(),
        String::from_utf8_lossy(&p.stderr.finish()).into_owned(),
    )
}

/// A response from [`raw`].
struct Raw {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

/// One request with an exact `Host` line (or none) and extra headers, on
/// its own connection. The body is read unless `head_only` (event streams
/// never end).
fn raw(
    addr: SocketAddr,
    method: &str,
    path: &str,
    host: Option<&str>,
    headers: &[(&str, &str)],
    body: &[u8],
    head_only: bool,
) -> Raw {
    let mut stream = try_connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    let mut req = format!("{method} {path} HTTP/1.1\r\n");
    if let Some(host) = host {
        req.push_str(&format!("Host: {host}\r\n"));
    }
    for (n, v) in headers {
        req.push_str(&format!("{n}: {v}\r\n"));
    }
    req.push_str(&format!(
        "Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    ));
    let mut bytes = req.into_bytes();
    bytes.extend_from_slice(body);
    stream.write_all(&bytes).unwrap();
    let mut r = BufReader::new(stream);
    let head = read_head(&mut r).unwrap_or_else(|e| panic!("{method} {path} (Host {host:?}): {e}"));
    let body = if head_only || method == "HEAD" {
        Vec::new()
    } else {
        read_body(&mut r, &head).0
    };
    Raw {
        status: head.status,
        headers: head.headers,
        body,
    }
}

/// Mode bits of a file or directory.
fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// Every file under `dir`, recursively, with its bytes.
fn files_under(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            match entry.file_type() {
                Ok(t) if t.is_dir() => todo.push(path),
                Ok(t) if t.is_file() => {
                    // SQLite may remove a file between listing and reading.
                    if let Ok(bytes) = std::fs::read(&path) {
                        out.push((path, bytes));
                    }
                }
                _ => {}
            }
        }
    }
    out.sort();
    out
}

// ---------------------------------------------------------------------------
// Loopback only, unless --allow-remote
// ---------------------------------------------------------------------------

/// What `tests/cli.rs` does not already cover: an IPv6 wildcard and a
/// specific non-loopback address, for a route and for the API, and the
/// config file's `api`/`listen` keys; each refused (exit 2, naming
/// `--allow-remote`) before anything listens.
#[test]
fn non_loopback_addresses_are_refused_without_allow_remote() {
    let dir = scratch("refused");
    let cases: [&[&str]; 4] = [
        &[
            "--api",
            "127.0.0.1:0",
            "--route",
            "a=[::]:0=http://127.0.0.1:9",
        ],
        &[
            "--api",
            "127.0.0.1:0",
            "--route",
            "a=192.0.2.1:0=http://127.0.0.1:9",
        ],
        &[
            "--api",
            "[::]:0",
            "--route",
            "a=127.0.0.1:0=http://127.0.0.1:9",
        ],
        &[
            "--api",
            "192.0.2.1:0",
            "--route",
            "a=127.0.0.1:0=http://127.0.0.1:9",
        ],
    ];
    for extra in cases {
        let mut args = vec!["run", "--no-db"];
        args.extend_from_slice(extra);
        let (code, stderr) = run_to_exit(&dir, &args);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains("needs --allow-remote"),
            "{args:?}: {stderr}"
        );
        assert!(
            !stderr.contains("speedtap: route "),
            "{args:?} started: {stderr}"
        );
    }
    let files = [
        (
            "remote_api.toml",
            "api = \"0.0.0.0:0\"\n[[route]]\nname = \"a\"\nlisten = \"127.0.0.1:0\"\nupstream = \"http://127.0.0.1:9\"\n",
        ),
        (
            "remote_route.toml",
            "api = \"127.0.0.1:0\"\n[[route]]\nname = \"a\"\nlisten = \"0.0.0.0:0\"\nupstream = \"http://127.0.0.1:9\"\n",
        ),
    ];
    for (name, text) in files {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        let (code, stderr) = run_to_exit(
            &dir,
            &["run", "--no-db", "--config", path.to_str().unwrap()],
        );
        assert_eq!(code, Some(2), "{name}: {stderr}");
        assert!(stderr.contains("needs --allow-remote"), "{name}: {stderr}");
        assert!(
            stderr.contains(name),
            "{name}: the message names the file: {stderr}"
        );
    }
}

/// With `--allow-remote` (or `allow_remote = true` in the config file) the
/// API and a route start on the wildcard address; the API still answers
/// only loopback `Host`s, except `/metrics`, which a Prometheus server on
/// another host scrapes by this host's name (read-only numbers).
#[test]
fn allow_remote_opens_the_listeners_but_not_the_host_guard() {
    let dir = scratch("allowed");
    let config = dir.join("remote.toml");
    std::fs::write(
        &config,
        "allow_remote = true\napi = \"0.0.0.0:0\"\n[[route]]\nname = \"b\"\nlisten = \"0.0.0.0:0\"\nupstream = \"http://127.0.0.1:9\"\n",
    )
    .unwrap();
    let by_flag = speedtap(
        &dir,
        &[
            "run",
            "--no-db",
            "--json",
            "--allow-remote",
            "--api",
            "0.0.0.0:0",
            "--route",
            "a=0.0.0.0:0=http://127.0.0.1:9",
        ],
    );
    let by_file = speedtap(
        &dir,
        &[
            "run",
            "--no-db",
            "--json",
            "--config",
            config.to_str().unwrap(),
        ],
    );
    for (cmd, route) in [(by_flag, "a"), (by_file, "b")] {
        let mut run = start(cmd, &[route]);
        assert!(run.api.ip().is_unspecified(), "{}", run.api);
        assert!(run.routes[0].ip().is_unspecified(), "{}", run.routes[0]);
        let local = SocketAddr::from(([127, 0, 0, 1], run.api.port()));
        let remote_name = format!("192.0.2.7:{}", run.api.port());
        let ok = raw(
            local,
            "GET",
            "/api/v1/stats",
            Some(&local.to_string()),
            &[],
            b"",
            false,
        );
        assert_eq!(ok.status, 200);
        for path in ["/api/v1/calls", "/api/v1/stats", "/", "/api/v1/settings"] {
            let r = raw(local, "GET", path, Some(&remote_name), &[], b"", false);
            assert_eq!(r.status, 403, "{path} by a remote name");
        }
        let scrape = raw(
            local,
            "GET",
            "/metrics",
            Some(&remote_name),
            &[],
            b"",
            false,
        );
        assert_eq!(scrape.status, 200, "the documented /metrics exemption");
        run.proc.signal("TERM");
        let status = run.proc.wait_exit(Duration::from_secs(10));
        assert_eq!(status.code(), Some(0));
    }
}

// ---------------------------------------------------------------------------
// The control API: Host guard and no CORS, on every endpoint
// ---------------------------------------------------------------------------

/// Every path the API serves (the contract's, the history endpoints, the
/// settings and demo writes, each dashboard asset) and one it doesn't.
fn every_path() -> Vec<String> {
    let mut paths: Vec<String> = [
        "/api/v1/calls",
        "/api/v1/calls?limit=5&route=sim",
        "/api/v1/calls/c-000001",
        "/api/v1/stats",
        "/api/v1/events",
        "/metrics",
        "/api/v1/routes",
        "/api/v1/stats/history",
        "/api/v1/history",
        "/api/v1/models",
        "/api/v1/export?format=csv",
        "/api/v1/export?format=jsonl",
        "/api/v1/discover",
        "/api/v1/servers",
        "/api/v1/settings",
        "/api/v1/demo",
        "/no/such/path",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    paths.extend(
        speedtap::api::dashboard::ASSETS
            .iter()
            .map(|a| a.path.to_string()),
    );
    paths
}

fn assert_no_cors(r: &Raw, what: &str) {
    let cors: Vec<_> = r
        .headers
        .iter()
        .filter(|(n, _)| n.to_ascii_lowercase().starts_with("access-control-"))
        .collect();
    assert!(cors.is_empty(), "{what}: CORS headers {cors:?}");
}

#[test]
fn the_control_api_answers_loopback_hosts_only_and_grants_no_cors() {
    let dir = scratch("host_guard");
    let db = dir.join("db").join("speedtap.sqlite3");
    let run = start(
        speedtap(
            &dir,
            &[
                "run",
                "--json",
                "--db",
                db.to_str().unwrap(),
                "--api",
                "127.0.0.1:0",
                "--route",
                "sim=127.0.0.1:0=http://127.0.0.1:9",
            ],
        ),
        &["sim"],
    );
    let api = run.api;
    let port = api.port();
    let evil_origin = ("Origin", "http://evil.example.com");
    let bad_hosts = [
        "evil.example.com".to_string(),
        format!("evil.example.com:{port}"),
        format!("192.168.1.2:{port}"),
        // Browsers let pages reach 0.0.0.0, which Linux routes to loopback.
        format!("0.0.0.0:{port}"),
        format!("localhost.evil.example.com:{port}"),
        format!("127.0.0.1.evil.example.com:{port}"),
        format!("[::ffff:127.0.0.1]:{port}"),
        format!("evil.example.com@127.0.0.1:{port}"),
    ];
    let methods = ["GET", "HEAD", "OPTIONS", "POST", "PUT", "DELETE"];
    let paths = every_path();
    let mut checked = 0;
    for path in &paths {
        for method in methods {
            for host in &bad_hosts {
                let r = raw(
                    api,
                    method,
                    path,
                    Some(host),
                    &[
                        evil_origin,
                        ("Access-Control-Request-Method", "PUT"),
                        ("Content-Type", "application/json"),
                    ],
                    b"{}",
                    false,
                );
                let what = format!("{method} {path} Host {host}");
                assert_eq!(r.status, 403, "{what}");
                assert_no_cors(&r, &what);
                if method != "HEAD" {
                    assert_eq!(
                        serde_json::from_slice::<Value>(&r.body).unwrap()["error"],
                        "host not allowed",
                        "{what}"
                    );
                }
                checked += 1;
            }
        }
        // A loopback Host with a foreign Origin: served, but never with
        // CORS permission, preflight or not. Writes are left to the checks
        // below (a JSON POST would start the demo).
        for method in ["GET", "HEAD", "OPTIONS"] {
            let r = raw(
                api,
                method,
                path,
                Some(&api.to_string()),
                &[
                    evil_origin,
                    ("Access-Control-Request-Method", "PUT"),
                    ("Access-Control-Request-Headers", "content-type"),
                ],
                b"",
                path == "/api/v1/events",
            );
            let what = format!("{method} {path} (loopback, foreign Origin)");
            assert_no_cors(&r, &what);
            if method == "OPTIONS" && !path.starts_with("/no/") {
                assert_eq!(r.status, 204, "{what}");
            }
            checked += 1;
        }
    }
    // Missing Host on HTTP/1.1: 400.
    let r = raw(api, "GET", "/api/v1/stats", None, &[], b"", false);
    assert_eq!(r.status, 400);

    // Writes a cross-origin page can send without a preflight (simple
    // content types) are refused before they act.
    for (method, path) in [("POST", "/api/v1/demo"), ("PUT", "/api/v1/settings")] {
        for ct in [
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
        ] {
            let r = raw(
                api,
                method,
                path,
                Some(&api.to_string()),
                &[evil_origin, ("Content-Type", ct)],
                br#"{"routes":[],"slow_ttft_ms":1,"notifications":false,"notify_settled":false}"#,
                false,
            );
            assert_eq!(r.status, 415, "{method} {path} as {ct}");
            assert_no_cors(&r, path);
            checked += 1;
        }
    }
    let routes = raw(
        api,
        "GET",
        "/api/v1/routes",
        Some(&api.to_string()),
        &[],
        b"",
        false,
    );
    let routes: Value = serde_json::from_slice(&routes.body).unwrap();
    assert!(
        !routes.to_string().contains("demo"),
        "a refused write started the demo: {routes}"
    );
    let config = dir.join("config").join("speedtap").join("speedtap.toml");
    assert!(
        !config.exists(),
        "a refused write saved {}",
        config.display()
    );
    assert!(checked > 1000, "{checked} requests");
}

// ---------------------------------------------------------------------------
// Secrets go to the upstream and nowhere else
// ---------------------------------------------------------------------------

const PROMPT_MARK: &str = "ZQXPROMPT7c41e";
const COMPLETION_MARK: &str = "ZQXCOMPLETION5b02";
const BEARER_MARK: &str = "ZQXBEARER9d3f";
const X_API_KEY_MARK: &str = "ZQXXAPIKEY1a88";
const API_KEY_MARK: &str = "ZQXAZUREKEY62c0";
const COOKIE_MARK: &str = "ZQXCOOKIE3e17";
const QUERY_MARK: &str = "ZQXQUERYKEY84b5";
const MARKS: [&str; 7] = [
    PROMPT_MARK,
    COMPLETION_MARK,
    BEARER_MARK,
    X_API_KEY_MARK,
    API_KEY_MARK,
    COOKIE_MARK,
    QUERY_MARK,
];

/// Every place a marker shows up in `bytes`, as "MARK in WHAT: context".
fn leaks(what: &str, bytes: &[u8]) -> Vec<String> {
    let mut out = Vec::new();
    for mark in MARKS {
        if let Some(at) = find(bytes, mark.as_bytes()) {
            let from = at.saturating_sub(120);
            let to = (at + 120).min(bytes.len());
            out.push(format!(
                "{mark} in {what}: …{}…",
                String::from_utf8_lossy(&bytes[from..to])
            ));
        }
    }
    out
}

/// Reads the event stream into a buffer until the server ends it.
fn collect_events(api: SocketAddr) -> (Arc<Mutex<Vec<u8>>>, thread::JoinHandle<()>) {
    let mut stream = try_connect(api).unwrap();
    stream
        .write_all(
            format!(
                "GET /api/v1/events HTTP/1.1\r\nHost: {api}\r\nAccept: text/event-stream\r\n\r\n"
            )
            .as_bytes(),
        )
        .unwrap();
    let buf = Arc::new(Mutex::new(Vec::new()));
    let buf2 = buf.clone();
    let reader = thread::spawn(move || {
        let mut stream: TcpStream = stream;
        let _ = stream.set_read_timeout(Some(Duration::from_secs(120)));
        let mut chunk = [0u8; 8192];
        while let Ok(n) = stream.read(&mut chunk) {
            if n == 0 {
                break;
            }
            buf2.lock().unwrap().extend_from_slice(&chunk[..n]);
        }
    });
    (buf, reader)
}

/// One request of the secrets scan: path, body, how the upstream answers,
/// extra headers, and the status the client must get.
type Probe = (String, String, Mode, Vec<(&'static str, &'static str)>, u16);

#[test]
fn secrets_reach_the_upstream_and_nowhere_else() {
    let dir = scratch("secrets");
    let data = dir.join("data");
    let upstream = MarkerUpstream::start(COMPLETION_MARK);
    let route = format!("sim=127.0.0.1:0=http://{}", upstream.addr);
    let mut cmd = speedtap(
        &dir,
        &[
            "run",
            "--json",
            "--slow-ttft-ms",
            "150",
            "--api",
            "127.0.0.1:0",
            "--route",
            &route,
            // The upstream's requests are counted below: no telemetry
            // GETs (they carry no credentials either way).
            "--no-telemetry",
        ],
    );
    // The most verbose logging there is; the store in the default place
    // (XDG_DATA_HOME points into the scratch dir).
    cmd.env("RUST_LOG", "trace");
    let mut run = start(cmd, &["sim"]);
    let (proxy, api) = (run.routes[0], run.api);
    let (events, events_reader) = collect_events(api);

    let prompt = format!("Please keep {PROMPT_MARK} between us.");
    let bearer = format!("Bearer {BEARER_MARK}");
    let cookie = format!("session={COOKIE_MARK}");
    let credentials = [
        ("Authorization", bearer.as_str()),
        ("x-api-key", X_API_KEY_MARK),
        ("api-key", API_KEY_MARK),
        ("Cookie", cookie.as_str()),
        ("User-Agent", "security-scan/1.0"),
    ];
    let mut requests: Vec<Probe> = Vec::new();
    for p in Protocol::ALL {
        let (path, body) = p.request("marker-model", &prompt);
        for mode in [Mode::Stream, Mode::StreamError] {
            requests.push((path.to_string(), body.clone(), mode, vec![], 200));
        }
    }
    let messages = json!([{"role": "user", "content": prompt}]);
    for (path, body) in [
        (
            "/v1/chat/completions",
            json!({"model": "marker-model", "stream": false, "messages": messages}),
        ),
        (
            "/v1/messages",
            json!({"model": "marker-model", "max_tokens": 64, "messages": messages}),
        ),
        (
            "/api/chat",
            json!({"model": "marker-model", "stream": false, "messages": messages}),
        ),
        (
            "/generate",
            json!({"inputs": prompt, "parameters": {"max_new_tokens": 64}}),
        ),
    ] {
        requests.push((path.into(), body.to_string(), Mode::Whole, vec![], 200));
    }
    for path in ["/v1/chat/completions", "/v1/messages"] {
        let body = json!({"model": "marker-model", "stream": true, "messages": messages});
        requests.push((path.into(), body.to_string(), Mode::Status, vec![], 400));
    }
    // A first token later than --slow-ttft-ms: the warning line and the
    // `slow_first_token` event fire while this call waits.
    requests.push((
        "/v1/chat/completions".into(),
        json!({"model": "marker-model", "stream": true, "messages": messages}).to_string(),
        Mode::Stream,
        vec![(DELAY_MS, "1200")],
        200,
    ));
    // The key in the query string, as some clients send it, on a path
    // speedtap passes through unmetered.
    requests.push((
        format!("/v1/embeddings?key={QUERY_MARK}"),
        json!({"model": "marker-model", "input": prompt}).to_string(),
        Mode::Stream,
        vec![],
        200,
    ));

    for (path, body, mode, extra, status) in &requests {
        let mut headers = credentials.to_vec();
        headers.push((MODE, mode.header()));
        headers.extend_from_slice(extra);
        let reply = http(proxy, "POST", path, body.as_bytes(), &headers)
            .unwrap_or_else(|e| panic!("POST {path}: {e}"));
        assert_eq!(reply.status, *status, "POST {path} {mode:?}");
        assert!(reply.complete, "POST {path} {mode:?}: cut");
        // The markers did travel: the client got the upstream's text.
        assert!(
            find(&reply.body, COMPLETION_MARK.as_bytes()).is_some(),
            "POST {path} {mode:?}: {}",
            String::from_utf8_lossy(&reply.body)
        );
    }
    // ...and the upstream got the prompt's request and every credential.
    {
        let seen = upstream.seen.lock().unwrap();
        assert_eq!(seen.len(), requests.len());
        for h in seen.iter() {
            assert_eq!(h.get("authorization"), Some(&bearer));
            assert_eq!(h.get("x-api-key").map(|s| s.as_str()), Some(X_API_KEY_MARK));
            assert_eq!(h.get("api-key").map(|s| s.as_str()), Some(API_KEY_MARK));
            assert_eq!(h.get("cookie"), Some(&cookie));
        }
    }

    // Everything settled (and so is on disk: settled means stored).
    let deadline = Instant::now() + Duration::from_secs(60);
    let calls = loop {
        let page = http(
            api,
            "GET",
            "/api/v1/calls?limit=10000&unmetered=1",
            b"",
            &[],
        )
        .unwrap()
        .json();
        let calls = page["calls"].as_array().unwrap().clone();
        if calls.len() == requests.len() && calls.iter().all(|c| c["status"] != "in_flight") {
            break calls;
        }
        assert!(Instant::now() < deadline, "not all settled: {page}");
        thread::sleep(Duration::from_millis(20));
    };
    let apis: BTreeSet<&str> = calls.iter().filter_map(|c| c["api"].as_str()).collect();
    assert_eq!(apis.len(), 9, "every protocol, and unknown: {apis:?}");
    run.proc
        .stderr
        .wait_for("the slow first token warning", STARTUP, |l| {
            l.contains("no first token after")
        });

    // Every control API answer.
    let mut scanned: Vec<(String, Vec<u8>)> = Vec::new();
    let mut paths: Vec<String> = [
        "/api/v1/calls?limit=10000&unmetered=1",
        "/api/v1/stats",
        "/api/v1/stats/history",
        "/api/v1/routes",
        "/api/v1/history?limit=10000",
        "/api/v1/models",
        "/api/v1/export?format=csv",
        "/api/v1/export?format=jsonl",
        "/metrics",
        "/api/v1/settings",
        "/api/v1/discover",
        "/api/v1/servers",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    paths.extend(
        calls
            .iter()
            .map(|c| format!("/api/v1/calls/{}", c["id"].as_str().unwrap())),
    );
    for path in &paths {
        let reply = http(api, "GET", path, b"", &[]).unwrap();
        assert_eq!(reply.status, 200, "GET {path}");
        scanned.push((format!("GET {path}"), reply.body));
    }
    let history = http(api, "GET", "/api/v1/history?limit=10000", b"", &[])
        .unwrap()
        .json();
    assert_eq!(
        history["calls"].as_array().unwrap().len(),
        requests.len(),
        "the store holds every call: {history}"
    );
    let csv = &scanned
        .iter()
        .find(|(w, _)| w.contains("format=csv"))
        .unwrap()
        .1;
    assert!(
        csv.split(|b| *b == b'\n').filter(|l| !l.is_empty()).count() > requests.len(),
        "the CSV export holds every call"
    );

    // The data directory while running (the WAL holds fresh commits).
    for (path, bytes) in files_under(&data) {
        scanned.push((format!("{} (running)", path.display()), bytes));
    }

    run.proc.signal("TERM");
    let status = run.proc.wait_exit(Duration::from_secs(30));
    assert_eq!(status.code(), Some(0), "{status:?}");
    events_reader.join().unwrap();
    let events = events.lock().unwrap().clone();
    for (name, needle) in [
        ("speed", &b"event: speed"[..]),
        ("settled", b"event: settled"),
        ("slow_first_token", b"event: slow_first_token"),
    ] {
        assert!(
            find(&events, needle).is_some(),
            "no {name} event in the stream"
        );
    }
    scanned.push(("GET /api/v1/events (the whole run)".into(), events));
    let stdout = run.proc.stdout.finish();
    assert!(find(&stdout, b"\"call\"").is_some(), "no --json lines");
    scanned.push(("stdout (--json)".into(), stdout));
    let stderr = run.proc.stderr.finish();
    assert!(
        find(&stderr, b"TRACE").is_some() || find(&stderr, b"DEBUG").is_some(),
        "RUST_LOG=trace had no effect: {}",
        String::from_utf8_lossy(&stderr)
    );
    scanned.push(("stderr (RUST_LOG=trace)".into(), stderr));
    let after = files_under(&data);
    assert!(
        after
            .iter()
            .any(|(p, b)| p.ends_with("speedtap.sqlite3") && !b.is_empty()),
        "the store is in {}: {:?}",
        data.display(),
        after.iter().map(|(p, _)| p).collect::<Vec<_>>()
    );
    for (path, bytes) in after {
        scanned.push((format!("{} (after exit)", path.display()), bytes));
    }

    let found: Vec<String> = scanned.iter().flat_map(|(w, b)| leaks(w, b)).collect();
    assert!(found.is_empty(), "secrets leaked:\n{}", found.join("\n"));
    assert!(scanned.len() > 30, "scanned {} sources", scanned.len());
}

/// What a slow-first-token hook (the tray app's desktop notification) is
/// handed: the call's identity and the wait, never the request.
#[test]
fn a_slow_first_token_hook_is_handed_no_request_data() {
    use speedtap::engine::notifier::SlowFirstTokenHook;
    use speedtap::host::{Engine, EngineOptions};
    use speedtap::model::RouteSpec;

    let dir = scratch("hook");
    let hook_file = dir.join("hook.txt");
    let upstream = MarkerUpstream::start(COMPLETION_MARK);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let route = RouteSpec::new(
            "hooked",
            "127.0.0.1:0",
            &format!("http://{}", upstream.addr),
        )
        .unwrap();
        let mut options = EngineOptions::new(vec![route]);
        options.slow_ttft = Duration::from_millis(100);
        let file = hook_file.clone();
        let hook: SlowFirstTokenHook = Arc::new(move |slow| {
            // Everything the hook gets: its debug form, its JSON, and the
            // message a notification would show.
            let text = format!(
                "{slow:?}\n{}\n{}\n",
                serde_json::to_string(slow).unwrap(),
                slow.message()
            );
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&file)
                .and_then(|mut f| f.write_all(text.as_bytes()))
                .unwrap();
        });
        options.slow_first_token_hooks.push(hook);
        let engine = Engine::start(options).await.unwrap();
        let proxy = engine.routes[0].listen;
        let prompt = format!("Please keep {PROMPT_MARK} between us.");
        let bearer = format!("Bearer {BEARER_MARK}");
        let body = json!({"model": "marker-model", "stream": true,
                          "messages": [{"role": "user", "content": prompt}]})
        .to_string();
        let reply = tokio::task::spawn_blocking(move || {
            http(
                proxy,
                "POST",
                &format!("/v1/chat/completions?key={QUERY_MARK}"),
                body.as_bytes(),
                &[
                    ("Authorization", bearer.as_str()),
                    ("x-api-key", X_API_KEY_MARK),
                    ("api-key", API_KEY_MARK),
                    (DELAY_MS, "800"),
                ],
            )
            .unwrap()
        })
        .await
        .unwrap();
        assert_eq!(reply.status, 200);
        engine.shutdown(Duration::from_secs(5)).await;
    });
    let text = std::fs::read(&hook_file).expect("the hook was called");
    assert!(
        find(&text, b"hooked").is_some(),
        "{}",
        String::from_utf8_lossy(&text)
    );
    assert!(find(&text, b"marker-model").is_some());
    let found = leaks("the hook's input", &text);
    assert!(found.is_empty(), "{}", found.join("\n"));
}

// ---------------------------------------------------------------------------
// Files are private
// ---------------------------------------------------------------------------

/// Under umask 022 (files 0644, dirs 0755 by default), the store in its
/// default place and a config file saved through the API are user-only.
#[test]
fn the_store_and_saved_settings_are_user_only_under_a_permissive_umask() {
    let dir = scratch("modes");
    let script = format!(
        "umask 022; exec '{BIN}' run --json --api 127.0.0.1:0 --route sim=127.0.0.1:0=http://127.0.0.1:9"
    );
    let cmd = speedtap(&dir, &[]);
    let mut sh = Command::new("sh");
    sh.arg("-c").arg(&script);
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => sh.env(k, v),
            None => sh.env_remove(k),
        };
    }
    sh.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut run = start(sh, &["sim"]);
    let api = run.api;

    // Make the store write: a call to the dead upstream settles (502).
    let reply = http(run.routes[0], "POST", "/v1/chat/completions", b"{}", &[]).unwrap();
    assert_eq!(reply.status, 502);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let h = http(api, "GET", "/api/v1/history", b"", &[])
            .unwrap()
            .json();
        if h["calls"].as_array().is_some_and(|c| !c.is_empty()) {
            break;
        }
        assert!(Instant::now() < deadline, "never stored: {h}");
        thread::sleep(Duration::from_millis(20));
    }
    let store_dir = dir.join("data").join("speedtap");
    assert_eq!(mode(&store_dir), 0o700, "{}", store_dir.display());
    let names: Vec<String> = std::fs::read_dir(&store_dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names.iter().any(|n| n == "speedtap.sqlite3-wal"),
        "{names:?}"
    );
    for name in &names {
        assert_eq!(mode(&store_dir.join(name)), 0o600, "{name}");
    }

    // Save the settings as they are: the config file is written.
    let doc = http(api, "GET", "/api/v1/settings", b"", &[]).unwrap();
    assert_eq!(doc.status, 200);
    let saved = http(api, "PUT", "/api/v1/settings", &doc.body, &[]).unwrap();
    assert_eq!(
        saved.status,
        200,
        "{}",
        String::from_utf8_lossy(&saved.body)
    );
    let path = PathBuf::from(saved.json()["config_path"].as_str().unwrap());
    assert!(path.starts_with(&dir), "{}", path.display());
    assert_eq!(mode(&path), 0o600, "{}", path.display());
    // The directory it created: user-only, like the data dir.
    let parent = path.parent().unwrap();
    assert_eq!(mode(parent), 0o700, "{}", parent.display());

    run.proc.signal("TERM");
    assert_eq!(run.proc.wait_exit(Duration::from_secs(10)).code(), Some(0));
}
