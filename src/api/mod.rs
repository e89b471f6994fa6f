//! The control API: JSON and Server-Sent Events over HTTP for scripts, the
//! web dashboard and the tray window, plus Prometheus metrics.
//!
//! # Endpoints (`docs/api.md`, "The control API")
//! - `GET /api/v1/calls?limit=N&route=NAME` -> `{"calls": [Call, ...]}`,
//!   newest first, in-flight included. `limit` defaults to 100, is clamped to
//!   [`MAX_LIMIT`](crate::model::MAX_LIMIT), and anything but a non-negative integer is a 400.
//! - `GET /api/v1/calls/{id}` -> `Call`, or 404 `{"error": "no call c-000099"}`.
//! - `GET /api/v1/stats` -> `Stats`.
//! - `GET /api/v1/events` -> Server-Sent Events: `speed` and `stats` (the
//!   contract), plus the extensions `settled` and `slow_first_token`, and a
//!   `: keep-alive` comment every 15 s while idle; see [`sse`].
//! - `GET /metrics` -> Prometheus text format 0.0.4; see
//!   [`crate::engine::metrics`].
//! - `GET /`, `GET /index.html`, `GET /app.js` -> the dashboard, embedded in
//!   the binary; see [`dashboard`].
//!
//! `HEAD` works wherever `GET` does. An unknown path is a 404, a known path
//! with another method a 405 with `Allow`; errors are always JSON
//! `{"error": "..."}`.
//!
//! # Security
//! The API listens on loopback and has no authentication, so what matters is
//! what a *web page* in the user's browser can do with it: any site can make
//! the browser send requests to `127.0.0.1:7878`.
//! - **No CORS.** No response carries `Access-Control-Allow-Origin` (or any
//!   `Access-Control-*` header), `OPTIONS` preflights included, so the
//!   browser never lets another origin read an answer: call records name
//!   models and routes, which are the user's business.
//! - **Host check** ([`host_guard`]). DNS rebinding defeats the same-origin
//!   policy: a site can point its own name at `127.0.0.1` and then read our
//!   answers as "same origin". Its requests still carry its own name in
//!   `Host`, so anything but a loopback name gets 403 `{"error": "host not
//!   allowed"}` (and HTTP/1.1 without `Host` gets 400, as RFC 9112 requires).
//! - **`x-content-type-options: nosniff`** on every response, so a page that
//!   includes our JSON with `<script src>` or `<link rel=stylesheet>` cannot
//!   get it executed or parsed under a guessed type.
//! - Every endpoint is a read: no request changes state, so a forged
//!   cross-site `GET` (which the browser sends without asking) learns and
//!   changes nothing.

use std::convert::Infallible;
use std::future::Future;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::combinators::UnsyncBoxBody;

use crate::model::EngineQueries;

pub mod dashboard;
pub mod host_guard;
pub mod routes;
pub mod server;
pub mod sse;

/// Every response body: a full buffer or an event stream.
pub type BoxBody = UnsyncBoxBody<Bytes, Infallible>;

/// Serves the control API on `listener` until `shutdown` resolves.
///
/// On shutdown it stops accepting, ends open event streams, lets responses in
/// progress finish for up to [`server::DRAIN`], then returns `Ok(())`. A
/// failed `accept` (say, out of file descriptors) is logged and retried, not
/// returned: the proxy must keep running even if its control port hiccups.
pub async fn serve<E: EngineQueries>(
    listener: tokio::net::TcpListener,
    engine: E,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    server::run(listener, engine, shutdown).await
}

/// The pure router: answers one request without a socket. The request body
/// is never read (every endpoint is a `GET`), so any body type will do.
/// Event streams from here end only when the engine drops the subscriber.
pub async fn handle<E: EngineQueries, B>(engine: &E, req: Request<B>) -> Response<BoxBody>
where
    B: http_body::Body,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    routes::route(engine, req, &routes::Context::default()).await
}
