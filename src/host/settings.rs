//! From flags and the config file to a running engine's options, the same
//! way for `speedtap run` and the tray app: settings resolution, discovery
//! when no routes are configured, the store (and its fallback to memory),
//! the OTLP exporter.

use std::time::Duration;

use super::args::RunArgs;
use super::EngineOptions;
use crate::config::{self, CliOverrides, ConfigError, Settings};
use crate::discover::Discovered;
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
    resolve_with(args, load_file(args)?)
}

/// Like [`resolve_settings`], with the tray app's default for `capture`:
/// when neither a flag nor the config file says, the capture is on exactly
/// when its helper already has the permission (off until the permission
/// exists, then on). `SPEEDTAP_CAPTURE=0` in the environment keeps it off.
pub fn resolve_settings_capture_by_permission(args: &RunArgs) -> Result<Settings, RunError> {
    let file = load_file(args)?;
    let said = args.capture || file.as_ref().is_some_and(|f| f.capture.is_some());
    let mut settings = resolve_with(args, file)?;
    if !said {
        settings.capture = capture_default(&settings.capture_interface);
    }
    Ok(settings)
}

/// The capture's default where nothing says: on when the helper may open
/// the packet socket, unless `SPEEDTAP_CAPTURE=0`.
fn capture_default(interface: &str) -> bool {
    if std::env::var("SPEEDTAP_CAPTURE").is_ok_and(|v| v == "0") {
        return false;
    }
    super::capture::startup_capture_permitted(interface)
}

fn load_file(args: &RunArgs) -> Result<Option<config::ConfigFile>, RunError> {
    Ok(match &args.config {
        Some(path) => Some(config::load_config(path)?),
        None => {
            let default = config::default_config_path();
            if default.exists() {
                Some(config::load_config(&default)?)
            } else {
                None
            }
        }
    })
}

fn resolve_with(args: &RunArgs, file: Option<config::ConfigFile>) -> Result<Settings, RunError> {
    let mut routes = Vec::new();
    let mut capture_routes = Vec::new();
    for spec in &args.routes {
        if let Some(route) = config::parse_capture_route_flag(spec) {
            capture_routes.push(route.map_err(|e| RunError::Usage(format!("--route {e}")))?);
            continue;
        }
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
        capture: args.capture,
        capture_interface: args.capture_interface.clone(),
        capture_routes,
    };
    Ok(config::resolve(file, flags)?)
}

/// Fills in routes from auto-discovery when none were configured, as
/// `speedtap run` does: finding none is an error. With capture on (and its
/// permission there) each server found gets a capture-only route, so its
/// clients need no change; otherwise a proxy route on the next port.
pub async fn discover_routes(settings: &mut Settings) -> Result<(), RunError> {
    if !settings.routes.is_empty() || !settings.capture_routes.is_empty() {
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
    let capture = capture_can_run(settings).await;
    for line in add_discovered(settings, found, capture) {
        eprintln!("speedtap: {line}");
    }
    Ok(())
}

/// Fills in routes from auto-discovery when none were configured, as the
/// tray app does: finding none is not an error (its window lists servers as
/// they appear and can start demo traffic). Messages start with `who`.
pub async fn discover_routes_if_any(settings: &mut Settings, who: &str) {
    if !settings.routes.is_empty() || !settings.capture_routes.is_empty() {
        return;
    }
    eprintln!("{who}: no routes configured; looking for local model servers...");
    let found = crate::discover::discover().await;
    let capture = !found.is_empty() && capture_can_run(settings).await;
    for line in add_discovered(settings, found, capture) {
        eprintln!("{who}: {line}");
    }
    if settings.routes.is_empty() && settings.capture_routes.is_empty() {
        eprintln!(
            "{who}: none found; open the window to see what to run, \
             or start demo traffic there"
        );
    }
}

/// Routes for the servers `found`: capture-only ones when `capture` (the
/// capture is on and may run), else proxy routes on the next port. Returns
/// one line per server for the start-up message.
pub fn add_discovered(
    settings: &mut Settings,
    found: Vec<Discovered>,
    capture: bool,
) -> Vec<String> {
    let mut lines = Vec::new();
    for d in found {
        if capture {
            lines.push(d.capture_summary());
            settings.capture_routes.push(d.capture_route());
        } else {
            lines.push(d.summary());
            settings.routes.push(d.suggested_route);
        }
    }
    lines
}

/// Whether discovered servers can be measured by capture alone: capture is
/// on and its helper may open the packet socket. When it may not, the
/// servers get proxy routes instead (a capture-only route would measure
/// nothing), and the engine's start says which command grants the
/// permission.
async fn capture_can_run(settings: &Settings) -> bool {
    if !settings.capture {
        return false;
    }
    let interface = settings.capture_interface.clone();
    tokio::task::spawn_blocking(move || super::capture::startup_capture_permitted(&interface))
        .await
        .unwrap_or(false)
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
    options.telemetry = !args.no_telemetry;
    options.config_path = Some(
        args.config
            .clone()
            .unwrap_or_else(config::default_config_path),
    );
    if let Some(endpoint) = &settings.otlp_endpoint {
        // Checked here so a bad endpoint is a usage error before anything
        // starts, whether it came from the file or the flag; the exporter
        // itself starts with the engine, for every front end.
        crate::engine::metrics::otlp::metrics_url(endpoint)
            .map_err(|e| RunError::Usage(format!("otlp_endpoint: {e}")))?;
        options.otlp_endpoint = Some(endpoint.clone());
        options.otlp_interval = OTLP_INTERVAL;
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discover::ServerKind;
    use crate::model::RouteSpec;

    fn ollama() -> Discovered {
        Discovered {
            kind: ServerKind::Ollama,
            port: 11434,
            upstream: "http://127.0.0.1:11434".into(),
            suggested_route: RouteSpec::new("ollama", "127.0.0.1:11435", "http://127.0.0.1:11434")
                .unwrap(),
            detail: None,
        }
    }

    #[test]
    fn discovery_with_capture_makes_capture_only_routes() {
        let mut settings = Settings::default();
        let lines = add_discovered(&mut settings, vec![ollama()], true);
        assert!(settings.routes.is_empty(), "no proxy port is opened");
        assert_eq!(settings.capture_routes.len(), 1);
        let route = &settings.capture_routes[0];
        assert_eq!(route.name, "ollama");
        assert_eq!(route.upstream.port, 11434);
        assert_eq!(route.upstream.host, "127.0.0.1");
        assert!(
            lines[0].contains("captured (no client changes)"),
            "{lines:?}"
        );
    }

    #[test]
    fn discovery_without_capture_puts_a_proxy_on_the_next_port() {
        let mut settings = Settings::default();
        let lines = add_discovered(&mut settings, vec![ollama()], false);
        assert!(settings.capture_routes.is_empty());
        assert_eq!(settings.routes.len(), 1);
        assert_eq!(settings.routes[0].listen.port(), 11435);
        assert!(lines[0].contains("127.0.0.1:11435"), "{lines:?}");
    }
}
