//! The first phase of a proxied call: the client's request read into the
//! one that goes upstream, and the call started.
//!
//! Only the head is read here: the path says which API the call speaks
//! (as the capture reads it, with [`detect_request`]), the User-Agent
//! which app made it. The headers are made fit for the next hop (hop-by-hop
//! ones dropped, `Host` set to the upstream's, `TE: trailers` kept when the
//! client accepts trailers, an uncompressed body asked for on metered
//! calls). The body is not touched: it streams upstream through the
//! [`CallSink`]'s wrapper.

use std::time::SystemTime;

use http::request::Parts;
use http::{header, HeaderMap, HeaderValue, Method, Request, Uri};
use tokio::time::Instant;

use super::headers;
use super::sink::CallSink;
use super::RouteProxy;
use crate::decode::detect::detect_request;
use crate::engine::link::CallStart;
use crate::model::{ApiKind, SeenBy, Upstream};

/// The client's request as it goes upstream, and what the call is known by.
pub struct Outgoing {
    method: Method,
    /// The client's path (without the query): the decoders read it.
    path: String,
    /// The same path and query on the upstream.
    uri: Uri,
    headers: HeaderMap,
    /// The API the path names; `Unknown` passes through unmetered.
    api: ApiKind,
    /// The app that made the call (from its User-Agent).
    client: Option<String>,
}

impl Outgoing {
    /// Reads the client's request head into the upstream's. Fails only on
    /// an upstream URL that doesn't parse.
    pub fn read(parts: Parts, upstream: &Upstream) -> Result<Self, http::uri::InvalidUri> {
        let path_and_query = parts
            .uri
            .path_and_query()
            .map(|p| p.as_str().to_owned())
            .unwrap_or_else(|| "/".to_owned());
        let api = detect_request(parts.method.as_str(), parts.uri.path(), b"").api;
        let client = parts
            .headers
            .get(header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .and_then(crate::engine::details::client_app);
        let mut headers = parts.headers;
        let trailers = headers::accepts_trailers(&headers);
        headers::strip_hop_by_hop(&mut headers);
        if trailers {
            headers::request_trailers(&mut headers);
        }
        if let Ok(host) = HeaderValue::from_str(&upstream.authority()) {
            headers.insert(header::HOST, host);
        }
        if api != ApiKind::Unknown {
            headers::request_identity_encoding(&mut headers);
        }
        let uri: Uri = upstream.join(&path_and_query).parse()?;
        Ok(Outgoing {
            method: parts.method,
            path: parts.uri.path().to_owned(),
            uri,
            headers,
            api,
            client,
        })
    }

    /// The upstream request, carrying `body`.
    pub fn into_request<B>(self, body: B) -> Request<B> {
        let mut upstream_req = Request::new(body);
        *upstream_req.method_mut() = self.method;
        *upstream_req.uri_mut() = self.uri;
        *upstream_req.headers_mut() = self.headers;
        upstream_req
    }
}

impl RouteProxy {
    /// Starts the call `outgoing` makes, dispatched now: a call actor when
    /// the decoders know its API, else a pass-through record.
    pub(super) fn start_call(
        &self,
        seq: u64,
        started_at: SystemTime,
        outgoing: &Outgoing,
    ) -> CallSink {
        let call = CallStart {
            seq,
            route: self.name.clone(),
            api: outgoing.api,
            started_at,
            method: outgoing.method.as_str().to_owned(),
            path: outgoing.path.clone(),
            dispatched_at: Instant::now(),
            client: outgoing.client.clone(),
            seen_by: SeenBy::Proxy,
            telemetry: self.telemetry.clone(),
            // Not looked up: a relay that sends its legs through a
            // speedtap port, not straight to its server, is not told apart
            // yet (`docs/metering.md`, "each client call once").
            peer: None,
        };
        if outgoing.api == ApiKind::Unknown {
            CallSink::passed_through(self.link.supervisor.clone(), &call)
        } else {
            CallSink::Metered(self.link.start_call(call))
        }
    }
}
