//! Ports the tray app wanted but could not have. `speedtap run` stops on a
//! taken port (exit code 1, the message on the terminal); the tray app is
//! started from a menu or at login, where nobody reads a terminal, so it
//! starts without the listeners it could not bind and shows why instead:
//! the tray icon and a menu line ([`crate::tray`]), a notification, and
//! the window's banner (the `port_conflicts` command), which names what
//! holds the port where Linux tells (`/proc/net/tcp*` gives the listening
//! socket's inode, `/proc/<pid>/fd` the process that has it open) and
//! offers the next free port for a route (`use_free_port`).
//!
//! The parsing is pure and unit-tested; [`PortConflict::find`] reads
//! `/proc` and probes ports.

use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};

use serde::Serialize;
use speedtap::model::RouteSpec;

/// How far past the taken port [`next_free_port`] looks.
const FREE_PORT_SEARCH: u16 = 100;

/// A listener the app could not bind.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PortConflict {
    /// `route NAME` or `control API`, as the engine names its listeners.
    pub what: String,
    /// The route's name; `None` for the control API.
    pub route: Option<String>,
    /// The address asked for (`127.0.0.1:8081`).
    pub listen: String,
    pub port: u16,
    /// The bind error (`Address already in use (os error 98)`).
    pub error: String,
    /// Who listens there, when `/proc` tells.
    pub holder: Option<Holder>,
    /// The next port on the same address that is free now.
    pub next_free: Option<String>,
    /// The route to start on `next_free` (not sent to the page).
    #[serde(skip)]
    pub spec: Option<RouteSpec>,
}

/// A process holding a port.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Holder {
    pub pid: u32,
    /// `/proc/<pid>/comm`, e.g. `speedtap`.
    pub name: String,
    /// The command line, arguments joined by spaces (at most 200 chars).
    pub command: String,
}

impl PortConflict {
    /// Describes a failed bind of `addr` (`what` as the engine names it),
    /// looking up the holder and the next free port.
    pub fn find(
        what: &str,
        addr: SocketAddr,
        error: &std::io::Error,
        spec: Option<RouteSpec>,
    ) -> Self {
        PortConflict {
            what: what.to_owned(),
            route: what.strip_prefix("route ").map(str::to_owned),
            listen: addr.to_string(),
            port: addr.port(),
            error: error.to_string(),
            holder: holder_of(addr),
            next_free: next_free_port(addr).map(|a| a.to_string()),
            spec,
        }
    }

    /// The tray menu's line: `Port 8081 taken (route ollama) by speedtap, pid 4242`.
    pub fn menu_line(&self) -> String {
        let by = match &self.holder {
            Some(h) => format!(" by {}, pid {}", h.name, h.pid),
            None => String::new(),
        };
        format!("Port {} taken ({}){by}", self.port, self.what)
    }

    /// One sentence for a notification or a log line.
    pub fn sentence(&self) -> String {
        let by = match &self.holder {
            Some(h) => format!("; {} (pid {}) is listening there", h.name, h.pid),
            None => String::new(),
        };
        let offer = match (&self.route, &self.next_free) {
            (Some(_), Some(free)) => format!(". {free} is free: open speedtap to use it"),
            _ => String::new(),
        };
        format!(
            "{} did not start: cannot listen on {}: {}{by}{offer}",
            self.what, self.listen, self.error
        )
    }
}

/// The conflicts found at start (managed state), shared by the tray, the
/// commands and the start-up notification.
#[derive(Clone, Default)]
pub struct Conflicts(pub Arc<Mutex<Vec<PortConflict>>>);

impl Conflicts {
    pub fn new(list: Vec<PortConflict>) -> Self {
        Conflicts(Arc::new(Mutex::new(list)))
    }

    pub fn list(&self) -> Vec<PortConflict> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Removes the conflict of `route` (it now runs on another port).
    pub fn resolve(&self, route: &str) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|c| c.route.as_deref() != Some(route));
    }
}

/// The first port after `addr`'s on the same IP that can be bound now.
pub fn next_free_port(addr: SocketAddr) -> Option<SocketAddr> {
    (1..=FREE_PORT_SEARCH)
        .filter_map(|d| addr.port().checked_add(d))
        .map(|port| SocketAddr::new(addr.ip(), port))
        .find(|a| TcpListener::bind(a).is_ok())
}

/// The process listening on `addr`'s port, from `/proc` (Linux). `None`
/// elsewhere, or when the holder is another user's process we may not
/// look into.
pub fn holder_of(addr: SocketAddr) -> Option<Holder> {
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        if let Ok(text) = std::fs::read_to_string(table) {
            inodes.extend(listening_inodes(&text, addr.port()));
        }
    }
    if inodes.is_empty() {
        return None;
    }
    let targets: Vec<String> = inodes.iter().map(|i| format!("socket:[{i}]")).collect();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        let holds = fds.flatten().any(|fd| {
            std::fs::read_link(fd.path())
                .map(|link| targets.iter().any(|t| link.as_os_str() == t.as_str()))
                .unwrap_or(false)
        });
        if holds {
            let read = |f: &str| std::fs::read(entry.path().join(f)).unwrap_or_default();
            let name = String::from_utf8_lossy(&read("comm")).trim().to_owned();
            return Some(Holder {
                pid,
                name,
                command: command_line(&read("cmdline")),
            });
        }
    }
    None
}

/// `/proc/<pid>/cmdline` (NUL-separated) as one line, at most 200 chars.
fn command_line(raw: &[u8]) -> String {
    let line = raw
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(String::from_utf8_lossy)
        .collect::<Vec<_>>()
        .join(" ");
    line.chars().take(200).collect()
}

/// The inodes of the sockets listening on `port` in a `/proc/net/tcp` or
/// `/proc/net/tcp6` table (`local_address` is `HEXIP:HEXPORT`, state `0A`
/// is LISTEN, the inode is the tenth column).
pub fn listening_inodes(table: &str, port: u16) -> Vec<u64> {
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let cols: Vec<&str> = line.split_whitespace().collect();
            let local = cols.get(1)?;
            let state = cols.get(3)?;
            let inode = cols.get(9)?.parse::<u64>().ok()?;
            let (_, hex_port) = local.rsplit_once(':')?;
            let p = u16::from_str_radix(hex_port, 16).ok()?;
            (p == port && *state == "0A" && inode != 0).then_some(inode)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TCP: &str = "\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F91 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 424242 1 0000000000000000 100 0 0 10 0
   1: 0100007F:1F91 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 515151 1 0000000000000000 20 4 30 10 -1
   2: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 777 1 0000000000000000 100 0 0 10 0
";

    #[test]
    fn only_the_listening_socket_on_the_port_is_found() {
        // 0x1F91 = 8081: the listener, not the connection in state 01.
        assert_eq!(listening_inodes(TCP, 8081), vec![424242]);
        assert_eq!(listening_inodes(TCP, 8080), vec![777]);
        assert!(listening_inodes(TCP, 9999).is_empty());
        assert!(listening_inodes("garbage\nmore garbage", 8081).is_empty());
    }

    #[test]
    fn a_taken_port_names_its_holder_and_the_next_free_port() {
        let taken = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap();
        let err = TcpListener::bind(addr).unwrap_err();
        let c = PortConflict::find("route ollama", addr, &err, None);
        assert_eq!(c.route.as_deref(), Some("ollama"));
        assert_eq!(c.port, addr.port());
        let holder = c.holder.clone().expect("this test process holds the port");
        assert_eq!(holder.pid, std::process::id());
        let free: SocketAddr = c.next_free.as_deref().unwrap().parse().unwrap();
        assert!(free.port() > addr.port());
        assert!(
            c.menu_line()
                .starts_with(&format!("Port {} taken (route ollama) by ", addr.port())),
            "{}",
            c.menu_line()
        );
        assert!(
            c.sentence().contains("is free: open speedtap"),
            "{}",
            c.sentence()
        );
    }

    #[test]
    fn the_control_api_has_no_route_and_no_offer() {
        let err = std::io::Error::from(std::io::ErrorKind::AddrInUse);
        let mut c = PortConflict::find("control API", "127.0.0.1:1".parse().unwrap(), &err, None);
        c.holder = None;
        assert_eq!(c.route, None);
        assert_eq!(c.menu_line(), "Port 1 taken (control API)");
        assert!(!c.sentence().contains("is free"), "{}", c.sentence());
    }

    #[test]
    fn a_command_line_is_joined_and_capped() {
        assert_eq!(
            command_line(b"speedtap\0run\0--route\0a\0"),
            "speedtap run --route a"
        );
        assert_eq!(command_line(&[b'x'; 300]).len(), 200);
    }

    #[test]
    fn resolving_a_route_removes_only_its_conflict() {
        let err = std::io::Error::from(std::io::ErrorKind::AddrInUse);
        let a = PortConflict::find("route a", "127.0.0.1:1".parse().unwrap(), &err, None);
        let api = PortConflict::find("control API", "127.0.0.1:2".parse().unwrap(), &err, None);
        let conflicts = Conflicts::new(vec![a, api]);
        conflicts.resolve("a");
        let left = conflicts.list();
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].what, "control API");
    }
}
