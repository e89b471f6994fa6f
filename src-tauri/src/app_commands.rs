//! The window's questions about the tray app itself, which the control API
//! has no counterpart for (`speedtap run` has no login entry and stops on
//! a taken port): start at login ([`crate::autostart`]) and the ports the
//! app could not have ([`crate::ports`]).
//!
//! The window runs in a process of its own ([`crate::window`]) and reads
//! everything else from the control API; these few it asks the tray
//! process over the single-instance socket ([`crate::instance`]): one JSON
//! line `{"command": ..., ...args}` each way, answered `{"ok": document}`
//! or `{"error": message}`. In a plain browser the page has no way to ask
//! and shows neither.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use speedtap::model::QueryError;

use crate::ports::{next_free_port, PortConflict};
use crate::App;

/// What a command answers: its document, or the engine interface's error.
pub type Result<T> = std::result::Result<T, QueryError>;

/// `port_conflicts` -> `{"conflicts": [PortConflict]}`.
#[derive(Clone, Debug, Serialize)]
pub struct ConflictsDoc {
    pub conflicts: Vec<PortConflict>,
}

/// `{"available": bool, "enabled": bool}`: whether the session starts
/// speedtap at login.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AutostartDoc {
    pub available: bool,
    pub enabled: bool,
}

/// One question, as the window sends it.
#[derive(Debug, Deserialize)]
#[serde(tag = "command", rename_all = "snake_case")]
enum Question {
    PortConflicts,
    UseFreePort { route: String },
    GetAutostart,
    SetAutostart { enabled: bool },
}

/// Answers one question line from the window process (see the module
/// docs), then redraws the tray, whose menu shows the same state.
pub async fn answer(app: &Arc<App>, line: &str) -> String {
    let result = match serde_json::from_str::<Question>(line) {
        Ok(question) => ask(app, question).await,
        Err(e) => Err(QueryError::BadInput(format!("not a question: {e}"))),
    };
    app.refresh_tray().await;
    match result {
        Ok(doc) => json!({ "ok": doc }),
        Err(e) => json!({ "error": e.to_string() }),
    }
    .to_string()
}

async fn ask(app: &App, q: Question) -> Result<Value> {
    Ok(match q {
        Question::PortConflicts => to_value(port_conflicts(app)),
        Question::UseFreePort { route } => to_value(use_free_port(app, route).await?),
        Question::GetAutostart => to_value(autostart_doc(app)),
        Question::SetAutostart { enabled } => to_value(set_autostart(app, enabled)?),
    })
}

fn to_value(doc: impl Serialize) -> Value {
    serde_json::to_value(doc).unwrap_or(Value::Null)
}

/// The listeners that could not be bound at start, each with its holder
/// (when known) and the next free port.
pub fn port_conflicts(app: &App) -> ConflictsDoc {
    ConflictsDoc {
        conflicts: app.conflicts.list(),
    }
}

/// Starts the route that could not have its port on the next free one
/// (looked up again now) and answers its new address. The config file is
/// left alone: the window's Settings saves a new address for good.
pub async fn use_free_port(app: &App, route: String) -> Result<String> {
    let conflicts = &app.conflicts;
    let conflict = conflicts
        .list()
        .into_iter()
        .find(|c| c.route.as_deref() == Some(route.as_str()))
        .ok_or_else(|| QueryError::NotFound(format!("no port conflict for route {route}")))?;
    let mut spec = conflict
        .spec
        .ok_or_else(|| QueryError::NotFound(format!("route {route} is not known")))?;
    spec.listen = next_free_port(spec.listen)
        .ok_or_else(|| QueryError::Conflict(format!("no free port near {}", spec.listen)))?;
    let bound = app
        .engine
        .add_route(spec)
        .await
        .map_err(|e| QueryError::Conflict(e.to_string()))?;
    conflicts.resolve(&route);
    Ok(bound.listen.to_string())
}

pub fn autostart_doc(app: &App) -> AutostartDoc {
    match &app.login {
        Some(item) => AutostartDoc {
            available: true,
            enabled: item.is_enabled(),
        },
        None => AutostartDoc {
            available: false,
            enabled: false,
        },
    }
}

/// Turns start at login on or off; answers the new state. The tray's check
/// item follows.
pub fn set_autostart(app: &App, enabled: bool) -> Result<AutostartDoc> {
    let item = app
        .login
        .as_ref()
        .ok_or_else(|| QueryError::Unavailable("start at login is not available here".into()))?;
    item.set_enabled(enabled).map_err(|e| {
        QueryError::Io(format!(
            "cannot change {}: {e}",
            item.user_entry().display()
        ))
    })?;
    Ok(autostart_doc(app))
}
