//! A response body fed through a channel, one frame per message.
//!
//! Why a channel: the token schedule runs in its own task against absolute
//! deadlines, independent of when hyper polls the body, and every token
//! must leave as its own frame (hyper writes and flushes each frame as it
//! arrives). The channel also carries the two ways a stream can stop early:
//! the receiver is dropped when the client hangs up (the generator sees its
//! sender closed and stops at once), and an `Err` item makes hyper abort the
//! connection without the terminating chunk (the simulated crash).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame};
use tokio::sync::mpsc;

/// The error that aborts a response mid-body (`x-sim-cut-after`).
#[derive(Debug)]
pub(crate) struct Aborted;

impl std::fmt::Display for Aborted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("simulated connection cut (x-sim-cut-after)")
    }
}

impl std::error::Error for Aborted {}

/// What the generator sends: a frame of bytes, or the abort.
pub(crate) type Item = Result<Bytes, Aborted>;

/// The receiving half, used as the response body.
#[derive(Debug)]
pub(crate) struct ChannelBody {
    rx: mpsc::Receiver<Item>,
    /// A data frame went to hyper since the body last answered `Pending`.
    sent_since_pending: bool,
    /// An abort held back for one poll (see [`ChannelBody::poll_frame`]).
    held_abort: Option<Aborted>,
}

/// A few frames of slack: the generator never waits on a reading client
/// unless the client stops reading altogether (then back-pressure is real).
const CAPACITY: usize = 8;

/// A connected sender and body.
pub(crate) fn channel() -> (mpsc::Sender<Item>, ChannelBody) {
    let (tx, rx) = mpsc::channel(CAPACITY);
    let body = ChannelBody {
        rx,
        sent_since_pending: false,
        held_abort: None,
    };
    (tx, body)
}

/// A body that fails at once: the response is cut before any of it is sent.
pub(crate) fn aborted() -> ChannelBody {
    let (tx, body) = channel();
    // A fresh channel has room for one item.
    let _ = tx.try_send(Err(Aborted));
    body
}

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = Aborted;

    /// An abort that arrives right behind a data frame is held back for
    /// one poll: hyper flushes what it has written when the body answers
    /// `Pending`, but an error polled in the same turn drops the unflushed
    /// frame with the connection. Holding it makes "N tokens, then the
    /// cut" hold however late the generator task ran, not only when the
    /// two happened far apart.
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Aborted>>> {
        let this = self.get_mut();
        if let Some(abort) = this.held_abort.take() {
            return Poll::Ready(Some(Err(abort)));
        }
        match this.rx.poll_recv(cx) {
            Poll::Pending => {
                this.sent_since_pending = false;
                Poll::Pending
            }
            Poll::Ready(Some(Err(abort))) if this.sent_since_pending => {
                this.sent_since_pending = false;
                this.held_abort = Some(abort);
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            Poll::Ready(Some(Ok(data))) => {
                this.sent_since_pending = true;
                Poll::Ready(Some(Ok(Frame::data(data))))
            }
            Poll::Ready(other) => Poll::Ready(other.map(|r| r.map(Frame::data))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn frames_arrive_in_order_then_the_body_ends() {
        let (tx, mut body) = channel();
        tx.send(Ok(Bytes::from_static(b"a"))).await.unwrap();
        tx.send(Ok(Bytes::from_static(b"b"))).await.unwrap();
        drop(tx);
        let a = body.frame().await.unwrap().unwrap().into_data().unwrap();
        let b = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!((&a[..], &b[..]), (&b"a"[..], &b"b"[..]));
        assert!(body.frame().await.is_none());
    }

    #[tokio::test]
    async fn aborted_body_errors() {
        let mut body = aborted();
        assert!(body.frame().await.unwrap().is_err());
    }

    #[tokio::test]
    async fn an_abort_right_behind_a_frame_waits_one_poll_so_the_frame_is_flushed() {
        let (tx, mut body) = channel();
        tx.send(Ok(Bytes::from_static(b"token"))).await.unwrap();
        tx.send(Err(Aborted)).await.unwrap();
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let mut poll = || Pin::new(&mut body).poll_frame(&mut cx);
        assert!(matches!(poll(), Poll::Ready(Some(Ok(_)))));
        assert!(poll().is_pending(), "the abort is held for one poll");
        assert!(matches!(poll(), Poll::Ready(Some(Err(Aborted)))));
    }

    #[tokio::test]
    async fn an_abort_after_an_idle_poll_comes_at_once() {
        let (tx, mut body) = channel();
        tx.send(Ok(Bytes::from_static(b"token"))).await.unwrap();
        let mut cx = Context::from_waker(std::task::Waker::noop());
        assert!(matches!(
            Pin::new(&mut body).poll_frame(&mut cx),
            Poll::Ready(Some(Ok(_)))
        ));
        assert!(Pin::new(&mut body).poll_frame(&mut cx).is_pending());
        tx.send(Err(Aborted)).await.unwrap();
        assert!(matches!(
            Pin::new(&mut body).poll_frame(&mut cx),
            Poll::Ready(Some(Err(Aborted)))
        ));
    }

    #[tokio::test]
    async fn dropping_the_body_closes_the_sender() {
        let (tx, body) = channel();
        drop(body);
        tx.closed().await;
        assert!(tx.send(Ok(Bytes::new())).await.is_err());
    }
}
