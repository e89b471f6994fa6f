//! Soak: the real `speedtap run` binary under mixed traffic from many
//! concurrent clients for minutes, watching its memory and file
//! descriptors, and checking that every call settles and every byte arrives.
//!
//! # Shape
//! ```text
//! 50 clients ──> speedtap run ──route sim──> recording relay ──> SimServer
//!                    │        └─route dead─> (closed port: 502 on purpose)
//!                    └─ control API: /metrics, /api/v1/stats, /api/v1/calls
//! ```
//! - The upstream is the crate's scripted model server ([`SimServer`]), in
//!   this process, speaking every protocol speedtap meters. Between it and
//!   speedtap sits a small recording relay, also in this process: it
//!   forwards each request unchanged and hashes the response body bytes it
//!   hands to speedtap, keyed by the request's `x-soak-id`. `SimServer` does
//!   not expose the bytes it wrote (ids and timestamps vary per call), and a
//!   hash taken on the upstream's side of the socket is the only way to say
//!   "the client got exactly what the upstream sent" for tens of thousands
//!   of calls without keeping their bodies.
//! - Each client loops until the deadline over a weighted mix (see
//!   [`Kind`]): streamed calls on every protocol with varying TTFT, rate,
//!   length and reasoning; non-streamed calls; a `503` from upstream; an
//!   in-protocol error; an upstream connection cut mid-body; the client
//!   hanging up mid-stream or before the first byte; a route whose
//!   upstream is unreachable on purpose; and unmetered `GET`s. Every kind
//!   has the call status speedtap must settle it with, so the per-status
//!   counts can be compared with `speedtap_calls_total`. The simulator has
//!   no tool calls, so there are none here.
//! - A thread samples the child's `VmRSS` and open fds (`/proc/<pid>/fd`)
//!   every second; the samples go to a CSV.
//!
//! # What is asserted
//! - Every call the clients made is settled (`speedtap_calls_total` per
//!   route and status equals what the clients made of each kind, nothing is
//!   `in_flight` in `/api/v1/calls`, `/api/v1/stats` shows none active).
//! - No proxy errors: no 502 on the live route, no transport error a client
//!   did not cause or the upstream inject, and every compared body hashes
//!   the same as what the relay sent (client aborts are not compared: the
//!   client stopped reading).
//! - After a warm-up (the first 20% of the traffic), the least-squares
//!   slope of RSS is under [`MAX_RSS_KB_PER_MIN`] and that of fds under
//!   [`MAX_FDS_PER_MIN`] (see there for why those numbers).
//!
//! # Running it
//! `#[ignore]`d, so `cargo test --all-targets` skips it: a slope over a few
//! seconds says nothing, and CI runs the real thing once through
//! `scripts/soak --minutes 2` rather than paying for a short and a long run.
//! Environment: `SPEEDTAP_SOAK_SECS` (traffic duration, default 20),
//! `SPEEDTAP_SOAK_CLIENTS` (default 50), `SPEEDTAP_SOAK_CSV` (default
//! `target/soak/samples.csv`).

// The 80-line limit is for product code; a test may read as one long script.
#![allow(clippy::too_many_lines)]
#![allow(clippy::unwrap_used)] // a test (or bench) may unwrap: a panic is its failure report

use std::collections::HashMap;
use std::hash::Hasher;
use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::service::service_fn;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{json, Value};
use speedtap::simulate::{SimConfig, SimServer};
use tokio::net::TcpListener;

const BIN: &str = env!("CARGO_BIN_EXE_speedtap");

/// RSS growth allowed after warm-up. A leak that matters is per call: at
/// the ~35 calls/s this harness makes on the 2-core machine, 1 MB/min is
/// about 500 bytes kept per call, so this catches a leak of a few hundred
/// bytes per call (one leaked request head, say) while leaving room for
/// allocator noise.
const MAX_RSS_KB_PER_MIN: f64 = 1024.0;

/// Calls after which speedtap's bounded caches are full: the engine's ring
/// of recent calls holds 2,000 (`engine::supervisor::RECENT_CALLS`), and
/// SQLite's page cache (its default 2 MiB per connection) keeps the pages a
/// growing store writes until the file outgrows it, at ~380 bytes per call
/// (`docs/benchmarks.md`: 3.8 MB per 10,000 calls) about 5,500 calls.
/// Measured: RSS grows ~1 MB/min (≈ the store's own growth rate) for the
/// first few thousand calls, then flattens. Growth before that point is
/// filling bounded caches, not a leak.
const WARMUP_CALLS: u64 = 6_000;

/// The bound for runs too short to get past [`WARMUP_CALLS`] (CI's
/// two-minute run): four times the steady bound, still well under what a
/// per-call leak of a connection buffer or a body (kilobytes per call,
/// several MB/min here) would show.
const MAX_RSS_KB_PER_MIN_IN_WARMUP: f64 = 4096.0;

/// Samples needed after warm-up for the steady bound to apply.
const MIN_STEADY_SAMPLES: usize = 60;

/// fd growth allowed after warm-up. The count swings by tens with the
/// connections open at the sampling instant (50 clients, their upstream
/// legs), which puts a least-squares slope's noise at a few per minute in a
/// short run; a leak of one fd per failed call (~1/s here) would be ~60/min.
const MAX_FDS_PER_MIN: f64 = 10.0;

/// Share of the traffic time treated as warm-up (pools, caches, the
/// tokenizer tables, the store's first pages).
const WARMUP_SHARE: f64 = 0.2;

/// Debug builds on a busy shared 2-core machine start slowly.
const STARTUP: Duration = Duration::from_secs(60);

/// The longest a client call may take. The longest scripted call is
/// 10 s (400 tokens at 40/s, the client hang-up kinds); the rest is room
/// for a busy machine.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// How long, after the traffic stops, every call has to settle.
const SETTLE: Duration = Duration::from_secs(60);

const MODELS: [&str; 3] = ["soak-a", "soak-b", "soak-c"];

// ---------------------------------------------------------------------------
// Settings
// ---------------------------------------------------------------------------

struct Settings {
    traffic: Duration,
    clients: usize,
    csv: PathBuf,
}

impl Settings {
    fn from_env() -> Settings {
        let secs: u64 = env_num("SPEEDTAP_SOAK_SECS", 20);
        let clients: u64 = env_num("SPEEDTAP_SOAK_CLIENTS", 50);
        let csv = std::env::var_os("SPEEDTAP_SOAK_CSV")
            .map(PathBuf::from)
            .unwrap_or_else(|| target_dir().join("soak").join("samples.csv"));
        Settings {
            traffic: Duration::from_secs(secs.max(1)),
            clients: clients.max(1) as usize,
            csv,
        }
    }
}

fn env_num(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a whole number")),
        Err(_) => default,
    }
}

/// `target/` (the parent of `CARGO_TARGET_TMPDIR`, `target/tmp`).
fn target_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("target/tmp has a parent")
        .to_path_buf()
}

// ---------------------------------------------------------------------------
// A small deterministic generator (each client has its own seed)
// ---------------------------------------------------------------------------

struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }

    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

// ---------------------------------------------------------------------------
// The recording relay
// ---------------------------------------------------------------------------

/// What the relay handed to speedtap for one `x-soak-id`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Sent {
    len: u64,
    hash: u64,
}

type Ledger = Arc<Mutex<HashMap<u64, Sent>>>;

/// The ids of requests marked `x-soak-report-arrival` that reached the
/// relay (so speedtap had dispatched them upstream).
type Arrivals = Arc<Mutex<std::collections::HashSet<u64>>>;

/// A response body that hashes every data frame on its way out and files
/// the total under the call's id when it ends, fails or is dropped.
struct Recording {
    inner: Incoming,
    id: Option<u64>,
    len: u64,
    hasher: std::collections::hash_map::DefaultHasher,
    ledger: Ledger,
}

impl Recording {
    fn file(&mut self) {
        if let Some(id) = self.id.take() {
            self.ledger.lock().unwrap().insert(
                id,
                Sent {
                    len: self.len,
                    hash: self.hasher.finish(),
                },
            );
        }
    }
}

impl Body for Recording {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.len += data.len() as u64;
                    this.hasher.write(data);
                }
            }
            Poll::Ready(Some(Err(_))) | Poll::Ready(None) => this.file(),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Recording {
    fn drop(&mut self) {
        self.file();
    }
}

/// Starts the relay in front of `upstream`; returns its address.
async fn start_relay(upstream: SocketAddr, ledger: Ledger, arrived: Arrivals) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let client: Client<HttpConnector, Incoming> =
        Client::builder(TokioExecutor::new()).build_http();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            let client = client.clone();
            let ledger = ledger.clone();
            let arrived = arrived.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req: Request<Incoming>| {
                    relay_one(
                        client.clone(),
                        upstream,
                        ledger.clone(),
                        arrived.clone(),
                        req,
                    )
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

async fn relay_one(
    client: Client<HttpConnector, Incoming>,
    upstream: SocketAddr,
    ledger: Ledger,
    arrived: Arrivals,
    req: Request<Incoming>,
) -> Result<Response<Recording>, hyper::Error> {
    let id = req
        .headers()
        .get("x-soak-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let (Some(id), true) = (id, req.headers().contains_key("x-soak-report-arrival")) {
        arrived.lock().unwrap().insert(id);
    }
    let (mut parts, body) = req.into_parts();
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    parts.uri = format!("http://{upstream}{path}").parse().unwrap();
    parts.headers.remove(http::header::HOST);
    let resp = match client.request(Request::from_parts(parts, body)).await {
        Ok(resp) => resp,
        Err(e) => panic!("relay: the simulator refused a request: {e}"),
    };
    let (parts, inner) = resp.into_parts();
    Ok(Response::from_parts(
        parts,
        Recording {
            inner,
            id,
            len: 0,
            hasher: Default::default(),
            ledger,
        },
    ))
}

// ---------------------------------------------------------------------------
// The traffic
// ---------------------------------------------------------------------------

/// What one client call does, and so how speedtap must settle it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Kind {
    /// A streamed call on any protocol, to its end: `ok`.
    Stream,
    /// A non-streamed call: `ok`.
    Whole,
    /// `x-sim-status: 503`: `upstream_error`, the 503 passed on.
    Status503,
    /// `x-sim-error-after`: an in-protocol error event: `upstream_error`.
    ErrorEvent,
    /// `x-sim-cut-after`: the upstream cuts the connection mid-body:
    /// `abandoned`.
    UpstreamCut,
    /// The client hangs up after the first body frame: `abandoned`.
    AbortMidStream,
    /// The client hangs up after the response head, while the first token
    /// is still awaited: `abandoned`.
    AbortInWait,
    /// A non-streamed call whose client hangs up before the response head
    /// (which comes with the whole body): `abandoned`.
    AbortBeforeHead,
    /// The `dead` route, whose upstream is a closed port: 502,
    /// `upstream_error`.
    Unreachable,
    /// `GET /v1/models` or `/health`: passed through, `unmetered`.
    Unmetered,
}

impl Kind {
    /// Percent weights; they add up to 100.
    const MIX: [(Kind, u64); 10] = [
        (Kind::Stream, 58),
        (Kind::Whole, 10),
        (Kind::Status503, 5),
        (Kind::ErrorEvent, 5),
        (Kind::UpstreamCut, 5),
        (Kind::AbortMidStream, 5),
        (Kind::AbortInWait, 2),
        (Kind::AbortBeforeHead, 2),
        (Kind::Unreachable, 3),
        (Kind::Unmetered, 5),
    ];

    fn pick(rng: &mut Lcg) -> Kind {
        let mut roll = rng.next() % 100;
        for (kind, weight) in Kind::MIX {
            if roll < weight {
                return kind;
            }
            roll -= weight;
        }
        Kind::Stream
    }

    /// `(route, status)` speedtap must settle this call with.
    fn expected(self) -> (&'static str, &'static str) {
        match self {
            Kind::Stream | Kind::Whole => ("sim", "ok"),
            Kind::Status503 | Kind::ErrorEvent => ("sim", "upstream_error"),
            Kind::UpstreamCut
            | Kind::AbortMidStream
            | Kind::AbortInWait
            | Kind::AbortBeforeHead => ("sim", "abandoned"),
            Kind::Unreachable => ("dead", "upstream_error"),
            Kind::Unmetered => ("sim", "unmetered"),
        }
    }

    /// Whether the client reads the whole body, so it can be compared.
    fn compared(self) -> bool {
        !matches!(
            self,
            Kind::AbortMidStream | Kind::AbortInWait | Kind::AbortBeforeHead | Kind::Unreachable
        )
    }
}

/// One generation protocol: path and a request body.
#[derive(Clone, Copy)]
struct Protocol {
    path: &'static str,
    stream_path: Option<&'static str>,
    body: fn(&str, bool) -> Value,
}

const PROTOCOLS: [Protocol; 8] = [
    Protocol {
        path: "/v1/chat/completions",
        stream_path: None,
        body: |m, s| {
            json!({"model": m, "stream": s, "stream_options": {"include_usage": s},
                   "messages": [{"role": "user", "content": "Tell me about rivers."}]})
        },
    },
    Protocol {
        path: "/v1/completions",
        stream_path: None,
        body: |m, s| json!({"model": m, "stream": s, "prompt": "Once upon a time"}),
    },
    Protocol {
        path: "/v1/responses",
        stream_path: None,
        body: |m, s| json!({"model": m, "stream": s, "input": "Summarise the news."}),
    },
    Protocol {
        path: "/v1/messages",
        stream_path: None,
        body: |m, s| {
            json!({"model": m, "stream": s, "max_tokens": 512,
                   "messages": [{"role": "user", "content": "Write a haiku."}]})
        },
    },
    Protocol {
        path: "/api/chat",
        stream_path: None,
        body: |m, s| {
            json!({"model": m, "stream": s,
                   "messages": [{"role": "user", "content": "Why is the sky blue?"}]})
        },
    },
    Protocol {
        path: "/api/generate",
        stream_path: None,
        body: |m, s| json!({"model": m, "stream": s, "prompt": "List three fruits."}),
    },
    Protocol {
        path: "/completion",
        stream_path: None,
        body: |_, s| json!({"stream": s, "prompt": "The capital of France is", "n_predict": 256}),
    },
    Protocol {
        path: "/generate",
        stream_path: Some("/generate_stream"),
        body: |_, _| json!({"inputs": "What is Rust?", "parameters": {"max_new_tokens": 256}}),
    },
];

/// What one client call came to.
#[derive(Default)]
struct Tally {
    /// Calls made, by kind.
    made: HashMap<Kind, u64>,
    /// Bodies that matched the relay's bytes.
    identical: u64,
    /// Failures: anything speedtap did that it should not have.
    failed: u64,
    /// The first few failures, described.
    failures: Vec<String>,
}

type Shared = Arc<Mutex<Tally>>;

struct ClientCtx {
    http: Client<HttpConnector, Full<Bytes>>,
    sim: SocketAddr,
    dead: SocketAddr,
    ledger: Ledger,
    arrived: Arrivals,
    tally: Shared,
    deadline: tokio::time::Instant,
    made: Arc<AtomicU64>,
}

async fn client_loop(ctx: Arc<ClientCtx>, index: u64) {
    let mut rng = Lcg(0x5eed_0000 + index * 7919);
    let mut seq = 0u64;
    while tokio::time::Instant::now() < ctx.deadline {
        seq += 1;
        let id = (index << 32) | seq;
        let kind = Kind::pick(&mut rng);
        // Bounded, so a call speedtap never finishes fails the soak instead
        // of hanging it.
        let outcome = tokio::time::timeout(CALL_TIMEOUT, one_call(&ctx, &mut rng, kind, id))
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {CALL_TIMEOUT:?}")));
        ctx.made.fetch_add(1, Ordering::Relaxed);
        {
            let mut tally = ctx.tally.lock().unwrap();
            *tally.made.entry(kind).or_default() += 1;
            match outcome {
                Ok(true) => tally.identical += 1,
                Ok(false) => {}
                Err(e) => {
                    tally.failed += 1;
                    if tally.failures.len() < 50 {
                        tally.failures.push(format!("{kind:?} #{id:x}: {e}"));
                    }
                }
            }
        }
        // Think time, so 50 clients look like people and agents rather
        // than a benchmark, and the shared 2-core machine is not saturated.
        let think = rng.range(50, 600);
        tokio::time::sleep(Duration::from_millis(think)).await;
    }
}

/// Makes one call of `kind`. `Ok(true)` when its body was compared and
/// matched, `Ok(false)` when not compared, `Err` on anything speedtap
/// should not have done.
async fn one_call(ctx: &ClientCtx, rng: &mut Lcg, kind: Kind, id: u64) -> Result<bool, String> {
    let proto = PROTOCOLS[rng.range(0, PROTOCOLS.len() as u64 - 1) as usize];
    let model = MODELS[rng.range(0, 2) as usize];
    let streamed = !matches!(kind, Kind::Whole | Kind::AbortBeforeHead);
    let path = match (streamed, proto.stream_path) {
        (true, Some(p)) => p,
        _ => proto.path,
    };
    let target = if kind == Kind::Unreachable {
        ctx.dead
    } else {
        ctx.sim
    };
    let mut req = Request::builder()
        .header("x-soak-id", id.to_string())
        .header("content-type", "application/json")
        .header("user-agent", "speedtap-soak/1");
    let body = if kind == Kind::Unmetered {
        let p = if rng.chance(50) {
            "/v1/models"
        } else {
            "/health"
        };
        req = req.method("GET").uri(format!("http://{target}{p}"));
        Bytes::new()
    } else {
        req = req.method("POST").uri(format!("http://{target}{path}"));
        Bytes::from((proto.body)(model, streamed).to_string())
    };
    let (mut ttft, mut tps, mut tokens) =
        (rng.range(0, 800), rng.range(20, 300), rng.range(5, 150));
    if matches!(
        kind,
        Kind::AbortMidStream | Kind::AbortInWait | Kind::AbortBeforeHead
    ) {
        // 10 s long: the hang-up is surely before the end. (Each x-sim-*
        // header is sent once: the simulator reads the first of repeats.)
        (ttft, tps, tokens) = (600, 40, 400);
    }
    req = req
        .header("x-sim-ttft-ms", ttft.to_string())
        .header("x-sim-tps", tps.to_string())
        .header("x-sim-tokens", tokens.to_string())
        .header("x-sim-usage", rng.chance(50).to_string())
        .header("x-sim-server-timings", rng.chance(30).to_string());
    if rng.chance(30) {
        req = req.header("x-sim-reasoning", rng.range(5, 40).to_string());
    }
    match kind {
        Kind::Status503 => req = req.header("x-sim-status", "503"),
        Kind::AbortBeforeHead => req = req.header("x-soak-report-arrival", "1"),
        Kind::ErrorEvent => {
            req = req.header("x-sim-error-after", rng.range(1, tokens - 1).to_string())
        }
        Kind::UpstreamCut => {
            req = req.header("x-sim-cut-after", rng.range(1, tokens - 1).to_string())
        }
        _ => {}
    }
    let req = req.body(Full::new(body)).unwrap();

    if kind == Kind::AbortBeforeHead {
        // Hang up once the request is known to have reached the upstream
        // (so speedtap has a call to settle), long before the head, which
        // comes with the whole body 10 s later.
        let pending = ctx.http.request(req);
        tokio::pin!(pending);
        let until = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            tokio::select! {
                r = &mut pending => {
                    return Err(format!("a head arrived before the scripted end: {r:?}"));
                }
                _ = tokio::time::sleep(Duration::from_millis(5)) => {
                    if ctx.arrived.lock().unwrap().remove(&id) {
                        return Ok(false);
                    }
                    if tokio::time::Instant::now() > until {
                        return Err("the request never reached the upstream".into());
                    }
                }
            }
        }
    }
    let resp = ctx
        .http
        .request(req)
        .await
        .map_err(|e| format!("request failed: {e:?}"))?;
    let status = resp.status();
    let expected_status = match kind {
        Kind::Status503 => StatusCode::SERVICE_UNAVAILABLE,
        Kind::Unreachable => StatusCode::BAD_GATEWAY,
        Kind::ErrorEvent if !streamed => StatusCode::INTERNAL_SERVER_ERROR,
        _ => StatusCode::OK,
    };
    if status != expected_status {
        return Err(format!("status {status}, expected {expected_status}"));
    }
    let mut body = resp.into_body();
    if kind == Kind::AbortInWait {
        // Dropped with the head only: the first token is 600 ms away.
        return Ok(false);
    }
    if kind == Kind::AbortMidStream {
        return match body.frame().await {
            Some(Ok(_)) => Ok(false), // dropped here: the client hangs up
            other => Err(format!("no first frame before hanging up: {other:?}")),
        };
    }
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    let mut len = 0u64;
    let mut cut = false;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => {
                if let Some(data) = frame.data_ref() {
                    len += data.len() as u64;
                    hasher.write(data);
                }
            }
            Err(e) => {
                if kind != Kind::UpstreamCut {
                    return Err(format!("body failed after {len} bytes: {e:?}"));
                }
                cut = true;
                break;
            }
        }
    }
    if kind == Kind::UpstreamCut && !cut {
        return Err(format!("a cut stream arrived whole ({len} bytes)"));
    }
    if !kind.compared() {
        return Ok(false);
    }
    let got = Sent {
        len,
        hash: hasher.finish(),
    };
    // The relay files its record when its body ends, which can be a moment
    // after the last byte reached us; wait for it, bounded.
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(sent) = ctx.ledger.lock().unwrap().remove(&id) {
            return if sent == got {
                Ok(true)
            } else {
                Err(format!(
                    "body differs: upstream sent {sent:?}, client got {got:?}"
                ))
            };
        }
        if Instant::now() > until {
            return Err("the relay never saw this call".into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

// ---------------------------------------------------------------------------
// The child process and its samples
// ---------------------------------------------------------------------------

struct Speedtap {
    child: Child,
    sim_route: SocketAddr,
    dead_route: SocketAddr,
    api: SocketAddr,
    stderr_tail: Arc<Mutex<Vec<String>>>,
    stdout_bytes: Arc<AtomicU64>,
}

impl Drop for Speedtap {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn spawn_speedtap(dir: &Path, relay: SocketAddr, dead: SocketAddr) -> Speedtap {
    let db = dir.join("data").join("speedtap.sqlite3");
    let mut child = Command::new(BIN)
        .args(["run", "--json", "--api", "127.0.0.1:0", "--db"])
        .arg(&db)
        .arg("--route")
        .arg(format!("sim=127.0.0.1:0=http://{relay}"))
        .arg("--route")
        .arg(format!("dead=127.0.0.1:0=http://{dead}"))
        .env("XDG_CONFIG_HOME", dir.join("config"))
        .env("XDG_DATA_HOME", dir.join("data"))
        .env("HOME", dir)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("speedtap starts");

    // stdout carries one JSON line per snapshot: drained and counted.
    let stdout_bytes = Arc::new(AtomicU64::new(0));
    let mut out = child.stdout.take().unwrap();
    let counter = stdout_bytes.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 64 * 1024];
        while let Ok(n) = out.read(&mut buf) {
            if n == 0 {
                break;
            }
            counter.fetch_add(n as u64, Ordering::Relaxed);
        }
    });

    let (tx, rx) = mpsc::channel::<String>();
    let tail = Arc::new(Mutex::new(Vec::new()));
    let tail2 = tail.clone();
    let err = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines() {
            let Ok(line) = line else { break };
            {
                let mut t = tail2.lock().unwrap();
                if t.len() >= 200 {
                    t.remove(0);
                }
                t.push(line.clone());
            }
            let _ = tx.send(line);
        }
    });

    let (mut sim_route, mut dead_route, mut api) = (None, None, None);
    let deadline = Instant::now() + STARTUP;
    while sim_route.is_none() || dead_route.is_none() || api.is_none() {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = rx
            .recv_timeout(left)
            .unwrap_or_else(|e| panic!("speedtap did not announce its addresses ({e}): {tail:?}"));
        if let Some(a) = addr_after(&line, "speedtap: route sim: http://") {
            sim_route = Some(a);
        } else if let Some(a) = addr_after(&line, "speedtap: route dead: http://") {
            dead_route = Some(a);
        } else if let Some(a) = addr_after(&line, "speedtap: dashboard and control API on http://")
        {
            api = Some(a);
        }
    }
    Speedtap {
        child,
        sim_route: sim_route.unwrap(),
        dead_route: dead_route.unwrap(),
        api: api.unwrap(),
        stderr_tail: tail,
        stdout_bytes,
    }
}

fn addr_after(line: &str, prefix: &str) -> Option<SocketAddr> {
    let rest = &line[line.find(prefix)? + prefix.len()..];
    let end = rest
        .find(|c: char| c == '/' || c.is_whitespace())
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

#[derive(Clone, Copy, Debug)]
struct Sample {
    t_s: f64,
    rss_kb: u64,
    fds: u64,
    calls: u64,
    /// The store's file and its write-ahead log.
    db_kb: u64,
    /// The child's threads (a new thread can bring a new malloc arena,
    /// which shows as a step in RSS).
    threads: u64,
}

fn status_field(status: &str, field: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

fn db_kb(db: &Path) -> u64 {
    let wal = db.with_file_name("speedtap.sqlite3-wal");
    [db, wal.as_path()]
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.len() / 1024)
        .sum()
}

fn fd_count(pid: u32) -> Option<u64> {
    Some(std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64)
}

/// Samples the child every second until `stop`.
fn start_sampler(
    pid: u32,
    db: PathBuf,
    t0: Instant,
    made: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Vec<Sample>> {
    std::thread::spawn(move || {
        let mut samples = Vec::new();
        let mut next = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok();
            let field = |name| status.as_deref().and_then(|s| status_field(s, name));
            if let (Some(rss_kb), Some(threads), Some(fds)) =
                (field("VmRSS:"), field("Threads:"), fd_count(pid))
            {
                samples.push(Sample {
                    threads,
                    t_s: t0.elapsed().as_secs_f64(),
                    rss_kb,
                    fds,
                    calls: made.load(Ordering::Relaxed),
                    db_kb: db_kb(&db),
                });
            }
            next += Duration::from_secs(1);
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
        }
        samples
    })
}

/// Least-squares slope of `y` over `t` (seconds), per minute, and its
/// standard error.
fn slope_per_min(points: &[(f64, f64)]) -> (f64, f64) {
    let n = points.len() as f64;
    if points.len() < 3 {
        return (0.0, f64::INFINITY);
    }
    let mt = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let stt: f64 = points.iter().map(|p| (p.0 - mt).powi(2)).sum();
    let sty: f64 = points.iter().map(|p| (p.0 - mt) * (p.1 - my)).sum();
    let b = sty / stt;
    let a = my - b * mt;
    let sse: f64 = points.iter().map(|p| (p.1 - a - b * p.0).powi(2)).sum();
    let se = (sse / (n - 2.0) / stt).sqrt();
    (b * 60.0, se * 60.0)
}

fn write_csv(path: &Path, samples: &[Sample], warmup_end: f64, traffic_end: f64) {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).unwrap();
    }
    let mut text = String::from("t_s,rss_kb,fds,calls_made,db_kb,threads,phase\n");
    for s in samples {
        let phase = if s.t_s < warmup_end {
            "warmup"
        } else if s.t_s <= traffic_end {
            "measure"
        } else {
            "drain"
        };
        text.push_str(&format!(
            "{:.1},{},{},{},{},{},{phase}\n",
            s.t_s, s.rss_kb, s.fds, s.calls, s.db_kb, s.threads
        ));
    }
    std::fs::write(path, text).unwrap();
}

// ---------------------------------------------------------------------------
// The control API
// ---------------------------------------------------------------------------

async fn api_get(http: &Client<HttpConnector, Full<Bytes>>, api: SocketAddr, path: &str) -> String {
    let req = Request::get(format!("http://{api}{path}"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = http.request(req).await.expect("the control API answers");
    assert_eq!(resp.status(), StatusCode::OK, "{path}");
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(body.to_vec()).unwrap()
}

/// `speedtap_calls_total` by `(route, status)`.
fn calls_total(metrics: &str) -> HashMap<(String, String), u64> {
    let mut out = HashMap::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("speedtap_calls_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.split_once("} ") else {
            continue;
        };
        let label = |name: &str| {
            labels.split(',').find_map(|kv| {
                let (k, v) = kv.split_once('=')?;
                (k == name).then(|| v.trim_matches('"').to_string())
            })
        };
        let (Some(route), Some(status)) = (label("route"), label("status")) else {
            continue;
        };
        let v: f64 = value.trim().parse().unwrap();
        // A bound route has a series for every status from the start; the
        // ones still at zero say nothing was counted there.
        if v == 0.0 {
            continue;
        }
        *out.entry((route, status)).or_default() += v as u64;
    }
    out
}

// ---------------------------------------------------------------------------
// The soak
// ---------------------------------------------------------------------------

#[test]
#[ignore = "minutes long: run through scripts/soak (SPEEDTAP_SOAK_SECS sets the length)"]
fn soak() {
    let settings = Settings::from_env();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("soak");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run_soak(settings, dir));
}

async fn run_soak(settings: Settings, dir: PathBuf) {
    let sim = SimServer::start("127.0.0.1:0", SimConfig::default())
        .await
        .unwrap();
    let ledger: Ledger = Arc::default();
    let arrived: Arrivals = Arc::default();
    let relay = start_relay(sim.local_addr(), ledger.clone(), arrived.clone()).await;
    // A port nothing listens on: bound to learn a free one, then closed.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();

    let child = spawn_speedtap(&dir, relay, dead);
    let pid = child.child.id();
    let http: Client<HttpConnector, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(5))
        .build_http();

    let t0 = Instant::now();
    let made = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let db = dir.join("data").join("speedtap.sqlite3");
    let sampler = start_sampler(pid, db, t0, made.clone(), stop.clone());

    let tally: Shared = Arc::default();
    let ctx = Arc::new(ClientCtx {
        http: http.clone(),
        sim: child.sim_route,
        dead: child.dead_route,
        ledger: ledger.clone(),
        arrived,
        tally: tally.clone(),
        deadline: tokio::time::Instant::now() + settings.traffic,
        made: made.clone(),
    });
    let clients: Vec<_> = (0..settings.clients as u64)
        .map(|i| tokio::spawn(client_loop(ctx.clone(), i)))
        .collect();
    for c in clients {
        c.await.expect("a client task panicked");
    }
    let traffic_end = t0.elapsed().as_secs_f64();

    // Settling: every call made is counted in speedtap_calls_total, and
    // nothing is active any more.
    let expected: HashMap<(String, String), u64> = {
        let tally = tally.lock().unwrap();
        let mut e = HashMap::new();
        for (kind, n) in &tally.made {
            let (route, status) = kind.expected();
            *e.entry((route.to_string(), status.to_string()))
                .or_default() += n;
        }
        e
    };
    let total_made: u64 = expected.values().sum();
    let settle_start = Instant::now();
    let counted = loop {
        let counted = calls_total(&api_get(&http, child.api, "/metrics").await);
        let sum: u64 = counted.values().sum();
        if sum >= total_made || settle_start.elapsed() > SETTLE {
            break counted;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let settle_s = settle_start.elapsed().as_secs_f64();
    // `/api/v1/stats` is what the engine last published: every second
    // while calls are active, every 10 s when idle; so its `active` drops
    // to 0 at the first idle publish after the last call settled.
    let stats: Value = loop {
        let stats: Value =
            serde_json::from_str(&api_get(&http, child.api, "/api/v1/stats").await).unwrap();
        if stats["active"] == 0 || settle_start.elapsed() > SETTLE {
            break stats;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let recent: Value = serde_json::from_str(
        &api_get(&http, child.api, "/api/v1/calls?limit=10000&unmetered=1").await,
    )
    .unwrap();
    let in_flight = recent["calls"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["status"] == "in_flight")
        .count();

    stop.store(true, Ordering::Relaxed);
    let samples = sampler.join().unwrap();
    let peak_rss_kb = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| status_field(&s, "VmHWM:"))
        .unwrap_or(0);
    let warmup_end = traffic_end * WARMUP_SHARE;
    let between = |from: f64| -> Vec<&Sample> {
        samples
            .iter()
            .filter(|s| s.t_s >= from && s.t_s <= traffic_end)
            .collect()
    };
    // RSS: fitted once the bounded caches are full (see WARMUP_CALLS) when
    // the run got there with enough samples left, else over everything
    // after the 20% warm-up against the coarse bound.
    let caches_full = samples
        .iter()
        .find(|s| s.calls >= WARMUP_CALLS)
        .map(|s| s.t_s.max(warmup_end));
    let steady = caches_full.map(&between).unwrap_or_default();
    let (rss_from, rss_limit, rss_basis) = if steady.len() >= MIN_STEADY_SAMPLES {
        (
            caches_full.unwrap(),
            MAX_RSS_KB_PER_MIN,
            "caches full (after 20% and 6,000 calls)",
        )
    } else {
        (
            warmup_end,
            MAX_RSS_KB_PER_MIN_IN_WARMUP,
            "run too short to fill the caches: coarse bound",
        )
    };
    write_csv(&settings.csv, &samples, rss_from, traffic_end);
    let rss_points: Vec<(f64, f64)> = between(rss_from)
        .iter()
        .map(|s| (s.t_s, s.rss_kb as f64))
        .collect();
    let (rss_slope, rss_se) = slope_per_min(&rss_points);
    let fd_points: Vec<(f64, f64)> = between(warmup_end)
        .iter()
        .map(|s| (s.t_s, s.fds as f64))
        .collect();
    let (fd_slope, fd_se) = slope_per_min(&fd_points);
    let peak_fds = samples.iter().map(|s| s.fds).max().unwrap_or(0);
    let first_rss = rss_points.first().map_or(0.0, |p| p.1);
    let last_rss = rss_points.last().map_or(0.0, |p| p.1);
    let db_kb_end = samples.last().map_or(0, |s| s.db_kb);

    let tally = tally.lock().unwrap();
    let mut kinds: Vec<_> = tally.made.iter().collect();
    kinds.sort();
    println!();
    println!(
        "soak: {} clients, {:.0} s of traffic ({:.0} s warm-up), settled {:.1} s later",
        settings.clients, traffic_end, warmup_end, settle_s
    );
    println!("| kind | calls | speedtap must settle as |");
    println!("|---|---:|---|");
    for (kind, n) in &kinds {
        let (route, status) = kind.expected();
        println!("| {kind:?} | {n} | {route}/{status} |");
    }
    println!("| **all** | {total_made} | |");
    println!();
    println!("| figure | value | limit |");
    println!("|---|---:|---|");
    println!(
        "| calls settled (speedtap_calls_total) | {} | = {total_made} made |",
        counted.values().sum::<u64>()
    );
    println!("| calls still in flight | {in_flight} | 0 |");
    println!(
        "| bodies byte-identical to the upstream's | {} | every compared call |",
        tally.identical
    );
    println!("| proxy errors | {} | 0 |", tally.failed);
    println!(
        "| RSS slope from {rss_from:.0} s ({rss_basis}) | {rss_slope:.0} ± {rss_se:.0} KB/min | < {rss_limit} |"
    );
    println!("| fd slope after warm-up | {fd_slope:.2} ± {fd_se:.2} /min | < {MAX_FDS_PER_MIN} |");
    println!("| RSS from {rss_from:.0} s → end of traffic | {first_rss} → {last_rss} KB | |");
    println!("| store size at the end (db + WAL) | {db_kb_end} KB | |");
    println!("| peak RSS (VmHWM) | {peak_rss_kb} KB | |");
    println!("| peak open fds | {peak_fds} | |");
    if let (Some(first), Some(last)) = (samples.first(), samples.last()) {
        println!(
            "| open fds: before traffic → after settling | {} → {} | |",
            first.fds, last.fds
        );
        println!(
            "| RSS: before traffic → after settling | {} → {} KB | |",
            first.rss_kb, last.rss_kb
        );
        let peak_threads = samples.iter().map(|s| s.threads).max().unwrap_or(0);
        println!(
            "| threads: before traffic → peak → after settling | {} → {peak_threads} → {} | |",
            first.threads, last.threads
        );
    }
    println!(
        "| stdout written (JSON lines) | {} KB | |",
        child.stdout_bytes.load(Ordering::Relaxed) / 1024
    );
    println!(
        "| samples | {} → {} | |",
        samples.len(),
        settings.csv.display()
    );

    // Every problem at once, so one run tells everything that went wrong.
    let mut problems: Vec<String> = Vec::new();
    if tally.failed > 0 {
        problems.push(format!(
            "{} proxy errors, first ones: {:#?}",
            tally.failed, tally.failures
        ));
    }
    if tally.identical == 0 {
        problems.push("no body was compared".into());
    }
    let mut mismatched: Vec<String> = expected
        .keys()
        .chain(counted.keys())
        .filter(|k| expected.get(*k) != counted.get(*k))
        .map(|k| {
            format!(
                "{}/{}: made {}, settled {}",
                k.0,
                k.1,
                expected.get(k).copied().unwrap_or(0),
                counted.get(k).copied().unwrap_or(0)
            )
        })
        .collect();
    mismatched.sort();
    mismatched.dedup();
    if !mismatched.is_empty() {
        problems.push(format!(
            "settled counts differ from the calls made: {mismatched:#?}"
        ));
    }
    if in_flight != 0 {
        problems.push(format!("{in_flight} calls still in flight"));
    }
    if stats["active"] != 0 {
        problems.push(format!("stats still show active calls: {stats}"));
    }
    if rss_slope >= rss_limit {
        problems.push(format!(
            "RSS grows {rss_slope:.0} KB/min from {rss_from:.0} s (limit {rss_limit}: {rss_basis})"
        ));
    }
    if fd_slope >= MAX_FDS_PER_MIN {
        problems.push(format!(
            "fds grow {fd_slope:.2}/min after warm-up (limit {MAX_FDS_PER_MIN})"
        ));
    }
    let tail = child.stderr_tail.lock().unwrap().clone();
    assert!(
        problems.is_empty(),
        "{}\nspeedtap stderr tail: {tail:#?}",
        problems.join("\n")
    );
    drop(sim);
}
