//! The in-process upstream every arm streams from: an OpenAI-chat SSE
//! server that stamps each chunk with its send time.
//!
//! Adapted from `benches/proxy_latency.rs`, with two changes that LiteLLM
//! forces and every arm gets, for fairness:
//! - The stamp travels inside the token text (`delta.content`), because
//!   LiteLLM re-serialises every chunk and drops unknown fields such as
//!   proxy_latency's `t_ns`. The content of a chunk is a space and the
//!   send time in microseconds since [`EPOCH`], zero-padded to ten digits
//!   (`" 0001234567"`). A fixed width makes every chunk the same text shape
//!   (5 o200k tokens: the space and four digit groups), and the leading
//!   space makes the pieces split the same way whether a tokenizer sees
//!   one chunk or the whole text, so "tokens sent" is well defined.
//! - The stream's shape travels in the model name
//!   (`bench-c<chunks>-i<interval µs>-<tag>`), because LiteLLM doesn't
//!   forward a client's custom headers upstream but does pass the model
//!   through (`openai/*`). The tag also lets the harness find one level's
//!   calls in speedtap's history (`?model=`).
//!
//! Chunks are stamped at the moment hyper polls the body for writing, so
//! the stamp is as close to the socket write as this process can get.
//! Every finished stream's full content is kept per model name, so the
//! harness can count, after the measurement, the o200k tokens the upstream
//! really sent and check speedtap's counts against them.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::time::{Interval, MissedTickBehavior};

/// The clock origin shared by send stamps and arrival times (one process,
/// one monotonic clock).
static EPOCH: OnceLock<Instant> = OnceLock::new();

/// Nanoseconds since [`EPOCH`].
pub fn now_ns() -> u64 {
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// What one stream is asked to be: its chunk count and pacing, and a tag
/// naming the measurement it belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shape {
    pub chunks: usize,
    pub interval: Duration,
    pub tag: String,
}

impl Shape {
    /// The model name that carries this shape through every proxy.
    pub fn model(&self) -> String {
        format!(
            "bench-c{}-i{}-{}",
            self.chunks,
            self.interval.as_micros(),
            self.tag
        )
    }

    /// Parses [`Shape::model`]'s output.
    pub fn from_model(model: &str) -> Option<Shape> {
        let rest = model.strip_prefix("bench-c")?;
        let (chunks, rest) = rest.split_once("-i")?;
        let (interval, tag) = rest.split_once('-')?;
        Some(Shape {
            chunks: chunks.parse().ok()?,
            interval: Duration::from_micros(interval.parse().ok()?),
            tag: tag.to_owned(),
        })
    }
}

/// The content of every finished stream, by model name.
#[derive(Clone, Default)]
pub struct Sent(Arc<Mutex<HashMap<String, Vec<String>>>>);

impl Sent {
    fn record(&self, model: &str, content: String) {
        self.0
            .lock()
            .expect("sent lock")
            .entry(model.to_owned())
            .or_default()
            .push(content);
    }

    /// Takes the contents recorded for `model`.
    pub fn take(&self, model: &str) -> Vec<String> {
        self.0
            .lock()
            .expect("sent lock")
            .remove(model)
            .unwrap_or_default()
    }
}

/// An OpenAI-chat SSE body: `remaining` stamped content chunks, the first
/// at once and then one per `interval` tick, then a finish chunk and
/// `[DONE]`. The first chunk does not wait on the timer because tokio
/// rounds a timer's deadline up to the next millisecond, which would add
/// up to 1 ms of noise to the time to first token.
struct ChunkBody {
    interval: Interval,
    remaining: usize,
    index: usize,
    done: bool,
    model: String,
    content: String,
    sent: Sent,
}

/// The content of one chunk: see the module docs.
pub fn stamp_text(us: u64) -> String {
    format!(" {:010}", us % 10_000_000_000)
}

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
            let content = std::mem::take(&mut this.content);
            this.sent.record(&this.model, content);
            let tail = format!(
                "data: {{\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":0,\"model\":\"{}\",\"choices\":[{{\"index\":0,\"delta\":{{}},\"finish_reason\":\"stop\"}}]}}\n\ndata: [DONE]\n\n",
                this.model
            );
            return Poll::Ready(Some(Ok(Frame::data(Bytes::from(tail)))));
        }
        if this.index > 0 && this.interval.poll_tick(cx).is_pending() {
            return Poll::Pending;
        }
        let role = if this.index == 0 {
            "\"role\":\"assistant\","
        } else {
            ""
        };
        let text = stamp_text(now_ns() / 1_000);
        let chunk = format!(
            "data: {{\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":0,\"model\":\"{}\",\"choices\":[{{\"index\":0,\"delta\":{{{role}\"content\":\"{text}\"}},\"finish_reason\":null}}]}}\n\n",
            this.model
        );
        this.content.push_str(&text);
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

/// Answers one request: the shape comes from the body's `model`.
async fn respond(req: Request<Incoming>, sent: Sent) -> Response<ChunkBody> {
    // Read the whole request first, like a real server.
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let model = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v.get("model")?.as_str().map(str::to_owned))
        .unwrap_or_default();
    let shape = Shape::from_model(&model).unwrap_or(Shape {
        chunks: 4,
        interval: Duration::from_millis(1),
        tag: "unknown".into(),
    });
    let period = shape.interval.max(Duration::from_micros(100));
    let mut interval = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    // A late tick shifts the rest instead of bursting to catch up.
    interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut resp = Response::new(ChunkBody {
        interval,
        remaining: shape.chunks,
        index: 0,
        done: false,
        content: String::with_capacity(shape.chunks * 11),
        model,
        sent,
    });
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/event-stream"),
    );
    resp
}

/// Starts the upstream on a free loopback port; it serves until the
/// process exits.
pub async fn start() -> (SocketAddr, Sent) {
    let sent = Sent::default();
    (start_with(&sent).await, sent)
}

/// Starts one more listener of the same upstream on another free port,
/// recording into `sent`: the capture arm's server, so that the capture
/// (which watches a port) sees only its own arm's streams.
pub async fn start_with(sent: &Sent) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind upstream");
    let addr = listener.local_addr().expect("upstream addr");
    let record = sent.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            let sent = record.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req| {
                    let sent = sent.clone();
                    async move { Ok::<_, Infallible>(respond(req, sent).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    addr
}
