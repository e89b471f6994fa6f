//! The HTTP side: listener, routing, and the per-request generator that
//! writes tokens on schedule.
//!
//! HTTP/1.1 only (hyper `http1`), like llama-server and Ollama. Sockets get
//! `TCP_NODELAY` so a token frame is never held back by Nagle's algorithm.
//! Hyper watches the socket while a response is being written: when the
//! client hangs up it drops the body, the generator sees its channel closed
//! at its next wait and stops at once, and the hang-up is counted.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_TYPE, SERVER};
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::{sleep_until, Instant};

use super::body::{self, Aborted, Item};
use super::ids::IdSource;
use super::json::Obj;
use super::plan::{self, BodyFlags, Ending, Plan, DEFAULT_MODEL};
use super::wire::{self, Framing, Reply, Totals};
use super::SimConfig;
use crate::model::ApiKind;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Body = BoxBody<Bytes, BoxError>;

/// The `Server` header of every reply.
const SERVER_NAME: &str = "speedtap-simulate";

/// Whether a route streams, and who decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StreamMode {
    /// The body's `stream` flag, with this default when absent.
    Body(bool),
    /// Always streams (`/generate_stream`).
    Always,
    /// Never streams (`/generate`).
    Never,
}

/// One generation route.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PostRoute {
    pub path: &'static str,
    pub api: ApiKind,
    pub stream: StreamMode,
}

/// Every generation route. OpenAI-style routes and llama.cpp's
/// `/completion` stream only when asked; Ollama's stream unless told not to.
pub(crate) const POST_ROUTES: [PostRoute; 9] = [
    PostRoute {
        path: "/v1/chat/completions",
        api: ApiKind::OpenaiChat,
        stream: StreamMode::Body(false),
    },
    PostRoute {
        path: "/v1/completions",
        api: ApiKind::OpenaiCompletions,
        stream: StreamMode::Body(false),
    },
    PostRoute {
        path: "/v1/responses",
        api: ApiKind::OpenaiResponses,
        stream: StreamMode::Body(false),
    },
    PostRoute {
        path: "/v1/messages",
        api: ApiKind::AnthropicMessages,
        stream: StreamMode::Body(false),
    },
    PostRoute {
        path: "/api/chat",
        api: ApiKind::OllamaChat,
        stream: StreamMode::Body(true),
    },
    PostRoute {
        path: "/api/generate",
        api: ApiKind::OllamaGenerate,
        stream: StreamMode::Body(true),
    },
    PostRoute {
        path: "/completion",
        api: ApiKind::LlamacppCompletion,
        stream: StreamMode::Body(false),
    },
    PostRoute {
        path: "/generate_stream",
        api: ApiKind::TgiGenerate,
        stream: StreamMode::Always,
    },
    PostRoute {
        path: "/generate",
        api: ApiKind::TgiGenerate,
        stream: StreamMode::Never,
    },
];

/// The discovery routes (GET).
pub(crate) const GET_PATHS: [&str; 4] = ["/health", "/v1/models", "/api/tags", "/api/version"];

/// State shared by the listener and every request.
#[derive(Debug)]
struct Shared {
    config: SimConfig,
    ids: IdSource,
    started: SystemTime,
    active: AtomicU64,
    cancelled: AtomicU64,
    /// Set on shutdown, so streams cut by the server itself are not counted
    /// as client hang-ups.
    closing: AtomicBool,
}

/// A running simulated server.
///
/// Serves on the tokio runtime it was started on until [`SimServer::shutdown`]
/// or drop (which stops accepting and closes open connections).
///
/// Per-request request headers override the script:
/// `x-sim-ttft-ms`, `x-sim-tps`, `x-sim-tokens`, `x-sim-reasoning`,
/// `x-sim-usage` (true/false), `x-sim-server-timings` (true/false),
/// `x-sim-usage-factor`; and inject faults:
/// - `x-sim-status: 503`: that status with the API's JSON error body, sent
///   after ttft, never streamed;
/// - `x-sim-cut-after: N`: N tokens, then, when token N would be due, the
///   connection is aborted mid-body (the client sees an incomplete body);
///   for a non-streamed request the response is aborted at that moment;
/// - `x-sim-error-after: N`: N tokens, then the API's in-protocol error
///   event and a clean end of body with no terminal marker (OpenAI and
///   llama.cpp `data: {"error":{…}}`, Anthropic `event: error`, Responses
///   `event: error`, Ollama `{"error":"…"}`, TGI `data:{"error":…}`); for a
///   non-streamed request a 500 with the API's error body at that moment;
/// - `x-sim-keepalive-ms: N`: SSE `: ping` comments every N ms until the
///   first token (SSE APIs only).
///
/// A fault whose N is beyond the output never fires. A value that doesn't
/// parse gets a 400 naming the header.
#[derive(Debug)]
pub struct SimServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl SimServer {
    /// Binds `addr` (e.g. "127.0.0.1:0") and serves on the current tokio
    /// runtime until dropped or shut down. An unplayable config (rate not
    /// > 0, negative factor) is an `InvalidInput` error.
    pub async fn start(addr: &str, config: SimConfig) -> std::io::Result<SimServer> {
        plan::validate(&config)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            config,
            ids: IdSource::new(),
            started: SystemTime::now(),
            active: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
            closing: AtomicBool::new(false),
        });
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(accept_loop(listener, shared.clone(), stopped));
        Ok(SimServer {
            addr,
            shared,
            stop: Some(stop),
            task: Some(task),
        })
    }

    /// The bound address (the real port when bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://IP:PORT`, no trailing slash.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Generations the client abandoned: it hung up before the reply was
    /// complete (streamed or not). Faults the simulator injects itself
    /// (`x-sim-cut-after`) and shutdown don't count.
    pub fn cancelled_streams(&self) -> u64 {
        self.shared.cancelled.load(Ordering::SeqCst)
    }

    /// Generations in progress now (streamed or not).
    pub fn active_streams(&self) -> u64 {
        self.shared.active.load(Ordering::SeqCst)
    }

    /// Stops accepting, closes open connections and waits for the listener
    /// task to end.
    pub async fn shutdown(mut self) {
        self.shared.closing.store(true, Ordering::SeqCst);
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for SimServer {
    fn drop(&mut self) {
        self.shared.closing.store(true, Ordering::SeqCst);
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// Accepts until told to stop; connection tasks live in a `JoinSet`, so
/// leaving the loop (or aborting it) closes every connection.
async fn accept_loop(listener: TcpListener, shared: Arc<Shared>, mut stop: oneshot::Receiver<()>) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            _ = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    conns.spawn(serve_connection(stream, shared.clone()));
                }
                // Out of file descriptors and the like: back off briefly
                // instead of spinning, then keep serving.
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

async fn serve_connection(stream: TcpStream, shared: Arc<Shared>) {
    let _ = stream.set_nodelay(true);
    let service = service_fn(move |req| handle(req, shared.clone()));
    // Connection errors (client gone, malformed request) end this
    // connection only; there is no one to report them to.
    let _ = http1::Builder::new()
        .timer(TokioTimer::new())
        .serve_connection(TokioIo::new(stream), service)
        .await;
}

async fn handle(req: Request<Incoming>, shared: Arc<Shared>) -> Result<Response<Body>, Infallible> {
    // The schedule starts when the request head has arrived.
    let arrival = Instant::now();
    let path = req.uri().path();
    let response = if req.method() == Method::POST {
        match POST_ROUTES.iter().find(|r| r.path == path) {
            Some(route) => generate(route, req, arrival, shared).await,
            None => not_found(),
        }
    } else if req.method() == Method::GET {
        discovery(path, &shared).unwrap_or_else(not_found)
    } else {
        not_found()
    };
    Ok(response)
}

/// Counts one generation in `active_streams`, and in `cancelled_streams`
/// when dropped unfinished (the client hung up: hyper dropped the body or
/// the handler future).
struct Generation {
    shared: Arc<Shared>,
    finished: bool,
}

impl Generation {
    fn start(shared: Arc<Shared>) -> Generation {
        shared.active.fetch_add(1, Ordering::SeqCst);
        Generation {
            shared,
            finished: false,
        }
    }

    fn finish(mut self) {
        self.finished = true;
    }
}

impl Drop for Generation {
    fn drop(&mut self) {
        self.shared.active.fetch_sub(1, Ordering::SeqCst);
        if !self.finished && !self.shared.closing.load(Ordering::SeqCst) {
            self.shared.cancelled.fetch_add(1, Ordering::SeqCst);
        }
    }
}

async fn generate(
    route: &PostRoute,
    req: Request<Incoming>,
    arrival: Instant,
    shared: Arc<Shared>,
) -> Response<Body> {
    let api = route.api;
    let plan = match Plan::new(&shared.config, req.headers()) {
        Ok(p) => p,
        Err(e) => return json(400, wire::error_body(api, 400, &e)),
    };
    let bytes = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            let msg = "could not read the request body";
            return json(400, wire::error_body(api, 400, msg));
        }
    };
    let default_stream = match route.stream {
        StreamMode::Body(default) => default,
        StreamMode::Always => true,
        StreamMode::Never => false,
    };
    let flags = match BodyFlags::parse(&bytes, default_stream) {
        Ok(f) => f,
        Err(e) => return json(400, wire::error_body(api, 400, &e)),
    };
    // The request text goes no further than this.
    drop(bytes);
    let streamed = match route.stream {
        StreamMode::Body(_) => flags.stream,
        StreamMode::Always => true,
        StreamMode::Never => false,
    };
    let reply = Reply::new(api, &flags, &plan, &shared.ids, SystemTime::now());
    if let Some(status) = plan.status {
        sleep_until(plan.deadline(arrival, 0)).await;
        let msg = format!("simulated failure ({}: {status})", plan::H_STATUS);
        return json(status, wire::error_body(api, status, &msg));
    }
    if streamed {
        start_stream(reply, plan, arrival, shared)
    } else {
        whole(reply, plan, arrival, shared).await
    }
}

/// Sends the stream's head now and spawns the generator that writes the
/// body on schedule.
fn start_stream(reply: Reply, plan: Plan, arrival: Instant, shared: Arc<Shared>) -> Response<Body> {
    let (tx, body) = body::channel();
    let content_type = reply.content_type(true);
    let generation = Generation::start(shared);
    tokio::spawn(run_stream(tx, reply, plan, arrival, generation));
    let mut response = Response::new(body.map_err(BoxError::from).boxed());
    let h = response.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    h.insert(SERVER, HeaderValue::from_static(SERVER_NAME));
    response
}

/// Sleeps until `at`; false if the client went away first (the body was
/// dropped), so the generator stops at once instead of at its next write.
async fn wait(tx: &mpsc::Sender<Item>, at: Instant) -> bool {
    tokio::select! {
        _ = sleep_until(at) => true,
        _ = tx.closed() => false,
    }
}

async fn send(tx: &mpsc::Sender<Item>, text: String) -> bool {
    tx.send(Ok(Bytes::from(text))).await.is_ok()
}

fn error_message(written: u64) -> String {
    format!(
        "simulated error after {written} tokens ({})",
        plan::H_ERROR_AFTER
    )
}

/// Writes the stream: keep-alives until the first token, one frame per
/// token at its deadline, the closing events (or the error event) in the
/// last token's frame, or the abort. Returning early without `finish`
/// counts the hang-up.
async fn run_stream(
    tx: mpsc::Sender<Item>,
    mut reply: Reply,
    plan: Plan,
    arrival: Instant,
    generation: Generation,
) {
    let (stop_at, ending) = plan.stop();
    let first_due = plan.deadline(arrival, 0);
    if let (Some(every), Framing::Sse) = (plan.keepalive, reply.framing()) {
        let mut next = arrival + every;
        while next < first_due {
            if !wait(&tx, next).await || !send(&tx, wire::KEEPALIVE.to_owned()).await {
                return;
            }
            next += every;
        }
    }
    let closing = |reply: &mut Reply, first: Instant, last: Instant| match ending {
        Ending::Finish => {
            let totals = Totals::measure(&plan, reply.input_tokens, arrival, first, last, last);
            reply.finish(&totals)
        }
        Ending::Error => reply.error_event(&error_message(stop_at)),
        Ending::Cut => String::new(),
    };
    let mut first = None;
    for i in 0..stop_at {
        if !wait(&tx, plan.deadline(arrival, i)).await {
            return;
        }
        let now = Instant::now();
        reply.wall = SystemTime::now();
        let first_at = *first.get_or_insert(now);
        let mut frame = if i == 0 {
            reply.preamble()
        } else {
            String::new()
        };
        frame.push_str(&reply.token(i));
        if i + 1 == stop_at {
            frame.push_str(&closing(&mut reply, first_at, now));
        }
        if !send(&tx, frame).await {
            return;
        }
    }
    if stop_at == 0 {
        if !wait(&tx, first_due).await {
            return;
        }
        let now = Instant::now();
        reply.wall = SystemTime::now();
        let frame = match ending {
            Ending::Finish => {
                let mut f = reply.preamble();
                f.push_str(&closing(&mut reply, now, now));
                f
            }
            _ => closing(&mut reply, now, now),
        };
        if !frame.is_empty() && !send(&tx, frame).await {
            return;
        }
    }
    if ending == Ending::Cut {
        // Abort when the next token would have been due: the previous frame
        // has long been written, so the client really holds N tokens.
        if !wait(&tx, plan.deadline(arrival, stop_at)).await {
            return;
        }
        let _ = tx.send(Err(Aborted)).await;
    }
    generation.finish();
}

/// A non-streamed reply: waits out the whole schedule, then sends the
/// complete body (or the fault).
async fn whole(
    mut reply: Reply,
    plan: Plan,
    arrival: Instant,
    shared: Arc<Shared>,
) -> Response<Body> {
    let generation = Generation::start(shared);
    let (stop_at, ending) = plan.stop();
    sleep_until(plan.deadline(arrival, 0)).await;
    let first = Instant::now();
    match ending {
        Ending::Cut => {
            sleep_until(plan.deadline(arrival, stop_at)).await;
            generation.finish();
            let mut response = Response::new(body::aborted().map_err(BoxError::from).boxed());
            response
                .headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static(wire::JSON));
            return response;
        }
        Ending::Error => {
            sleep_until(plan.deadline(arrival, stop_at.saturating_sub(1))).await;
            generation.finish();
            return json(
                500,
                wire::error_body(reply.api, 500, &error_message(stop_at)),
            );
        }
        Ending::Finish => {}
    }
    for i in 0..plan.total() {
        reply.record(i);
    }
    sleep_until(plan.end(arrival)).await;
    let last = Instant::now();
    reply.wall = SystemTime::now();
    let totals = Totals::measure(&plan, reply.input_tokens, arrival, first, last, last);
    let mut response = json(200, reply.whole(&totals));
    for (name, value) in reply.whole_headers(&totals) {
        if let Ok(v) = HeaderValue::from_str(&value) {
            response.headers_mut().insert(name, v);
        }
    }
    generation.finish();
    response
}

/// A complete JSON reply (`Content-Length` set by `Full`).
fn json(status: u16, text: String) -> Response<Body> {
    let body = Full::new(Bytes::from(text))
        .map_err(|never| match never {})
        .boxed();
    let mut response = Response::new(body);
    *response.status_mut() =
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let h = response.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static(wire::JSON));
    h.insert(SERVER, HeaderValue::from_static(SERVER_NAME));
    response
}

/// llama-server's 404.
fn not_found() -> Response<Body> {
    let text = Obj::new()
        .obj(
            "error",
            Obj::new()
                .field("message", "File Not Found")
                .field("type", "not_found_error")
                .field("code", 404),
        )
        .finish();
    json(404, text)
}

/// The discovery endpoints clients and speedtap's own probe use.
fn discovery(path: &str, shared: &Shared) -> Option<Response<Body>> {
    let created = shared
        .started
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let text = match path {
        "/health" => Obj::new().field("status", "ok").finish(),
        "/v1/models" => Obj::new()
            .field("object", "list")
            .arr(
                "data",
                vec![Obj::new()
                    .field("id", DEFAULT_MODEL)
                    .field("object", "model")
                    .field("created", created)
                    .field("owned_by", SERVER_NAME)],
            )
            .finish(),
        "/api/tags" => {
            let details = Obj::new()
                .field("parent_model", "")
                .field("format", "gguf")
                .field("family", "sim")
                .field("families", ["sim"])
                .field("parameter_size", "0")
                .field("quantization_level", "F16");
            let model = Obj::new()
                .field("name", DEFAULT_MODEL)
                .field("model", DEFAULT_MODEL)
                .field("modified_at", wire::rfc3339(shared.started))
                .field("size", 0)
                .field("digest", "0".repeat(64))
                .obj("details", details);
            Obj::new().arr("models", vec![model]).finish()
        }
        "/api/version" => Obj::new().field("version", "0.0.0-speedtap-sim").finish(),
        _ => return None,
    };
    Some(json(200, text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_are_unique_and_cover_every_metered_api() {
        for (i, a) in POST_ROUTES.iter().enumerate() {
            for b in &POST_ROUTES[i + 1..] {
                assert_ne!(a.path, b.path);
            }
        }
        for api in ApiKind::METERED {
            assert!(POST_ROUTES.iter().any(|r| r.api == api), "{api}");
        }
    }

    #[test]
    fn discovery_bodies_parse() {
        let shared = Shared {
            config: SimConfig::default(),
            ids: IdSource::new(),
            started: SystemTime::now(),
            active: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
            closing: AtomicBool::new(false),
        };
        for p in GET_PATHS {
            assert!(discovery(p, &shared).is_some(), "{p}");
        }
        assert!(discovery("/nope", &shared).is_none());
    }
}
