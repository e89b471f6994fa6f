//! The window's commands about the tray app itself, which the control API
//! has no counterpart for (`speedtap run` has no login entry and stops on
//! a taken port): start at login ([`crate::autostart`]) and the ports the
//! app could not have ([`crate::ports`]). In a browser the page finds no
//! such commands and shows neither.

use serde::Serialize;
use speedtap::model::QueryError;
use tauri::{AppHandle, Manager, Runtime, State};

use crate::autostart::LoginItem;
use crate::commands::{Engine, Result};
use crate::ports::{next_free_port, Conflicts, PortConflict};

/// `port_conflicts` -> `{"conflicts": [PortConflict]}`.
#[derive(Clone, Debug, Serialize)]
pub struct ConflictsDoc {
    pub conflicts: Vec<PortConflict>,
}

/// The listeners that could not be bound at start, each with its holder
/// (when known) and the next free port.
#[tauri::command]
pub fn port_conflicts<R: Runtime>(app: AppHandle<R>) -> ConflictsDoc {
    ConflictsDoc {
        conflicts: app
            .try_state::<Conflicts>()
            .map(|c| c.list())
            .unwrap_or_default(),
    }
}

/// Starts the route that could not have its port on the next free one
/// (looked up again now) and answers its new address. The config file is
/// left alone: the window's Settings saves a new address for good.
#[tauri::command]
pub async fn use_free_port<R: Runtime>(
    app: AppHandle<R>,
    engine: State<'_, Engine>,
    route: String,
) -> Result<String> {
    let conflicts = app
        .try_state::<Conflicts>()
        .ok_or_else(|| QueryError::NotFound(format!("no port conflict for route {route}")))?;
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
    let bound = engine
        .0
        .add_route(spec)
        .await
        .map_err(|e| QueryError::Conflict(e.to_string()))?;
    conflicts.resolve(&route);
    #[cfg(all(desktop, not(test)))]
    crate::tray::refresh(&app).await;
    Ok(bound.listen.to_string())
}

/// `{"available": bool, "enabled": bool}`: whether the session starts
/// speedtap at login.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AutostartDoc {
    pub available: bool,
    pub enabled: bool,
}

fn autostart_doc<R: Runtime>(app: &AppHandle<R>) -> AutostartDoc {
    match app.try_state::<LoginItem>() {
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

#[tauri::command]
pub fn get_autostart<R: Runtime>(app: AppHandle<R>) -> AutostartDoc {
    autostart_doc(&app)
}

/// Turns start at login on or off; answers the new state. The tray's check
/// item follows.
#[tauri::command]
pub async fn set_autostart<R: Runtime>(app: AppHandle<R>, enabled: bool) -> Result<AutostartDoc> {
    let item = app
        .try_state::<LoginItem>()
        .ok_or_else(|| QueryError::Unavailable("start at login is not available here".into()))?;
    item.set_enabled(enabled).map_err(|e| {
        QueryError::Io(format!(
            "cannot change {}: {e}",
            item.user_entry().display()
        ))
    })?;
    #[cfg(all(desktop, not(test)))]
    crate::tray::refresh(&app).await;
    Ok(autostart_doc(&app))
}
