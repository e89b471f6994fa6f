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
//!   and keeps a copy of its first [`REQUEST_CAPTURE_LIMIT`] bytes, which
//!   is where `model` and `stream` are read from.

use std::pin::Pin;
use std::task::{Context, Poll};

use actix::Addr;
use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame as HttpFrame, SizeHint};
use pin_project_lite::pin_project;
use tokio::time::Instant;

use crate::engine::call_actor::CallActor;
use crate::engine::messages::{BodyEnded, Frame, RequestCaptured};
use crate::engine::metrics::record_proxy_latency;
use crate::metering::StreamEnd;

/// How much of a request body is kept to read `model` and `stream`.
pub const REQUEST_CAPTURE_LIMIT: usize = 256 * 1024;

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

    fn end(&mut self, end: StreamEnd) {
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
        self.end(StreamEnd::ClientGone);
    }
}

pin_project! {
    /// The response body as the client receives it, tapped.
    pub struct TapBody<B> {
        #[pin]
        inner: B,
        tap: CallTap,
    }
}

impl<B> TapBody<B> {
    pub fn new(inner: B, tap: CallTap) -> Self {
        TapBody { inner, tap }
    }
}

impl<B> Body for TapBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<HttpFrame<Bytes>, Self::Error>>> {
        let mut this = self.project();
        match this.inner.as_mut().poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                let arrived = Instant::now();
                if let Some(data) = frame.data_ref() {
                    this.tap.frame(data.clone(), arrived);
                }
                if this.inner.is_end_stream() {
                    // The consumer may not poll again (exact Content-Length).
                    this.tap.end(StreamEnd::Complete);
                }
                // What the tap added to this frame's trip: arrival to here.
                record_proxy_latency(arrived.elapsed());
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                this.tap.end(StreamEnd::UpstreamCut);
                Poll::Ready(Some(Err(e)))
            }
            Poll::Ready(None) => {
                this.tap.end(StreamEnd::Complete);
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Where the captured request prefix goes.
pub struct Capture {
    addr: Addr<CallActor>,
    buf: BytesMut,
    sent: bool,
}

impl Capture {
    pub fn new(addr: Addr<CallActor>) -> Self {
        Capture {
            addr,
            buf: BytesMut::new(),
            sent: false,
        }
    }

    fn push(&mut self, data: &[u8]) {
        if self.sent {
            return;
        }
        let room = REQUEST_CAPTURE_LIMIT - self.buf.len();
        self.buf.extend_from_slice(&data[..data.len().min(room)]);
        if self.buf.len() == REQUEST_CAPTURE_LIMIT {
            self.send();
        }
    }

    fn send(&mut self) {
        if !self.sent {
            self.sent = true;
            let bytes = std::mem::take(&mut self.buf).freeze();
            self.addr.do_send(RequestCaptured(bytes));
        }
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        self.send();
    }
}

pin_project! {
    /// The request body on its way upstream, with its prefix copied.
    pub struct CaptureBody<B> {
        #[pin]
        inner: B,
        capture: Capture,
    }
}

impl<B> CaptureBody<B> {
    pub fn new(inner: B, capture: Capture) -> Self {
        CaptureBody { inner, capture }
    }
}

impl<B> Body for CaptureBody<B>
where
    B: Body<Data = Bytes>,
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
                    this.capture.push(data);
                }
                if this.inner.is_end_stream() {
                    this.capture.send();
                }
            }
            Poll::Ready(None) | Poll::Ready(Some(Err(_))) => this.capture.send(),
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
