//! What to run: the engine's options ([`EngineOptions`], built from the
//! resolved settings by [`EngineOptions::from_settings`]), what to capture,
//! how the capture started, and why the engine could not start.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::config::CaptureOnlyRoute;
use crate::config::{self, Settings};
use crate::engine::notifier::SlowFirstTokenHook;
use crate::engine::proxy::limits::ProxyLimits;
use crate::meter::calibration::CalibrationTable;
use crate::model::RouteSpec;
use crate::store::Store;
use crate::tokens::{default_estimator, TokenEstimator};

use super::*;

/// Why the engine could not start.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// A listener could not be bound (port taken, no permission...).
    #[error("{what}: cannot listen on {addr}: {source}")]
    Bind {
        what: String,
        addr: SocketAddr,
        source: std::io::Error,
    },
    /// The actor threads could not be started.
    #[error("cannot start the metering threads: {0}")]
    Actors(String),
    /// The OTLP exporter could not be started.
    #[error("--otlp-endpoint: {0}")]
    Otlp(String),
    /// A route added at run time whose upstream is one of speedtap's own
    /// listeners: every request would loop back into speedtap.
    #[error(
        "route {route:?}: upstream {upstream} is speedtap's own address ({what}, {addr}): \
         every request would loop back into speedtap; point it at the model server"
    )]
    Loop {
        route: String,
        upstream: String,
        what: String,
        addr: SocketAddr,
    },
}

/// What to run.
pub struct EngineOptions {
    pub routes: Vec<RouteSpec>,
    /// The control API's address; `None` runs without one.
    pub api: Option<SocketAddr>,
    pub slow_ttft: Duration,
    pub estimator: Arc<dyn TokenEstimator>,
    /// Calibration to start from (a later issue loads it from the store).
    pub calibration: CalibrationTable,
    /// Threads that run call actors (tokenizing happens there).
    pub metering_threads: usize,
    /// Reactions to slow first tokens (desktop notifications).
    pub slow_first_token_hooks: Vec<SlowFirstTokenHook>,
    /// Desktop notifications on (the settings' `notifications`).
    pub notifications: bool,
    /// A follow-up notification when a slow call settles.
    pub notify_settled: bool,
    /// Where settings are saved; `None` means the platform default.
    pub config_path: Option<PathBuf>,
    /// The embedded store; `None` keeps everything in memory. Its saved
    /// calibration replaces `calibration` so estimates are calibrated from
    /// the first call after a restart.
    pub store: Option<Store>,
    /// How long settled calls are kept, and the store's size cap.
    pub retention: Duration,
    pub max_db_bytes: u64,
    /// The proxy's connection limits and optional idle timeout.
    pub proxy_limits: ProxyLimits,
    /// Push metrics to this OTLP/HTTP collector (`--otlp-endpoint`), every
    /// `otlp_interval`; `None` exports nothing.
    pub otlp_endpoint: Option<String>,
    /// How often metrics are pushed when `otlp_endpoint` is set.
    pub otlp_interval: Duration,
    /// Passive capture of the routes' upstream ports; `None` (the default)
    /// captures nothing.
    pub capture: Option<CaptureOptions>,
    /// Ask each route's server what it publishes (`/api/ps`, `/slots`...)
    /// to explain waits (on from settings, i.e. for both front ends, unless
    /// `--no-telemetry`; off in [`EngineOptions::new`]).
    pub telemetry: bool,
    /// Follow the machine: measure model servers as they start, stop and
    /// come back (`None`, the default for engines built in code, watches
    /// nothing).
    pub watch: Option<super::WatchOptions>,
}

/// What to capture (`--capture`).
#[derive(Clone, Debug, Default)]
pub struct CaptureOptions {
    /// `lo`, `any`, or an interface name.
    pub interface: String,
    /// Routes measured by capture alone (no listener).
    pub capture_only: Vec<CaptureOnlyRoute>,
}

/// How the capture started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CaptureStatus {
    /// Not asked for.
    Off,
    /// Capturing these upstream ports.
    On { ports: Vec<u16> },
    /// Asked for but not running: why, in one line (naming the command
    /// that grants the permission, when that is what is missing). The proxy
    /// runs regardless.
    Unavailable(String),
}

/// Default retention of settled calls: the settings' default
/// (`retention_days`), so engines built in code keep calls as long.
pub const DEFAULT_RETENTION: Duration =
    Duration::from_secs(config::DEFAULT_RETENTION_DAYS * 24 * 3600);

/// Default cap on the store's size: the settings' default (`max_db_mb`).
pub const DEFAULT_MAX_DB_BYTES: u64 = config::DEFAULT_MAX_DB_MB * 1024 * 1024;

impl EngineOptions {
    pub fn new(routes: Vec<RouteSpec>) -> Self {
        EngineOptions {
            routes,
            api: None,
            slow_ttft: Duration::from_millis(config::DEFAULT_SLOW_TTFT_MS),
            estimator: default_estimator(),
            calibration: CalibrationTable::default(),
            metering_threads: 1,
            slow_first_token_hooks: Vec::new(),
            notifications: true,
            notify_settled: false,
            config_path: None,
            store: None,
            retention: DEFAULT_RETENTION,
            max_db_bytes: DEFAULT_MAX_DB_BYTES,
            proxy_limits: ProxyLimits::default(),
            otlp_endpoint: None,
            otlp_interval: settings::OTLP_INTERVAL,
            capture: None,
            // Off for engines built in code (tests, benches): they opt in.
            // The front ends' path, `from_settings`, turns it on.
            telemetry: false,
            watch: None,
        }
    }

    /// The options `speedtap run` and the tray app derive from resolved
    /// settings (routes, API address, threshold, notification switches).
    pub fn from_settings(settings: &Settings) -> Self {
        let mut options = EngineOptions::new(settings.routes.clone());
        options.telemetry = true;
        options.api = Some(settings.api);
        options.slow_ttft = settings.slow_ttft_ms.duration();
        options.notifications = settings.notifications;
        options.notify_settled = settings.notify_settled;
        options.proxy_limits.idle_timeout = settings.idle_timeout;
        options.retention = Duration::from_secs(settings.retention_days.max(1) * 24 * 3600);
        options.max_db_bytes = settings.max_db_mb.max(1) * 1024 * 1024;
        let proxy = &settings.proxy;
        if let Some(t) = proxy.head_timeout {
            options.proxy_limits.header_read_timeout = t;
        }
        if let Some(kib) = proxy.max_head_kib {
            options.proxy_limits.max_buf_size =
                usize::try_from(kib.saturating_mul(1024)).unwrap_or(usize::MAX);
        }
        if let Some(n) = proxy.max_connections {
            options.proxy_limits.max_connections = usize::try_from(n).unwrap_or(usize::MAX);
        }
        if settings.capture {
            options.capture = Some(CaptureOptions {
                interface: settings.capture_interface.clone(),
                capture_only: settings.capture_routes.clone(),
            });
        }
        options
    }
}
