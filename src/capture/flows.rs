//! The connection table: captured segments in, HTTP events per connection
//! out.
//!
//! The capture filter lets through the traffic of the model servers'
//! ports; [`Flows`] decides which side of each connection is the server
//! (the side whose address matches a configured [`ServerPort`]), keeps one
//! [`Reassembler`] per direction and one [`Http1Conn`] per connection, and
//! labels what comes out with a [`ConnId`]. Connections end on a FIN each
//! way or a RST; the engine sweeps idle ones and gives up holes on its own
//! timer ([`Flows::sweep`], [`Flows::give_up_holes`]), since this core
//! reads no clock.
//!
//! Speedtap's own proxy talks to the same servers: its upstream sockets
//! are registered with [`Flows::ignore`] so a proxied call is not also
//! recorded by capture.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};

use super::http1::{Event, Http1Conn, Timed, DEFAULT_MAX_REQUEST_HEAD};
use super::packet::Segment;
use super::reassembly::{Delivery, Reassembler, DEFAULT_HELD_CAP};
use super::Nanos;

/// A server endpoint to capture: a port, on one address or on any.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ServerPort {
    /// `None` matches the port on every address (127.0.0.1, ::1, ...).
    pub ip: Option<IpAddr>,
    pub port: u16,
}

impl ServerPort {
    /// The port on every address.
    pub fn any(port: u16) -> Self {
        ServerPort { ip: None, port }
    }

    fn matches(&self, addr: SocketAddr) -> bool {
        self.port == addr.port() && self.ip.is_none_or(|ip| ip == addr.ip())
    }
}

/// One captured connection, as events name it. `serial` tells apart two
/// connections that reused the same address pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConnId {
    pub serial: u64,
    pub client: SocketAddr,
    pub server: SocketAddr,
}

/// An HTTP event of one connection, with the capture timestamp of the
/// packet that completed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaptureEvent {
    pub conn: ConnId,
    pub at: Nanos,
    pub event: Event,
}

/// Bounds on what the table holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections tracked at once; segments opening more are dropped
    /// (and counted), so a connection flood cannot grow memory unbounded.
    pub max_conns: usize,
    /// Out-of-order bytes held per direction before a hole is given up.
    pub held_cap: usize,
    /// The most bytes one request head may take (the proxy's
    /// `--max-head-kib`): a longer one is not parsed.
    pub max_request_head: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_conns: 4096,
            held_cap: DEFAULT_HELD_CAP,
            max_request_head: DEFAULT_MAX_REQUEST_HEAD,
        }
    }
}

/// Counts for `/metrics` and the stats.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowStats {
    /// Connections not tracked because the table was full.
    pub conns_refused: u64,
    /// Connections found not to speak HTTP/1.x.
    pub not_http: u64,
    /// Holes skipped, and the bytes they lost.
    pub gaps: u64,
    pub missing_bytes: u64,
}

struct Conn {
    id: ConnId,
    to_server: Reassembler,
    to_client: Reassembler,
    http: Http1Conn,
    last_seen: Nanos,
    /// The client's SYN sequence number, to tell a retransmitted SYN from
    /// a new connection on the same address pair.
    client_isn: Option<u32>,
    /// FINs seen by flag, for connections no longer parsed (not HTTP,
    /// upgraded), which skip reassembly.
    fin_from_client: bool,
    fin_from_server: bool,
}

/// The table of captured connections to the configured server ports.
pub struct Flows {
    ports: Vec<ServerPort>,
    limits: Limits,
    conns: HashMap<(SocketAddr, SocketAddr), Conn>,
    ignored: HashSet<SocketAddr>,
    next_serial: u64,
    stats: FlowStats,
    deliveries: Vec<Delivery>,
    timed: Vec<Timed>,
}

impl Flows {
    /// A table for connections to `ports`, with default [`Limits`].
    pub fn new(ports: impl IntoIterator<Item = ServerPort>) -> Self {
        Flows::with_limits(ports, Limits::default())
    }

    pub fn with_limits(ports: impl IntoIterator<Item = ServerPort>, limits: Limits) -> Self {
        Flows {
            ports: ports.into_iter().collect(),
            limits,
            conns: HashMap::new(),
            ignored: HashSet::new(),
            next_serial: 0,
            stats: FlowStats::default(),
            deliveries: Vec::new(),
            timed: Vec::new(),
        }
    }

    /// Connections tracked now.
    pub fn len(&self) -> usize {
        self.conns.len()
    }

    pub fn is_empty(&self) -> bool {
        self.conns.is_empty()
    }

    pub fn stats(&self) -> FlowStats {
        self.stats
    }

    /// Whether any direction of any connection holds data back behind a
    /// hole (so [`Flows::give_up_holes`] has work to do soon).
    pub fn has_holes(&self) -> bool {
        self.conns
            .values()
            .any(|c| c.to_server.hole_since().is_some() || c.to_client.hole_since().is_some())
    }

    /// Ignores every segment to or from `addr` (exact address and port):
    /// the engine registers its own proxy's upstream sockets, before they
    /// connect, so proxied calls are recorded once. A connection already
    /// tracked with that address (the capture read its SYN before the
    /// engine learned the socket's address) is dropped without events;
    /// its id is returned so the engine can drop what it started for it.
    pub fn ignore(&mut self, addr: SocketAddr) -> Vec<ConnId> {
        self.ignored.insert(addr);
        let mut dropped = Vec::new();
        self.conns.retain(|_, c| {
            let keep = c.id.client != addr && c.id.server != addr;
            if !keep {
                dropped.push(c.id);
            }
            keep
        });
        dropped
    }

    /// Takes request heads of up to `bytes` on connections opened from now
    /// on (the proxy's configured cap).
    pub fn set_max_request_head(&mut self, bytes: usize) {
        self.limits.max_request_head = bytes;
    }

    /// Tracks new connections to `port` too (a route added while running).
    pub fn add_port(&mut self, port: ServerPort) {
        if !self.ports.contains(&port) {
            self.ports.push(port);
        }
    }

    /// Opens no new connection to `port` (on any address) any more; those
    /// tracked go on to their end.
    pub fn remove_port(&mut self, port: u16) {
        self.ports.retain(|p| p.port != port);
    }

    /// Drops the tracked connections `which` selects, without events (the
    /// engine has nothing in flight on them).
    pub fn forget(&mut self, which: impl Fn(ConnId) -> bool) {
        self.conns.retain(|_, c| !which(c.id));
    }

    /// Stops ignoring `addr` (its socket closed; the port may be reused).
    pub fn unignore(&mut self, addr: SocketAddr) {
        self.ignored.remove(&addr);
    }

    /// Takes one captured segment and returns the HTTP events it
    /// completes, in order.
    pub fn feed(&mut self, seg: Segment, at: Nanos) -> Vec<CaptureEvent> {
        if self.ignored.contains(&seg.src) || self.ignored.contains(&seg.dst) {
            return Vec::new();
        }
        let Some((key, from_client)) = self.route(&seg) else {
            return Vec::new();
        };
        let is_client_syn = from_client && seg.flags.syn && !seg.flags.ack;
        let mut events = Vec::new();
        // A new SYN on a tracked pair: a retransmission, or the pair was
        // reused by a new connection (the old one ends here).
        if is_client_syn {
            if let Some(old) = self.conns.get(&key) {
                if old.client_isn != Some(seg.seq) {
                    self.end_conn(key, at, &mut events);
                }
            }
        }
        if !self.conns.contains_key(&key) {
            // Pure ACKs, FINs and RSTs of a connection we do not track
            // (ended, or never seen) open nothing.
            if seg.flags.rst || (!seg.flags.syn && seg.payload.is_empty()) {
                return events;
            }
            if self.conns.len() >= self.limits.max_conns {
                self.stats.conns_refused += 1;
                return events;
            }
            let id = ConnId {
                serial: self.next_serial,
                client: key.0,
                server: key.1,
            };
            self.next_serial += 1;
            let conn = Conn {
                id,
                to_server: Reassembler::new(self.limits.held_cap),
                to_client: Reassembler::new(self.limits.held_cap),
                http: Http1Conn::new(!is_client_syn)
                    .with_max_request_head(self.limits.max_request_head),
                last_seen: at,
                client_isn: is_client_syn.then_some(seg.seq),
                fin_from_client: false,
                fin_from_server: false,
            };
            self.conns.insert(key, conn);
        }
        let Some(conn) = self.conns.get_mut(&key) else {
            return events;
        };
        conn.last_seen = at;
        if seg.flags.fin {
            if from_client {
                conn.fin_from_client = true;
            } else {
                conn.fin_from_server = true;
            }
        }
        if conn.http.is_done() {
            // Not parsed any more: only its end matters.
            if seg.flags.rst || (conn.fin_from_client && conn.fin_from_server) {
                self.conns.remove(&key);
            }
            return events;
        }
        let (dir, peer) = if from_client {
            (&mut conn.to_server, &mut conn.to_client)
        } else {
            (&mut conn.to_client, &mut conn.to_server)
        };
        // What this side acknowledges tells how far the other side's
        // stream went, lost tail included.
        if seg.flags.ack && !seg.flags.rst {
            peer.peer_acked(seg.ack, at);
        }
        dir.push(seg.seq, seg.flags, seg.payload, at, &mut self.deliveries);
        self.deliver(key, from_client, &mut events);
        events
    }

    /// Ends connections silent for at least `idle` (their exchanges end
    /// incomplete) and returns those events.
    pub fn sweep(&mut self, now: Nanos, idle: Nanos) -> Vec<CaptureEvent> {
        let stale: Vec<_> = self
            .conns
            .iter()
            .filter(|(_, c)| now.saturating_sub(c.last_seen) >= idle)
            .map(|(k, _)| *k)
            .collect();
        let mut events = Vec::new();
        for key in stale {
            self.end_conn(key, now, &mut events);
        }
        events
    }

    /// The connections silent for at least `quiet` at `now`.
    pub fn quiet(&self, now: Nanos, quiet: Nanos) -> Vec<ConnId> {
        self.conns
            .values()
            .filter(|c| now.saturating_sub(c.last_seen) >= quiet)
            .map(|c| c.id)
            .collect()
    }

    /// Ends connection `id` now, if it is still tracked (the kernel says
    /// it is gone though its end was not captured): what is in flight ends
    /// incomplete, flagged `gap`, since a TCP connection never ends without
    /// a FIN or RST, so packets of it were lost.
    pub fn end(&mut self, id: ConnId, now: Nanos) -> Vec<CaptureEvent> {
        let key = (id.client, id.server);
        let mut events = Vec::new();
        if self.conns.get(&key).is_some_and(|c| c.id == id) {
            self.end_conn(key, now, &mut events);
        }
        for e in &mut events {
            if let Event::ResponseEnd { gap, .. } = &mut e.event {
                *gap = true;
            }
        }
        events
    }

    /// Gives up every hole that has kept data waiting for at least `wait`:
    /// its bytes are reported as a gap and the data behind it flows.
    pub fn give_up_holes(&mut self, now: Nanos, wait: Nanos) -> Vec<CaptureEvent> {
        let mut waiting = Vec::new();
        for (key, conn) in &self.conns {
            for (from_client, dir) in [(true, &conn.to_server), (false, &conn.to_client)] {
                if dir
                    .hole_since()
                    .is_some_and(|since| now.saturating_sub(since) >= wait)
                {
                    waiting.push((*key, from_client));
                }
            }
        }
        let mut events = Vec::new();
        for (key, from_client) in waiting {
            let Some(conn) = self.conns.get_mut(&key) else {
                continue;
            };
            let dir = if from_client {
                &mut conn.to_server
            } else {
                &mut conn.to_client
            };
            dir.give_up_hole(now, &mut self.deliveries);
            self.deliver(key, from_client, &mut events);
        }
        events
    }

    /// Which tracked pair a segment belongs to, and whether it comes from
    /// the client; a new pair when one side is a server port.
    fn route(&self, seg: &Segment) -> Option<((SocketAddr, SocketAddr), bool)> {
        if self.conns.contains_key(&(seg.src, seg.dst)) {
            return Some(((seg.src, seg.dst), true));
        }
        if self.conns.contains_key(&(seg.dst, seg.src)) {
            return Some(((seg.dst, seg.src), false));
        }
        let is_server = |addr: SocketAddr| self.ports.iter().any(|p| p.matches(addr));
        if is_server(seg.dst) {
            Some(((seg.src, seg.dst), true))
        } else if is_server(seg.src) {
            Some(((seg.dst, seg.src), false))
        } else {
            None
        }
    }

    /// Hands the pending deliveries of one direction to the connection's
    /// HTTP parser, and drops the connection once it is over.
    fn deliver(
        &mut self,
        key: (SocketAddr, SocketAddr),
        from_client: bool,
        events: &mut Vec<CaptureEvent>,
    ) {
        let Some(conn) = self.conns.get_mut(&key) else {
            self.deliveries.clear();
            return;
        };
        let mut reset = false;
        for delivery in self.deliveries.drain(..) {
            match &delivery {
                Delivery::Gap { missing_bytes, .. } => {
                    self.stats.gaps += 1;
                    self.stats.missing_bytes += missing_bytes;
                }
                Delivery::End { reset: true, .. } => reset = true,
                _ => {}
            }
            let was_http = !conn.http.is_not_http();
            conn.http
                .on_delivery(from_client, delivery, &mut self.timed);
            if was_http && conn.http.is_not_http() {
                self.stats.not_http += 1;
            }
        }
        let id = conn.id;
        events.extend(self.timed.drain(..).map(|t| CaptureEvent {
            conn: id,
            at: t.at,
            event: t.event,
        }));
        if reset || (conn.to_server.is_ended() && conn.to_client.is_ended()) {
            self.conns.remove(&key);
        }
    }

    /// Ends a connection now: what is in flight ends incomplete.
    fn end_conn(
        &mut self,
        key: (SocketAddr, SocketAddr),
        at: Nanos,
        events: &mut Vec<CaptureEvent>,
    ) {
        if let Some(mut conn) = self.conns.remove(&key) {
            conn.http.close(at, &mut self.timed);
            events.extend(self.timed.drain(..).map(|t| CaptureEvent {
                conn: conn.id,
                at: t.at,
                event: t.event,
            }));
        }
    }
}

/// A scripted TCP conversation, for the capture tests: each call gives the
/// next segment of one side with the right sequence numbers.
#[cfg(test)]
pub(crate) mod script {
    use bytes::Bytes;

    use super::*;
    use crate::capture::packet::TcpFlags;

    pub struct Talk {
        pub client: SocketAddr,
        pub server: SocketAddr,
        pub client_seq: u32,
        pub server_seq: u32,
    }

    impl Talk {
        pub fn new(client: &str, server: &str, client_isn: u32, server_isn: u32) -> Self {
            Talk {
                client: client.parse().expect("client addr"),
                server: server.parse().expect("server addr"),
                client_seq: client_isn,
                server_seq: server_isn,
            }
        }

        fn segment(&mut self, from_client: bool, flags: TcpFlags, payload: &[u8]) -> Segment {
            let (src, dst, seq, ack) = if from_client {
                (
                    self.client,
                    self.server,
                    &mut self.client_seq,
                    self.server_seq,
                )
            } else {
                (
                    self.server,
                    self.client,
                    &mut self.server_seq,
                    self.client_seq,
                )
            };
            let seg = Segment {
                src,
                dst,
                seq: *seq,
                ack,
                flags,
                payload: Bytes::copy_from_slice(payload),
            };
            *seq = seq
                .wrapping_add(payload.len() as u32 + u32::from(flags.syn) + u32::from(flags.fin));
            seg
        }

        /// SYN, SYN-ACK, ACK.
        pub fn handshake(&mut self) -> Vec<Segment> {
            let syn = TcpFlags {
                syn: true,
                ..TcpFlags::default()
            };
            let syn_ack = TcpFlags {
                syn: true,
                ack: true,
                ..TcpFlags::default()
            };
            vec![
                self.segment(true, syn, b""),
                self.segment(false, syn_ack, b""),
                self.segment(true, ack(), b""),
            ]
        }

        pub fn client(&mut self, payload: &[u8]) -> Segment {
            self.segment(true, push(), payload)
        }

        pub fn server(&mut self, payload: &[u8]) -> Segment {
            self.segment(false, push(), payload)
        }

        pub fn fin(&mut self, from_client: bool) -> Segment {
            self.segment(
                from_client,
                TcpFlags {
                    fin: true,
                    ack: true,
                    ..TcpFlags::default()
                },
                b"",
            )
        }

        pub fn rst(&mut self, from_client: bool) -> Segment {
            self.segment(
                from_client,
                TcpFlags {
                    rst: true,
                    ack: true,
                    ..TcpFlags::default()
                },
                b"",
            )
        }
    }

    fn ack() -> TcpFlags {
        TcpFlags {
            ack: true,
            ..TcpFlags::default()
        }
    }

    fn push() -> TcpFlags {
        TcpFlags {
            ack: true,
            psh: true,
            ..TcpFlags::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::script::Talk;
    use super::*;

    const REQUEST: &[u8] = b"POST /api/chat HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}";
    const HEAD: &[u8] = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";

    fn flows() -> Flows {
        Flows::new([ServerPort::any(11434)])
    }

    fn feed_all(flows: &mut Flows, segs: Vec<Segment>, t0: Nanos) -> Vec<CaptureEvent> {
        let mut out = Vec::new();
        for (i, seg) in segs.into_iter().enumerate() {
            out.extend(flows.feed(seg, t0 + i as Nanos));
        }
        out
    }

    /// Events as short lines: the connection's serial, then the event.
    fn lines(events: &[CaptureEvent]) -> Vec<String> {
        events
            .iter()
            .map(|e| {
                let what = match &e.event {
                    Event::RequestHead { exchange, path, .. } => {
                        format!("req-head {exchange} {path}")
                    }
                    Event::RequestBody { exchange, bytes } => {
                        format!("req-body {exchange} {}", String::from_utf8_lossy(bytes))
                    }
                    Event::RequestEnd { exchange, complete } => {
                        format!("req-end {exchange} {complete}")
                    }
                    Event::ResponseHead {
                        exchange, status, ..
                    } => format!("resp-head {exchange} {status}"),
                    Event::ResponseBody { exchange, bytes } => {
                        format!("resp-body {exchange} {}", String::from_utf8_lossy(bytes))
                    }
                    Event::ResponseEnd {
                        exchange,
                        complete,
                        gap,
                    } => {
                        format!("resp-end {exchange} {complete} {gap}")
                    }
                    Event::Gap { missing_bytes, .. } => format!("gap {missing_bytes}"),
                };
                format!("#{} {what}", e.conn.serial)
            })
            .collect()
    }

    /// A whole call: handshake, request, a two-chunk response, FINs.
    fn call(talk: &mut Talk) -> Vec<Segment> {
        let mut segs = talk.handshake();
        segs.push(talk.client(REQUEST));
        segs.push(talk.server(HEAD));
        segs.push(talk.server(b"5\r\nhello\r\n"));
        segs.push(talk.server(b"6\r\n world\r\n0\r\n\r\n"));
        segs.push(talk.fin(true));
        segs.push(talk.fin(false));
        segs
    }

    const CALL_LINES: [&str; 7] = [
        "req-head 0 /api/chat",
        "req-body 0 {}",
        "req-end 0 true",
        "resp-head 0 200",
        "resp-body 0 hello",
        "resp-body 0  world",
        "resp-end 0 true false",
    ];

    fn call_lines(serial: u64) -> Vec<String> {
        CALL_LINES
            .iter()
            .map(|l| format!("#{serial} {l}"))
            .collect()
    }

    #[test]
    fn a_whole_exchange_from_packets_gives_its_events_and_the_connection_ends() {
        let mut f = flows();
        let mut talk = Talk::new("127.0.0.1:50000", "127.0.0.1:11434", 100, 9000);
        let events = feed_all(&mut f, call(&mut talk), 1_000);
        assert_eq!(lines(&events), call_lines(0));
        assert_eq!(events[0].conn.client, talk.client);
        assert_eq!(events[0].conn.server, talk.server);
        // The response head's packet is the fifth (handshake, request).
        assert_eq!(events[3].at, 1_004);
        assert!(f.is_empty());
    }

    #[test]
    fn interleaved_flows_keep_their_own_events() {
        let mut f = flows();
        let a = call(&mut Talk::new(
            "127.0.0.1:50000",
            "127.0.0.1:11434",
            100,
            9000,
        ));
        let b = call(&mut Talk::new(
            "[::1]:50001",
            "[::1]:11434",
            u32::MAX - 10,
            5,
        ));
        let mut mixed = Vec::new();
        for (x, y) in a.into_iter().zip(b) {
            mixed.push(x);
            mixed.push(y);
        }
        let events = feed_all(&mut f, mixed, 0);
        let of = |serial: u64| -> Vec<String> {
            lines(&events)
                .into_iter()
                .filter(|l| l.starts_with(&format!("#{serial} ")))
                .collect()
        };
        assert_eq!(of(0), call_lines(0));
        assert_eq!(of(1), call_lines(1));
        assert!(f.is_empty());
    }

    #[test]
    fn one_connection_carries_two_calls() {
        let mut f = flows();
        let mut talk = Talk::new("127.0.0.1:50000", "127.0.0.1:11434", 1, 2);
        let mut segs = talk.handshake();
        segs.push(talk.client(REQUEST));
        segs.push(talk.server(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\none"));
        segs.push(talk.client(REQUEST));
        segs.push(talk.server(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\ntwo"));
        let events = feed_all(&mut f, segs, 0);
        let ends: Vec<_> = lines(&events)
            .into_iter()
            .filter(|l| l.contains("resp-"))
            .collect();
        assert_eq!(
            ends,
            [
                "#0 resp-head 0 200",
                "#0 resp-body 0 one",
                "#0 resp-end 0 true false",
                "#0 resp-head 1 200",
                "#0 resp-body 1 two",
                "#0 resp-end 1 true false",
            ]
        );
        assert_eq!(f.len(), 1);
    }

    #[test]
    fn a_reset_mid_body_ends_the_call_incomplete_and_the_connection() {
        let mut f = flows();
        let mut talk = Talk::new("127.0.0.1:50000", "127.0.0.1:11434", 1, 2);
        let mut segs = talk.handshake();
        segs.push(talk.client(REQUEST));
        segs.push(talk.server(HEAD));
        segs.push(talk.server(b"5\r\nhello\r\n"));
        segs.push(talk.rst(true));
        let events = feed_all(&mut f, segs, 0);
        assert_eq!(
            lines(&events).last().map(String::as_str),
            Some("#0 resp-end 0 false false")
        );
        assert!(f.is_empty());
        // The server's late segments give nothing.
        assert!(f.feed(talk.server(b"6\r\n world\r\n"), 99).is_empty());
    }

    #[test]
    fn ignored_addresses_and_other_ports_are_not_tracked() {
        let mut f = flows();
        let mut proxied = Talk::new("127.0.0.1:50000", "127.0.0.1:11434", 1, 2);
        f.ignore(proxied.client);
        assert!(feed_all(&mut f, call(&mut proxied), 0).is_empty());
        let mut other = Talk::new("127.0.0.1:50001", "127.0.0.1:8080", 1, 2);
        assert!(feed_all(&mut f, call(&mut other), 0).is_empty());
        assert!(f.is_empty());
        f.unignore(proxied.client);
        let mut again = Talk::new("127.0.0.1:50000", "127.0.0.1:11434", 77, 2);
        assert_eq!(lines(&feed_all(&mut f, call(&mut again), 0)), call_lines(0));
    }

    #[test]
    fn ignoring_a_tracked_address_drops_its_connection() {
        let mut f = flows();
        let mut talk = Talk::new("127.0.0.1:50000", "127.0.0.1:11434", 1, 2);
        feed_all(&mut f, talk.handshake(), 0);
        assert_eq!(f.len(), 1);
        let dropped = f.ignore(talk.client);
        assert_eq!(
            dropped.iter().map(|c| c.client).collect::<Vec<_>>(),
            [talk.client]
        );
        assert!(f.is_empty());
        assert!(f.feed(talk.client(REQUEST), 5).is_empty());
    }

    #[test]
    fn a_server_port_bound_to_one_address_matches_only_it() {
        let mut f = Flows::new([ServerPort {
            ip: Some("127.0.0.1".parse().expect("ip")),
            port: 11434,
        }]);
        let mut v6 = Talk::new("[::1]:50000", "[::1]:11434", 1, 2);
        assert!(feed_all(&mut f, call(&mut v6), 0).is_empty());
        let mut v4 = Talk::new("127.0.0.1:50000", "127.0.0.1:11434", 1, 2);
        assert_eq!(feed_all(&mut f, call(&mut v4), 0).len(), 7);
    }

    #[test]
    fn the_connection_cap_refuses_new_connections_and_counts_them() {
        let mut f = Flows::with_limits(
            [ServerPort::any(11434)],
            Limits {
                max_conns: 1,
                held_cap: DEFAULT_HELD_CAP,
                max_request_head: DEFAULT_MAX_REQUEST_HEAD,
            },
        );
        let mut a = Talk::new("127.0.0.1:50000", "127.0.0.1:11434", 1, 2);
        let mut b = Talk::new("127.0.0.1:50001", "127.0.0.1:11434", 1, 2);
        feed_all(&mut f, a.handshake(), 0);
        feed_all(&mut f, b.handshake(), 0);
        assert_eq!(f.len(), 1);
        assert_eq!(f.stats().conns_refused, 2);
    }

    #[test]
    fn idle_connections_are_swept_with_their_calls_ended() {
        let mut f = flows();
        let mut talk = Talk::new("127.0.0.1:50000", "127.0.0.1:11434", 1, 2);
        let mut segs = talk.handshake();
        segs.push(talk.client(REQUEST));
        feed_all(&mut f, segs, 0);
        assert!(f.sweep(50, 100).is_empty());
        let events = f.sweep(200, 100);
        assert_eq!(lines(&events), ["#0 resp-end 0 false false"]);
        assert_eq!(events[0].at, 200);
        assert!(f.is_empty());
    }

    #[test]
    fn a_hole_that_waits_too_long_is_given_up_as_a_gap() {
        let mut f = flows();
        let mut talk = Talk::new("127.0.0.1:50000", "127.0.0.1:11434", 1, 2);
        let mut segs = talk.handshake();
        segs.push(talk.client(b"GET / HTTP/1.1\r\n\r\n"));
        segs.push(talk.server(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nab"));
        let _lost = talk.server(b"cd");
        segs.push(talk.server(b"ef"));
        let events = feed_all(&mut f, segs, 0);
        assert_eq!(
            lines(&events).last().map(String::as_str),
            Some("#0 resp-body 0 ab")
        );
        assert!(f.give_up_holes(10, 100).is_empty());
        let events = f.give_up_holes(200, 100);
        assert_eq!(
            lines(&events),
            ["#0 gap 2", "#0 resp-body 0 ef", "#0 resp-end 0 false true"]
        );
        assert_eq!(f.stats().gaps, 1);
        assert_eq!(f.stats().missing_bytes, 2);
    }

    #[test]
    fn a_non_http_connection_gives_nothing_and_ends_at_its_fins() {
        let mut f = flows();
        let mut talk = Talk::new("127.0.0.1:50000", "127.0.0.1:11434", 1, 2);
        let mut segs = talk.handshake();
        segs.push(talk.client(b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03"));
        segs.push(talk.server(b"\x16\x03\x03\x00\x7a"));
        segs.push(talk.fin(true));
        assert!(feed_all(&mut f, segs, 0).is_empty());
        assert_eq!(f.len(), 1);
        assert_eq!(f.stats().not_http, 1);
        f.feed(talk.fin(false), 9);
        assert!(f.is_empty());
    }

    #[test]
    fn a_new_syn_on_a_reused_address_pair_starts_a_new_connection() {
        let mut f = flows();
        let mut first = Talk::new("127.0.0.1:50000", "127.0.0.1:11434", 1, 2);
        let mut segs = first.handshake();
        segs.push(first.client(REQUEST));
        feed_all(&mut f, segs, 0);
        let mut second = Talk::new("127.0.0.1:50000", "127.0.0.1:11434", 5000, 7000);
        let events = feed_all(&mut f, call(&mut second), 10);
        let mut expected = vec!["#0 resp-end 0 false false".to_owned()];
        expected.extend(call_lines(1));
        assert_eq!(lines(&events), expected);
    }

    #[test]
    fn a_connection_seen_mid_stream_is_picked_up_at_its_next_request() {
        let mut f = flows();
        let mut talk = Talk::new("127.0.0.1:50000", "127.0.0.1:11434", 1, 2);
        let _unseen = talk.handshake();
        let segs = vec![
            talk.server(b"tail of an earlier response"),
            talk.client(REQUEST),
            talk.server(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"),
        ];
        let events = feed_all(&mut f, segs, 0);
        assert_eq!(
            lines(&events),
            [
                "#0 req-head 0 /api/chat",
                "#0 req-body 0 {}",
                "#0 req-end 0 true",
                "#0 resp-head 0 200",
                "#0 resp-body 0 ok",
                "#0 resp-end 0 true false",
            ]
        );
    }
}
