//! The running engine's handle ([`EngineHandle`]): the state the handle
//! shares with the host, and the queries the control API and the tray ask
//! (calls, stats, history, settings and their saving, the demo).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock};

use actix::Addr;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

use crate::config::{self, ConfigFile};
use crate::engine::link::EngineLink;
use crate::engine::messages::{
    GetCalibration, GetCall, GetCalls, GetHistory, GetStats, SetNotificationsPaused, Subscribe,
};
use crate::engine::metrics::Metrics;
use crate::engine::notifier::Notifier;
use crate::engine::proxy::{listen, RouteProxy};
use crate::engine::supervisor::{Supervisor, SUBSCRIBER_CAPACITY};
use crate::meter::calibration::CalibrationTable;
use crate::model::{
    queries::NO_STORE, BoundRoute, Call, CallsQuery, CaptureDoc, CaptureState, DemoDoc,
    DiscoveredDoc, EngineEvent, EngineQueries, ExportFormat, HistoryDoc, HistoryFilter,
    ModelSummary, QueryError, RouteDoc, RouteInfo, RouteSpec, RoutesDoc, SaveOutcome, ServerDoc,
    SettingsDoc, Stats,
};
use crate::simulate::{SimConfig, SimServer};
use crate::store::Store;

use super::*;

/// The settings that can change while running.
#[derive(Clone, Debug)]
pub(super) struct LiveSettings {
    /// The routes as configured (what a restart would bind).
    pub(super) routes: Vec<RouteSpec>,
    pub(super) notifications: bool,
    pub(super) notify_settled: bool,
    /// Capture as configured (what a restart would do).
    pub(super) capture: bool,
}

/// The demo: the simulator, its route, and whether traffic is running.
pub(super) struct Demo {
    pub(super) _sim: SimServer,
    pub(super) route: BoundRoute,
    pub(super) traffic: Option<tokio::task::JoinHandle<()>>,
}

/// State shared by the engine's handle and host.
pub(super) struct Shared {
    pub(super) link: Arc<EngineLink>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) routes: RwLock<Vec<BoundRoute>>,
    /// Each proxy route's own stop switch, by name: a route opened for a
    /// followed server the user then ignores closes its port at once.
    pub(super) route_stops: std::sync::Mutex<HashMap<String, watch::Sender<bool>>>,
    pub(super) settings: RwLock<LiveSettings>,
    pub(super) config_path: PathBuf,
    pub(super) stop: watch::Receiver<bool>,
    pub(super) servers: tokio::sync::Mutex<JoinSet<()>>,
    pub(super) demo: tokio::sync::Mutex<Option<Demo>>,
    /// A second connection to the store for queries (WAL lets it read
    /// while the writer writes).
    pub(super) reader: Option<Arc<std::sync::Mutex<Store>>>,
    /// How the capture started (set after the start), and the routes it
    /// captures as they are added and removed.
    pub(super) capture: RwLock<CaptureDoc>,
    /// The model servers followed on this machine (the watcher's list).
    pub(super) followed: Arc<RwLock<crate::model::ServersDoc>>,
    /// The watcher's inbox, once it runs.
    pub(super) watch_commands: std::sync::OnceLock<
        tokio::sync::mpsc::UnboundedSender<super::watch::command::WatchCommand>,
    >,
    /// Changes the running capture's routes (set once, when it starts).
    pub(super) capture_control: std::sync::OnceLock<crate::engine::capture::CaptureControl>,
    /// The control API's address as bound, once it is (no API: unset).
    pub(super) api_addr: std::sync::OnceLock<std::net::SocketAddr>,
}

/// Access to the running engine, for front ends. Cheap to clone.
#[derive(Clone)]
pub struct EngineHandle {
    pub(super) supervisor: Addr<Supervisor>,
    pub(super) notifier: Addr<Notifier>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) shared: Arc<Shared>,
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

    /// Where the control API (and the dashboard) listens, once bound;
    /// `None` when it is off. The tray app points its window here.
    pub fn api_addr(&self) -> Option<std::net::SocketAddr> {
        self.shared.api_addr.get().copied()
    }

    /// The routes bound now (the demo route included once started).
    pub fn bound_routes(&self) -> Vec<BoundRoute> {
        read(&self.shared.routes).clone()
    }

    /// The routes bound now as `GET /api/v1/routes` lists them: the
    /// demo's marked `demo`, so no host offers its proxy URL to clients.
    pub fn route_infos(&self) -> Vec<RouteInfo> {
        self.bound_routes()
            .iter()
            .map(|r| RouteInfo {
                demo: self.shared.link.is_demo_route(&r.name),
                ..RouteInfo::from(r)
            })
            .collect()
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
            watch_ports: {
                let followed = read(&self.shared.followed);
                followed.watching.then(|| followed.watch_ports.clone())
            },
            config_path: Some(self.shared.config_path.display().to_string()),
        }
    }

    /// Binds one more route while running and serves it until shutdown.
    /// A route whose upstream is one of speedtap's own listeners (a
    /// route's, the new one's, the control API's) is refused: every
    /// request would loop back into speedtap.
    pub async fn add_route(&self, route: RouteSpec) -> Result<BoundRoute, EngineError> {
        let mut own = self.own_listeners();
        own.push((format!("route {:?}'s listener", route.name), route.listen));
        if let Some((what, addr)) = reached_listener(&route, &own) {
            return Err(EngineError::Loop {
                route: route.name.clone(),
                upstream: route.upstream.base_url(),
                what,
                addr,
            });
        }
        let listener = bind_route(&route).await?;
        let bound = spawn_route(&self.shared, route, listener).await;
        Ok(bound)
    }

    /// Watches `ports` from now on (the watcher asks their listeners
    /// whether they are model servers); nothing when the machine isn't
    /// followed.
    fn watch_ports(&self, ports: Vec<u16>) {
        if let Some(commands) = self.shared.watch_commands.get() {
            let _ = commands.send(super::watch::command::WatchCommand::WatchPorts(ports));
        }
    }

    /// Stops serving the proxy route `name`, and returns once its port is
    /// closed (calls in flight on it finish first); false when there is no
    /// such route.
    pub async fn remove_route(&self, name: &str) -> bool {
        let stop = self
            .shared
            .route_stops
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(name);
        let Some(stop) = stop else {
            return false;
        };
        write(&self.shared.routes).retain(|r| r.name != name);
        let _ = stop.send(true);
        // The route's task holds the only receiver until it returns, and
        // with it the listener.
        stop.closed().await;
        true
    }

    /// Every address speedtap listens on now, each with what it is.
    fn own_listeners(&self) -> Vec<(String, std::net::SocketAddr)> {
        let routes = read(&self.shared.routes)
            .iter()
            .map(|r| (format!("route {:?}'s listener", r.name), r.listen))
            .collect::<Vec<_>>();
        routes
            .into_iter()
            .chain(
                self.shared
                    .api_addr
                    .get()
                    .map(|a| ("the control API".to_owned(), *a)),
            )
            .collect()
    }
}

pub(super) fn unix_ms_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

pub(super) fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|p| p.into_inner())
}

pub(super) fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
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
            routes: self.route_infos(),
        }
    }

    async fn stats_history(&self) -> HistoryDoc {
        self.supervisor.send(GetHistory).await.unwrap_or_default()
    }

    async fn servers(&self) -> crate::model::ServersDoc {
        let mut doc = read(&self.shared.followed).clone();
        let loaded = self.shared.link.loaded_models().await;
        let normals = self
            .shared
            .link
            .normals
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        doc.loaded = loaded
            .iter()
            .flat_map(|(route, models)| models.iter().map(|m| loaded_doc(route, m, &normals)))
            .collect();
        doc
    }

    async fn ignore_server(&self, name: String) -> Result<crate::model::ServersDoc, QueryError> {
        let Some(commands) = self.shared.watch_commands.get() else {
            return Err(QueryError::NotFound(format!(
                "no followed server {name:?}: routes are configured, so the machine isn't followed"
            )));
        };
        let (reply, answer) = tokio::sync::oneshot::channel();
        let asked = commands.send(super::watch::command::WatchCommand::Ignore { name, reply });
        match (asked, answer.await) {
            (Ok(()), Ok(Ok(()))) => Ok(read(&self.shared.followed).clone()),
            (Ok(()), Ok(Err(why))) => Err(QueryError::NotFound(why)),
            _ => Err(QueryError::Io("the watcher has stopped".into())),
        }
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
        let routes = routes_of(&doc)?;
        if doc.watch_ports.as_ref().is_some_and(|p| p.contains(&0)) {
            return Err(QueryError::BadInput(
                "watch_ports: 0 is not a port (1 to 65535)".into(),
            ));
        }
        self.refuse_loops(&routes)?;
        config::values::at_least_one(doc.slow_ttft_ms)
            .map_err(|e| QueryError::BadInput(format!("slow_ttft_ms: {e}")))?;
        let path = self.shared.config_path.clone();
        save_to_file(&path, &doc, &routes)?;
        let restart_required = self.apply_live(&doc, routes);
        if let Some(ports) = &doc.watch_ports {
            self.watch_ports(ports.clone());
        }
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
            // Marked before it binds: its first call is a demo call too.
            self.shared.link.mark_demo_route(&name);
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
            route: RouteInfo {
                demo: true,
                ..RouteInfo::from(&state.route)
            },
        })
    }
}

impl EngineHandle {
    /// Applies saved settings that take effect at once (the threshold and
    /// the notification switches); returns whether the rest (routes,
    /// capture) waits for a restart.
    fn apply_live(&self, doc: &SettingsDoc, routes: Vec<RouteSpec>) -> bool {
        self.shared
            .link
            .slow_ttft_ms
            .store(doc.slow_ttft_ms, Ordering::Relaxed);
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
    }
}

/// The form's routes, each checked by the routes' rules, no name twice.
/// The first of `listeners` a connection to `route`'s upstream would
/// reach (see [`config::loops::upstream_reaches`]).
fn reached_listener(
    route: &RouteSpec,
    listeners: &[(String, std::net::SocketAddr)],
) -> Option<(String, std::net::SocketAddr)> {
    listeners
        .iter()
        .find(|(_, addr)| config::loops::upstream_reaches(&route.upstream, *addr))
        .cloned()
}

impl EngineHandle {
    /// Refuses saved routes whose upstream is one of speedtap's listeners
    /// at the next start, when they apply: the control API's and the saved
    /// routes' own (the rule the start applies to the file). Such a route
    /// would loop every request back into speedtap.
    fn refuse_loops(&self, routes: &[RouteSpec]) -> Result<(), QueryError> {
        let api = self.shared.api_addr.get();
        let mut listeners: Vec<(String, std::net::SocketAddr)> = api
            .map(|a| ("the control API".to_owned(), *a))
            .into_iter()
            .collect();
        listeners.extend(
            routes
                .iter()
                .map(|r| (format!("route {:?}'s listener", r.name), r.listen)),
        );
        for (i, route) in routes.iter().enumerate() {
            if let Some((what, addr)) = reached_listener(route, &listeners) {
                return Err(QueryError::BadInput(format!(
                    "routes[{i}] ({}): upstream {} is speedtap's own address ({what}, {addr}): \
                     every request would loop back into speedtap; point it at the model server",
                    route.name, route.upstream
                )));
            }
        }
        Ok(())
    }
}

fn routes_of(doc: &SettingsDoc) -> Result<Vec<RouteSpec>, QueryError> {
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
    Ok(routes)
}

/// Writes the form's settings into the config file at `path`, keeping the
/// file's other keys. A file that is there but doesn't parse is left alone
/// (saving over it would lose what it says).
fn save_to_file(
    path: &std::path::Path,
    doc: &SettingsDoc,
    routes: &[RouteSpec],
) -> Result<(), QueryError> {
    let mut file = if path.exists() {
        config::load_config(path).map_err(|e| match e {
            // The file is there but can't be read: the engine's side.
            config::ConfigError::Io { .. } => QueryError::Io(e.to_string()),
            // It doesn't parse: saving over it would lose what it says.
            _ => QueryError::Conflict(e.to_string()),
        })?
    } else {
        ConfigFile::default()
    };
    file.routes = routes.to_vec();
    file.slow_ttft_ms = Some(doc.slow_ttft_ms);
    file.notifications = Some(doc.notifications);
    file.notify_settled = Some(doc.notify_settled);
    if let Some(capture) = doc.capture {
        file.capture = Some(capture);
    }
    if let Some(ports) = &doc.watch_ports {
        file.watch_ports = (!ports.is_empty()).then(|| ports.clone());
    }
    config::save_config(path, &file)
        .map_err(|e| QueryError::Io(format!("cannot write {}: {e}", path.display())))
}

pub(super) async fn bind_route(route: &RouteSpec) -> Result<TcpListener, EngineError> {
    TcpListener::bind(route.listen)
        .await
        .map_err(|source| EngineError::Bind {
            what: format!("route {}", route.name),
            addr: route.listen,
            source,
        })
}

pub(super) async fn spawn_route(
    shared: &Arc<Shared>,
    route: RouteSpec,
    listener: TcpListener,
) -> BoundRoute {
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
    let stop = route_stop(shared, &bound.name);
    shared.servers.lock().await.spawn(listen::serve_route(
        listener,
        proxy,
        stop,
        shared.link.limits.clone(),
    ));
    bound
}

/// The route's own stop switch, which the engine's stop also throws.
fn route_stop(shared: &Arc<Shared>, name: &str) -> watch::Receiver<bool> {
    let (tx, rx) = watch::channel(*shared.stop.borrow());
    let mut engine_stop = shared.stop.clone();
    let on_stop = tx.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = engine_stop.wait_for(|s| *s) => {
                let _ = on_stop.send(true);
            }
            // The route stopped on its own switch and let go of it.
            () = on_stop.closed() => {}
        }
    });
    shared
        .route_stops
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(name.to_owned(), tx);
    rx
}

/// One loaded model as `GET /api/v1/servers` lists it: when it unloads,
/// how much of it is off the GPU, and the route's usual load time for it
/// (under the name the server lists, else the name without `:latest`,
/// as requests often name it).
fn loaded_doc(
    route: &str,
    model: &crate::engine::telemetry::server::LoadedModel,
    normals: &crate::meter::normals::Normals,
) -> crate::model::LoadedModelDoc {
    let cpu_share = match (model.size, model.size_vram) {
        (Some(size), Some(vram)) if size > 0 => {
            let share = 1.0 - vram.min(size) as f64 / size as f64;
            Some((share * 100.0).round() / 100.0)
        }
        _ => None,
    };
    let usual_load_ms = normals.usual_load_ms(route, &model.name).or_else(|| {
        let bare = model.name.strip_suffix(":latest")?;
        normals.usual_load_ms(route, bare)
    });
    crate::model::LoadedModelDoc {
        route: route.to_owned(),
        model: model.name.clone(),
        expires_at: model.expires_at_ms.map(crate::model::time::ms_to_rfc3339),
        cpu_share,
        usual_load_ms,
    }
}
