//! The taps: transparent `http_body::Body` wrappers that copy what passes
//! through to a call's actor without ever waiting on it.
//!
//! - [`TapBody`] wraps the upstream's response body. Each data frame is
//!   timestamped on arrival, handed to the call actor as a `Bytes` clone
//!   (a reference count, no copy) with `do_send` (queued, never awaited),
//!   and returned to hyper unchanged. The end of the body is reported once:
//!   on the last frame, on `None`, on an error, or from `Drop` when the
//!   client went away first (after tower-http's trace body). The time
//!   from a frame's arrival to its hand-off is the proxy's added latency
//!   (`speedtap_proxy_added_latency_seconds`).
//! - [`CaptureBody`] wraps the client's request body on its way upstream
//!   and reads its top-level `model` and `stream` as the bytes pass, with
//!   a [`RequestScanner`]: at any body size, keeping none of the body. Each
//!   time a field is found it goes to the call actor, so a call still
//!   waiting for its first token already shows its model.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use actix::Addr;
use bytes::Bytes;
use http_body::{Body, Frame as HttpFrame, SizeHint};
use pin_project_lite::pin_project;
use tokio::time::Instant;

use crate::decode::request_fields::RequestScanner;
use crate::engine::call_actor::CallActor;
use crate::engine::messages::{BodyEnded, Frame, RequestFieldsSeen};
use crate::engine::metrics::record_proxy_latency;
use crate::metering::StreamEnd;

/// A call actor's inbox as the response tap sees it.
pub struct CallTap {
    addr: Addr<CallActor>,
    ended: bool,
}

impl CallTap {
    pub fn new(addr: Addr<CallActor>) -> Self {
        CallTap { addr, ended: false }
    }

    fn frame(&self, bytes: Bytes, at: Instant) {
        self.addr.do_send(Frame { bytes, at });
    }

    fn finish(&mut self, end: StreamEnd) {
        if !self.ended {
            self.ended = true;
            self.addr.do_send(BodyEnded {
                end,
                at: Instant::now(),
            });
        }
    }
}

impl Drop for CallTap {
    fn drop(&mut self) {
        // Dropped before the body ended: the client hung up. Dropping the
        // inner body at the same time closes the upstream connection, so
        // the server stops generating.
        self.finish(StreamEnd::ClientGone);
    }
}

impl FrameObserver for CallTap {
    fn data(&mut self, data: &Bytes, arrived: Instant) {
        self.frame(data.clone(), arrived);
        // What the tap added to this frame's trip: arrival to here.
        record_proxy_latency(arrived.elapsed());
    }

    fn end(&mut self) {
        self.finish(StreamEnd::Complete);
    }

    fn failed(&mut self) {
        self.finish(StreamEnd::UpstreamCut);
    }
}

/// The response body as the client receives it, tapped.
pub type TapBody<B> = Observed<B, CallTap>;

/// Reads the request body's fields for the call actor.
pub struct Capture {
    addr: Addr<CallActor>,
    scanner: RequestScanner,
}

impl Capture {
    pub fn new(addr: Addr<CallActor>) -> Self {
        Capture {
            addr,
            scanner: RequestScanner::default(),
        }
    }
}

impl FrameObserver for Capture {
    fn data(&mut self, data: &Bytes, _arrived: Instant) {
        // The scan skips string contents with memchr (a few GB/s), the
        // only work done here; once the top-level object closed, nothing.
        if !self.scanner.is_finished() && self.scanner.feed(data) {
            self.addr
                .do_send(RequestFieldsSeen(self.scanner.fields().clone()));
        }
    }

    fn end(&mut self) {}

    fn failed(&mut self) {}
}

/// The request body on its way upstream, its fields read as it passes.
pub type CaptureBody<B> = Observed<B, Capture>;

/// Raises a flag when the client's request body fails (the client hung
/// up or broke off mid-body), so the forwarder can tell a request that
/// failed on the client's side from an unreachable upstream.
#[derive(Clone, Default)]
pub struct ClientBodyFailed(Arc<AtomicBool>);

impl ClientBodyFailed {
    /// Whether the request body failed.
    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

impl FrameObserver for ClientBodyFailed {
    fn data(&mut self, _data: &Bytes, _arrived: Instant) {}

    fn end(&mut self) {}

    fn failed(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// What a tapped body tells its observer. Each call is made from inside
/// `poll_frame`, so implementations must not block or await.
pub trait FrameObserver {
    /// A data frame arrived at `arrived`; it is handed on unchanged.
    fn data(&mut self, data: &Bytes, arrived: Instant);
    /// The body ended cleanly: `None`, a trailers frame, or a frame after
    /// which the inner body reports its end (the consumer may not poll
    /// again, e.g. with an exact Content-Length). May be called more than
    /// once.
    fn end(&mut self);
    /// The inner body failed mid-way.
    fn failed(&mut self);
}

pin_project! {
    /// A transparent body wrapper: every frame passes through unchanged
    /// while its observer sees it (after tower-http's trace body).
    pub struct Observed<B, O> {
        #[pin]
        inner: B,
        observer: O,
    }
}

impl<B, O> Observed<B, O> {
    pub fn new(inner: B, observer: O) -> Self {
        Observed { inner, observer }
    }
}

impl<B, O> Body for Observed<B, O>
where
    B: Body<Data = Bytes>,
    O: FrameObserver,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<HttpFrame<Bytes>, Self::Error>>> {
        let mut this = self.project();
        let polled = this.inner.as_mut().poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.observer.data(data, Instant::now());
                }
                // Trailers are always a body's last frame, and hyper's
                // server stops polling once it has them (hyper's `Incoming`
                // doesn't report its end after chunked trailers), so they
                // end the body here.
                if frame.is_trailers() || this.inner.is_end_stream() {
                    this.observer.end();
                }
            }
            Poll::Ready(Some(Err(_))) => this.observer.failed(),
            Poll::Ready(None) => this.observer.end(),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
