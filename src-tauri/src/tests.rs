//! The tray process without a display or a bus, against a real engine: it
//! answers the window process's questions, and starts without a port it
//! cannot have.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use serde_json::{json, Value};
use speedtap::host::settings::resolve_settings;
use speedtap::host::{Engine, EngineOptions};

use super::*;
use crate::notify::{Note, Sink};

/// Notifications go nowhere in these tests.
struct Discard;

impl Sink for Discard {
    fn show(&self, _: Note) {}
}

/// A unique temp dir per test (tests run in parallel in one process).
fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "speedtap-desktop-test-{}-{name}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The tray app's shared state around a real engine, without a tray.
fn tray_app(name: &str) -> (Arc<App>, tokio::runtime::Runtime) {
    let config = temp_dir(name).join("config.toml");
    let runtime = tokio_test_runtime();
    let engine = runtime.block_on(async {
        let mut options = EngineOptions::new(Vec::new());
        options.config_path = Some(config.clone());
        Engine::start(options).await.unwrap()
    });
    let app = Arc::new(App {
        engine: engine.handle.clone(),
        notifications: Notifications::with_settings(Discard, true, false),
        conflicts: Conflicts::new(Vec::new()),
        login: None,
        config,
        json: false,
        tray: OnceLock::new(),
        quit: tokio::sync::Notify::new(),
        runtime: runtime.handle().clone(),
    });
    (app, runtime)
}

fn tokio_test_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn answer(app: &Arc<App>, question: Value) -> Value {
    let line = app
        .runtime
        .block_on(app_commands::answer(app, &question.to_string()));
    serde_json::from_str(&line).unwrap()
}

#[test]
fn the_window_process_questions_are_answered_as_documents_or_errors() {
    let (app, _runtime) = tray_app("questions");
    assert_eq!(
        answer(&app, json!({"command": "port_conflicts"})),
        json!({"ok": {"conflicts": []}})
    );
    assert_eq!(
        answer(&app, json!({"command": "get_autostart"})),
        json!({"ok": {"available": false, "enabled": false}})
    );
    let refused = answer(&app, json!({"command": "use_free_port", "route": "x"}));
    assert_eq!(refused, json!({"error": "no port conflict for route x"}));
    let unknown = answer(&app, json!({"command": "rm_rf"}));
    assert!(
        unknown["error"]
            .as_str()
            .is_some_and(|e| e.starts_with("not a question")),
        "{unknown}"
    );
}

#[test]
fn flags_are_speedtap_runs_plus_hidden() {
    let args = DesktopArgs::try_parse_from([
        "speedtap-desktop",
        "--config",
        "/tmp/x.toml",
        "--route",
        "ollama=127.0.0.1:11435=http://127.0.0.1:11434",
        "--slow-ttft-ms",
        "800",
        "--hidden",
    ])
    .unwrap();
    assert!(args.hidden);
    assert_eq!(args.run.routes.len(), 1);
    assert_eq!(args.run.slow_ttft_ms, Some(800));
    let settings = resolve_settings(
        &DesktopArgs::try_parse_from([
            "x",
            "--route",
            "a=127.0.0.1:1=http://127.0.0.1:2",
            "--config",
            "/nonexistent/speedtap.toml",
        ])
        .unwrap()
        .run,
    );
    assert!(
        settings.is_err(),
        "a named config file that is missing is an error, as for speedtap run"
    );
}

#[test]
fn a_taken_port_leaves_the_app_running_without_that_route_and_the_api_on_a_free_one() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy = taken.local_addr().unwrap();
    let api_taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let api_busy = api_taken.local_addr().unwrap();
    let free = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let config = temp_dir("taken-port").join("config.toml");
    std::fs::write(&config, "").unwrap();
    let args = DesktopArgs::try_parse_from([
        "speedtap-desktop".to_owned(),
        "--config".to_owned(),
        config.display().to_string(),
        "--no-db".to_owned(),
        "--api".to_owned(),
        api_busy.to_string(),
        "--route".to_owned(),
        format!("busy={busy}=http://127.0.0.1:9"),
        "--route".to_owned(),
        format!("fine={free}=http://127.0.0.1:9"),
    ])
    .unwrap();
    let settings = resolve_settings(&args.run).unwrap();
    let notifications = Notifications::with_settings(Discard, true, false);
    let (engine, conflicts) = tokio_test_runtime()
        .block_on(start_engine(&args.run, settings, &notifications))
        .unwrap();
    assert_eq!(conflicts.len(), 2, "{conflicts:?}");
    let route = conflicts
        .iter()
        .find(|c| c.route.is_some())
        .expect("the route's conflict");
    assert_eq!(route.route.as_deref(), Some("busy"));
    assert_eq!(route.port, busy.port());
    // The window reads the control API: it still listens, on a loopback
    // port of the system's choosing.
    let api = engine.handle.api_addr().expect("the control API listens");
    assert!(
        api.ip().is_loopback() && api.port() != api_busy.port(),
        "{api}"
    );
    let conflicts = [route.clone()];
    assert_eq!(
        conflicts[0].holder.as_ref().map(|h| h.pid),
        Some(std::process::id())
    );
    let routes: Vec<String> = engine.routes.iter().map(|r| r.name.clone()).collect();
    assert_eq!(routes, ["fine"]);
    drop((taken, api_taken));
}
