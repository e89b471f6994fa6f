//! The capture interceptor: the second way calls reach the meter, beside
//! the [`proxy`](super::proxy); both start calls through the
//! [`link`](super::link). It reads the loopback traffic to the routes'
//! upstream ports (packets from [`crate::capture::source`]) and feeds the
//! very same [`CallActor`](crate::engine::call_actor::CallActor)s, with the
//! very same messages, as the proxy's taps do. Clients need no change:
//! they keep calling the model server's own port.
//!
//! One task ([`CaptureTask::run`]) owns the packet receiver and the
//! connection table ([`Flows`]): it parses each packet, feeds the table,
//! and turns the HTTP events that come out into actor messages
//! ([`exchange`]):
//! - a request head on a path the decoders know (`detect_request`, as the
//!   proxy) starts a call actor as the proxy does, with
//!   `EngineLink::start_call`, `seen_by: capture`, dispatched at the
//!   head's packet time;
//! - request body bytes go through the same streaming scanner as the
//!   proxy's (`RequestScanner`): `RequestFieldsSeen` each time a field is
//!   found;
//! - the response head becomes `ResponseStarted`, its content type decided
//!   by the proxy's own rule ([`crate::engine::http_meta::tap_content_type`]:
//!   encoded bodies are unmetered);
//! - each response body piece becomes a `Frame` stamped with its packet's
//!   monotonic instant, queued for the actor as the proxy's tap queues
//!   them (one wake-up for a burst, `FrameQueue`);
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
//!
//! Routes come and go while it runs, through a [`CaptureControl`]
//! ([`control`]): a server found after the start is captured with no
//! restart, and the helper's filter follows.
//!
//! This file holds the task and its packet loop (the clock, the ticks, the
//! proxy's own connections); [`exchange`] turns one connection's HTTP
//! events into its calls' messages.

mod control;
mod exchange;
#[cfg(test)]
mod lossy;
#[cfg(test)]
mod rig;
mod settle;
pub(crate) mod sniff;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use actix::Addr;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::link::{EngineLink, OwnConnection};
use super::messages::Discard;
use super::telemetry::TelemetryPoller;
use crate::capture::flows::{ConnId, Flows, ServerPort};
use crate::capture::packet::{self, LinkType};
use crate::capture::sockets::{ProcNetTcp, SocketTable};
use crate::capture::source::{CaptureSource, SourcePacket};
use crate::capture::Nanos;
use crate::model::Upstream;
pub use control::{Applied, CaptureControl, CaptureStopped, RouteChange, RouteChanges};
use exchange::Exchange;

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
/// How far behind the capture clock the engine may be and still count as
/// caught up (see [`CaptureTask::is_caught_up`]).
pub const LAG: Duration = Duration::from_millis(200);
/// How long a connection with a call in flight stays silent before the
/// kernel's socket table is asked whether it still exists (its FIN or RST
/// may have been dropped), and before a call whose end marker came is
/// settled without its transport's end. Also the least time between two
/// reads of the socket table.
pub const QUIET: Duration = Duration::from_secs(1);

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
    upstream: Upstream,
    telemetry: Option<Addr<TelemetryPoller>>,
    /// Removed: no new call starts; kept while its calls in flight settle.
    retiring: bool,
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
    /// Calls started since the task began.
    calls_started: u64,
    /// The kernel's sockets: whether a quiet connection still exists.
    sockets: Box<dyn SocketTable>,
    /// When the socket table was last read.
    sockets_read: Option<Instant>,
    /// Whether every packet received so far has been handled (none queued
    /// behind): only then is a quiet connection really quiet.
    caught_up: bool,
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
                        upstream: r.upstream.clone(),
                        telemetry: engine.telemetry_for(&r.name, &r.upstream),
                        retiring: false,
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
            calls_started: 0,
            sockets: Box::new(ProcNetTcp),
            sockets_read: None,
            caught_up: true,
            engine,
        }
    }

    /// Reads request heads of up to `bytes` (the proxy's `--max-head-kib`).
    pub fn with_max_request_head(mut self, bytes: usize) -> Self {
        self.flows.set_max_request_head(bytes);
        self
    }

    /// Reads whether connections still exist from `sockets` instead of the
    /// kernel's table (tests decide what the kernel says).
    pub fn with_socket_table(mut self, sockets: Box<dyn SocketTable>) -> Self {
        self.sockets = sockets;
        self
    }

    /// Runs until `stop` turns true or the packets end. `source`, when
    /// given, is polled for its loss counters (into `metrics`), told the
    /// ports as `changes` change the routes, and stopped (its helper
    /// killed) when the task ends.
    pub async fn run(
        mut self,
        mut packets: mpsc::Receiver<SourcePacket>,
        mut own: mpsc::UnboundedReceiver<OwnConnection>,
        mut changes: RouteChanges,
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
                Some((change, done)) = changes.rx.recv() => {
                    let ticket = self
                        .change_routes(change)
                        .and_then(|ports| set_ports(source.as_ref(), &ports));
                    if let Some(done) = done {
                        let _ = done.send(ticket);
                    }
                }
                p = packets.recv() => match p {
                    Some(p) => self.packet(p),
                    None => break,
                },
                () = &mut timer, if armed.is_some() => {
                    armed = None;
                    let now = Instant::now();
                    self.caught_up = self.is_caught_up(packets.is_empty(), now);
                    self.tick(now);
                    if self.settle_retired() {
                        set_ports(source.as_ref(), &self.capture_ports());
                    }
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
        if !self.exchanges.is_empty() || self.flows.has_holes() || self.has_retiring() {
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
        // Behind a backlog, time is what the packets handled say: a hole
        // whose filling packet waits in the queue is not given up, nor a
        // flow swept, for the engine's own delay.
        let now_ts = if self.caught_up {
            ts.saturating_add(now.saturating_duration_since(at).as_nanos() as u64)
        } else {
            ts
        };
        let mut events = self
            .flows
            .give_up_holes(now_ts, HOLE_WAIT.as_nanos() as u64);
        events.extend(self.flows.sweep(now_ts, IDLE.as_nanos() as u64));
        self.handle(events);
        self.settle_quiet(now, now_ts);
        if self.flows.is_empty() {
            self.client_closed.clear();
        }
    }

    /// Whether every packet captured so far has been handled at `now`:
    /// none waits in the queue, and packets handled since the last tick
    /// (if any) were captured less than [`LAG`] ago. A backlog (the helper
    /// or the pipe ahead of the engine in a burst) makes a flow look quiet
    /// while its last packets still wait to be read; the kernel's table,
    /// which is current, would then end it early.
    fn is_caught_up(&self, queue_empty: bool, now: Instant) -> bool {
        queue_empty
            && (!self.fresh_packets
                || self
                    .clock
                    .is_none_or(|(_, at)| now.saturating_duration_since(at) < LAG))
    }

    /// The monotonic instant of packet time `ns`.
    fn instant(&self, ns: Nanos) -> Instant {
        match self.clock {
            Some((ts, at)) if ns >= ts => at + Duration::from_nanos(ns - ts),
            Some((ts, at)) => at.checked_sub(Duration::from_nanos(ts - ns)).unwrap_or(at),
            None => Instant::now(),
        }
    }

    /// Exchanges being metered now.
    pub fn open_calls(&self) -> usize {
        self.exchanges.len()
    }

    /// Calls started since the task began.
    pub fn calls_started(&self) -> u64 {
        self.calls_started
    }
}

/// Tells the helper the new port set; the ticket to wait for. A failure
/// is logged, never the engine's: the capture goes on with the ports it
/// had (its end, if the helper died, shows as the packets' end).
fn set_ports(source: Option<&CaptureSource>, ports: &[u16]) -> control::Ticket {
    let source = source?;
    match source.set_ports(ports) {
        Ok(ticket) => Some((ticket, source.applied())),
        Err(e) => {
            tracing::warn!("capture: {e}");
            None
        }
    }
}

/// The task fed with hand-built packets (no socket): its own connections,
/// its own ports and its ticks.
#[cfg(test)]
mod tests {
    use super::rig::{head, lines, play, request, Rig, SERVER};
    use super::*;
    use crate::capture::flows::script::Talk;
    use crate::model::CallStatus;

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

    #[actix::test]
    async fn a_task_reading_a_backlog_is_not_caught_up_and_an_idle_one_is() {
        let mut rig = Rig::new().await;
        let mut talk = Talk::new("127.0.0.1:50007", SERVER, 1, 2);
        for seg in talk.handshake() {
            rig.feed(seg, 0);
        }
        let captured = rig.now();
        assert!(rig.task.is_caught_up(true, captured + LAG / 2));
        assert!(!rig.task.is_caught_up(false, captured), "packets queued");
        // Packets handled since the last tick were captured 2 s ago: the
        // engine reads a backlog.
        assert!(!rig.task.is_caught_up(true, captured + LAG * 10));
        // No packet since the last tick: quiet, not behind.
        rig.task.tick(captured + LAG * 10);
        assert!(rig.task.is_caught_up(true, captured + LAG * 20));
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
