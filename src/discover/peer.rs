//! Who holds the client end of a connection, among a few processes: how a
//! relay's leg is told apart (a connection to a measured server whose
//! client end a followed server's process holds; `engine::relay`).
//!
//! Two reads of `/proc` (through `procfs`, under a root tests replace):
//! the kernel's TCP table for the connection's socket inode, then the
//! descriptors of the candidate processes only (a handful of followed
//! servers, never every process). A connection already gone, or a
//! candidate whose descriptors can't be read, holds nothing.

use std::net::SocketAddr;
use std::path::Path;

use procfs::process::Process;

use super::listeners::{canonical, read_entries};
use super::owner::socket_inodes;

/// The inode of the socket whose local end is `client` and remote end is
/// `server` (the client side of that connection), from `<proc_root>/net/tcp`
/// and `tcp6`.
pub fn client_socket(proc_root: &Path, client: SocketAddr, server: SocketAddr) -> Option<u64> {
    let same = |a: SocketAddr, b: SocketAddr| {
        a.port() == b.port() && canonical(a.ip()) == canonical(b.ip())
    };
    ["net/tcp", "net/tcp6"]
        .iter()
        .filter_map(|table| read_entries(&proc_root.join(table)).ok())
        .flatten()
        .find(|e| same(e.local_address, client) && same(e.remote_address, server))
        .map(|e| e.inode)
        .filter(|inode| *inode != 0)
}

/// Which of `pids` holds the socket `inode`, if any.
pub fn holder(proc_root: &Path, inode: u64, pids: &[i32]) -> Option<i32> {
    pids.iter().copied().find(|pid| {
        Process::new_with_root(proc_root.join(pid.to_string()))
            .is_ok_and(|p| socket_inodes(&p).any(|held| held == inode))
    })
}

/// Which of `pids` holds the client end of the `client -> server`
/// connection.
pub fn client_process(
    proc_root: &Path,
    client: SocketAddr,
    server: SocketAddr,
    pids: &[i32],
) -> Option<i32> {
    if pids.is_empty() {
        return None;
    }
    holder(proc_root, client_socket(proc_root, client, server)?, pids)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discover::listeners::tests::TCP_HEADER;
    use crate::discover::owner::tests::fake_process;

    /// One established IPv4 connection's line, as the kernel writes it.
    fn connection_line(local: u16, remote: u16, inode: u64) -> String {
        let lo = u32::from_le_bytes([127, 0, 0, 1]);
        format!(
            "   1: {lo:08X}:{local:04X} {lo:08X}:{remote:04X} 01 00000000:00000000 00:00000000 00000000     0        0 {inode} 1 0000000000000000 20 4 30 10 -1\n"
        )
    }

    fn fake_proc(lines: &[String]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("net")).unwrap();
        std::fs::write(
            dir.path().join("net/tcp"),
            format!("{TCP_HEADER}{}", lines.concat()),
        )
        .unwrap();
        dir
    }

    fn at(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    #[test]
    fn the_process_holding_a_connections_client_end_is_found_among_the_candidates() {
        // A relay (pid 40) listens on 4000 and called the server on 11434
        // from port 51000; a curl (pid 50) called the server from 52000.
        let proc = fake_proc(&[
            connection_line(51000, 11434, 700),
            connection_line(11434, 51000, 701),
            connection_line(52000, 11434, 800),
        ]);
        fake_process(proc.path(), 40, 1, "litellm", &["litellm"], &[600, 700]);
        fake_process(proc.path(), 50, 1, "curl", &["curl"], &[800]);
        let root = proc.path();
        assert_eq!(client_socket(root, at(51000), at(11434)), Some(700));
        assert_eq!(client_process(root, at(51000), at(11434), &[40]), Some(40));
        assert_eq!(
            client_process(root, at(52000), at(11434), &[40]),
            None,
            "curl is no relay"
        );
        assert_eq!(client_process(root, at(51000), at(11434), &[]), None);
    }

    #[test]
    fn a_connection_already_gone_has_no_holder() {
        let proc = fake_proc(&[]);
        fake_process(proc.path(), 40, 1, "litellm", &["litellm"], &[700]);
        assert_eq!(
            client_process(proc.path(), at(51000), at(11434), &[40]),
            None
        );
    }
}
