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
use std::time::{Duration, SystemTime};

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
use super::plan::{self, BodyFlags, Ending, Plan, Timeline, DEFAULT_MODEL};
use super::state::{Finished, ModelUse, SlotLease, State, Task};
use super::telemetry;
use super::wire::{self, Framing, Reply, Totals};
use super::{Overflow, PsWhileLoading, SimConfig};
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

/// The discovery and telemetry routes (GET).
pub(crate) const GET_PATHS: [&str; 8] = [
    "/health",
    "/v1/models",
    "/api/tags",
    "/api/version",
    "/api/ps",
    "/slots",
    "/props",
    "/metrics",
];

/// State shared by the listener and every request.
#[derive(Debug)]
struct Shared {
    config: SimConfig,
    /// Loaded models, slots and counters (see `state`).
    state: Arc<State>,
    ids: IdSource,
    started: SystemTime,
    active: AtomicU64,
    cancelled: AtomicU64,
    /// Telemetry GETs answered (`/api/ps`, `/slots`, `/props`, `/metrics`).
    telemetry: AtomicU64,
    /// Set on shutdown, so streams cut by the server itself are not counted
    /// as client hang-ups.
    closing: AtomicBool,
    /// What `/api/version` answers now.
    version: std::sync::Mutex<String>,
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
///   first token (SSE APIs only; [`SimConfig::ping_interval`] by default);
/// - `x-sim-stall-after: N` with `x-sim-stall-ms: M`: after N tokens the
///   stream is silent for M ms, then goes on (every later token M ms late).
///
/// Server behaviour (defaults off; see [`SimConfig`]): `x-sim-prompt-tokens`
/// (the prompt's size instead of `ceil(body bytes / 4)`),
/// `x-sim-prefill-tps`, `x-sim-load-ms` (load time if this call finds its
/// model unloaded), `x-sim-keep-alive-ms` (negative: forever),
/// `x-sim-overflow` (`auto`/`refuse`/`truncate`), `x-sim-draft-acceptance`
/// (0..=1), `x-sim-vram-fraction` (0..=1, applied when this call loads the
/// model).
///
/// A call first waits for its model (loading it if needed), then for a
/// slot (FIFO), then is checked against the context size, then prefills;
/// the base ttft follows. The telemetry GETs (`/api/ps`, `/slots`,
/// `/props`, `/metrics`) show the same state.
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
            state: Arc::new(State::new(&config)),
            version: std::sync::Mutex::new(config.version.clone()),
            config,
            ids: IdSource::new(),
            started: SystemTime::now(),
            active: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
            telemetry: AtomicU64::new(0),
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

    /// Telemetry requests answered so far (`/api/ps`, `/slots`, `/props`,
    /// `/metrics`): what polling this server costs it.
    pub fn telemetry_requests(&self) -> u64 {
        self.shared.telemetry.load(Ordering::SeqCst)
    }

    /// From now on `/api/version` answers `version`: the server was
    /// upgraded (or downgraded) in place.
    pub fn set_version(&self, version: &str) {
        if let Ok(mut v) = self.shared.version.lock() {
            *v = version.to_owned();
        }
    }

    /// From now on every loaded model sits `vram_fraction` (0..=1) in
    /// VRAM in `/api/ps`, the rest on the CPU: the model was pushed partly
    /// off the GPU.
    pub fn set_vram_fraction(&self, vram_fraction: f64) {
        self.shared
            .state
            .set_vram_fraction(vram_fraction.clamp(0.0, 1.0));
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
        if path == "/api/ps" && shared.config.ps_while_loading == PsWhileLoading::Blocks {
            // Answered once no load is under way, as Ollama's PsHandler
            // waits for each loading runner's lock.
            while let Some(end) = shared.state.loads_end(Instant::now()) {
                tokio::time::sleep_until(end).await;
            }
        }
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
    let admitted = match admit(api, &plan, &flags, streamed, arrival, &shared).await {
        Ok(a) => a,
        Err(response) => return response,
    };
    let Admitted {
        timeline,
        prompt_tokens,
        lease,
    } = admitted;
    let mut reply = Reply::new(api, &flags, &plan, &shared.ids, SystemTime::now());
    reply.input_tokens = prompt_tokens;
    if let Some(status) = plan.status {
        sleep_until(plan.deadline(timeline.origin, 0)).await;
        let msg = format!("simulated failure ({}: {status})", plan::H_STATUS);
        return json(status, wire::error_body(api, status, &msg));
    }
    if streamed {
        start_stream(reply, plan, timeline, shared, lease)
    } else {
        whole(reply, plan, timeline, shared, lease).await
    }
}

/// A call that has its model and a slot.
struct Admitted {
    timeline: Timeline,
    /// The prompt as the server processes it (cut when truncated).
    prompt_tokens: u64,
    lease: Lease,
}

/// What an admitted call holds until it ends: its slot and its model.
/// Dropping it frees the slot (the next queued call starts) and starts the
/// model's keep-alive.
struct Lease {
    _slot: SlotLease,
    _model: ModelUse,
    state: Arc<State>,
}

impl Lease {
    /// The call completed: its numbers go into `/metrics`.
    fn finish(self, totals: &Totals) {
        self.state.record(&Finished {
            prompt_tokens: totals.input_tokens,
            prompt_seconds: totals.prompt_ms / 1000.0,
            output_tokens: totals.output_tokens,
            output_seconds: totals.predicted_ms / 1000.0,
            drafts: totals.drafts,
        });
    }
}

/// Whether the API family cuts an over-long prompt rather than refusing it.
fn truncates(overflow: Overflow, api: ApiKind) -> bool {
    match overflow {
        Overflow::Auto => matches!(api, ApiKind::OllamaChat | ApiKind::OllamaGenerate),
        Overflow::Refuse => false,
        Overflow::Truncate => true,
    }
}

/// Takes a call through the stages before its prefill: the model (loaded
/// now if it is not resident: the wait is `load_time`, or what is left of
/// a load another call started), then a slot (FIFO behind earlier calls),
/// then the context check, which refuses the call (llama-server: prompt
/// tokens >= `n_ctx`, checked once the call has a slot, as upstream
/// server-context.cpp does) or cuts its prompt to `n_ctx` (Ollama's
/// runner: prompt tokens > `n_ctx`). Ollama's order, the scheduler's load
/// before the runner's parallel limit, is kept for both families.
async fn admit(
    api: ApiKind,
    plan: &Plan,
    flags: &BodyFlags,
    streamed: bool,
    arrival: Instant,
    shared: &Shared,
) -> Result<Admitted, Response<Body>> {
    let state = &shared.state;
    let ollama = matches!(api, ApiKind::OllamaChat | ApiKind::OllamaGenerate);
    // A request's own `keep_alive` sets the session, as in Ollama.
    let keep_alive = match flags.keep_alive {
        Some(k) if ollama => k,
        _ => plan.keep_alive,
    };
    let (model, ready_at) = state.use_model(
        &flags.model,
        plan.load_time,
        keep_alive,
        plan.vram_fraction,
        arrival,
    );
    if ready_at > Instant::now() {
        sleep_until(ready_at).await;
    }
    let load = ready_at.saturating_duration_since(arrival);
    let slot = state.acquire_slot().await;
    let start = Instant::now();
    let asked = plan.prompt_tokens.unwrap_or(flags.prompt_tokens);
    let n_ctx = shared.config.n_ctx;
    let prompt_tokens = if truncates(plan.overflow, api) {
        asked.min(n_ctx)
    } else if asked >= n_ctx {
        let (status, body) = wire::context_error(api, asked, n_ctx);
        return Err(json(status, body));
    } else {
        asked
    };
    let origin = start + plan.prefill(prompt_tokens);
    let (stop_at, _) = plan.stop();
    slot.begin(Task {
        id: state.next_task_id(),
        n_prompt: prompt_tokens,
        start,
        prefill_end: origin,
        first: plan.deadline(origin, 0),
        tokens_per_second: plan.tokens_per_second,
        n_output: stop_at,
        stream: streamed,
        speculative: plan.draft_acceptance.is_some(),
    });
    Ok(Admitted {
        timeline: Timeline {
            arrival,
            start,
            origin,
            load,
        },
        prompt_tokens,
        lease: Lease {
            _slot: slot,
            _model: model,
            state: state.clone(),
        },
    })
}

/// Sends the stream's head now and spawns the generator that writes the
/// body on schedule.
fn start_stream(
    reply: Reply,
    plan: Plan,
    timeline: Timeline,
    shared: Arc<Shared>,
    lease: Lease,
) -> Response<Body> {
    let (tx, body) = body::channel();
    let content_type = reply.content_type(true);
    let generation = Generation::start(shared);
    tokio::spawn(run_stream(tx, reply, plan, timeline, generation, lease));
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
/// counts the hang-up; the lease is dropped on every return, freeing the
/// slot the moment the stream ends.
async fn run_stream(
    tx: mpsc::Sender<Item>,
    mut reply: Reply,
    plan: Plan,
    t: Timeline,
    generation: Generation,
    lease: Lease,
) {
    let (stop_at, ending) = plan.stop();
    let first_due = plan.deadline(t.origin, 0);
    if let (Some(every), Framing::Sse) = (plan.keepalive, reply.framing()) {
        if !send_keepalives(&tx, t.start, every, first_due).await {
            return;
        }
    }
    let mut totals = None;
    let mut closing = |reply: &mut Reply, first: Instant, last: Instant| match ending {
        Ending::Finish => {
            let measured = Totals::measure(&plan, reply.input_tokens, &t, first, last, last);
            let text = reply.finish(&measured);
            totals = Some(measured);
            text
        }
        Ending::Error => reply.error_event(&error_message(stop_at)),
        Ending::Cut => String::new(),
    };
    let mut first = None;
    for i in 0..stop_at {
        if !wait(&tx, plan.deadline(t.origin, i)).await {
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
        if !wait(&tx, plan.deadline(t.origin, stop_at)).await {
            return;
        }
        let _ = tx.send(Err(Aborted)).await;
    }
    generation.finish();
    if let Some(totals) = totals {
        lease.finish(&totals);
    }
}

/// Sends an SSE keep-alive `every` so long from `start` until the first
/// token is due; false if the client went away.
async fn send_keepalives(
    tx: &mpsc::Sender<Item>,
    start: Instant,
    every: Duration,
    first_due: Instant,
) -> bool {
    let mut next = start + every;
    while next < first_due {
        if !wait(tx, next).await || !send(tx, wire::KEEPALIVE.to_owned()).await {
            return false;
        }
        next += every;
    }
    true
}

/// A non-streamed reply: waits out the whole schedule, then sends the
/// complete body (or the fault).
async fn whole(
    mut reply: Reply,
    plan: Plan,
    t: Timeline,
    shared: Arc<Shared>,
    lease: Lease,
) -> Response<Body> {
    let generation = Generation::start(shared);
    let (stop_at, ending) = plan.stop();
    sleep_until(plan.deadline(t.origin, 0)).await;
    let first = Instant::now();
    match ending {
        Ending::Cut => {
            sleep_until(plan.deadline(t.origin, stop_at)).await;
            generation.finish();
            let mut response = Response::new(body::aborted().map_err(BoxError::from).boxed());
            response
                .headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static(wire::JSON));
            return response;
        }
        Ending::Error => {
            sleep_until(plan.deadline(t.origin, stop_at.saturating_sub(1))).await;
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
    sleep_until(plan.end(t.origin)).await;
    let last = Instant::now();
    reply.wall = SystemTime::now();
    let totals = Totals::measure(&plan, reply.input_tokens, &t, first, last, last);
    let mut response = json(200, reply.whole(&totals));
    for (name, value) in reply.whole_headers(&totals) {
        if let Ok(v) = HeaderValue::from_str(&value) {
            response.headers_mut().insert(name, v);
        }
    }
    generation.finish();
    lease.finish(&totals);
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
        "/api/version" => {
            let version = shared.version.lock().map(|v| v.clone()).unwrap_or_default();
            Obj::new().field("version", version).finish()
        }
        "/api/ps" | "/slots" | "/props" | "/metrics" => return Some(telemetry_reply(path, shared)),
        _ => return None,
    };
    Some(json(200, text))
}

/// The telemetry endpoints, rendered from the state at this instant.
fn telemetry_reply(path: &str, shared: &Shared) -> Response<Body> {
    shared.telemetry.fetch_add(1, Ordering::SeqCst);
    if !shared.config.publishes_slots && path != "/api/ps" {
        return not_found();
    }
    if !shared.config.publishes_ps && path == "/api/ps" {
        return not_found();
    }
    let mut snap = shared.state.snapshot(Instant::now());
    if shared.config.slots.is_none() {
        telemetry::with_room(&mut snap);
    }
    let n_ctx = shared.config.n_ctx;
    let speculative = shared.config.draft_acceptance.is_some();
    match path {
        "/api/ps" => json(
            200,
            telemetry::api_ps(&snap, n_ctx, |at| shared.state.wall(at)),
        ),
        "/slots" => json(200, telemetry::slots(&snap, n_ctx, speculative)),
        "/props" => json(200, telemetry::props(&snap, n_ctx, speculative)),
        _ => {
            let body = Full::new(Bytes::from(telemetry::metrics(&snap)))
                .map_err(|never| match never {})
                .boxed();
            let mut response = Response::new(body);
            let started = shared
                .started
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0);
            let h = response.headers_mut();
            h.insert(
                CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4"),
            );
            h.insert("process-start-time-unix", HeaderValue::from(started));
            h.insert(SERVER, HeaderValue::from_static(SERVER_NAME));
            response
        }
    }
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
            state: Arc::new(State::new(&SimConfig::default())),
            config: SimConfig::default(),
            ids: IdSource::new(),
            started: SystemTime::now(),
            active: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
            telemetry: AtomicU64::new(0),
            closing: AtomicBool::new(false),
            version: std::sync::Mutex::new(String::new()),
        };
        for p in GET_PATHS {
            assert!(discovery(p, &shared).is_some(), "{p}");
        }
        assert!(discovery("/nope", &shared).is_none());
    }
}
