//! Whether a route's upstream is one of speedtap's own listeners: such a
//! route would forward every request back into speedtap, which forwards it
//! again, call after call, until memory runs out. [`resolve`](super::resolve())
//! refuses it at start.
//!
//! The rule follows what a connect would reach: an upstream reaches a
//! listener when the ports match and the listener accepts on the
//! upstream's address, that is the same address, or a wildcard listener
//! (`0.0.0.0` for IPv4, `::` for both families) and an address of this
//! machine. `localhost` (and `*.localhost`, RFC 6761) is taken as both
//! loopback addresses. Other names are not resolved here: a start must not
//! wait on DNS, and a loop through a name that points back at this machine
//! is still stopped at run time, where the proxy answers a request arriving
//! over its own upstream connection `508 Loop Detected`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};

use crate::model::Upstream;

/// Whether a connection to `upstream` would reach `listener`. A listener on
/// port 0 (any free port) is reached by nothing known before it binds.
pub fn upstream_reaches(upstream: &Upstream, listener: SocketAddr) -> bool {
    listener.port() != 0
        && upstream.port == listener.port()
        && upstream_ips(&upstream.host)
            .into_iter()
            .any(|ip| accepts(listener.ip(), ip))
}

/// The addresses an upstream's host stands for, as far as they are known
/// without asking DNS.
fn upstream_ips(host: &str) -> Vec<IpAddr> {
    let lower = host.to_ascii_lowercase();
    if lower == "localhost" || lower.ends_with(".localhost") {
        return vec![
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(Ipv6Addr::LOCALHOST),
        ];
    }
    host.parse::<IpAddr>()
        .map(|ip| vec![ip.to_canonical()])
        .unwrap_or_default()
}

/// Whether a listener bound to `listen` accepts a connection to `to` (same
/// port assumed).
fn accepts(listen: IpAddr, to: IpAddr) -> bool {
    let listen = listen.to_canonical();
    // A connect to 0.0.0.0 or :: goes to this machine, to whichever
    // listener holds the port.
    if to.is_unspecified() || listen == to {
        return true;
    }
    match listen {
        IpAddr::V4(v4) if v4.is_unspecified() => to.is_ipv4() && is_local(to),
        // `::` takes IPv4 too (Linux's default, `bindv6only = 0`).
        IpAddr::V6(v6) if v6.is_unspecified() => is_local(to),
        _ => false,
    }
}

/// Whether `ip` is an address of this machine: a loopback one, or one a
/// socket can bind to (binding fails with "address not available" for an
/// address no interface holds). No packet is sent.
fn is_local(ip: IpAddr) -> bool {
    ip.is_loopback() || UdpSocket::bind(SocketAddr::new(ip, 0)).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn up(url: &str) -> Upstream {
        Upstream::parse(url).unwrap()
    }

    fn at(addr: &str) -> SocketAddr {
        addr.parse().unwrap()
    }

    #[test]
    fn an_upstream_on_a_listeners_own_address_reaches_it() {
        assert!(upstream_reaches(
            &up("http://127.0.0.1:9001"),
            at("127.0.0.1:9001")
        ));
        assert!(upstream_reaches(&up("http://[::1]:9001"), at("[::1]:9001")));
        assert!(!upstream_reaches(
            &up("http://127.0.0.1:9002"),
            at("127.0.0.1:9001")
        ));
        // Another loopback address is another socket.
        assert!(!upstream_reaches(
            &up("http://127.0.0.2:9001"),
            at("127.0.0.1:9001")
        ));
    }

    #[test]
    fn localhost_stands_for_both_loopback_addresses() {
        for url in ["http://localhost:9001", "http://LOCALHOST:9001/v1"] {
            assert!(upstream_reaches(&up(url), at("127.0.0.1:9001")), "{url}");
            assert!(upstream_reaches(&up(url), at("[::1]:9001")), "{url}");
        }
        assert!(upstream_reaches(
            &up("http://api.localhost:9001"),
            at("127.0.0.1:9001")
        ));
    }

    #[test]
    fn a_wildcard_listener_is_reached_by_any_address_of_this_machine() {
        assert!(upstream_reaches(
            &up("http://127.0.0.1:9001"),
            at("0.0.0.0:9001")
        ));
        assert!(upstream_reaches(
            &up("http://127.0.0.1:9001"),
            at("[::]:9001")
        ));
        assert!(upstream_reaches(&up("http://[::1]:9001"), at("[::]:9001")));
        // 0.0.0.0 listens on IPv4 only.
        assert!(!upstream_reaches(
            &up("http://[::1]:9001"),
            at("0.0.0.0:9001")
        ));
        // TEST-NET-3: no interface of a test machine holds it.
        assert!(!upstream_reaches(
            &up("http://203.0.113.7:9001"),
            at("0.0.0.0:9001")
        ));
    }

    #[test]
    fn an_unspecified_upstream_reaches_any_listener_on_its_port() {
        assert!(upstream_reaches(
            &up("http://0.0.0.0:9001"),
            at("127.0.0.1:9001")
        ));
    }

    #[test]
    fn a_listener_on_any_free_port_and_other_names_are_never_a_loop() {
        assert!(!upstream_reaches(
            &up("http://127.0.0.1:9001"),
            at("127.0.0.1:0")
        ));
        assert!(!upstream_reaches(
            &up("http://model-box:9001"),
            at("0.0.0.0:9001")
        ));
    }
}
