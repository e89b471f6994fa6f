//! Routes that come and go while the capture runs: [`CaptureControl`], the
//! cloneable handle the host changes them through, and how the task applies
//! a change between two packets.
//!
//! - An added route's port joins the connection table's server ports and
//!   the helper's filter; its calls are recorded from its first captured
//!   request on, with a telemetry poller as the routes given at the start
//!   have.
//! - A removed route starts no call any more, and its port opens no new
//!   connection in the table. The calls in flight on it are not cut off:
//!   they settle as their flows end, so its port stays in the helper's
//!   filter until then ([`CaptureTask::settle_retired`]). Its connections
//!   with no call in flight are forgotten at once.
//! - The helper's filter is always the whole set: every route's port, the
//!   retiring ones included ([`CaptureTask::capture_ports`]).

use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};

use super::{CaptureRoute, CaptureTask, RouteEntry};
use crate::capture::flows::ServerPort;

/// A change to the capture's routes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RouteChange {
    /// Capture this route's port (or rename the route already on it).
    Add(CaptureRoute),
    /// Stop capturing new calls to this port.
    Remove(u16),
}

/// The capture task has ended: nothing can change its routes any more.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the capture has stopped")]
pub struct CaptureStopped;

/// Changes the routes of a running capture task. Cheap to clone; the task
/// applies each change between two packets, in the order sent.
#[derive(Clone, Debug)]
pub struct CaptureControl {
    tx: mpsc::UnboundedSender<(RouteChange, Option<oneshot::Sender<Ticket>>)>,
}

/// The task's end of a [`CaptureControl`].
pub struct RouteChanges {
    pub(super) rx: mpsc::UnboundedReceiver<(RouteChange, Option<oneshot::Sender<Ticket>>)>,
}

/// The helper's filter change a route change asked for: its control
/// line's ticket and the helper's count of lines dealt with. `None` when
/// the filter didn't change (or no helper runs).
pub(super) type Ticket = Option<(u64, watch::Receiver<u64>)>;

/// Waits for an added route's port to be in the helper's kernel filter.
#[derive(Debug)]
pub struct Applied(oneshot::Receiver<Ticket>);

impl Applied {
    /// Returns once the helper has attached the filter with the new port
    /// (so a connection opened from then on is seen from its SYN), or
    /// after `within`; false then, or when the capture stopped.
    pub async fn wait(self, within: Duration) -> bool {
        let wait = async {
            match self.0.await {
                Ok(Some((ticket, mut applied))) => applied.wait_for(|n| *n >= ticket).await.is_ok(),
                Ok(None) => true,
                Err(_) => false,
            }
        };
        tokio::time::timeout(within, wait).await.unwrap_or(false)
    }
}

impl CaptureControl {
    /// A handle and the receiving end to give [`CaptureTask::run`].
    pub fn channel() -> (CaptureControl, RouteChanges) {
        let (tx, rx) = mpsc::unbounded_channel();
        (CaptureControl { tx }, RouteChanges { rx })
    }

    /// Captures `route`'s port from now on, under its name; the answer
    /// tells when the helper's filter has the port.
    pub fn add_route(&self, route: CaptureRoute) -> Result<Applied, CaptureStopped> {
        let (done, applied) = oneshot::channel();
        self.tx
            .send((RouteChange::Add(route), Some(done)))
            .map_err(|_| CaptureStopped)?;
        Ok(Applied(applied))
    }

    /// Stops recording new calls to `port`; the calls in flight settle.
    pub fn remove_route(&self, port: u16) -> Result<(), CaptureStopped> {
        self.tx
            .send((RouteChange::Remove(port), None))
            .map_err(|_| CaptureStopped)
    }
}

impl CaptureTask {
    /// Applies one change. Returns the new port set for the helper when it
    /// changed.
    pub fn change_routes(&mut self, change: RouteChange) -> Option<Vec<u16>> {
        let before = self.capture_ports();
        match change {
            RouteChange::Add(route) => self.add_route(route),
            RouteChange::Remove(port) => self.retire_route(port),
        }
        let after = self.capture_ports();
        (after != before).then_some(after)
    }

    /// The ports the helper must capture: every route's, those whose last
    /// calls are still settling included. Sorted.
    pub fn capture_ports(&self) -> Vec<u16> {
        let mut ports: Vec<u16> = self.routes.keys().copied().collect();
        ports.sort_unstable();
        ports
    }

    fn add_route(&mut self, route: CaptureRoute) {
        if self.own_ports.contains(&route.port) {
            tracing::warn!(
                port = route.port,
                "not capturing one of speedtap's own listen ports"
            );
            return;
        }
        if let Some(entry) = self.routes.get(&route.port) {
            if !entry.retiring && entry.name == route.name && entry.upstream == route.upstream {
                return;
            }
        }
        let entry = RouteEntry {
            name: route.name.clone(),
            upstream: route.upstream.clone(),
            telemetry: self.engine.telemetry_for(&route.name, &route.upstream),
            retiring: false,
        };
        self.routes.insert(route.port, entry);
        self.flows.add_port(ServerPort::any(route.port));
    }

    /// Stops new calls to `port`; drops its connections with no call in
    /// flight, and the route itself when none is left.
    fn retire_route(&mut self, port: u16) {
        let Some(entry) = self.routes.get_mut(&port) else {
            return;
        };
        entry.retiring = true;
        self.flows.remove_port(port);
        let busy = self.busy_connections();
        self.flows
            .forget(|id| id.server.port() == port && !busy.contains(&id));
        self.settle_retired();
    }

    /// Drops the retiring routes whose last call has ended (and their
    /// remaining idle connections). True when the port set changed.
    pub fn settle_retired(&mut self) -> bool {
        let busy_ports: std::collections::HashSet<u16> = self
            .exchanges
            .keys()
            .map(|(conn, _)| conn.server.port())
            .collect();
        let done: Vec<u16> = self
            .routes
            .iter()
            .filter(|(port, entry)| entry.retiring && !busy_ports.contains(port))
            .map(|(port, _)| *port)
            .collect();
        for port in &done {
            self.routes.remove(port);
            self.flows.forget(|id| id.server.port() == *port);
        }
        !done.is_empty()
    }

    /// Whether a route is retiring (its calls settling).
    pub(super) fn has_retiring(&self) -> bool {
        self.routes.values().any(|r| r.retiring)
    }

    /// The connections with a call in flight.
    fn busy_connections(&self) -> std::collections::HashSet<crate::capture::flows::ConnId> {
        self.exchanges.keys().map(|(conn, _)| *conn).collect()
    }
}

/// Routes added and removed while the task runs, fed hand-built packets.
#[cfg(test)]
mod tests {
    use super::super::rig::{head, lines, play, play_to, request, Rig, SERVER};
    use super::*;
    use crate::capture::flows::script::Talk;
    use crate::model::{CallStatus, Upstream};

    const OTHER: &str = "127.0.0.1:8080";

    fn other_route() -> CaptureRoute {
        CaptureRoute {
            name: "llama-server-8080".into(),
            port: 8080,
            upstream: Upstream::parse("http://127.0.0.1:8080").expect("upstream"),
        }
    }

    /// Plays a call's handshake, request, head and the first `lines`
    /// response lines; returns the conversation to go on with.
    fn begin(rig: &mut Rig, client: &str, server: &str, sent: usize) -> Talk {
        let mut talk = Talk::new(client, server, 7_000, 90_000);
        for seg in talk.handshake() {
            rig.feed(seg, 0);
        }
        let seg = talk.client(&request());
        rig.feed(seg, 1);
        let all = lines();
        let len = all.iter().map(String::len).sum();
        let seg = talk.server(&head(len));
        rig.feed(seg, 100);
        for line in &all[..sent] {
            let seg = talk.server(line.as_bytes());
            rig.feed(seg, 50);
        }
        talk
    }

    /// The rest of a call [`begin`] started: its lines after `sent`, then
    /// both FINs.
    fn finish(rig: &mut Rig, talk: &mut Talk, sent: usize) {
        for line in &lines()[sent..] {
            let seg = talk.server(line.as_bytes());
            rig.feed(seg, 50);
        }
        let seg = talk.fin(false);
        rig.feed(seg, 1);
        let seg = talk.fin(true);
        rig.feed(seg, 1);
    }

    #[actix::test]
    async fn a_route_added_while_running_records_calls_to_its_port_from_then_on() {
        let mut rig = Rig::new().await;
        // Before the route: a call to its port starts nothing.
        let mut talk = begin(&mut rig, "127.0.0.1:50100", OTHER, 3);
        assert_eq!(rig.task.open_calls(), 0);
        finish(&mut rig, &mut talk, 3);

        rig.control.add_route(other_route()).expect("running");
        assert_eq!(rig.apply(), Some(vec![8080, 11434]), "the helper's new set");
        play_to(&mut rig, "127.0.0.1:50101", OTHER, None).await;
        let call = rig.settled().await;
        assert_eq!(call.identity.route, "llama-server-8080");
        assert_eq!(
            call.identity.id, "c-000001",
            "the earlier call was not recorded"
        );
        assert_eq!(call.status, CallStatus::Ok, "{call:?}");
        // Adding it again changes nothing.
        rig.control.add_route(other_route()).expect("running");
        assert_eq!(rig.apply(), None);
    }

    #[actix::test]
    async fn a_removed_route_records_no_new_call() {
        let mut rig = Rig::new().await;
        rig.control.add_route(other_route()).expect("running");
        rig.apply();
        rig.control.remove_route(11434).expect("running");
        // Nothing in flight on it: its port leaves the filter at once.
        assert_eq!(rig.apply(), Some(vec![8080]));
        let mut talk = begin(&mut rig, "127.0.0.1:50102", SERVER, 3);
        assert_eq!(
            rig.task.open_calls(),
            0,
            "no call started on the removed route"
        );
        finish(&mut rig, &mut talk, 3);
        play_to(&mut rig, "127.0.0.1:50103", OTHER, None).await;
        let call = rig.settled().await;
        assert_eq!(call.identity.route, "llama-server-8080");
        assert_eq!(
            call.identity.id, "c-000001",
            "the removed route's call was not recorded"
        );
    }

    #[actix::test]
    async fn a_removed_routes_call_in_flight_settles_as_its_flow_ends() {
        let mut rig = Rig::new().await;
        let mut talk = begin(&mut rig, "127.0.0.1:50104", SERVER, 10);
        rig.control.remove_route(11434).expect("running");
        assert_eq!(rig.apply(), None, "its port stays while its call is open");
        // A second request on another connection is not recorded...
        let mut late = begin(&mut rig, "127.0.0.1:50105", SERVER, 0);
        assert_eq!(rig.task.open_calls(), 1);
        finish(&mut rig, &mut late, 0);
        // ...while the open one runs to its end, whole.
        finish(&mut rig, &mut talk, 10);
        let call = rig.settled().await;
        assert_eq!(call.status, CallStatus::Ok, "{call:?}");
        assert!(!call.details.capture_gap);
        assert_eq!(call.speed.expect("a snapshot").output_tokens, 30);
        // Then the port leaves the filter.
        assert_eq!(rig.task.next_tick(), Some(super::super::TICK));
        assert!(rig.task.settle_retired());
        assert!(rig.task.capture_ports().is_empty());
    }

    #[actix::test]
    async fn packets_of_an_existing_flow_keep_flowing_across_an_add() {
        let mut rig = Rig::new().await;
        let mut talk = begin(&mut rig, "127.0.0.1:50106", SERVER, 15);
        rig.control.add_route(other_route()).expect("running");
        assert_eq!(rig.apply(), Some(vec![8080, 11434]));
        finish(&mut rig, &mut talk, 15);
        let call = rig.settled().await;
        assert_eq!(call.identity.route, "ollama");
        assert_eq!(call.status, CallStatus::Ok, "{call:?}");
        assert!(!call.details.capture_gap);
        let speed = call.speed.expect("a snapshot");
        assert_eq!(speed.output_tokens, 30);
        assert_eq!(speed.output_tokens_per_second, Some(20.0));
        // And the old route keeps recording new calls.
        play(&mut rig, "127.0.0.1:50107", None).await;
        assert_eq!(rig.settled().await.identity.id, "c-000002");
    }

    #[actix::test]
    async fn a_stopped_capture_refuses_changes() {
        let rig = Rig::new().await;
        let control = rig.control.clone();
        drop(rig);
        assert_eq!(control.remove_route(1), Err(CaptureStopped));
    }
}
