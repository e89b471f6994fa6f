//! Half-closed clients: served when they are still there to read.
//!
//! A client may send its request and then shut down its sending side
//! (`nc -N`, `curl` with some options, HTTP/1.0-era scripts). The server
//! answers them, so the proxy must too. But on the wire the end of a
//! client's input looks the same whether it half-closed or closed its
//! socket for good (it hung up): both send a FIN, and TCP tells them apart
//! only when a write fails. Served blindly, a client that left before its
//! answer would be recorded `ok` whenever the whole answer fit in one
//! write (the soak saw 75 of 632 hang-ups so recorded), against the rule
//! that a hang-up is an abandon.
//!
//! So when a client's input ends while it awaits an answer (one in
//! progress, or a request read with the input's end that hyper has not
//! dispatched yet), [`ClientStream`] asks the kernel who holds the client's end. On this
//! machine (the proxy listens on loopback by default) the client's socket
//! is in the same TCP table: a socket a process still holds (a non-zero
//! inode, [`client_socket`]) is a half-close, and the answer is
//! served; a socket closed for good is orphaned (inode 0) or gone, and
//! the input's end reads as a hang-up, as it always did: the call ends
//! `abandoned` and the upstream connection closes at once, so the server
//! stops generating. A client on another machine can't be looked up, so
//! its half-close still reads as a hang-up (documented in
//! `docs/protocols.md`).
//!
//! A client library that hangs up may shut its sending side a moment
//! before it closes the socket, so one look can catch a leaving client
//! still there. After a half-close the kernel is therefore asked again
//! every [`LOOK_EVERY`] while the answer is awaited, and a write of it goes
//! out only after a look no older than that: a client gone since shows as
//! a hang-up then, before a dead socket's buffer can swallow the answer
//! and pass it for delivered. The reading and the writing side share the
//! looks (one lookup at a time; its answer serves both): each waiting on a
//! look of its own, the reader, woken first, took every answer and the
//! writer never wrote (seen: a half-closed client got the head and nothing
//! more).
//!
//! The lookup reads `/proc/net/tcp{,6}` off the async threads, and only
//! for a connection whose input ended awaiting an answer: a keep-alive
//! connection closed between calls costs nothing.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::task::AtomicWaker;
use http_body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tokio::time::Sleep;

/// A connection's answers: how many are on their way now (from the
/// request's dispatch until its response body is dropped), and how many
/// have been finished so far.
#[derive(Clone, Debug, Default)]
pub struct Pending(Arc<Answers>);

#[derive(Debug, Default)]
struct Answers {
    in_progress: AtomicUsize,
    finished: AtomicU64,
    /// The half-closed connection's reader, woken when an answer finishes.
    reader: AtomicWaker,
}

impl Pending {
    /// Counts one more answer in progress until the guard is dropped.
    pub fn guard(&self) -> PendingGuard {
        self.0.in_progress.fetch_add(1, Ordering::AcqRel);
        PendingGuard(self.0.clone())
    }

    fn any(&self) -> bool {
        self.0.in_progress.load(Ordering::Acquire) > 0
    }

    fn finished(&self) -> u64 {
        self.0.finished.load(Ordering::Acquire)
    }
}

/// One answer in progress; dropped with its response body.
#[derive(Debug)]
pub struct PendingGuard(Arc<Answers>);

impl Drop for PendingGuard {
    fn drop(&mut self) {
        self.0.finished.fetch_add(1, Ordering::AcqRel);
        self.0.in_progress.fetch_sub(1, Ordering::AcqRel);
        self.0.reader.wake();
    }
}

/// A response body that keeps its answer counted as pending while hyper
/// still has it to send.
pub struct Guarded<B> {
    body: B,
    _pending: PendingGuard,
}

impl<B> Guarded<B> {
    pub fn new(body: B, pending: PendingGuard) -> Self {
        Guarded {
            body,
            _pending: pending,
        }
    }
}

impl<B: Body<Data = Bytes> + Unpin> Body for Guarded<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// An accepted client connection whose input's end, with an answer
/// pending, is a half-close only if the kernel says the client still
/// holds its socket; otherwise it reads as a hang-up (an I/O error).
pub struct ClientStream {
    inner: TcpStream,
    pending: Pending,
    /// How many answers were finished when the client last sent bytes:
    /// while no answer has finished since, those bytes (a request hyper
    /// may not have dispatched yet) are still unanswered.
    finished_at_last_input: Option<u64>,
    /// `(client, server)`: the client's socket is `client -> server`.
    ends: Option<(SocketAddr, SocketAddr)>,
    lookup: Option<JoinHandle<bool>>,
    /// When a look last found the client's socket held.
    held_at: Option<tokio::time::Instant>,
    half_closed: bool,
    /// After a half-close, when the kernel is next asked whether the
    /// client is still there while its answer is awaited.
    next_look: Option<Pin<Box<Sleep>>>,
    /// The kernel said the client left after its half-close: its input's
    /// end now shows, and writes fail.
    left: bool,
    /// How many answers were finished at hyper's last flush. An answer is
    /// finished when hyper has taken its last frame, which may still sit
    /// in hyper's write buffer; hyper flushes this stream only once its
    /// buffer is written out, so a flush after the last answer finished
    /// means every byte of it reached the socket.
    finished_at_last_flush: u64,
}

impl ClientStream {
    pub fn new(inner: TcpStream, pending: Pending) -> Self {
        let ends = inner.peer_addr().ok().zip(inner.local_addr().ok());
        ClientStream {
            inner,
            pending,
            finished_at_last_input: None,
            ends,
            lookup: None,
            held_at: None,
            half_closed: false,
            next_look: None,
            left: false,
            finished_at_last_flush: 0,
        }
    }

    /// Whether the client has sent something not yet answered: an answer
    /// in progress, or input since the last answer finished (a request
    /// read together with the input's end, before hyper dispatched it).
    fn awaits_an_answer(&self) -> bool {
        self.pending.any() || self.finished_at_last_input == Some(self.pending.finished())
    }

    /// Whether every answer awaited is done and written out: only then may
    /// a half-closed client's input end show (hyper closes the connection
    /// at the input's end, dropping whatever its write buffer still held).
    fn answered_and_written(&self) -> bool {
        !self.awaits_an_answer() && self.finished_at_last_flush == self.pending.finished()
    }

    /// Before a write after a half-close, makes sure a look no older than
    /// [`LOOK_EVERY`] found the client there, asking the kernel again when
    /// none did. A client library that hangs up may shut its sending side
    /// down a moment before it closes the socket (hyper's client does), so
    /// the look at the input's end can catch it still held; a write to a
    /// client gone since then fails as a write to a departed client
    /// would, instead of filling a dead socket's buffer and passing for a
    /// delivered answer. Only half-closed connections pay for the look.
    fn poll_still_there_to_write(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if !self.half_closed {
            return Poll::Ready(Ok(()));
        }
        let fresh = self.held_at.is_some_and(|at| at.elapsed() <= LOOK_EVERY);
        if !self.left && !fresh && !ready!(self.poll_still_there(cx)) {
            self.left = true;
        }
        if self.left {
            Poll::Ready(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the client hung up before its answer",
            )))
        } else {
            Poll::Ready(Ok(()))
        }
    }

    /// Polls the kernel lookup started at the input's end.
    fn poll_still_there(&mut self, cx: &mut Context<'_>) -> Poll<bool> {
        let Some((client, server)) = self.ends else {
            return Poll::Ready(false);
        };
        let lookup = self.lookup.get_or_insert_with(|| {
            tokio::task::spawn_blocking(move || client_holds(client, server))
        });
        let held = ready!(Pin::new(lookup).poll(cx)).unwrap_or(false);
        self.lookup = None;
        if held {
            self.held_at = Some(tokio::time::Instant::now());
        }
        Poll::Ready(held)
    }
}

impl AsyncRead for ClientStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.half_closed {
            return this.poll_after_half_close(cx);
        }
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        if buf.filled().len() > before {
            this.finished_at_last_input = Some(this.pending.finished());
        }
        let at_end = buf.filled().len() == before && buf.remaining() > 0;
        if !at_end || !this.awaits_an_answer() {
            return Poll::Ready(Ok(()));
        }
        if ready!(this.poll_still_there(cx)) {
            this.half_closed = true;
            return this.poll_after_half_close(cx);
        }
        // A hang-up: hyper sees the input's end mid-message, as it always
        // did, and drops the answer (the call ends `abandoned`).
        Poll::Ready(Ok(()))
    }
}

impl ClientStream {
    /// After a half-close, hyper is shown no input's end until the
    /// awaited answer is done: it would take it for a hang-up. Then the
    /// end shows, and hyper closes the connection after the answer, as
    /// the client (which can send no other request) waits for.
    ///
    /// While the answer is awaited the kernel is asked again every
    /// [`LOOK_EVERY`]: a client that closes its socket during a long
    /// prefill has hung up, and its end shows then, so the call ends
    /// `abandoned` and the upstream stops generating, as for any hang-up.
    fn poll_after_half_close(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.pending.0.reader.register(cx.waker());
        if self.left || self.answered_and_written() {
            return Poll::Ready(Ok(()));
        }
        loop {
            if self.lookup.is_none() {
                let next = self
                    .next_look
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(LOOK_EVERY)));
                ready!(next.as_mut().poll(cx));
            }
            if !ready!(self.poll_still_there(cx)) {
                self.left = true;
                return Poll::Ready(Ok(()));
            }
            let again = tokio::time::Instant::now() + LOOK_EVERY;
            match self.next_look.as_mut() {
                Some(next) => next.as_mut().reset(again),
                None => self.next_look = Some(Box::pin(tokio::time::sleep_until(again))),
            }
        }
    }
}

impl AsyncWrite for ClientStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_still_there_to_write(cx))?;
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_still_there_to_write(cx))?;
        Pin::new(&mut this.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let finished = this.pending.finished();
        ready!(Pin::new(&mut this.inner).poll_flush(cx))?;
        if this.finished_at_last_flush != finished {
            this.finished_at_last_flush = finished;
            // A half-closed reader waiting for the answer to be written.
            this.pending.0.reader.wake();
        }
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// How often a half-closed client awaiting its answer is looked for
/// again: a hang-up during a long wait shows within this.
const LOOK_EVERY: Duration = Duration::from_millis(100);

/// How many times a socket not listed is looked for before it is taken
/// for gone.
const READINGS: usize = 3;

/// Whether a process on this machine still holds the client's socket of
/// the `client -> server` connection, from the kernel's TCP tables. A
/// table that can't be read is no evidence of a half-close.
///
/// `/proc/net/tcp` is read a page at a time while the kernel's table
/// changes, so one reading can skip a socket that exists (seen with
/// parallel tests: a half-closed client taken for gone). A socket listed
/// is an answer either way; one not listed is looked for again.
fn client_holds(client: SocketAddr, server: SocketAddr) -> bool {
    for _ in 0..READINGS {
        let mut entries = procfs::net::tcp().unwrap_or_default();
        entries.extend(procfs::net::tcp6().unwrap_or_default());
        let listed = entries
            .iter()
            .map(|e| (e.local_address, e.remote_address, e.inode));
        match client_socket(listed, client, server) {
            ClientSocket::Held => return true,
            ClientSocket::Orphaned => return false,
            ClientSocket::NotListed => continue,
        }
    }
    false
}

/// What the kernel's table says of a client's socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientSocket {
    /// A process holds it: the client can still read (a half-close).
    Held,
    /// Closed for good but not yet done with its FIN handshake, which the
    /// kernel lists with inode 0: a hang-up.
    Orphaned,
    /// Not in this reading: on another machine, gone, or skipped.
    NotListed,
}

/// Finds the socket from `client` to `server` among `(local, remote,
/// inode)` sockets.
pub fn client_socket(
    sockets: impl IntoIterator<Item = (SocketAddr, SocketAddr, u64)>,
    client: SocketAddr,
    server: SocketAddr,
) -> ClientSocket {
    let (client, server) = (canonical(client), canonical(server));
    let found = sockets
        .into_iter()
        .find(|(local, remote, _)| canonical(*local) == client && canonical(*remote) == server);
    match found {
        Some((_, _, 0)) => ClientSocket::Orphaned,
        Some(_) => ClientSocket::Held,
        None => ClientSocket::NotListed,
    }
}

/// An IPv4-mapped IPv6 address (how a dual-stack listener sees an IPv4
/// client) as the IPv4 address the client's own socket is listed under.
fn canonical(addr: SocketAddr) -> SocketAddr {
    SocketAddr::new(addr.ip().to_canonical(), addr.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLIENT: &str = "127.0.0.1:50000";
    const SERVER: &str = "127.0.0.1:8080";

    fn socket(local: &str, remote: &str, inode: u64) -> (SocketAddr, SocketAddr, u64) {
        (local.parse().unwrap(), remote.parse().unwrap(), inode)
    }

    fn held(sockets: &[(SocketAddr, SocketAddr, u64)]) -> bool {
        client_socket(
            sockets.iter().copied(),
            CLIENT.parse().unwrap(),
            SERVER.parse().unwrap(),
        ) == ClientSocket::Held
    }

    #[test]
    fn a_client_socket_a_process_holds_is_a_half_close() {
        assert!(held(&[
            socket(SERVER, CLIENT, 0),
            socket(CLIENT, SERVER, 4242)
        ]));
    }

    #[test]
    fn an_orphaned_client_socket_is_a_hang_up() {
        assert!(!held(&[
            socket(SERVER, CLIENT, 777),
            socket(CLIENT, SERVER, 0)
        ]));
    }

    #[test]
    fn a_client_socket_not_listed_is_a_hang_up() {
        assert!(!held(&[socket(SERVER, CLIENT, 777)]));
        assert!(!held(&[socket("127.0.0.1:50001", SERVER, 5)]));
    }

    #[test]
    fn a_dual_stack_listeners_view_of_an_ipv4_client_matches_its_socket() {
        assert_eq!(
            client_socket(
                [socket(CLIENT, SERVER, 9)],
                "[::ffff:127.0.0.1]:50000".parse().unwrap(),
                "[::ffff:127.0.0.1]:8080".parse().unwrap(),
            ),
            ClientSocket::Held
        );
    }

    /// A connected pair on loopback: the client's socket, and the proxy's
    /// end wrapped as the proxy wraps it.
    async fn connected() -> (tokio::net::TcpStream, ClientStream, Pending) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (accepted, _) = listener.accept().await.unwrap();
        let pending = Pending::default();
        (
            client,
            ClientStream::new(accepted, pending.clone()),
            pending,
        )
    }

    /// Reads the proxy's end until its input ends or fails.
    async fn read_to_end(stream: &mut ClientStream) -> io::Result<Vec<u8>> {
        use tokio::io::AsyncReadExt;
        let mut read = Vec::new();
        stream.read_to_end(&mut read).await.map(|_| read)
    }

    #[tokio::test]
    async fn a_hang_up_awaiting_an_answer_shows_its_end_at_once() {
        use tokio::io::AsyncWriteExt;
        let (mut client, mut proxy_end, pending) = connected().await;
        client.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        let _answer = pending.guard();
        drop(client);
        let read = read_to_end(&mut proxy_end).await.unwrap();
        assert_eq!(read, b"GET / HTTP/1.1\r\n\r\n");
    }

    /// Polls one read of the proxy's end: `None` while it waits, else how
    /// many bytes it gave (0 at the input's end).
    async fn poll_once(stream: &mut ClientStream) -> Option<usize> {
        let mut bytes = [0u8; 64];
        std::future::poll_fn(|cx| {
            let mut buf = ReadBuf::new(&mut bytes);
            Poll::Ready(match Pin::new(&mut *stream).poll_read(cx, &mut buf) {
                Poll::Ready(read) => Some(read.map(|()| buf.filled().len()).unwrap()),
                Poll::Pending => None,
            })
        })
        .await
    }

    #[tokio::test]
    async fn a_half_close_shows_its_end_only_once_the_answer_is_written_out() {
        use tokio::io::AsyncWriteExt;
        let (mut client, mut proxy_end, pending) = connected().await;
        client.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        client.shutdown().await.unwrap();
        let answer = pending.guard();
        // The request, then no end while the kernel is asked and after it
        // says the client is still there.
        let mut read = 0;
        while !proxy_end.half_closed {
            match poll_once(&mut proxy_end).await {
                Some(0) => panic!("the input's end showed before the answer"),
                Some(n) => read += n,
                None => tokio::task::yield_now().await,
            }
        }
        assert_eq!(read, 18);
        assert_eq!(poll_once(&mut proxy_end).await, None);
        drop(answer);
        // Taken by hyper, but maybe still in its write buffer: no end yet.
        assert_eq!(poll_once(&mut proxy_end).await, None);
        tokio::io::AsyncWriteExt::flush(&mut proxy_end)
            .await
            .unwrap();
        assert_eq!(poll_once(&mut proxy_end).await, Some(0));
        drop(client);
    }

    #[tokio::test]
    async fn an_input_that_ends_after_its_answer_finished_is_a_plain_close() {
        use tokio::io::AsyncWriteExt;
        let (mut client, mut proxy_end, pending) = connected().await;
        client.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        let mut head = [0u8; 18];
        tokio::io::AsyncReadExt::read_exact(&mut proxy_end, &mut head)
            .await
            .unwrap();
        drop(pending.guard());
        drop(client);
        assert!(read_to_end(&mut proxy_end).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_pending_answer_is_counted_until_its_body_is_dropped() {
        let pending = Pending::default();
        let body = Guarded::new(
            http_body_util::Full::new(Bytes::from_static(b"x")),
            pending.guard(),
        );
        assert!(pending.any());
        drop(body);
        assert!(!pending.any());
    }
}
