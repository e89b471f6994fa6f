//! From flags and the config file to a running engine's options, the same
//! way for `speedtap run` and the tray app: settings resolution, discovery
//! when no routes are configured, the store (and its fallback to memory),
//! the OTLP exporter.

use std::time::Duration;

use super::args::RunArgs;
use super::EngineOptions;
use super::WatchOptions;
use crate::config::{self, CliOverrides, ConfigError, Settings};
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
    let settings = resolve_with(args, load_file(args)?)?;
    check_capture_routes(&settings)?;
    Ok(settings)
}

/// A capture-only route (`--route NAME=UPSTREAM`) has no listener: only
/// the capture measures it. With the capture off it would silently
/// measure nothing, so that is a usage error naming the route and the two
/// ways out. Checked once the capture's own default is applied.
fn check_capture_routes(settings: &Settings) -> Result<(), RunError> {
    match settings.capture_routes.first() {
        Some(route) if !settings.capture => Err(RunError::Usage(format!(
            "--route {}={}: a route without a listen address is measured by capture \
             alone, and the capture is off; add --capture (or capture = true in the \
             config file), or give the route a listen address: \
             --route {}=LISTEN=UPSTREAM",
            route.name,
            route.upstream.base_url(),
            route.name,
        ))),
        _ => Ok(()),
    }
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
    check_capture_routes(&settings)?;
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
    let flags = args.settings.overrides(CliOverrides {
        routes,
        api: args.api,
        db: args.db.clone(),
        no_db: args.no_db,
        capture_routes,
        ..CliOverrides::default()
    });
    Ok(config::resolve(file, flags)?)
}

/// Following the machine, as both front ends do it: on when no route is
/// configured (then speedtap finds model servers as they start, and with
/// none up it waits for one), off when routes are (those are measured as
/// configured, and nothing else). The servers' names are saved beside the
/// store; `announce` says each line (a server found, down, back).
pub fn watch_options(
    settings: &Settings,
    announce: super::watch::Announce,
) -> Option<WatchOptions> {
    let nothing_configured = settings.routes.is_empty() && settings.capture_routes.is_empty();
    nothing_configured.then(|| WatchOptions {
        saved: settings
            .db
            .path()
            .map(|db| db.with_file_name("servers.json")),
        announce: Some(announce),
        watch_ports: settings.watch_ports.clone(),
        ..WatchOptions::default()
    })
}

/// How often metrics are pushed with `--otlp-endpoint`, unless
/// [`OTLP_INTERVAL_ENV`] says otherwise.
pub const OTLP_INTERVAL: Duration = Duration::from_secs(10);

/// The OpenTelemetry SDKs' own variable for the push interval, in
/// milliseconds (the OTel specification's `OTEL_METRIC_EXPORT_INTERVAL`).
pub const OTLP_INTERVAL_ENV: &str = "OTEL_METRIC_EXPORT_INTERVAL";

/// The push interval: [`OTLP_INTERVAL_ENV`]'s milliseconds when it holds a
/// number above zero, else [`OTLP_INTERVAL`] (as the OTel SDKs read it: a
/// value that isn't one is ignored, not an error).
pub fn otlp_interval(env_value: Option<&str>) -> Duration {
    env_value
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|ms| *ms > 0)
        .map_or(OTLP_INTERVAL, Duration::from_millis)
}

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
        options.otlp_interval = otlp_interval(std::env::var(OTLP_INTERVAL_ENV).ok().as_deref());
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
    use crate::model::RouteSpec;

    #[test]
    fn the_otlp_interval_is_ten_seconds_unless_the_otel_variable_names_milliseconds() {
        assert_eq!(otlp_interval(None), Duration::from_secs(10));
        assert_eq!(otlp_interval(Some("250")), Duration::from_millis(250));
        for ignored in ["0", "", "fast", "-5", "1.5"] {
            assert_eq!(otlp_interval(Some(ignored)), OTLP_INTERVAL, "{ignored:?}");
        }
    }

    #[test]
    fn the_machine_is_followed_only_when_no_route_is_configured() {
        let say: super::super::watch::Announce = std::sync::Arc::new(|_: &str| {});
        let mut settings = Settings {
            db: crate::config::DbSetting::File("/data/speedtap.sqlite3".into()),
            ..Settings::default()
        };
        let watch = watch_options(&settings, say.clone()).expect("nothing configured: watched");
        assert_eq!(
            watch.saved.as_deref(),
            Some(std::path::Path::new("/data/servers.json"))
        );
        settings
            .routes
            .push(RouteSpec::new("o", "127.0.0.1:0", "http://127.0.0.1:11434").unwrap());
        assert!(watch_options(&settings, say).is_none());
    }
}
