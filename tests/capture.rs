//! The capture interceptor end to end: the real helper (`speedtap-capture`,
//! built into `target/debug` by `cargo build -p speedtap-capture`, where the
//! engine's search finds it from the test binary in `target/debug/deps`; or
//! named by `SPEEDTAP_CAPTURE_BIN`) captures loopback traffic that clients
//! send straight to the simulator, and the in-process engine meters it.
//! Where the helper can't open the packet socket (no permission, no
//! helper) each test says why and skips, unless `SPEEDTAP_CAPTURE_REQUIRE`
//! is set (CI sets it: there a skip would hide a helper the build forgot).

use crate::util::proxy as proxy_support;

use std::time::Duration;

use proxy_support::*;
use speedtap::config::CaptureOnlyRoute;
use speedtap::host::{CaptureOptions, CaptureStatus, Engine, EngineOptions, RunningEngine};
use speedtap::model::{
    ApiKind, Call, CallStatus, CaptureRouteDoc, CaptureState, EngineQueries, RouteSpec, SeenBy,
    StartKind, Upstream, WaitReason,
};
use speedtap::simulate::{SimConfig, SimServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const MS: Duration = Duration::from_millis(1);

/// An engine capturing `upstream`'s port: with a proxy route `t` to it when
/// `proxy`, else as the capture-only route `t`. `None` (and a printed
/// reason) when the capture can't run here.
pub(crate) async fn capture_engine(upstream: &str, proxy: bool) -> Option<RunningEngine> {
    capture_engine_with(upstream, proxy, |_| {}).await
}

/// [`capture_engine`] with the options changed by `tweak` first.
pub(crate) async fn capture_engine_with(
    upstream: &str,
    proxy: bool,
    tweak: impl FnOnce(&mut EngineOptions),
) -> Option<RunningEngine> {
    let mut options = if proxy {
        EngineOptions::new(vec![RouteSpec::new("t", "127.0.0.1:0", upstream).unwrap()])
    } else {
        EngineOptions::new(Vec::new())
    };
    options.estimator = std::sync::Arc::new(speedtap::tokens::O200kEstimator);
    options.capture = Some(CaptureOptions {
        interface: "lo".into(),
        capture_only: if proxy {
            Vec::new()
        } else {
            vec![CaptureOnlyRoute {
                name: "t".into(),
                upstream: Upstream::parse(upstream).unwrap(),
            }]
        },
    });
    tweak(&mut options);
    let engine = Engine::start(options).await.unwrap();
    match &engine.capture {
        CaptureStatus::On { .. } => Some(engine),
        other => {
            assert!(
                std::env::var_os("SPEEDTAP_CAPTURE_REQUIRE").is_none(),
                "SPEEDTAP_CAPTURE_REQUIRE is set but the capture can't run here: {other:?}"
            );
            eprintln!("skipped: the capture can't run here: {other:?}");
            engine.shutdown(Duration::from_secs(1)).await;
            None
        }
    }
}

/// The eight streaming protocols: path, request body, API.
fn cases() -> [(&'static str, &'static str, ApiKind); 8] {
    [
        (
            "/v1/chat/completions",
            r#"{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[]}"#,
            ApiKind::OpenaiChat,
        ),
        (
            "/v1/completions",
            r#"{"model":"m","stream":true,"prompt":"x"}"#,
            ApiKind::OpenaiCompletions,
        ),
        (
            "/v1/responses",
            r#"{"model":"m","stream":true,"input":"x"}"#,
            ApiKind::OpenaiResponses,
        ),
        (
            "/v1/messages",
            r#"{"model":"m","stream":true,"max_tokens":64,"messages":[]}"#,
            ApiKind::AnthropicMessages,
        ),
        (
            "/api/chat",
            r#"{"model":"m","messages":[]}"#,
            ApiKind::OllamaChat,
        ),
        (
            "/api/generate",
            r#"{"model":"m","prompt":"x"}"#,
            ApiKind::OllamaGenerate,
        ),
        (
            "/completion",
            r#"{"prompt":"x","stream":true}"#,
            ApiKind::LlamacppCompletion,
        ),
        (
            "/generate_stream",
            r#"{"inputs":"x"}"#,
            ApiKind::TgiGenerate,
        ),
    ]
}

/// Long enough (about 1.5 s of decode) that the simulator's own timer
/// jitter on a busy machine stays well inside 1% of the span.
const TOKENS: u64 = 150;
const RATE: f64 = 100.0;

async fn simulator() -> SimServer {
    SimServer::start(
        "127.0.0.1:0",
        SimConfig {
            ttft: 80 * MS,
            tokens_per_second: RATE,
            tokens: TOKENS,
            usage: true,
            ..SimConfig::default()
        },
    )
    .await
    .unwrap()
}

/// What the stopwatch client saw: the status and each read's arrival time.
struct Stopwatch {
    status: u16,
    sent_at: std::time::Instant,
    reads: Vec<std::time::Instant>,
}

/// The client whose stopwatch the capture is held to: one request written
/// and its response read on an OS thread of its own, with blocking socket
/// calls, each read stamped the moment it returns. Not the async client:
/// there a read's stamp waits for a tokio worker, which on a busy machine
/// (the in-process engine and simulator share those workers) came up to
/// 8 ms after the bytes were in the socket, and that is the client's delay,
/// not the capture's error.
async fn stopwatch_client(addr: std::net::SocketAddr, path: &str, body: &str) -> Stopwatch {
    use std::io::{Read, Write};
    let request = format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         connection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    tokio::task::spawn_blocking(move || {
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        stream.set_nodelay(true).unwrap();
        let sent_at = std::time::Instant::now();
        stream.write_all(request.as_bytes()).unwrap();
        let (mut all, mut reads, mut buf) = (Vec::new(), Vec::new(), [0u8; 65_536]);
        loop {
            let n = stream.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            reads.push(std::time::Instant::now());
            all.extend_from_slice(&buf[..n]);
        }
        let head = String::from_utf8_lossy(&all[..all.len().min(32)]).into_owned();
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no status line in {head:?}"));
        Stopwatch {
            status,
            sent_at,
            reads,
        }
    })
    .await
    .unwrap()
}

fn all_calls(calls: &[Call]) -> String {
    format!("{calls:#?}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_sent_straight_to_the_server_are_measured_by_capture_in_every_protocol() {
    let sim = simulator().await;
    let Some(engine) = capture_engine(&sim.base_url(), false).await else {
        sim.shutdown().await;
        return;
    };
    assert!(
        engine.routes.is_empty(),
        "a capture-only route opens no port"
    );
    let mut report = Vec::new();
    for (i, (path, body, api)) in cases().iter().enumerate() {
        let got = stopwatch_client(sim.local_addr(), path, body).await;
        assert_eq!(got.status, 200, "{path}");
        let calls = settled_calls(&engine, i + 1).await;
        let call = calls
            .iter()
            .find(|c| c.identity.api == *api)
            .unwrap_or_else(|| panic!("{path}: no {api:?} call in {}", all_calls(&calls)));
        assert_eq!(call.status, CallStatus::Ok, "{path}: {call:#?}");
        assert_eq!(call.details.seen_by, SeenBy::Capture, "{path}");
        assert!(!call.details.capture_gap, "{path}: {call:#?}");
        assert_eq!(call.identity.route, "t");
        if *api != ApiKind::LlamacppCompletion && *api != ApiKind::TgiGenerate {
            assert_eq!(call.identity.model.as_deref(), Some("m"), "{path}");
        }
        let speed = call.speed.as_ref().unwrap();
        assert_eq!(speed.output_tokens, TOKENS, "{path}: {speed:?}");
        // The client's stopwatch: request sent to the first read that
        // came at or after the first token was due (the head, and a
        // role-only or metadata frame, may come at once).
        let first = got
            .reads
            .iter()
            .map(|at| at.duration_since(got.sent_at))
            .find(|d| *d >= 70 * MS)
            .unwrap();
        let client_ms = first.as_secs_f64() * 1000.0;
        // The record keeps whole milliseconds (truncated): the true value
        // lies in [ttft, ttft + 1), so compare from the bucket's middle.
        let ttft = speed.time_to_first_token_ms.unwrap() as f64 + 0.5;
        let rate = speed.output_tokens_per_second.unwrap();
        report.push(format!(
            "{path}: ttft capture {ttft} ms, client {client_ms:.2} ms; rate {rate}"
        ));
        assert!(
            (ttft - client_ms).abs() <= 2.0,
            "{path}: capture TTFT {ttft} ms, client {client_ms:.2} ms"
        );
        assert!(
            (rate - RATE).abs() <= RATE * 0.01,
            "{path}: rate {rate}, schedule {RATE}"
        );
    }
    eprintln!("{}", report.join("\n"));
    engine.shutdown(Duration::from_secs(1)).await;
    sim.shutdown().await;
}

/// Every snapshot of a captured call, the first (awaiting its first
/// token) included, says the capture saw it: a live view never shows
/// "proxy" and then "capture".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_captured_call_says_capture_from_its_first_snapshot_to_its_last() {
    use speedtap::model::{EngineEvent, Phase};
    let sim = simulator().await;
    let Some(engine) = capture_engine(&sim.base_url(), false).await else {
        sim.shutdown().await;
        return;
    };
    let mut rx = engine.handle.subscribe().await;
    let (path, body, _) = cases()[0];
    let got = stopwatch_client(sim.local_addr(), path, body).await;
    assert_eq!(got.status, 200);
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(EngineEvent::Speed {
                call,
                speed,
                seen_by,
            })) if call.route == "t" => {
                seen.push((speed.phase, seen_by));
                if speed.is_final {
                    break;
                }
            }
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => panic!("no final snapshot; seen {seen:?}"),
        }
    }
    assert_eq!(seen[0].0, Phase::AwaitingFirstToken, "{seen:?}");
    assert!(seen.len() > 2, "live snapshots too: {seen:?}");
    assert!(
        seen.iter().all(|(_, by)| *by == SeenBy::Capture),
        "{seen:?}"
    );
    engine.shutdown(Duration::from_secs(1)).await;
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_through_a_proxy_route_with_capture_on_are_recorded_once() {
    let sim = simulator().await;
    let Some(engine) = capture_engine(&sim.base_url(), true).await else {
        sim.shutdown().await;
        return;
    };
    let proxy = engine.routes[0].listen;
    for (path, body, _) in cases().iter().take(3) {
        let got = send(proxy, "POST", path, body).await;
        assert_eq!(got.status, 200, "{path}");
    }
    settled_calls(&engine, 3).await;
    // A direct call after them: once it has settled, the capture has read
    // every packet of the proxied calls before it.
    let (path, body, _) = cases()[4];
    send(sim.local_addr(), "POST", path, body).await;
    let calls = settled_calls(&engine, 4).await;
    let by = |s: SeenBy| calls.iter().filter(|c| c.details.seen_by == s).count();
    assert_eq!(calls.len(), 4, "{}", all_calls(&calls));
    assert_eq!(by(SeenBy::Proxy), 3, "{}", all_calls(&calls));
    assert_eq!(by(SeenBy::Capture), 1, "{}", all_calls(&calls));
    assert!(calls.iter().all(|c| c.status == CallStatus::Ok));
    engine.shutdown(Duration::from_secs(1)).await;
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_capture_tells_the_ui_which_ports_it_measures() {
    let sim = simulator().await;
    let Some(engine) = capture_engine(&sim.base_url(), false).await else {
        sim.shutdown().await;
        return;
    };
    let doc = engine.handle.capture().await;
    assert_eq!(doc.state, CaptureState::On);
    assert_eq!(doc.interface.as_deref(), Some("lo"));
    assert_eq!(
        doc.routes,
        vec![CaptureRouteDoc {
            name: "t".into(),
            port: sim.local_addr().port()
        }]
    );
    assert_eq!(doc.grant_command, None);
    // Settings read the switch as it runs.
    assert_eq!(
        engine.handle.get_settings().await.unwrap().capture,
        Some(true)
    );
    engine.shutdown(Duration::from_secs(1)).await;
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_hangs_up_mid_stream_is_abandoned() {
    let sim = SimServer::start(
        "127.0.0.1:0",
        SimConfig {
            ttft: 20 * MS,
            tokens_per_second: 50.0,
            tokens: 500,
            ..SimConfig::default()
        },
    )
    .await
    .unwrap();
    let Some(engine) = capture_engine(&sim.base_url(), false).await else {
        sim.shutdown().await;
        return;
    };
    let body = r#"{"model":"m","prompt":"x"}"#;
    let mut stream = tokio::net::TcpStream::connect(sim.local_addr())
        .await
        .unwrap();
    let request = format!(
        "POST /api/generate HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        sim.local_addr(),
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    // Read until a few tokens have come, then hang up.
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while got.iter().filter(|b| **b == b'\n').count() < 15 {
        let n = stream.read(&mut buf).await.unwrap();
        assert!(n > 0, "the server ended early");
        got.extend_from_slice(&buf[..n]);
    }
    drop(stream);
    let calls = settled_calls(&engine, 1).await;
    assert_eq!(calls[0].status, CallStatus::Abandoned, "{calls:#?}");
    assert_eq!(calls[0].details.seen_by, SeenBy::Capture);
    engine.shutdown(Duration::from_secs(1)).await;
    sim.shutdown().await;
}

#[test]
fn without_the_permission_speedtap_run_warns_once_with_the_grant_command_and_keeps_proxying() {
    use crate::util::process::{self, read_announcement, speedtap, start_simulate, Proc, STARTUP};
    use std::os::unix::fs::PermissionsExt;

    let dir = process::scratch("capture", "no_permission");
    // A helper that fails its check the way libpcap does without
    // CAP_NET_RAW.
    let helper = dir.join("speedtap-capture");
    std::fs::write(
        &helper,
        "#!/bin/sh\necho 'socket: Operation not permitted' >&2\nexit 1\n",
    )
    .unwrap();
    std::fs::set_permissions(&helper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (_sim, upstream) =
        start_simulate(&dir, &["--tokens", "20", "--tps", "500", "--ttft-ms", "0"]);
    let route = format!("sim=127.0.0.1:0=http://{upstream}");
    let mut cmd = speedtap(
        &dir,
        &[
            "run",
            "--json",
            "--no-db",
            "--capture",
            "--api",
            "127.0.0.1:0",
            "--route",
            &route,
        ],
    );
    cmd.env("SPEEDTAP_CAPTURE_BIN", &helper);
    let mut p = Proc::spawn(cmd);
    let (proxy, api) = read_announcement(&p, "sim");
    let warning = p.stderr.wait_for("the capture warning", STARTUP, |l| {
        l.contains("capture is off")
    });
    let grant = format!("sudo setcap cap_net_raw=eip {}", helper.display());
    assert!(warning.contains(&grant), "{warning}");

    let rt = tokio::runtime::Runtime::new().unwrap();
    // The UI's document says the same: what Settings and Get started show.
    let doc = rt.block_on(send(api, "GET", "/api/v1/capture", ""));
    assert_eq!(doc.status, 200);
    let doc: speedtap::model::CaptureDoc = serde_json::from_slice(&doc.body()).unwrap();
    assert_eq!(doc.state, speedtap::model::CaptureState::Unavailable);
    assert_eq!(doc.grant_command.as_deref(), Some(grant.as_str()));

    let got = rt.block_on(send(
        proxy,
        "POST",
        "/v1/chat/completions",
        r#"{"model":"m","stream":true,"messages":[]}"#,
    ));
    assert_eq!(got.status, 200);
    p.stdout.wait_for("the settled call line", STARTUP, |l| {
        l.contains("\"is_final\":true")
    });

    p.signal("TERM");
    let status = p.wait_exit(Duration::from_secs(10));
    assert_eq!(status.code(), Some(0));
    let warnings = p
        .stderr
        .finish_lines()
        .into_iter()
        .filter(|l| l.contains("capture is off"))
        .count();
    assert_eq!(warnings, 1, "one warning line");
}

/// A call seen only by the capture has its wait explained like a proxied
/// one: the capture-only route's telemetry poller sees the simulator
/// (behaving like Ollama) loading the model, so the call's live snapshots
/// say `loading_model` before its first token, and its details keep it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_captured_call_for_a_model_not_loaded_says_it_is_loading() {
    let sim = crate::wait::loading_simulator().await;
    let Some(engine) = capture_engine_with(&sim.base_url(), false, |o| o.telemetry = true).await
    else {
        sim.shutdown().await;
        return;
    };
    let mut rx = engine.handle.subscribe().await;
    let body = serde_json::json!({
        "model": "m", "stream": true,
        "messages": [{"role": "user", "content": "hello there"}]
    })
    .to_string();
    let got = stopwatch_client(sim.local_addr(), "/api/chat", &body).await;
    assert_eq!(got.status, 200);
    let (seen, call) = crate::wait::waits_of(&mut rx, "c-000001").await;
    assert_eq!(call.details.seen_by, SeenBy::Capture);
    assert_eq!(
        crate::wait::reasons(&seen).first(),
        Some(&WaitReason::LoadingModel),
        "{seen:?}"
    );
    assert_eq!(call.details.start, Some(StartKind::Cold));
    assert!(call.details.wait.is_some(), "{call:#?}");
    let ttft = call.speed.as_ref().and_then(|s| s.time_to_first_token_ms);
    assert!(ttft.is_some_and(|t| t >= 1_500), "{ttft:?}");
    engine.shutdown(Duration::from_secs(1)).await;
    sim.shutdown().await;
}

/// Every call, once at least `n` calls on `route` have settled (10 s at
/// most).
async fn settled_on(engine: &RunningEngine, route: &str, n: usize) -> Vec<Call> {
    let all = speedtap::model::CallsQuery {
        limit: 10_000,
        route: None,
        unmetered: false,
    };
    calls_when(engine, all, |calls| {
        calls
            .iter()
            .filter(|c| c.identity.route == route && c.status.is_settled())
            .count()
            >= n
    })
    .await
}

/// Waits for a live snapshot of a call on `route` with output tokens: a
/// call streaming now.
async fn streaming_on(
    rx: &mut tokio::sync::mpsc::Receiver<speedtap::model::EngineEvent>,
    route: &str,
) {
    use speedtap::model::EngineEvent;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(EngineEvent::Speed { call, speed, .. }))
                if call.route == route && speed.output_tokens > 0 =>
            {
                return
            }
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => panic!("no call streaming on route {route}"),
        }
    }
}

/// A server that starts after the engine is captured from the moment its
/// route is added, with no restart and no proxy; the call streaming on the
/// other route meanwhile loses no packet. Removed again, its calls are no
/// longer recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_captured_while_running_measures_a_server_started_later_without_a_gap_for_the_others(
) {
    let sim_a = simulator().await;
    let Some(engine) = capture_engine(&sim_a.base_url(), false).await else {
        sim_a.shutdown().await;
        return;
    };
    let (path, body, _) = cases()[0];
    // A call to A streams (about 1.5 s) while B's route is added.
    let mut rx = engine.handle.subscribe().await;
    let a_addr = sim_a.local_addr();
    let in_flight = tokio::spawn(stopwatch_client(a_addr, path, body));
    streaming_on(&mut rx, "t").await;

    let sim_b = simulator().await;
    let b_port = sim_b.local_addr().port();
    let applied = engine
        .handle
        .capture_route("b", Upstream::parse(&sim_b.base_url()).unwrap())
        .unwrap();
    // A connection opened once the helper confirmed its filter is seen.
    assert!(
        applied.wait(Duration::from_secs(5)).await,
        "the filter took b's port"
    );
    let doc = engine.handle.capture().await;
    assert!(
        doc.routes.contains(&CaptureRouteDoc {
            name: "b".into(),
            port: b_port
        }),
        "{doc:?}"
    );
    // The same route again is no change; another name on its port is refused.
    engine
        .handle
        .capture_route("b", Upstream::parse(&sim_b.base_url()).unwrap())
        .unwrap();
    let taken = engine
        .handle
        .capture_route("c", Upstream::parse(&sim_b.base_url()).unwrap());
    assert!(taken.is_err(), "{taken:?}");

    // The call to A that was streaming across the change: whole.
    assert_eq!(in_flight.await.unwrap().status, 200);
    let calls = settled_on(&engine, "t", 1).await;
    let a = &calls[0];
    assert_eq!(
        (a.identity.route.as_str(), a.status),
        ("t", CallStatus::Ok),
        "{a:#?}"
    );
    assert!(!a.details.capture_gap, "{a:#?}");
    assert_eq!(a.speed.as_ref().unwrap().output_tokens, TOKENS);

    // Calls straight to B are measured. The helper applies the new filter
    // within a moment of the route's addition, so the first call may come
    // before it: retried until one is seen (each followed by a call to A,
    // which the capture reads after it), then the next one must be.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut on_a = 1;
    let mut attempts = 0;
    let b_seen = loop {
        attempts += 1;
        assert_eq!(
            stopwatch_client(sim_b.local_addr(), path, body)
                .await
                .status,
            200
        );
        stopwatch_client(a_addr, path, body).await;
        on_a += 1;
        let calls = settled_on(&engine, "t", on_a).await;
        let b_seen = calls.iter().filter(|c| c.identity.route == "b").count();
        if b_seen > 0 {
            eprintln!("the first call to B was measured on attempt {attempts}");
            break b_seen;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no call to B measured: {}",
            all_calls(&calls)
        );
    };
    assert_eq!(
        stopwatch_client(sim_b.local_addr(), path, body)
            .await
            .status,
        200
    );
    let calls = settled_on(&engine, "b", b_seen + 1).await;
    let b: Vec<&Call> = calls.iter().filter(|c| c.identity.route == "b").collect();
    for call in &b {
        assert_eq!(call.status, CallStatus::Ok, "{call:#?}");
        assert_eq!(call.details.seen_by, SeenBy::Capture);
        assert!(!call.details.capture_gap, "{call:#?}");
        assert_eq!(call.speed.as_ref().unwrap().output_tokens, TOKENS);
    }
    // Every call to A, before, across and after the change: whole.
    let on_a_calls: Vec<&Call> = calls.iter().filter(|c| c.identity.route == "t").collect();
    assert_eq!(on_a_calls.len(), on_a, "{}", all_calls(&calls));
    assert!(
        on_a_calls
            .iter()
            .all(|c| c.status == CallStatus::Ok && !c.details.capture_gap),
        "{}",
        all_calls(&calls)
    );

    // Removed: a call to B is no longer recorded (checked behind a call to
    // A, which the capture reads after it).
    assert!(engine.handle.uncapture_route(b_port));
    assert!(!engine.handle.uncapture_route(b_port), "already removed");
    stopwatch_client(sim_b.local_addr(), path, body).await;
    stopwatch_client(a_addr, path, body).await;
    let calls = settled_on(&engine, "t", on_a + 1).await;
    assert_eq!(
        calls.iter().filter(|c| c.identity.route == "b").count(),
        b.len(),
        "{}",
        all_calls(&calls)
    );
    let doc = engine.handle.capture().await;
    assert!(doc.routes.iter().all(|r| r.port != b_port), "{doc:?}");
    engine.shutdown(Duration::from_secs(1)).await;
    sim_a.shutdown().await;
    sim_b.shutdown().await;
}

/// With capture asked for and no route at all, the capture still starts
/// (on no port), so servers found later can be captured; without the
/// capture, capturing a route says why it can't.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_capture_starts_with_no_route_and_a_route_needs_it_running() {
    let mut options = EngineOptions::new(Vec::new());
    options.capture = Some(CaptureOptions {
        interface: "lo".into(),
        capture_only: Vec::new(),
    });
    let engine = Engine::start(options).await.unwrap();
    match &engine.capture {
        CaptureStatus::On { ports } => assert!(ports.is_empty(), "{ports:?}"),
        other => {
            assert!(
                std::env::var_os("SPEEDTAP_CAPTURE_REQUIRE").is_none(),
                "SPEEDTAP_CAPTURE_REQUIRE is set but the capture can't run here: {other:?}"
            );
            let refused = engine
                .handle
                .capture_route("x", Upstream::parse("http://127.0.0.1:9").unwrap())
                .unwrap_err();
            assert!(
                matches!(refused, speedtap::host::CaptureRouteError::Unavailable(_)),
                "{refused}"
            );
            eprintln!("skipped: the capture can't run here: {other:?}");
            engine.shutdown(Duration::from_secs(1)).await;
            return;
        }
    }
    let doc = engine.handle.capture().await;
    assert_eq!(doc.state, CaptureState::On);
    assert!(doc.routes.is_empty());
    let sim = simulator().await;
    let applied = engine
        .handle
        .capture_route("late", Upstream::parse(&sim.base_url()).unwrap())
        .unwrap();
    assert!(
        applied.wait(Duration::from_secs(5)).await,
        "the filter took the port"
    );
    let remote = engine
        .handle
        .capture_route("far", Upstream::parse("http://10.0.0.5:8080").unwrap());
    assert!(
        matches!(remote, Err(speedtap::host::CaptureRouteError::NotLocal(_))),
        "{remote:?}"
    );
    // Measured once the helper has the port (retried until then).
    let (path, body, _) = cases()[0];
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let call = loop {
        assert_eq!(
            stopwatch_client(sim.local_addr(), path, body).await.status,
            200
        );
        let calls = engine
            .handle
            .calls(speedtap::model::CallsQuery {
                limit: 10,
                route: None,
                unmetered: false,
            })
            .await;
        if let Some(c) = calls.into_iter().find(|c| c.status.is_settled()) {
            break c;
        }
        assert!(std::time::Instant::now() < deadline, "no call measured");
    };
    assert_eq!(call.identity.route, "late");
    assert_eq!(call.details.seen_by, SeenBy::Capture);
    engine.shutdown(Duration::from_secs(1)).await;
    sim.shutdown().await;

    // Without the capture, the reason comes back.
    let engine = Engine::start(EngineOptions::new(Vec::new())).await.unwrap();
    let refused = engine
        .handle
        .capture_route("x", Upstream::parse("http://127.0.0.1:9").unwrap())
        .unwrap_err();
    assert_eq!(
        refused.to_string(),
        "the capture is not running: capture is off (not asked for)"
    );
    engine.shutdown(Duration::from_secs(1)).await;
}

/// A server that answers every request with one OpenAI stream of `tokens`
/// chunks written in a single burst (one `write_all`), as a fast server
/// flushing a finished generation does; `usage` at the end.
async fn burst_server(tokens: usize) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // Words o200k reads as one token each: the text's estimate is the
    // usage's count, so a count above it is a count of something twice.
    const WORDS: [&str; 5] = [" the", " of", " and", " to", " in"];
    let mut body = String::new();
    for i in 0..tokens {
        body.push_str(&format!(
            "data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{}\"}},\"finish_reason\":null}}]}}\n\n",
            WORDS[i % WORDS.len()]
        ));
    }
    body.push_str(&format!(
        "data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[],\"usage\":{{\"prompt_tokens\":5,\"completion_tokens\":{tokens}}}}}\n\ndata: [DONE]\n\n"
    ));
    let response = std::sync::Arc::new(
        format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .into_bytes(),
    );
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let response = response.clone();
            tokio::spawn(async move {
                let mut seen = Vec::new();
                let mut buf = [0u8; 4096];
                while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => seen.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = stream.write_all(&response).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    addr
}

/// The 7 MB burst measurement: six responses of 50,000 tokens
/// (7 MB each) written at once straight from the server, all measured by
/// capture. Prints the packets the capture lost and checks every call
/// settled with a count at or below the truth. Run by hand, as root, after
/// `cargo build -p speedtap-capture`:
/// `cargo test --test tests capture::seven_mb_bursts -- --ignored --nocapture`.
/// Figures: docs/reliability.md. What it checks (every call settles, no
/// count above the truth) runs in CI on seeded loss, over all 8 protocols,
/// in `engine::capture::lossy`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement (drops vary with the machine), run by hand; its invariants run in CI in engine::capture::lossy"]
async fn seven_mb_bursts_measured_by_capture_settle_and_report_their_drops() {
    const TOKENS: usize = 50_000;
    let server = burst_server(TOKENS).await;
    let Some(engine) = capture_engine(&format!("http://{server}"), false).await else {
        return;
    };
    let mut rx = engine.handle.subscribe().await;
    let body = r#"{"messages":[{"role":"user","content":"hi"}],"stream":true,"model":"m"}"#;
    let clients: Vec<_> = (0..6)
        .map(|_| tokio::spawn(send(server, "POST", "/v1/chat/completions", body)))
        .collect();
    for c in clients {
        c.await.unwrap();
    }
    // Every call the capture started settles (a call whose request was
    // lost never starts): wait for a reading where every recorded call is
    // settled, then 4 s more of readings for the helper's last loss
    // counters, starting over if a call starts meanwhile. Not the stats'
    // `active`: it leaves out a call with no token for a while, as a call
    // whose packets still wait behind the other bursts' in the engine's
    // queue (a debug engine reads this burst for seconds).
    let on_t = speedtap::model::CallsQuery {
        limit: 100,
        route: Some("t".into()),
        unmetered: false,
    };
    let mut dropped = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut settle_by = deadline;
    let mut quiet = false;
    while let Ok(Some(event)) = tokio::time::timeout_at(settle_by, rx.recv()).await {
        if let speedtap::model::EngineEvent::Stats(stats) = event {
            dropped = dropped.max(stats.capture_dropped_packets);
            let calls = engine.handle.calls(on_t.clone()).await;
            // A reading from before the first call started is no sign.
            let settled = !calls.is_empty() && calls.iter().all(|c| c.status.is_settled());
            if settled && !quiet {
                quiet = true;
                settle_by = tokio::time::Instant::now() + Duration::from_secs(4);
            } else if !settled && quiet {
                quiet = false;
                settle_by = deadline;
            }
        }
    }
    assert!(quiet, "every captured call settled");
    let calls = engine.handle.calls(on_t).await;
    let gaps = calls.iter().filter(|c| c.details.capture_gap).count();
    assert!(calls.iter().all(|c| c.status.is_settled()), "{calls:?}");
    let counts: Vec<(u64, CallStatus)> = calls
        .iter()
        .map(|c| (c.speed.as_ref().map_or(0, |s| s.output_tokens), c.status))
        .collect();
    println!(
        "7 MB bursts: {dropped} packets dropped, {} calls, {gaps} flagged capture_gap, counts and statuses {counts:?}",
        calls.len()
    );
    for call in &calls {
        let speed = call.speed.as_ref().expect("a snapshot");
        assert!(speed.output_tokens <= TOKENS as u64, "{call:?}");
        if call.details.capture_gap {
            assert_eq!(speed.output_tokens_per_second, None);
        }
    }
    engine.shutdown(Duration::from_secs(1)).await;
}
