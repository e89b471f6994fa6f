//! Header handling for the forwarding hop (RFC 9110 §7.6.1).

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

/// Headers that describe one connection, not the message: never forwarded.
const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

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
}
