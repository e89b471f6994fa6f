//! The proxy's per-connection limits, in one place.
//!
//! They bound what a misbehaving client can hold (a slowloris trickling its
//! request head, an endless header line, a flood of connections) without
//! ever cutting a legitimate model call: a local model may think for
//! minutes before its first token and stream for an hour, so nothing here
//! limits how long a response takes. The one limit on a running response,
//! [`ProxyLimits::idle_timeout`], is off unless the user sets it.

use std::time::Duration;

/// How long a client may take to send a request head, and how long an idle
/// keep-alive connection is kept (hyper uses one timer for both: it starts
/// whenever the connection waits for a head).
///
/// 60 s: far longer than any real client takes to send a few hundred bytes
/// of head on loopback, and longer than the idle expiry of the usual HTTP
/// client pools (httpx 5 s, Node 4-5 s), so it never races a reuse in
/// practice; short enough that a slowloris connection is gone in a minute.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(60);

/// The most a connection buffers while reading a request head: hyper's own
/// default (about 400 KiB). A longer head is refused with
/// `431 Request Header Fields Too Large`, so one client can pin at most
/// this much memory per connection before its head is complete.
///
/// hyper applies the cap to its read buffer, which may hold up to about
/// twice the cap when a head arrives in one piece: such a head parsed
/// whole and passed. [`head_too_large`] measures the parsed head against
/// the same cap, so every head over it gets its 431.
pub const DEFAULT_MAX_BUF_SIZE: usize = 408 * 1024;

/// The most client connections one route serves at once: far above what a
/// desk full of chat clients opens, low enough that a connection flood
/// can't take every descriptor (each proxied call holds two sockets, so
/// the cap needs about 8,200; where the process limit is lower, `accept`
/// fails first and the listener backs off, see [`ACCEPT_ERROR_BACKOFF`]).
/// When the cap is reached, new connections wait in the kernel's accept
/// backlog until one closes, instead of being refused.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4_096;

/// After `accept` fails (out of descriptors, say), the listener waits this
/// long before trying again instead of spinning on the error.
pub const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(50);

/// Limits applied by every route's listener and forwarder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProxyLimits {
    /// The longest the upstream may stay silent once its response has
    /// started (between the head and the first body frame, and between
    /// frames). `None`, the default, never cuts a response: a slow model is
    /// not a fault. When it fires the response is cut (the client sees a
    /// truncated body) and the call ends `abandoned`.
    ///
    /// Deliberately not applied to the wait for the response head: a
    /// non-streamed call is silent until the model has finished, however
    /// long that is.
    pub idle_timeout: Option<Duration>,
    /// See [`DEFAULT_HEADER_READ_TIMEOUT`].
    pub header_read_timeout: Duration,
    /// See [`DEFAULT_MAX_BUF_SIZE`].
    pub max_buf_size: usize,
    /// See [`DEFAULT_MAX_CONNECTIONS`].
    pub max_connections: usize,
}

impl Default for ProxyLimits {
    fn default() -> Self {
        ProxyLimits {
            idle_timeout: None,
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            max_buf_size: DEFAULT_MAX_BUF_SIZE,
            max_connections: DEFAULT_MAX_CONNECTIONS,
        }
    }
}

/// Whether the request head `parts` (its request line and header lines, as
/// they are counted on the wire) is longer than `cap` bytes.
pub fn head_too_large(parts: &http::request::Parts, cap: usize) -> bool {
    // "METHOD SP target SP HTTP/1.1 CRLF", each "name: value CRLF", CRLF.
    let line = parts.method.as_str().len() + parts.uri.to_string().len() + 12;
    let fields: usize = parts
        .headers
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum();
    line + fields + 2 > cap
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts_with(header_bytes: usize) -> http::request::Parts {
        let req = http::Request::post("/v1/chat/completions")
            .header("x-big", "a".repeat(header_bytes))
            .body(())
            .unwrap_or_default();
        req.into_parts().0
    }

    #[test]
    fn a_head_is_measured_as_it_is_counted_on_the_wire() {
        // "POST /v1/chat/completions HTTP/1.1\r\n" is 36 bytes, the header
        // line 9 bytes more than its value, the blank line 2.
        let parts = parts_with(100);
        assert!(!head_too_large(&parts, 36 + 109 + 2));
        assert!(head_too_large(&parts, 36 + 109 + 1));
    }
}
