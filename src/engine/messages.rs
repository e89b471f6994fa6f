//! The messages between the proxy and the actors, one struct each, named
//! as facts. Delivery: the proxy only ever uses `do_send` (never awaits an
//! actor), so metering can't slow the traffic it measures.

use actix::Message;
use bytes::Bytes;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::decode::request_fields::RequestFields;
use crate::meter::calibration::CalibrationTable;
use crate::metering::StreamEnd;
use crate::model::CallsQuery;
use crate::model::Snapshot;
use crate::model::Stats;
use crate::model::{Call, CallIdentity, EngineEvent, SlowFirstToken};

// === proxy -> CallActor ===

/// The request body's top-level `model` and `stream` as far as the body
/// has passed, sent each time one of them is found (the latest message
/// holds everything found so far).
#[derive(Message)]
#[rtype(result = "()")]
pub struct RequestFieldsSeen(pub RequestFields);

/// The upstream's response head arrived.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ResponseStarted {
    pub status: u16,
    pub content_type: Option<String>,
    pub at: Instant,
}

/// One response body frame, timestamped on arrival from the upstream,
/// before it was forwarded. The `Bytes` is a cheap clone of the frame the
/// client receives.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Frame {
    pub bytes: Bytes,
    pub at: Instant,
}

/// The response body ended (or the client left). Sent at most once per
/// call by the tap; the actor also settles from `stopping()` when it never
/// comes.
#[derive(Message)]
#[rtype(result = "()")]
pub struct BodyEnded {
    pub end: StreamEnd,
    pub at: Instant,
}

/// The upstream could not be reached (the proxy answered 502).
#[derive(Message)]
#[rtype(result = "()")]
pub struct UpstreamFailed {
    pub at: Instant,
}

/// Bytes of this call were lost in capture (sent by the capture
/// interceptor only): the call keeps what the server reported but shows no
/// rate, see `CallActor`'s report.
#[derive(Message)]
#[rtype(result = "()")]
pub struct CaptureGap;

/// Forget this call without recording it: the capture started it for a
/// connection that turned out to be the proxy's own upstream connection,
/// which the proxy records itself (never twice).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Discard;

// === CallActor / proxy -> Supervisor ===

/// A metered call was dispatched: it joins the active set.
#[derive(Message)]
#[rtype(result = "()")]
pub struct CallOpened {
    pub seq: u64,
    pub call: Call,
}

/// A metered call published a snapshot.
#[derive(Message)]
#[rtype(result = "()")]
pub struct CallProgress {
    pub seq: u64,
    pub identity: CallIdentity,
    pub speed: Snapshot,
    /// When the call's latest output arrived (feeds the global meter).
    pub last_output_at: Option<Instant>,
}

/// A call ended; this is its record. Sent exactly once per opened call.
#[derive(Message)]
#[rtype(result = "()")]
pub struct CallClosed {
    pub seq: u64,
    pub call: Call,
    /// A plausible exact/estimate ratio for (route, model) calibration.
    pub calibration_ratio: Option<f64>,
}

/// A call left the active set without a record (see [`Discard`]).
#[derive(Message)]
#[rtype(result = "()")]
pub struct CallDiscarded {
    pub seq: u64,
}

/// A call that was never metered (unknown path, unreachable upstream for
/// one): recorded as it is.
#[derive(Message)]
#[rtype(result = "()")]
pub struct PassedThrough {
    pub seq: u64,
    pub call: Call,
}

/// Send an event to every subscriber (the Notifier's alarms).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Broadcast(pub EngineEvent);

// === queries ===

/// A new bounded subscription to every engine event.
#[derive(Message)]
#[rtype(result = "mpsc::Receiver<EngineEvent>")]
pub struct Subscribe {
    pub capacity: usize,
}

/// Calls newest first.
#[derive(Message)]
#[rtype(result = "Vec<Call>")]
pub struct GetCalls(pub CallsQuery);

/// One call by id.
#[derive(Message)]
#[rtype(result = "Option<Call>")]
pub struct GetCall(pub String);

/// The latest global reading.
#[derive(Message)]
#[rtype(result = "Stats")]
pub struct GetStats;

/// The global tok/s readings of the last hour, for the chart.
#[derive(Message)]
#[rtype(result = "crate::model::HistoryDoc")]
pub struct GetHistory;

/// A copy of the calibration table (for persistence and inspection).
#[derive(Message)]
#[rtype(result = "CalibrationTable")]
pub struct GetCalibration;

// === -> Notifier ===

/// A call has waited `slow_ttft` for its first token and is still waiting.
#[derive(Message)]
#[rtype(result = "()")]
pub struct FirstTokenLate(pub SlowFirstToken);

/// Pause or resume desktop notifications (the tray's menu entry).
#[derive(Message)]
#[rtype(result = "()")]
pub struct SetNotificationsPaused(pub bool);

// === store ===

/// Hand the store's writer to the supervisor: from now on a call is only
/// reported settled once it is durable.
#[derive(Message)]
#[rtype(result = "()")]
pub struct AttachStore(pub std::sync::Arc<crate::store::StoreWriter>);

/// Take the writer back (shutdown), after which calls settle in memory.
#[derive(Message)]
#[rtype(result = "Option<std::sync::Arc<crate::store::StoreWriter>>")]
pub struct DetachStore;

/// The writer committed these calls (or failed to: `durable` false, and
/// they are settled in memory all the same).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Persisted {
    pub ids: Vec<String>,
    pub durable: bool,
}
