//! The forwarding proxy: one listener per route, everything under it
//! forwarded to the route's upstream base URL.
//!
//! The proxy never waits on metering. Per request it allocates a call id,
//! starts a [`CallActor`] when the path is one the decoders know (on a
//! metering arbiter, never on these threads), streams the request body
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
//! through untouched and is `unmetered` (see [`headers::tap_content_type`]).

pub mod headers;
pub mod idle;
pub mod limits;
pub mod listen;
pub mod tap;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock};
use std::time::{Duration, SystemTime};

use actix::{Actor, Addr, ArbiterHandle, Recipient, WeakAddr};
use bytes::Bytes;
use http::{header, HeaderValue, Request, Response, StatusCode, Uri};
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::call_actor::{CallActor, CallSetup};
use super::messages::{BodyEnded, FirstTokenLate, PassedThrough, ResponseStarted, UpstreamFailed};
use super::supervisor::Supervisor;
use super::telemetry::TelemetryPoller;
use crate::decode::detect::detect_request;
use crate::meter::calibration::CalibrationTable;
use crate::meter::normals::Normals;
use crate::metering::StreamEnd;
use crate::model::ApiKind;
use crate::model::Upstream;
use crate::model::{Call, CallDetails, CallIdentity, CallStatus, SeenBy};
use crate::tokens::TokenEstimator;
use idle::IdleTimeout;
use limits::ProxyLimits;
use tap::{CallTap, Capture, CaptureBody, ClientBodyFailed, Observed, TapBody};

/// Any error a body may carry on its way through.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body type of every response the proxy returns.
pub type ProxyBody = BoxBody<Bytes, BoxError>;

/// What the proxy needs from the engine: where to start call actors and
/// where to report. Shared by every route.
pub struct EngineLink {
    pub supervisor: Addr<Supervisor>,
    pub notifier: Recipient<FirstTokenLate>,
    pub arbiters: Vec<ArbiterHandle>,
    pub next_arbiter: AtomicUsize,
    pub seq: AtomicU64,
    pub calibration: Arc<RwLock<CalibrationTable>>,
    pub estimator: Arc<dyn TokenEstimator>,
    /// The slow-first-token threshold in ms; settings may change it live.
    pub slow_ttft_ms: AtomicU64,
    /// Per-connection limits and the optional idle timeout.
    pub limits: ProxyLimits,
    /// Where the proxy reports the local address of each upstream
    /// connection it opens, once the capture runs: the capture ignores
    /// those connections, so a proxied call is recorded once (by the
    /// proxy). Unset, nothing is reported.
    pub own_connections: OnceLock<mpsc::UnboundedSender<OwnConnection>>,
    /// Every route's normals (usual TTFT, load time, prompt factor).
    pub normals: Arc<RwLock<Normals>>,
    /// Start a telemetry poller per route (off in tests that count the
    /// upstream's requests).
    pub telemetry: bool,
    /// The live telemetry poller of each (route, upstream base URL), held
    /// weakly: see [`EngineLink::telemetry_for`].
    pub pollers: Mutex<HashMap<(String, String), WeakAddr<TelemetryPoller>>>,
}

/// One of the proxy's own upstream connections: its local address, and
/// when the connect returned (a SYN from that address captured later is a
/// new connection that merely reuses the port).
#[derive(Clone, Copy, Debug)]
pub struct OwnConnection {
    pub local: SocketAddr,
    pub at: Instant,
}

impl EngineLink {
    /// The next call's sequence number (shared by both interceptors, so
    /// ids stay unique).
    pub(crate) fn next_seq(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// The telemetry poller for `route`'s calls to `upstream`, started on
    /// first use: the proxy route and the capture, which may both see
    /// calls to the same server under the same route name, report them to
    /// one poller, so a call's queue position counts the calls ahead of it
    /// whichever interceptor saw them, and the server is asked once per
    /// look, not once per interceptor. Held weakly here: the poller stops
    /// when the last of its route's holders (the route's proxy, the
    /// capture task, a call still in flight) lets go. `None` with
    /// telemetry off.
    pub(crate) fn telemetry_for(
        &self,
        route: &str,
        upstream: &Upstream,
    ) -> Option<Addr<TelemetryPoller>> {
        if !self.telemetry {
            return None;
        }
        let mut pollers = self.pollers.lock().unwrap_or_else(PoisonError::into_inner);
        pollers.retain(|_, poller| poller.upgrade().is_some());
        let key = (route.to_owned(), upstream.base_url());
        if let Some(live) = pollers.get(&key).and_then(WeakAddr::upgrade) {
            return Some(live);
        }
        let (name, up, normals) = (route.to_owned(), upstream.clone(), self.normals.clone());
        // On a metering arbiter, off the proxy's threads.
        let poller = TelemetryPoller::start_in_arbiter(self.arbiter(), move |_| {
            TelemetryPoller::new(name, up, normals)
        });
        pollers.insert(key, poller.downgrade());
        Some(poller)
    }

    /// The metering arbiter for the next call actor, round robin.
    pub(crate) fn arbiter(&self) -> &ArbiterHandle {
        let i = self.next_arbiter.fetch_add(1, Ordering::Relaxed);
        &self.arbiters[i % self.arbiters.len()]
    }
}

/// The id a call is known by in the API: `c-000042`.
pub fn call_id(seq: u64) -> String {
    format!("c-{seq:06}")
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
                Output = Result<
                    TokioIo<tokio::net::TcpStream>,
                    <HttpConnector as tower_service::Service<Uri>>::Error,
                >,
            > + Send,
    >,
>;

impl tower_service::Service<Uri> for ReportingConnector {
    type Response = TokioIo<tokio::net::TcpStream>;
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
            if let (Some(tx), Ok(local)) = (link.own_connections.get(), io.inner().local_addr()) {
                let _ = tx.send(OwnConnection {
                    local,
                    at: Instant::now(),
                });
            }
            Ok(io)
        })
    }
}

impl RouteProxy {
    pub fn new(name: String, upstream: Upstream, link: Arc<EngineLink>) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        // No idle pool: see the module doc (a reused connection can race
        // the server's close and turn a good call into a 502).
        let connector = ReportingConnector {
            inner: connector,
            link: link.clone(),
        };
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(0)
            .build(connector);
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
    /// with a JSON body naming the upstream.
    pub async fn handle(&self, req: Request<Incoming>) -> Response<ProxyBody> {
        let seq = self.link.next_seq();
        let (parts, body) = req.into_parts();
        let path_and_query = parts
            .uri
            .path_and_query()
            .map(|p| p.as_str().to_owned())
            .unwrap_or_else(|| "/".to_owned());
        let api_hint = detect_request(parts.method.as_str(), parts.uri.path(), b"").api;
        let identity = CallIdentity {
            id: call_id(seq),
            route: self.name.clone(),
            api: api_hint,
            model: None,
            started_at: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
        };

        let client = parts
            .headers
            .get(header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .and_then(super::details::client_app);
        let mut headers = parts.headers;
        let trailers = headers::accepts_trailers(&headers);
        headers::strip_hop_by_hop(&mut headers);
        if trailers {
            headers::request_trailers(&mut headers);
        }
        if let Ok(host) = HeaderValue::from_str(&self.upstream.authority()) {
            headers.insert(header::HOST, host);
        }
        if api_hint != ApiKind::Unknown {
            headers::request_identity_encoding(&mut headers);
        }
        let uri: Uri = match self.upstream.join(&path_and_query).parse() {
            Ok(uri) => uri,
            Err(e) => return self.bad_gateway(&format!("bad upstream URL: {e}")),
        };

        let dispatched_at = Instant::now();
        let actor = (api_hint != ApiKind::Unknown).then(|| {
            let setup = CallSetup {
                seq,
                identity: identity.clone(),
                method: parts.method.as_str().to_owned(),
                path: parts.uri.path().to_owned(),
                dispatched_at,
                slow_ttft: Duration::from_millis(self.link.slow_ttft_ms.load(Ordering::Relaxed)),
                estimator: self.link.estimator.clone(),
                calibration: self.link.calibration.clone(),
                supervisor: self.link.supervisor.clone(),
                notifier: self.link.notifier.clone(),
                client: client.clone(),
                seen_by: SeenBy::Proxy,
                normals: self.link.normals.clone(),
                telemetry: self.telemetry.clone(),
            };
            CallActor::start_in_arbiter(self.link.arbiter(), move |_| CallActor::new(setup))
        });
        // An unmetered call has no actor to report it if the client hangs
        // up while the upstream is still working (this future is dropped
        // mid-await); the guard does, as `abandoned`.
        let mut unreported = actor.is_none().then(|| PassThroughGuard {
            supervisor: self.link.supervisor.clone(),
            seq,
            identity: Some(identity.clone()),
            client: client.clone(),
        });
        let client_failed = ClientBodyFailed::default();
        let body = Observed::new(body, client_failed.clone());
        let body = match &actor {
            Some(addr) => CaptureBody::new(body, Capture::new(addr.clone())).boxed(),
            None => body.boxed(),
        };
        let mut upstream_req = Request::new(body);
        *upstream_req.method_mut() = parts.method;
        *upstream_req.uri_mut() = uri;
        *upstream_req.headers_mut() = headers;

        let answer = self.client.request(upstream_req).await;
        if let Some(guard) = unreported.as_mut() {
            guard.disarm();
        }
        match answer {
            Err(e) => {
                let cause = error_chain(&e);
                // The client broke off its own request body: its call is
                // abandoned, and nobody is left to read the 502.
                let client_gone = client_failed.is_set();
                match &actor {
                    Some(addr) if client_gone => addr.do_send(BodyEnded {
                        end: StreamEnd::ClientGone,
                        at: Instant::now(),
                    }),
                    Some(addr) => addr.do_send(UpstreamFailed { at: Instant::now() }),
                    None => self.link.supervisor.do_send(PassedThrough {
                        seq,
                        call: Call {
                            identity,
                            status: if client_gone {
                                CallStatus::Abandoned
                            } else {
                                CallStatus::UpstreamError
                            },
                            http_status: (!client_gone).then_some(502),
                            speed: None,
                            input_tokens: None,
                            details: passthrough_details(client.clone()),
                        },
                    }),
                }
                self.bad_gateway(&cause)
            }
            Ok(resp) => {
                let (mut parts, body) = resp.into_parts();
                headers::strip_hop_by_hop(&mut parts.headers);
                // The version is hop-by-hop too (RFC 9110 §6.2): the client
                // gets our own, so an HTTP/1.0 upstream's close-delimited
                // body reaches an HTTP/1.1 client chunked, on a connection
                // that stays open, instead of ending it.
                parts.version = http::Version::default();
                let body = IdleTimeout::new(body, self.link.limits.idle_timeout);
                let body = match actor {
                    Some(addr) => {
                        addr.do_send(ResponseStarted {
                            status: parts.status.as_u16(),
                            content_type: headers::tap_content_type(&parts.headers),
                            at: Instant::now(),
                        });
                        TapBody::new(body, CallTap::new(addr)).boxed()
                    }
                    None => {
                        self.link.supervisor.do_send(PassedThrough {
                            seq,
                            call: Call {
                                identity,
                                status: CallStatus::Unmetered,
                                http_status: Some(parts.status.as_u16()),
                                speed: None,
                                input_tokens: None,
                                details: passthrough_details(client),
                            },
                        });
                        body.boxed()
                    }
                };
                Response::from_parts(parts, body)
            }
        }
    }

    /// `502 Bad Gateway` with a JSON body saying which upstream failed and
    /// why, so a user sees at once which server is down.
    fn bad_gateway(&self, cause: &str) -> Response<ProxyBody> {
        let body = serde_json::json!({
            "error": "upstream unreachable",
            "route": self.name,
            "upstream": self.upstream.base_url(),
            "cause": cause,
        });
        json_response(StatusCode::BAD_GATEWAY, &body)
    }
}

/// The details of a call that was never metered: who made it, and when it
/// ended.
/// Reports an unmetered call as `abandoned` when dropped armed: the
/// client went away before the upstream answered, so `handle` never got
/// to report it.
struct PassThroughGuard {
    supervisor: Addr<Supervisor>,
    seq: u64,
    identity: Option<CallIdentity>,
    client: Option<String>,
}

impl PassThroughGuard {
    /// The upstream answered (or failed): `handle` reports the call itself.
    fn disarm(&mut self) {
        self.identity = None;
    }
}

impl Drop for PassThroughGuard {
    fn drop(&mut self) {
        if let Some(identity) = self.identity.take() {
            self.supervisor.do_send(PassedThrough {
                seq: self.seq,
                call: Call {
                    identity,
                    status: CallStatus::Abandoned,
                    http_status: None,
                    speed: None,
                    input_tokens: None,
                    details: passthrough_details(self.client.take()),
                },
            });
        }
    }
}

fn passthrough_details(client: Option<String>) -> CallDetails {
    CallDetails {
        client,
        settled_at: Some(humantime::format_rfc3339_millis(SystemTime::now()).to_string()),
        ..CallDetails::default()
    }
}

/// A JSON response with the given status.
pub fn json_response(status: StatusCode, body: &serde_json::Value) -> Response<ProxyBody> {
    let mut resp = Response::new(
        Full::new(Bytes::from(body.to_string()))
            .map_err(|never| match never {})
            .boxed(),
    );
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// "client error (Connect): tcp connect error: Connection refused (os error 111)"
fn error_chain(e: &dyn std::error::Error) -> String {
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
