//! The last phase of a proxied call: the upstream's answer relayed to the
//! client, frame by frame, through the call's [`CallSink`] (the tap when
//! metered), and the responses the proxy makes itself (a 502 naming the
//! upstream when it can't be reached).

use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;

use super::headers;
use super::idle::IdleTimeout;
use super::sink::CallSink;
use super::{ProxyBody, RouteProxy};

/// The upstream's response as the client gets it: hop-by-hop headers
/// dropped, the body cut after `idle_timeout` of silence (when set), and
/// tapped for the call's actor when metered.
pub fn relay(
    resp: Response<Incoming>,
    sink: CallSink,
    idle_timeout: Option<Duration>,
) -> Response<ProxyBody> {
    let (mut parts, body) = resp.into_parts();
    headers::strip_hop_by_hop(&mut parts.headers);
    // The version is hop-by-hop too (RFC 9110 §6.2): the client gets our
    // own, so an HTTP/1.0 upstream's close-delimited body reaches an
    // HTTP/1.1 client chunked, on a connection that stays open, instead of
    // ending it.
    parts.version = http::Version::default();
    let body = IdleTimeout::new(body, idle_timeout);
    let body = sink.response_body(&parts, body);
    Response::from_parts(parts, body)
}

impl RouteProxy {
    /// `502 Bad Gateway` with a JSON body saying which upstream failed and
    /// why, so a user sees at once which server is down.
    pub(super) fn bad_gateway(&self, cause: &str) -> Response<ProxyBody> {
        let body = serde_json::json!({
            "error": "upstream unreachable",
            "route": self.name,
            "upstream": self.upstream.base_url(),
            "cause": cause,
        });
        json_response(StatusCode::BAD_GATEWAY, &body)
    }
}

impl RouteProxy {
    /// `508 Loop Detected` for a request that arrived over one of the
    /// proxy's own upstream connections: some route's upstream leads back
    /// to this listener. Not forwarded and not recorded as a call (the
    /// route that sent it records the call, with this status); logged, as
    /// the configuration needs fixing.
    pub(super) fn loop_detected(&self) -> Response<ProxyBody> {
        tracing::warn!(
            "proxy: route {:?} received a request from speedtap's own upstream connection: \
             a route's upstream leads back to speedtap; answered 508 Loop Detected",
            self.name
        );
        let body = serde_json::json!({
            "error": "loop detected: a speedtap route's upstream leads back to speedtap",
            "route": self.name,
        });
        json_response(StatusCode::LOOP_DETECTED, &body)
    }
}

impl RouteProxy {
    /// `431 Request Header Fields Too Large` for a head over the cap that
    /// hyper's own buffer check let through (see
    /// [`super::limits::DEFAULT_MAX_BUF_SIZE`]). Not forwarded and not
    /// recorded; the connection is closed after it.
    pub(super) fn head_too_large(&self) -> Response<ProxyBody> {
        let body = serde_json::json!({
            "error": "request head too large",
            "route": self.name,
            "max_head_bytes": self.link.limits.max_buf_size,
        });
        let mut resp = json_response(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE, &body);
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        resp
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
