//! The router: one request in, one response out. No sockets here, so every
//! rule (host guard, methods, paths, queries, headers) is testable directly.

use std::convert::Infallible;

use bytes::Bytes;
use http::header::{HeaderValue, ALLOW, CACHE_CONTROL, CONTENT_TYPE};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use serde::Serialize;
use tokio::sync::watch;

use super::host_guard::{self, HostRejection};
use super::{dashboard, sse, BoxBody};
use crate::engine::control::SettingsDoc;
use crate::engine::metrics::CONTENT_TYPE as METRICS_CONTENT_TYPE;
use crate::engine::{Call, CallsQuery, EngineQueries};

/// The largest `limit` honoured; larger values are clamped, not refused, so a
/// script asking for "everything" gets what the engine keeps.
pub const MAX_LIMIT: usize = 10_000;

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
    Discover,
    Settings,
    Demo,
    Asset(&'static dashboard::Asset),
}

impl Endpoint<'_> {
    /// The methods this endpoint answers (for 405s and preflights).
    fn allowed(&self) -> &'static str {
        match self {
            Endpoint::Settings => ALLOWED_SETTINGS,
            Endpoint::Demo => ALLOWED_DEMO,
            _ => ALLOWED,
        }
    }

    fn accepts(&self, method: &Method) -> bool {
        match self {
            Endpoint::Settings => {
                matches!(*method, Method::GET | Method::HEAD | Method::PUT)
            }
            Endpoint::Demo => *method == Method::POST,
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
        "/api/v1/discover" => Some(Endpoint::Discover),
        "/api/v1/settings" => Some(Endpoint::Settings),
        "/api/v1/demo" => Some(Endpoint::Demo),
        _ => {
            if let Some(id) = path.strip_prefix("/api/v1/calls/") {
                return (!id.is_empty() && !id.contains('/')).then_some(Endpoint::Call(id));
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

async fn dispatch<E: EngineQueries>(
    engine: &E,
    req: &Request<()>,
    body: Option<Bytes>,
    ctx: &Context,
) -> Response<BoxBody> {
    match host_guard::check(req) {
        Ok(()) => {}
        Err(HostRejection::Missing) => {
            return error(StatusCode::BAD_REQUEST, "missing host header");
        }
        Err(HostRejection::NotAllowed) => return error(StatusCode::FORBIDDEN, "host not allowed"),
    }

    let Some(endpoint) = endpoint(req.uri().path()) else {
        return error(StatusCode::NOT_FOUND, "not found");
    };
    if *req.method() == Method::OPTIONS {
        // A preflight gets the allowed methods and nothing else: without
        // `access-control-allow-*` headers the browser refuses the
        // cross-origin request it was asking about.
        let mut res = Response::new(empty());
        *res.status_mut() = StatusCode::NO_CONTENT;
        res.headers_mut()
            .insert(ALLOW, HeaderValue::from_static(endpoint.allowed()));
        return res;
    }
    if !endpoint.accepts(req.method()) {
        let mut res = error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed");
        res.headers_mut()
            .insert(ALLOW, HeaderValue::from_static(endpoint.allowed()));
        return res;
    }
    // Writes must say they are JSON: a cross-origin page can only send
    // that after a CORS preflight, which this API never grants.
    if matches!(*req.method(), Method::PUT | Method::POST) {
        let is_json = req
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim_start().to_ascii_lowercase().starts_with(JSON));
        if !is_json {
            return error(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "writes need content-type: application/json",
            );
        }
    }

    match endpoint {
        Endpoint::Calls => match calls_query(req.uri().query()) {
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
        },
        Endpoint::Call(raw_id) => {
            let id = percent_decode(raw_id, false);
            match engine.call(id.clone()).await {
                Some(call) => json(StatusCode::OK, &call),
                None => error(StatusCode::NOT_FOUND, &format!("no call {id}")),
            }
        }
        Endpoint::Stats => json(StatusCode::OK, &engine.stats().await),
        Endpoint::Events => {
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
        Endpoint::Metrics => Response::builder()
            .header(CONTENT_TYPE, METRICS_CONTENT_TYPE)
            .header(CACHE_CONTROL, "no-store")
            .body(full(engine.metrics_text()))
            .unwrap_or_else(|_| internal_error()),
        Endpoint::Routes => json(StatusCode::OK, &engine.routes().await),
        Endpoint::History => json(StatusCode::OK, &engine.stats_history().await),
        Endpoint::Discover => json(StatusCode::OK, &engine.discover().await),
        Endpoint::Settings if *req.method() == Method::PUT => {
            let doc = match serde_json::from_slice::<SettingsDoc>(body.as_deref().unwrap_or(b"")) {
                Ok(doc) => doc,
                Err(e) => return error(StatusCode::BAD_REQUEST, &format!("bad settings: {e}")),
            };
            match engine.save_settings(doc).await {
                Ok(outcome) => json(StatusCode::OK, &outcome),
                Err(message) => error(StatusCode::BAD_REQUEST, &message),
            }
        }
        Endpoint::Settings => match engine.get_settings().await {
            Ok(doc) => json(StatusCode::OK, &doc),
            Err(message) => error(StatusCode::NOT_FOUND, &message),
        },
        Endpoint::Demo => match engine.start_demo().await {
            Ok(doc) => json(StatusCode::OK, &doc),
            Err(message) => error(StatusCode::INTERNAL_SERVER_ERROR, &message),
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

/// Parses `limit=N&route=NAME`. Unknown parameters are ignored; the last
/// occurrence of a repeated one wins. `limit` must be a non-negative integer
/// (0 is allowed and returns no calls) and is clamped to [`MAX_LIMIT`]; an
/// empty `route=` means no route filter.
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
            _ => {}
        }
    }
    Ok(out)
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

    #[test]
    fn calls_query_defaults_parses_and_clamps() {
        assert_eq!(calls_query(None).unwrap(), CallsQuery::default());
        assert_eq!(
            calls_query(Some("limit=5&route=llama%20cpp&x=1")).unwrap(),
            CallsQuery {
                limit: 5,
                route: Some("llama cpp".into())
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
                route: None
            }
        );
        assert_eq!(
            calls_query(Some("route=a+b&limit=1&limit=2")).unwrap(),
            CallsQuery {
                limit: 2,
                route: Some("a b".into())
            }
        );
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
    fn endpoints_by_path() {
        assert_eq!(endpoint("/api/v1/calls"), Some(Endpoint::Calls));
        assert_eq!(endpoint("/api/v1/calls/c-1"), Some(Endpoint::Call("c-1")));
        assert_eq!(endpoint("/api/v1/calls/"), None);
        assert_eq!(endpoint("/api/v1/calls/a/b"), None);
        assert_eq!(endpoint("/api/v1/stats/"), None);
        assert!(matches!(endpoint("/"), Some(Endpoint::Asset(_))));
        assert_eq!(endpoint("/ui/index.html"), None);
    }
}
