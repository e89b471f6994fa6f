//! `speedtap run`: resolve the settings, start the engine, show what it
//! measures, stop cleanly on SIGINT/SIGTERM.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use tokio::time::Instant;

use super::args::RunArgs;
use super::view::{json_line, TerminalView};
use crate::config::{self, CliOverrides, ConfigError, Settings};
use crate::engine::{Engine, EngineEvent, EngineOptions, EngineQueries, RunningEngine};
use crate::store::Store;

/// In-flight calls get this long to finish on SIGINT/SIGTERM (contract).
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// How the process ends, mapped to the contract's exit codes.
#[derive(Debug)]
pub enum RunError {
    /// Bad usage or config: exit code 2.
    Usage(String),
    /// A runtime failure such as a taken port: exit code 1.
    Runtime(String),
}

impl RunError {
    pub fn exit_code(&self) -> i32 {
        match self {
            RunError::Usage(_) => 2,
            RunError::Runtime(_) => 1,
        }
    }
}

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RunError::Usage(m) | RunError::Runtime(m) => f.write_str(m),
        }
    }
}

impl From<ConfigError> for RunError {
    fn from(e: ConfigError) -> Self {
        RunError::Usage(e.to_string())
    }
}

/// Reads the config file (the one named, else the platform default if it
/// exists) and merges the flags over it.
pub fn resolve_settings(args: &RunArgs) -> Result<Settings, RunError> {
    let file = match &args.config {
        Some(path) => Some(config::load_config(path)?),
        None => {
            let default = config::default_config_path();
            if default.exists() {
                Some(config::load_config(&default)?)
            } else {
                None
            }
        }
    };
    let mut routes = Vec::new();
    for spec in &args.routes {
        routes.push(
            config::parse_route_flag(spec).map_err(|e| RunError::Usage(format!("--route {e}")))?,
        );
    }
    let flags = CliOverrides {
        routes,
        api: args.api,
        db: args.db.clone(),
        no_db: args.no_db,
        slow_ttft_ms: args.slow_ttft_ms,
        json: args.json,
        allow_remote: args.allow_remote,
        idle_timeout: args.idle_timeout,
        retention_days: args.retention_days,
        max_db_mb: args.max_db_mb,
        otlp_endpoint: args.otlp_endpoint.clone(),
        proxy: config::ProxySettings {
            head_timeout: args.head_timeout,
            max_head_kib: args.max_head_kib,
            max_connections: args.max_connections,
        },
    };
    Ok(config::resolve(file, flags)?)
}

/// Fills in routes from auto-discovery when none were configured.
async fn discover_routes(settings: &mut Settings) -> Result<(), RunError> {
    if !settings.routes.is_empty() {
        return Ok(());
    }
    eprintln!("speedtap: no routes configured; looking for local model servers...");
    let found = crate::discover::discover().await;
    if found.is_empty() {
        return Err(RunError::Usage(
            "no local model server found on the usual ports (Ollama 11434, llama.cpp 8080, \
             LM Studio 1234, vLLM 8000, KoboldCpp 5001, Jan 1337); start one, or pass \
             --route NAME=LISTEN=UPSTREAM"
                .into(),
        ));
    }
    for d in found {
        eprintln!("speedtap: {}", d.summary());
        settings.routes.push(d.suggested_route);
    }
    Ok(())
}

/// Runs until SIGINT/SIGTERM. Returns the process exit code.
pub async fn run(args: RunArgs) -> Result<(), RunError> {
    let mut settings = resolve_settings(&args)?;
    discover_routes(&mut settings).await?;
    let options = engine_options(&args, &settings)?;
    // Listen for the stop signals before anything is announced: a script
    // or service manager may stop speedtap as soon as it prints its start
    // lines, and a signal without a handler kills the process undrained.
    let stop = stop_signal();
    let engine = Engine::start(options)
        .await
        .map_err(|e| RunError::Runtime(e.to_string()))?;
    // Subscribe before announcing too, so a call made as soon as the start
    // lines appear still gets every one of its lines.
    let json = settings.json || !std::io::stdout().is_terminal();
    let events = engine.handle.subscribe().await;
    let printer = tokio::spawn(print_events(events, json));
    announce(&engine);
    // Build the tokenizer tables now, off the proxy's threads, so the first
    // call doesn't pay for them.
    std::thread::spawn(crate::tokens::O200kEstimator::warm_up);

    let otlp = match &settings.otlp_endpoint {
        Some(endpoint) => {
            let exporter = crate::engine::otlp::start_otlp_exporter(
                endpoint,
                OTLP_INTERVAL,
                engine.handle.metrics(),
            )
            .map_err(|e| RunError::Usage(format!("--otlp-endpoint: {e}")))?;
            eprintln!("speedtap: pushing metrics to {}", exporter.url());
            Some(exporter)
        }
        None => None,
    };

    stop.await;
    eprintln!("speedtap: stopping (in-flight calls get up to 5 s to finish)...");
    engine.shutdown(SHUTDOWN_GRACE).await;
    if let Some(exporter) = otlp {
        // The last calls get exported before the process ends.
        let _ = tokio::task::spawn_blocking(move || exporter.shutdown()).await;
    }
    let _ = tokio::time::timeout(Duration::from_secs(1), printer).await;
    Ok(())
}

/// How often metrics are pushed with `--otlp-endpoint`.
pub const OTLP_INTERVAL: Duration = Duration::from_secs(10);

/// The engine options `speedtap run` and the tray app derive from their
/// flags and settings: routes, API, thresholds, the config file to save
/// settings to, and the store.
///
/// A store that can't be opened (a read-only or full disk, a path under a
/// file) doesn't stop the monitor: the proxy matters more than history, so
/// speedtap warns once, names the file and runs with calls metered in
/// memory only, as it does with `--no-db`. The same choice is made when
/// the store fails later (see `StoreWriter`).
pub fn engine_options(args: &RunArgs, settings: &Settings) -> Result<EngineOptions, RunError> {
    let mut options = EngineOptions::from_settings(settings);
    options.config_path = Some(
        args.config
            .clone()
            .unwrap_or_else(config::default_config_path),
    );
    if let Some(path) = settings.db.path() {
        match Store::open(&path) {
            Ok(store) => options.store = Some(store),
            Err(e) => {
                let warning = store_unavailable_warning(&path, &e);
                tracing::warn!("{warning}");
                eprintln!("speedtap: warning: {warning}");
            }
        }
    }
    Ok(options)
}

/// The one warning shown when the store can't be opened at start.
fn store_unavailable_warning(path: &std::path::Path, error: &dyn std::fmt::Display) -> String {
    format!(
        "history is off: cannot open the store {}: {error}; calls are still proxied and \
         metered in memory (fix the path or permissions, or pass --no-db to silence this)",
        path.display()
    )
}

fn announce(engine: &RunningEngine) {
    for route in &engine.routes {
        eprintln!(
            "speedtap: route {}: {} -> {}",
            route.name,
            route.proxy_url(),
            route.upstream
        );
    }
    if let Some(api) = engine.api {
        eprintln!("speedtap: dashboard and control API on http://{api}/");
    }
}

/// Writes every event: JSON lines, or the live terminal view on a TTY.
/// Slow-first-token warnings go to stderr either way.
async fn print_events(mut events: tokio::sync::mpsc::Receiver<EngineEvent>, json: bool) {
    let mut stdout = std::io::stdout();
    if json {
        // Lines for every event already queued go out in one write: with
        // many streams, a write (and a flush) per line was a measurable
        // share of the proxy's CPU (docs/benchmarks.md, profile).
        let mut batch = String::new();
        while let Some(event) = events.recv().await {
            let mut next = Some(event);
            while let Some(event) = next.take() {
                match &event {
                    EngineEvent::Speed { call, speed } => {
                        batch.push_str(&json_line(call, speed));
                        batch.push('\n');
                    }
                    EngineEvent::SlowFirstToken(slow) => {
                        eprintln!("{}", TerminalView::warning_line(slow));
                    }
                    _ => {}
                }
                if batch.len() < 64 * 1024 {
                    next = events.try_recv().ok();
                }
            }
            if !batch.is_empty() {
                let _ = stdout.write_all(batch.as_bytes());
                let _ = stdout.flush();
                batch.clear();
            }
        }
        return;
    }
    let width = terminal_width();
    let mut view = TerminalView::new(width);
    let mut redraw = tokio::time::interval(Duration::from_millis(250));
    loop {
        tokio::select! {
            event = events.recv() => {
                let Some(event) = event else { break };
                // The view prints slow-first-token warnings above its live
                // block itself.
                view.apply(&event);
            }
            _ = redraw.tick() => {
                if let Some(text) = view.render(Instant::now()) {
                    let _ = stdout.write_all(text.as_bytes());
                    let _ = stdout.flush();
                }
            }
        }
    }
    // Calls that settled in the last moments still get their line.
    if let Some(text) = view.flush() {
        let _ = stdout.write_all(text.as_bytes());
        let _ = stdout.flush();
    }
}

/// The terminal's width: asked of the terminal, else `COLUMNS`, else 100.
fn terminal_width() -> usize {
    terminal_size::terminal_size()
        .map(|(w, _)| w.0 as usize)
        .or_else(|| std::env::var("COLUMNS").ok().and_then(|c| c.parse().ok()))
        .unwrap_or(100)
}

/// Resolves on the first SIGINT or SIGTERM (ctrl-c elsewhere).
///
/// On Unix the handlers are installed when this is *called*, not when the
/// future is first polled (which is how `tokio::signal::ctrl_c` behaves), so
/// calling it before the start lines are printed closes the window in which
/// a stop signal would still get the default action.
pub fn stop_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let interrupt = signal(SignalKind::interrupt());
        let terminate = signal(SignalKind::terminate());
        async move {
            // A listener that failed to install never fires; the other one
            // still does.
            let wait = |s: std::io::Result<tokio::signal::unix::Signal>| async move {
                match s {
                    Ok(mut s) => {
                        s.recv().await;
                    }
                    Err(_) => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                _ = wait(interrupt) => {}
                _ = wait(terminate) => {}
            }
        }
    }
    #[cfg(not(unix))]
    {
        async {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
