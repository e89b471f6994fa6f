//! DNS-rebinding protection: only loopback names may address the API.
//!
//! A web page on `evil.example.com` can make its own name resolve to
//! `127.0.0.1` after it loaded; the browser then treats requests to
//! `http://evil.example.com:7878/` as same-origin and lets the page read the
//! answers, CORS or not. What the browser cannot forge is the `Host` header:
//! it still says `evil.example.com:7878`. So every request must name a
//! loopback host: `localhost`, `*.localhost` (RFC 6761 reserves the whole
//! tree for loopback), an IPv4 address in `127.0.0.0/8`, or `[::1]`, each
//! with or without a port.

use http::header::HOST;
use http::{Request, Version};

/// Why a request was turned away.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostRejection {
    /// HTTP/1.1 without a `Host` header (RFC 9112 section 3.2 requires 400).
    Missing,
    /// A `Host` (or absolute-form authority) that is not a loopback name.
    NotAllowed,
    /// More than one `Host` header: RFC 9112 section 3.2 asks for 400
    /// ("more than one Host header line"), and which of them a browser or
    /// an intermediary would honour is anyone's guess.
    Repeated,
}

/// Checks the request's `Host` header and, when the request target is in
/// absolute form (`GET http://host/path`) or comes over HTTP/2 (`:authority`),
/// its URI authority too: both must be loopback names when present.
///
/// A request with neither is accepted on HTTP/1.0 and older, which predate
/// `Host`: no browser sends such a request, so it cannot be a rebinding
/// attack, and old scripting clients keep working.
pub fn check<B>(req: &Request<B>) -> Result<(), HostRejection> {
    if req.headers().get_all(HOST).iter().nth(1).is_some() {
        return Err(HostRejection::Repeated);
    }
    let header = match req.headers().get(HOST) {
        Some(value) => Some(value.to_str().map_err(|_| HostRejection::NotAllowed)?),
        None => None,
    };
    let authority = req.uri().authority().map(|a| a.as_str());
    if header.is_none() && authority.is_none() {
        return if req.version() >= Version::HTTP_11 {
            Err(HostRejection::Missing)
        } else {
            Ok(())
        };
    }
    for host in header.into_iter().chain(authority) {
        if !is_loopback_host(host) {
            return Err(HostRejection::NotAllowed);
        }
    }
    Ok(())
}

/// True for `localhost`, `*.localhost`, `127.x.x.x` and `[::1]`, with or
/// without a `:port`, case-insensitively. Anything with userinfo, an empty
/// label or a malformed port is refused.
pub fn is_loopback_host(host: &str) -> bool {
    let host = host.trim();
    if host.contains('@') {
        return false;
    }
    let name = if let Some(rest) = host.strip_prefix('[') {
        // IPv6 literal: `[::1]` or `[::1]:port`.
        let Some((addr, after)) = rest.split_once(']') else {
            return false;
        };
        if !valid_port_suffix(after) {
            return false;
        }
        return addr
            .parse::<std::net::Ipv6Addr>()
            .is_ok_and(|ip| ip.is_loopback());
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) => {
                if !valid_port(port) {
                    return false;
                }
                name
            }
            None => host,
        }
    };
    if name.is_empty() {
        return false;
    }
    if let Ok(ip) = name.parse::<std::net::Ipv4Addr>() {
        return ip.is_loopback();
    }
    // A trailing dot is the same name, fully qualified.
    let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
    if name == "localhost" {
        return true;
    }
    match name.strip_suffix(".localhost") {
        Some(sub) => {
            !sub.is_empty()
                && sub.split('.').all(|label| {
                    !label.is_empty()
                        && label
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                })
        }
        None => false,
    }
}

fn valid_port_suffix(after: &str) -> bool {
    after.is_empty() || after.strip_prefix(':').is_some_and(valid_port)
}

fn valid_port(port: &str) -> bool {
    // An empty port (`localhost:`) is allowed by RFC 3986 and means default.
    port.is_empty() || (port.len() <= 5 && port.parse::<u16>().is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_names_pass() {
        for host in [
            "localhost",
            "LOCALHOST:7878",
            "localhost.",
            "app.localhost",
            "a.b.localhost:80",
            "127.0.0.1",
            "127.0.0.1:7878",
            "127.1.2.3:1",
            "[::1]",
            "[::1]:7878",
            "[0:0:0:0:0:0:0:1]:7878",
            "localhost:",
        ] {
            assert!(is_loopback_host(host), "{host}");
        }
    }

    #[test]
    fn other_names_fail() {
        for host in [
            "",
            ":7878",
            "evil.example.com",
            "evil.example.com:7878",
            "localhost.evil.example.com",
            "evillocalhost",
            ".localhost",
            "a..localhost",
            "128.0.0.1",
            "0.0.0.0:7878",
            "192.168.1.10",
            "[::2]:7878",
            "[::ffff:127.0.0.1]",
            "[::1",
            "::1",
            "localhost:99999",
            "localhost:80x",
            "user@localhost",
            "127.0.0.1.nip.io",
        ] {
            assert!(!is_loopback_host(host), "{host}");
        }
    }

    fn request(version: Version, host: Option<&str>, uri: &str) -> Request<()> {
        let mut b = Request::builder().version(version).uri(uri);
        if let Some(h) = host {
            b = b.header(HOST, h);
        }
        b.body(()).unwrap()
    }

    #[test]
    fn two_host_headers_are_refused_even_when_both_are_loopback() {
        let mut req = request(Version::HTTP_11, Some("localhost:7878"), "/");
        req.headers_mut()
            .append(HOST, http::HeaderValue::from_static("localhost:7878"));
        assert_eq!(check(&req), Err(HostRejection::Repeated));
    }

    #[test]
    fn missing_host_is_an_error_only_on_http_1_1() {
        assert_eq!(
            check(&request(Version::HTTP_11, None, "/")),
            Err(HostRejection::Missing)
        );
        assert_eq!(check(&request(Version::HTTP_10, None, "/")), Ok(()));
        assert_eq!(
            check(&request(Version::HTTP_11, Some("localhost:7878"), "/")),
            Ok(())
        );
        assert_eq!(
            check(&request(Version::HTTP_11, Some("evil.example.com"), "/")),
            Err(HostRejection::NotAllowed)
        );
    }

    #[test]
    fn absolute_form_authority_must_be_loopback_too() {
        assert_eq!(
            check(&request(
                Version::HTTP_11,
                Some("localhost"),
                "http://evil.example.com/api/v1/stats"
            )),
            Err(HostRejection::NotAllowed)
        );
        assert_eq!(
            check(&request(Version::HTTP_2, None, "http://127.0.0.1:7878/")),
            Ok(())
        );
    }
}
