//! Capture start-up: the helper's permission check and the capture task
//! for every route whose upstream is on this machine.

use std::sync::Arc;

use tokio::sync::mpsc;

use crate::capture::packet::LinkType;
use crate::capture::source::{self as capture_source, CaptureConfig, CaptureError, CaptureSource};
use crate::engine::capture::{CaptureRoute, CaptureTask};
use crate::model::{BoundRoute, CaptureDoc, CaptureRouteDoc, CaptureState, RouteSpec};

use super::*;

/// Whether `host` names this machine (the capture only sees loopback).
pub(super) fn is_loopback_host(host: &str) -> bool {
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
pub(super) async fn start_capture(
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
