//! Where a proxied call is reported: [`CallSink`], one value per call
//! whichever way it goes. A call the decoders know is metered by its
//! actor; any other passes through and is recorded straight to the
//! supervisor, as `unmetered` (or `abandoned`, `upstream_error`). Each
//! phase of the proxy tells the sink what happened and the sink reports it
//! the right way, so no phase keeps two options side by side.

use std::time::SystemTime;

use actix::Addr;
use bytes::Bytes;
use http::response::Parts;
use http_body_util::{combinators::BoxBody, BodyExt};
use hyper::body::Incoming;
use tokio::time::Instant;

use super::tap::{CallTap, Capture, CaptureBody, ClientBodyFailed, Observed, TapBody};
use super::{BoxError, ProxyBody};
use crate::engine::call_actor::CallActor;
use crate::engine::http_meta::tap_content_type;
use crate::engine::link::CallStart;
use crate::engine::messages::{BodyEnded, PassedThrough, ResponseStarted, UpstreamFailed};
use crate::engine::supervisor::Supervisor;
use crate::meter::pipeline::StreamEnd;
use crate::model::{Call, CallDetails, CallIdentity, CallStatus};

/// Where one proxied call is reported.
pub enum CallSink {
    /// The call's actor meters it from the taps' frames.
    Metered(Addr<CallActor>),
    /// Nothing meters it: the record goes straight to the supervisor.
    PassedThrough(PassThrough),
}

impl CallSink {
    /// A call passed through unmetered, armed to report itself `abandoned`
    /// if dropped before the upstream answers.
    pub fn passed_through(supervisor: Addr<Supervisor>, call: &CallStart) -> Self {
        CallSink::PassedThrough(PassThrough {
            supervisor,
            seq: call.seq,
            identity: Some(call.identity()),
            client: call.client.clone(),
        })
    }

    /// Whether the call is metered (its request body is worth reading).
    pub fn is_metered(&self) -> bool {
        matches!(self, CallSink::Metered(_))
    }

    /// The client's request body on its way upstream: read for the call's
    /// fields when metered, untouched otherwise.
    pub fn request_body(
        &self,
        body: Observed<Incoming, ClientBodyFailed>,
    ) -> BoxBody<Bytes, hyper::Error> {
        match self {
            CallSink::Metered(addr) => CaptureBody::new(body, Capture::new(addr.clone())).boxed(),
            CallSink::PassedThrough(_) => body.boxed(),
        }
    }

    /// The upstream could not be reached, or the client broke off its own
    /// request body (`client_gone`): the call ends `abandoned` then, not
    /// `upstream_error`, as the upstream did nothing wrong.
    pub fn upstream_failed(self, client_gone: bool) {
        match self {
            CallSink::Metered(addr) if client_gone => addr.do_send(BodyEnded {
                end: StreamEnd::ClientGone,
                at: Instant::now(),
            }),
            CallSink::Metered(addr) => addr.do_send(UpstreamFailed { at: Instant::now() }),
            CallSink::PassedThrough(mut pass) if client_gone => {
                pass.report(CallStatus::Abandoned, None)
            }
            CallSink::PassedThrough(mut pass) => pass.report(CallStatus::UpstreamError, Some(502)),
        }
    }

    /// The upstream answered with `head`: the response `body` goes back
    /// to the client tapped when metered, untouched otherwise.
    pub fn response_body<B>(self, head: &Parts, body: B) -> ProxyBody
    where
        B: http_body::Body<Data = Bytes, Error = BoxError> + Send + Sync + 'static,
    {
        match self {
            CallSink::Metered(addr) => {
                addr.do_send(ResponseStarted {
                    status: head.status.as_u16(),
                    content_type: tap_content_type(&head.headers),
                    at: Instant::now(),
                });
                TapBody::new(body, CallTap::new(addr)).boxed()
            }
            CallSink::PassedThrough(mut pass) => {
                pass.report(CallStatus::Unmetered, Some(head.status.as_u16()));
                body.boxed()
            }
        }
    }
}

/// An unmetered call's record, kept until it is reported. Dropped before
/// then (the client went away before the upstream answered, so the proxy
/// never got to report it), it reports the call `abandoned`.
pub struct PassThrough {
    supervisor: Addr<Supervisor>,
    seq: u64,
    /// `None` once reported.
    identity: Option<CallIdentity>,
    client: Option<String>,
}

impl PassThrough {
    /// Reports the call, once.
    fn report(&mut self, status: CallStatus, http_status: Option<u16>) {
        if let Some(identity) = self.identity.take() {
            self.supervisor.do_send(PassedThrough {
                seq: self.seq,
                call: Call {
                    identity,
                    status,
                    http_status,
                    speed: None,
                    input_tokens: None,
                    details: passthrough_details(self.client.take()),
                },
            });
        }
    }
}

impl Drop for PassThrough {
    fn drop(&mut self) {
        self.report(CallStatus::Abandoned, None);
    }
}

/// The details of a call that was never metered: who made it, and when it
/// ended.
fn passthrough_details(client: Option<String>) -> CallDetails {
    CallDetails {
        client,
        settled_at: Some(humantime::format_rfc3339_millis(SystemTime::now()).to_string()),
        ..CallDetails::default()
    }
}
