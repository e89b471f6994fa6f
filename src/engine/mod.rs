//! The engine: proxy listeners, the actors that meter each call, and the
//! records and events front ends consume.

pub mod metrics;
pub mod model;
pub mod queries;

pub use model::{Call, CallIdentity, CallStatus, EngineEvent, SlowFirstToken, SpeedEvent};
pub use queries::{CallsQuery, EngineQueries};
