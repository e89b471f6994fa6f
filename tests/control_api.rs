//! The control API over a real socket, against a fake engine: status codes,
//! content types and JSON shapes of the contract (`docs/api.md`,
//! "The control API"), the host guard, the absence of CORS, the event stream and
//! shutdown; and the stored history (`/api/v1/history`, `/models`,
//! `/export`), which the fake answers from a real in-memory store.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::header::{HeaderMap, CONTENT_TYPE, HOST};
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};

use speedtap::engine::metrics::Metrics;
use speedtap::model::ApiKind;
use speedtap::model::Stats;
use speedtap::model::{
    Call, CallIdentity, CallStatus, CallsQuery, EngineEvent, EngineQueries, SpeedEvent,
};
use speedtap::model::{CallDetails, TtftBreakdown};
use speedtap::model::{ExportFormat, HistoryFilter, ModelSummary, QueryError};
use speedtap::model::{Phase, Snapshot, TokenSource};
use speedtap::store::{parse_export, Store};

// ---------------------------------------------------------------- the fake

/// A fixed engine: two calls, one stats value, real metrics with one
/// recorded call; it records every calls query and hands each new
/// subscription's sender to the test. Its history is a real in-memory
/// store holding [`stored_calls`]; it records every history, models and
/// export query (with the endpoint's name) too.
#[derive(Clone)]
struct FakeEngine {
    calls: Arc<Vec<Call>>,
    stats: Stats,
    queries: Arc<Mutex<Vec<CallsQuery>>>,
    subscribers: mpsc::UnboundedSender<mpsc::Sender<EngineEvent>>,
    metrics: Arc<Metrics>,
    store: Arc<Mutex<Store>>,
    history_queries: Arc<Mutex<Vec<(&'static str, HistoryFilter)>>>,
}

impl FakeEngine {
    fn record(&self, endpoint: &'static str, filter: &HistoryFilter) {
        self.history_queries
            .lock()
            .unwrap()
            .push((endpoint, filter.clone()));
    }
}

impl EngineQueries for FakeEngine {
    async fn calls(&self, query: CallsQuery) -> Vec<Call> {
        self.queries.lock().unwrap().push(query.clone());
        self.calls
            .iter()
            .filter(|c| match &query.route {
                Some(r) => *r == c.identity.route,
                None => true,
            })
            .take(query.limit)
            .cloned()
            .collect()
    }

    async fn call(&self, id: String) -> Option<Call> {
        self.calls.iter().find(|c| c.identity.id == id).cloned()
    }

    async fn stats(&self) -> Stats {
        self.stats.clone()
    }

    async fn subscribe(&self) -> mpsc::Receiver<EngineEvent> {
        let (tx, rx) = mpsc::channel(16);
        self.subscribers.send(tx).unwrap();
        rx
    }

    fn metrics_text(&self) -> String {
        self.metrics.render()
    }

    async fn history(&self, filter: HistoryFilter) -> Result<Vec<Call>, QueryError> {
        self.record("history", &filter);
        let store = self.store.lock().unwrap();
        store
            .history(&filter)
            .map_err(|e| QueryError::Io(e.to_string()))
    }

    async fn models(&self, filter: HistoryFilter) -> Result<Vec<ModelSummary>, QueryError> {
        self.record("models", &filter);
        let store = self.store.lock().unwrap();
        store
            .models(&filter)
            .map_err(|e| QueryError::Io(e.to_string()))
    }

    async fn export(
        &self,
        filter: HistoryFilter,
        format: ExportFormat,
    ) -> Result<Vec<u8>, QueryError> {
        self.record("export", &filter);
        let store = self.store.lock().unwrap();
        let mut out = Vec::new();
        speedtap::store::export(&store, &filter, format, &mut out)
            .map_err(|e| QueryError::Io(e.to_string()))?;
        Ok(out)
    }
}

/// An engine without a store (`--no-db`): only the required queries, so
/// history, models and export are the trait's defaults.
#[derive(Clone)]
struct NoStoreEngine;

impl EngineQueries for NoStoreEngine {
    async fn calls(&self, _query: CallsQuery) -> Vec<Call> {
        Vec::new()
    }

    async fn call(&self, _id: String) -> Option<Call> {
        None
    }

    async fn stats(&self) -> Stats {
        stats()
    }

    async fn subscribe(&self) -> mpsc::Receiver<EngineEvent> {
        mpsc::channel(1).1
    }

    fn metrics_text(&self) -> String {
        String::new()
    }
}

fn identity(id: &str, route: &str) -> CallIdentity {
    CallIdentity {
        id: id.into(),
        route: route.into(),
        api: ApiKind::OpenaiChat,
        model: Some("qwen3:8b".into()),
        started_at: "2026-11-30T10:42:07.123Z".into(),
        demo: false,
    }
}

/// The contract's example call.
fn settled_call() -> Call {
    Call {
        identity: identity("c-000042", "ollama"),
        status: CallStatus::Ok,
        http_status: Some(200),
        speed: Some(Snapshot {
            stalled_ms: None,
            phase: Phase::Complete,
            is_final: true,
            elapsed_ms: 5120,
            time_to_first_token_ms: Some(312),
            output_tokens: 201,
            output_tokens_per_second: Some(41.7),
            token_source: TokenSource::Server,
            wait: None,
        }),
        input_tokens: Some(37),
        details: Default::default(),
    }
}

fn live_snapshot() -> Snapshot {
    Snapshot {
        stalled_ms: None,
        phase: Phase::Reasoning,
        is_final: false,
        elapsed_ms: 800,
        time_to_first_token_ms: Some(250),
        output_tokens: 12,
        output_tokens_per_second: None,
        token_source: TokenSource::Estimated,
        wait: None,
    }
}

fn in_flight_call() -> Call {
    Call {
        identity: identity("c-000043", "llamacpp"),
        status: CallStatus::InFlight,
        http_status: Some(200),
        speed: Some(live_snapshot()),
        input_tokens: None,
        details: Default::default(),
    }
}

/// The store's calls, oldest first, an hour apart from 10:42:07.123Z: the
/// contract's example with every detail set, a one-burst call on another
/// route and model, and an unmetered call that named no model.
fn stored_calls() -> Vec<Call> {
    let mut first = settled_call();
    first.details = CallDetails {
        client: Some("openai-python".into()),
        ttft_breakdown: Some(TtftBreakdown {
            load_ms: Some(120.5),
            prefill_ms: Some(150.0),
            prefill_tokens: Some(37),
            cached_tokens: Some(0),
            prefill_tokens_per_second: Some(246.7),
            other_ms: Some(41.5),
        }),
        one_burst: false,
        unstreamed_reasoning: true,
        settled_at: Some("2026-11-30T10:42:12.243Z".into()),
        ..CallDetails::default()
    };
    let mut second = settled_call();
    second.identity = CallIdentity {
        id: "c-000043".into(),
        route: "llamacpp".into(),
        api: ApiKind::OpenaiChat,
        model: Some("gemma3".into()),
        started_at: "2026-11-30T11:42:07.123Z".into(),
        demo: false,
    };
    let speed = second.speed.as_mut().unwrap();
    speed.time_to_first_token_ms = Some(900);
    speed.output_tokens_per_second = None;
    second.details = CallDetails {
        client: Some("curl".into()),
        one_burst: true,
        ..CallDetails::default()
    };
    let third = Call {
        identity: CallIdentity {
            id: "c-000044".into(),
            route: "llamacpp".into(),
            api: ApiKind::Unknown,
            model: None,
            started_at: "2026-11-30T12:42:07.123Z".into(),
            demo: false,
        },
        status: CallStatus::Unmetered,
        http_status: Some(200),
        speed: None,
        input_tokens: None,
        details: CallDetails::default(),
    };
    vec![first, second, third]
}

fn stats() -> Stats {
    Stats {
        tps: Some(47.3),
        tps_available: true,
        estimated: false,
        high: Some(52.1),
        low: Some(31.4),
        active: 1,
        aggregate_tps: Some(47.3),
        dropped_subscribers: 2,
        capture_dropped_packets: 0,
    }
}

struct Server {
    addr: std::net::SocketAddr,
    queries: Arc<Mutex<Vec<CallsQuery>>>,
    history_queries: Arc<Mutex<Vec<(&'static str, HistoryFilter)>>>,
    subscribers: mpsc::UnboundedReceiver<mpsc::Sender<EngineEvent>>,
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

async fn start() -> Server {
    let metrics = Arc::new(Metrics::new());
    metrics.record_settled(&settled_call());
    metrics.set_active_calls(1);
    let (sub_tx, sub_rx) = mpsc::unbounded_channel();
    let mut store = Store::open_in_memory().unwrap();
    store.insert_calls(&stored_calls()).unwrap();
    let engine = FakeEngine {
        calls: Arc::new(vec![in_flight_call(), settled_call()]),
        stats: stats(),
        queries: Arc::default(),
        subscribers: sub_tx,
        metrics,
        store: Arc::new(Mutex::new(store)),
        history_queries: Arc::default(),
    };
    let queries = engine.queries.clone();
    let history_queries = engine.history_queries.clone();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(speedtap::api::serve(listener, engine, async move {
        let _ = stopped.await;
    }));
    Server {
        addr,
        queries,
        history_queries,
        subscribers: sub_rx,
        stop,
        task,
    }
}

// ---------------------------------------------------------------- client

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", String::from_utf8_lossy(&self.body)))
    }

    fn content_type(&self) -> &str {
        self.headers
            .get(CONTENT_TYPE)
            .map(|v| v.to_str().unwrap())
            .unwrap_or("")
    }

    fn assert_json_error(&self, status: StatusCode, message: &str) {
        assert_eq!(self.status, status);
        assert_eq!(self.content_type(), "application/json");
        assert_eq!(self.json(), serde_json::json!({ "error": message }));
    }
}

/// Sends one request on a fresh connection and returns the response head
/// with its still-streaming body. `host: None` sends no `Host` header.
async fn send(
    server: &Server,
    method: Method,
    path: &str,
    host: Option<&str>,
    extra: &[(&str, &str)],
) -> http::Response<Incoming> {
    let stream = TcpStream::connect(server.addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut req = Request::builder().method(method).uri(path);
    if let Some(host) = host {
        req = req.header(HOST, host);
    }
    for (name, value) in extra {
        req = req.header(*name, *value);
    }
    sender
        .send_request(req.body(Empty::<Bytes>::new()).unwrap())
        .await
        .unwrap()
}

async fn request(
    server: &Server,
    method: Method,
    path: &str,
    host: Option<&str>,
    extra: &[(&str, &str)],
) -> Answer {
    let response = send(server, method, path, host, extra).await;
    let (parts, body) = response.into_parts();
    let answer = Answer {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    };
    // Every answer: nosniff, and never any CORS permission.
    assert_eq!(
        answer.headers.get("x-content-type-options").unwrap(),
        "nosniff"
    );
    for name in answer.headers.keys() {
        assert!(
            !name.as_str().starts_with("access-control-"),
            "CORS header {name} on {path}"
        );
    }
    answer
}

async fn get(server: &Server, path: &str) -> Answer {
    request(server, Method::GET, path, Some("127.0.0.1:7878"), &[]).await
}

fn keys(v: &Value) -> Vec<&str> {
    let mut k: Vec<&str> = v.as_object().unwrap().keys().map(|k| k.as_str()).collect();
    k.sort_unstable();
    k
}

// ---------------------------------------------------------------- tests

#[tokio::test]
async fn calls_list_has_the_contract_shape_and_passes_filters_through() {
    let server = start().await;

    let a = get(&server, "/api/v1/calls").await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.content_type(), "application/json");
    let v = a.json();
    assert_eq!(keys(&v), ["calls"]);
    let calls: Vec<Call> = serde_json::from_value(v["calls"].clone()).unwrap();
    assert_eq!(calls, vec![in_flight_call(), settled_call()]);
    // Raw names, as scripts see them.
    let settled = &v["calls"][1];
    assert_eq!(
        keys(settled),
        [
            "api",
            "http_status",
            "id",
            "input_tokens",
            "model",
            "route",
            "seen_by",
            "speed",
            "started_at",
            "status"
        ]
    );
    assert_eq!(settled["status"], "ok");
    assert_eq!(settled["api"], "openai_chat");
    assert_eq!(
        keys(&settled["speed"]),
        [
            "elapsed_ms",
            "is_final",
            "output_tokens",
            "output_tokens_per_second",
            "phase",
            "time_to_first_token_ms",
            "token_source"
        ]
    );
    assert_eq!(v["calls"][0]["status"], "in_flight");
    assert!(v["calls"][0]["speed"]
        .get("output_tokens_per_second")
        .is_none());

    let a = get(&server, "/api/v1/calls?limit=1&route=llamacpp").await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.json()["calls"][0]["id"], "c-000043");
    let a = get(&server, "/api/v1/calls?limit=50000").await;
    assert_eq!(a.status, StatusCode::OK);
    let a = get(&server, "/api/v1/calls?unmetered=1").await;
    assert_eq!(a.status, StatusCode::OK);

    assert_eq!(
        *server.queries.lock().unwrap(),
        vec![
            CallsQuery {
                limit: 100,
                route: None,
                unmetered: false,
            },
            CallsQuery {
                limit: 1,
                route: Some("llamacpp".into()),
                unmetered: false,
            },
            CallsQuery {
                limit: 10_000,
                route: None,
                unmetered: false,
            },
            CallsQuery {
                limit: 100,
                route: None,
                unmetered: true,
            },
        ]
    );
}

#[tokio::test]
async fn a_bad_limit_is_a_json_400_and_never_reaches_the_engine() {
    let server = start().await;
    for q in ["limit=abc", "limit=-3"] {
        let a = get(&server, &format!("/api/v1/calls?{q}")).await;
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "{q}");
        assert_eq!(a.content_type(), "application/json");
        assert!(a.json()["error"].as_str().unwrap().contains("limit"));
    }
    assert!(server.queries.lock().unwrap().is_empty());
}

#[tokio::test]
async fn one_call_by_id_or_a_404() {
    let server = start().await;
    let a = get(&server, "/api/v1/calls/c-000042").await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.content_type(), "application/json");
    let call: Call = serde_json::from_slice(&a.body).unwrap();
    assert_eq!(call, settled_call());

    get(&server, "/api/v1/calls/c-000099")
        .await
        .assert_json_error(StatusCode::NOT_FOUND, "no call c-000099");
}

#[tokio::test]
async fn stats_have_the_contract_shape() {
    let server = start().await;
    let a = get(&server, "/api/v1/stats").await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.content_type(), "application/json");
    let v = a.json();
    assert_eq!(
        keys(&v),
        [
            "active",
            "aggregate_tps",
            "capture_dropped_packets",
            "dropped_subscribers",
            "estimated",
            "high",
            "low",
            "tps",
            "tps_available"
        ]
    );
    assert_eq!(v["dropped_subscribers"], 2);
    let parsed: Stats = serde_json::from_value(v).unwrap();
    assert_eq!(parsed, stats());
}

#[tokio::test]
async fn metrics_are_prometheus_text_with_otel_names_and_buckets() {
    let server = start().await;
    let a = get(&server, "/metrics").await;
    assert_eq!(a.status, StatusCode::OK);
    assert!(
        a.content_type().starts_with("text/plain; version=0.0.4"),
        "{}",
        a.content_type()
    );
    let text = String::from_utf8(a.body.to_vec()).unwrap();
    for family in [
        "gen_ai_server_time_to_first_token_seconds",
        "gen_ai_server_time_per_output_token_seconds",
        "gen_ai_server_request_duration_seconds",
        "gen_ai_client_token_usage",
        "speedtap_calls_total",
        "speedtap_output_tokens_total",
        "speedtap_active_calls",
    ] {
        assert!(
            text.contains(&format!("# TYPE {family} ")),
            "{family}:\n{text}"
        );
    }
    let les: Vec<String> = text
        .lines()
        .filter(|l| l.starts_with("gen_ai_server_time_to_first_token_seconds_bucket{"))
        .map(|l| {
            l.split("le=\"")
                .nth(1)
                .unwrap()
                .split('"')
                .next()
                .unwrap()
                .to_string()
        })
        .collect();
    // The OTel recommendation, as the text format spells the numbers.
    let expected = [
        "0.001", "0.005", "0.01", "0.02", "0.04", "0.06", "0.08", "0.1", "0.25", "0.5", "0.75",
        "1", "2.5", "5", "7.5", "10", "+Inf",
    ];
    assert_eq!(les, expected);
    assert!(text.contains("gen_ai_request_model=\"qwen3:8b\""));
    assert!(text.contains("speedtap_active_calls 1"));
}

#[tokio::test]
async fn the_dashboard_is_served_from_the_binary() {
    let server = start().await;
    for path in ["/", "/index.html"] {
        let a = get(&server, path).await;
        assert_eq!(a.status, StatusCode::OK, "{path}");
        assert_eq!(a.content_type(), "text/html; charset=utf-8");
        let html = String::from_utf8(a.body.to_vec()).unwrap();
        let title = html
            .split("<title>")
            .nth(1)
            .and_then(|t| t.split("</title>").next())
            .expect("a <title>");
        assert!(title.contains("speedtap"), "{title}");
    }
    let a = get(&server, "/app.js").await;
    assert_eq!(a.status, StatusCode::OK);
    assert!(a.content_type().starts_with("text/javascript"));
    assert!(String::from_utf8_lossy(&a.body).contains("/api/v1/events"));
}

#[tokio::test]
async fn unknown_paths_and_wrong_methods_are_json_errors() {
    let server = start().await;
    get(&server, "/api/v1/nope")
        .await
        .assert_json_error(StatusCode::NOT_FOUND, "not found");
    get(&server, "/ui/index.html")
        .await
        .assert_json_error(StatusCode::NOT_FOUND, "not found");
    let a = request(
        &server,
        Method::POST,
        "/api/v1/stats",
        Some("localhost"),
        &[],
    )
    .await;
    a.assert_json_error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed");
    assert_eq!(a.headers.get("allow").unwrap(), "GET, HEAD, OPTIONS");
    let a = request(
        &server,
        Method::DELETE,
        "/api/v1/calls/c-000042",
        Some("localhost"),
        &[],
    )
    .await;
    assert_eq!(a.status, StatusCode::METHOD_NOT_ALLOWED);
}

#[tokio::test]
async fn only_loopback_host_names_are_served() {
    let server = start().await;
    for host in [
        "localhost:7878",
        "127.0.0.1:7878",
        "[::1]:7878",
        "localhost",
        "dash.localhost:7878",
    ] {
        let a = request(&server, Method::GET, "/api/v1/stats", Some(host), &[]).await;
        assert_eq!(a.status, StatusCode::OK, "{host}");
    }
    for host in [
        "evil.example.com",
        "evil.example.com:7878",
        "192.168.1.2:7878",
        "localhost.evil.example.com",
    ] {
        for path in ["/api/v1/stats", "/", "/metrics", "/api/v1/events"] {
            request(&server, Method::GET, path, Some(host), &[])
                .await
                .assert_json_error(StatusCode::FORBIDDEN, "host not allowed");
        }
    }
    request(&server, Method::GET, "/api/v1/stats", None, &[])
        .await
        .assert_json_error(StatusCode::BAD_REQUEST, "missing host header");
}

/// RFC 9112 section 3.2 answers more than one `Host` line with
/// 400, loopback names or not.
#[tokio::test]
async fn a_request_with_two_host_headers_is_a_400() {
    let server = start().await;
    for second in ["127.0.0.1:7878", "evil.example.com"] {
        request(
            &server,
            Method::GET,
            "/api/v1/stats",
            Some("127.0.0.1:7878"),
            &[("host", second)],
        )
        .await
        .assert_json_error(StatusCode::BAD_REQUEST, "more than one host header");
    }
}

#[tokio::test]
async fn preflights_get_no_cors_permission() {
    let server = start().await;
    let cors = [
        ("origin", "http://evil.example.com"),
        ("access-control-request-method", "GET"),
        ("access-control-request-headers", "content-type"),
    ];
    // `request` asserts that no `access-control-*` header comes back.
    let a = request(
        &server,
        Method::OPTIONS,
        "/api/v1/calls",
        Some("localhost:7878"),
        &cors,
    )
    .await;
    assert_eq!(a.status, StatusCode::NO_CONTENT);
    assert_eq!(a.headers.get("allow").unwrap(), "GET, HEAD, OPTIONS");
    let a = request(
        &server,
        Method::GET,
        "/api/v1/calls",
        Some("localhost:7878"),
        &cors[..1],
    )
    .await;
    assert_eq!(a.status, StatusCode::OK);
}

/// Reads the event stream until `n` complete frames (blank-line terminated)
/// arrived, or until it ends.
async fn read_frames(body: &mut Incoming, buffer: &mut String, n: usize) -> Vec<String> {
    loop {
        let complete = buffer.matches("\n\n").count();
        if complete >= n {
            let mut frames = Vec::new();
            for _ in 0..n {
                let end = buffer.find("\n\n").unwrap() + 2;
                frames.push(buffer[..end].to_string());
                buffer.drain(..end);
            }
            return frames;
        }
        match body.frame().await {
            Some(frame) => {
                if let Ok(data) = frame.unwrap().into_data() {
                    buffer.push_str(std::str::from_utf8(&data).unwrap());
                }
            }
            None => panic!("stream ended with {buffer:?} pending"),
        }
    }
}

fn event(frame: &str) -> (&str, Value) {
    let mut lines = frame.trim_end_matches('\n').lines();
    let name = lines.next().unwrap().strip_prefix("event: ").unwrap();
    let data = lines.next().unwrap().strip_prefix("data: ").unwrap();
    assert!(lines.next().is_none(), "one data line: {frame:?}");
    (name, serde_json::from_str(data).unwrap())
}

#[tokio::test]
async fn events_stream_speed_and_stats_until_the_engine_drops_the_subscriber() {
    let mut server = start().await;
    let response = send(
        &server,
        Method::GET,
        "/api/v1/events",
        Some("localhost:7878"),
        &[],
    )
    .await;
    assert_eq!(response.status(), StatusCode::OK);
    let h = response.headers();
    assert_eq!(h.get(CONTENT_TYPE).unwrap(), "text/event-stream");
    assert_eq!(h.get("cache-control").unwrap(), "no-cache");
    assert_eq!(h.get("x-accel-buffering").unwrap(), "no");
    assert_eq!(h.get("x-content-type-options").unwrap(), "nosniff");
    assert!(h.get("access-control-allow-origin").is_none());
    let mut body = response.into_body();

    let events = server.subscribers.recv().await.expect("the API subscribed");
    events
        .send(EngineEvent::Speed {
            call: identity("c-000043", "llamacpp"),
            speed: live_snapshot(),
            seen_by: speedtap::model::SeenBy::Capture,
        })
        .await
        .unwrap();
    events.send(EngineEvent::Stats(stats())).await.unwrap();
    events
        .send(EngineEvent::Settled(settled_call()))
        .await
        .unwrap();

    let mut buffer = String::new();
    let frames = read_frames(&mut body, &mut buffer, 3).await;

    let (name, data) = event(&frames[0]);
    assert_eq!(name, "speed");
    assert_eq!(keys(&data), ["call", "seen_by", "speed"]);
    assert_eq!(data["seen_by"], "capture");
    assert_eq!(
        keys(&data["call"]),
        ["api", "id", "model", "route", "started_at"]
    );
    let speed: SpeedEvent = serde_json::from_value(data).unwrap();
    assert_eq!(speed.call, identity("c-000043", "llamacpp"));
    assert_eq!(speed.speed, live_snapshot());

    let (name, data) = event(&frames[1]);
    assert_eq!(name, "stats");
    assert_eq!(serde_json::from_value::<Stats>(data).unwrap(), stats());

    let (name, data) = event(&frames[2]);
    assert_eq!(name, "settled");
    assert_eq!(
        serde_json::from_value::<Call>(data).unwrap(),
        settled_call()
    );

    drop(events);
    assert!(
        body.frame().await.is_none(),
        "stream ends with the subscriber"
    );
    assert!(buffer.is_empty(), "{buffer:?}");
}

#[tokio::test]
async fn shutdown_ends_open_event_streams_and_returns() {
    let mut server = start().await;
    let response = send(
        &server,
        Method::GET,
        "/api/v1/events",
        Some("localhost"),
        &[],
    )
    .await;
    let mut body = response.into_body();
    let _events = server.subscribers.recv().await.unwrap();

    server.stop.send(()).unwrap();
    // The stream ends although the engine still holds the subscriber...
    while let Some(frame) = body.frame().await {
        assert!(frame.is_ok());
    }
    // ...and the server returns cleanly and stops accepting.
    server.task.await.unwrap().unwrap();
    assert!(TcpStream::connect(server.addr).await.is_err());
}

// ---------------------------------------------------------------- history

fn header<'a>(a: &'a Answer, name: &str) -> &'a str {
    a.headers
        .get(name)
        .map(|v| v.to_str().unwrap())
        .unwrap_or_else(|| panic!("no {name} header"))
}

fn recorded(server: &Server) -> Vec<(&'static str, HistoryFilter)> {
    server.history_queries.lock().unwrap().clone()
}

#[tokio::test]
async fn history_returns_stored_calls_newest_first_with_their_details() {
    let server = start().await;
    let a = get(&server, "/api/v1/history").await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.content_type(), "application/json");
    assert_eq!(header(&a, "cache-control"), "no-store");
    let v = a.json();
    assert_eq!(keys(&v), ["calls"]);
    let calls: Vec<Call> = serde_json::from_value(v["calls"].clone()).unwrap();
    let mut newest_first = stored_calls();
    newest_first.reverse();
    assert_eq!(calls, newest_first);
    // The details sit beside the contract's fields, under their own names;
    // unset flags are left out.
    let oldest = &v["calls"][2];
    assert_eq!(
        keys(oldest),
        [
            "api",
            "client",
            "http_status",
            "id",
            "input_tokens",
            "model",
            "route",
            "seen_by",
            "settled_at",
            "speed",
            "started_at",
            "status",
            "ttft_breakdown",
            "unstreamed_reasoning"
        ]
    );
    assert_eq!(oldest["ttft_breakdown"]["prefill_tokens_per_second"], 246.7);
    assert_eq!(v["calls"][1]["one_burst"], true);

    // Every filter reaches the engine, decoded; limit is clamped.
    let a = get(
        &server,
        "/api/v1/history?model=gemma3&route=llamacpp&client=curl\
         &since=2026-11-30T11%3A00%3A00Z&until=1796045000000&limit=1",
    )
    .await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.json()["calls"][0]["id"], "c-000043");
    // `model=` (empty): the calls that named none.
    let a = get(&server, "/api/v1/history?model=&limit=50000").await;
    let v = a.json();
    let ids: Vec<&str> = v["calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["c-000044"]);
    assert_eq!(
        recorded(&server),
        vec![
            (
                "history",
                HistoryFilter {
                    limit: Some(100),
                    ..HistoryFilter::default()
                }
            ),
            (
                "history",
                HistoryFilter {
                    model: Some("gemma3".into()),
                    route: Some("llamacpp".into()),
                    client: Some("curl".into()),
                    since_ms: Some(1_796_036_400_000),
                    until_ms: Some(1_796_045_000_000),
                    status: None,
                    limit: Some(1),
                }
            ),
            (
                "history",
                HistoryFilter {
                    model: Some(String::new()),
                    limit: Some(10_000),
                    ..HistoryFilter::default()
                }
            ),
        ]
    );
}

#[tokio::test]
async fn bad_history_parameters_are_json_400s_naming_them_and_never_reach_the_engine() {
    let server = start().await;
    for (path, name) in [
        ("/api/v1/history?since=yesterday", "since"),
        ("/api/v1/history?until=2026-13-45", "until"),
        ("/api/v1/history?limit=ten", "limit"),
        ("/api/v1/history?since=2000&until=1000", "since"),
        ("/api/v1/models?since=soon", "since"),
        ("/api/v1/export?format=xml", "format"),
        ("/api/v1/export?format=csv&until=later", "until"),
    ] {
        let a = get(&server, path).await;
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "{path}");
        assert_eq!(a.content_type(), "application/json", "{path}");
        let message = a.json()["error"].as_str().unwrap().to_owned();
        assert!(message.starts_with(name), "{path}: {message}");
    }
    assert!(recorded(&server).is_empty());
}

#[tokio::test]
async fn models_summarise_the_store_per_model_and_route() {
    let server = start().await;
    let a = get(&server, "/api/v1/models").await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.content_type(), "application/json");
    let v = a.json();
    assert_eq!(keys(&v), ["models"]);
    let models: Vec<ModelSummary> = serde_json::from_value(v["models"].clone()).unwrap();
    let groups: Vec<(&str, &str, u64)> = models
        .iter()
        .map(|m| (m.model.as_str(), m.route.as_str(), m.calls))
        .collect();
    assert_eq!(
        groups,
        [
            ("", "llamacpp", 1),
            ("gemma3", "llamacpp", 1),
            ("qwen3:8b", "ollama", 1)
        ]
    );
    let qwen = &v["models"][2];
    assert_eq!(qwen["ttft_ms_p50"], 312.0);
    assert_eq!(qwen["tps_p90"], 41.7);
    assert_eq!(qwen["tps_p10"], 41.7);
    // Its prompt was 37 tokens: too short for an honest prefill rate.
    assert_eq!(qwen["prefill_tps_p50"], serde_json::Value::Null);
    assert_eq!(qwen["last_seen"], "2026-11-30T10:42:07.123Z");

    // Filters pass through; `limit` means nothing here and is ignored.
    let a = get(&server, "/api/v1/models?route=llamacpp&client=curl&limit=x").await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.json()["models"].as_array().unwrap().len(), 1);
    assert_eq!(a.json()["models"][0]["model"], "gemma3");
    assert_eq!(
        recorded(&server)[1],
        (
            "models",
            HistoryFilter {
                route: Some("llamacpp".into()),
                client: Some("curl".into()),
                ..HistoryFilter::default()
            }
        )
    );
}

#[tokio::test]
async fn export_is_a_download_that_reads_back_to_the_stored_calls() {
    let server = start().await;
    for (query, format, content_type, file) in [
        (
            "",
            ExportFormat::Csv,
            "text/csv; charset=utf-8",
            "speedtap-calls.csv",
        ),
        (
            "?format=csv",
            ExportFormat::Csv,
            "text/csv; charset=utf-8",
            "speedtap-calls.csv",
        ),
        (
            "?format=jsonl",
            ExportFormat::Jsonl,
            "application/x-ndjson",
            "speedtap-calls.jsonl",
        ),
    ] {
        let a = get(&server, &format!("/api/v1/export{query}")).await;
        assert_eq!(a.status, StatusCode::OK, "{query}");
        assert_eq!(a.content_type(), content_type, "{query}");
        assert_eq!(
            header(&a, "content-disposition"),
            format!("attachment; filename=\"{file}\""),
            "{query}"
        );
        assert_eq!(header(&a, "cache-control"), "no-store");
        let back = parse_export(format, &mut a.body.as_ref()).unwrap();
        // Oldest first, every detail intact.
        assert_eq!(back, stored_calls(), "{query}");
    }

    // Filters apply; an export has no limit.
    let a = get(
        &server,
        "/api/v1/export?format=jsonl&route=llamacpp&limit=1",
    )
    .await;
    let back = parse_export(ExportFormat::Jsonl, &mut a.body.as_ref()).unwrap();
    assert_eq!(back, stored_calls()[1..]);
    assert_eq!(
        recorded(&server).last().unwrap(),
        &(
            "export",
            HistoryFilter {
                route: Some("llamacpp".into()),
                ..HistoryFilter::default()
            }
        )
    );

    // HEAD: the download's head without its body; other methods: 405.
    let a = request(
        &server,
        Method::HEAD,
        "/api/v1/export",
        Some("localhost"),
        &[],
    )
    .await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.content_type(), "text/csv; charset=utf-8");
    assert!(a.body.is_empty());
    let a = request(
        &server,
        Method::POST,
        "/api/v1/export",
        Some("localhost"),
        &[],
    )
    .await;
    a.assert_json_error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed");
}

#[tokio::test]
async fn without_a_store_history_models_and_export_are_json_503s() {
    for path in [
        "/api/v1/history",
        "/api/v1/models?route=x",
        "/api/v1/export?format=jsonl",
    ] {
        let req = Request::get(path)
            .header(HOST, "127.0.0.1:7878")
            .body(Empty::<Bytes>::new())
            .unwrap();
        let res = speedtap::api::handle(&NoStoreEngine, req).await;
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE, "{path}");
        assert_eq!(res.headers().get(CONTENT_TYPE).unwrap(), "application/json");
        assert!(res.headers().get("content-disposition").is_none());
        let body = res.into_body().collect().await.unwrap().to_bytes();
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(keys(&v), ["error"]);
        let message = v["error"].as_str().unwrap();
        assert!(message.starts_with("no store: "), "{path}: {message}");
        assert!(message.contains("--no-db"), "{path}: {message}");
    }
}
