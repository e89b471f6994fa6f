//! The Tauri commands the window calls: one per control API request, same
//! name and same result document (`docs/api.md`, "Endpoints"). Each
//! is a thin forward to the engine handle; the engine owns every decision
//! (validation, what a save writes, what the demo starts), so the browser
//! and the window cannot drift apart.
//!
//! Errors are the engine interface's [`QueryError`], the control API's too
//! (which answers each kind with its status); a command rejects the
//! `invoke` promise with the error's message as a plain string, as the
//! contract says (`Tauri commands reject with the error string`). Argument
//! checks (the history filter, `limit`) are the model's, shared with the
//! control API.

use serde::{Deserialize, Serialize};
use speedtap::host::EngineHandle;
use speedtap::model::Stats;
use speedtap::model::MAX_LIMIT;
use speedtap::model::{time_bound, ExportFormat, HistoryFilter, ModelSummary, QueryError};
use speedtap::model::{Call, CallsQuery, EngineQueries};
use speedtap::model::{
    CaptureDoc, DemoDoc, DiscoveredDoc, HistoryDoc, RoutesDoc, SaveOutcome, SettingsDoc,
};
use speedtap::model::{DepthDoc, DepthQuery, ServersDoc};
use tauri::State;

/// What a command answers: its document, or the engine interface's error
/// (serialised as its message).
pub type Result<T> = std::result::Result<T, QueryError>;

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
        // As the HTTP endpoint: the unmetered calls only on request.
        unmetered: false,
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

/// The model servers followed on this machine, like `GET /api/v1/servers`.
#[tauri::command]
pub async fn servers(engine: State<'_, Engine>) -> Result<ServersDoc> {
    Ok(engine.0.servers().await)
}

/// Never measure a followed server again, like `POST
/// /api/v1/servers/NAME/ignore`.
#[tauri::command]
pub async fn ignore_server(engine: State<'_, Engine>, name: String) -> Result<ServersDoc> {
    engine.0.ignore_server(name).await
}

/// How calls made straight to a model server are measured, like
/// `GET /api/v1/capture` (runs the capture helper once to check its
/// permission when the capture is off).
#[tauri::command]
pub async fn capture(engine: State<'_, Engine>) -> Result<CaptureDoc> {
    Ok(engine.0.capture().await)
}

#[tauri::command]
pub async fn get_settings(engine: State<'_, Engine>) -> Result<SettingsDoc> {
    engine.0.get_settings().await
}

/// Validates and writes the config file; the threshold and notification
/// switches apply at once, route changes after a restart.
#[tauri::command]
pub async fn save_settings(
    engine: State<'_, Engine>,
    settings: SettingsDoc,
) -> Result<SaveOutcome> {
    engine.0.save_settings(settings).await
}

/// Starts the simulator, a `demo` route and a minute of demo traffic.
#[tauri::command]
pub async fn start_demo(engine: State<'_, Engine>) -> Result<DemoDoc> {
    engine.0.start_demo().await
}

// ---- the stored history -----------------------------------------------------

/// A time bound as the page sends it: unix milliseconds (a JSON number) or
/// an RFC 3339 string, as `since=`/`until=` accept over HTTP.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum TimeArg {
    Ms(u64),
    Text(String),
}

/// The `filter` argument of `history`, `models` and `export`:
/// `{model?, route?, client?, since?, until?, limit?}`.
/// [`HistoryFilter`] has no `Deserialize` (its times are already parsed), so
/// the page's shape is read here and converted by [`FilterArg::into_filter`]
/// with the HTTP API's rules. Unknown keys are ignored, as unknown query
/// parameters are.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct FilterArg {
    pub model: Option<String>,
    pub route: Option<String>,
    pub client: Option<String>,
    pub since: Option<TimeArg>,
    pub until: Option<TimeArg>,
    pub limit: Option<usize>,
}

/// `history`'s default list size, as `GET /api/v1/history`'s.
pub const HISTORY_DEFAULT_LIMIT: usize = 100;

impl FilterArg {
    /// The store's filter, by the rules of `GET /api/v1/history`:
    /// `model: ""` / `client: ""` select the calls that named none (the
    /// `""` group of `models`); an empty `route`, `since` or `until` is no
    /// filter; `since` must be before `until` (`[since, until)`). `limit`
    /// is left to the caller: each command has its own rule.
    pub fn into_filter(self) -> std::result::Result<HistoryFilter, String> {
        let filter = HistoryFilter {
            model: self.model,
            route: self.route.filter(|r| !r.is_empty()),
            client: self.client,
            since_ms: time_arg("since", self.since)?,
            until_ms: time_arg("until", self.until)?,
            ..HistoryFilter::default()
        };
        filter.check_window()?;
        Ok(filter)
    }
}

fn time_arg(name: &str, arg: Option<TimeArg>) -> std::result::Result<Option<u64>, String> {
    match arg {
        None => Ok(None),
        Some(TimeArg::Ms(ms)) => Ok(Some(ms)),
        Some(TimeArg::Text(text)) => time_bound(name, &text),
    }
}

/// `models` -> `{"models": [ModelSummary]}`, like `GET /api/v1/models`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelsDoc {
    pub models: Vec<ModelSummary>,
}

/// Stored calls, newest first. `limit` defaults to 100 and is clamped like
/// the HTTP endpoint's. Without a store: the engine's "no store: ..."
/// message.
#[tauri::command]
pub async fn history(engine: State<'_, Engine>, filter: Option<FilterArg>) -> Result<CallsDoc> {
    let filter = filter.unwrap_or_default();
    let limit = filter.limit.unwrap_or(HISTORY_DEFAULT_LIMIT).min(MAX_LIMIT);
    let mut filter = filter.into_filter().map_err(QueryError::BadInput)?;
    filter.limit = Some(limit);
    let calls = engine.0.history(filter).await?;
    Ok(CallsDoc { calls })
}

/// Decode speed against context depth for one model, with its fitted
/// line, like `GET /api/v1/history/depth` (`model` required; `since` and
/// `until` as in the history filter).
#[tauri::command]
pub async fn history_depth(
    engine: State<'_, Engine>,
    model: String,
    route: Option<String>,
    since: Option<TimeArg>,
    until: Option<TimeArg>,
) -> Result<DepthDoc> {
    let query = DepthQuery {
        model,
        route,
        since_ms: time_arg("since", since).map_err(QueryError::BadInput)?,
        until_ms: time_arg("until", until).map_err(QueryError::BadInput)?,
    };
    query.check().map_err(QueryError::BadInput)?;
    engine.0.history_depth(query).await
}

/// Per (model, route) figures over the selected calls (`limit` ignored).
#[tauri::command]
pub async fn models(engine: State<'_, Engine>, filter: Option<FilterArg>) -> Result<ModelsDoc> {
    let filter = filter
        .unwrap_or_default()
        .into_filter()
        .map_err(QueryError::BadInput)?;
    let models = engine.0.models(filter).await?;
    Ok(ModelsDoc { models })
}

/// The export file's text (`csv`, the default, or `jsonl`) of every call
/// the filter selects (`limit` ignored, as over HTTP); the page saves it.
#[tauri::command]
pub async fn export(
    engine: State<'_, Engine>,
    format: Option<String>,
    filter: Option<FilterArg>,
) -> Result<String> {
    let format = export_format(format.as_deref()).map_err(QueryError::BadInput)?;
    let filter = filter
        .unwrap_or_default()
        .into_filter()
        .map_err(QueryError::BadInput)?;
    let bytes = engine.0.export(filter, format).await?;
    // CSV and JSON Lines are written as UTF-8 by the store.
    String::from_utf8(bytes).map_err(|e| QueryError::Io(format!("export is not UTF-8: {e}")))
}

/// `None` is CSV, as a bare `GET /api/v1/export` is.
fn export_format(format: Option<&str>) -> std::result::Result<ExportFormat, String> {
    format
        .map_or(Ok(ExportFormat::Csv), str::parse)
        .map_err(|e| format!("format: {e}"))
}

#[cfg(test)]
mod history_args_tests {
    use super::*;
    use serde_json::json;

    fn filter(v: serde_json::Value) -> std::result::Result<HistoryFilter, String> {
        serde_json::from_value::<FilterArg>(v)
            .map_err(|e| e.to_string())?
            .into_filter()
    }

    #[test]
    fn the_pages_filter_becomes_the_stores() {
        assert_eq!(filter(json!({})).unwrap(), HistoryFilter::default());
        let f = filter(json!({
            "model": "qwen3:8b", "route": "ollama", "client": "curl",
            "since": 1_764_496_927_000u64, "until": "2026-11-30T10:42:07Z", "limit": 5,
            "unknown": true
        }))
        .unwrap();
        assert_eq!(f.model.as_deref(), Some("qwen3:8b"));
        assert_eq!(f.route.as_deref(), Some("ollama"));
        assert_eq!(f.client.as_deref(), Some("curl"));
        assert_eq!(f.since_ms, Some(1_764_496_927_000));
        assert_eq!(
            f.until_ms,
            speedtap::model::time::parse_time("2026-11-30T10:42:07Z").ok()
        );
        // The limit is each command's business, not the filter's.
        assert_eq!(f.limit, None);
        // Unix ms as a string parse too, as over HTTP.
        assert_eq!(
            filter(json!({"since": "1000"})).unwrap().since_ms,
            Some(1000)
        );
    }

    #[test]
    fn empty_values_follow_the_http_rules() {
        let f = filter(json!({"model": "", "client": "", "route": "", "since": "", "until": null}))
            .unwrap();
        // Named none...
        assert_eq!(f.model.as_deref(), Some(""));
        assert_eq!(f.client.as_deref(), Some(""));
        // ...but every call has a route, and an empty time is no bound.
        assert_eq!((f.route, f.since_ms, f.until_ms), (None, None, None));
    }

    #[test]
    fn bad_values_are_refused_naming_the_argument() {
        let err = filter(json!({"since": "yesterday"})).unwrap_err();
        assert!(err.starts_with("since must be unix milliseconds"), "{err}");
        let err = filter(json!({"until": "soon"})).unwrap_err();
        assert!(err.starts_with("until "), "{err}");
        let err = filter(json!({"since": 2000, "until": 1000})).unwrap_err();
        assert!(err.starts_with("since must be before until"), "{err}");
        assert!(
            filter(json!({"since": 5, "until": 5})).is_err(),
            "empty window"
        );
        assert!(filter(json!({"since": -1})).is_err());
        assert!(filter(json!({"limit": "ten"})).is_err());
    }

    #[test]
    fn export_format_defaults_to_csv_and_names_a_bad_one() {
        assert_eq!(export_format(None), Ok(ExportFormat::Csv));
        assert_eq!(export_format(Some("jsonl")), Ok(ExportFormat::Jsonl));
        assert_eq!(export_format(Some("CSV")), Ok(ExportFormat::Csv));
        let err = export_format(Some("xml")).unwrap_err();
        assert!(err.starts_with("format: "), "{err}");
    }

    #[test]
    fn errors_reach_the_page_as_their_message() {
        let e = QueryError::BadInput("since must be ...".into());
        assert_eq!(
            serde_json::to_value(&e).unwrap(),
            json!("since must be ...")
        );
    }
}
