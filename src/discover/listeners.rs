//! The machine's listening TCP sockets, from the kernel's own table, and
//! what changed between two readings.
//!
//! The table is read from `/proc/net/tcp` and `/proc/net/tcp6` (parsed by
//! the `procfs` crate), not through netlink `sock_diag`: the files need no
//! privilege and no netlink code, they show the same sockets for the
//! network namespace speedtap runs in, and on a desktop they hold a few
//! dozen lines. `sock_diag` would filter listeners in the kernel, which
//! only pays off with tens of thousands of open connections, and reading
//! the files then still takes well under a millisecond per look.
//!
//! Only listeners a local client can reach over loopback count: loopback
//! addresses (127.0.0.0/8, `::1`) and the wildcard addresses (`0.0.0.0`,
//! `::`). A socket bound to one LAN address alone is not on loopback, so
//! neither a local client nor the capture (on `lo`) meets it there.
//!
//! Listeners are grouped by port: a server that binds both `0.0.0.0` and
//! `::` is one server. A port whose sockets were all replaced between two
//! readings (no inode in common) was closed and opened again: the server
//! restarted, or another process took the port.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::net::IpAddr;
use std::path::Path;

use procfs::net::{TcpNetEntries, TcpNetEntry, TcpState};
use procfs::FromReadSI;

/// Everything listening on one port, as one reading saw it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PortListeners {
    /// The addresses bound (loopback or wildcard), in order.
    pub addresses: BTreeSet<IpAddr>,
    /// The sockets' inodes: the key from a socket to its owning process
    /// (`/proc/PID/fd/N -> socket:[INODE]`).
    pub inodes: BTreeSet<u64>,
    /// The owning user of the first socket seen (all of a server's sockets
    /// share it).
    pub uid: u32,
}

/// One reading of the listening sockets, by port.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListenerTable {
    pub ports: BTreeMap<u16, PortListeners>,
}

/// What changed on one port between two readings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListenerChange {
    /// Something listens where nothing did.
    Appeared { port: u16, now: PortListeners },
    /// Nothing listens any more.
    Gone { port: u16, was: PortListeners },
    /// Still listening, but on sockets that are all new: restarted, or
    /// taken by another process.
    Replaced {
        port: u16,
        was: PortListeners,
        now: PortListeners,
    },
}

impl ListenerChange {
    /// The port the change is about.
    pub fn port(&self) -> u16 {
        match self {
            ListenerChange::Appeared { port, .. }
            | ListenerChange::Gone { port, .. }
            | ListenerChange::Replaced { port, .. } => *port,
        }
    }
}

impl ListenerTable {
    /// Reads `<proc_root>/net/tcp` and `<proc_root>/net/tcp6`. A missing
    /// `tcp6` (IPv6 disabled) is an empty one; a missing `tcp` is an error.
    pub fn read(proc_root: &Path) -> io::Result<ListenerTable> {
        let mut entries = read_entries(&proc_root.join("net/tcp"))?;
        match read_entries(&proc_root.join("net/tcp6")) {
            Ok(v6) => entries.extend(v6),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        Ok(ListenerTable::from_entries(&entries))
    }

    /// The listeners among `entries` that loopback clients can reach.
    pub fn from_entries(entries: &[TcpNetEntry]) -> ListenerTable {
        let mut table = ListenerTable::default();
        for entry in entries {
            let ip = canonical(entry.local_address.ip());
            if entry.state != TcpState::Listen || !(ip.is_loopback() || ip.is_unspecified()) {
                continue;
            }
            let port = table
                .ports
                .entry(entry.local_address.port())
                .or_insert_with(|| PortListeners {
                    uid: entry.uid,
                    ..PortListeners::default()
                });
            port.addresses.insert(ip);
            port.inodes.insert(entry.inode);
        }
        table
    }

    /// What changed from `before` to `self`, in port order.
    pub fn changes_since(&self, before: &ListenerTable) -> Vec<ListenerChange> {
        let ports: BTreeSet<u16> = before
            .ports
            .keys()
            .chain(self.ports.keys())
            .copied()
            .collect();
        ports
            .into_iter()
            .filter_map(
                |port| match (before.ports.get(&port), self.ports.get(&port)) {
                    (None, Some(now)) => Some(ListenerChange::Appeared {
                        port,
                        now: now.clone(),
                    }),
                    (Some(was), None) => Some(ListenerChange::Gone {
                        port,
                        was: was.clone(),
                    }),
                    (Some(was), Some(now)) if was.inodes.is_disjoint(&now.inodes) => {
                        Some(ListenerChange::Replaced {
                            port,
                            was: was.clone(),
                            now: now.clone(),
                        })
                    }
                    _ => None,
                },
            )
            .collect()
    }
}

/// An IPv4-mapped IPv6 address (`::ffff:127.0.0.1`) as the IPv4 address
/// it is, so its loopback-ness is judged right.
pub(super) fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

pub(super) fn read_entries(path: &Path) -> io::Result<Vec<TcpNetEntry>> {
    let file = std::fs::File::open(path)?;
    TcpNetEntries::from_read(file, procfs::current_system_info())
        .map(|entries| entries.0)
        .map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {e}", path.display()),
            )
        })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A `/proc/net/tcp` header line, as the kernel writes it.
    pub(crate) const TCP_HEADER: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n";

    /// One `/proc/net/tcp` line for an IPv4 socket (little-endian hex, as
    /// on x86 and arm).
    pub(crate) fn tcp4_line(ip: [u8; 4], port: u16, state: u8, uid: u32, inode: u64) -> String {
        let addr = u32::from_le_bytes(ip);
        format!(
            "   0: {addr:08X}:{port:04X} 00000000:0000 {state:02X} 00000000:00000000 00:00000000 00000000 {uid:>5}        0 {inode} 1 0000000000000000 100 0 0 10 0\n"
        )
    }

    /// One `/proc/net/tcp6` line for `::` (wildcard) or `::1` (loopback).
    pub(crate) fn tcp6_line(loopback: bool, port: u16, state: u8, inode: u64) -> String {
        let addr = if loopback {
            "00000000000000000000000001000000"
        } else {
            "00000000000000000000000000000000"
        };
        format!(
            "   0: {addr}:{port:04X} 00000000000000000000000000000000:0000 {state:02X} 00000000:00000000 00:00000000 00000000  1000        0 {inode} 1 0000000000000000 100 0 0 10 0\n"
        )
    }

    const LISTEN: u8 = 0x0A;
    const ESTABLISHED: u8 = 0x01;

    fn fake_proc(tcp: &str, tcp6: Option<&str>) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("net")).unwrap();
        std::fs::write(dir.path().join("net/tcp"), format!("{TCP_HEADER}{tcp}")).unwrap();
        if let Some(tcp6) = tcp6 {
            std::fs::write(dir.path().join("net/tcp6"), format!("{TCP_HEADER}{tcp6}")).unwrap();
        }
        dir
    }

    #[test]
    fn only_listening_sockets_on_loopback_or_wildcard_addresses_count() {
        let tcp = [
            tcp4_line([127, 0, 0, 1], 11434, LISTEN, 999, 100),
            tcp4_line([0, 0, 0, 0], 8080, LISTEN, 1000, 101),
            tcp4_line([192, 168, 1, 20], 9000, LISTEN, 1000, 102),
            tcp4_line([127, 0, 0, 1], 40000, ESTABLISHED, 1000, 103),
        ]
        .concat();
        let tcp6 = [
            tcp6_line(false, 8080, LISTEN, 104),
            tcp6_line(true, 1234, LISTEN, 105),
        ]
        .concat();
        let dir = fake_proc(&tcp, Some(&tcp6));
        let table = ListenerTable::read(dir.path()).unwrap();
        assert_eq!(
            table.ports.keys().copied().collect::<Vec<_>>(),
            vec![1234, 8080, 11434]
        );
        let both = &table.ports[&8080];
        assert_eq!(
            both.inodes,
            BTreeSet::from([101, 104]),
            "v4 and v6 wildcard are one server"
        );
        assert_eq!(both.addresses.len(), 2);
        assert_eq!(table.ports[&11434].uid, 999);
    }

    #[test]
    fn a_missing_tcp6_table_reads_as_no_ipv6_listeners() {
        let dir = fake_proc(&tcp4_line([127, 0, 0, 1], 8080, LISTEN, 1000, 7), None);
        let table = ListenerTable::read(dir.path()).unwrap();
        assert_eq!(table.ports.len(), 1);
    }

    #[test]
    fn a_table_that_is_not_the_kernels_format_is_an_error_naming_the_file() {
        let dir = fake_proc("   0: garbage\n", None);
        let err = ListenerTable::read(dir.path()).unwrap_err();
        assert!(err.to_string().contains("net/tcp"), "{err}");
    }

    fn table(ports: &[(u16, &[u64])]) -> ListenerTable {
        ListenerTable {
            ports: ports
                .iter()
                .map(|(port, inodes)| {
                    (
                        *port,
                        PortListeners {
                            inodes: inodes.iter().copied().collect(),
                            ..PortListeners::default()
                        },
                    )
                })
                .collect(),
        }
    }

    #[test]
    fn a_new_port_appears_a_closed_one_is_gone_and_a_reopened_one_is_replaced() {
        let before = table(&[(8080, &[1]), (11434, &[2, 3]), (1234, &[4])]);
        let after = table(&[(8080, &[1]), (11434, &[5]), (9931, &[6])]);
        let changes: Vec<(u16, &str)> = after
            .changes_since(&before)
            .iter()
            .map(|c| {
                let what = match c {
                    ListenerChange::Appeared { .. } => "appeared",
                    ListenerChange::Gone { .. } => "gone",
                    ListenerChange::Replaced { .. } => "replaced",
                };
                (c.port(), what)
            })
            .collect();
        assert_eq!(
            changes,
            vec![(1234, "gone"), (9931, "appeared"), (11434, "replaced")]
        );
    }

    #[test]
    fn a_server_that_adds_a_second_socket_on_its_port_is_not_a_change() {
        let before = table(&[(8080, &[1])]);
        let after = table(&[(8080, &[1, 2])]);
        assert!(after.changes_since(&before).is_empty());
    }
}
