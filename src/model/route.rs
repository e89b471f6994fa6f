//! Routes: a listener and the upstream it forwards to, with the rules
//! every front end checks them by (`--route`, the config file, the settings
//! form).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

// ---------------------------------------------------------------------------
// Routes and upstreams
// ---------------------------------------------------------------------------

/// Longest accepted route name.
pub(crate) const MAX_ROUTE_NAME: usize = 64;

// ---------------------------------------------------------------------------
// Routes and upstreams
// ---------------------------------------------------------------------------

/// One listener and where it forwards to.
#[derive(Clone, Debug, PartialEq)]
pub struct RouteSpec {
    /// The route's name (`ollama`): shown everywhere, used in `?route=`.
    pub name: String,
    /// Where speedtap listens for this route.
    pub listen: SocketAddr,
    /// The base URL everything is forwarded to.
    pub upstream: Upstream,
}

impl RouteSpec {
    /// Builds a route after checking the name, listen address and upstream
    /// with the same rules as the config file and `--route`.
    pub fn new(name: &str, listen: &str, upstream: &str) -> Result<RouteSpec, String> {
        check_route_name(name)?;
        let listen = parse_listen(listen)?;
        let upstream = Upstream::parse(upstream)?;
        Ok(RouteSpec {
            name: name.to_string(),
            listen,
            upstream,
        })
    }
}

/// A parsed upstream base URL.
///
/// Only `http://` is accepted: speedtap taps plain-HTTP local servers and
/// does not originate TLS. The host may be a name, an IPv4 address or a
/// bracketed IPv6 address; the port defaults to 80 when absent; the base path
/// is kept without its trailing slash and is prefixed to every forwarded
/// request path (so `http://127.0.0.1:1337/v1` plus `/v1/models` forwards to
/// `/v1/v1/models`: give the server's root unless it really serves under a
/// prefix the clients don't send). Userinfo, query and fragment are rejected:
/// they have no sensible meaning for a base URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Upstream {
    /// Host name or IP address, IPv6 without brackets.
    pub host: String,
    /// TCP port (80 when the URL has none).
    pub port: u16,
    /// Base path, empty or starting with `/`, never ending with `/`.
    pub base_path: String,
}

impl Upstream {
    /// Parses `http://HOST[:PORT][/BASE]`.
    pub fn parse(s: &str) -> Result<Upstream, String> {
        let s = s.trim();
        let Some(scheme_end) = s.find("://") else {
            return Err(format!("upstream {s:?} is not an http:// URL"));
        };
        let scheme = &s[..scheme_end];
        if scheme.eq_ignore_ascii_case("https") {
            return Err(format!(
                "upstream {s:?}: https:// is not supported (speedtap taps plain-HTTP local servers); use http://"
            ));
        }
        if !scheme.eq_ignore_ascii_case("http") {
            return Err(format!("upstream {s:?} is not an http:// URL"));
        }
        let rest = &s[scheme_end + 3..];
        if rest.contains('?') || rest.contains('#') {
            return Err(format!(
                "upstream {s:?}: a base URL can't have a query or fragment"
            ));
        }
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        if authority.contains('@') {
            return Err(format!(
                "upstream {s:?}: credentials in the URL are not supported"
            ));
        }
        let (host, port) =
            split_host_port(authority).map_err(|e| format!("upstream {s:?}: {e}"))?;
        let port = port.unwrap_or(80);
        let base_path = path.trim_end_matches('/').to_string();
        if base_path
            .chars()
            .any(|c| c.is_whitespace() || c.is_control())
        {
            return Err(format!(
                "upstream {s:?}: the path contains spaces or control characters"
            ));
        }
        Ok(Upstream {
            host,
            port,
            base_path,
        })
    }

    /// `host:port`, IPv6 hosts bracketed: the `Host` header and what to
    /// connect to.
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// The full URL for a request: base path + the request's path and query.
    /// A `path_and_query` without a leading `/` gets one.
    pub fn join(&self, path_and_query: &str) -> String {
        let sep = if path_and_query.starts_with('/') {
            ""
        } else {
            "/"
        };
        format!("{}{sep}{path_and_query}", self.base_url())
    }

    /// `http://host:port[/base]`, the port always written out.
    pub fn base_url(&self) -> String {
        format!("http://{}{}", self.authority(), self.base_path)
    }
}

impl fmt::Display for Upstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.base_url())
    }
}

/// Splits `host[:port]` / `[v6][:port]`.
fn split_host_port(authority: &str) -> Result<(String, Option<u16>), String> {
    if authority.is_empty() {
        return Err("no host".into());
    }
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let Some(end) = rest.find(']') else {
            return Err("unclosed [ in the IPv6 address".into());
        };
        let host = &rest[..end];
        if host.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(format!("{host:?} is not an IPv6 address"));
        }
        let after = &rest[end + 1..];
        let port = match after.strip_prefix(':') {
            Some(p) => Some(p),
            None if after.is_empty() => None,
            None => return Err(format!("unexpected {after:?} after the address")),
        };
        (host.to_string(), port)
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (authority.to_string(), None),
        }
    };
    if host.is_empty() {
        return Err("no host".into());
    }
    // A bracketed host was checked as IPv6 above. Any other host must be a
    // plain name or IPv4 address: an unbracketed one with a `:` in it used
    // to pass unchecked and print back as an invalid `[...]` URL
    // (fuzz/regressions/config).
    if !authority.starts_with('[')
        && !host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_')
    {
        return Err(format!(
            "{host:?} is not a valid host (an IPv6 address goes in brackets: [::1])"
        ));
    }
    let port = match port {
        None => None,
        Some(p) => Some(
            p.parse::<u16>()
                .ok()
                .filter(|&p| p != 0)
                .ok_or_else(|| format!("{p:?} is not a valid port"))?,
        ),
    };
    Ok((host, port))
}

/// Parses a listen (or API) address: `IP:PORT`, `[v6]:PORT`, or
/// `localhost:PORT` (taken as 127.0.0.1, the address users mean by it; we
/// don't resolve names for listening). Port 0 is allowed and means "any free
/// port", mostly useful in tests.
pub fn parse_listen(s: &str) -> Result<SocketAddr, String> {
    let t = s.trim();
    if let Some(port) = t.strip_prefix("localhost:") {
        return port
            .parse::<u16>()
            .map(|p| SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), p))
            .map_err(|_| format!("{s:?} is not a HOST:PORT address"));
    }
    t.parse::<SocketAddr>()
        .map_err(|_| format!("{s:?} is not a HOST:PORT address (e.g. 127.0.0.1:11435)"))
}

/// Route names appear in URLs (`?route=`), metric labels and the UI, so
/// they stay short and plain: ASCII letters, digits, `-`, `_`, `.`.
pub fn check_route_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("the route name is empty".into());
    }
    if name.len() > MAX_ROUTE_NAME {
        return Err(format!(
            "route name {name:?} is longer than {MAX_ROUTE_NAME} characters"
        ));
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err(format!(
            "route name {name:?} may only hold letters, digits, '-', '_' and '.'"
        ));
    }
    Ok(())
}

/// A route measured by the passive capture alone: no listener is opened.
///
/// A separate type and list rather than an optional listen address on
/// [`RouteSpec`]: every proxy path (binding, the settings document, the
/// tray) relies on a route having a listener, and making that optional
/// would ripple through all of them for a route none of them serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaptureOnlyRoute {
    /// The route's name, as for a proxy route.
    pub name: String,
    /// The model server; its port is captured.
    pub upstream: Upstream,
}

/// `--route NAME=UPSTREAM` (one `=` before the URL's scheme): a
/// capture-only route, or `None` when `s` names a listen address too
/// (`NAME=LISTEN=UPSTREAM`, see [`parse_route_flag`]).
pub fn parse_capture_route_flag(s: &str) -> Option<Result<CaptureOnlyRoute, String>> {
    let (name, rest) = s.split_once('=')?;
    // NAME=http://... : the second part is already the URL.
    if !(rest.starts_with("http://") || rest.starts_with("https://")) {
        return None;
    }
    if name.is_empty() {
        return Some(Err(format!("{s:?}: expected NAME=UPSTREAM")));
    }
    Some(Upstream::parse(rest).map(|upstream| CaptureOnlyRoute {
        name: name.to_owned(),
        upstream,
    }))
}

/// `--route NAME=LISTEN=UPSTREAM`, split on the first two `=` (the upstream
/// URL may contain `=`).
pub fn parse_route_flag(s: &str) -> Result<RouteSpec, String> {
    const USAGE: &str =
        "expected NAME=LISTEN=UPSTREAM, e.g. ollama=127.0.0.1:11435=http://127.0.0.1:11434";
    let mut parts = s.splitn(3, '=');
    let (Some(name), Some(listen), Some(upstream)) = (parts.next(), parts.next(), parts.next())
    else {
        return Err(format!("{s:?}: {USAGE}"));
    };
    if name.is_empty() || listen.is_empty() || upstream.is_empty() {
        return Err(format!("{s:?}: {USAGE}"));
    }
    RouteSpec::new(name, listen, upstream)
}
