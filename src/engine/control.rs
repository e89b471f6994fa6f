//! What front ends may change or start in a running engine, and the
//! documents they exchange: bound routes, the tok/s history for the chart,
//! discovered servers, the editable settings, and demo traffic. The shapes
//! are the UI contract's (the control API serves them over HTTP, the tray
//! app through Tauri commands with the same names).

use serde::{Deserialize, Serialize};

use super::host::BoundRoute;
use crate::config::RouteSpec;
use crate::discover::Discovered;

/// A bound route as the UI shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteInfo {
    pub name: String,
    pub listen: String,
    pub upstream: String,
    /// The URL to point a client at instead of the upstream's.
    pub proxy_url: String,
}

impl From<&BoundRoute> for RouteInfo {
    fn from(r: &BoundRoute) -> Self {
        RouteInfo {
            name: r.name.clone(),
            listen: r.listen.to_string(),
            upstream: r.upstream.clone(),
            proxy_url: r.proxy_url(),
        }
    }
}

/// `GET /api/v1/routes`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoutesDoc {
    pub routes: Vec<RouteInfo>,
}

/// One global tok/s reading for the last-hour chart.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct HistoryPoint {
    /// Unix time in milliseconds.
    pub t: u64,
    pub tps: f64,
}

/// `GET /api/v1/stats/history`: readings with a real tps, oldest first.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HistoryDoc {
    pub points: Vec<HistoryPoint>,
}

/// A route as the settings form edits it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteDoc {
    pub name: String,
    pub listen: String,
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
    pub kind: String,
    pub label: String,
    pub port: u16,
    pub upstream: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    pub suggested_route: RouteDoc,
    pub proxy_url: String,
}

impl From<&Discovered> for ServerDoc {
    fn from(d: &Discovered) -> Self {
        ServerDoc {
            kind: format!("{:?}", d.kind).to_lowercase(),
            label: d.kind.label().to_owned(),
            port: d.port,
            upstream: d.upstream.clone(),
            detail: d.detail.clone(),
            suggested_route: RouteDoc::from(&d.suggested_route),
            proxy_url: format!("http://{}", d.suggested_route.listen),
        }
    }
}

/// `GET /api/v1/discover`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiscoveredDoc {
    pub servers: Vec<ServerDoc>,
}

/// The settings the UI edits. `config_path` is informational (ignored when
/// saving).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SettingsDoc {
    pub routes: Vec<RouteDoc>,
    pub slow_ttft_ms: u64,
    pub notifications: bool,
    pub notify_settled: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_path: Option<String>,
}

/// The answer to a save.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SaveOutcome {
    pub saved: bool,
    /// Route changes are saved but only take effect after a restart.
    pub restart_required: bool,
    pub config_path: String,
}

/// `POST /api/v1/demo`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DemoDoc {
    pub running: bool,
    pub route: RouteInfo,
}
