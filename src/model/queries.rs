//! What front ends (control API, terminal view, tray) may ask of a running
//! engine. A trait so the control API can be tested against a fake and the
//! engine's internals (actors) stay private.

use std::future::Future;

use serde::Serialize;
use tokio::sync::mpsc;

use super::call::{Call, EngineEvent};
use super::control::{
    CaptureDoc, DemoDoc, DiscoveredDoc, HistoryDoc, RoutesDoc, SaveOutcome, SettingsDoc,
};
use super::history::{DepthDoc, DepthQuery, ExportFormat, HistoryFilter, ModelSummary};
use super::servers::ServersDoc;
use super::stats::Stats;

/// Why a request to the engine failed. Each kind has one HTTP status
/// ([`QueryError::http_status`]), which the control API answers with; the
/// tray app's commands reject with the message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    /// The request itself is wrong (a settings field, a filter): 400.
    #[error("{0}")]
    BadInput(String),
    /// What was asked for does not exist here: 404.
    #[error("{0}")]
    NotFound(String),
    /// The request is fine but the state it would change is not (the
    /// config file on disk does not parse): 409.
    #[error("{0}")]
    Conflict(String),
    /// Reading or writing failed on the engine's side (the config file,
    /// the store, the simulator): 500.
    #[error("{0}")]
    Io(String),
    /// The engine runs without what this needs (history without a store):
    /// 503.
    #[error("{0}")]
    Unavailable(String),
}

impl QueryError {
    /// The HTTP status the control API answers this error with. The one
    /// place errors of the engine interface become statuses.
    pub fn http_status(&self) -> u16 {
        match self {
            QueryError::BadInput(_) => 400,
            QueryError::NotFound(_) => 404,
            QueryError::Conflict(_) => 409,
            QueryError::Io(_) => 500,
            QueryError::Unavailable(_) => 503,
        }
    }

    /// The message alone.
    pub fn message(&self) -> &str {
        match self {
            QueryError::BadInput(m)
            | QueryError::NotFound(m)
            | QueryError::Conflict(m)
            | QueryError::Io(m)
            | QueryError::Unavailable(m) => m,
        }
    }
}

/// Serialised as its message: what the tray app's commands reject with.
impl Serialize for QueryError {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.message())
    }
}

/// The answer of a history query on an engine without a store.
pub const NO_STORE: &str = "no store: history needs --db (it is off with --no-db)";

/// `GET /api/v1/calls?limit=N&route=NAME`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallsQuery {
    /// At most this many calls, newest first (contract default 100).
    pub limit: usize,
    /// Only calls of this route.
    pub route: Option<String>,
    /// Also the unmetered calls (passed through, not measured), which are
    /// kept apart and left out unless asked for (`unmetered=1`).
    pub unmetered: bool,
}

impl Default for CallsQuery {
    fn default() -> Self {
        CallsQuery {
            limit: 100,
            route: None,
            unmetered: false,
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
    /// The model servers followed on this machine, found as they start.
    fn servers(&self) -> impl Future<Output = ServersDoc> + Send {
        async { ServersDoc::default() }
    }
    /// Never measure the followed server `name` again (kept across
    /// restarts); answers the new list.
    fn ignore_server(
        &self,
        name: String,
    ) -> impl Future<Output = Result<ServersDoc, QueryError>> + Send {
        async move {
            Err(QueryError::NotFound(format!(
                "no followed server {name:?}: this engine doesn't follow the machine"
            )))
        }
    }
    /// How calls made straight to a model server are measured (the
    /// passive capture's state, and the command that grants its
    /// permission when missing).
    fn capture(&self) -> impl Future<Output = CaptureDoc> + Send {
        async { CaptureDoc::default() }
    }
    /// The editable settings.
    fn get_settings(&self) -> impl Future<Output = Result<SettingsDoc, QueryError>> + Send {
        async {
            Err(QueryError::NotFound(
                "settings are not available here".to_owned(),
            ))
        }
    }
    /// Validates and saves settings.
    fn save_settings(
        &self,
        doc: SettingsDoc,
    ) -> impl Future<Output = Result<SaveOutcome, QueryError>> + Send {
        let _ = doc;
        async {
            Err(QueryError::NotFound(
                "settings are not available here".to_owned(),
            ))
        }
    }
    /// Starts demo traffic.
    fn start_demo(&self) -> impl Future<Output = Result<DemoDoc, QueryError>> + Send {
        async { Err(QueryError::Io("the demo is not available here".to_owned())) }
    }
    /// Settled calls from the store, newest first.
    fn history(
        &self,
        filter: HistoryFilter,
    ) -> impl Future<Output = Result<Vec<Call>, QueryError>> + Send {
        let _ = filter;
        async { Err(QueryError::Unavailable(NO_STORE.to_owned())) }
    }
    /// Per (model, route) aggregates from the store.
    fn models(
        &self,
        filter: HistoryFilter,
    ) -> impl Future<Output = Result<Vec<ModelSummary>, QueryError>> + Send {
        let _ = filter;
        async { Err(QueryError::Unavailable(NO_STORE.to_owned())) }
    }
    /// Decode speed against context depth for one model, from the store's
    /// settled calls, with its fitted line (`GET /api/v1/history/depth`).
    fn history_depth(
        &self,
        query: DepthQuery,
    ) -> impl Future<Output = Result<DepthDoc, QueryError>> + Send {
        let _ = query;
        async { Err(QueryError::Unavailable(NO_STORE.to_owned())) }
    }
    /// The stored calls `filter` selects as a whole export file in `format`
    /// (what `speedtap export` writes: oldest first, CSV with its header
    /// row or JSON Lines), for `GET /api/v1/export`. Built in memory: the
    /// API answers with one body and a length.
    fn export(
        &self,
        filter: HistoryFilter,
        format: ExportFormat,
    ) -> impl Future<Output = Result<Vec<u8>, QueryError>> + Send {
        let _ = (filter, format);
        async {
            Err(QueryError::Unavailable(
                "no store: export needs --db (it is off with --no-db)".to_owned(),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_has_its_status_and_serialises_as_its_message() {
        let cases = [
            (QueryError::BadInput("a".into()), 400),
            (QueryError::NotFound("b".into()), 404),
            (QueryError::Conflict("c".into()), 409),
            (QueryError::Io("d".into()), 500),
            (QueryError::Unavailable("e".into()), 503),
        ];
        for (e, status) in cases {
            assert_eq!(e.http_status(), status, "{e:?}");
            assert_eq!(
                serde_json::to_value(&e).ok(),
                Some(serde_json::Value::String(e.message().to_owned()))
            );
            assert_eq!(e.to_string(), e.message());
        }
    }
}
