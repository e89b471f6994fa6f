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
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::{mpsc as std_mpsc, Arc, RwLock};
use std::time::Duration;

use actix::prelude::*;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

use super::messages::{
    GetCalibration, GetCall, GetCalls, GetStats, SetNotificationsPaused, Subscribe,
};
use super::metrics::Metrics;
use super::model::{Call, EngineEvent};
use super::notifier::{Notifier, SlowFirstTokenHook};
use super::proxy::{EngineLink, RouteProxy};
use super::queries::{CallsQuery, EngineQueries};
use super::supervisor::{Supervisor, SUBSCRIBER_CAPACITY};
use crate::config::RouteSpec;
use crate::meter::calibration::CalibrationTable;
use crate::meter::global::Stats;
use crate::tokens::{default_estimator, TokenEstimator};

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
}

impl EngineOptions {
    pub fn new(routes: Vec<RouteSpec>) -> Self {
        EngineOptions {
            routes,
            api: None,
            slow_ttft: Duration::from_millis(5000),
            estimator: default_estimator(),
            calibration: CalibrationTable::default(),
            metering_threads: 1,
            slow_first_token_hooks: Vec::new(),
        }
    }
}

/// A route as it is actually bound.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BoundRoute {
    pub name: String,
    pub listen: SocketAddr,
    pub upstream: String,
}

impl BoundRoute {
    /// The URL a client should use instead of the upstream's.
    pub fn proxy_url(&self) -> String {
        format!("http://{}", self.listen)
    }
}

/// Read access to the running engine, for front ends. Cheap to clone.
#[derive(Clone)]
pub struct EngineHandle {
    supervisor: Addr<Supervisor>,
    notifier: Addr<Notifier>,
    metrics: Arc<Metrics>,
}

impl EngineHandle {
    /// Pause or resume the slow-first-token hooks (desktop notifications).
    pub fn set_notifications_paused(&self, paused: bool) {
        self.notifier.do_send(SetNotificationsPaused(paused));
    }

    /// A copy of the current calibration table.
    pub async fn calibration(&self) -> CalibrationTable {
        self.supervisor
            .send(GetCalibration)
            .await
            .unwrap_or_default()
    }
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
}

/// A running engine.
pub struct RunningEngine {
    pub handle: EngineHandle,
    pub routes: Vec<BoundRoute>,
    pub api: Option<SocketAddr>,
    stop_accepting: watch::Sender<bool>,
    servers: JoinSet<()>,
    system: System,
    actor_thread: Option<std::thread::JoinHandle<()>>,
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

impl Engine {
    /// Binds every listener, starts the actors and serves. Must be called
    /// inside a multi-threaded tokio runtime.
    pub async fn start(options: EngineOptions) -> Result<RunningEngine, EngineError> {
        let mut route_listeners = Vec::new();
        for route in &options.routes {
            let listener =
                TcpListener::bind(route.listen)
                    .await
                    .map_err(|source| EngineError::Bind {
                        what: format!("route {}", route.name),
                        addr: route.listen,
                        source,
                    })?;
            route_listeners.push((route.clone(), listener));
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

        let calibration = Arc::new(RwLock::new(options.calibration));
        let metrics = Arc::new(Metrics::new());
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
            slow_ttft: options.slow_ttft,
        });
        let handle = EngineHandle {
            supervisor: actors.supervisor,
            notifier: actors.notifier,
            metrics,
        };

        let (stop_accepting, stop_rx) = watch::channel(false);
        let mut servers = JoinSet::new();
        let mut routes = Vec::new();
        for (route, listener) in route_listeners {
            let listen = listener.local_addr().unwrap_or(route.listen);
            routes.push(BoundRoute {
                name: route.name.clone(),
                listen,
                upstream: route.upstream.base_url(),
            });
            let proxy = Arc::new(RouteProxy::new(route.name, route.upstream, link.clone()));
            servers.spawn(serve_route(listener, proxy, stop_rx.clone()));
        }
        let api = match api_listener {
            Some(listener) => {
                let addr = listener.local_addr().ok();
                let mut stop = stop_rx.clone();
                let engine = handle.clone();
                servers.spawn(async move {
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

        Ok(RunningEngine {
            handle,
            routes,
            api,
            stop_accepting,
            servers,
            system: actors.system,
            actor_thread: None,
        })
    }
}

impl RunningEngine {
    /// Stops accepting, lets in-flight calls finish for up to `grace`,
    /// then stops the actors (settling any call still open as abandoned).
    pub async fn shutdown(mut self, grace: Duration) {
        let _ = self.stop_accepting.send(true);
        let drained = tokio::time::timeout(grace, async {
            while self.servers.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            self.servers.abort_all();
        }
        // Give the actors a moment to settle the calls the drain ended.
        tokio::time::sleep(Duration::from_millis(50)).await;
        self.system.stop();
        if let Some(t) = self.actor_thread.take() {
            let _ = tokio::task::spawn_blocking(move || t.join()).await;
        }
    }
}

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

/// Accepts connections for one route until told to stop, then waits for
/// the open connections to finish (the caller bounds that wait).
async fn serve_route(
    listener: TcpListener,
    proxy: Arc<RouteProxy>,
    mut stop: watch::Receiver<bool>,
) {
    let graceful = GracefulShutdown::new();
    let builder = auto::Builder::new(TokioExecutor::new());
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let _ = stream.set_nodelay(true);
                let proxy = proxy.clone();
                let service = service_fn(move |req| {
                    let proxy = proxy.clone();
                    async move { Ok::<_, std::convert::Infallible>(proxy.handle(req).await) }
                });
                let conn = builder
                    .serve_connection(TokioIo::new(stream), service)
                    .into_owned();
                let conn = graceful.watch(conn);
                tokio::spawn(async move {
                    let _ = conn.await;
                });
            }
            _ = stop.wait_for(|s| *s) => break,
        }
    }
    drop(listener);
    graceful.shutdown().await;
}
