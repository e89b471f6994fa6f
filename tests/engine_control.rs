//! The UI's engine controls through the real engine: bound routes, settings
//! saved to the config file, demo traffic that really flows and is metered.

use crate::util::proxy as proxy_support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use proxy_support::{send, settled_calls};
use speedtap::config::load_config;
use speedtap::host::{Engine, EngineOptions};
use speedtap::model::RouteSpec;
use speedtap::model::{CallStatus, EngineQueries};
use speedtap::model::{EngineEvent, HistoryFilter, SlowFirstToken};
use speedtap::model::{RouteDoc, SettingsDoc};
use speedtap::simulate::{SimConfig, SimServer};
use speedtap::store::Store;

fn temp_config(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("speedtap-test-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("speedtap.toml")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_are_validated_saved_and_applied() {
    let path = temp_config("settings");
    let route = RouteSpec::new("ollama", "127.0.0.1:0", "http://127.0.0.1:9").unwrap();
    let mut options = EngineOptions::new(vec![route]);
    options.config_path = Some(path.clone());
    let engine = Engine::start(options).await.unwrap();
    let h = &engine.handle;

    let routes = h.routes().await.routes;
    assert_eq!(routes.len(), 1);
    assert_eq!(routes[0].name, "ollama");
    assert_eq!(
        routes[0].proxy_url,
        format!("http://{}", engine.routes[0].listen)
    );

    let mut doc = h.get_settings().await.unwrap();
    assert_eq!(doc.slow_ttft_ms, 5000);
    assert_eq!(doc.config_path.as_deref(), Some(path.to_str().unwrap()));

    // A bad upstream is refused and names the route; nothing is written.
    let mut bad = doc.clone();
    bad.routes[0].upstream = "ftp://nope".into();
    let err = h.save_settings(bad).await.unwrap_err().to_string();
    assert!(err.contains("routes[0]") && err.contains("ollama"), "{err}");
    assert!(!path.exists());

    doc.slow_ttft_ms = 1234;
    doc.notify_settled = true;
    doc.routes.push(RouteDoc {
        name: "llama".into(),
        listen: "127.0.0.1:8081".into(),
        upstream: "http://127.0.0.1:8080".into(),
    });
    let saved = h.save_settings(doc).await.unwrap();
    assert!(saved.saved);
    assert!(saved.restart_required, "a new route needs a restart");
    let file = load_config(&path).unwrap();
    assert_eq!(file.slow_ttft_ms, Some(1234));
    assert_eq!(file.notify_settled, Some(true));
    assert_eq!(file.routes.len(), 2);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }
    // Applied at once.
    let now: SettingsDoc = h.get_settings().await.unwrap();
    assert_eq!(now.slow_ttft_ms, 1234);
    assert!(now.notify_settled);
    engine.shutdown(Duration::from_secs(1)).await;
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_capture_switch_is_saved_to_the_file_and_waits_for_a_restart() {
    let path = temp_config("capture-switch");
    let route = RouteSpec::new("ollama", "127.0.0.1:0", "http://127.0.0.1:9").unwrap();
    let mut options = EngineOptions::new(vec![route]);
    options.config_path = Some(path.clone());
    let engine = Engine::start(options).await.unwrap();
    let h = &engine.handle;

    let mut doc = h.get_settings().await.unwrap();
    assert_eq!(doc.capture, Some(false), "started without capture");
    // A document without the key (an older page) keeps what the file says.
    doc.capture = None;
    let saved = h.save_settings(doc.clone()).await.unwrap();
    assert!(!saved.restart_required);
    assert_eq!(load_config(&path).unwrap().capture, None);

    doc.capture = Some(true);
    let saved = h.save_settings(doc.clone()).await.unwrap();
    assert!(saved.restart_required, "the capture starts with the engine");
    assert_eq!(load_config(&path).unwrap().capture, Some(true));
    assert_eq!(h.get_settings().await.unwrap().capture, Some(true));

    doc.capture = Some(false);
    h.save_settings(doc).await.unwrap();
    assert_eq!(load_config(&path).unwrap().capture, Some(false));

    // Not running: the capture document says off (and whether it could run).
    let capture = h.capture().await;
    assert_eq!(capture.state, speedtap::model::CaptureState::Off);
    assert!(
        capture.permitted.is_some(),
        "the helper's permission was checked"
    );
    engine.shutdown(Duration::from_secs(1)).await;
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_traffic_flows_through_a_demo_route_and_is_metered() {
    let engine = Engine::start(EngineOptions::new(Vec::new())).await.unwrap();
    let h = &engine.handle;
    let demo = h.start_demo().await.unwrap();
    assert!(demo.running);
    assert_eq!(demo.route.name, "demo");
    // Idempotent: the same route while it runs.
    assert_eq!(h.start_demo().await.unwrap().route, demo.route);
    assert_eq!(h.routes().await.routes, vec![demo.route.clone()]);
    // The first demo calls settle with real numbers.
    let calls = settled_calls(&engine, 2).await;
    let ok: Vec<_> = calls
        .iter()
        .filter(|c| c.status == CallStatus::Ok)
        .collect();
    assert!(ok.len() >= 2, "{calls:#?}");
    for call in ok {
        assert_eq!(call.identity.route, "demo");
        let speed = call.speed.as_ref().unwrap();
        assert!(speed.output_tokens >= 90, "{speed:?}");
        assert!(speed.time_to_first_token_ms.is_some());
    }
    engine.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_route_never_takes_a_configured_routes_name() {
    let route = RouteSpec::new("demo", "127.0.0.1:0", "http://127.0.0.1:9").unwrap();
    let engine = Engine::start(EngineOptions::new(vec![route]))
        .await
        .unwrap();
    let demo = engine.handle.start_demo().await.unwrap();
    assert_eq!(demo.route.name, "demo-2");
    let names: Vec<String> = engine
        .handle
        .routes()
        .await
        .routes
        .into_iter()
        .map(|r| r.name)
        .collect();
    assert_eq!(names, vec!["demo".to_owned(), "demo-2".to_owned()]);
    engine.shutdown(Duration::from_secs(1)).await;
}

/// A config file that can't be written is the engine's failure, not the
/// request's: `QueryError::Io`, which the control API answers with 500.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_file_that_cannot_be_written_is_a_500() {
    use speedtap::model::QueryError;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    // The config file's folder is a regular file: the write must fail.
    let blocker = temp_config("unwritable").with_file_name("not-a-folder");
    std::fs::write(&blocker, b"").unwrap();
    let path = blocker.join("speedtap.toml");
    let route = RouteSpec::new("ollama", "127.0.0.1:0", "http://127.0.0.1:9").unwrap();
    let mut options = EngineOptions::new(vec![route]);
    options.config_path = Some(path.clone());
    options.api = Some("127.0.0.1:0".parse().unwrap());
    let engine = Engine::start(options).await.unwrap();
    let h = &engine.handle;

    let doc = h.get_settings().await.unwrap();
    let err = h.save_settings(doc.clone()).await.unwrap_err();
    assert!(matches!(err, QueryError::Io(_)), "{err:?}");
    assert_eq!(err.http_status(), 500);
    assert!(err.message().contains("cannot write"), "{err}");

    // The same through the control API.
    let api = engine.api.unwrap();
    let body = serde_json::to_string(&doc).unwrap();
    let mut conn = tokio::net::TcpStream::connect(api).await.unwrap();
    let request = format!(
        "PUT /api/v1/settings HTTP/1.1\r\nHost: {api}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    conn.read_to_string(&mut response).await.unwrap();
    assert!(
        response.starts_with("HTTP/1.1 500"),
        "expected a 500, got: {response}"
    );
    assert!(response.contains("cannot write"), "{response}");

    // A bad field is still the request's fault: 400.
    let mut bad = doc;
    bad.slow_ttft_ms = 0;
    let err = h.save_settings(bad).await.unwrap_err();
    assert_eq!(err.http_status(), 400, "{err}");
    engine.shutdown(Duration::from_secs(1)).await;
}

/// Every option the config file sets reaches the engine through the one
/// settings path both front ends use (`host::settings`): the store's
/// retention and size cap, the OTLP endpoint and the proxy's limits.
#[test]
fn each_option_in_the_config_file_reaches_the_engine_options() {
    use clap::Parser;
    use speedtap::host::args::RunArgs;
    use speedtap::host::settings::{engine_options, resolve_settings};

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        run: RunArgs,
    }

    let path = temp_config("every-option");
    std::fs::write(
        &path,
        "db = false\nidle_timeout = \"3m\"\nretention_days = 7\nmax_db_mb = 64\n\
         otlp_endpoint = \"http://127.0.0.1:4318\"\nhead_timeout = \"15s\"\n\
         max_head_kib = 32\nmax_connections = 100\nslow_ttft_ms = 1234\n\
         notifications = false\nnotify_settled = true\n",
    )
    .unwrap();
    let config = path.to_str().unwrap();
    let flags = Flags::parse_from([
        "speedtap",
        "--config",
        config,
        "--route",
        "t=127.0.0.1:0=http://127.0.0.1:9",
    ]);
    let settings = resolve_settings(&flags.run).expect("settings");
    let options = engine_options(&flags.run, &settings).expect("options");
    assert!(options.store.is_none(), "db = false");
    assert_eq!(options.retention, Duration::from_secs(7 * 24 * 3600));
    assert_eq!(options.max_db_bytes, 64 * 1024 * 1024);
    assert_eq!(
        options.otlp_endpoint.as_deref(),
        Some("http://127.0.0.1:4318")
    );
    assert_eq!(
        options.proxy_limits.idle_timeout,
        Some(Duration::from_secs(180))
    );
    assert_eq!(
        options.proxy_limits.header_read_timeout,
        Duration::from_secs(15)
    );
    assert_eq!(options.proxy_limits.max_buf_size, 32 * 1024);
    assert_eq!(options.proxy_limits.max_connections, 100);
    assert_eq!(options.slow_ttft, Duration::from_millis(1234));
    assert!(!options.notifications && options.notify_settled);
    assert_eq!(options.config_path.as_deref(), Some(path.as_path()));

    // A flag beats the file, field by field.
    let flags = Flags::parse_from([
        "speedtap",
        "--config",
        config,
        "--route",
        "t=127.0.0.1:0=http://127.0.0.1:9",
        "--max-connections",
        "9",
        "--retention-days",
        "2",
    ]);
    let settings = resolve_settings(&flags.run).expect("settings");
    let options = engine_options(&flags.run, &settings).expect("options");
    assert_eq!(options.proxy_limits.max_connections, 9);
    assert_eq!(options.retention, Duration::from_secs(2 * 24 * 3600));
    assert_eq!(options.proxy_limits.max_buf_size, 32 * 1024);
}

/// Demo traffic beside a real route, against a slow-first-token threshold
/// of 1 ms that every call crosses: the real call is stored and alarmed,
/// the demo's calls are marked, named `demo/…`, and leave History and the
/// notifications untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_traffic_leaves_history_and_notifications_untouched() {
    let sim = SimServer::start("127.0.0.1:0", SimConfig::default())
        .await
        .unwrap();
    let route = RouteSpec::new("real", "127.0.0.1:0", &sim.base_url()).unwrap();
    let mut options = EngineOptions::new(vec![route]);
    let db = temp_config("demo-history").with_file_name("speedtap.db");
    let _ = std::fs::remove_file(&db);
    options.store = Some(Store::open(&db).unwrap());
    options.slow_ttft = Duration::from_millis(1);
    let alarmed = Arc::new(Mutex::new(Vec::<String>::new()));
    let seen = alarmed.clone();
    options
        .slow_first_token_hooks
        .push(Arc::new(move |slow: &SlowFirstToken| {
            seen.lock().unwrap().push(slow.call.route.clone());
        }));
    let engine = Engine::start(options).await.unwrap();
    let h = &engine.handle;
    let mut rx = h.subscribe().await;
    h.start_demo().await.unwrap();
    let real = send(
        engine.routes[0].listen,
        "POST",
        "/v1/chat/completions",
        r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
    )
    .await;
    assert_eq!(real.status, 200);
    // The real call and at least the demo's first.
    let calls = settled_calls(&engine, 2).await;
    let demo: Vec<_> = calls
        .iter()
        .filter(|c| c.identity.route == "demo" && c.status.is_settled())
        .collect();
    assert!(!demo.is_empty(), "{calls:#?}");
    for call in &demo {
        assert!(call.identity.demo, "{call:?}");
        let model = call.identity.model.as_deref().unwrap_or("");
        assert!(model.starts_with("demo/"), "{model}");
    }
    let real_call = calls.iter().find(|c| c.identity.route == "real").unwrap();
    assert!(!real_call.identity.demo);
    // The routes as hosts offer them (the tray's copy entries): the demo's
    // marked, the real one not.
    let marked: Vec<(String, bool)> = h
        .route_infos()
        .into_iter()
        .map(|r| (r.name, r.demo))
        .collect();
    assert_eq!(
        marked,
        vec![("real".to_owned(), false), ("demo".to_owned(), true)]
    );
    // History holds the real call only.
    let history = h.history(HistoryFilter::default()).await.unwrap();
    let routes: Vec<&str> = history.iter().map(|c| c.identity.route.as_str()).collect();
    assert_eq!(routes, vec!["real"]);
    // Alarms: the real route's, none of the demo's.
    let mut slow_routes = Vec::new();
    while let Ok(event) = rx.try_recv() {
        match event {
            EngineEvent::SlowFirstToken(slow) => slow_routes.push(slow.call.route),
            EngineEvent::PromptTruncated(cut) => slow_routes.push(cut.call.route),
            EngineEvent::Speed { call, .. } if call.route == "demo" => {
                assert!(call.demo, "a demo snapshot not marked: {call:?}");
            }
            _ => {}
        }
    }
    assert_eq!(slow_routes, vec!["real".to_owned()]);
    assert_eq!(*alarmed.lock().unwrap(), vec!["real".to_owned()]);
    engine.shutdown(Duration::from_secs(1)).await;
    sim.shutdown().await;
    let _ = std::fs::remove_dir_all(db.parent().unwrap());
}

/// A route added while running (the watcher, the demo, the tray)
/// or saved from Settings whose upstream is one of speedtap's own
/// listeners would loop every request back into speedtap: refused, with
/// an error naming the route and the listener; nothing is bound or written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_added_or_saved_at_run_time_that_loop_back_are_refused() {
    let path = temp_config("runtime_loops");
    let route = RouteSpec::new("a", "127.0.0.1:0", "http://127.0.0.1:9").unwrap();
    let mut options = EngineOptions::new(vec![route]);
    options.config_path = Some(path.clone());
    options.api = Some("127.0.0.1:0".parse().unwrap());
    let engine = Engine::start(options).await.unwrap();
    let h = &engine.handle;
    let listen = engine.routes[0].listen;
    let api = engine.api.unwrap();
    for (target, what) in [(listen, "route \"a\"'s listener"), (api, "the control API")] {
        let spec = RouteSpec::new("looped", "127.0.0.1:0", &format!("http://{target}")).unwrap();
        let err = h.add_route(spec).await.unwrap_err().to_string();
        for fragment in ["route \"looped\"", what, "loop back into speedtap"] {
            assert!(err.contains(fragment), "{fragment:?}: {err}");
        }
    }
    assert_eq!(
        h.routes().await.routes.len(),
        1,
        "a looping route was bound"
    );

    let mut doc = h.get_settings().await.unwrap();
    doc.routes.push(RouteDoc {
        name: "self".into(),
        listen: "127.0.0.1:9419".into(),
        upstream: "http://localhost:9419".into(),
    });
    let err = h.save_settings(doc).await.unwrap_err().to_string();
    for fragment in ["routes[1] (self)", "loop back into speedtap"] {
        assert!(err.contains(fragment), "{fragment:?}: {err}");
    }
    assert!(!path.exists(), "the looping route was saved");
    engine.shutdown(Duration::from_secs(1)).await;
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}
