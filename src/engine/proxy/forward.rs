//! The middle phase of a proxied call: the upstream connection and the
//! client that sends the request over it.
//!
//! Every call opens a fresh connection (no idle pool: see the
//! [module doc](super)), and each connection's local address is reported
//! to the capture before the request is written, so the capture never
//! records a proxied call a second time. Each connection is also marked in
//! the link's [`OwnSockets`](crate::engine::link::OwnSockets) for as long
//! as it is open, before the request is written too, so a request that
//! comes back round to one of speedtap's own listeners is recognised there
//! (see [`RouteProxy::handle`](super::RouteProxy::handle)).
//!
//! The request body goes to the client inside a [`Reclaimable`], so when
//! the upstream can't be reached (hyper drops the request unread), the
//! body is taken back and read for the call's fields: a failed call still
//! names the model its request asked for.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::Uri;
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::BoxBody;
use http_body_util::BodyExt;
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::time::Instant;

use crate::engine::link::{EngineLink, OwnConnection, OwnSocketMark};

/// The client a route forwards through: one fresh connection per call.
pub(super) fn upstream_client(
    link: &Arc<EngineLink>,
) -> Client<ReportingConnector, BoxBody<Bytes, hyper::Error>> {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    // No idle pool: see the module doc (a reused connection can race
    // the server's close and turn a good call into a 502).
    let connector = ReportingConnector {
        inner: connector,
        link: link.clone(),
    };
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build(connector)
}

/// The proxy's connector: hyper's, plus one report per connection of the
/// socket's local address to the capture (see
/// [`EngineLink::own_connections`]). The report goes out after the connect
/// and before hyper writes the request, so the capture learns to ignore the
/// connection before any of its HTTP is on the wire.
#[derive(Clone)]
pub struct ReportingConnector {
    inner: HttpConnector,
    link: Arc<EngineLink>,
}

type ConnectFuture = std::pin::Pin<
    Box<
        dyn std::future::Future<
                Output = Result<OwnStream, <HttpConnector as tower_service::Service<Uri>>::Error>,
            > + Send,
    >,
>;

impl tower_service::Service<Uri> for ReportingConnector {
    type Response = OwnStream;
    type Error = <HttpConnector as tower_service::Service<Uri>>::Error;
    type Future = ConnectFuture;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connecting = self.inner.call(uri);
        let link = self.link.clone();
        Box::pin(async move {
            let io = connecting.await?;
            let local = io.inner().local_addr().ok();
            if let (Some(tx), Some(local)) = (link.own_connections.get(), local) {
                let _ = tx.send(OwnConnection {
                    local,
                    at: Instant::now(),
                });
            }
            let mark = match (local, io.inner().peer_addr()) {
                (Some(local), Ok(remote)) => Some(link.own_sockets.register(local, remote)),
                _ => None,
            };
            Ok(OwnStream { io, _mark: mark })
        })
    }
}

/// An upstream connection that stays marked as the proxy's own while it
/// is open: dropping it (the call is over, or the client left) unmarks it.
pub struct OwnStream {
    io: TokioIo<tokio::net::TcpStream>,
    _mark: Option<OwnSocketMark>,
}

impl Connection for OwnStream {
    fn connected(&self) -> Connected {
        self.io.connected()
    }
}

impl hyper::rt::Read for OwnStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for OwnStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }
}

/// "client error (Connect): tcp connect error: Connection refused (os error 111)"
pub(super) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

/// The longest a request body is read after its upstream failed, for the
/// fields it names: the client has usually sent it all by then, and one
/// still trickling its body gets its 502 this late at most.
pub(super) const RECLAIMED_READ_LIMIT: Duration = Duration::from_secs(1);

type RequestBody = BoxBody<Bytes, hyper::Error>;

/// A request body whose unread rest can be taken back by the proxy after
/// hyper gave up on the request: [`Reclaimable::new`] returns the body for
/// the request and a [`Spare`] handle to it. One uncontended lock per
/// frame: the handle is only used once the request is over.
pub(super) struct Reclaimable {
    shared: Arc<Mutex<Option<RequestBody>>>,
}

/// The proxy's hold on a [`Reclaimable`] body.
pub(super) struct Spare {
    shared: Arc<Mutex<Option<RequestBody>>>,
}

impl Reclaimable {
    pub(super) fn new(body: RequestBody) -> (Self, Spare) {
        let shared = Arc::new(Mutex::new(Some(body)));
        (
            Reclaimable {
                shared: shared.clone(),
            },
            Spare { shared },
        )
    }

    fn with<T>(&self, f: impl FnOnce(Option<&mut RequestBody>) -> T) -> T {
        let mut body = self.shared.lock().unwrap_or_else(PoisonError::into_inner);
        f(body.as_mut())
    }
}

impl Body for Reclaimable {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        // Taken back: the request is over, nothing more goes upstream.
        self.with(|body| body.map_or(Poll::Ready(None), |b| Pin::new(b).poll_frame(cx)))
    }

    fn is_end_stream(&self) -> bool {
        self.with(|body| body.is_none_or(|b| b.is_end_stream()))
    }

    fn size_hint(&self) -> SizeHint {
        self.with(|body| body.map_or_else(|| SizeHint::with_exact(0), |b| b.size_hint()))
    }
}

impl Spare {
    /// Takes the body back and reads what is left of it (its observers see
    /// every frame, so the call learns its fields), for at most
    /// [`RECLAIMED_READ_LIMIT`]. What was read is dropped: nobody forwards
    /// it any more.
    pub(super) async fn read_rest(self) {
        let taken = self
            .shared
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let Some(mut body) = taken else { return };
        let drain = async { while let Some(Ok(_)) = body.frame().await {} };
        let _ = tokio::time::timeout(RECLAIMED_READ_LIMIT, drain).await;
    }
}
