//! Test support for the proxy: a scripted upstream that serves exact bytes
//! at scripted times over a real socket, a client that records what it
//! receives, and an in-process engine.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use speedtap::host::{Engine, EngineOptions, RunningEngine};
use speedtap::model::RouteSpec;
use speedtap::model::{Call, CallsQuery, EngineEvent, EngineQueries};
use speedtap::tokens::O200kEstimator;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// What the scripted upstream does when its body ends.
#[derive(Clone, Debug, PartialEq)]
pub enum Ending {
    /// A clean end of the body.
    Clean,
    /// Reset the connection (the client sees a cut body).
    Cut,
}

/// One scripted response.
#[derive(Clone, Debug)]
pub struct Script {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    /// (offset from request arrival, bytes), in order.
    pub frames: Vec<(Duration, Bytes)>,
    pub ending: Ending,
    /// Delay before the response head is sent.
    pub head_delay: Duration,
}

impl Script {
    pub fn sse(frames: Vec<(Duration, Bytes)>) -> Script {
        Script {
            status: 200,
            headers: vec![("content-type".into(), "text/event-stream".into())],
            frames,
            ending: Ending::Clean,
            head_delay: Duration::ZERO,
        }
    }

    pub fn with_content_type(mut self, ct: &str) -> Script {
        self.headers.retain(|(n, _)| n != "content-type");
        self.headers.push(("content-type".into(), ct.into()));
        self
    }

    pub fn body(&self) -> Vec<u8> {
        self.frames.iter().flat_map(|(_, b)| b.to_vec()).collect()
    }
}

/// What the upstream saw.
#[derive(Default)]
pub struct Seen {
    pub requests: Vec<(String, String, HashMap<String, String>)>,
    /// Streams whose client (the proxy) went away before the end.
    pub cancelled: u64,
}

/// A scripted upstream on 127.0.0.1:0: `path -> Script`.
pub struct ScriptedUpstream {
    pub addr: SocketAddr,
    pub seen: Arc<Mutex<Seen>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ScriptedUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ScriptedUpstream {
    pub async fn start(scripts: HashMap<String, Script>) -> ScriptedUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let scripts = Arc::new(scripts);
        let seen = Arc::new(Mutex::new(Seen::default()));
        let seen2 = seen.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let scripts = scripts.clone();
                let seen = seen2.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req: Request<Incoming>| {
                        let scripts = scripts.clone();
                        let seen = seen.clone();
                        async move { Ok::<_, Infallible>(respond(req, &scripts, seen).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        ScriptedUpstream { addr, seen, task }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

type UpBody = http_body_util::combinators::BoxBody<Bytes, std::io::Error>;

async fn respond(
    req: Request<Incoming>,
    scripts: &HashMap<String, Script>,
    seen: Arc<Mutex<Seen>>,
) -> Response<UpBody> {
    let arrived = Instant::now();
    // A test may pick the script by name instead of by path.
    let path = match req.headers().get("x-script") {
        Some(name) => name.to_str().unwrap_or("").to_owned(),
        None => req.uri().path().to_owned(),
    };
    let headers = req
        .headers()
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_owned()))
        .collect();
    let method = req.method().to_string();
    // Read the whole request body first, like a real server.
    let _ = req.into_body().collect().await;
    seen.lock()
        .unwrap()
        .requests
        .push((method, path.clone(), headers));
    let Some(script) = scripts.get(&path).cloned() else {
        let mut r = Response::new(
            Full::new(Bytes::from_static(b"{\"error\":\"no script\"}"))
                .map_err(|n| match n {})
                .boxed(),
        );
        *r.status_mut() = StatusCode::NOT_FOUND;
        return r;
    };
    tokio::time::sleep_until(arrived + script.head_delay).await;
    let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(4);
    tokio::spawn(async move {
        for (at, bytes) in script.frames {
            tokio::time::sleep_until(arrived + at).await;
            if tx.send(Ok(Frame::data(bytes))).await.is_err() {
                seen.lock().unwrap().cancelled += 1;
                return;
            }
        }
        if script.ending == Ending::Cut {
            let _ = tx
                .send(Err(std::io::Error::new(
                    std::io::ErrorKind::ConnectionReset,
                    "scripted cut",
                )))
                .await;
        }
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    let mut resp = Response::new(StreamBody::new(stream).boxed());
    *resp.status_mut() = StatusCode::from_u16(script.status).unwrap();
    for (k, v) in &script.headers {
        resp.headers_mut().insert(
            http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            v.parse().unwrap(),
        );
    }
    resp
}

/// What a client received: every frame with its arrival time.
pub struct Received {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub frames: Vec<(Instant, Bytes)>,
    pub error: Option<String>,
    pub sent_at: Instant,
}

impl Received {
    pub fn body(&self) -> Vec<u8> {
        self.frames.iter().flat_map(|(_, b)| b.to_vec()).collect()
    }
}

/// Sends one request and records the response frame by frame.
pub async fn send(addr: SocketAddr, method: &str, path: &str, body: &str) -> Received {
    send_with(addr, method, path, Bytes::from(body.to_owned()), &[]).await
}

/// [`send`] with a raw body and extra request headers.
pub async fn send_with(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Bytes,
    extra_headers: &[(&str, &str)],
) -> Received {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.set_nodelay(true).unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string())
        .header("content-type", "application/json")
        .header("authorization", "Bearer sk-secret-token");
    for (name, value) in extra_headers {
        req = req.header(*name, *value);
    }
    let req = req.body(Full::new(body)).unwrap();
    let sent_at = Instant::now();
    let resp = sender.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let mut body = resp.into_body();
    let mut frames = Vec::new();
    let mut error = None;
    loop {
        match body.frame().await {
            Some(Ok(f)) => {
                if let Ok(data) = f.into_data() {
                    frames.push((Instant::now(), data));
                }
            }
            Some(Err(e)) => {
                error = Some(e.to_string());
                break;
            }
            None => break,
        }
    }
    Received {
        status,
        headers,
        frames,
        error,
        sent_at,
    }
}

/// An engine with one route `t` to `upstream`.
pub async fn engine_for(upstream: &str) -> RunningEngine {
    engine_with(upstream, |_| {}).await
}

pub async fn engine_with(upstream: &str, tweak: impl FnOnce(&mut EngineOptions)) -> RunningEngine {
    let route = RouteSpec::new("t", "127.0.0.1:0", upstream).unwrap();
    let mut options = EngineOptions::new(vec![route]);
    options.estimator = Arc::new(O200kEstimator);
    tweak(&mut options);
    Engine::start(options).await.unwrap()
}

/// Waits (up to 10 s) until `n` calls have settled; returns all calls,
/// newest first, unmetered ones included.
pub async fn settled_calls(engine: &RunningEngine, n: usize) -> Vec<Call> {
    let all = CallsQuery {
        limit: 10_000,
        route: None,
        unmetered: true,
    };
    calls_when(engine, all, |calls| {
        calls.iter().filter(|c| c.status.is_settled()).count() >= n
    })
    .await
}

/// Waits (up to 10 s) until the calls `query` selects satisfy `done`, and
/// returns them. Subscribes first, then re-reads the calls after each
/// `Settled` event, so no settle can slip between the check and the wait.
pub async fn calls_when(
    engine: &RunningEngine,
    query: CallsQuery,
    done: impl Fn(&[Call]) -> bool,
) -> Vec<Call> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut events = engine.handle.subscribe().await;
    loop {
        let calls = engine.handle.calls(query.clone()).await;
        if done(&calls) {
            return calls;
        }
        loop {
            match tokio::time::timeout_at(deadline, events.recv()).await {
                Ok(Some(EngineEvent::Settled(_))) => break,
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => panic!("calls did not settle as awaited: {calls:#?}"),
            }
        }
    }
}

/// Collects engine events until `pred` says stop or 10 s pass.
pub async fn events_until(
    rx: &mut mpsc::Receiver<EngineEvent>,
    mut pred: impl FnMut(&EngineEvent) -> bool,
) -> Vec<EngineEvent> {
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while let Ok(Some(e)) = tokio::time::timeout_at(deadline, rx.recv()).await {
        let stop = pred(&e);
        out.push(e);
        if stop {
            break;
        }
    }
    out
}

/// SSE frames of an OpenAI chat stream: `n` one-word tokens, the first at
/// `ttft`, then one every `gap`, then usage and [DONE] with the last.
pub fn openai_chat_script(n: usize, ttft: Duration, gap: Duration, usage: Option<u64>) -> Script {
    let mut frames = Vec::new();
    for i in 0..n {
        let mut s = String::new();
        if i == 0 {
            s.push_str("data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":null}}]}\n\n");
        }
        s.push_str(
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\" the\"},\"finish_reason\":null}]}\n\n",
        );
        if i == n - 1 {
            s.push_str(
                "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
            );
            if let Some(u) = usage {
                s.push_str(&format!(
                    "data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":5,\"completion_tokens\":{u},\"total_tokens\":{}}}}}\n\n",
                    u + 5
                ));
            }
            s.push_str("data: [DONE]\n\n");
        }
        frames.push((ttft + gap * i as u32, Bytes::from(s)));
    }
    Script::sse(frames)
}
