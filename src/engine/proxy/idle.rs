//! [`IdleTimeout`]: a response body that fails when its upstream stays
//! silent too long.
//!
//! Off by default ([`ProxyLimits::idle_timeout`](super::limits::ProxyLimits)
//! is `None`): a local model that pauses for a minute mid-stream (swapping,
//! a long tool call being formed) is slow, not broken, and the proxy must
//! not be the one to cut it. Users who want hung upstreams cut can opt in.
//!
//! The timer runs on tokio's clock, so tests drive it with paused time.
//! It is armed when the body is created (the response head has arrived) and
//! re-armed by every frame; it is only polled while the inner body is
//! pending, so a fast stream pays one `Instant::now()` per frame.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};

use super::BoxError;

/// The error a cut body carries: the client's stream ends with it, and the
/// tap reports the call as cut by the upstream.
#[derive(Debug, thiserror::Error)]
#[error("upstream sent nothing for {0:?} (idle timeout); response cut")]
pub struct IdleTimedOut(pub Duration);

pin_project! {
    /// A body that errors with [`IdleTimedOut`] after `after` without a
    /// frame. With `after = None` it is a plain pass-through.
    pub struct IdleTimeout<B> {
        #[pin]
        inner: B,
        after: Option<Duration>,
        timer: Option<Pin<Box<Sleep>>>,
        fired: bool,
    }
}

impl<B> IdleTimeout<B> {
    pub fn new(inner: B, after: Option<Duration>) -> Self {
        IdleTimeout {
            inner,
            after,
            timer: after.map(|d| Box::pin(tokio::time::sleep(d))),
            fired: false,
        }
    }
}

impl<B> Body for IdleTimeout<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.project();
        if *this.fired {
            return Poll::Ready(None);
        }
        match this.inner.poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let (Some(timer), Some(after)) = (this.timer.as_mut(), *this.after) {
                    timer.as_mut().reset(Instant::now() + after);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => {
                let (Some(timer), Some(after)) = (this.timer.as_mut(), *this.after) else {
                    return Poll::Pending;
                };
                if timer.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                *this.fired = true;
                Poll::Ready(Some(Err(Box::new(IdleTimedOut(after)))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.fired || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, StreamBody};
    use tokio::sync::mpsc;

    type Item = Result<Frame<Bytes>, std::convert::Infallible>;

    /// A body fed by hand, wrapped with `after`.
    fn fed(
        after: Option<Duration>,
    ) -> (
        mpsc::Sender<Item>,
        impl Body<Data = Bytes, Error = BoxError>,
    ) {
        let (tx, rx) = mpsc::channel::<Item>(8);
        let stream = futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        });
        (tx, IdleTimeout::new(StreamBody::new(stream), after))
    }

    fn data(s: &'static str) -> Item {
        Ok(Frame::data(Bytes::from_static(s.as_bytes())))
    }

    #[tokio::test(start_paused = true)]
    async fn off_by_default_waits_out_an_hour_of_silence() {
        let (tx, body) = fed(None);
        let mut body = Box::pin(body);
        tx.send(data("a")).await.unwrap();
        let first = body.frame().await.unwrap().unwrap();
        assert_eq!(first.into_data().unwrap(), "a");
        let later = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            tx.send(data("b")).await.unwrap();
        });
        let t0 = Instant::now();
        let second = body.frame().await.unwrap().unwrap();
        assert_eq!(second.into_data().unwrap(), "b");
        assert!(t0.elapsed() >= Duration::from_secs(3600));
        later.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn frames_rearm_the_timer_and_silence_fires_it_once() {
        let after = Duration::from_secs(10);
        let (tx, body) = fed(Some(after));
        let mut body = Box::pin(body);
        let t0 = Instant::now();
        // A frame every 9 s for a minute: never idle for 10 s.
        let feeder = tokio::spawn(async move {
            for _ in 0..7 {
                tokio::time::sleep(Duration::from_secs(9)).await;
                tx.send(data("x")).await.unwrap();
            }
            // Then silence, with the sender still open.
            tokio::time::sleep(Duration::from_secs(3600)).await;
            drop(tx);
        });
        for _ in 0..7 {
            assert!(body.frame().await.unwrap().is_ok());
        }
        let err = body.frame().await.unwrap().unwrap_err();
        assert!(err.is::<IdleTimedOut>(), "{err}");
        // Cut 10 s after the last frame (at 63 s), not earlier.
        assert_eq!(t0.elapsed(), Duration::from_secs(63 + 10));
        assert!(body.is_end_stream());
        assert!(body.frame().await.is_none(), "a cut body ends");
        feeder.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_start_counts_from_the_head() {
        let (_tx, body) = fed(Some(Duration::from_millis(500)));
        let mut body = Box::pin(body);
        let t0 = Instant::now();
        assert!(body.frame().await.unwrap().is_err());
        assert_eq!(t0.elapsed(), Duration::from_millis(500));
    }
}
