//! The contract types: what the engine publishes and what every front end
//! (the control API, the terminal view, the tray app) and the store speak.
//!
//! Calls, their identity, status and details, the TTFT breakdown, the
//! snapshot every measurement takes, the global stats, the history filters
//! and their validation, the control documents the UI exchanges, routes,
//! and the engine-handle trait front ends talk to. This module sits below
//! everything that uses it and imports nothing of the crate's: its field
//! names and spellings are the external contract (`docs/api.md`): extend,
//! don't rename.

pub mod api_kind;
pub mod call;
pub mod control;
pub mod failure;
pub mod history;
pub mod otlp_endpoint;
pub mod queries;
pub mod route;
pub mod servers;
pub mod slowdown;
pub mod snapshot;
pub mod stats;
pub mod time;
pub mod wait;

pub use api_kind::ApiKind;
pub use call::{
    json_line, Call, CallDetails, CallIdentity, CallStatus, EngineEvent, PromptTruncated, SeenBy,
    SlowFirstToken, SpeedEvent, TtftBreakdown,
};
pub use control::{
    BoundRoute, CaptureDoc, CaptureRouteDoc, CaptureState, DemoDoc, DiscoveredDoc, HistoryDoc,
    HistoryPoint, RouteDoc, RouteInfo, RoutesDoc, SaveOutcome, ServerDoc, SettingsDoc,
};
pub use failure::{clean_message, Failure, FailureKind};
pub use history::{
    time_bound, DepthDoc, DepthFit, DepthPoint, DepthQuery, ExportFormat, HistoryFilter,
    ModelSummary, MAX_LIMIT,
};
pub use queries::{CallsQuery, EngineQueries, QueryError};
pub use route::{RouteSpec, Upstream};
pub use servers::{product_name, FollowedServer, FollowedState, LoadedModelDoc, ServersDoc};
pub use slowdown::{Slowdown, SlowdownCause};
pub use snapshot::{Phase, Snapshot, TokenSource};
pub use stats::Stats;
pub use wait::{
    ContextUse, DraftCounts, Placement, ProgressSource, PromptTruncation, StartKind, Wait,
    WaitReason,
};
