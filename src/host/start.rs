//! Start-up ([`Engine::start`]): bind every listener first (so a taken
//! port is an error before anything runs), start the actors on their own
//! threads, then serve the routes and the control API on the caller's
//! tokio runtime.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::{mpsc as std_mpsc, Arc, RwLock};
use std::time::Duration;

use actix::{Actor, Addr, Arbiter, ArbiterHandle, System};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::config::{self};
use crate::engine::link::EngineLink;
use crate::engine::messages::{AttachStore, Persisted, SeedHour};
use crate::engine::metrics::otlp::{start_otlp_exporter, OtlpExporter};
use crate::engine::metrics::Metrics;
use crate::engine::notifier::{Notifier, SlowFirstTokenHook};
use crate::engine::supervisor::Supervisor;
use crate::meter::calibration::CalibrationTable;
use crate::model::{BoundRoute, CallStatus, CaptureDoc, HistoryFilter, RouteSpec};
use crate::store::{Store, StoreWriter};

use super::*;

/// A running engine.
pub struct RunningEngine {
    pub handle: EngineHandle,
    pub routes: Vec<BoundRoute>,
    pub api: Option<SocketAddr>,
    /// Whether the passive capture runs.
    pub capture: CaptureStatus,
    pub(super) stop_accepting: watch::Sender<bool>,
    pub(super) system: System,
    pub(super) otlp: Option<OtlpExporter>,
}

/// The actor side, as handed back from its thread.
pub(super) struct Actors {
    pub(super) supervisor: Addr<Supervisor>,
    pub(super) notifier: Addr<Notifier>,
    pub(super) arbiters: Vec<ArbiterHandle>,
    pub(super) system: System,
}

/// The engine entry point.
pub struct Engine;

/// How often the store is pruned while running (and once at start).
pub const PRUNE_EVERY: Duration = Duration::from_secs(3600);

impl Engine {
    /// Binds every listener, starts the actors and serves. Must be called
    /// inside a multi-threaded tokio runtime.
    pub async fn start(mut options: EngineOptions) -> Result<RunningEngine, EngineError> {
        let listeners = bind_all(&options).await?;
        let mut saved = load_saved(
            options.store.as_ref(),
            std::mem::take(&mut options.calibration),
        );
        let calibration = Arc::new(RwLock::new(std::mem::take(&mut saved.calibration)));
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
            std::mem::take(&mut options.slow_first_token_hooks),
        )?;
        let (stop_accepting, stop_rx) = watch::channel(false);
        let shared = share_state(&mut options, &actors, calibration, saved, &metrics, stop_rx);
        if let Some(store) = options.store.take() {
            attach_store(&shared, &actors, store, &options).await;
        }
        let handle = EngineHandle {
            supervisor: actors.supervisor,
            notifier: actors.notifier,
            metrics,
            shared: shared.clone(),
        };
        let (routes, api) = serve(&shared, &handle, listeners).await;
        let head_cap = options.proxy_limits.max_buf_size;
        let capture =
            capture::start(&shared, &options.routes, &routes, options.capture, head_cap).await;
        if let Some(watch) = options.watch.take() {
            let (commands, received) = tokio::sync::mpsc::unbounded_channel();
            let _ = shared.watch_commands.set(commands);
            let watcher =
                super::watch::spawn(handle.clone(), watch, shared.followed.clone(), received);
            shared.servers.lock().await.spawn(watcher);
        }
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

/// Every listener, bound before anything starts (a taken port is an error
/// that stops the start).
struct Listeners {
    routes: Vec<(RouteSpec, TcpListener)>,
    api: Option<TcpListener>,
}

async fn bind_all(options: &EngineOptions) -> Result<Listeners, EngineError> {
    let mut routes = Vec::new();
    for route in &options.routes {
        routes.push((route.clone(), bind_route(route).await?));
    }
    let api = match options.api {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .await
                .map_err(|source| EngineError::Bind {
                    what: "control API".into(),
                    addr,
                    source,
                })?,
        ),
        None => None,
    };
    Ok(Listeners { routes, api })
}

/// What the store remembers from the last run, and a reader connection
/// for the history queries.
struct Saved {
    calibration: CalibrationTable,
    normals: crate::meter::normals::Normals,
    decode_usuals: crate::meter::slowdown::DecodeUsuals,
    reader: Option<Arc<std::sync::Mutex<Store>>>,
}

/// The store's calibration (else `calibration`), the routes' normals and a
/// reader; what can't be loaded starts afresh, with a warning.
fn load_saved(store: Option<&Store>, calibration: CalibrationTable) -> Saved {
    let mut saved = Saved {
        calibration,
        normals: crate::meter::normals::Normals::new(),
        decode_usuals: crate::meter::slowdown::DecodeUsuals::new(),
        reader: None,
    };
    let Some(s) = store else { return saved };
    match s.load_calibration() {
        Ok(table) if !table.is_empty() => saved.calibration = table,
        Ok(_) => {}
        Err(e) => tracing::warn!("store: cannot load the calibration: {e}"),
    }
    match s.load_normals() {
        Ok(normals) => saved.normals = normals,
        Err(e) => tracing::warn!("store: the routes' normals start afresh: {e}"),
    }
    match s.load_decode_usuals() {
        Ok(usuals) => saved.decode_usuals = usuals,
        Err(e) => tracing::warn!("store: the usual decode rates start afresh: {e}"),
    }
    match s.path().map(Store::open) {
        Some(Ok(r)) => saved.reader = Some(Arc::new(std::sync::Mutex::new(r))),
        Some(Err(e)) => tracing::warn!("store: no reader connection, history is off: {e}"),
        None => {}
    }
    saved
}

/// The link the interceptors meter through and the state the handle and
/// the host share.
fn share_state(
    options: &mut EngineOptions,
    actors: &Actors,
    calibration: Arc<RwLock<CalibrationTable>>,
    saved: Saved,
    metrics: &Arc<Metrics>,
    stop: watch::Receiver<bool>,
) -> Arc<Shared> {
    let link = Arc::new(EngineLink {
        supervisor: actors.supervisor.clone(),
        notifier: actors.notifier.clone().recipient(),
        arbiters: actors.arbiters.clone(),
        next_arbiter: AtomicUsize::new(0),
        seq: AtomicU64::new(0),
        calibration,
        estimator: options.estimator.clone(),
        slow_ttft_ms: AtomicU64::new(options.slow_ttft.as_millis() as u64),
        limits: options.proxy_limits.clone(),
        own_connections: std::sync::OnceLock::new(),
        own_sockets: Default::default(),
        normals: Arc::new(RwLock::new(saved.normals)),
        decode_watch: Arc::new(crate::engine::decode_watch::DecodeWatch::with_usuals(
            saved.decode_usuals,
        )),
        telemetry: options.telemetry,
        pollers: Default::default(),
        demo_routes: Default::default(),
        relay_judge: Default::default(),
    });
    Arc::new(Shared {
        link,
        metrics: metrics.clone(),
        routes: RwLock::new(Vec::new()),
        route_stops: Default::default(),
        settings: RwLock::new(LiveSettings {
            routes: options.routes.clone(),
            notifications: options.notifications,
            notify_settled: options.notify_settled,
            capture: options.capture.is_some(),
        }),
        config_path: options
            .config_path
            .take()
            .unwrap_or_else(config::default_config_path),
        stop,
        servers: tokio::sync::Mutex::new(JoinSet::new()),
        demo: tokio::sync::Mutex::new(None),
        reader: saved.reader,
        capture: RwLock::new(CaptureDoc::default()),
        followed: Arc::default(),
        watch_commands: std::sync::OnceLock::new(),
        api_addr: std::sync::OnceLock::new(),
        capture_control: std::sync::OnceLock::new(),
    })
}

/// Hands the store to its writer thread and the supervisor, and prunes it
/// every [`PRUNE_EVERY`] until shutdown.
async fn attach_store(
    shared: &Arc<Shared>,
    actors: &Actors,
    store: Store,
    options: &EngineOptions,
) {
    actors
        .supervisor
        .do_send(SeedHour(hour_of_settled_rates(&store, unix_ms_now())));
    let supervisor = actors.supervisor.clone();
    let writer = Arc::new(StoreWriter::spawn(
        store,
        Box::new(move |ids, durable| supervisor.do_send(Persisted { ids, durable })),
    ));
    actors.supervisor.do_send(AttachStore(writer.clone()));
    let prune = prune_loop(
        writer,
        options.retention,
        options.max_db_bytes,
        shared.stop.clone(),
    );
    shared.servers.lock().await.spawn(prune);
}

/// The stored `ok` calls settled in the hour before `now_ms` with a
/// settled rate, as (settle time in unix ms, rate), oldest first: what the
/// hour's high, low and chart were made of before this start. A store that
/// can't be read seeds nothing (the hour starts empty, as it did before).
fn hour_of_settled_rates(store: &Store, now_ms: u64) -> Vec<(u64, f64)> {
    let hour = crate::engine::supervisor::CHART_WINDOW.as_millis() as u64;
    let filter = HistoryFilter {
        // Started up to an hour before the window, settled within it.
        since_ms: Some(now_ms.saturating_sub(2 * hour)),
        status: Some(CallStatus::Ok),
        limit: Some(crate::model::MAX_LIMIT),
        ..HistoryFilter::default()
    };
    let calls = store.history(&filter).unwrap_or_default();
    let mut rates: Vec<(u64, f64)> = calls
        .iter()
        .filter_map(|call| {
            let rate = call.speed.as_ref()?.output_tokens_per_second?;
            let settled = humantime::parse_rfc3339(call.details.settled_at.as_deref()?).ok()?;
            let t = settled
                .duration_since(std::time::UNIX_EPOCH)
                .ok()?
                .as_millis() as u64;
            (t + hour >= now_ms && t <= now_ms).then_some((t, rate))
        })
        .collect();
    rates.sort_by_key(|(t, _)| *t);
    rates
}

/// Prunes the store now and every [`PRUNE_EVERY`] (calls older than
/// `retention`, then the oldest beyond `max_bytes`) until `stop`.
async fn prune_loop(
    writer: Arc<StoreWriter>,
    retention: Duration,
    max_bytes: u64,
    mut stop: watch::Receiver<bool>,
) {
    let mut every = tokio::time::interval(PRUNE_EVERY);
    loop {
        tokio::select! {
            _ = every.tick() => {}
            _ = stop.wait_for(|s| *s) => break,
        }
        let writer = writer.clone();
        let pruned =
            tokio::task::spawn_blocking(move || writer.prune(unix_ms_now(), retention, max_bytes))
                .await;
        match pruned {
            Ok(Ok(report)) if report.removed() > 0 => {
                tracing::info!("store: pruned {} old calls", report.removed())
            }
            Ok(Err(e)) => tracing::warn!("store: prune failed: {e}"),
            _ => {}
        }
    }
}

/// Serves every bound route and the control API until shutdown; returns
/// the routes as bound and the API's address.
async fn serve(
    shared: &Arc<Shared>,
    handle: &EngineHandle,
    listeners: Listeners,
) -> (Vec<BoundRoute>, Option<SocketAddr>) {
    let mut routes = Vec::new();
    for (route, listener) in listeners.routes {
        routes.push(spawn_route(shared, route, listener).await);
    }
    let Some(listener) = listeners.api else {
        return (routes, None);
    };
    let addr = listener.local_addr().ok();
    if let Some(addr) = addr {
        let _ = shared.api_addr.set(addr);
    }
    let mut stop = shared.stop.clone();
    let engine = handle.clone();
    shared.servers.lock().await.spawn(async move {
        let shutdown = async move {
            let _ = stop.wait_for(|s| *s).await;
        };
        if let Err(e) = crate::api::serve(listener, engine, shutdown).await {
            tracing::error!("control API stopped: {e}");
        }
    });
    (routes, addr)
}

pub(super) fn start_actors(
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
