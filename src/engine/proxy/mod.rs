//! The forwarding proxy: one listener per route, everything under it
//! forwarded to the route's upstream base URL.
//!
//! The proxy never waits on metering. Per request it allocates a call id,
//! starts a call actor when the path is one the decoders know (through
//! the [`link`](crate::engine::link), as the capture does: on a metering
//! arbiter, never on these threads), streams the request body
//! upstream while a streaming scanner reads its top-level `model` and
//! `stream` (nothing of the body is kept), and streams the response back
//! frame by frame through a [`tap::TapBody`]. Requests the decoders don't
//! know pass through untouched and are recorded as `unmetered`.
//!
//! Every call opens a fresh upstream connection; none is kept idle for
//! reuse. Model servers close keep-alive connections when they please:
//! llama-server advertises `Keep-Alive: timeout=5` yet closes right after
//! each streamed response, and a pooled connection reused in that instant
//! fails with "connection closed before message completed", which the
//! client would see as a 502 for a request that may already have reached
//! the model (a POST, so not safely retried). A loopback connect costs
//! about 0.1 ms against a time to first token of tens of milliseconds or
//! more, so correctness wins. Dropping a response body that has not ended
//! (the client hung up) drops the upstream body too, which closes that
//! upstream connection at once, so the server stops generating.
//!
//! A request that fails on the client's side (the client breaks off while
//! sending its body) ends `abandoned`, not `upstream_error`: the upstream
//! did nothing wrong. Response trailers pass through when the client sent
//! `TE: trailers`. An encoded response (`Content-Encoding: gzip`...) passes
//! through untouched and is `unmetered` (see
//! [`crate::engine::http_meta::tap_content_type`]).
//!
//! Built like tower-http's `trace/`: this file is the service, kept short;
//! each phase of a proxied call has its own file: [`request`] reads the
//! client's request and starts the call, [`forward`] connects upstream and
//! sends it, [`response`] relays the answer through the tap, and [`sink`]
//! is where the call is reported, metered or not.
//!
//! A request that arrives over one of the proxy's own upstream connections
//! (a route whose upstream leads back to a speedtap listener, however it
//! got there: a name that resolves here, a route added at run time) is
//! answered `508 Loop Detected` and not forwarded, so a loop costs one
//! extra hop, not a request forwarded until memory runs out. A request
//! head longer than the cap (`--max-head-kib`) is answered `431` and not
//! forwarded either ([`limits::head_too_large`]).

mod forward;
pub mod half_close;
pub mod headers;
pub mod idle;
pub mod limits;
pub mod listen;
mod request;
mod response;
mod sink;
pub mod tap;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::SystemTime;

use actix::Addr;
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::combinators::BoxBody;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;

use super::link::EngineLink;
use super::telemetry::TelemetryPoller;
use crate::model::Upstream;
use forward::{Reclaimable, ReportingConnector};
use request::Outgoing;
use tap::{ClientBodyFailed, Observed};

pub use response::json_response;

/// Any error a body may carry on its way through.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body type of every response the proxy returns.
pub type ProxyBody = BoxBody<Bytes, BoxError>;

/// The two ends of a client's connection to a route's listener, when the
/// socket could tell them.
#[derive(Clone, Copy, Debug)]
pub struct ClientConn {
    peer: Option<SocketAddr>,
    local: Option<SocketAddr>,
}

impl ClientConn {
    /// The addresses of an accepted connection.
    pub fn of(stream: &tokio::net::TcpStream) -> Self {
        ClientConn {
            peer: stream.peer_addr().ok(),
            local: stream.local_addr().ok(),
        }
    }
}

/// One route's forwarding service.
pub struct RouteProxy {
    name: String,
    upstream: Upstream,
    client: Client<ReportingConnector, BoxBody<Bytes, hyper::Error>>,
    link: Arc<EngineLink>,
    /// The route's telemetry poller (see `engine::telemetry`).
    telemetry: Option<Addr<TelemetryPoller>>,
}

impl RouteProxy {
    pub fn new(name: String, upstream: Upstream, link: Arc<EngineLink>) -> Self {
        let client = forward::upstream_client(&link);
        // Shared with the capture, when it sees this route's upstream too.
        let telemetry = link.telemetry_for(&name, &upstream);
        RouteProxy {
            name,
            upstream,
            client,
            link,
            telemetry,
        }
    }

    /// Forwards one request. Never fails: upstream trouble becomes a 502
    /// with a JSON body naming the upstream (the call still names its
    /// model: the unsent body is read for it), and a request over the proxy's
    /// own upstream connection (`from`) a 508 that goes nowhere.
    ///
    /// The loop is checked per request, not at accept: the connector marks
    /// its connection before hyper writes the request, but the listener
    /// may accept it a moment before the mark is made.
    pub async fn handle(&self, req: Request<Incoming>, from: ClientConn) -> Response<ProxyBody> {
        if let (Some(peer), Some(local)) = (from.peer, from.local) {
            if self.link.own_sockets.is_own(peer, local) {
                return self.loop_detected();
            }
        }
        let (parts, body) = req.into_parts();
        if limits::head_too_large(&parts, self.link.limits.max_buf_size) {
            return self.head_too_large();
        }
        let seq = self.link.next_seq();
        let started_at = SystemTime::now();
        let outgoing = match Outgoing::read(parts, &self.upstream) {
            Ok(outgoing) => outgoing,
            Err(e) => return self.bad_gateway(&format!("bad upstream URL: {e}")),
        };
        let sink = self.start_call(seq, started_at, &outgoing);
        let client_failed = ClientBodyFailed::default();
        let body = sink.request_body(Observed::new(body, client_failed.clone()));
        let (body, spare) = Reclaimable::new(body);
        let answer = self
            .client
            .request(outgoing.into_request(body.boxed()))
            .await;
        match answer {
            Err(e) => {
                let cause = forward::error_chain(&e);
                // What hyper left unread still names the call's model.
                if sink.is_metered() {
                    spare.read_rest().await;
                }
                // The client broke off its own request body: its call is
                // abandoned, and nobody is left to read the 502.
                sink.upstream_failed(client_failed.is_set());
                self.bad_gateway(&cause)
            }
            Ok(resp) => response::relay(resp, sink, self.link.limits.idle_timeout),
        }
    }
}
