//! What front ends (control API, terminal view, tray) may ask of a running
//! engine. A trait so the control API can be tested against a fake and the
//! engine's internals (actors) stay private.

use std::future::Future;

use tokio::sync::mpsc;

use super::call::{Call, EngineEvent};
use super::control::{DemoDoc, DiscoveredDoc, HistoryDoc, RoutesDoc, SaveOutcome, SettingsDoc};
use super::history::{ExportFormat, HistoryFilter, ModelSummary};
use super::stats::Stats;

/// `GET /api/v1/calls?limit=N&route=NAME`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallsQuery {
    /// At most this many calls, newest first (contract default 100).
    pub limit: usize,
    /// Only calls of this route.
    pub route: Option<String>,
}

impl Default for CallsQuery {
    fn default() -> Self {
        CallsQuery {
            limit: 100,
            route: None,
        }
    }
}

/// Read access to a running engine.
pub trait EngineQueries: Clone + Send + Sync + 'static {
    /// Calls newest first, in-flight ones included.
    fn calls(&self, query: CallsQuery) -> impl Future<Output = Vec<Call>> + Send;
    /// One call by id (`c-000042`), in flight or recent.
    fn call(&self, id: String) -> impl Future<Output = Option<Call>> + Send;
    /// The latest global reading.
    fn stats(&self) -> impl Future<Output = Stats> + Send;
    /// A new subscription to every [`EngineEvent`]. The channel is bounded;
    /// a subscriber that falls behind is dropped by the engine (its
    /// receiver then ends), never waited on.
    fn subscribe(&self) -> impl Future<Output = mpsc::Receiver<EngineEvent>> + Send;
    /// The Prometheus text exposition of the engine's metrics.
    fn metrics_text(&self) -> String;

    // The UI's extensions (see `model::control`). The defaults describe an
    // engine without them, so test fakes only implement what they need.

    /// The routes bound now.
    fn routes(&self) -> impl Future<Output = RoutesDoc> + Send {
        async { RoutesDoc::default() }
    }
    /// Global tok/s readings of the last hour.
    fn stats_history(&self) -> impl Future<Output = HistoryDoc> + Send {
        async { HistoryDoc::default() }
    }
    /// Local model servers found now.
    fn discover(&self) -> impl Future<Output = DiscoveredDoc> + Send {
        async { DiscoveredDoc::default() }
    }
    /// The editable settings.
    fn get_settings(&self) -> impl Future<Output = Result<SettingsDoc, String>> + Send {
        async { Err("settings are not available here".to_owned()) }
    }
    /// Validates and saves settings.
    fn save_settings(
        &self,
        doc: SettingsDoc,
    ) -> impl Future<Output = Result<SaveOutcome, String>> + Send {
        let _ = doc;
        async { Err("settings are not available here".to_owned()) }
    }
    /// Starts demo traffic.
    fn start_demo(&self) -> impl Future<Output = Result<DemoDoc, String>> + Send {
        async { Err("the demo is not available here".to_owned()) }
    }
    /// Settled calls from the store, newest first.
    fn history(
        &self,
        filter: HistoryFilter,
    ) -> impl Future<Output = Result<Vec<Call>, String>> + Send {
        let _ = filter;
        async { Err("no store: history needs --db (it is off with --no-db)".to_owned()) }
    }
    /// Per (model, route) aggregates from the store.
    fn models(
        &self,
        filter: HistoryFilter,
    ) -> impl Future<Output = Result<Vec<ModelSummary>, String>> + Send {
        let _ = filter;
        async { Err("no store: history needs --db (it is off with --no-db)".to_owned()) }
    }
    /// The stored calls `filter` selects as a whole export file in `format`
    /// (what `speedtap export` writes: oldest first, CSV with its header
    /// row or JSON Lines), for `GET /api/v1/export`. Built in memory: the
    /// API answers with one body and a length.
    fn export(
        &self,
        filter: HistoryFilter,
        format: ExportFormat,
    ) -> impl Future<Output = Result<Vec<u8>, String>> + Send {
        let _ = (filter, format);
        async { Err("no store: export needs --db (it is off with --no-db)".to_owned()) }
    }
}
