//! Building and hosting the engine, the same way for every front end: the
//! headless `speedtap run`, the tray app and the integration tests.
//!
//! [`Engine::start`] binds every listener first (so a taken port is an
//! error before anything runs), starts the actors on their own threads (an
//! actix `System` for the supervisor and notifier, plus metering arbiters
//! for the call actors), and serves the routes and the control API on the
//! caller's tokio runtime. [`RunningEngine::shutdown`] stops accepting,
//! lets in-flight calls drain for a grace period, and stops the actors,
//! which settles whatever is still open.

pub mod args;
pub mod capture;
pub mod demo;
mod handle;
mod options;
pub mod settings;
mod shutdown;
mod start;
mod summary;
pub mod watch;

pub use capture::{capture_permitted, CaptureRouteError};
pub use handle::EngineHandle;
pub use options::{
    CaptureOptions, CaptureStatus, EngineError, EngineOptions, DEFAULT_MAX_DB_BYTES,
    DEFAULT_RETENTION,
};
pub use shutdown::SETTLE_WAIT;
pub use start::{Engine, RunningEngine, PRUNE_EVERY};
pub use watch::{look_once, FoundNow, WatchOptions, WATCH_EVERY};

use handle::{bind_route, read, spawn_route, unix_ms_now, write, LiveSettings, Shared};
