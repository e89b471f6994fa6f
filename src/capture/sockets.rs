//! Whether a captured connection still exists: the kernel's own socket
//! table, as the last word on a flow whose end the capture missed.
//!
//! A packet socket can drop a connection's last packets (its FIN, its
//! RST, the end of a response) under a burst. Without them the connection
//! table would wait for bytes that never come, and the call would stay in
//! flight long after its client finished. The kernel knows better: a
//! loopback connection whose two sockets are both gone, or both past the
//! point of sending (`TIME_WAIT`, `FIN_WAIT2`, `LAST_ACK`, ...), will carry
//! no more bytes, so the engine ends it ([`crate::capture::flows::Flows::end`]).
//!
//! Read from `/proc/net/tcp` and `/proc/net/tcp6` through the `procfs`
//! crate (no privilege needed); behind a trait so the pure core's tests
//! decide what the kernel says.

use std::collections::HashSet;
use std::net::SocketAddr;

use procfs::net::{TcpNetEntry, TcpState};

/// An address pair `(local, remote)` of one socket.
pub type Pair = (SocketAddr, SocketAddr);

/// Which TCP sockets can still send.
pub trait SocketTable: Send {
    /// The `(local, remote)` pairs of the sockets that can still send
    /// bytes, or `None` when the table can't be read (then no connection
    /// is taken for gone: a missing table is no evidence).
    fn open_pairs(&mut self) -> Option<HashSet<Pair>>;
}

/// The kernel's table, read from `/proc/net/tcp{,6}`.
#[derive(Clone, Copy, Debug, Default)]
pub struct ProcNetTcp;

impl SocketTable for ProcNetTcp {
    fn open_pairs(&mut self) -> Option<HashSet<Pair>> {
        let mut entries = procfs::net::tcp().ok()?;
        // No IPv6 on the machine is no reason to know nothing.
        entries.extend(procfs::net::tcp6().unwrap_or_default());
        Some(open_pairs(entries.iter().map(|e: &TcpNetEntry| {
            (e.local_address, e.remote_address, e.state.clone())
        })))
    }
}

/// The pairs of the entries whose socket can still send: established, or
/// half-closed on the other side only (`CLOSE_WAIT`: a server may still
/// answer a client that shut down its sending side), or still opening.
pub fn open_pairs(
    entries: impl IntoIterator<Item = (SocketAddr, SocketAddr, TcpState)>,
) -> HashSet<Pair> {
    entries
        .into_iter()
        .filter(|(_, _, state)| {
            matches!(
                state,
                TcpState::Established
                    | TcpState::CloseWait
                    | TcpState::SynSent
                    | TcpState::SynRecv
                    | TcpState::NewSynRecv
            )
        })
        .map(|(local, remote, _)| (canonical(local), canonical(remote)))
        .collect()
}

/// Whether the connection between `client` and `server` is gone: neither
/// side's socket can send any more.
pub fn is_gone(open: &HashSet<Pair>, client: SocketAddr, server: SocketAddr) -> bool {
    let (client, server) = (canonical(client), canonical(server));
    !open.contains(&(client, server)) && !open.contains(&(server, client))
}

/// An IPv4-mapped IPv6 address (`::ffff:127.0.0.1`, how a dual-stack
/// listener's sockets are listed) as the IPv4 address the packets carry.
fn canonical(addr: SocketAddr) -> SocketAddr {
    SocketAddr::new(addr.ip().to_canonical(), addr.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(local: &str, remote: &str, state: TcpState) -> (SocketAddr, SocketAddr, TcpState) {
        (
            local.parse().expect("local"),
            remote.parse().expect("remote"),
            state,
        )
    }

    const CLIENT: &str = "127.0.0.1:50000";
    const SERVER: &str = "127.0.0.1:11434";

    fn gone(entries: &[(SocketAddr, SocketAddr, TcpState)]) -> bool {
        is_gone(
            &open_pairs(entries.iter().cloned()),
            CLIENT.parse().expect("client"),
            SERVER.parse().expect("server"),
        )
    }

    #[test]
    fn a_connection_with_an_established_side_is_not_gone() {
        assert!(!gone(&[entry(SERVER, CLIENT, TcpState::Established)]));
        assert!(!gone(&[entry(CLIENT, SERVER, TcpState::Established)]));
    }

    #[test]
    fn a_server_still_able_to_answer_a_half_closed_client_is_not_gone() {
        assert!(!gone(&[
            entry(CLIENT, SERVER, TcpState::FinWait2),
            entry(SERVER, CLIENT, TcpState::CloseWait),
        ]));
    }

    #[test]
    fn a_connection_absent_or_closing_on_both_sides_is_gone() {
        assert!(gone(&[]));
        assert!(gone(&[
            entry(CLIENT, SERVER, TcpState::TimeWait),
            entry(SERVER, CLIENT, TcpState::LastAck),
        ]));
        // Another connection to the same server says nothing of this one.
        assert!(gone(&[entry(
            SERVER,
            "127.0.0.1:50001",
            TcpState::Established
        )]));
    }

    #[test]
    fn a_dual_stack_listeners_mapped_address_matches_the_ipv4_packets() {
        assert!(!gone(&[entry(
            "[::ffff:127.0.0.1]:11434",
            "[::ffff:127.0.0.1]:50000",
            TcpState::Established
        )]));
    }
}
