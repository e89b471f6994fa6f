//! How much latency speedtap's tapping proxy adds to each streamed chunk,
//! compared with talking to the upstream directly.
//!
//! Everything runs in one process so one monotonic clock measures both
//! ends: an in-process upstream (hyper http1 on 127.0.0.1:0) streams an
//! OpenAI-chat SSE response and stamps every chunk, at the moment hyper
//! polls it for writing, with its send time as nanoseconds since a shared
//! [`Instant`] epoch (an extra `t_ns` field in the chunk JSON, which the
//! decoders ignore). A client (hyper http1 over a TCP_NODELAY socket, a
//! fresh connection per request) records arrival minus send for every
//! chunk, and the time from sending the request to the first body byte
//! (TTFB, here the first chunk; the TCP connect is not included).
//!
//! Two arms, interleaved in rounds so that noise on this shared machine
//! hits both, and the arm order flips every round:
//! - `direct`: client to upstream;
//! - `proxy`: client to an in-process speedtap engine (one route,
//!   `metering_threads: 1`, the default o200k estimator) to upstream.
//!
//! Two workloads: one stream at 500 chunks/s for 2 s, and 32 concurrent
//! streams at 40 chunks/s for 2 s. The concurrent streams start together
//! and so tick in step, as the slots of a batching server do.
//!
//! "Added" figures are differences of percentiles (proxy p50 minus direct
//! p50, and so on), not percentiles of paired differences: chunks of the
//! two arms are different chunks. Client, proxy and upstream share the
//! same 2-worker tokio runtime (and the machine's cores), so the absolute
//! numbers include scheduling on a loaded box; the difference is what the
//! proxy costs on top.
//!
//! Every proxied call must be settled by the engine with status `ok`; the
//! run prints `metered: N/N ok` and exits non-zero otherwise. Under
//! `cargo test --benches` (no `--bench` argument) a short smoke run is done
//! instead of the full one.

// The 80-line limit is for product code; a bench may read as one long script.
#![allow(clippy::too_many_lines)]
#![allow(clippy::unwrap_used)] // a test (or bench) may unwrap: a panic is its failure report

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use memchr::memmem;
use speedtap::host::{Engine, EngineOptions};
use speedtap::model::RouteSpec;
use speedtap::model::{CallStatus, CallsQuery, EngineQueries};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio::time::{Interval, MissedTickBehavior};

/// The shared clock origin for send stamps and arrival times.
static EPOCH: OnceLock<Instant> = OnceLock::new();

fn now_ns() -> u64 {
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// The route name the proxied calls are filed under.
const ROUTE: &str = "bench";

/// One load shape.
#[derive(Clone, Copy)]
struct Workload {
    label: &'static str,
    streams: usize,
    chunks_per_s: u32,
    duration: Duration,
}

impl Workload {
    fn chunks(&self) -> usize {
        (self.chunks_per_s as f64 * self.duration.as_secs_f64()).round() as usize
    }

    fn interval(&self) -> Duration {
        Duration::from_secs(1) / self.chunks_per_s
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Arm {
    Direct,
    Proxy,
}

/// What one arm collected on one workload, over all rounds.
#[derive(Default)]
struct Samples {
    /// Per chunk, arrival minus send, ns.
    chunk_ns: Vec<u64>,
    /// Per request, request sent to first body byte, ns.
    ttfb_ns: Vec<u64>,
    /// Requests that did not return 200 or every chunk.
    bad: usize,
}

// ---------------------------------------------------------------- upstream

/// An OpenAI-chat SSE body: `remaining` content chunks, the first at once
/// and then one per `interval` tick, each stamped when hyper polls it,
/// then a finish chunk and `[DONE]`. The first chunk does not wait on the
/// timer because tokio rounds a timer's deadline up to the next
/// millisecond, which would add up to 1 ms of noise to TTFB.
struct ChunkBody {
    interval: Interval,
    remaining: usize,
    index: usize,
    done: bool,
}

const WORDS: &[&str] = &[
    " the", " quick", " brown", " fox", " jumps", " over", " a", " dog",
];

impl Body for ChunkBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        if this.remaining == 0 {
            this.done = true;
            return Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(
                b"data: {\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":0,\"model\":\"bench\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n",
            )))));
        }
        if this.index > 0 && this.interval.poll_tick(cx).is_pending() {
            return Poll::Pending;
        }
        let word = WORDS[this.index % WORDS.len()];
        let role = if this.index == 0 {
            "\"role\":\"assistant\","
        } else {
            ""
        };
        let chunk = format!(
            "data: {{\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":0,\"model\":\"bench\",\"choices\":[{{\"index\":0,\"delta\":{{{role}\"content\":\"{word}\"}},\"finish_reason\":null}}],\"t_ns\":{}}}\n\n",
            now_ns()
        );
        this.index += 1;
        this.remaining -= 1;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from(chunk)))))
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

fn header_u64(req: &Request<Incoming>, name: &str) -> Option<u64> {
    req.headers().get(name)?.to_str().ok()?.parse().ok()
}

/// The upstream answers every request with a [`ChunkBody`] shaped by the
/// `x-chunks` and `x-interval-us` request headers.
async fn upstream_respond(req: Request<Incoming>) -> Response<ChunkBody> {
    let chunks = header_u64(&req, "x-chunks").unwrap_or(10) as usize;
    let interval_us = header_u64(&req, "x-interval-us").unwrap_or(10_000);
    // Read the whole request first, like a real server.
    let _ = req.into_body().collect().await;
    let period = Duration::from_micros(interval_us);
    let mut interval = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    // A late tick shifts the rest instead of bursting to catch up.
    interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut resp = Response::new(ChunkBody {
        interval,
        remaining: chunks,
        index: 0,
        done: false,
    });
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/event-stream"),
    );
    resp
}

async fn start_upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind upstream");
    let addr = listener.local_addr().expect("upstream addr");
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            tokio::spawn(async move {
                let svc =
                    service_fn(
                        |req| async move { Ok::<_, Infallible>(upstream_respond(req).await) },
                    );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    addr
}

// ------------------------------------------------------------------ client

/// What one request measured.
struct Outcome {
    chunk_ns: Vec<u64>,
    ttfb_ns: Option<u64>,
    complete: bool,
}

/// The `t_ns` stamp of one SSE event, if it carries one.
fn stamp_of(event: &[u8]) -> Option<u64> {
    const KEY: &[u8] = b"\"t_ns\":";
    let at = memmem::find(event, KEY)? + KEY.len();
    let digits = event[at..]
        .iter()
        .take_while(|b| b.is_ascii_digit())
        .count();
    std::str::from_utf8(&event[at..at + digits])
        .ok()?
        .parse()
        .ok()
}

/// Streams one chat completion from `addr`, timing every chunk.
async fn run_request(addr: SocketAddr, w: Workload) -> Outcome {
    let failed = Outcome {
        chunk_ns: Vec::new(),
        ttfb_ns: None,
        complete: false,
    };
    let Ok(stream) = TcpStream::connect(addr).await else {
        return failed;
    };
    let _ = stream.set_nodelay(true);
    let Ok((mut sender, conn)) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await
    else {
        return failed;
    };
    tokio::spawn(conn);
    let req = Request::post("/v1/chat/completions")
        .header("host", addr.to_string())
        .header("content-type", "application/json")
        .header("x-chunks", w.chunks().to_string())
        .header("x-interval-us", w.interval().as_micros().to_string())
        .body(Full::new(Bytes::from_static(
            br#"{"model":"bench","stream":true,"messages":[{"role":"user","content":"count"}]}"#,
        )))
        .expect("request");
    let sent = now_ns();
    let Ok(resp) = sender.send_request(req).await else {
        return failed;
    };
    let ok_status = resp.status() == http::StatusCode::OK;
    let mut body = resp.into_body();
    let mut buf: Vec<u8> = Vec::new();
    let mut chunk_ns = Vec::with_capacity(w.chunks());
    let mut ttfb_ns = None;
    let mut done = false;
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else { break };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let arrived = now_ns();
        ttfb_ns.get_or_insert(arrived.saturating_sub(sent));
        buf.extend_from_slice(&data);
        // A read may hold several events, or end inside one.
        let mut start = 0;
        while let Some(end) = memmem::find(&buf[start..], b"\n\n") {
            let event = &buf[start..start + end];
            if let Some(stamp) = stamp_of(event) {
                chunk_ns.push(arrived.saturating_sub(stamp));
            } else if memmem::find(event, b"[DONE]").is_some() {
                done = true;
            }
            start += end + 2;
        }
        buf.drain(..start);
    }
    let complete = ok_status && done && chunk_ns.len() == w.chunks();
    Outcome {
        chunk_ns,
        ttfb_ns,
        complete,
    }
}

/// Runs one workload against `addr`: all its streams at once.
async fn run_workload(addr: SocketAddr, w: Workload, into: &mut Samples) {
    let mut set = JoinSet::new();
    for _ in 0..w.streams {
        set.spawn(run_request(addr, w));
    }
    while let Some(joined) = set.join_next().await {
        match joined {
            Ok(o) => {
                if !o.complete {
                    into.bad += 1;
                }
                into.chunk_ns.extend(o.chunk_ns);
                into.ttfb_ns.extend(o.ttfb_ns);
            }
            Err(_) => into.bad += 1,
        }
    }
}

// ----------------------------------------------------------------- figures

/// Nearest-rank percentile of sorted values, in µs.
fn pct_us(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1] as f64 / 1_000.0
}

struct Figures {
    chunks: usize,
    p50: f64,
    p99: f64,
    ttfb_p50: f64,
    bad: usize,
}

fn figures(s: &mut Samples) -> Figures {
    s.chunk_ns.sort_unstable();
    s.ttfb_ns.sort_unstable();
    Figures {
        chunks: s.chunk_ns.len(),
        p50: pct_us(&s.chunk_ns, 50.0),
        p99: pct_us(&s.chunk_ns, 99.0),
        ttfb_p50: pct_us(&s.ttfb_ns, 50.0),
        bad: s.bad,
    }
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let _ = now_ns(); // fix the epoch
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let ok = runtime.block_on(bench(full));
    if !ok {
        std::process::exit(1);
    }
}

async fn bench(full: bool) -> bool {
    let scale = if full { 1.0 } else { 0.1 };
    let rounds = if full { 5 } else { 1 };
    let workloads = [
        Workload {
            label: "1 x 500/s",
            streams: 1,
            chunks_per_s: 500,
            duration: Duration::from_secs(2).mul_f64(scale),
        },
        Workload {
            label: "32 x 40/s",
            streams: 32,
            chunks_per_s: 40,
            duration: Duration::from_secs(2).mul_f64(scale),
        },
    ];

    let upstream = start_upstream().await;
    let route =
        RouteSpec::new(ROUTE, "127.0.0.1:0", &format!("http://{upstream}")).expect("route spec");
    let mut options = EngineOptions::new(vec![route]);
    options.metering_threads = 1;
    let engine = Engine::start(options).await.expect("engine start");
    let proxy = engine.routes[0].listen;
    let mut proxied = 0usize;

    // Warm-up, not recorded: pooled upstream connections, the estimator's
    // tables, allocator and caches.
    let warm = Workload {
        label: "warm-up",
        streams: 32,
        chunks_per_s: 200,
        duration: Duration::from_millis(250),
    };
    for arm in [Arm::Direct, Arm::Proxy] {
        let addr = if arm == Arm::Proxy { proxy } else { upstream };
        run_workload(addr, warm, &mut Samples::default()).await;
    }
    proxied += warm.streams;

    let started = Instant::now();
    let mut samples: Vec<[Samples; 2]> = workloads.iter().map(|_| Default::default()).collect();
    for round in 0..rounds {
        for (wi, w) in workloads.iter().enumerate() {
            let order = if round % 2 == 0 {
                [Arm::Direct, Arm::Proxy]
            } else {
                [Arm::Proxy, Arm::Direct]
            };
            for arm in order {
                let (addr, slot) = match arm {
                    Arm::Direct => (upstream, 0),
                    Arm::Proxy => (proxy, 1),
                };
                run_workload(addr, *w, &mut samples[wi][slot]).await;
                if arm == Arm::Proxy {
                    proxied += w.streams;
                }
            }
        }
    }
    let elapsed = started.elapsed();

    // Wait (up to 10 s) for the engine to settle every proxied call.
    let deadline = Instant::now() + Duration::from_secs(10);
    let calls = loop {
        let calls = engine
            .handle
            .calls(CallsQuery {
                limit: 10_000,
                route: Some(ROUTE.into()),
                unmetered: true,
            })
            .await;
        let settled = calls.iter().filter(|c| c.status.is_settled()).count();
        if settled >= proxied || Instant::now() >= deadline {
            break calls;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let metered_ok = calls.iter().filter(|c| c.status == CallStatus::Ok).count();
    engine.shutdown(Duration::from_secs(1)).await;

    // The machine is shared: say how loaded it was.
    let load = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .map(|l| format!(", load avg {l}"))
        .unwrap_or_default();
    println!(
        "proxy_latency: {rounds} round(s), arms interleaved, {:.1} s measured{load}{}",
        elapsed.as_secs_f64(),
        if full {
            ""
        } else {
            " (smoke run: pass --bench for the full one)"
        }
    );
    println!(
        "{:<22} {:<7} {:>7} {:>10} {:>10} {:>12}",
        "workload", "arm", "chunks", "p50 us", "p99 us", "TTFB p50 us"
    );
    let mut all_complete = true;
    for (w, [direct, proxy]) in workloads.iter().zip(samples.iter_mut()) {
        let d = figures(direct);
        let p = figures(proxy);
        let label = format!("{} {:.1}s", w.label, w.duration.as_secs_f64());
        for (arm, f) in [("direct", &d), ("proxy", &p)] {
            println!(
                "{:<22} {:<7} {:>7} {:>10.1} {:>10.1} {:>12.1}{}",
                label,
                arm,
                f.chunks,
                f.p50,
                f.p99,
                f.ttfb_p50,
                if f.bad > 0 {
                    format!("  ({} incomplete)", f.bad)
                } else {
                    String::new()
                }
            );
            all_complete &= f.bad == 0;
        }
        println!(
            "{:<22} {:<7} {:>7} {:>+10.1} {:>+10.1} {:>+12.1}",
            label,
            "added",
            "",
            p.p50 - d.p50,
            p.p99 - d.p99,
            p.ttfb_p50 - d.ttfb_p50
        );
    }
    println!("metered: {metered_ok}/{proxied} ok");
    all_complete && metered_ok == proxied && calls.len() == proxied
}
