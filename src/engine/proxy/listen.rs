//! A route's listener: accepts client connections and serves each with the
//! route's [`RouteProxy`], under the [`ProxyLimits`].
//!
//! - hyper's HTTP/1 reader gets a timer, so `header_read_timeout` takes
//!   effect (without a timer hyper silently ignores its 30 s default, and a
//!   client trickling its head one byte a minute would hold its connection
//!   forever), and `max_buf_size` caps what a head may buffer.
//! - Half-closed clients are served, but only those the kernel says are
//!   still there to read: each connection is a [`ClientStream`], which
//!   hides the end of a half-closed client's input from hyper until its
//!   answer is done ([`super::half_close`]). hyper's own `half_close`
//!   stays off: with it on, hyper stops reading while it answers and never
//!   sees a hang-up that comes before the answer's first write. A hang-up
//!   still ends the call `abandoned` at once and closes the upstream
//!   connection.
//! - A semaphore caps the connections served at once; at the cap the loop
//!   stops accepting, so extra clients wait in the kernel's backlog.
//! - A failed `accept` (no descriptors left) backs off briefly instead of
//!   spinning on the error; the loop keeps serving the connections it has.
//! - Each connection's two addresses go with its requests, so one that is
//!   speedtap's own upstream connection coming back round is refused (see
//!   [`RouteProxy::handle`]).

use std::sync::Arc;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

use super::half_close::{ClientStream, Guarded, Pending};
use super::limits::{ProxyLimits, ACCEPT_ERROR_BACKOFF};
use super::{ClientConn, RouteProxy};

/// Accepts connections for one route until told to stop, then waits for
/// the open connections to finish (the caller bounds that wait).
pub async fn serve_route(
    listener: TcpListener,
    proxy: Arc<RouteProxy>,
    mut stop: watch::Receiver<bool>,
    limits: ProxyLimits,
) {
    let graceful = GracefulShutdown::new();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(limits.max_buf_size);
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    // Connections live in this task's set, so aborting the route's task at
    // the end of the drain drops them (and their taps) instead of leaving
    // them streaming detached.
    let mut connections = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            accepted = accept_with_slot(&listener, &slots) => accepted,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            _ = stop.wait_for(|s| *s) => break,
        };
        let (stream, slot) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!("proxy: accept failed: {e}; retrying shortly");
                tokio::select! {
                    _ = tokio::time::sleep(ACCEPT_ERROR_BACKOFF) => continue,
                    _ = stop.wait_for(|s| *s) => break,
                }
            }
        };
        let _ = stream.set_nodelay(true);
        let from = ClientConn::of(&stream);
        let pending = Pending::default();
        let stream = ClientStream::new(stream, pending.clone());
        let proxy = proxy.clone();
        let service = service_fn(move |req| {
            let proxy = proxy.clone();
            let answer = pending.guard();
            async move {
                let response = proxy.handle(req, from).await;
                Ok::<_, std::convert::Infallible>(response.map(|b| Guarded::new(b, answer)))
            }
        });
        let conn = builder
            .serve_connection(TokioIo::new(stream), service)
            .into_owned();
        let conn = graceful.watch(conn);
        connections.spawn(async move {
            let _ = conn.await;
            drop(slot);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    while connections.join_next().await.is_some() {}
}

/// Waits for a free connection slot, then for a connection.
async fn accept_with_slot(
    listener: &TcpListener,
    slots: &Arc<Semaphore>,
) -> std::io::Result<(tokio::net::TcpStream, tokio::sync::OwnedSemaphorePermit)> {
    let slot = slots
        .clone()
        .acquire_owned()
        .await
        .map_err(|_| std::io::Error::other("connection slots closed"))?;
    let (stream, _) = listener.accept().await?;
    Ok((stream, slot))
}
