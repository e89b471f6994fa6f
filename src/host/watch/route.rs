//! How a followed server is measured: by a route already configured in
//! front of it, by the capture (no client change), or, when the capture
//! may not run, behind a proxy route of its own on the next free port.
//! Also the lines people read about it and the list the API serves.

use std::collections::{BTreeSet, HashMap};
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::discover::known::{process_kind, ProcessKind};
use crate::discover::owner::Owner;
use crate::discover::registry::{KnownServer, ServerState};
use crate::discover::Discovered;
use crate::engine::metrics::schema::UNKNOWN_PROVIDER;
use crate::model::{CaptureState, FollowedServer, FollowedState, RouteSpec, Upstream};

use super::super::handle::read;
use super::super::EngineHandle;
use super::follow::Candidate;

/// How one server is measured now, and what it said of itself.
#[derive(Clone, Debug)]
pub(super) struct Routed {
    pub upstream: Upstream,
    /// `capture` or `proxy`; `None` when nothing could measure it.
    pub seen_by: Option<&'static str>,
    /// The route its calls are filed under.
    pub route: String,
    /// The proxy route opened for it, where it has one.
    pub proxy_listen: Option<SocketAddr>,
    /// Whether the watcher added its capture route (and takes it back
    /// when the server goes down).
    pub captured: bool,
    pub owner: Option<Owner>,
    pub version: Option<String>,
}

/// Names held by configured routes: never given to a found server.
pub(super) fn configured_names(handle: &EngineHandle) -> BTreeSet<String> {
    let mut names: BTreeSet<String> = handle.bound_routes().into_iter().map(|r| r.name).collect();
    names.extend(
        read(&handle.shared.capture)
            .routes
            .iter()
            .map(|r| r.name.clone()),
    );
    names
}

/// speedtap's own listen ports: never followed.
pub(super) fn own_ports(handle: &EngineHandle) -> BTreeSet<u16> {
    handle
        .bound_routes()
        .iter()
        .map(|r| r.listen.port())
        .collect()
}

/// Measures the server `name` found at `candidate` (`before`: how it was
/// measured when it was last up).
pub(super) async fn measure(
    handle: &EngineHandle,
    name: &str,
    candidate: &Candidate,
    found: &Discovered,
    before: Option<&Routed>,
) -> Routed {
    let upstream = Upstream {
        host: candidate.host.to_string(),
        port: candidate.port,
        base_path: String::new(),
    };
    let mut routed = Routed {
        upstream: upstream.clone(),
        seen_by: None,
        route: name.to_owned(),
        proxy_listen: None,
        captured: false,
        owner: candidate.owner.clone(),
        version: found.detail.clone(),
    };
    let provider = provider_of(candidate, found);
    if let Some((route, seen_by)) = configured_route(handle, name, candidate.port) {
        handle.shared.metrics.set_route_provider(&route, provider);
        routed.route = route;
        routed.seen_by = Some(seen_by);
        return routed;
    }
    handle.shared.metrics.set_route_provider(name, provider);
    if read(&handle.shared.capture).state == CaptureState::On {
        match handle.capture_route(name, upstream.clone()) {
            Ok(applied) => {
                // Said measured only once a new connection would be seen.
                if !applied.wait(FILTER_WITHIN).await {
                    tracing::warn!("the capture helper did not confirm port {}", candidate.port);
                }
                routed.seen_by = Some("capture");
                routed.captured = true;
                return routed;
            }
            Err(why) => tracing::warn!("cannot capture {name}: {why}; proxying it instead"),
        }
    }
    routed.proxy_listen = match before.and_then(|b| b.proxy_listen) {
        Some(listen) => Some(listen),
        None => proxy_route(handle, name, &upstream).await,
    };
    if routed.proxy_listen.is_some() {
        routed.seen_by = Some("proxy");
    }
    routed
}

/// What the metrics call the server (`gen_ai.provider.name`): its
/// process's kind where that is read and is a server's own, else the kind
/// its answers showed, else [`UNKNOWN_PROVIDER`].
fn provider_of(candidate: &Candidate, found: &Discovered) -> &'static str {
    candidate
        .owner
        .as_ref()
        .and_then(process_kind)
        .and_then(ProcessKind::provider_name)
        .or_else(|| found.kind.provider_name())
        .unwrap_or(UNKNOWN_PROVIDER)
}

/// The configured route (other than the server's own) already measuring
/// `port` on this machine, and how it sees calls.
fn configured_route(
    handle: &EngineHandle,
    name: &str,
    port: u16,
) -> Option<(String, &'static str)> {
    let local = |u: &Upstream| u.port == port && super::super::capture::is_loopback_host(&u.host);
    let proxied = handle
        .bound_routes()
        .into_iter()
        .find(|r| r.name != name && Upstream::parse(&r.upstream).is_ok_and(|u| local(&u)));
    if let Some(route) = proxied {
        return Some((route.name, "proxy"));
    }
    read(&handle.shared.capture)
        .routes
        .iter()
        .find(|r| r.name != name && r.port == port)
        .map(|r| (r.name.clone(), "capture"))
}

/// Ports tried for a server's proxy route after its own: the next ones
/// up, then any free port.
const PROXY_PORT_TRIES: u16 = 10;

/// How long a new capture route waits for the helper to say its filter
/// has the port (it answers within milliseconds).
const FILTER_WITHIN: std::time::Duration = std::time::Duration::from_secs(2);

/// Opens a proxy route for `name` on the first free port after the
/// server's (as start-up discovery always did), else on any free port.
async fn proxy_route(handle: &EngineHandle, name: &str, upstream: &Upstream) -> Option<SocketAddr> {
    let next = (1..=PROXY_PORT_TRIES).filter_map(|i| upstream.port.checked_add(i));
    for port in next.chain([0]) {
        let spec = RouteSpec {
            name: name.to_owned(),
            listen: SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
            upstream: upstream.clone(),
        };
        if let Ok(bound) = handle.add_route(spec).await {
            return Some(bound.listen);
        }
    }
    None
}

/// The server stopped listening on `port`: its capture route (if the
/// watcher added it) is taken back. A proxy route stays bound, so clients
/// pointed at it get a 502 naming the server, and it serves again when the
/// server is back.
pub(super) fn unmeasure(handle: &EngineHandle, routed: &Routed, port: u16) {
    if routed.captured {
        let _ = handle.uncapture_route(port);
    }
}

/// The line said when a server is found or back.
pub(super) fn arrival_line(
    name: &str,
    found: &Discovered,
    candidate: &Candidate,
    routed: &Routed,
    back: bool,
) -> String {
    let what = match &found.detail {
        Some(detail) => format!("{} ({detail})", found.kind.label()),
        None => found.kind.label().to_owned(),
    };
    let process = candidate
        .owner
        .as_ref()
        .map(|o| format!(", process {} pid {}", o.comm, o.pid))
        .unwrap_or_default();
    let how = match (routed.seen_by, routed.proxy_listen) {
        (Some("capture"), _) if routed.route == name => {
            "measured by capture (no client changes)".to_owned()
        }
        (_, Some(listen)) => format!("point clients at http://{listen} to measure it"),
        (Some(_), None) => format!("measured by route \"{}\"", routed.route),
        (None, None) => "not measured (no route could be opened)".to_owned(),
    };
    let verb = if back { "back" } else { "found" };
    format!(
        "{verb}: {what} at {}{process} -> route \"{name}\", {how}",
        routed.upstream.base_url()
    )
}

/// Once per run, when a server had to be proxied: why the capture didn't
/// measure it, and the command that grants it.
pub(super) fn grant_hint(handle: &EngineHandle) -> Option<String> {
    let capture = read(&handle.shared.capture);
    let grant = capture.grant_command.as_deref()?;
    Some(format!(
        "calls sent straight to a server are measured once the capture may run: {grant} \
         (then start speedtap with --capture)"
    ))
}

/// The list `GET /api/v1/servers` serves.
pub(super) fn documents(
    servers: &[KnownServer],
    routed: &HashMap<String, Routed>,
) -> Vec<FollowedServer> {
    servers
        .iter()
        .map(|server| {
            let how = routed.get(&server.name);
            let state = match (server.state, how) {
                (ServerState::Ignored, _) => FollowedState::Ignored,
                (ServerState::Up, Some(r)) if r.proxy_listen.is_some() => FollowedState::Proxied,
                (ServerState::Up, Some(r)) if r.seen_by.is_some() => FollowedState::Measured,
                _ => FollowedState::Down,
            };
            let up = state != FollowedState::Down && state != FollowedState::Ignored;
            FollowedServer {
                name: server.name.clone(),
                kind: server.identity.kind.clone(),
                upstream: how.map_or_else(
                    || format!("http://127.0.0.1:{}", server.identity.port),
                    |r| r.upstream.base_url(),
                ),
                state,
                seen_by: how
                    .filter(|_| up)
                    .and_then(|r| r.seen_by)
                    .map(str::to_owned),
                route: how.map_or_else(|| server.name.clone(), |r| r.route.clone()),
                proxy_listen: how.and_then(|r| r.proxy_listen).map(|l| l.to_string()),
                pid: how
                    .filter(|_| up)
                    .and_then(|r| r.owner.as_ref())
                    .map(|o| o.pid),
                process: how.and_then(|r| r.owner.as_ref()).map(|o| o.comm.clone()),
                version: how.and_then(|r| r.version.clone()),
                found_at: unix_ms(server.found_at),
                last_seen: unix_ms(server.last_seen),
            }
        })
        .collect()
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discover::known::ProbeReason;
    use crate::discover::ServerKind;

    fn candidate(process: Option<&[&str]>) -> Candidate {
        Candidate {
            port: 30000,
            host: Ipv4Addr::LOCALHOST.into(),
            owner: process.map(|argv| Owner {
                pid: 42,
                comm: argv[0].to_owned(),
                exe: None,
                cmdline: argv.iter().map(|a| (*a).to_owned()).collect(),
                parent_comm: None,
            }),
            reason: ProbeReason::WellKnownPort,
            attempts: 0,
        }
    }

    fn found(kind: ServerKind) -> Discovered {
        Discovered {
            kind,
            port: 30000,
            upstream: "http://127.0.0.1:30000".into(),
            suggested_route: RouteSpec::new(
                kind.route_name(),
                "127.0.0.1:30001",
                "http://127.0.0.1:30000",
            )
            .unwrap(),
            detail: None,
        }
    }

    #[test]
    fn the_provider_is_the_servers_process_then_its_answers_and_never_a_guess() {
        let sglang = ["python3", "-m", "sglang.launch_server"];
        // The process says more than an OpenAI-style model list.
        assert_eq!(
            provider_of(
                &candidate(Some(&sglang)),
                &found(ServerKind::OpenAiCompatible)
            ),
            "sglang"
        );
        // No owner to read: the endpoints that answered.
        assert_eq!(
            provider_of(&candidate(None), &found(ServerKind::Ollama)),
            "ollama"
        );
        assert_eq!(
            provider_of(&candidate(None), &found(ServerKind::LlamaCpp)),
            "llama.cpp"
        );
        // The simulator is no server of its own: the kind it answers as.
        let simulate = ["speedtap", "simulate", "--listen", "127.0.0.1:0"];
        assert_eq!(
            provider_of(&candidate(Some(&simulate)), &found(ServerKind::Vllm)),
            "vllm"
        );
        // A model list alone identifies nothing.
        assert_eq!(
            provider_of(&candidate(None), &found(ServerKind::OpenAiCompatible)),
            UNKNOWN_PROVIDER
        );
    }
}
