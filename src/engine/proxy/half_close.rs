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
//! So when a client's input ends while its answer is still pending,
//! [`ClientStream`] asks the kernel who holds the client's end. On this
//! machine (the proxy listens on loopback by default) the client's socket
//! is in the same TCP table: a socket a process still holds (a non-zero
//! inode, [`held_by_a_process`]) is a half-close, and the answer is
//! served; a socket closed for good is orphaned (inode 0) or gone, and
//! the input's end reads as a hang-up, as it always did: the call ends
//! `abandoned` and the upstream connection closes at once, so the server
//! stops generating. A client on another machine can't be looked up, so
//! its half-close still reads as a hang-up (documented in
//! `docs/protocols.md`).
//!
//! The lookup reads `/proc/net/tcp{,6}` off the async threads, and only
//! when an input ends with an answer pending: a keep-alive connection
//! closed between calls costs nothing.

use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

/// How many of a connection's requests still have an answer on its way
/// (from the request's head until its response body is dropped).
#[derive(Clone, Debug, Default)]
pub struct Pending(Arc<AtomicUsize>);

impl Pending {
    /// Counts one more answer pending until the guard is dropped.
    pub fn guard(&self) -> PendingGuard {
        self.0.fetch_add(1, Ordering::AcqRel);
        PendingGuard(self.0.clone())
    }

    fn any(&self) -> bool {
        self.0.load(Ordering::Acquire) > 0
    }
}

/// One pending answer; dropped with its response body.
#[derive(Debug)]
pub struct PendingGuard(Arc<AtomicUsize>);

impl Drop for PendingGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
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
    /// `(client, server)`: the client's socket is `client -> server`.
    ends: Option<(SocketAddr, SocketAddr)>,
    lookup: Option<JoinHandle<bool>>,
    half_closed: bool,
}

impl ClientStream {
    pub fn new(inner: TcpStream, pending: Pending) -> Self {
        let ends = inner.peer_addr().ok().zip(inner.local_addr().ok());
        ClientStream {
            inner,
            pending,
            ends,
            lookup: None,
            half_closed: false,
        }
    }

    /// Polls the kernel lookup started at the input's end.
    fn poll_still_there(&mut self, cx: &mut Context<'_>) -> Poll<bool> {
        let Some((client, server)) = self.ends else {
            return Poll::Ready(false);
        };
        let lookup = self
            .lookup
            .get_or_insert_with(|| tokio::task::spawn_blocking(move || client_holds(client, server)));
        let held = ready!(Pin::new(lookup).poll(cx)).unwrap_or(false);
        self.lookup = None;
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
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        let at_end = buf.filled().len() == before && buf.remaining() > 0;
        if !at_end || this.half_closed || !this.pending.any() {
            return Poll::Ready(Ok(()));
        }
        if ready!(this.poll_still_there(cx)) {
            this.half_closed = true;
            Poll::Ready(Ok(()))
        } else {
            Poll::Ready(Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "the client hung up before its answer",
            )))
        }
    }
}

impl AsyncWrite for ClientStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// Whether a process on this machine still holds the client's socket of
/// the `client -> server` connection, from the kernel's TCP tables. A
/// table that can't be read is no evidence of a half-close.
fn client_holds(client: SocketAddr, server: SocketAddr) -> bool {
    let mut entries = procfs::net::tcp().unwrap_or_default();
    entries.extend(procfs::net::tcp6().unwrap_or_default());
    held_by_a_process(
        entries
            .iter()
            .map(|e| (e.local_address, e.remote_address, e.inode)),
        client,
        server,
    )
}

/// Whether, among `(local, remote, inode)` sockets, the one from `client`
/// to `server` is held by a process: a socket closed for good but not yet
/// done with its FIN handshake is orphaned, which the kernel lists with
/// inode 0; one never listed is on another machine or gone.
pub fn held_by_a_process(
    sockets: impl IntoIterator<Item = (SocketAddr, SocketAddr, u64)>,
    client: SocketAddr,
    server: SocketAddr,
) -> bool {
    let (client, server) = (canonical(client), canonical(server));
    sockets.into_iter().any(|(local, remote, inode)| {
        inode != 0 && canonical(local) == client && canonical(remote) == server
    })
}

/// An IPv4-mapped IPv6 address (how a dual-stack listener sees an IPv4
/// client) as the IPv4 address the client's own socket is listed under.
fn canonical(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(IpAddr::V4(v4), addr.port()),
            None => addr,
        },
        IpAddr::V4(_) => addr,
    }
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
        held_by_a_process(
            sockets.iter().copied(),
            CLIENT.parse().unwrap(),
            SERVER.parse().unwrap(),
        )
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
        assert!(held_by_a_process(
            [socket(CLIENT, SERVER, 9)],
            "[::ffff:127.0.0.1]:50000".parse().unwrap(),
            "[::ffff:127.0.0.1]:8080".parse().unwrap(),
        ));
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
