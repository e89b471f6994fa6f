//! The capture interceptor: the second way calls reach the meter, beside
//! the [`proxy`](super::proxy). It reads the loopback traffic to the
//! routes' upstream ports (packets from [`crate::capture::source`]) and
//! feeds the very same [`CallActor`]s, with the very same messages, as the
//! proxy's taps do. Clients need no change: they keep calling the model
//! server's own port.
//!
//! One task ([`CaptureTask::run`]) owns the packet receiver and the
//! connection table ([`Flows`]): it parses each packet, feeds the table,
//! and turns the HTTP events that come out into actor messages:
//! - a request head on a path the decoders know ([`detect_request`], as
//!   the proxy) starts a call actor with the same [`CallSetup`] the proxy
//!   builds, `seen_by: capture`, dispatched at the head's packet time;
//! - request body bytes go through the same streaming scanner as the
//!   proxy's ([`RequestScanner`]): `RequestFieldsSeen` each time a field is
//!   found;
//! - the response head becomes `ResponseStarted`, its content type decided
//!   by the proxy's own rule ([`headers::tap_content_type`]: encoded bodies
//!   are unmetered);
//! - each response body piece becomes a `Frame` stamped with its packet's
//!   monotonic instant, queued for the actor as the proxy's tap queues
//!   them (one wake-up for a burst, [`FrameQueue`]);
//! - the end: a complete body is `Complete`; one cut after the client
//!   closed or reset its side is `ClientGone` (the proxy's hung-up client);
//!   any other cut is `UpstreamCut`. Lost bytes send `CaptureGap` first.
//!
//! Exchanges on paths the decoders don't know are not recorded (the proxy
//! lists them `unmetered`): the capture sees every health check and model
//! listing on the port, and listing those would bury the calls.
//!
//! Never twice: the proxy reports each upstream connection it opens
//! ([`OwnConnection`]) before it writes the request; the task then ignores
//! that address. Connections the table already tracked (it read the SYN
//! first) are dropped by [`Flows::ignore`], and any actor started for them
//! is discarded without a record. Segments to or from one of speedtap's
//! own listen ports are skipped too.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use actix::{Actor, Addr};
use http::{header, HeaderMap, HeaderValue};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::call_actor::{CallActor, CallSetup};
use super::messages::{
    BodyEnded, CaptureGap, Discard, Frame, FrameQueue, FramesQueued, RequestFieldsSeen,
    ResponseStarted,
};
use super::proxy::{call_id, headers, EngineLink, OwnConnection};
use super::telemetry::TelemetryPoller;
use crate::capture::flows::{CaptureEvent, ConnId, Flows, ServerPort};
use crate::capture::http1::{Event, Headers};
use crate::capture::packet::{self, LinkType};
use crate::capture::source::{CaptureSource, SourcePacket};
use crate::capture::Nanos;
use crate::decode::detect::detect_request;
use crate::decode::request_fields::RequestScanner;
use crate::metering::StreamEnd;
use crate::model::{ApiKind, CallIdentity, SeenBy, Upstream};

/// How often holes are given up and the source's loss counters read while
/// there is something to do: a call in flight or a hole holding data back.
pub const TICK: Duration = Duration::from_millis(100);
/// How long after the last packet the loss counters are read once more:
/// the helper sends its counters once a second while packets flow, so the
/// last ones come up to a second after the last packet.
pub const SETTLE: Duration = Duration::from_secs(2);
/// How often idle connections are swept while some are open but quiet (a
/// client's keep-alive connection): rare, as [`IDLE`] is long.
pub const SWEEP_EVERY: Duration = Duration::from_secs(30);
/// How long a hole may hold back the data behind it before it is reported
/// as lost: a loopback retransmission comes within a few hundred ms.
pub const HOLE_WAIT: Duration = Duration::from_millis(500);
/// A connection silent this long is ended (its exchanges incomplete).
pub const IDLE: Duration = Duration::from_secs(600);

/// The delay to (re)arm the tick with, if it must be: when it is not armed
/// and one is wanted, or when a shorter one is wanted than it was armed
/// with (a call starting while only the 30 s sweep was armed must not wait
/// for it to give up a hole). Otherwise the armed deadline stands, so a
/// stream of packets doesn't push it back.
fn rearm(armed: Option<Duration>, wanted: Option<Duration>) -> Option<Duration> {
    match (armed, wanted) {
        (None, Some(w)) => Some(w),
        (Some(a), Some(w)) if w < a => Some(w),
        _ => None,
    }
}

/// A route as the capture sees it: its name, its upstream's port, and the
/// upstream itself (where its telemetry poller asks).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaptureRoute {
    pub name: String,
    pub port: u16,
    pub upstream: Upstream,
}

/// What the task keeps of a route: the name its calls are recorded under
/// and the poller that explains their waits (`None` with telemetry off).
struct RouteEntry {
    name: String,
    telemetry: Option<Addr<TelemetryPoller>>,
}

/// One HTTP exchange being metered.
struct Exchange {
    actor: Addr<CallActor>,
    scanner: RequestScanner,
    /// Its response frames on their way to the actor: queued like the
    /// proxy tap's, so a burst of packets wakes the actor once, not once
    /// per packet (see [`FrameQueue`]).
    frames: Arc<FrameQueue>,
}

/// The task's state: the connection table and the calls it feeds.
pub struct CaptureTask {
    flows: Flows,
    link: LinkType,
    engine: Arc<EngineLink>,
    /// The routes by upstream port.
    routes: HashMap<u16, RouteEntry>,
    /// speedtap's own listen ports: never captured.
    own_ports: HashSet<u16>,
    exchanges: HashMap<(ConnId, u64), Exchange>,
    /// Connections whose client sent a FIN or RST, by (client, server).
    client_closed: HashSet<(SocketAddr, SocketAddr)>,
    /// The proxy's own upstream sockets, with when their connect returned.
    own_connections: HashMap<SocketAddr, Instant>,
    /// The latest packet's capture time and monotonic instant: maps the
    /// core's packet clock onto the engine's.
    clock: Option<(Nanos, Instant)>,
    /// Packets lost so far, as last added to the metrics.
    lost_reported: u64,
    /// Whether a packet came since the last tick.
    fresh_packets: bool,
}

impl CaptureTask {
    /// A task for `routes`, reading packets of link type `link`, skipping
    /// `own_ports` (the proxy's listen ports).
    pub fn new(
        engine: Arc<EngineLink>,
        routes: &[CaptureRoute],
        own_ports: impl IntoIterator<Item = u16>,
        link: LinkType,
    ) -> Self {
        CaptureTask {
            flows: Flows::new(routes.iter().map(|r| ServerPort::any(r.port))),
            link,
            routes: routes
                .iter()
                .map(|r| {
                    let entry = RouteEntry {
                        name: r.name.clone(),
                        telemetry: engine.telemetry_for(&r.name, &r.upstream),
                    };
                    (r.port, entry)
                })
                .collect(),
            own_ports: own_ports.into_iter().collect(),
            exchanges: HashMap::new(),
            client_closed: HashSet::new(),
            own_connections: HashMap::new(),
            clock: None,
            lost_reported: 0,
            fresh_packets: false,
            engine,
        }
    }

    /// Runs until `stop` turns true or the packets end. `source`, when
    /// given, is polled for its loss counters (into `metrics`) and stopped
    /// (its helper killed) when the task ends.
    pub async fn run(
        mut self,
        mut packets: mpsc::Receiver<SourcePacket>,
        mut own: mpsc::UnboundedReceiver<OwnConnection>,
        mut stop: watch::Receiver<bool>,
        source: Option<CaptureSource>,
        metrics: Arc<crate::engine::metrics::Metrics>,
    ) {
        // The tick is armed only when there is something for it to do
        // ([`CaptureTask::next_tick`]): an idle tray app with capture on
        // wakes for nothing. `armed` is the delay it was armed with.
        let timer = tokio::time::sleep(TICK);
        tokio::pin!(timer);
        let mut armed: Option<Duration> = None;
        loop {
            if let Some(after) = rearm(armed, self.next_tick()) {
                timer.as_mut().reset(Instant::now() + after);
                armed = Some(after);
            }
            // Biased: an own connection is registered before any packet
            // still queued behind it is looked at.
            tokio::select! {
                biased;
                _ = stop.wait_for(|s| *s) => break,
                Some(conn) = own.recv() => self.own_connection(conn),
                p = packets.recv() => match p {
                    Some(p) => self.packet(p),
                    None => break,
                },
                () = &mut timer, if armed.is_some() => {
                    armed = None;
                    self.tick(Instant::now());
                    if let Some(source) = &source {
                        let lost = source.stats().lost();
                        metrics.add_capture_dropped(lost.saturating_sub(self.lost_reported));
                        self.lost_reported = lost.max(self.lost_reported);
                    }
                }
            }
        }
        if let Some(source) = source {
            let _ = tokio::task::spawn_blocking(move || source.stop()).await;
        }
        // Calls still open settle themselves (as abandoned) once their
        // actors notice every address is gone.
    }

    /// The proxy opened an upstream connection from `conn.local`: ignore
    /// it, and drop whatever was started for it already.
    pub fn own_connection(&mut self, conn: OwnConnection) {
        self.own_connections.insert(conn.local, conn.at);
        for id in self.flows.ignore(conn.local) {
            let started: Vec<_> = self
                .exchanges
                .keys()
                .filter(|(c, _)| *c == id)
                .copied()
                .collect();
            for key in started {
                if let Some(ex) = self.exchanges.remove(&key) {
                    ex.actor.do_send(Discard);
                }
            }
        }
    }

    /// One captured packet.
    pub fn packet(&mut self, p: SourcePacket) {
        self.fresh_packets = true;
        let Some(seg) = packet::parse(self.link, &p.packet.data) else {
            return;
        };
        let ts = p.packet.ts_ns;
        self.clock = Some((ts, p.at));
        if self.own_ports.contains(&seg.src.port()) || self.own_ports.contains(&seg.dst.port()) {
            return;
        }
        let from_client = self.routes.contains_key(&seg.dst.port());
        if from_client {
            let pair = (seg.src, seg.dst);
            if seg.flags.syn && !seg.flags.ack {
                self.client_closed.remove(&pair);
                // A SYN from a socket the proxy reported earlier is a new
                // connection reusing the port, not the proxy's.
                if self
                    .own_connections
                    .get(&seg.src)
                    .is_some_and(|reported| p.at > *reported)
                {
                    self.own_connections.remove(&seg.src);
                    self.flows.unignore(seg.src);
                }
            }
            if seg.flags.fin || seg.flags.rst {
                self.client_closed.insert(pair);
            }
        }
        let events = self.flows.feed(seg, ts);
        self.handle(events);
    }

    /// How long until the next tick is needed, if one is: every [`TICK`]
    /// while a call is in flight or a hole holds data back; [`SETTLE`]
    /// after the last packets, to read the loss counters that follow them;
    /// every [`SWEEP_EVERY`] while quiet connections stay open; never when
    /// no connection is open.
    pub fn next_tick(&self) -> Option<Duration> {
        if !self.exchanges.is_empty() || self.flows.has_holes() {
            Some(TICK)
        } else if self.fresh_packets {
            Some(SETTLE)
        } else if !self.flows.is_empty() {
            Some(SWEEP_EVERY)
        } else {
            None
        }
    }

    /// Gives up old holes and sweeps idle connections, at `now`.
    pub fn tick(&mut self, now: Instant) {
        self.fresh_packets = false;
        let Some((ts, at)) = self.clock else {
            return;
        };
        let now_ts = ts.saturating_add(now.saturating_duration_since(at).as_nanos() as u64);
        let mut events = self
            .flows
            .give_up_holes(now_ts, HOLE_WAIT.as_nanos() as u64);
        events.extend(self.flows.sweep(now_ts, IDLE.as_nanos() as u64));
        self.handle(events);
        if self.flows.is_empty() {
            self.client_closed.clear();
        }
    }

    /// The monotonic instant of packet time `ns`.
    fn instant(&self, ns: Nanos) -> Instant {
        match self.clock {
            Some((ts, at)) if ns >= ts => at + Duration::from_nanos(ns - ts),
            Some((ts, at)) => at.checked_sub(Duration::from_nanos(ts - ns)).unwrap_or(at),
            None => Instant::now(),
        }
    }

    fn handle(&mut self, events: Vec<CaptureEvent>) {
        for ev in events {
            let at = self.instant(ev.at);
            self.event(ev.conn, ev.event, at);
        }
    }

    fn event(&mut self, conn: ConnId, event: Event, at: Instant) {
        match event {
            Event::RequestHead {
                exchange,
                method,
                path,
                headers,
            } => self.start_call(conn, exchange, &method, &path, &headers, at),
            Event::RequestBody { exchange, bytes } => {
                if let Some(ex) = self.exchanges.get_mut(&(conn, exchange)) {
                    if !ex.scanner.is_finished() && ex.scanner.feed(&bytes) {
                        ex.actor
                            .do_send(RequestFieldsSeen(ex.scanner.fields().clone()));
                    }
                }
            }
            Event::RequestEnd { .. } => {}
            Event::ResponseHead {
                exchange,
                status,
                headers,
            } => {
                if let Some(ex) = self.exchanges.get(&(conn, exchange)) {
                    ex.actor.do_send(ResponseStarted {
                        status,
                        content_type: tap_content_type(&headers),
                        at,
                    });
                }
            }
            Event::ResponseBody { exchange, bytes } => {
                if let Some(ex) = self.exchanges.get(&(conn, exchange)) {
                    if ex.frames.push(Frame { bytes, at }) {
                        ex.actor.do_send(FramesQueued(ex.frames.clone()));
                    }
                }
            }
            Event::ResponseEnd {
                exchange,
                complete,
                gap,
            } => {
                if let Some(ex) = self.exchanges.remove(&(conn, exchange)) {
                    if gap {
                        ex.actor.do_send(CaptureGap);
                    }
                    let end = if complete {
                        StreamEnd::Complete
                    } else if self.client_closed.contains(&(conn.client, conn.server)) {
                        StreamEnd::ClientGone
                    } else {
                        StreamEnd::UpstreamCut
                    };
                    ex.actor.do_send(BodyEnded { end, at });
                }
            }
            Event::Gap {
                exchange: Some(exchange),
                ..
            } => {
                if let Some(ex) = self.exchanges.get(&(conn, exchange)) {
                    ex.actor.do_send(CaptureGap);
                }
            }
            Event::Gap { exchange: None, .. } => {}
        }
    }

    /// Starts a call actor for a request the decoders know, exactly as the
    /// proxy does (same setup, the route's name, `seen_by: capture`).
    fn start_call(
        &mut self,
        conn: ConnId,
        exchange: u64,
        method: &str,
        path: &str,
        headers: &Headers,
        at: Instant,
    ) {
        let api = detect_request(method, path, b"").api;
        if api == ApiKind::Unknown {
            return;
        }
        let Some(route) = self.routes.get(&conn.server.port()) else {
            return;
        };
        let link = &self.engine;
        let seq = link.next_seq();
        let identity = CallIdentity {
            id: call_id(seq),
            route: route.name.clone(),
            api,
            model: None,
            started_at: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
        };
        let setup = CallSetup {
            seq,
            identity,
            method: method.to_owned(),
            path: path.to_owned(),
            dispatched_at: at,
            slow_ttft: Duration::from_millis(link.slow_ttft_ms.load(Ordering::Relaxed)),
            estimator: link.estimator.clone(),
            calibration: link.calibration.clone(),
            supervisor: link.supervisor.clone(),
            notifier: link.notifier.clone(),
            client: headers
                .user_agent
                .as_deref()
                .and_then(super::details::client_app),
            seen_by: SeenBy::Capture,
            normals: link.normals.clone(),
            // The route's poller (shared with its proxy, if it has one):
            // a captured call's wait is explained like a proxied one's.
            telemetry: route.telemetry.clone(),
        };
        let actor = CallActor::start_in_arbiter(link.arbiter(), move |_| CallActor::new(setup));
        self.exchanges.insert(
            (conn, exchange),
            Exchange {
                actor,
                scanner: RequestScanner::default(),
                frames: Arc::default(),
            },
        );
    }

    /// Exchanges being metered now.
    pub fn open_calls(&self) -> usize {
        self.exchanges.len()
    }
}

/// The proxy's content-type rule ([`headers::tap_content_type`]) applied to
/// the captured header values: an encoded body reads as opaque bytes.
fn tap_content_type(h: &Headers) -> Option<String> {
    let mut map = HeaderMap::new();
    if let Some(v) = h
        .content_type
        .as_deref()
        .and_then(|v| HeaderValue::from_str(v).ok())
    {
        map.insert(header::CONTENT_TYPE, v);
    }
    if let Some(v) = h
        .content_encoding
        .as_deref()
        .and_then(|v| HeaderValue::from_str(v).ok())
    {
        map.insert(header::CONTENT_ENCODING, v);
    }
    headers::tap_content_type(&map)
}

/// The capture task fed with hand-built packets (no socket): the same
/// actors and supervisor as in the engine.
#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, AtomicUsize};
    use std::sync::RwLock;

    use actix::Arbiter;
    use bytes::Bytes;

    use super::*;
    use crate::capture::feed::CapturedPacket;
    use crate::capture::flows::script::Talk;
    use crate::capture::packet::{build, Segment};
    use crate::engine::messages::Subscribe;
    use crate::engine::metrics::Metrics;
    use crate::engine::notifier::Notifier;
    use crate::engine::proxy::limits::ProxyLimits;
    use crate::engine::supervisor::Supervisor;
    use crate::meter::calibration::CalibrationTable;
    use crate::model::{Call, CallStatus, EngineEvent};
    use crate::tokens::WordCounter;

    const SERVER: &str = "127.0.0.1:11434";

    struct Rig {
        task: CaptureTask,
        events: mpsc::Receiver<EngineEvent>,
        base: Instant,
        ts: Nanos,
    }

    impl Rig {
        async fn new() -> Self {
            let calibration = Arc::new(RwLock::new(CalibrationTable::new()));
            let supervisor = Supervisor::new(calibration.clone(), Arc::new(Metrics::new())).start();
            let events = supervisor
                .send(Subscribe { capacity: 4_096 })
                .await
                .expect("supervisor");
            let notifier = Notifier::new(supervisor.clone().recipient(), Vec::new()).start();
            let link = Arc::new(EngineLink {
                supervisor,
                notifier: notifier.recipient(),
                arbiters: vec![Arbiter::current()],
                next_arbiter: AtomicUsize::new(0),
                seq: AtomicU64::new(0),
                calibration,
                estimator: Arc::new(WordCounter),
                slow_ttft_ms: AtomicU64::new(60_000),
                limits: ProxyLimits::default(),
                own_connections: std::sync::OnceLock::new(),
                normals: Default::default(),
                telemetry: false,
                pollers: Default::default(),
            });
            let routes = [CaptureRoute {
                name: "ollama".into(),
                port: 11434,
                upstream: Upstream::parse("http://127.0.0.1:11434").expect("upstream"),
            }];
            Rig {
                task: CaptureTask::new(link, &routes, [11435], LinkType::Ethernet),
                events,
                base: Instant::now(),
                ts: 1_000_000_000,
            }
        }

        /// Feeds one segment captured `after_ms` after the previous one.
        fn feed(&mut self, seg: Segment, after_ms: u64) {
            self.ts += after_ms * 1_000_000;
            let data: Bytes = build::ethernet(&seg);
            self.task.packet(SourcePacket {
                at: self.base + Duration::from_nanos(self.ts),
                packet: CapturedPacket {
                    ts_ns: self.ts,
                    orig_len: data.len() as u32,
                    data,
                },
            });
        }

        /// The next settled call, within a few seconds.
        async fn settled(&mut self) -> Call {
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                match tokio::time::timeout(left, self.events.recv()).await {
                    Ok(Some(EngineEvent::Settled(call))) => return call,
                    Ok(Some(_)) => {}
                    _ => panic!("no call settled"),
                }
            }
        }
    }

    const REQUEST_BODY: &str = r#"{"model":"m","prompt":"hi","stream":true}"#;

    fn request() -> Vec<u8> {
        format!(
            "POST /api/generate HTTP/1.1\r\nHost: 127.0.0.1:11434\r\nUser-Agent: curl/8.5\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{REQUEST_BODY}",
            REQUEST_BODY.len()
        )
        .into_bytes()
    }

    /// Thirty NDJSON lines of one word each (enough for a settled rate), then the final line with the
    /// server's counts.
    fn lines() -> Vec<String> {
        let mut lines: Vec<String> = (0..30)
            .map(|i| format!("{{\"model\":\"m\",\"response\":\" w{i}\",\"done\":false}}\n"))
            .collect();
        lines.push(
            "{\"model\":\"m\",\"response\":\"\",\"done\":true,\"prompt_eval_count\":7,\"eval_count\":30}\n"
                .into(),
        );
        lines
    }

    fn head(body_len: usize) -> Vec<u8> {
        format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nContent-Length: {body_len}\r\n\r\n"
        )
        .into_bytes()
    }

    /// Plays one call; the response line at `lose` (if any) is never
    /// captured.
    async fn play(rig: &mut Rig, client: &str, lose: Option<usize>) {
        let mut talk = Talk::new(client, SERVER, 7_000, 90_000);
        for seg in talk.handshake() {
            rig.feed(seg, 0);
        }
        let seg = talk.client(&request());
        rig.feed(seg, 1);
        let lines = lines();
        let len = lines.iter().map(String::len).sum();
        let seg = talk.server(&head(len));
        rig.feed(seg, 100);
        for (i, line) in lines.iter().enumerate() {
            let seg = talk.server(line.as_bytes());
            if lose != Some(i) {
                rig.feed(seg, 50);
            }
        }
        let seg = talk.fin(false);
        rig.feed(seg, 1);
        let seg = talk.fin(true);
        rig.feed(seg, 1);
    }

    #[actix::test]
    async fn a_clean_captured_call_is_metered_like_a_proxied_one_and_says_capture() {
        let mut rig = Rig::new().await;
        play(&mut rig, "127.0.0.1:50000", None).await;
        let call = rig.settled().await;
        assert_eq!(call.status, CallStatus::Ok, "{call:?}");
        assert_eq!(call.identity.route, "ollama");
        assert_eq!(call.identity.model.as_deref(), Some("m"));
        assert_eq!(call.identity.api, ApiKind::OllamaGenerate);
        assert_eq!(call.details.seen_by, SeenBy::Capture);
        assert_eq!(call.details.client.as_deref(), Some("curl"));
        assert!(!call.details.capture_gap);
        let speed = call.speed.expect("a snapshot");
        // Head 101 ms after the request, first line 50 ms later.
        assert_eq!(speed.time_to_first_token_ms, Some(150));
        assert_eq!(speed.output_tokens, 30);
        // 29 tokens after the first over 29 × 50 ms.
        assert_eq!(speed.output_tokens_per_second, Some(20.0));
    }

    #[actix::test]
    async fn a_lost_segment_flags_the_call_capture_gap_keeps_the_counts_and_shows_no_rate() {
        let mut rig = Rig::new().await;
        play(&mut rig, "127.0.0.1:50001", Some(4)).await;
        // The hole is given up after HOLE_WAIT.
        let later = rig.base + Duration::from_nanos(rig.ts) + HOLE_WAIT * 2;
        rig.task.tick(later);
        let call = rig.settled().await;
        assert!(call.details.capture_gap, "{call:?}");
        assert_eq!(call.details.seen_by, SeenBy::Capture);
        let speed = call.speed.expect("a snapshot");
        assert_eq!(speed.output_tokens_per_second, None);
        assert_eq!(speed.output_tokens, 30, "the server's count is kept");
        assert_eq!(call.input_tokens, Some(7));
    }

    #[actix::test]
    async fn the_proxys_own_upstream_connection_is_never_recorded() {
        let mut rig = Rig::new().await;
        let client: SocketAddr = "127.0.0.1:50002".parse().expect("addr");
        // The capture read the SYN and the request before the report came.
        let mut talk = Talk::new("127.0.0.1:50002", SERVER, 1, 2);
        for seg in talk.handshake() {
            rig.feed(seg, 0);
        }
        let seg = talk.client(&request());
        rig.feed(seg, 1);
        assert_eq!(rig.task.open_calls(), 1);
        rig.task.own_connection(OwnConnection {
            local: client,
            at: rig.base + Duration::from_nanos(rig.ts),
        });
        assert_eq!(rig.task.open_calls(), 0);
        let seg = talk.server(&head(3));
        rig.feed(seg, 10);
        assert_eq!(rig.task.open_calls(), 0);
        // A later, unrelated call is still recorded, once.
        play(&mut rig, "127.0.0.1:50003", None).await;
        let call = rig.settled().await;
        assert_eq!(call.identity.id, "c-000002", "{call:?}");
        assert_eq!(call.status, CallStatus::Ok);
    }

    #[actix::test]
    async fn traffic_on_speedtaps_own_listen_port_is_skipped() {
        let mut rig = Rig::new().await;
        let mut talk = Talk::new("127.0.0.1:50004", "127.0.0.1:11435", 1, 2);
        for seg in talk.handshake() {
            rig.feed(seg, 0);
        }
        let seg = talk.client(&request());
        rig.feed(seg, 1);
        assert_eq!(rig.task.open_calls(), 0);
    }

    #[test]
    fn the_tick_is_rearmed_only_when_unarmed_or_when_sooner_is_wanted() {
        assert_eq!(rearm(None, None), None);
        assert_eq!(rearm(None, Some(SETTLE)), Some(SETTLE));
        // A call starts while only the sweep is armed: the sweep gives way.
        assert_eq!(rearm(Some(SWEEP_EVERY), Some(TICK)), Some(TICK));
        // Packets keep coming at TICK: the armed deadline stands.
        assert_eq!(rearm(Some(TICK), Some(TICK)), None);
        assert_eq!(rearm(Some(TICK), Some(SWEEP_EVERY)), None);
        assert_eq!(rearm(Some(SETTLE), None), None);
    }

    #[actix::test]
    async fn the_tick_is_armed_only_while_there_is_work_for_it() {
        let mut rig = Rig::new().await;
        assert_eq!(rig.task.next_tick(), None, "nothing captured yet");

        // A call in flight: every TICK.
        let mut talk = Talk::new("127.0.0.1:50005", SERVER, 1, 2);
        for seg in talk.handshake() {
            rig.feed(seg, 0);
        }
        let seg = talk.client(&request());
        rig.feed(seg, 1);
        assert_eq!(rig.task.next_tick(), Some(TICK), "a call in flight");

        // It completes on a keep-alive connection: once more after SETTLE
        // for the loss counters, then only the rare sweep.
        let lines = lines();
        let len = lines.iter().map(String::len).sum();
        let seg = talk.server(&head(len));
        rig.feed(seg, 10);
        for line in &lines {
            let seg = talk.server(line.as_bytes());
            rig.feed(seg, 1);
        }
        rig.settled().await;
        assert_eq!(rig.task.next_tick(), Some(SETTLE), "packets just came");
        let now = rig.base + Duration::from_nanos(rig.ts);
        rig.task.tick(now + SETTLE);
        assert_eq!(
            rig.task.next_tick(),
            Some(SWEEP_EVERY),
            "a quiet open connection"
        );

        // The connection closes: nothing left to tick for.
        let seg = talk.fin(false);
        rig.feed(seg, 1);
        let seg = talk.fin(true);
        rig.feed(seg, 1);
        let now = rig.base + Duration::from_nanos(rig.ts);
        rig.task.tick(now + SETTLE);
        assert_eq!(rig.task.next_tick(), None, "no connection open");

        // A lost segment holds the data behind it: every TICK until given up.
        play(&mut rig, "127.0.0.1:50006", Some(4)).await;
        assert!(rig.task.flows.has_holes());
        assert_eq!(rig.task.next_tick(), Some(TICK), "a hole to give up");
    }
}
