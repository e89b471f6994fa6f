//! The Tauri commands the window calls: one per control API request, same
//! name and same result document (`/tmp/ui-contract.md`, "Requests"). Each
//! is a thin forward to the engine handle; the engine owns every decision
//! (validation, what a save writes, what the demo starts), so the browser
//! and the window cannot drift apart.
//!
//! Errors reject the `invoke` promise with the engine's message as a plain
//! string, as the contract says (`Tauri commands reject with the error
//! string`).

use serde::{Deserialize, Serialize};
use speedtap::api::routes::MAX_LIMIT;
use speedtap::engine::control::{
    DemoDoc, DiscoveredDoc, HistoryDoc, RoutesDoc, SaveOutcome, SettingsDoc,
};
use speedtap::engine::{Call, CallsQuery, EngineHandle, EngineQueries};
use speedtap::meter::global::Stats;
use tauri::State;

/// Why a command failed. Serialised as its message.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CommandError {
    /// The engine refused (bad settings field, simulator could not start...).
    #[error("{0}")]
    Engine(String),
}

impl Serialize for CommandError {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

pub type Result<T> = std::result::Result<T, CommandError>;

/// The engine the commands forward to (managed state).
pub struct Engine(pub EngineHandle);

/// `calls` -> `{"calls": [Call]}`, like `GET /api/v1/calls`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CallsDoc {
    pub calls: Vec<Call>,
}

/// Newest first, in-flight ones included. `limit` defaults to 100 and is
/// clamped like the HTTP endpoint's; an empty `route` means all routes.
#[tauri::command]
pub async fn calls(
    engine: State<'_, Engine>,
    limit: Option<usize>,
    route: Option<String>,
) -> Result<CallsDoc> {
    let query = CallsQuery {
        limit: limit.unwrap_or(CallsQuery::default().limit).min(MAX_LIMIT),
        route: route.filter(|r| !r.is_empty()),
    };
    Ok(CallsDoc {
        calls: engine.0.calls(query).await,
    })
}

#[tauri::command]
pub async fn stats(engine: State<'_, Engine>) -> Result<Stats> {
    Ok(engine.0.stats().await)
}

#[tauri::command]
pub async fn stats_history(engine: State<'_, Engine>) -> Result<HistoryDoc> {
    Ok(engine.0.stats_history().await)
}

#[tauri::command]
pub async fn routes(engine: State<'_, Engine>) -> Result<RoutesDoc> {
    Ok(engine.0.routes().await)
}

/// Probes the usual local ports (takes up to about a second).
#[tauri::command]
pub async fn discover(engine: State<'_, Engine>) -> Result<DiscoveredDoc> {
    Ok(engine.0.discover().await)
}

#[tauri::command]
pub async fn get_settings(engine: State<'_, Engine>) -> Result<SettingsDoc> {
    engine.0.get_settings().await.map_err(CommandError::Engine)
}

/// Validates and writes the config file; the threshold and notification
/// switches apply at once, route changes after a restart.
#[tauri::command]
pub async fn save_settings(
    engine: State<'_, Engine>,
    settings: SettingsDoc,
) -> Result<SaveOutcome> {
    engine
        .0
        .save_settings(settings)
        .await
        .map_err(CommandError::Engine)
}

/// Starts the simulator, a `demo` route and a minute of demo traffic.
#[tauri::command]
pub async fn start_demo(engine: State<'_, Engine>) -> Result<DemoDoc> {
    engine.0.start_demo().await.map_err(CommandError::Engine)
}
