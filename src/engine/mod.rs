//! The engine: the two interceptors, the actors that meter each call, and
//! the records and events front ends consume.
//!
//! Two interceptors sit side by side and see calls two ways: a route's
//! [`proxy`] forwards the client's requests to the model server and taps
//! the bytes on their way; the [`capture`] reads the loopback traffic to
//! the model server's own port. Neither knows the other: both start calls
//! through the [`link`] ([`link::EngineLink::start_call`]: one call setup,
//! one id sequence, shared telemetry pollers) and read response heads by
//! one rule ([`http_meta`]); the proxy tells the capture, through the
//! link, which upstream connections are its own, so no call is recorded
//! twice.
//!
//! Data flow: an interceptor starts a [`call_actor::CallActor`] per
//! metered request and feeds it frames (the proxy through a tap, the
//! capture from its packets), with the same messages; call actors publish
//! snapshots to the [`supervisor::Supervisor`], which keeps the active and
//! recent calls, the global meter and calibration, and fans events out to
//! subscribers; the [`notifier::Notifier`] turns late first tokens into
//! alarms; each route's [`telemetry::TelemetryPoller`] asks the model
//! server what it publishes and explains every waiting call's wait.
//! [`crate::host`] builds and runs all of it.

pub mod call_actor;
pub mod capture;
pub mod decode_watch;
pub mod details;
pub mod failure;
pub mod http_meta;
pub mod link;
pub mod messages;
pub mod metrics;
pub mod notifier;
pub mod proxy;
pub mod relay;
pub mod supervisor;
pub mod telemetry;
