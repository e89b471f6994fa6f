//! The engine: proxy listeners, the actors that meter each call, and the
//! records and events front ends consume.
//!
//! Data flow: a route's [`proxy`] starts a [`call_actor::CallActor`] per
//! metered request and feeds it frames through a tap; call actors publish
//! snapshots to the [`supervisor::Supervisor`], which keeps the active and
//! recent calls, the global meter and calibration, and fans events out to
//! subscribers; the [`notifier::Notifier`] turns late first tokens into
//! alarms; each route's [`telemetry::TelemetryPoller`] asks the model
//! server what it publishes and explains every waiting call's wait.
//! [`crate::host`] builds and runs all of it.

pub mod call_actor;
pub mod capture;
pub mod details;
pub mod messages;
pub mod metrics;
pub mod notifier;
pub mod proxy;
pub mod supervisor;
pub mod telemetry;
