//! The messages between the proxy and the actors, one struct each, named
//! as facts. Delivery: the proxy only ever uses `do_send` (never awaits an
//! actor), so metering can't slow the traffic it measures.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use actix::Message;
use bytes::Bytes;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::decode::request_fields::RequestFields;
use crate::meter::calibration::CalibrationTable;
use crate::meter::pipeline::StreamEnd;
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
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct Frame {
    pub bytes: Bytes,
    pub at: Instant,
}

/// Frames are waiting in this call's [`FrameQueue`]: the proxy's tap
/// queues every frame there and sends this only when the actor should look
/// now (see [`FrameQueue::push`]); otherwise the actor's snapshot tick
/// drains the queue. One message for many frames instead of one each.
#[derive(Message)]
#[rtype(result = "()")]
pub struct FramesQueued(pub Arc<FrameQueue>);

/// Queued frames that make the tap wake the actor although its first
/// output was seen: a bound on what waits for the tick.
pub const WAKE_AT_FRAMES: usize = 64;
/// Queued bytes that wake the actor, likewise (a large body going by).
pub const WAKE_AT_BYTES: usize = 256 * 1024;

/// One call's response frames on their way from the tap (a proxy thread)
/// to its actor (a metering thread), in arrival order.
///
/// The tap pushes each frame after timestamping it and before handing it
/// on; the lock is only ever held to push one frame or to swap the whole
/// vector out, so the proxy never waits on metering. Until the actor has
/// seen the call's first output every frame is wanted at once (the time to
/// first token and the phase change are live news); after it, frames wait
/// for the actor's snapshot tick (every 250 ms, which is as often as a call
/// publishes anyway) unless [`WAKE_AT_FRAMES`] or [`WAKE_AT_BYTES`] pile
/// up. Every figure uses the arrival time stamped on the frame, so when a
/// frame is metered changes no number.
#[derive(Debug)]
pub struct FrameQueue {
    inner: Mutex<Queued>,
    /// The actor wants each frame at once (cleared after the first output).
    prompt: AtomicBool,
}

#[derive(Debug, Default)]
struct Queued {
    frames: Vec<Frame>,
    bytes: usize,
    /// A `FramesQueued` is on its way and the queue wasn't drained since.
    woken: bool,
    /// The call settled (at its end marker) while the body goes on: later
    /// frames are forwarded to the client but no longer kept here, so a
    /// server that keeps sending after its marker costs no memory.
    closed: bool,
}

impl Default for FrameQueue {
    fn default() -> Self {
        FrameQueue {
            inner: Mutex::new(Queued::default()),
            prompt: AtomicBool::new(true),
        }
    }
}

impl FrameQueue {
    /// Queues one frame; true when the caller should send `FramesQueued`.
    pub fn push(&self, frame: Frame) -> bool {
        let prompt = self.prompt.load(Ordering::Relaxed);
        let Ok(mut q) = self.inner.lock() else {
            return false;
        };
        if q.closed {
            return false;
        }
        q.bytes += frame.bytes.len();
        q.frames.push(frame);
        let due = prompt || q.frames.len() >= WAKE_AT_FRAMES || q.bytes >= WAKE_AT_BYTES;
        let wake = due && !q.woken;
        q.woken |= wake;
        wake
    }

    /// Moves every queued frame into `into` (empty, its capacity reused for
    /// the next batch), oldest first.
    pub fn take(&self, into: &mut Vec<Frame>) {
        if let Ok(mut q) = self.inner.lock() {
            std::mem::swap(&mut q.frames, into);
            q.bytes = 0;
            q.woken = false;
        }
    }

    /// From now on frames may wait for the actor's tick.
    pub fn relax(&self) {
        self.prompt.store(false, Ordering::Relaxed);
    }

    /// The call is settled: frames queued so far and from now on are
    /// dropped (the tap still forwards them to the client).
    pub fn close(&self) {
        if let Ok(mut q) = self.inner.lock() {
            q.closed = true;
            q.frames = Vec::new();
            q.bytes = 0;
        }
    }
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

/// The captured connection went quiet at `at` long after the call's last
/// bytes (the capture interceptor only): if the protocol's end marker has
/// arrived, the call is over whatever became of the transport's tail (its
/// end of body or its FIN may have been dropped by the packet socket), so
/// it settles, at the marker. Without the marker it keeps waiting: a quiet
/// connection may be a long prefill.
#[derive(Message)]
#[rtype(result = "()")]
pub struct FlowQuiet {
    pub at: Instant,
}

/// The model the response names (OpenAI and Ollama chunks carry it), for a
/// captured call whose request bytes were lost before its `model` was read
/// (the capture interceptor only). It names the call only if the request
/// named none.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ResponseModel(pub String);

/// Forget this call without recording it: the capture started it for a
/// connection that turned out to be the proxy's own upstream connection,
/// which the proxy records itself (never twice).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Discard;

/// This call is a relay's leg (see [`super::relay`]): the relay's route.
/// Sent by the link once the relay judge has looked the connection up.
#[derive(Message)]
#[rtype(result = "()")]
pub struct RelayLeg(pub String);

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

/// A call turned out to be a relay's leg (see [`super::relay`]): listed,
/// never counted nor stored; paired with the relay's client call.
#[derive(Message)]
#[rtype(result = "()")]
pub struct LegFound {
    pub seq: u64,
    /// The relay's route.
    pub relay: String,
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

/// The last hour's settled rates from the store, at start: (settle time
/// in unix ms, the call's settled decode rate), oldest first. The hour's
/// high and low and the chart start from them instead of from nothing.
#[derive(Message)]
#[rtype(result = "()")]
pub struct SeedHour(pub Vec<(u64, f64)>);

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
