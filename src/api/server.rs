//! The accept loop: one task per connection, HTTP/1.1, graceful shutdown.
//!
//! HTTP/1.1 only: browsers speak it to plain-`http` servers (they use HTTP/2
//! only over TLS), and so do curl, Prometheus and scripts; an HTTP/2 stack
//! would add nothing for a loopback control port.

use std::convert::Infallible;
use std::future::Future;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::Request;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::routes::{self, Context};
use crate::model::EngineQueries;

/// How long open connections get to finish after shutdown before they are
/// cut. Event streams end at once on shutdown, so this only bounds a slow
/// client still reading a response.
pub const DRAIN: Duration = Duration::from_secs(2);

/// A connection that sends no complete request head for this long is closed
/// (hyper's slow-header guard).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Back-off after a failed `accept` (typically out of file descriptors), so
/// the loop does not spin while the condition lasts.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// See [`crate::api::serve`].
pub async fn run<E: EngineQueries>(
    listener: TcpListener,
    engine: E,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut connections = JoinSet::new();
    let remote_metrics = listener
        .local_addr()
        .map(|a| !a.ip().is_loopback())
        .unwrap_or(false);
    let mut shutdown = std::pin::pin!(shutdown);

    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => {
                    // Event frames are small and must leave at once.
                    let _ = stream.set_nodelay(true);
                    connections.spawn(connection(
                        stream,
                        engine.clone(),
                        stop_rx.clone(),
                        remote_metrics,
                    ));
                }
                Err(err) => {
                    tracing::warn!("control API: accept failed: {err}");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }

    drop(listener);
    let _ = stop_tx.send(true);
    let drained = tokio::time::timeout(DRAIN, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::debug!(
            "control API: cutting {} connection(s) after the drain period",
            connections.len()
        );
        connections.shutdown().await;
    }
    Ok(())
}

/// Serves one connection until the client closes it or shutdown is asked
/// for; then finishes the response in progress (event streams end by
/// themselves) and closes.
async fn connection<E: EngineQueries>(
    stream: tokio::net::TcpStream,
    engine: E,
    mut stop: watch::Receiver<bool>,
    remote_metrics: bool,
) {
    let ctx = Context {
        shutdown: Some(stop.clone()),
        remote_metrics,
    };
    let service = service_fn(move |req: Request<Incoming>| {
        let engine = engine.clone();
        let ctx = ctx.clone();
        async move { Ok::<_, Infallible>(routes::route(&engine, req, &ctx).await) }
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .serve_connection(TokioIo::new(stream), service);
    let mut conn = std::pin::pin!(conn);

    let result = tokio::select! {
        result = conn.as_mut() => result,
        // The guard `wait_for` returns is not `Send`: drop it inside. A
        // dropped sender (the server is gone) counts as shutdown too.
        () = async { let _ = stop.wait_for(|stopping| *stopping).await; } => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(err) = result {
        tracing::debug!("control API: connection ended with an error: {err}");
    }
}
