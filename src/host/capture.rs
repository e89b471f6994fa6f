//! Capture start-up: the helper's permission check and the capture task
//! for every route whose upstream is on this machine; then the routes
//! captured while it runs ([`EngineHandle::capture_route`],
//! [`EngineHandle::uncapture_route`]), for servers found after the start.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;

use crate::capture::packet::LinkType;
use crate::capture::source::{self as capture_source, CaptureConfig, CaptureError, CaptureSource};
use crate::config::CaptureOnlyRoute;
use crate::engine::capture::{Applied, CaptureControl, CaptureRoute, CaptureTask};
use crate::model::{BoundRoute, CaptureDoc, CaptureRouteDoc, CaptureState, RouteSpec, Upstream};

use super::*;

/// Whether `host` names this machine (the capture only sees loopback).
pub(super) fn is_loopback_host(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Whether the capture helper is there and may open the packet socket on
/// `interface` (it is run to check, each time: the control API's
/// `capture` query asks afresh, as a permission may be granted while
/// running). The error names the command that grants the permission when
/// that is what is missing.
pub fn capture_permitted(interface: &str) -> Result<(), CaptureError> {
    find_and_check(interface).map(drop)
}

/// The helper found and its permission checked: the helper's path, or why
/// the capture can't run.
fn find_and_check(interface: &str) -> Result<PathBuf, CaptureError> {
    let helper = capture_source::find_helper()?;
    capture_source::check(&helper, interface)?;
    Ok(helper)
}

/// One answer of [`find_and_check`], shared.
pub(super) type Checked = Arc<Result<PathBuf, CaptureError>>;

/// The check made while a front end prepares a start (the capture's
/// default, whether discovered servers can be captured), for the interface
/// it was made for. The next engine start takes it, so one start runs the
/// helper's check once; a start without capture clears it, so it never
/// outlives the start-up it was made for.
static STARTUP_CHECK: Mutex<Option<(String, Checked)>> = Mutex::new(None);

/// Whether the capture may run on `interface`, for the start-up being
/// prepared: checked once, then remembered until the engine starts.
pub fn startup_capture_permitted(interface: &str) -> bool {
    let mut memo = STARTUP_CHECK.lock().unwrap_or_else(|p| p.into_inner());
    match memo.as_ref() {
        Some((checked_for, checked)) if checked_for == interface => checked.is_ok(),
        _ => {
            let checked = Arc::new(find_and_check(interface));
            let ok = checked.is_ok();
            *memo = Some((interface.to_owned(), checked));
            ok
        }
    }
}

/// Takes the start-up's check if it was made for `interface` (and clears
/// it either way): the engine's start uses it instead of checking again.
fn take_startup_check(interface: &str) -> Option<Checked> {
    let taken = STARTUP_CHECK
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take();
    taken.and_then(|(checked_for, checked)| (checked_for == interface).then_some(checked))
}

/// Starts the capture as `options` say, or not at all, and records how it
/// went for the UI's document. Ends the start-up's permission memo.
/// Request heads up to `head_cap` bytes are read, as the proxy reads them
/// (`--max-head-kib`).
pub(super) async fn start(
    shared: &Arc<Shared>,
    specs: &[RouteSpec],
    bound: &[BoundRoute],
    options: Option<CaptureOptions>,
    head_cap: usize,
) -> CaptureStatus {
    let interface = options.as_ref().map_or("", |o| o.interface.as_str());
    let checked = take_startup_check(interface);
    let Some(options) = options else {
        return CaptureStatus::Off;
    };
    let interface = options.interface.clone();
    let (status, doc, control) =
        start_capture(shared, specs, bound, options, head_cap, checked).await;
    *write(&shared.capture) = CaptureDoc {
        interface: Some(interface),
        ..doc
    };
    // After the document: a route captured from now on is added to it.
    if let Some(control) = control {
        let _ = shared.capture_control.set(control);
    }
    status
}

/// Starts the capture task for every route whose upstream is on this
/// machine, plus the capture-only routes; with none of them, it starts
/// capturing no port, ready for the routes added while it runs. Never
/// fails the engine: what went wrong is returned for the front end to
/// show, also as the document the UI reads.
pub(super) async fn start_capture(
    shared: &Arc<Shared>,
    specs: &[RouteSpec],
    bound: &[BoundRoute],
    options: CaptureOptions,
    head_cap: usize,
    checked: Option<Checked>,
) -> (CaptureStatus, CaptureDoc, Option<CaptureControl>) {
    let unavailable = |why: String, grant: Option<String>| {
        let doc = CaptureDoc {
            state: CaptureState::Unavailable,
            reason: Some(why.clone()),
            grant_command: grant,
            ..CaptureDoc::default()
        };
        (CaptureStatus::Unavailable(why), doc, None)
    };
    let routes = capture_routes(specs, &options.capture_only);
    let ports: Vec<u16> = routes.iter().map(|r| r.port).collect();
    let config = CaptureConfig {
        interface: options.interface,
        ports: ports.clone(),
        ..CaptureConfig::default()
    };
    let (tx, packets) = mpsc::channel(CAPTURE_QUEUE);
    // The start-up's check if one ran, else one now: a start checks the
    // helper's permission once. Running the helper blocks.
    let opened = tokio::task::spawn_blocking(move || {
        let checked = checked.unwrap_or_else(|| Arc::new(find_and_check(&config.interface)));
        match checked.as_ref() {
            Ok(helper) => CaptureSource::start(helper, &config, tx)
                .map_err(|e| (e.to_string(), e.grant_command().map(str::to_owned))),
            Err(e) => Err((e.to_string(), e.grant_command().map(str::to_owned))),
        }
    })
    .await;
    let source = match opened {
        Ok(Ok(source)) => source,
        Ok(Err((why, grant))) => return unavailable(why, grant),
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
    let task = CaptureTask::new(shared.link.clone(), &routes, own_ports, link)
        .with_max_request_head(head_cap);
    let (control, changes) = CaptureControl::channel();
    shared.servers.lock().await.spawn(task.run(
        packets,
        own,
        changes,
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
    (CaptureStatus::On { ports }, doc, Some(control))
}

/// Why a route can't be captured while running.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CaptureRouteError {
    /// The capture isn't running: why (the capture's own reason, naming the
    /// grant command when the permission is what is missing).
    #[error("the capture is not running: {0}")]
    Unavailable(String),
    #[error("{0} is not on this machine (the capture sees loopback traffic only)")]
    NotLocal(String),
    #[error("port {0} is one of speedtap's own listeners")]
    OwnPort(u16),
    #[error("port {port} is already captured as route {route:?}")]
    PortTaken { port: u16, route: String },
    #[error("route {name:?} already captures port {port}")]
    NameTaken { name: String, port: u16 },
    #[error("the capture has stopped")]
    Stopped,
}

impl EngineHandle {
    /// Captures calls to `upstream`'s port under the capture-only route
    /// `name`, from now on, with no restart: the capture task and the
    /// helper's filter take the port, and the UI's capture document lists
    /// it. Capturing the same route again is a no-op. The answer waits
    /// for the helper's filter to take the port ([`Applied::wait`]).
    pub fn capture_route(
        &self,
        name: &str,
        upstream: Upstream,
    ) -> Result<Applied, CaptureRouteError> {
        let Some(control) = self.shared.capture_control.get() else {
            return Err(CaptureRouteError::Unavailable(self.capture_unavailable()));
        };
        if !is_loopback_host(&upstream.host) {
            return Err(CaptureRouteError::NotLocal(upstream.to_string()));
        }
        let port = upstream.port;
        if read(&self.shared.routes)
            .iter()
            .any(|r| r.listen.port() == port)
        {
            return Err(CaptureRouteError::OwnPort(port));
        }
        // The document is held while the task is told: two changes reach
        // the task in the order the document shows them.
        let mut doc = write(&self.shared.capture);
        if let Some(r) = doc.routes.iter().find(|r| r.port == port && r.name != name) {
            return Err(CaptureRouteError::PortTaken {
                port,
                route: r.name.clone(),
            });
        }
        if let Some(r) = doc.routes.iter().find(|r| r.name == name && r.port != port) {
            return Err(CaptureRouteError::NameTaken {
                name: name.to_owned(),
                port: r.port,
            });
        }
        let applied = control
            .add_route(CaptureRoute {
                name: name.to_owned(),
                port,
                upstream,
            })
            .map_err(|_| CaptureRouteError::Stopped)?;
        if !doc.routes.iter().any(|r| r.port == port) {
            doc.routes.push(CaptureRouteDoc {
                name: name.to_owned(),
                port,
            });
        }
        Ok(applied)
    }

    /// Stops capturing new calls to `port` (its calls in flight settle as
    /// their flows end); the UI's capture document drops it. False when no
    /// route captured it.
    pub fn uncapture_route(&self, port: u16) -> bool {
        let Some(control) = self.shared.capture_control.get() else {
            return false;
        };
        let mut doc = write(&self.shared.capture);
        let before = doc.routes.len();
        doc.routes.retain(|r| r.port != port);
        if doc.routes.len() == before {
            return false;
        }
        control.remove_route(port).is_ok()
    }

    /// Why the capture isn't running, in the words the UI shows.
    fn capture_unavailable(&self) -> String {
        let doc = read(&self.shared.capture);
        match (&doc.reason, doc.state) {
            (Some(why), _) => why.clone(),
            (None, CaptureState::Off) => "capture is off (not asked for)".to_owned(),
            (None, _) => "capture is not running".to_owned(),
        }
    }
}

/// What to capture: each capture-only route's upstream, then each proxy
/// route's on this machine, one per port. A port with both files its
/// direct calls under the capture-only route: that route exists to name
/// them, while the proxy route has its own calls from its listener.
fn capture_routes(specs: &[RouteSpec], capture_only: &[CaptureOnlyRoute]) -> Vec<CaptureRoute> {
    let mut routes: Vec<CaptureRoute> = Vec::new();
    let upstreams = capture_only
        .iter()
        .map(|r| (&r.name, &r.upstream))
        .chain(specs.iter().map(|r| (&r.name, &r.upstream)));
    for (name, upstream) in upstreams {
        if is_loopback_host(&upstream.host) && !routes.iter().any(|r| r.port == upstream.port) {
            routes.push(CaptureRoute {
                name: name.clone(),
                port: upstream.port,
                upstream: upstream.clone(),
            });
        }
    }
    routes
}

/// Packets queued between the capture's reader and its task; beyond this
/// they are dropped and counted (the reader never waits).
const CAPTURE_QUEUE: usize = 65_536;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_upstreams_on_this_machine_are_captured_once_per_port() {
        let specs = [
            RouteSpec::new("a", "127.0.0.1:0", "http://127.0.0.1:11434").unwrap(),
            RouteSpec::new("b", "127.0.0.1:0", "http://localhost:11434").unwrap(),
            RouteSpec::new("c", "127.0.0.1:0", "http://10.0.0.5:8080").unwrap(),
        ];
        let only = [
            crate::config::parse_capture_route_flag("d=http://[::1]:8000")
                .unwrap()
                .unwrap(),
        ];
        let ports: Vec<(String, u16)> = capture_routes(&specs, &only)
            .into_iter()
            .map(|r| (r.name, r.port))
            .collect();
        assert_eq!(ports, [("d".to_owned(), 8000), ("a".to_owned(), 11434)]);
    }

    #[test]
    fn direct_calls_to_an_upstream_with_a_capture_only_route_are_filed_under_it() {
        let specs = [RouteSpec::new("proxied", "127.0.0.1:0", "http://127.0.0.1:11434").unwrap()];
        let only = [
            crate::config::parse_capture_route_flag("direct=http://127.0.0.1:11434")
                .unwrap()
                .unwrap(),
        ];
        let routes = capture_routes(&specs, &only);
        assert_eq!(routes.len(), 1);
        assert_eq!(routes[0].name, "direct");
    }

    #[test]
    fn loopback_hosts_are_named_or_numbered() {
        assert!(is_loopback_host("LOCALHOST") && is_loopback_host("::1"));
        assert!(is_loopback_host("127.0.0.2") && !is_loopback_host("10.0.0.1"));
    }
}
