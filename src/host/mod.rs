//! Building and hosting the engine, the same way for every front end: the
//! headless `speedtap run`, the tray app and the integration tests.
//!
//! [`Engine::start`] binds every listener first (so a taken port is an
//! error before anything runs), starts the actors on their own threads (an
//! actix `System` for the supervisor and notifier, plus metering arbiters
//! for the call actors), and serves the routes and the control API on the
//! caller's tokio runtime. [`RunningEngine::shutdown`] stops accepting,
//! lets in-flight calls drain for a grace period, and stops the actors,
//! which settles whatever is still open.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc as std_mpsc, Arc, RwLock};
use std::time::Duration;

use actix::{Actor, Addr, Arbiter, ArbiterHandle, System};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

use crate::capture::packet::LinkType;
use crate::capture::source::{self as capture_source, CaptureConfig, CaptureError, CaptureSource};
use crate::config::CaptureOnlyRoute;
use crate::config::{self, ConfigFile, Settings};
use crate::engine::capture::{CaptureRoute, CaptureTask};
use crate::engine::messages::{
    AttachStore, DetachStore, GetCalibration, GetCall, GetCalls, GetHistory, GetStats, Persisted,
    SetNotificationsPaused, Subscribe,
};
use crate::engine::metrics::otlp::{start_otlp_exporter, OtlpExporter};
use crate::engine::metrics::Metrics;
use crate::engine::notifier::{Notifier, SlowFirstTokenHook};
use crate::engine::proxy::limits::ProxyLimits;
use crate::engine::proxy::{listen, EngineLink, RouteProxy};
use crate::engine::supervisor::{Supervisor, SUBSCRIBER_CAPACITY};
use crate::meter::calibration::CalibrationTable;
use crate::model::{
    engine::NO_STORE, BoundRoute, Call, CallsQuery, CaptureDoc, CaptureRouteDoc, CaptureState,
    DemoDoc, DiscoveredDoc, EngineEvent, EngineQueries, ExportFormat, HistoryDoc, HistoryFilter,
    ModelSummary, QueryError, RouteDoc, RouteInfo, RouteSpec, RoutesDoc, SaveOutcome, ServerDoc,
    SettingsDoc, Stats,
};
use crate::simulate::{SimConfig, SimServer};
use crate::store::{Store, StoreWriter};
use crate::tokens::{default_estimator, TokenEstimator};

pub mod args;
pub mod demo;
pub mod settings;

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
}

/// After the drain, how long shutdown waits for the calls it ended to be
/// settled by their actors.
pub const SETTLE_WAIT: Duration = Duration::from_secs(1);

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

/// Default retention of settled calls.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(90 * 24 * 3600);

/// Default cap on the store's size.
pub const DEFAULT_MAX_DB_BYTES: u64 = 1024 * 1024 * 1024;

/// How often the store is pruned while running (and once at start).
pub const PRUNE_EVERY: Duration = Duration::from_secs(3600);

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
        }
    }

    /// The options `speedtap run` and the tray app derive from resolved
    /// settings (routes, API address, threshold, notification switches).
    pub fn from_settings(settings: &Settings) -> Self {
        let mut options = EngineOptions::new(settings.routes.clone());
        options.telemetry = true;
        options.api = Some(settings.api);
        options.slow_ttft = Duration::from_millis(settings.slow_ttft_ms);
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

/// The settings that can change while running.
#[derive(Clone, Debug)]
struct LiveSettings {
    /// The routes as configured (what a restart would bind).
    routes: Vec<RouteSpec>,
    notifications: bool,
    notify_settled: bool,
    /// Capture as configured (what a restart would do).
    capture: bool,
}

/// The demo: the simulator, its route, and whether traffic is running.
struct Demo {
    _sim: SimServer,
    route: BoundRoute,
    traffic: Option<tokio::task::JoinHandle<()>>,
}

/// State shared by the engine's handle and host.
struct Shared {
    link: Arc<EngineLink>,
    metrics: Arc<Metrics>,
    routes: RwLock<Vec<BoundRoute>>,
    settings: RwLock<LiveSettings>,
    config_path: PathBuf,
    stop: watch::Receiver<bool>,
    servers: tokio::sync::Mutex<JoinSet<()>>,
    demo: tokio::sync::Mutex<Option<Demo>>,
    /// A second connection to the store for queries (WAL lets it read
    /// while the writer writes).
    reader: Option<Arc<std::sync::Mutex<Store>>>,
    /// How the capture started (set once, after the start).
    capture: RwLock<CaptureDoc>,
}

/// Access to the running engine, for front ends. Cheap to clone.
#[derive(Clone)]
pub struct EngineHandle {
    supervisor: Addr<Supervisor>,
    notifier: Addr<Notifier>,
    metrics: Arc<Metrics>,
    shared: Arc<Shared>,
}

impl EngineHandle {
    /// Pause or resume the slow-first-token hooks (desktop notifications).
    pub fn set_notifications_paused(&self, paused: bool) {
        self.notifier.do_send(SetNotificationsPaused(paused));
    }

    /// The metrics registry (for exporters).
    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    /// Runs a read-only query on the store's reader connection, off the
    /// async threads.
    async fn query<T: Send + 'static>(
        &self,
        job: impl FnOnce(&Store) -> Result<T, crate::store::StoreError> + Send + 'static,
    ) -> Result<T, QueryError> {
        let Some(reader) = self.shared.reader.clone() else {
            return Err(QueryError::Unavailable(NO_STORE.to_owned()));
        };
        tokio::task::spawn_blocking(move || {
            let store = reader.lock().unwrap_or_else(|p| p.into_inner());
            job(&store).map_err(|e| QueryError::Io(e.to_string()))
        })
        .await
        .map_err(|e| QueryError::Io(format!("store query failed: {e}")))?
    }

    /// A copy of the current calibration table.
    pub async fn calibration(&self) -> CalibrationTable {
        self.supervisor
            .send(GetCalibration)
            .await
            .unwrap_or_default()
    }

    /// The routes bound now (the demo route included once started).
    pub fn bound_routes(&self) -> Vec<BoundRoute> {
        read(&self.shared.routes).clone()
    }

    /// The settings as they are now (for hosts deciding on notifications).
    pub fn settings_snapshot(&self) -> SettingsDoc {
        let live = read(&self.shared.settings).clone();
        SettingsDoc {
            routes: live.routes.iter().map(RouteDoc::from).collect(),
            slow_ttft_ms: self.shared.link.slow_ttft_ms.load(Ordering::Relaxed),
            notifications: live.notifications,
            notify_settled: live.notify_settled,
            capture: Some(live.capture),
            config_path: Some(self.shared.config_path.display().to_string()),
        }
    }

    /// Binds one more route while running and serves it until shutdown.
    pub async fn add_route(&self, route: RouteSpec) -> Result<BoundRoute, EngineError> {
        let listener = bind_route(&route).await?;
        let bound = spawn_route(&self.shared, route, listener).await;
        Ok(bound)
    }
}

fn unix_ms_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|p| p.into_inner())
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|p| p.into_inner())
}

impl EngineQueries for EngineHandle {
    async fn calls(&self, query: CallsQuery) -> Vec<Call> {
        self.supervisor
            .send(GetCalls(query))
            .await
            .unwrap_or_default()
    }

    async fn call(&self, id: String) -> Option<Call> {
        self.supervisor.send(GetCall(id)).await.ok().flatten()
    }

    async fn stats(&self) -> Stats {
        self.supervisor.send(GetStats).await.unwrap_or_default()
    }

    async fn subscribe(&self) -> mpsc::Receiver<EngineEvent> {
        match self
            .supervisor
            .send(Subscribe {
                capacity: SUBSCRIBER_CAPACITY,
            })
            .await
        {
            Ok(rx) => rx,
            // The engine is stopping: an already-closed subscription.
            Err(_) => mpsc::channel(1).1,
        }
    }

    fn metrics_text(&self) -> String {
        self.metrics.render()
    }

    async fn routes(&self) -> RoutesDoc {
        RoutesDoc {
            routes: self.bound_routes().iter().map(RouteInfo::from).collect(),
        }
    }

    async fn stats_history(&self) -> HistoryDoc {
        self.supervisor.send(GetHistory).await.unwrap_or_default()
    }

    async fn discover(&self) -> DiscoveredDoc {
        DiscoveredDoc {
            servers: crate::discover::discover()
                .await
                .iter()
                .map(ServerDoc::from)
                .collect(),
        }
    }

    /// The capture's state; when it is off, whether it could run if turned
    /// on (the helper is run once to check its permission).
    async fn capture(&self) -> CaptureDoc {
        let mut doc = read(&self.shared.capture).clone();
        if doc.state == CaptureState::Off {
            let interface = doc
                .interface
                .clone()
                .unwrap_or_else(|| config::DEFAULT_CAPTURE_INTERFACE.to_owned());
            let checked = tokio::task::spawn_blocking(move || capture_permitted(&interface)).await;
            match checked {
                Ok(Ok(())) => doc.permitted = Some(true),
                Ok(Err(e)) => {
                    doc.permitted = Some(false);
                    doc.grant_command = e.grant_command().map(str::to_owned);
                    doc.reason = Some(e.to_string());
                }
                Err(_) => {}
            }
        }
        doc
    }

    async fn get_settings(&self) -> Result<SettingsDoc, QueryError> {
        Ok(self.settings_snapshot())
    }

    /// Validates, writes the config file (keeping its other keys), applies
    /// the threshold and notification switches at once; route changes are
    /// saved for the next start (rebinding live would cut calls in flight).
    async fn save_settings(&self, doc: SettingsDoc) -> Result<SaveOutcome, QueryError> {
        let mut routes = Vec::new();
        for (i, r) in doc.routes.iter().enumerate() {
            let spec = RouteSpec::new(&r.name, &r.listen, &r.upstream)
                .map_err(|e| QueryError::BadInput(format!("routes[{i}] ({}): {e}", r.name)))?;
            if routes.iter().any(|o: &RouteSpec| o.name == spec.name) {
                return Err(QueryError::BadInput(format!(
                    "routes[{i}]: the name {:?} is used twice",
                    spec.name
                )));
            }
            routes.push(spec);
        }
        if doc.slow_ttft_ms == 0 {
            return Err(QueryError::BadInput(
                "slow_ttft_ms: must be at least 1".into(),
            ));
        }
        let path = self.shared.config_path.clone();
        let mut file = if path.exists() {
            config::load_config(&path).map_err(|e| match e {
                // The file is there but can't be read: the engine's side.
                config::ConfigError::Io { .. } => QueryError::Io(e.to_string()),
                // It doesn't parse: saving over it would lose what it says.
                _ => QueryError::Conflict(e.to_string()),
            })?
        } else {
            ConfigFile::default()
        };
        file.routes = routes.clone();
        file.slow_ttft_ms = Some(doc.slow_ttft_ms);
        file.notifications = Some(doc.notifications);
        file.notify_settled = Some(doc.notify_settled);
        if let Some(capture) = doc.capture {
            file.capture = Some(capture);
        }
        config::save_config(&path, &file)
            .map_err(|e| QueryError::Io(format!("cannot write {}: {e}", path.display())))?;

        self.shared
            .link
            .slow_ttft_ms
            .store(doc.slow_ttft_ms, Ordering::Relaxed);
        let restart_required = {
            let mut live = write(&self.shared.settings);
            let mut changed = live.routes != routes;
            if let Some(capture) = doc.capture {
                // The capture starts with the engine: a change waits for
                // the next start, like the routes.
                changed |= live.capture != capture;
                live.capture = capture;
            }
            live.routes = routes;
            live.notifications = doc.notifications;
            live.notify_settled = doc.notify_settled;
            changed
        };
        Ok(SaveOutcome {
            saved: true,
            restart_required,
            config_path: path.display().to_string(),
        })
    }

    async fn history(&self, filter: HistoryFilter) -> Result<Vec<Call>, QueryError> {
        self.query(move |s| s.history(&filter)).await
    }

    async fn models(&self, filter: HistoryFilter) -> Result<Vec<ModelSummary>, QueryError> {
        self.query(move |s| s.models(&filter)).await
    }

    async fn history_depth(
        &self,
        query: crate::model::DepthQuery,
    ) -> Result<crate::model::DepthDoc, QueryError> {
        query.check().map_err(QueryError::BadInput)?;
        self.query(move |s| s.depth(&query)).await
    }

    async fn export(
        &self,
        filter: HistoryFilter,
        format: ExportFormat,
    ) -> Result<Vec<u8>, QueryError> {
        self.query(move |s| {
            let mut out = Vec::new();
            crate::store::export::export(s, &filter, format, &mut out)?;
            Ok(out)
        })
        .await
    }

    /// Starts the simulator and a `demo` route once, then (again) a minute
    /// of demo traffic unless some is still running.
    async fn start_demo(&self) -> Result<DemoDoc, QueryError> {
        let mut demo = self.shared.demo.lock().await;
        if demo.is_none() {
            let sim = SimServer::start("127.0.0.1:0", SimConfig::default())
                .await
                .map_err(|e| QueryError::Io(format!("cannot start the simulator: {e}")))?;
            // "demo", unless a configured route already has that name.
            let taken: Vec<String> = self.bound_routes().into_iter().map(|r| r.name).collect();
            let name = std::iter::once("demo".to_owned())
                .chain((2..).map(|i| format!("demo-{i}")))
                .find(|n| !taken.contains(n))
                .unwrap_or_else(|| "demo".to_owned());
            let spec =
                RouteSpec::new(&name, "127.0.0.1:0", &sim.base_url()).map_err(QueryError::Io)?;
            let route = self
                .add_route(spec)
                .await
                .map_err(|e| QueryError::Io(e.to_string()))?;
            *demo = Some(Demo {
                _sim: sim,
                route,
                traffic: None,
            });
        }
        let Some(state) = demo.as_mut() else {
            return Err(QueryError::Io("demo did not start".into()));
        };
        let running = state.traffic.as_ref().is_some_and(|t| !t.is_finished());
        if !running {
            let proxy = state.route.proxy_url();
            state.traffic = Some(tokio::spawn(demo::run_traffic(proxy)));
        }
        Ok(DemoDoc {
            running: true,
            route: RouteInfo::from(&state.route),
        })
    }
}

/// A running engine.
pub struct RunningEngine {
    pub handle: EngineHandle,
    pub routes: Vec<BoundRoute>,
    pub api: Option<SocketAddr>,
    /// Whether the passive capture runs.
    pub capture: CaptureStatus,
    stop_accepting: watch::Sender<bool>,
    system: System,
    otlp: Option<OtlpExporter>,
}

/// The actor side, as handed back from its thread.
struct Actors {
    supervisor: Addr<Supervisor>,
    notifier: Addr<Notifier>,
    arbiters: Vec<ArbiterHandle>,
    system: System,
}

/// The engine entry point.
pub struct Engine;

async fn bind_route(route: &RouteSpec) -> Result<TcpListener, EngineError> {
    TcpListener::bind(route.listen)
        .await
        .map_err(|source| EngineError::Bind {
            what: format!("route {}", route.name),
            addr: route.listen,
            source,
        })
}

async fn spawn_route(shared: &Arc<Shared>, route: RouteSpec, listener: TcpListener) -> BoundRoute {
    let listen = listener.local_addr().unwrap_or(route.listen);
    let bound = BoundRoute {
        name: route.name.clone(),
        listen,
        upstream: route.upstream.base_url(),
    };
    write(&shared.routes).push(bound.clone());
    shared
        .metrics
        .set_route_upstream(&route.name, &route.upstream.host, route.upstream.port);
    let proxy = Arc::new(RouteProxy::new(
        route.name,
        route.upstream,
        shared.link.clone(),
    ));
    shared.servers.lock().await.spawn(listen::serve_route(
        listener,
        proxy,
        shared.stop.clone(),
        shared.link.limits.clone(),
    ));
    bound
}

impl Engine {
    /// Binds every listener, starts the actors and serves. Must be called
    /// inside a multi-threaded tokio runtime.
    pub async fn start(options: EngineOptions) -> Result<RunningEngine, EngineError> {
        let mut route_listeners = Vec::new();
        for route in &options.routes {
            route_listeners.push((route.clone(), bind_route(route).await?));
        }
        let api_listener = match options.api {
            Some(addr) => {
                Some(
                    TcpListener::bind(addr)
                        .await
                        .map_err(|source| EngineError::Bind {
                            what: "control API".into(),
                            addr,
                            source,
                        })?,
                )
            }
            None => None,
        };

        let mut calibration = options.calibration;
        let mut normals = crate::meter::normals::Normals::new();
        let mut reader = None;
        let mut store = options.store;
        if let Some(s) = &store {
            match s.load_calibration() {
                Ok(saved) if !saved.is_empty() => calibration = saved,
                Ok(_) => {}
                Err(e) => tracing::warn!("store: cannot load the calibration: {e}"),
            }
            match s.load_normals() {
                Ok(saved) => normals = saved,
                Err(e) => tracing::warn!("store: the routes' normals start afresh: {e}"),
            }
            match s.path().map(Store::open) {
                Some(Ok(r)) => reader = Some(Arc::new(std::sync::Mutex::new(r))),
                Some(Err(e)) => tracing::warn!("store: no reader connection, history is off: {e}"),
                None => {}
            }
        }
        let calibration = Arc::new(RwLock::new(calibration));
        let metrics = Arc::new(Metrics::new());
        let otlp = match &options.otlp_endpoint {
            Some(endpoint) => Some(
                start_otlp_exporter(endpoint, options.otlp_interval, metrics.clone())
                    .map_err(EngineError::Otlp)?,
            ),
            None => None,
        };
        let actors = start_actors(
            calibration.clone(),
            metrics.clone(),
            options.metering_threads.max(1),
            options.slow_first_token_hooks,
        )?;
        let link = Arc::new(EngineLink {
            supervisor: actors.supervisor.clone(),
            notifier: actors.notifier.clone().recipient(),
            arbiters: actors.arbiters,
            next_arbiter: AtomicUsize::new(0),
            seq: AtomicU64::new(0),
            calibration,
            estimator: options.estimator,
            slow_ttft_ms: AtomicU64::new(options.slow_ttft.as_millis() as u64),
            limits: options.proxy_limits,
            own_connections: std::sync::OnceLock::new(),
            normals: Arc::new(RwLock::new(normals)),
            telemetry: options.telemetry,
            pollers: Default::default(),
        });
        let (stop_accepting, stop_rx) = watch::channel(false);
        let shared = Arc::new(Shared {
            link,
            metrics: metrics.clone(),
            routes: RwLock::new(Vec::new()),
            settings: RwLock::new(LiveSettings {
                routes: options.routes.clone(),
                notifications: options.notifications,
                notify_settled: options.notify_settled,
                capture: options.capture.is_some(),
            }),
            config_path: options
                .config_path
                .unwrap_or_else(config::default_config_path),
            stop: stop_rx.clone(),
            servers: tokio::sync::Mutex::new(JoinSet::new()),
            demo: tokio::sync::Mutex::new(None),
            reader,
            capture: RwLock::new(CaptureDoc::default()),
        });
        if let Some(store) = store.take() {
            let supervisor = actors.supervisor.clone();
            let writer = Arc::new(StoreWriter::spawn(
                store,
                Box::new(move |ids, durable| supervisor.do_send(Persisted { ids, durable })),
            ));
            actors.supervisor.do_send(AttachStore(writer.clone()));
            let (retention, max_bytes) = (options.retention, options.max_db_bytes);
            let mut stop = stop_rx.clone();
            shared.servers.lock().await.spawn(async move {
                let mut every = tokio::time::interval(PRUNE_EVERY);
                loop {
                    tokio::select! {
                        _ = every.tick() => {}
                        _ = stop.wait_for(|s| *s) => break,
                    }
                    let writer = writer.clone();
                    let pruned = tokio::task::spawn_blocking(move || {
                        writer.prune(unix_ms_now(), retention, max_bytes)
                    })
                    .await;
                    match pruned {
                        Ok(Ok(report)) if report.removed() > 0 => {
                            tracing::info!("store: pruned {} old calls", report.removed())
                        }
                        Ok(Err(e)) => tracing::warn!("store: prune failed: {e}"),
                        _ => {}
                    }
                }
            });
        }
        let handle = EngineHandle {
            supervisor: actors.supervisor,
            notifier: actors.notifier,
            metrics,
            shared: shared.clone(),
        };

        let mut routes = Vec::new();
        for (route, listener) in route_listeners {
            routes.push(spawn_route(&shared, route, listener).await);
        }
        let api = match api_listener {
            Some(listener) => {
                let addr = listener.local_addr().ok();
                let mut stop = stop_rx.clone();
                let engine = handle.clone();
                shared.servers.lock().await.spawn(async move {
                    let shutdown = async move {
                        let _ = stop.wait_for(|s| *s).await;
                    };
                    if let Err(e) = crate::api::serve(listener, engine, shutdown).await {
                        tracing::error!("control API stopped: {e}");
                    }
                });
                addr
            }
            None => None,
        };

        let capture = match options.capture {
            None => CaptureStatus::Off,
            Some(capture) => {
                let interface = capture.interface.clone();
                let (status, doc) = start_capture(&shared, &options.routes, &routes, capture).await;
                *write(&shared.capture) = CaptureDoc {
                    interface: Some(interface),
                    ..doc
                };
                status
            }
        };
        // Not logged here: each front end shows `capture` in its own words
        // (one line in the terminal), and a log line would say it twice.

        Ok(RunningEngine {
            handle,
            routes,
            api,
            capture,
            stop_accepting,
            system: actors.system,
            otlp,
        })
    }
}

impl RunningEngine {
    /// Where metrics are pushed, when an OTLP exporter runs.
    pub fn otlp_url(&self) -> Option<&str> {
        self.otlp.as_ref().map(OtlpExporter::url)
    }

    /// Stops accepting, lets in-flight calls finish for up to `grace`,
    /// then stops the actors (settling any call still open as abandoned).
    pub async fn shutdown(self, grace: Duration) {
        let _ = self.stop_accepting.send(true);
        if let Some(demo) = self.handle.shared.demo.lock().await.take() {
            if let Some(t) = demo.traffic {
                t.abort();
            }
        }
        let mut servers = std::mem::take(&mut *self.handle.shared.servers.lock().await);
        let drained = tokio::time::timeout(grace, async {
            while servers.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            servers.abort_all();
            while servers.join_next().await.is_some() {}
        }
        // The connections the drain ended dropped their taps, which queued
        // the calls' final reports. Wait (briefly) until the supervisor has
        // settled them, so subscribers see every call end before the
        // actors stop.
        let deadline = tokio::time::Instant::now() + SETTLE_WAIT;
        while tokio::time::Instant::now() < deadline {
            let in_flight = self
                .handle
                .calls(CallsQuery {
                    limit: usize::MAX,
                    route: None,
                })
                .await
                .iter()
                .any(|c| !c.status.is_settled());
            if !in_flight {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Commit what the writer still holds before the threads end.
        if let Ok(Some(writer)) = self.handle.supervisor.send(DetachStore).await {
            let _ = tokio::task::spawn_blocking(move || drop(writer)).await;
        }
        self.system.stop();
        if let Some(exporter) = self.otlp {
            // The last calls get exported before the process ends.
            let _ = tokio::task::spawn_blocking(move || exporter.shutdown()).await;
        }
    }
}

/// Whether `host` names this machine (the capture only sees loopback).
fn is_loopback_host(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Whether the capture helper is there and may open the packet socket on
/// `interface` (it is run once to check). The error names the command that
/// grants the permission when that is what is missing.
pub fn capture_permitted(interface: &str) -> Result<(), CaptureError> {
    let helper = capture_source::find_helper()?;
    capture_source::check(&helper, interface)
}

/// Starts the capture task for every route whose upstream is on this
/// machine, plus the capture-only routes. Never fails the engine: what
/// went wrong is returned for the front end to show, also as the
/// document the UI reads.
async fn start_capture(
    shared: &Arc<Shared>,
    specs: &[RouteSpec],
    bound: &[BoundRoute],
    options: CaptureOptions,
) -> (CaptureStatus, CaptureDoc) {
    let unavailable = |why: String, grant: Option<String>| {
        let doc = CaptureDoc {
            state: CaptureState::Unavailable,
            reason: Some(why.clone()),
            grant_command: grant,
            ..CaptureDoc::default()
        };
        (CaptureStatus::Unavailable(why), doc)
    };
    let mut routes: Vec<CaptureRoute> = Vec::new();
    let upstreams = specs
        .iter()
        .map(|r| (&r.name, &r.upstream))
        .chain(options.capture_only.iter().map(|r| (&r.name, &r.upstream)));
    for (name, upstream) in upstreams {
        if is_loopback_host(&upstream.host) && !routes.iter().any(|r| r.port == upstream.port) {
            routes.push(CaptureRoute {
                name: name.clone(),
                port: upstream.port,
                upstream: upstream.clone(),
            });
        }
    }
    if routes.is_empty() {
        return unavailable("no route has an upstream on this machine".into(), None);
    }
    let ports: Vec<u16> = routes.iter().map(|r| r.port).collect();
    let config = CaptureConfig {
        interface: options.interface,
        ports: ports.clone(),
        ..CaptureConfig::default()
    };
    let (tx, packets) = mpsc::channel(CAPTURE_QUEUE);
    // Finding the helper and checking its permission run it once: blocking.
    let opened = tokio::task::spawn_blocking(move || CaptureSource::open(&config, tx)).await;
    let source = match opened {
        Ok(Ok(source)) => source,
        Ok(Err(e)) => {
            let grant = e.grant_command().map(str::to_owned);
            return unavailable(e.to_string(), grant);
        }
        Err(e) => return unavailable(e.to_string(), None),
    };
    let Some(link) = LinkType::from_linktype(source.link_type().0) else {
        return unavailable(
            format!("unsupported link type {}", source.link_type().0),
            None,
        );
    };
    let (own_tx, own) = mpsc::unbounded_channel();
    if shared.link.own_connections.set(own_tx).is_err() {
        return unavailable("capture already running".into(), None);
    }
    let docs = routes
        .iter()
        .map(|r| CaptureRouteDoc {
            name: r.name.clone(),
            port: r.port,
        })
        .collect();
    let own_ports: Vec<u16> = bound.iter().map(|r| r.listen.port()).collect();
    let task = CaptureTask::new(shared.link.clone(), &routes, own_ports, link);
    shared.servers.lock().await.spawn(task.run(
        packets,
        own,
        shared.stop.clone(),
        Some(source),
        shared.metrics.clone(),
    ));
    let doc = CaptureDoc {
        state: CaptureState::On,
        routes: docs,
        permitted: Some(true),
        ..CaptureDoc::default()
    };
    (CaptureStatus::On { ports }, doc)
}

/// Packets queued between the capture's reader and its task; beyond this
/// they are dropped and counted (the reader never waits).
const CAPTURE_QUEUE: usize = 65_536;

fn start_actors(
    calibration: Arc<RwLock<CalibrationTable>>,
    metrics: Arc<Metrics>,
    metering_threads: usize,
    hooks: Vec<SlowFirstTokenHook>,
) -> Result<Actors, EngineError> {
    let (tx, rx) = std_mpsc::channel();
    std::thread::Builder::new()
        .name("speedtap-actors".into())
        .spawn(move || {
            let system = System::new();
            system.block_on(async move {
                let supervisor = Supervisor::new(calibration, metrics).start();
                let notifier = Notifier::new(supervisor.clone().recipient(), hooks).start();
                let arbiters: Vec<ArbiterHandle> = (0..metering_threads)
                    .map(|_| Arbiter::new().handle())
                    .collect();
                let _ = tx.send(Actors {
                    supervisor,
                    notifier,
                    arbiters,
                    system: System::current(),
                });
            });
            let _ = system.run();
        })
        .map_err(|e| EngineError::Actors(e.to_string()))?;
    rx.recv()
        .map_err(|_| EngineError::Actors("the actor thread died while starting".into()))
}
