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
use speedtap::model::{CallsQuery, EngineEvent, EngineQueries, FollowedServer, FollowedState};

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
    cmd.args(["simulate", "--listen", listen, "--tps", "200"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let sim = Proc::spawn(cmd);
    let banner = sim.stdout.wait_for("the simulate banner", STARTUP, |l| {
        l.contains("listening on")
    });
    (sim, url_addr(&banner, "listening on http://"))
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
    let unknown = engine.handle.ignore_server("no-such-server".into()).await;
    assert!(unknown.is_err());
    engine.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_capture_a_server_started_after_the_engine_is_measured_with_no_client_change() {
    let dir = scratch("follow", "capture");
    let mut options = EngineOptions::new(Vec::new());
    options.capture = Some(CaptureOptions {
        interface: "lo".into(),
        capture_only: Vec::new(),
    });
    options.watch = Some(WatchOptions::default());
    let engine = Engine::start(options).await.unwrap();
    if !matches!(engine.capture, CaptureStatus::On { .. }) {
        assert!(
            std::env::var_os("SPEEDTAP_CAPTURE_REQUIRE").is_none(),
            "SPEEDTAP_CAPTURE_REQUIRE is set but the capture can't run here: {:?}",
            engine.capture
        );
        eprintln!("skipped: the capture can't run here: {:?}", engine.capture);
        engine.shutdown(Duration::from_secs(1)).await;
        return;
    }
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
