//! The engine: proxy listeners, the actors that meter each call, and the
//! records and events front ends consume.
//!
//! Data flow: a route's [`proxy`] starts a [`call_actor::CallActor`] per
//! metered request and feeds it frames through a tap; call actors publish
//! snapshots to the [`supervisor::Supervisor`], which keeps the active and
//! recent calls, the global meter and calibration, and fans events out to
//! subscribers; the [`notifier::Notifier`] turns late first tokens into
//! alarms. [`host`] builds and runs all of it.

pub mod call_actor;
pub mod control;
pub mod demo;
pub mod details;
pub mod host;
pub mod messages;
pub mod metrics;
pub mod model;
pub mod notifier;
pub mod otlp;
pub mod proxy;
pub mod queries;
pub mod supervisor;

pub use host::{BoundRoute, Engine, EngineError, EngineHandle, EngineOptions, RunningEngine};
pub use model::{Call, CallIdentity, CallStatus, EngineEvent, SlowFirstToken, SpeedEvent};
pub use queries::{CallsQuery, EngineQueries};
