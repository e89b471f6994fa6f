//! What both interceptors read from an HTTP message's headers the same
//! way: the media type a response body is decoded as. The proxy reads it
//! from the upstream's response head, the capture from the captured one;
//! one rule here, so a call is metered (or not) alike whichever
//! interceptor saw it.

use http::header::{self, HeaderMap};

/// The media type the response tap should decode the body as.
///
/// A body with a `Content-Encoding` other than `identity` (gzip, br...) is
/// opaque bytes to the decoders, whatever its `Content-Type` says. It is
/// reported as `application/octet-stream`, which the metering classes as
/// not understood: the bytes pass through untouched and the call is listed
/// `unmetered`. Decompressing in the tap was the alternative; it was not
/// chosen because a compressed stream only decodes at the compressor's
/// flush points, which would distort the very timings measured, and metered
/// requests already ask for `identity` (the proxy's
/// `headers::request_identity_encoding`).
pub fn tap_content_type(headers: &HeaderMap) -> Option<String> {
    let encoded = headers
        .get_all(header::CONTENT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .any(|e| !e.is_empty() && !e.eq_ignore_ascii_case("identity"));
    if encoded {
        return Some("application/octet-stream".to_owned());
    }
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    #[test]
    fn an_encoded_body_is_opaque_to_the_tap() {
        let mut h = HeaderMap::new();
        h.insert(
            "content-type",
            HeaderValue::from_static("text/event-stream"),
        );
        assert_eq!(tap_content_type(&h).as_deref(), Some("text/event-stream"));
        h.insert("content-encoding", HeaderValue::from_static("identity"));
        assert_eq!(tap_content_type(&h).as_deref(), Some("text/event-stream"));
        h.insert("content-encoding", HeaderValue::from_static("gzip"));
        assert_eq!(
            tap_content_type(&h).as_deref(),
            Some("application/octet-stream")
        );
    }
}
