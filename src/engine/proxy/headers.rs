//! Header handling for the forwarding hop (RFC 9110 §7.6.1). The media
//! type a response is metered as is read alike by both interceptors, in
//! [`crate::engine::http_meta`].

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

/// Headers that describe one connection, not the message: never forwarded.
///
/// `Trailer` is not among them: it is end-to-end (RFC 9110 §6.6.2), and
/// hyper only writes a response's trailer fields that its `Trailer` header
/// declares, so dropping it would drop the trailers.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "transfer-encoding",
    "upgrade",
];

/// Whether the client's `TE` header accepts trailers (`TE: trailers`).
/// Read before [`strip_hop_by_hop`] removes it.
pub fn accepts_trailers(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::TE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| {
            t.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .eq_ignore_ascii_case("trailers")
        })
}

/// Says `TE: trailers` upstream on behalf of a client that accepts them:
/// `TE` is hop-by-hop, but the proxy passes trailer frames through, so it
/// may make the same promise on its own hop (RFC 9110 §10.1.4).
pub fn request_trailers(headers: &mut HeaderMap) {
    headers.insert(header::TE, HeaderValue::from_static("trailers"));
}

/// Removes hop-by-hop headers, including any the `Connection` header names.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
}

/// Asks the upstream for an uncompressed body on metered calls.
///
/// The meter must read the stream as it arrives. A compressed SSE stream
/// can only be decoded at the compressor's flush points, which distorts the
/// very timings we measure, and on loopback bandwidth is free. So metered
/// requests go upstream with `Accept-Encoding: identity`; everything else
/// keeps the client's header. If an upstream compresses anyway, the bytes
/// still pass through untouched and the call is simply not understood.
pub fn request_identity_encoding(headers: &mut HeaderMap) {
    headers.insert(
        header::ACCEPT_ENCODING,
        HeaderValue::from_static("identity"),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_standard_and_connection_named_headers() {
        let mut h = HeaderMap::new();
        h.insert(
            "connection",
            HeaderValue::from_static("keep-alive, x-private"),
        );
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("x-private", HeaderValue::from_static("1"));
        h.insert("transfer-encoding", HeaderValue::from_static("chunked"));
        h.insert(
            "content-type",
            HeaderValue::from_static("text/event-stream"),
        );
        h.insert("authorization", HeaderValue::from_static("Bearer k"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 2);
        assert!(h.contains_key("content-type"));
        assert!(h.contains_key("authorization"));
    }

    #[test]
    fn trailer_declarations_pass_and_te_trailers_is_recognised() {
        let mut h = HeaderMap::new();
        h.insert("trailer", HeaderValue::from_static("x-checksum"));
        h.insert("te", HeaderValue::from_static("gzip;q=0.5, Trailers"));
        assert!(accepts_trailers(&h));
        strip_hop_by_hop(&mut h);
        assert!(h.contains_key("trailer"));
        assert!(!h.contains_key("te"));
        assert!(!accepts_trailers(&h));
        h.insert("te", HeaderValue::from_static("deflate"));
        assert!(!accepts_trailers(&h));
    }
}
