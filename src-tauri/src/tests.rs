//! The commands and the event forwarding, through Tauri's IPC on the mock
//! runtime (no display, no bus), against a real engine with a route to the
//! built-in simulator.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{json, Value};
use speedtap::host::settings::resolve_settings;
use speedtap::host::{Engine, EngineOptions};
use speedtap::model::RouteSpec;
use speedtap::simulate::{SimConfig, SimServer};
use tauri::ipc::{CallbackFn, InvokeBody};
use tauri::test::{mock_builder, MockRuntime, INVOKE_KEY};
use tauri::webview::InvokeRequest;
use tauri::{App, Listener, Manager, WebviewWindow};

use super::*;
use crate::notify::{Note, Sink};

/// Notifications go nowhere in these tests.
struct Discard;

impl Sink for Discard {
    fn show(&self, _: Note) {}
}

struct Harness {
    app: App<MockRuntime>,
    window: WebviewWindow<MockRuntime>,
    proxy: String,
    config: PathBuf,
    _sim: SimServer,
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

fn harness(name: &str) -> Harness {
    let config = temp_dir(name).join("config.toml");
    let (engine, sim) = tauri::async_runtime::block_on(async {
        let sim = SimServer::start(
            "127.0.0.1:0",
            SimConfig {
                ttft: Duration::from_millis(20),
                tokens: 8,
                ..SimConfig::default()
            },
        )
        .await
        .unwrap();
        let mut options =
            EngineOptions::new(vec![
                RouteSpec::new("sim", "127.0.0.1:0", &sim.base_url()).unwrap()
            ]);
        options.config_path = Some(config.clone());
        (Engine::start(options).await.unwrap(), sim)
    });
    let proxy = engine.routes[0].proxy_url();
    let handle = engine.handle.clone();
    let notifications = Notifications::with_settings(Discard, true, false);
    let app = build_app(
        mock_builder(),
        Host {
            engine,
            notifications: notifications.clone(),
            show_window: true,
            json: false,
        },
    )
    .unwrap();
    // The mock app's event loop never starts, so its setup never runs.
    start_following_events(app.handle(), handle, notifications, false);
    let window = match app.get_webview_window(MAIN_WINDOW) {
        Some(w) => w,
        None => tauri::WebviewWindowBuilder::new(&app, MAIN_WINDOW, Default::default())
            .build()
            .unwrap(),
    };
    Harness {
        app,
        window,
        proxy,
        config,
        _sim: sim,
    }
}

impl Harness {
    /// `window.__TAURI__.core.invoke(cmd, args)` as the page would send it.
    fn invoke(&self, cmd: &str, args: Value) -> Result<Value, Value> {
        tauri::test::get_ipc_response(
            &self.window,
            InvokeRequest {
                cmd: cmd.into(),
                callback: CallbackFn(0),
                error: CallbackFn(1),
                // The Linux/macOS origin of the app's own pages; the Windows
                // form (`http://tauri.localhost`) counts as remote here.
                url: "tauri://localhost".parse().unwrap(),
                body: InvokeBody::Json(args),
                headers: Default::default(),
                invoke_key: INVOKE_KEY.to_string(),
            },
        )
        .map(|body| body.deserialize::<Value>().unwrap())
    }

    /// One streamed chat completion through the proxy, read to the end.
    fn stream_one_call(&self) {
        let addr = self.proxy.trim_start_matches("http://").to_owned();
        let body =
            r#"{"model":"qwen3:8b","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(
            s,
            "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        assert!(out.starts_with("HTTP/1.1 200"), "{out}");
        assert!(out.contains("[DONE]"), "{out}");
    }
}

#[test]
fn calls_lists_a_streamed_call_and_settled_reaches_the_window() {
    let h = harness("calls");
    let (tx, rx) = mpsc::channel::<Value>();
    h.app.listen_any(events::SETTLED, move |e| {
        let _ = tx.send(serde_json::from_str(e.payload()).unwrap());
    });
    h.stream_one_call();
    let settled = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("a settled event");
    assert_eq!(settled["status"], "ok");
    assert_eq!(settled["model"], "qwen3:8b");
    assert_eq!(settled["route"], "sim");

    let doc = h
        .invoke("calls", json!({"limit": 10, "route": "sim"}))
        .unwrap();
    let calls = doc["calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{doc}");
    assert_eq!(calls[0]["id"], settled["id"]);
    assert_eq!(calls[0]["speed"]["phase"], "complete");
    // A route filter that matches nothing, and the default limit.
    let none = h.invoke("calls", json!({"route": "other"})).unwrap();
    assert_eq!(none, json!({"calls": []}));
    let all = h.invoke("calls", json!({})).unwrap();
    assert_eq!(all["calls"].as_array().unwrap().len(), 1);
}

#[test]
fn stats_routes_and_history_have_the_contract_shapes() {
    let h = harness("stats");
    let stats = h.invoke("stats", json!({})).unwrap();
    assert_eq!(stats["tps_available"], false, "{stats}");
    assert!(
        stats.get("tps").is_none(),
        "no number rather than 0: {stats}"
    );
    assert_eq!(stats["active"], 0);

    let routes = h.invoke("routes", json!({})).unwrap();
    assert_eq!(routes["routes"][0]["name"], "sim");
    assert_eq!(routes["routes"][0]["proxy_url"], h.proxy.as_str());

    let history = h.invoke("stats_history", json!({})).unwrap();
    assert!(history["points"].is_array(), "{history}");
}

#[test]
fn settings_save_to_the_config_file_and_bad_ones_are_refused() {
    let h = harness("settings");
    let current = h.invoke("get_settings", json!({})).unwrap();
    assert_eq!(
        current["config_path"],
        h.config.display().to_string().as_str()
    );
    assert_eq!(current["slow_ttft_ms"], 5000);

    let mut changed = current.clone();
    changed["slow_ttft_ms"] = json!(1234);
    changed["notify_settled"] = json!(true);
    let saved = h
        .invoke("save_settings", json!({ "settings": changed }))
        .unwrap();
    assert_eq!(saved["saved"], true, "{saved}");
    assert_eq!(saved["restart_required"], false, "{saved}");
    let text = std::fs::read_to_string(&h.config).unwrap();
    assert!(text.contains("slow_ttft_ms = 1234"), "{text}");
    let now = h.invoke("get_settings", json!({})).unwrap();
    assert_eq!(now["slow_ttft_ms"], 1234);
    assert_eq!(now["notify_settled"], true);

    let mut bad = current;
    bad["slow_ttft_ms"] = json!(0);
    let err = h
        .invoke("save_settings", json!({ "settings": bad }))
        .unwrap_err();
    assert!(
        err.as_str().is_some_and(|m| m.contains("slow_ttft_ms")),
        "the error names the field: {err}"
    );
}

#[test]
fn start_demo_adds_a_demo_route() {
    let h = harness("demo");
    let demo = h.invoke("start_demo", json!({})).unwrap();
    assert_eq!(demo["running"], true, "{demo}");
    assert_eq!(demo["route"]["name"], "demo");
    let again = h.invoke("start_demo", json!({})).unwrap();
    assert_eq!(again["route"], demo["route"], "idempotent while running");
    let routes = h.invoke("routes", json!({})).unwrap();
    let names: Vec<&str> = routes["routes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["name"].as_str())
        .collect();
    assert_eq!(names, ["sim", "demo"]);
}

#[test]
fn unknown_commands_are_refused() {
    let h = harness("unknown");
    assert!(h.invoke("rm_rf", json!({})).is_err());
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
fn the_window_is_created_only_when_opened_and_once() {
    let config = temp_dir("lazy-window").join("config.toml");
    let engine = tauri::async_runtime::block_on(async {
        let mut options = EngineOptions::new(Vec::new());
        options.config_path = Some(config);
        Engine::start(options).await.unwrap()
    });
    let app = build_app(
        mock_builder(),
        Host {
            engine,
            notifications: Notifications::with_settings(Discard, true, false),
            show_window: false,
            json: false,
        },
    )
    .unwrap();
    assert!(
        app.get_webview_window(MAIN_WINDOW).is_none(),
        "no window (and no webview) before it is opened"
    );
    crate::window::open(app.handle());
    assert!(app.get_webview_window(MAIN_WINDOW).is_some());
    // Opening again shows the same window rather than a second one.
    crate::window::open(app.handle());
    assert_eq!(app.webview_windows().len(), 1);
}

#[test]
fn a_taken_port_leaves_the_app_running_without_that_route() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy = taken.local_addr().unwrap();
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
        "127.0.0.1:0".to_owned(),
        "--route".to_owned(),
        format!("busy={busy}=http://127.0.0.1:9"),
        "--route".to_owned(),
        format!("fine={free}=http://127.0.0.1:9"),
    ])
    .unwrap();
    let settings = resolve_settings(&args.run).unwrap();
    let notifications = Notifications::with_settings(Discard, true, false);
    let (engine, conflicts) =
        tauri::async_runtime::block_on(start_engine(&args.run, settings, &notifications)).unwrap();
    assert_eq!(conflicts.len(), 1, "{conflicts:?}");
    assert_eq!(conflicts[0].route.as_deref(), Some("busy"));
    assert_eq!(conflicts[0].port, busy.port());
    assert_eq!(
        conflicts[0].holder.as_ref().map(|h| h.pid),
        Some(std::process::id())
    );
    let routes: Vec<String> = engine.routes.iter().map(|r| r.name.clone()).collect();
    assert_eq!(routes, ["fine"]);
    drop(taken);
}
