//! The router: one request in, one response out. No sockets here, so every
//! rule (host guard, methods, paths, queries, headers) is testable directly.
//!
//! # The stored history
//! - `GET /api/v1/history?model=&route=&client=&since=&until=&limit=` ->
//!   `{"calls": [Call, ...]}`: settled calls from the store, newest first;
//!   `limit` defaults to 100 and is clamped to [`MAX_LIMIT`].
//! - `GET /api/v1/models?model=&route=&client=&since=&until=` ->
//!   `{"models": [ModelSummary, ...]}`: per (model, route) figures.
//! - `GET /api/v1/history/depth?model=M&route=&since=&until=` ->
//!   [`DepthDoc`](crate::model::DepthDoc): one model's decode rate against
//!   context depth, with its fitted line (`model` is required).
//! - `GET /api/v1/export?format=csv|jsonl&model=&route=&client=&since=&until=`
//!   -> the file `speedtap export` writes, as a download
//!   (`content-disposition: attachment; filename="speedtap-calls.csv"` or
//!   `.jsonl`); `format` defaults to `csv`, so a bare link downloads CSV.
//!
//! Filters (see [`history_filter`]): `since`/`until` are unix milliseconds
//! or RFC 3339 times, `[since, until)`; `model=` and `client=` given but
//! empty select the calls that named none (the `""` group of
//! `/api/v1/models`), while an empty `route=`, `since=` or `until=` means no
//! filter. A value that doesn't parse is a 400 naming the parameter, and
//! never reaches the engine. When the engine can't answer from a store (it
//! runs with `--no-db`, or the store failed), the answer is 503 with the
//! engine's message: the service exists but its data is unavailable here.

use std::convert::Infallible;

use bytes::Bytes;
use http::header::{HeaderValue, ALLOW, CACHE_CONTROL, CONTENT_DISPOSITION, CONTENT_TYPE};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use serde::Serialize;
use tokio::sync::watch;

use super::host_guard::{self, HostRejection};
use super::{dashboard, sse, BoxBody};
use crate::engine::metrics::CONTENT_TYPE as METRICS_CONTENT_TYPE;
use crate::model::SettingsDoc;
use crate::model::{time_bound, ExportFormat, HistoryFilter, ModelSummary, QueryError, MAX_LIMIT};
use crate::model::{Call, CallsQuery, EngineQueries};

const JSON: &str = "application/json";
const ALLOWED: &str = "GET, HEAD, OPTIONS";
const ALLOWED_SETTINGS: &str = "GET, HEAD, PUT, OPTIONS";
const ALLOWED_DEMO: &str = "POST, OPTIONS";

/// The largest request body accepted (settings documents are tiny).
pub const MAX_BODY: usize = 64 * 1024;

/// What the router knows beyond the request: the server's shutdown signal,
/// which ends open event streams.
#[derive(Clone, Debug, Default)]
pub struct Context {
    pub shutdown: Option<watch::Receiver<bool>>,
    /// The API listens on a non-loopback address (`--allow-remote`), so a
    /// Prometheus server on another host may scrape `/metrics` by this
    /// host's name or address. Only `/metrics` (read-only numbers, never
    /// call identities) is exempt from the Host check; everything else
    /// still answers loopback names only, against DNS rebinding.
    pub remote_metrics: bool,
}

/// The endpoints, once the path is understood.
#[derive(Debug, PartialEq, Eq)]
enum Endpoint<'a> {
    Calls,
    Call(&'a str),
    Stats,
    Events,
    Metrics,
    Routes,
    History,
    StoredCalls,
    Depth,
    Models,
    Export,
    Discover,
    Servers,
    IgnoreServer(&'a str),
    Capture,
    Settings,
    Demo,
    Asset(&'static dashboard::Asset),
}

impl Endpoint<'_> {
    /// The methods this endpoint answers (for 405s and preflights).
    fn allowed(&self) -> &'static str {
        match self {
            Endpoint::Settings => ALLOWED_SETTINGS,
            Endpoint::Demo | Endpoint::IgnoreServer(_) => ALLOWED_DEMO,
            _ => ALLOWED,
        }
    }

    fn accepts(&self, method: &Method) -> bool {
        match self {
            Endpoint::Settings => {
                matches!(*method, Method::GET | Method::HEAD | Method::PUT)
            }
            Endpoint::Demo | Endpoint::IgnoreServer(_) => *method == Method::POST,
            _ => matches!(*method, Method::GET | Method::HEAD),
        }
    }
}

fn endpoint(path: &str) -> Option<Endpoint<'_>> {
    match path {
        "/api/v1/calls" => Some(Endpoint::Calls),
        "/api/v1/stats" => Some(Endpoint::Stats),
        "/api/v1/events" => Some(Endpoint::Events),
        "/metrics" => Some(Endpoint::Metrics),
        "/api/v1/routes" => Some(Endpoint::Routes),
        "/api/v1/stats/history" => Some(Endpoint::History),
        "/api/v1/history" => Some(Endpoint::StoredCalls),
        "/api/v1/history/depth" => Some(Endpoint::Depth),
        "/api/v1/models" => Some(Endpoint::Models),
        "/api/v1/export" => Some(Endpoint::Export),
        "/api/v1/discover" => Some(Endpoint::Discover),
        "/api/v1/servers" => Some(Endpoint::Servers),
        "/api/v1/capture" => Some(Endpoint::Capture),
        "/api/v1/settings" => Some(Endpoint::Settings),
        "/api/v1/demo" => Some(Endpoint::Demo),
        _ => {
            if let Some(id) = path.strip_prefix("/api/v1/calls/") {
                return (!id.is_empty() && !id.contains('/')).then_some(Endpoint::Call(id));
            }
            if let Some(rest) = path.strip_prefix("/api/v1/servers/") {
                let name = rest.strip_suffix("/ignore")?;
                return (!name.is_empty() && !name.contains('/'))
                    .then_some(Endpoint::IgnoreServer(name));
            }
            dashboard::asset(path).map(Endpoint::Asset)
        }
    }
}

/// Routes one request. See the module docs of [`crate::api`] for the rules.
pub async fn route<E: EngineQueries, B>(
    engine: &E,
    req: Request<B>,
    ctx: &Context,
) -> Response<BoxBody>
where
    B: http_body::Body,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (parts, body) = req.into_parts();
    let req = Request::from_parts(parts, ());
    // Only writes carry a body; read it (bounded) once the host is known
    // to be allowed.
    let body =
        if matches!(*req.method(), Method::PUT | Method::POST) && host_guard::check(&req).is_ok() {
            match http_body_util::Limited::new(body, MAX_BODY).collect().await {
                Ok(collected) => Some(collected.to_bytes()),
                Err(_) => {
                    return error(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        "request body too large or unreadable",
                    )
                }
            }
        } else {
            None
        };
    let mut response = dispatch(engine, &req, body, ctx).await;
    let headers = response.headers_mut();
    headers.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    if req.method() == Method::HEAD {
        *response.body_mut() = empty();
    }
    response
}

/// Answers one request once its body is read: the checks every request
/// passes (Host, path, method, JSON writes), then its endpoint.
async fn dispatch<E: EngineQueries>(
    engine: &E,
    req: &Request<()>,
    body: Option<Bytes>,
    ctx: &Context,
) -> Response<BoxBody> {
    if let Some(refused) = host_refusal(req, ctx) {
        return refused;
    }
    let Some(endpoint) = endpoint(req.uri().path()) else {
        return error(StatusCode::NOT_FOUND, "not found");
    };
    if let Some(answer) = method_answer(&endpoint, req) {
        return answer;
    }
    if let Some(refused) = non_json_write_refusal(req) {
        return refused;
    }
    answer(engine, endpoint, req, body, ctx).await
}

/// The refusal of a request whose Host names no loopback address (a 400
/// when it names none), unless it is a scrape of `/metrics` by a remote
/// Prometheus that [`Context::remote_metrics`] lets in.
fn host_refusal(req: &Request<()>, ctx: &Context) -> Option<Response<BoxBody>> {
    let remote_scrape = ctx.remote_metrics
        && req.uri().path() == "/metrics"
        && matches!(*req.method(), Method::GET | Method::HEAD);
    match host_guard::check(req) {
        Ok(()) => None,
        Err(_) if remote_scrape => None,
        Err(HostRejection::Missing) => Some(error(StatusCode::BAD_REQUEST, "missing host header")),
        Err(HostRejection::NotAllowed) => Some(error(StatusCode::FORBIDDEN, "host not allowed")),
        Err(HostRejection::Repeated) => {
            Some(error(StatusCode::BAD_REQUEST, "more than one host header"))
        }
    }
}

/// The answer a request gets from its method alone: a preflight's, or a
/// 405 for a method the endpoint doesn't take. Both name the allowed
/// methods.
fn method_answer(endpoint: &Endpoint<'_>, req: &Request<()>) -> Option<Response<BoxBody>> {
    if *req.method() == Method::OPTIONS {
        // A preflight gets the allowed methods and nothing else: without
        // `access-control-allow-*` headers the browser refuses the
        // cross-origin request it was asking about.
        let mut res = Response::new(empty());
        *res.status_mut() = StatusCode::NO_CONTENT;
        res.headers_mut()
            .insert(ALLOW, HeaderValue::from_static(endpoint.allowed()));
        return Some(res);
    }
    if !endpoint.accepts(req.method()) {
        let mut res = error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed");
        res.headers_mut()
            .insert(ALLOW, HeaderValue::from_static(endpoint.allowed()));
        return Some(res);
    }
    None
}

/// Writes must say they are JSON: a cross-origin page can only send
/// that after a CORS preflight, which this API never grants.
fn non_json_write_refusal(req: &Request<()>) -> Option<Response<BoxBody>> {
    if !matches!(*req.method(), Method::PUT | Method::POST) {
        return None;
    }
    let is_json = req
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().to_ascii_lowercase().starts_with(JSON));
    (!is_json).then(|| {
        error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "writes need content-type: application/json",
        )
    })
}

/// The endpoint's answer to a request that passed every check.
async fn answer<E: EngineQueries>(
    engine: &E,
    endpoint: Endpoint<'_>,
    req: &Request<()>,
    body: Option<Bytes>,
    ctx: &Context,
) -> Response<BoxBody> {
    let query = req.uri().query();
    match endpoint {
        Endpoint::Calls => live_calls(engine, query).await,
        Endpoint::Call(raw_id) => one_call(engine, raw_id).await,
        Endpoint::Stats => json(StatusCode::OK, &engine.stats().await),
        Endpoint::Events => events(engine, req, ctx).await,
        Endpoint::Metrics => Response::builder()
            .header(CONTENT_TYPE, METRICS_CONTENT_TYPE)
            .header(CACHE_CONTROL, "no-store")
            .body(full(engine.metrics_text()))
            .unwrap_or_else(|_| internal_error()),
        Endpoint::Routes => json(StatusCode::OK, &engine.routes().await),
        Endpoint::History => json(StatusCode::OK, &engine.stats_history().await),
        Endpoint::StoredCalls => stored_calls(engine, query).await,
        Endpoint::Depth => match depth_query(query) {
            Ok(query) => match engine.history_depth(query).await {
                Ok(doc) => json(StatusCode::OK, &doc),
                Err(e) => query_error(&e),
            },
            Err(message) => error(StatusCode::BAD_REQUEST, &message),
        },
        Endpoint::Models => models(engine, query).await,
        Endpoint::Export => match export_query(query) {
            Ok((filter, format)) => match engine.export(filter, format).await {
                Ok(body) => download(format, body),
                Err(e) => query_error(&e),
            },
            Err(message) => error(StatusCode::BAD_REQUEST, &message),
        },
        Endpoint::Discover => json(StatusCode::OK, &engine.discover().await),
        Endpoint::Servers => json(StatusCode::OK, &engine.servers().await),
        Endpoint::IgnoreServer(name) => match engine.ignore_server(name.to_owned()).await {
            Ok(doc) => json(StatusCode::OK, &doc),
            Err(e) => query_error(&e),
        },
        Endpoint::Capture => json(StatusCode::OK, &engine.capture().await),
        Endpoint::Settings if *req.method() == Method::PUT => save_settings(engine, body).await,
        Endpoint::Settings => match engine.get_settings().await {
            Ok(doc) => json(StatusCode::OK, &doc),
            Err(e) => query_error(&e),
        },
        Endpoint::Demo => match engine.start_demo().await {
            Ok(doc) => json(StatusCode::OK, &doc),
            Err(e) => query_error(&e),
        },
        Endpoint::Asset(asset) => Response::builder()
            .header(CONTENT_TYPE, asset.content_type)
            // The page is embedded in the binary: revalidate so an upgrade
            // shows at once.
            .header(CACHE_CONTROL, "no-cache")
            .body(full(Bytes::from_static(asset.body)))
            .unwrap_or_else(|_| internal_error()),
    }
}

/// `GET /api/v1/calls`: the engine's recent calls, `{"calls": [...]}`.
async fn live_calls<E: EngineQueries>(engine: &E, query: Option<&str>) -> Response<BoxBody> {
    match calls_query(query) {
        Ok(query) => {
            #[derive(Serialize)]
            struct Page {
                calls: Vec<Call>,
            }
            json(
                StatusCode::OK,
                &Page {
                    calls: engine.calls(query).await,
                },
            )
        }
        Err(message) => error(StatusCode::BAD_REQUEST, &message),
    }
}

/// `GET /api/v1/calls/{id}`: one call, by its percent-encoded id.
async fn one_call<E: EngineQueries>(engine: &E, raw_id: &str) -> Response<BoxBody> {
    let id = percent_decode(raw_id, false);
    match engine.call(id.clone()).await {
        Some(call) => json(StatusCode::OK, &call),
        None => error(StatusCode::NOT_FOUND, &format!("no call {id}")),
    }
}

/// `GET /api/v1/events`: the engine's events as server-sent events, until
/// the client or the server goes away (a HEAD gets the headers only).
async fn events<E: EngineQueries>(
    engine: &E,
    req: &Request<()>,
    ctx: &Context,
) -> Response<BoxBody> {
    let body = if req.method() == Method::HEAD {
        empty()
    } else {
        sse::body(
            engine.subscribe().await,
            ctx.shutdown.clone(),
            sse::KEEP_ALIVE,
        )
    };
    Response::builder()
        .header(CONTENT_TYPE, "text/event-stream")
        .header(CACHE_CONTROL, "no-cache")
        // Tells nginx-style reverse proxies not to buffer the stream.
        .header("x-accel-buffering", "no")
        .body(body)
        .unwrap_or_else(|_| internal_error())
}

/// `GET /api/v1/history`: settled calls from the store, `{"calls": [...]}`.
async fn stored_calls<E: EngineQueries>(engine: &E, query: Option<&str>) -> Response<BoxBody> {
    #[derive(Serialize)]
    struct Page {
        calls: Vec<Call>,
    }
    match history_query(query) {
        Ok(filter) => match engine.history(filter).await {
            Ok(calls) => json(StatusCode::OK, &Page { calls }),
            Err(e) => query_error(&e),
        },
        Err(message) => error(StatusCode::BAD_REQUEST, &message),
    }
}

/// `GET /api/v1/models`: per (model, route) figures, `{"models": [...]}`.
async fn models<E: EngineQueries>(engine: &E, query: Option<&str>) -> Response<BoxBody> {
    #[derive(Serialize)]
    struct Page {
        models: Vec<ModelSummary>,
    }
    match history_filter(query, |_, _| Ok(())) {
        Ok(filter) => match engine.models(filter).await {
            Ok(models) => json(StatusCode::OK, &Page { models }),
            Err(e) => query_error(&e),
        },
        Err(message) => error(StatusCode::BAD_REQUEST, &message),
    }
}

/// `PUT /api/v1/settings`: the body is a settings document to save.
async fn save_settings<E: EngineQueries>(engine: &E, body: Option<Bytes>) -> Response<BoxBody> {
    let doc = match serde_json::from_slice::<SettingsDoc>(body.as_deref().unwrap_or(b"")) {
        Ok(doc) => doc,
        Err(e) => return error(StatusCode::BAD_REQUEST, &format!("bad settings: {e}")),
    };
    match engine.save_settings(doc).await {
        Ok(outcome) => json(StatusCode::OK, &outcome),
        Err(e) => query_error(&e),
    }
}

/// Parses `limit=N&route=NAME&unmetered=1`. Unknown parameters are
/// ignored; the last occurrence of a repeated one wins. `limit` must be a
/// non-negative integer (0 is allowed and returns no calls) and is clamped
/// to [`MAX_LIMIT`]; an empty `route=` means no route filter; `unmetered`
/// is `1`/`true` or `0`/`false` (a bare `unmetered` is `1`).
pub fn calls_query(query: Option<&str>) -> Result<CallsQuery, String> {
    let mut out = CallsQuery::default();
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = percent_decode(value, true);
        match percent_decode(key, true).as_str() {
            "limit" => {
                let n: u64 = value
                    .trim()
                    .parse()
                    .map_err(|_| format!("limit must be a non-negative integer, got {value:?}"))?;
                out.limit = usize::try_from(n).unwrap_or(usize::MAX).min(MAX_LIMIT);
            }
            "route" => out.route = (!value.is_empty()).then_some(value),
            "unmetered" => {
                out.unmetered = match value.trim() {
                    "" | "1" | "true" => true,
                    "0" | "false" => false,
                    _ => return Err(format!("unmetered must be 1 or 0, got {value:?}")),
                }
            }
            _ => {}
        }
    }
    Ok(out)
}

/// Parses the history filters shared by `/api/v1/history`, `/models` and
/// `/export`: `model`, `route`, `client`, `since`, `until`. Any other
/// parameter goes to `extra(key, value)`, which may claim it or ignore it
/// (unknown parameters are ignored, as in [`calls_query`]); the last
/// occurrence of a repeated one wins.
///
/// - `model=` / `client=` present but empty: the calls that named none
///   (how `/api/v1/models` groups them, so its `""` row can be drilled into);
///   absent: no filter.
/// - `route=`, `since=`, `until=` empty: no filter (every call has a route).
/// - `since`/`until`: unix milliseconds or an RFC 3339 time; calls started
///   in `[since, until)`. `since` not before `until` is refused: the window
///   is empty, and swapped bounds are the likelier mistake.
pub fn history_filter(
    query: Option<&str>,
    mut extra: impl FnMut(&str, String) -> Result<(), String>,
) -> Result<HistoryFilter, String> {
    let mut filter = HistoryFilter::default();
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = percent_decode(value, true);
        match percent_decode(key, true).as_str() {
            "model" => filter.model = Some(value),
            "client" => filter.client = Some(value),
            "route" => filter.route = (!value.is_empty()).then_some(value),
            "since" => filter.since_ms = time_bound("since", &value)?,
            "until" => filter.until_ms = time_bound("until", &value)?,
            other => extra(other, value)?,
        }
    }
    filter.check_window()?;
    Ok(filter)
}

/// `GET /api/v1/history`: the filters plus `limit` (default 100, clamped to
/// [`MAX_LIMIT`], a non-negative integer as in [`calls_query`]).
pub fn history_query(query: Option<&str>) -> Result<HistoryFilter, String> {
    let mut limit = 100;
    let mut filter = history_filter(query, |key, value| {
        if key == "limit" {
            let n: u64 = value
                .trim()
                .parse()
                .map_err(|_| format!("limit must be a non-negative integer, got {value:?}"))?;
            limit = usize::try_from(n).unwrap_or(usize::MAX).min(MAX_LIMIT);
        }
        Ok(())
    })?;
    filter.limit = Some(limit);
    Ok(filter)
}

/// `GET /api/v1/history/depth`: `model` (required), `route`, `since`,
/// `until`, with the history filters' rules.
pub fn depth_query(query: Option<&str>) -> Result<crate::model::DepthQuery, String> {
    let filter = history_filter(query, |_, _| Ok(()))?;
    let q = crate::model::DepthQuery {
        model: filter.model.unwrap_or_default(),
        route: filter.route,
        since_ms: filter.since_ms,
        until_ms: filter.until_ms,
    };
    q.check()?;
    Ok(q)
}

/// `GET /api/v1/export`: the filters plus `format` (`csv`, the default, or
/// `jsonl`). No limit: an export is every matching call.
pub fn export_query(query: Option<&str>) -> Result<(HistoryFilter, ExportFormat), String> {
    let mut format = ExportFormat::Csv;
    let filter = history_filter(query, |key, value| {
        if key == "format" {
            format = value.parse().map_err(|e| format!("format: {e}"))?;
        }
        Ok(())
    })?;
    Ok((filter, format))
}

/// An export as a download: the browser saves it under a fixed name rather
/// than showing it, and never caches it (the history changes).
fn download(format: ExportFormat, body: Vec<u8>) -> Response<BoxBody> {
    let (content_type, name) = match format {
        ExportFormat::Csv => ("text/csv; charset=utf-8", "speedtap-calls.csv"),
        ExportFormat::Jsonl => ("application/x-ndjson", "speedtap-calls.jsonl"),
    };
    Response::builder()
        .header(CONTENT_TYPE, content_type)
        .header(
            CONTENT_DISPOSITION,
            format!("attachment; filename=\"{name}\""),
        )
        .header(CACHE_CONTROL, "no-store")
        .body(full(body))
        .unwrap_or_else(|_| internal_error())
}

/// Decodes `%XX` escapes and, when `plus_is_space` (query strings, as in
/// form encoding), `+` as a space. Invalid escapes are kept literally;
/// invalid UTF-8 is replaced (U+FFFD).
pub fn percent_decode(s: &str, plus_is_space: bool) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' if plus_is_space => out.push(b' '),
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h << 4 | l);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

fn full(body: impl Into<Bytes>) -> BoxBody {
    Full::new(body.into())
        .map_err(|e: Infallible| match e {})
        .boxed_unsync()
}

fn empty() -> BoxBody {
    Empty::<Bytes>::new().boxed_unsync()
}

fn json<T: Serialize>(status: StatusCode, value: &T) -> Response<BoxBody> {
    match serde_json::to_vec(value) {
        Ok(body) => Response::builder()
            .status(status)
            .header(CONTENT_TYPE, JSON)
            .header(CACHE_CONTROL, "no-store")
            .body(full(body))
            .unwrap_or_else(|_| internal_error()),
        Err(_) => internal_error(),
    }
}

/// `{"error": message}` with `status`.
/// The answer to a failed engine request: the status its kind maps to
/// ([`QueryError::http_status`]) and its message.
pub fn query_error(e: &QueryError) -> Response<BoxBody> {
    let status = StatusCode::from_u16(e.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    error(status, e.message())
}

pub fn error(status: StatusCode, message: &str) -> Response<BoxBody> {
    let body = serde_json::json!({ "error": message }).to_string();
    let mut res = Response::new(full(body));
    *res.status_mut() = status;
    let headers = res.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(JSON));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    res
}

fn internal_error() -> Response<BoxBody> {
    let mut res = Response::new(full(r#"{"error":"internal error"}"#));
    *res.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
    res.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(JSON));
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Just enough of an engine to route requests.
    #[derive(Clone)]
    struct Bare;

    impl EngineQueries for Bare {
        async fn calls(&self, _: CallsQuery) -> Vec<Call> {
            Vec::new()
        }
        async fn call(&self, _: String) -> Option<Call> {
            None
        }
        async fn stats(&self) -> crate::model::Stats {
            crate::model::Stats::default()
        }
        async fn subscribe(&self) -> tokio::sync::mpsc::Receiver<crate::model::EngineEvent> {
            tokio::sync::mpsc::channel(1).1
        }
        fn metrics_text(&self) -> String {
            "speedtap_active_calls 0\n".into()
        }
    }

    async fn status_for(path: &str, host: &str, remote_metrics: bool) -> StatusCode {
        let req = Request::get(path)
            .header("host", host)
            .body(Empty::<Bytes>::new())
            .unwrap();
        let ctx = Context {
            shutdown: None,
            remote_metrics,
        };
        route(&Bare, req, &ctx).await.status()
    }

    #[tokio::test]
    async fn a_remote_api_lets_other_hosts_scrape_metrics_and_nothing_else() {
        // Loopback API: any non-loopback Host is refused, /metrics included.
        assert_eq!(
            status_for("/metrics", "10.1.2.3:7878", false).await,
            StatusCode::FORBIDDEN
        );
        // --allow-remote API: a scraper may name this host...
        assert_eq!(
            status_for("/metrics", "10.1.2.3:7878", true).await,
            StatusCode::OK
        );
        // ...but the calls (and the dashboard) still answer loopback names only.
        assert_eq!(
            status_for("/api/v1/calls", "10.1.2.3:7878", true).await,
            StatusCode::FORBIDDEN
        );
        assert_eq!(
            status_for("/", "evil.example:7878", true).await,
            StatusCode::FORBIDDEN
        );
        assert_eq!(
            status_for("/api/v1/calls", "localhost:7878", true).await,
            StatusCode::OK
        );
    }

    #[test]
    fn calls_query_defaults_parses_and_clamps() {
        assert_eq!(calls_query(None).unwrap(), CallsQuery::default());
        assert_eq!(
            calls_query(Some("limit=5&route=llama%20cpp&x=1")).unwrap(),
            CallsQuery {
                limit: 5,
                route: Some("llama cpp".into()),
                unmetered: false,
            }
        );
        assert_eq!(
            calls_query(Some("limit=99999999999")).unwrap().limit,
            MAX_LIMIT
        );
        assert_eq!(
            calls_query(Some("limit=0&route=")).unwrap(),
            CallsQuery {
                limit: 0,
                route: None,
                unmetered: false,
            }
        );
        assert_eq!(
            calls_query(Some("route=a+b&limit=1&limit=2")).unwrap(),
            CallsQuery {
                limit: 2,
                route: Some("a b".into()),
                unmetered: false,
            }
        );
        for (q, unmetered) in [
            ("unmetered=1", true),
            ("unmetered=true", true),
            ("unmetered", true),
            ("unmetered=1&unmetered=0", false),
            ("unmetered=false", false),
        ] {
            assert_eq!(calls_query(Some(q)).unwrap().unmetered, unmetered, "{q}");
        }
        let err = calls_query(Some("unmetered=yes")).unwrap_err();
        assert!(err.starts_with("unmetered must be"), "{err}");
    }

    #[test]
    fn bad_limits_are_refused() {
        for q in ["limit=-1", "limit=ten", "limit=", "limit=1.5", "limit"] {
            let err = calls_query(Some(q)).unwrap_err();
            assert!(err.starts_with("limit must be"), "{q}: {err}");
        }
    }

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("c-000042", false), "c-000042");
        assert_eq!(percent_decode("a%2Fb%zz%4", false), "a/b%zz%4");
        assert_eq!(percent_decode("a+b", false), "a+b");
        assert_eq!(percent_decode("a+b", true), "a b");
        assert_eq!(percent_decode("%E2%80%93", true), "\u{2013}");
    }

    #[test]
    fn history_filters_parse_and_name_the_bad_parameter() {
        assert_eq!(
            history_query(None).unwrap(),
            HistoryFilter {
                limit: Some(100),
                ..HistoryFilter::default()
            }
        );
        assert_eq!(
            history_query(Some(
                "model=qwen3%3A8b&route=ollama&client=curl&since=1000\
                 &until=1970-01-01T00:00:02Z&limit=5&x=1"
            ))
            .unwrap(),
            HistoryFilter {
                model: Some("qwen3:8b".into()),
                route: Some("ollama".into()),
                client: Some("curl".into()),
                since_ms: Some(1000),
                until_ms: Some(2000),
                status: None,
                limit: Some(5),
            }
        );
        // Empty model/client: the calls that named none; empty route and
        // times: no filter.
        let f = history_query(Some("model=&client=&route=&since=&until=")).unwrap();
        assert_eq!(f.model.as_deref(), Some(""));
        assert_eq!(f.client.as_deref(), Some(""));
        assert_eq!((f.route, f.since_ms, f.until_ms), (None, None, None));
        assert_eq!(
            history_query(Some("limit=123456")).unwrap().limit,
            Some(MAX_LIMIT)
        );
        for (q, name) in [
            ("since=yesterday", "since must be"),
            ("until=2026-13-01", "until must be"),
            ("limit=-1", "limit must be"),
            ("since=2000&until=1000", "since must be before until"),
            ("since=1000&until=1000", "since must be before until"),
        ] {
            let err = history_query(Some(q)).unwrap_err();
            assert!(err.starts_with(name), "{q}: {err}");
        }
    }

    #[test]
    fn models_ignore_limit_and_export_reads_format() {
        let f = history_filter(Some("limit=abc&model=m"), |_, _| Ok(())).unwrap();
        assert_eq!(f.limit, None);
        assert_eq!(f.model.as_deref(), Some("m"));
        assert_eq!(export_query(None).unwrap().1, ExportFormat::Csv);
        let (f, format) = export_query(Some("format=JSONL&route=r&limit=2")).unwrap();
        assert_eq!(format, ExportFormat::Jsonl);
        assert_eq!((f.route.as_deref(), f.limit), (Some("r"), None));
        let err = export_query(Some("format=xml")).unwrap_err();
        assert!(err.starts_with("format: "), "{err}");
    }

    #[test]
    fn endpoints_by_path() {
        assert_eq!(endpoint("/api/v1/calls"), Some(Endpoint::Calls));
        assert_eq!(endpoint("/api/v1/calls/c-1"), Some(Endpoint::Call("c-1")));
        assert_eq!(endpoint("/api/v1/calls/"), None);
        assert_eq!(endpoint("/api/v1/calls/a/b"), None);
        assert_eq!(endpoint("/api/v1/stats/"), None);
        assert_eq!(endpoint("/api/v1/history"), Some(Endpoint::StoredCalls));
        assert_eq!(endpoint("/api/v1/history/depth"), Some(Endpoint::Depth));
        assert_eq!(
            depth_query(Some("model=m&route=r"))
                .unwrap()
                .route
                .as_deref(),
            Some("r")
        );
        assert!(depth_query(Some("route=r")).unwrap_err().contains("model"));
        assert_eq!(endpoint("/api/v1/models"), Some(Endpoint::Models));
        assert_eq!(endpoint("/api/v1/export"), Some(Endpoint::Export));
        assert!(matches!(endpoint("/"), Some(Endpoint::Asset(_))));
        assert_eq!(endpoint("/ui/index.html"), None);
    }
}
