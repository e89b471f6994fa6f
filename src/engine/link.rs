//! The link between the engine and its two interceptors, the
//! [`proxy`](super::proxy) and the [`capture`](super::capture): what both
//! need to turn a request they saw into a metered call.
//!
//! It holds the shared [`EngineLink`] (where call actors start and where
//! they report), the call ids both interceptors draw from (so ids stay
//! unique whichever one saw a call), the telemetry pollers they share,
//! and the one way to start a call, [`EngineLink::start_call`]: each
//! interceptor says what differs ([`CallStart`]: route, API, seen by,
//! request line, client, times) and gets the running [`CallActor`] back,
//! so the proxy and the capture build the same [`CallSetup`] by
//! construction, not by copy. It also holds [`OwnSockets`], the proxy's
//! live upstream connections, by which a request that comes back round to
//! speedtap's own listener is known and refused.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock};
use std::time::{Duration, SystemTime};

use actix::{Actor, Addr, ArbiterHandle, Recipient, WeakAddr};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::call_actor::{CallActor, CallSetup};
use super::decode_watch::DecodeWatch;
use super::messages::{FirstTokenLate, RelayLeg};
use super::proxy::limits::ProxyLimits;
use super::relay::RelayJudge;
use super::supervisor::Supervisor;
use super::telemetry::server::LoadedModel;
use super::telemetry::TelemetryPoller;
use crate::meter::calibration::CalibrationTable;
use crate::meter::normals::Normals;
use crate::model::{ApiKind, CallIdentity, SeenBy, Upstream};
use crate::tokens::TokenEstimator;

/// What the interceptors need from the engine: where to start call actors
/// and where to report. Shared by every route and by the capture.
pub struct EngineLink {
    pub supervisor: Addr<Supervisor>,
    pub notifier: Recipient<FirstTokenLate>,
    pub arbiters: Vec<ArbiterHandle>,
    pub next_arbiter: AtomicUsize,
    pub seq: AtomicU64,
    pub calibration: Arc<RwLock<CalibrationTable>>,
    pub estimator: Arc<dyn TokenEstimator>,
    /// The slow-first-token threshold in ms; settings may change it live.
    pub slow_ttft_ms: AtomicU64,
    /// Per-connection limits and the optional idle timeout.
    pub limits: ProxyLimits,
    /// Where the proxy reports the local address of each upstream
    /// connection it opens, once the capture runs: the capture ignores
    /// those connections, so a proxied call is recorded once (by the
    /// proxy). Unset, nothing is reported.
    pub own_connections: OnceLock<mpsc::UnboundedSender<OwnConnection>>,
    /// The proxy's live upstream connections: a request arriving over one
    /// of them has come back round to speedtap (a route loop) and is
    /// answered `508 Loop Detected` instead of being forwarded again.
    pub own_sockets: Arc<OwnSockets>,
    /// Every route's normals (usual TTFT, load time, prompt factor).
    pub normals: Arc<RwLock<Normals>>,
    /// Every route's usual decode rates and streaming calls (the
    /// slowdown rule).
    pub decode_watch: Arc<DecodeWatch>,
    /// Start a telemetry poller per route (off in tests that count the
    /// upstream's requests).
    pub telemetry: bool,
    /// The live telemetry poller of each (route, upstream base URL), held
    /// weakly: see [`EngineLink::telemetry_for`].
    pub pollers: Mutex<HashMap<(String, String), WeakAddr<TelemetryPoller>>>,
    /// The routes of the demo's traffic: their calls are marked `demo`
    /// (never stored in History, never notified).
    pub demo_routes: RwLock<HashSet<String>>,
    /// Who tells a relay's legs apart (see [`super::relay`]): set by the
    /// host while it follows the machine; unset, no call is a leg.
    pub relay_judge: RwLock<Option<Arc<dyn RelayJudge>>>,
}

/// One of the proxy's own upstream connections: its local address, and
/// when the connect returned (a SYN from that address captured later is a
/// new connection that merely reuses the port).
#[derive(Clone, Copy, Debug)]
pub struct OwnConnection {
    pub local: SocketAddr,
    pub at: Instant,
}

/// The proxy's upstream connections still open, each as its pair of
/// addresses (local, remote). A connection accepted on a route's listener
/// whose (peer, local) pair is one of them is the proxy talking to itself.
/// Pairs, not local addresses alone: Linux reuses an ephemeral port for
/// connections to different destinations, so a client elsewhere may share
/// a local port with one of ours, never the pair.
#[derive(Debug, Default)]
pub struct OwnSockets {
    live: Mutex<HashSet<(SocketAddr, SocketAddr)>>,
}

impl OwnSockets {
    /// Records an upstream connection from `local` to `remote` until the
    /// returned mark is dropped (with the connection it travels with).
    pub(crate) fn register(
        self: &Arc<Self>,
        local: SocketAddr,
        remote: SocketAddr,
    ) -> OwnSocketMark {
        let pair = (canonical(local), canonical(remote));
        self.lock().insert(pair);
        OwnSocketMark {
            sockets: self.clone(),
            pair,
        }
    }

    /// Whether a connection accepted from `peer` on `local` is one of the
    /// proxy's own upstream connections.
    pub(crate) fn is_own(&self, peer: SocketAddr, local: SocketAddr) -> bool {
        self.lock().contains(&(canonical(peer), canonical(local)))
    }

    /// How many upstream connections are open.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no upstream connection is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<(SocketAddr, SocketAddr)>> {
        self.live.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// An IPv4 peer seen by an IPv6 (`::`) listener reads `::ffff:a.b.c.d`; the
/// connection's own socket reads `a.b.c.d`.
fn canonical(addr: SocketAddr) -> SocketAddr {
    SocketAddr::new(addr.ip().to_canonical(), addr.port())
}

/// One registered upstream connection; dropping it forgets the connection.
#[derive(Debug)]
pub struct OwnSocketMark {
    sockets: Arc<OwnSockets>,
    pair: (SocketAddr, SocketAddr),
}

impl Drop for OwnSocketMark {
    fn drop(&mut self) {
        self.sockets.lock().remove(&self.pair);
    }
}

/// What differs between two calls as an interceptor starts one: the rest
/// of the call's setup comes from the [`EngineLink`].
pub(crate) struct CallStart {
    /// From [`EngineLink::next_seq`].
    pub seq: u64,
    /// The route's name, which the call is listed under.
    pub route: String,
    /// The API the request line names (never `Unknown` for a started call).
    pub api: ApiKind,
    /// When the request was seen, as the wall clock says.
    pub started_at: SystemTime,
    pub method: String,
    pub path: String,
    /// When the request went (or was seen going) to the model server: the
    /// TTFT and the slow alarm count from here.
    pub dispatched_at: Instant,
    /// The app that made the call (from its User-Agent).
    pub client: Option<String>,
    /// Which interceptor saw the call.
    pub seen_by: SeenBy,
    /// The route's poller (shared by both interceptors, see
    /// [`EngineLink::telemetry_for`]): a call's wait is explained alike
    /// whichever interceptor saw it.
    pub telemetry: Option<Addr<TelemetryPoller>>,
    /// The connection's client and server addresses, where the
    /// interceptor saw them (the capture): how a relay's leg is told
    /// apart.
    pub peer: Option<(SocketAddr, SocketAddr)>,
}

impl CallStart {
    /// The call's identity as the API lists it; its model is learned later
    /// from the request body.
    pub(crate) fn identity(&self) -> CallIdentity {
        CallIdentity {
            id: call_id(self.seq),
            route: self.route.clone(),
            api: self.api,
            model: None,
            started_at: humantime::format_rfc3339_millis(self.started_at).to_string(),
            demo: false,
        }
    }
}

impl EngineLink {
    /// The next call's sequence number (shared by both interceptors, so
    /// ids stay unique).
    pub(crate) fn next_seq(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Starts the call actor for `call` on a metering arbiter (never on
    /// the interceptor's threads): the one place either interceptor starts
    /// a call, so both set calls up alike.
    pub(crate) fn start_call(&self, call: CallStart) -> Addr<CallActor> {
        let mut identity = call.identity();
        identity.demo = self.is_demo_route(&call.route);
        let setup = CallSetup {
            seq: call.seq,
            identity,
            method: call.method,
            path: call.path,
            dispatched_at: call.dispatched_at,
            slow_ttft: Duration::from_millis(self.slow_ttft_ms.load(Ordering::Relaxed)),
            estimator: self.estimator.clone(),
            calibration: self.calibration.clone(),
            supervisor: self.supervisor.clone(),
            notifier: self.notifier.clone(),
            client: call.client,
            seen_by: call.seen_by,
            normals: self.normals.clone(),
            decode_watch: self.decode_watch.clone(),
            telemetry: call.telemetry,
        };
        let peer = call.peer;
        let actor = CallActor::start_in_arbiter(self.arbiter(), move |_| CallActor::new(setup));
        if let Some((client, server)) = peer {
            self.judge_relay(&actor, client, server);
        }
        actor
    }

    /// Asks the relay judge, off the async threads (it reads `/proc`),
    /// whether `client` is a relay's end, and tells the call if so.
    fn judge_relay(&self, actor: &Addr<CallActor>, client: SocketAddr, server: SocketAddr) {
        let judge = self
            .relay_judge
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let (Some(judge), Ok(rt)) = (judge, tokio::runtime::Handle::try_current()) else {
            return;
        };
        let actor = actor.clone();
        rt.spawn_blocking(move || {
            if let Some(relay) = judge.relay_of(client, server) {
                actor.do_send(RelayLeg(relay));
            }
        });
    }

    /// Sets (or, with `None`, clears) who tells relays' legs apart.
    pub fn set_relay_judge(&self, judge: Option<Arc<dyn RelayJudge>>) {
        *self
            .relay_judge
            .write()
            .unwrap_or_else(PoisonError::into_inner) = judge;
    }

    /// Marks `route` as the demo's: its calls are demo calls from now on.
    pub fn mark_demo_route(&self, route: &str) {
        self.demo_routes
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(route.to_owned());
    }

    /// Whether `route` carries the demo's traffic.
    pub(crate) fn is_demo_route(&self, route: &str) -> bool {
        self.demo_routes
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(route)
    }

    /// The telemetry poller for `route`'s calls to `upstream`, started on
    /// first use: the proxy route and the capture, which may both see
    /// calls to the same server under the same route name, report them to
    /// one poller, so a call's queue position counts the calls ahead of it
    /// whichever interceptor saw them, and the server is asked once per
    /// look, not once per interceptor. Held weakly here: the poller stops
    /// when the last of its route's holders (the route's proxy, the
    /// capture task, a call still in flight) lets go. `None` with
    /// telemetry off.
    pub(crate) fn telemetry_for(
        &self,
        route: &str,
        upstream: &Upstream,
    ) -> Option<Addr<TelemetryPoller>> {
        if !self.telemetry {
            return None;
        }
        let mut pollers = self.pollers.lock().unwrap_or_else(PoisonError::into_inner);
        pollers.retain(|_, poller| poller.upgrade().is_some());
        let key = (route.to_owned(), upstream.base_url());
        if let Some(live) = pollers.get(&key).and_then(WeakAddr::upgrade) {
            return Some(live);
        }
        let (name, up, normals) = (route.to_owned(), upstream.clone(), self.normals.clone());
        // On a metering arbiter, off the proxy's threads.
        let poller = TelemetryPoller::start_in_arbiter(self.arbiter(), move |_| {
            TelemetryPoller::new(name, up, normals)
        });
        pollers.insert(key, poller.downgrade());
        Some(poller)
    }

    /// The models each live poller's server has loaded now, by route
    /// (Ollama `/api/ps`; see [`LoadedNow`](super::telemetry::LoadedNow)),
    /// in route order. A poller that stopped answering gives none.
    pub async fn loaded_models(&self) -> Vec<(String, Vec<LoadedModel>)> {
        let mut live: Vec<(String, Addr<TelemetryPoller>)> = {
            let pollers = self.pollers.lock().unwrap_or_else(PoisonError::into_inner);
            pollers
                .iter()
                .filter_map(|((route, _), poller)| Some((route.clone(), poller.upgrade()?)))
                .collect()
        };
        live.sort_by(|a, b| a.0.cmp(&b.0));
        let mut loaded = Vec::with_capacity(live.len());
        for (route, poller) in live {
            if let Ok(models) = poller.send(super::telemetry::LoadedNow).await {
                loaded.push((route, models));
            }
        }
        loaded
    }

    /// The metering arbiter for the next call actor, round robin.
    pub(crate) fn arbiter(&self) -> &ArbiterHandle {
        let i = self.next_arbiter.fetch_add(1, Ordering::Relaxed);
        &self.arbiters[i % self.arbiters.len()]
    }

    /// A link for unit tests: everything on the current arbiter, default
    /// limits, telemetry off, a 60 s slow threshold.
    #[cfg(test)]
    pub(crate) fn on_current_arbiter(
        supervisor: Addr<Supervisor>,
        notifier: Recipient<FirstTokenLate>,
        calibration: Arc<RwLock<CalibrationTable>>,
    ) -> Self {
        EngineLink {
            supervisor,
            notifier,
            arbiters: vec![actix::Arbiter::current()],
            next_arbiter: AtomicUsize::new(0),
            seq: AtomicU64::new(0),
            calibration,
            estimator: Arc::new(crate::tokens::WordCounter),
            slow_ttft_ms: AtomicU64::new(60_000),
            limits: ProxyLimits::default(),
            own_connections: OnceLock::new(),
            own_sockets: Default::default(),
            normals: Default::default(),
            decode_watch: Default::default(),
            telemetry: false,
            pollers: Default::default(),
            demo_routes: Default::default(),
            relay_judge: Default::default(),
        }
    }
}

/// The id a call is known by in the API: `c-000042`.
pub fn call_id(seq: u64) -> String {
    format!("c-{seq:06}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn an_own_connection_is_known_by_its_pair_until_its_mark_is_dropped() {
        let sockets = Arc::new(OwnSockets::default());
        let mark = sockets.register(at("127.0.0.1:40000"), at("127.0.0.1:9001"));
        assert!(sockets.is_own(at("127.0.0.1:40000"), at("127.0.0.1:9001")));
        // Seen by a `::` listener, the same peer reads as IPv4-mapped.
        assert!(sockets.is_own(
            at("[::ffff:127.0.0.1]:40000"),
            at("[::ffff:127.0.0.1]:9001")
        ));
        // The same local port towards another destination is someone else.
        assert!(!sockets.is_own(at("127.0.0.1:40000"), at("127.0.0.1:9002")));
        drop(mark);
        assert!(!sockets.is_own(at("127.0.0.1:40000"), at("127.0.0.1:9001")));
        assert!(sockets.is_empty());
    }
}
