//! What front ends may change or start in a running engine, and the
//! documents they exchange: bound routes, the tok/s history for the chart,
//! discovered servers, the editable settings, and demo traffic. The shapes
//! are the UI contract's (the control API serves them over HTTP, the tray
//! app through Tauri commands with the same names).

use serde::{Deserialize, Serialize};

use std::net::SocketAddr;

use super::route::RouteSpec;

/// A route as it is actually bound.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BoundRoute {
    /// The route's name.
    pub name: String,
    /// The address it listens on (the port chosen when 0 was asked for).
    pub listen: SocketAddr,
    /// The upstream's base URL.
    pub upstream: String,
}

impl BoundRoute {
    /// The URL a client should use instead of the upstream's.
    pub fn proxy_url(&self) -> String {
        format!("http://{}", self.listen)
    }
}

/// A bound route as the UI shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteInfo {
    /// The route's name.
    pub name: String,
    /// The address it listens on.
    pub listen: String,
    /// The upstream's base URL.
    pub upstream: String,
    /// The URL to point a client at instead of the upstream's.
    pub proxy_url: String,
    /// The demo's route (its own simulator, for demo traffic only): never
    /// offered as a URL to give clients. Absent (false) for real routes.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub demo: bool,
}

impl From<&BoundRoute> for RouteInfo {
    fn from(r: &BoundRoute) -> Self {
        RouteInfo {
            name: r.name.clone(),
            listen: r.listen.to_string(),
            upstream: r.upstream.clone(),
            proxy_url: r.proxy_url(),
            demo: false,
        }
    }
}

/// `GET /api/v1/routes`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoutesDoc {
    /// Every bound route, the demo route included once started.
    pub routes: Vec<RouteInfo>,
}

/// One global tok/s reading for the last-hour chart.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct HistoryPoint {
    /// Unix time in milliseconds.
    pub t: u64,
    /// The global tokens per second then.
    pub tps: f64,
}

/// `GET /api/v1/stats/history`: readings with a real tps, oldest first.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HistoryDoc {
    /// The readings.
    pub points: Vec<HistoryPoint>,
}

/// A route as the settings form edits it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteDoc {
    /// The route's name.
    pub name: String,
    /// The listen address, `HOST:PORT`.
    pub listen: String,
    /// The upstream's base URL.
    pub upstream: String,
}

impl From<&RouteSpec> for RouteDoc {
    fn from(r: &RouteSpec) -> Self {
        RouteDoc {
            name: r.name.clone(),
            listen: r.listen.to_string(),
            upstream: r.upstream.base_url(),
        }
    }
}

/// A local server found by discovery, with the route speedtap suggests.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerDoc {
    /// The server kind, lowercase (`ollama`, `llamacpp`...).
    pub kind: String,
    /// The server kind's display name.
    pub label: String,
    /// The port it answered on.
    pub port: u16,
    /// The server's base URL.
    pub upstream: String,
    /// What the server said about itself (a version, a model), if anything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// The route speedtap would make for it.
    pub suggested_route: RouteDoc,
    /// The URL clients would use through that route.
    pub proxy_url: String,
}

/// `GET /api/v1/discover`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiscoveredDoc {
    /// The servers found.
    pub servers: Vec<ServerDoc>,
}

/// The settings the UI edits. `config_path` is informational (ignored when
/// saving).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SettingsDoc {
    /// The configured routes (what the next start binds).
    pub routes: Vec<RouteDoc>,
    /// The slow-first-token threshold, in milliseconds (at least 1).
    pub slow_ttft_ms: u64,
    /// Desktop notifications for slow first tokens.
    pub notifications: bool,
    /// A follow-up notification when a slow call settles.
    pub notify_settled: bool,
    /// Passive capture of the loopback traffic to the model servers' own
    /// ports (the config's `capture`). Read: the setting in effect. Saved
    /// as `capture = true/false`; absent keeps what the file says. It
    /// takes effect at the next start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capture: Option<bool>,
    /// Ports whose listeners are asked whether they are model servers,
    /// whatever process owns them (the config's `watch_ports`, beside the
    /// well-known ports and model servers known by name). Read: the ports
    /// in effect, absent when the engine doesn't follow the machine (it
    /// has routes configured). Saved as `watch_ports = [...]`; absent
    /// keeps what the file says. It takes effect at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watch_ports: Option<Vec<u16>>,
    /// Where the settings are saved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_path: Option<String>,
}

/// The answer to a save.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SaveOutcome {
    /// True once the config file was written.
    pub saved: bool,
    /// Route changes are saved but only take effect after a restart.
    pub restart_required: bool,
    /// The config file written.
    pub config_path: String,
}

/// `POST /api/v1/demo`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DemoDoc {
    /// True while demo traffic runs.
    pub running: bool,
    /// The demo route.
    pub route: RouteInfo,
}

/// Whether the passive capture runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CaptureState {
    /// Not asked for (`capture = false`, no `--capture`).
    #[default]
    Off,
    /// Capturing the ports in `routes`.
    On,
    /// Asked for but not running (`reason` says why); the proxy runs.
    Unavailable,
}

/// One port the capture measures.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaptureRouteDoc {
    /// The route whose calls these are.
    pub name: String,
    /// The model server's own port, captured on the loopback interface.
    pub port: u16,
}

/// `GET /api/v1/capture`: how calls made straight to a model server are
/// measured, for the Get started and Settings views.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaptureDoc {
    /// Whether the capture runs.
    pub state: CaptureState,
    /// The interface captured (`lo`, `any`...), when asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<String>,
    /// The ports measured (state `on`).
    #[serde(default)]
    pub routes: Vec<CaptureRouteDoc>,
    /// Why the capture is not running (state `unavailable`), or why it
    /// could not run if it were turned on (state `off`), in one line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The one command that grants the permission the capture helper
    /// lacks, when that is what is missing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant_command: Option<String>,
    /// Whether the helper may open the packet socket now (checked by
    /// running it); `None` when not checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permitted: Option<bool>,
}
