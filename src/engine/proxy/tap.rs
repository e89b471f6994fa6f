//! The taps: transparent `http_body::Body` wrappers that copy what passes
//! through to a call's actor without ever waiting on it.
//!
//! - [`TapBody`] wraps the upstream's response body. Each data frame is
//!   timestamped on arrival, queued for the call actor as a `Bytes` clone
//!   (a reference count, no copy) in the call's [`FrameQueue`], and
//!   returned to hyper unchanged. The actor is woken with `do_send`
//!   (queued, never awaited) only when the queue says so: each frame until
//!   the call's first output, then once per pile of frames; its snapshot
//!   tick drains the rest, so a stream costs a message per batch of frames,
//!   not per frame. The end of the body is reported once:
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

use actix::{Addr, Recipient};
use bytes::Bytes;
use http_body::{Body, Frame as HttpFrame, SizeHint};
use pin_project_lite::pin_project;
use tokio::time::Instant;

use crate::decode::request_fields::RequestScanner;
use crate::engine::call_actor::CallActor;
use crate::engine::messages::{BodyEnded, Frame, FrameQueue, FramesQueued, RequestFieldsSeen};
use crate::engine::metrics::record_proxy_latency;
use crate::meter::pipeline::StreamEnd;

/// A call actor's inbox as the response tap sees it: the queue frames go
/// to, where its wake-ups go and where the one end report goes
/// (recipients, so a test can stand in for the actor).
pub struct CallTap {
    queue: Arc<FrameQueue>,
    wake: Recipient<FramesQueued>,
    ends: Recipient<BodyEnded>,
    ended: bool,
}

impl CallTap {
    pub fn new(addr: Addr<CallActor>) -> Self {
        Self::to(addr.clone().recipient(), addr.recipient())
    }

    /// A tap reporting to any recipients of the two messages.
    pub fn to(wake: Recipient<FramesQueued>, ends: Recipient<BodyEnded>) -> Self {
        CallTap {
            queue: Arc::default(),
            wake,
            ends,
            ended: false,
        }
    }

    fn frame(&self, bytes: Bytes, at: Instant) {
        if self.queue.push(Frame { bytes, at }) {
            self.wake.do_send(FramesQueued(self.queue.clone()));
        }
    }

    fn finish(&mut self, end: StreamEnd) {
        if !self.ended {
            self.ended = true;
            self.ends.do_send(BodyEnded {
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

/// One named test per edge case of a tapped body, after tower-http's trace
/// body tests: what the client gets is what the upstream sent, and the
/// call actor hears exactly one end, the right one.
#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::Mutex;

    use actix::{Actor, Context as ActorContext, Handler};
    use http::HeaderMap;
    use http_body_util::{BodyExt, Empty, Full, StreamBody};

    use super::*;
    use crate::engine::messages::{WAKE_AT_BYTES, WAKE_AT_FRAMES};

    /// What the stand-in actor heard, in order.
    #[derive(Debug, PartialEq)]
    enum Heard {
        Frame(Bytes),
        End(StreamEnd),
    }

    struct Recorder(Arc<Mutex<Vec<Heard>>>);

    impl Actor for Recorder {
        type Context = ActorContext<Self>;
    }

    impl Handler<FramesQueued> for Recorder {
        type Result = ();
        fn handle(&mut self, msg: FramesQueued, _: &mut Self::Context) {
            let mut frames = Vec::new();
            msg.0.take(&mut frames);
            let mut heard = self.0.lock().expect("lock");
            heard.extend(frames.into_iter().map(|f| Heard::Frame(f.bytes)));
        }
    }

    impl Handler<BodyEnded> for Recorder {
        type Result = ();
        fn handle(&mut self, msg: BodyEnded, _: &mut Self::Context) {
            self.0.lock().expect("lock").push(Heard::End(msg.end));
        }
    }

    /// A tap reporting to a fresh recorder, and what it heard.
    fn recorded_tap() -> (CallTap, Arc<Mutex<Vec<Heard>>>) {
        let heard = Arc::new(Mutex::new(Vec::new()));
        let addr = Recorder(heard.clone()).start();
        (
            CallTap::to(addr.clone().recipient(), addr.recipient()),
            heard,
        )
    }

    /// Lets the recorder drain its mailbox: `do_send` is queued, and the
    /// actor runs on this same system.
    async fn heard(h: &Arc<Mutex<Vec<Heard>>>) -> Vec<Heard> {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        std::mem::take(&mut *h.lock().expect("lock"))
    }

    type Item = Result<HttpFrame<Bytes>, std::io::Error>;

    fn stream_body(
        items: Vec<Item>,
    ) -> StreamBody<futures_util::stream::Iter<std::vec::IntoIter<Item>>> {
        StreamBody::new(futures_util::stream::iter(items))
    }

    fn data(s: &'static str) -> Item {
        Ok(HttpFrame::data(Bytes::from_static(s.as_bytes())))
    }

    #[actix::test]
    async fn frames_reach_the_client_unchanged_and_in_order() {
        let (tap, h) = recorded_tap();
        let body = TapBody::new(stream_body(vec![data("a"), data("bc"), data("d")]), tap);
        let got = body.collect().await.expect("body").to_bytes();
        assert_eq!(&got[..], b"abcd");
        assert_eq!(
            heard(&h).await,
            vec![
                Heard::Frame(Bytes::from_static(b"a")),
                Heard::Frame(Bytes::from_static(b"bc")),
                Heard::Frame(Bytes::from_static(b"d")),
                Heard::End(StreamEnd::Complete),
            ]
        );
    }

    #[actix::test]
    async fn the_end_after_the_last_data_frame_is_reported_without_another_poll() {
        // A body with an exact length ends with its last frame; hyper may
        // never poll it again, so the end is reported with that frame.
        let (tap, h) = recorded_tap();
        let mut body = TapBody::new(Full::new(Bytes::from_static(b"whole")), tap);
        let frame = body.frame().await.expect("a frame").expect("data");
        assert_eq!(frame.into_data().ok(), Some(Bytes::from_static(b"whole")));
        assert_eq!(
            heard(&h).await,
            vec![
                Heard::Frame(Bytes::from_static(b"whole")),
                Heard::End(StreamEnd::Complete),
            ]
        );
        // Polling to the end anyway reports nothing more, even on drop.
        assert!(body.frame().await.is_none());
        drop(body);
        assert_eq!(heard(&h).await, vec![]);
    }

    #[actix::test]
    async fn an_empty_body_ends_once_with_no_frames() {
        let (tap, h) = recorded_tap();
        let body = TapBody::new(
            Empty::<Bytes>::new().map_err(|e: Infallible| match e {}),
            tap,
        );
        let got: Result<_, Infallible> = body.collect().await;
        assert!(got.expect("body").to_bytes().is_empty());
        assert_eq!(heard(&h).await, vec![Heard::End(StreamEnd::Complete)]);
    }

    #[actix::test]
    async fn trailers_end_the_body_and_pass_through() {
        let mut trailers = HeaderMap::new();
        trailers.insert("x-checksum", "1".parse().expect("header value"));
        let (tap, h) = recorded_tap();
        let body = TapBody::new(
            stream_body(vec![data("a"), Ok(HttpFrame::trailers(trailers.clone()))]),
            tap,
        );
        let collected = body.collect().await.expect("body");
        assert_eq!(collected.trailers(), Some(&trailers));
        assert_eq!(
            heard(&h).await,
            vec![
                Heard::Frame(Bytes::from_static(b"a")),
                Heard::End(StreamEnd::Complete),
            ]
        );
    }

    #[actix::test]
    async fn an_upstream_error_is_a_cut_and_reaches_the_client() {
        let (tap, h) = recorded_tap();
        let mut body = TapBody::new(
            stream_body(vec![data("a"), Err(std::io::Error::other("reset"))]),
            tap,
        );
        assert!(body.frame().await.expect("a frame").is_ok());
        assert!(body.frame().await.expect("the error").is_err());
        drop(body);
        assert_eq!(
            heard(&h).await,
            vec![
                Heard::Frame(Bytes::from_static(b"a")),
                Heard::End(StreamEnd::UpstreamCut),
            ]
        );
    }

    #[actix::test]
    async fn a_drop_before_the_end_means_the_client_left() {
        let (tap, h) = recorded_tap();
        let mut body = TapBody::new(stream_body(vec![data("a"), data("b")]), tap);
        assert!(body.frame().await.expect("a frame").is_ok());
        drop(body);
        assert_eq!(
            heard(&h).await,
            vec![
                Heard::Frame(Bytes::from_static(b"a")),
                Heard::End(StreamEnd::ClientGone),
            ]
        );
    }

    #[actix::test]
    async fn a_pending_upstream_reports_nothing() {
        let (tap, h) = recorded_tap();
        let mut body = TapBody::new(
            StreamBody::new(futures_util::stream::pending::<Item>()),
            tap,
        );
        let mut cx = Context::from_waker(std::task::Waker::noop());
        assert!(Pin::new(&mut body).poll_frame(&mut cx).is_pending());
        assert_eq!(heard(&h).await, vec![]);
        drop(body);
        assert_eq!(heard(&h).await, vec![Heard::End(StreamEnd::ClientGone)]);
    }

    #[test]
    fn after_the_first_output_frames_wait_for_the_tick_until_a_pile_wakes_the_actor_once() {
        let queue = FrameQueue::default();
        let frame = |n: usize| Frame {
            bytes: Bytes::from(vec![b'x'; n]),
            at: Instant::now(),
        };
        // Before the first output: a wake for the first frame, none while
        // that wake is pending, and one again after the actor drained.
        assert!(queue.push(frame(1)));
        assert!(!queue.push(frame(1)));
        let mut got = Vec::new();
        queue.take(&mut got);
        assert_eq!(got.len(), 2);
        got.clear();
        assert!(queue.push(frame(1)));
        queue.take(&mut got);
        got.clear();
        // After it: frames wait, until WAKE_AT_FRAMES of them pile up.
        queue.relax();
        let wakes: Vec<bool> = (0..WAKE_AT_FRAMES + 5)
            .map(|_| queue.push(frame(1)))
            .collect();
        assert_eq!(wakes.iter().filter(|w| **w).count(), 1);
        assert!(wakes[WAKE_AT_FRAMES - 1]);
        queue.take(&mut got);
        assert_eq!(got.len(), WAKE_AT_FRAMES + 5);
        got.clear();
        // Or WAKE_AT_BYTES of them.
        assert!(!queue.push(frame(WAKE_AT_BYTES - 1)));
        assert!(queue.push(frame(1)));
    }

    #[test]
    fn a_failing_request_body_raises_the_client_flag_and_a_clean_one_does_not() {
        let flag = ClientBodyFailed::default();
        let mut observer = flag.clone();
        observer.end();
        assert!(!flag.is_set());
        observer.failed();
        assert!(flag.is_set());
    }
}
