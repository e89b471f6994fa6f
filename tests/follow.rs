//! Following the machine end to end: an engine started with nothing
//! configured finds a model server started after it (a real process, the
//! simulator run under a model server's name), measures its calls under a
//! stable name, marks it down when it stops and up when it comes back on
//! the same port under the same name.
//!
//! Without the capture's permission the server is measured behind the
//! proxy route the watcher opens for it; with it, by capture (the
//! capture's own tests cover that path).

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use speedtap::host::{
    CaptureOptions, CaptureStatus, Engine, EngineOptions, RunningEngine, WatchOptions, WATCH_EVERY,
};
use speedtap::model::{
    Call, CallsQuery, EngineEvent, EngineQueries, FollowedServer, FollowedState,
};

use crate::util::process::{scratch, url_addr, Proc, BIN, STARTUP};
use crate::util::proxy::{calls_when, send};

/// `speedtap simulate` started as `<dir>/llama-server` (a link to the
/// binary): to the watcher, a llama.cpp server by its process name.
fn start_llama_server(dir: &Path, listen: &str) -> (Proc, SocketAddr) {
    let link = dir.join("llama-server");
    if !link.exists() {
        std::os::unix::fs::symlink(BIN, &link).unwrap();
    }
    let mut cmd = Command::new(&link);
    cmd.args(["simulate", "--listen", listen, "--tps", "200"]);
    spawn_listening(cmd)
}

/// Starts `cmd` and waits for its `listening on http://ADDR` line.
fn spawn_listening(mut cmd: Command) -> (Proc, SocketAddr) {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = Proc::spawn(cmd);
    let banner = child.stdout.wait_for("the listening banner", STARTUP, |l| {
        l.contains("listening on")
    });
    (child, url_addr(&banner, "listening on http://"))
}

/// The engine started with the capture on `lo`, or `None` (the test
/// skipped) where the capture can't run and CI doesn't require it.
async fn capture_engine(mut options: EngineOptions) -> Option<RunningEngine> {
    options.capture = Some(CaptureOptions {
        interface: "lo".into(),
        capture_only: Vec::new(),
    });
    let engine = Engine::start(options).await.unwrap();
    if matches!(engine.capture, CaptureStatus::On { .. }) {
        return Some(engine);
    }
    assert!(
        std::env::var_os("SPEEDTAP_CAPTURE_REQUIRE").is_none(),
        "SPEEDTAP_CAPTURE_REQUIRE is set but the capture can't run here: {:?}",
        engine.capture
    );
    eprintln!("skipped: the capture can't run here: {:?}", engine.capture);
    engine.shutdown(Duration::from_secs(1)).await;
    None
}

async fn watching_engine(dir: &Path) -> RunningEngine {
    let mut options = EngineOptions::new(Vec::new());
    options.watch = Some(WatchOptions {
        saved: Some(dir.join("servers.json")),
        ..WatchOptions::default()
    });
    Engine::start(options).await.unwrap()
}

/// Waits until the server on `port` is in `state` (re-reading the list
/// after each `servers` event, subscribed before the first read so no
/// change slips between), and how long that took; fails after `within`.
async fn server_on(
    engine: &RunningEngine,
    port: u16,
    state: FollowedState,
    within: Duration,
) -> (FollowedServer, Duration) {
    let start = Instant::now();
    let deadline = tokio::time::Instant::now() + within;
    let mut events = engine.handle.subscribe().await;
    loop {
        let doc = engine.handle.servers().await;
        let found = doc
            .servers
            .iter()
            .find(|s| s.upstream.ends_with(&format!(":{port}")) && s.state == state);
        if let Some(server) = found {
            return (server.clone(), start.elapsed());
        }
        loop {
            match tokio::time::timeout_at(deadline, events.recv()).await {
                Ok(Some(EngineEvent::Servers(_))) => break,
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => {
                    panic!("no server {state:?} on port {port} after {within:?}: {doc:#?}")
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_started_after_the_engine_is_measured_and_keeps_its_name_across_a_restart() {
    let dir = scratch("follow", "restart");
    let engine = watching_engine(&dir).await;
    assert!(engine.handle.servers().await.watching);

    let (mut sim, addr) = start_llama_server(&dir, "127.0.0.1:0");
    let within = 2 * WATCH_EVERY;
    let (server, took) = server_on(&engine, addr.port(), FollowedState::Proxied, within).await;
    eprintln!("found after {took:?}");
    let name = format!("llama-server-{}", addr.port());
    assert_eq!(
        (server.name.as_str(), server.kind.as_str()),
        (name.as_str(), "llama-server")
    );
    assert_eq!(server.process.as_deref(), Some("llama-server"));
    assert_eq!(server.pid, Some(sim.child.id() as i32));

    // A call through the route opened for it is measured under its name.
    let proxy: SocketAddr = server.proxy_listen.as_deref().unwrap().parse().unwrap();
    let body = r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let reply = send(proxy, "POST", "/v1/chat/completions", body).await;
    assert_eq!(reply.status, 200);
    let calls = engine
        .handle
        .calls(CallsQuery {
            limit: 100,
            route: Some(name.clone()),
            unmetered: false,
        })
        .await;
    assert_eq!(calls.len(), 1, "{calls:#?}");

    // Stopped: down, with its name.
    sim.kill_9();
    let (down, _) = server_on(&engine, addr.port(), FollowedState::Down, within).await;
    assert_eq!(down.name, name);

    // Started again on the same port: up under the same name, its history kept.
    let (_sim, again) = start_llama_server(&dir, &addr.to_string());
    assert_eq!(again, addr);
    let (back, _) = server_on(&engine, addr.port(), FollowedState::Proxied, within).await;
    assert_eq!(back.name, name);
    assert_eq!(back.proxy_listen, server.proxy_listen);
    let saved = std::fs::read_to_string(dir.join("servers.json")).unwrap();
    assert!(saved.contains(&name), "{saved}");

    // Ignored by the user: listed as such, and saved so.
    let doc = engine.handle.ignore_server(name.clone()).await.unwrap();
    let ignored = doc.servers.iter().find(|s| s.name == name).unwrap();
    assert_eq!(ignored.state, FollowedState::Ignored);
    let saved = std::fs::read_to_string(dir.join("servers.json")).unwrap();
    assert!(saved.contains("\"ignored\""), "{saved}");
    // Its proxy port closed at once: nothing would measure calls there.
    assert!(tokio::net::TcpStream::connect(proxy).await.is_err());
    assert!(engine.handle.bound_routes().iter().all(|r| r.name != name));
    let unknown = engine.handle.ignore_server("no-such-server".into()).await;
    assert!(unknown.is_err());
    engine.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_capture_a_server_started_after_the_engine_is_measured_with_no_client_change() {
    let dir = scratch("follow", "capture");
    let mut options = EngineOptions::new(Vec::new());
    options.watch = Some(WatchOptions::default());
    let Some(engine) = capture_engine(options).await else {
        return;
    };
    let (_sim, addr) = start_llama_server(&dir, "127.0.0.1:0");
    let (server, took) = server_on(
        &engine,
        addr.port(),
        FollowedState::Measured,
        2 * WATCH_EVERY,
    )
    .await;
    eprintln!("captured after {took:?}");
    assert_eq!(server.seen_by.as_deref(), Some("capture"));
    assert_eq!(server.proxy_listen, None, "no port opened");

    // A call sent straight to the server, as any client makes it.
    let body = r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let reply = send(addr, "POST", "/v1/chat/completions", body).await;
    assert_eq!(reply.status, 200);
    let route = CallsQuery {
        limit: 100,
        route: Some(server.name.clone()),
        unmetered: false,
    };
    let calls = calls_when(&engine, route, |calls| {
        calls.iter().any(|c| c.status.is_settled())
    })
    .await;
    assert_eq!(calls.len(), 1, "{calls:#?}");
    engine.shutdown(Duration::from_secs(1)).await;
}

/// `tests/relay/litellm` (a relay known by its process name, like
/// LiteLLM) started in front of `upstream`; its address.
fn start_relay(upstream: SocketAddr) -> (Proc, SocketAddr) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/relay/litellm");
    let mut cmd = Command::new(script);
    cmd.arg(format!("http://{upstream}"));
    spawn_listening(cmd)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_through_a_relay_to_a_second_server_is_recorded_once_with_the_servers_truth() {
    let dir = scratch("follow", "relay");
    let db = dir.join("speedtap.db");
    let mut options = EngineOptions::new(Vec::new());
    options.watch = Some(WatchOptions::default());
    options.store = Some(speedtap::store::Store::open(&db).unwrap());
    let Some(engine) = capture_engine(options).await else {
        return;
    };
    let within = 2 * WATCH_EVERY;
    let (_sim, server_addr) = start_llama_server(&dir, "127.0.0.1:0");
    let (server, _) = server_on(&engine, server_addr.port(), FollowedState::Measured, within).await;
    let (relay_proc, relay_addr) = start_relay(server_addr);
    let (relay, _) = server_on(&engine, relay_addr.port(), FollowedState::Measured, within).await;
    assert_eq!(relay.pid, Some(relay_proc.child.id() as i32));

    // Three calls to the relay, as an app pointed at LiteLLM makes them.
    for _ in 0..3 {
        let body = r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
        let reply = send(relay_addr, "POST", "/v1/chat/completions", body).await;
        assert_eq!(reply.status, 200);
    }
    let all = CallsQuery {
        limit: 100,
        route: None,
        unmetered: false,
    };
    // Other tests' servers may be followed too: only these two routes.
    let ours = |c: &&Call| c.identity.route == relay.route || c.identity.route == server.route;
    let calls = calls_when(&engine, all, |calls| {
        calls
            .iter()
            .filter(ours)
            .filter(|c| c.status.is_settled())
            .count()
            == 6
    })
    .await;
    let calls: Vec<Call> = calls.iter().filter(ours).cloned().collect();
    let (legs, clients): (Vec<_>, Vec<_>) = calls.iter().partition(|c| c.details.relay.is_some());
    assert_eq!((legs.len(), clients.len()), (3, 3), "{calls:#?}");
    for leg in &legs {
        assert_eq!(leg.identity.route, server.route);
        assert_eq!(leg.details.relay.as_deref(), Some(relay.route.as_str()));
    }
    for call in &clients {
        assert_eq!(call.identity.route, relay.route);
        assert_eq!(call.identity.model.as_deref(), Some("m"));
    }
    engine.shutdown(Duration::from_secs(1)).await;

    // One record per client call: the relay's legs are never stored.
    let stored = speedtap::store::Store::open(&db).unwrap();
    let on = |route: &str| {
        let filter = speedtap::model::HistoryFilter {
            route: Some(route.to_owned()),
            ..Default::default()
        };
        stored.history(&filter).unwrap().len()
    };
    assert_eq!((on(&relay.route), on(&server.route)), (3, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_unknown_by_name_is_found_once_the_settings_name_its_port() {
    let dir = scratch("follow", "watch-ports");
    let mut options = EngineOptions::new(Vec::new());
    options.config_path = Some(dir.join("config.toml"));
    options.watch = Some(WatchOptions::default());
    let engine = Engine::start(options).await.unwrap();

    // The simulator under a name no model server has: left alone.
    let link = dir.join("my-model-server");
    std::os::unix::fs::symlink(BIN, &link).unwrap();
    let mut cmd = Command::new(&link);
    cmd.args(["simulate", "--listen", "127.0.0.1:0"]);
    let (_sim, addr) = spawn_listening(cmd);

    // Named in the Settings view: found at once, and saved to the file.
    let mut settings = engine.handle.get_settings().await.unwrap();
    assert_eq!(settings.watch_ports, Some(Vec::new()));
    settings.watch_ports = Some(vec![addr.port()]);
    engine.handle.save_settings(settings).await.unwrap();
    let (server, took) = server_on(
        &engine,
        addr.port(),
        FollowedState::Proxied,
        2 * WATCH_EVERY,
    )
    .await;
    eprintln!("found {} {took:?} after its port was named", server.name);
    assert_eq!(server.process.as_deref(), Some("my-model-server"));
    let file = std::fs::read_to_string(dir.join("config.toml")).unwrap();
    assert!(
        file.contains(&format!("watch_ports = [{}]", addr.port())),
        "{file}"
    );
    assert_eq!(engine.handle.servers().await.watch_ports, [addr.port()]);
    engine.shutdown(Duration::from_secs(1)).await;
}
