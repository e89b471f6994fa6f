//! The watcher's bookkeeping, apart from its I/O: which listeners appeared
//! or went away since the last look, which of them deserve a probe, and
//! which server each answer is, under its stable name.
//!
//! Everything here takes the kernel's table, the owners and the clock as
//! arguments, so the whole lifecycle (appear, probe, name, down, back) is
//! tested against fake readings without a process or a socket.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::SystemTime;

use crate::discover::known::{decide, process_kind, ProbeReason};
use crate::discover::listeners::{ListenerChange, ListenerTable, PortListeners};
use crate::discover::owner::Owner;
use crate::discover::registry::{Arrival, KnownServer, Registry, ServerIdentity};
use crate::discover::ServerKind;

/// How many looks a listener worth probing gets to answer as a model
/// server: a server may listen before it answers (llama-server while it
/// loads its model), so it is asked again on each look, for about two
/// minutes at the usual interval, then left alone until it restarts.
pub(crate) const PROBE_ATTEMPTS: u32 = 24;

/// A listener to probe: where, whose, and why.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Candidate {
    pub port: u16,
    /// The loopback address to ask it at (IPv4 where it listens there).
    pub host: IpAddr,
    /// The owning process, where it can be read.
    pub owner: Option<Owner>,
    pub reason: ProbeReason,
    /// Probes made so far without an answer.
    pub attempts: u32,
}

/// What one look found.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Observed {
    /// Listeners to probe now (new ones, and earlier ones still silent).
    pub probe: Vec<Candidate>,
    /// Ports nothing listens on any more (or taken over), with the names
    /// of the servers that went down there.
    pub down: Vec<(u16, Vec<String>)>,
}

/// The listeners seen, the ones awaiting an answer, and the servers known.
pub(crate) struct Follow {
    table: ListenerTable,
    pending: BTreeMap<u16, Candidate>,
    pub(crate) registry: Registry,
    watch_ports: Vec<u16>,
    own_pid: i32,
    /// speedtap's own listen ports (proxy routes, control API).
    own_ports: BTreeSet<u16>,
}

impl Follow {
    pub(crate) fn new(
        registry: Registry,
        watch_ports: Vec<u16>,
        own_pid: i32,
        own_ports: BTreeSet<u16>,
    ) -> Follow {
        Follow {
            table: ListenerTable::default(),
            pending: BTreeMap::new(),
            registry,
            watch_ports,
            own_pid,
            own_ports,
        }
    }

    /// A port speedtap itself listens on from now (a proxy route it
    /// opened): never a server to follow.
    pub(crate) fn own_port(&mut self, port: u16) {
        self.own_ports.insert(port);
    }

    /// Takes a new reading of the listeners. `owners` finds the processes
    /// behind socket inodes (only asked when something appeared).
    pub(crate) fn observe(
        &mut self,
        table: ListenerTable,
        owners: impl FnOnce(&BTreeSet<u64>) -> HashMap<u64, Owner>,
        now: SystemTime,
    ) -> Observed {
        let changes = table.changes_since(&self.table);
        self.table = table;
        let mut observed = Observed::default();
        let mut appeared: Vec<(u16, PortListeners)> = Vec::new();
        for change in changes {
            match change {
                ListenerChange::Appeared { port, now: l } => appeared.push((port, l)),
                ListenerChange::Gone { port, .. } => observed.down.push(self.gone(port, now)),
                ListenerChange::Replaced { port, now: l, .. } => {
                    observed.down.push(self.gone(port, now));
                    appeared.push((port, l));
                }
            }
        }
        observed.down.retain(|(_, names)| !names.is_empty());
        self.consider(appeared, owners);
        observed.probe = self.pending.values().cloned().collect();
        observed
    }

    /// Nothing (or something new) listens on `port`: forget its probe and
    /// mark its server down.
    fn gone(&mut self, port: u16, now: SystemTime) -> (u16, Vec<String>) {
        self.pending.remove(&port);
        (port, self.registry.down(port, now))
    }

    /// Decides which appeared listeners to probe, from their owners.
    fn consider(
        &mut self,
        appeared: Vec<(u16, PortListeners)>,
        owners: impl FnOnce(&BTreeSet<u64>) -> HashMap<u64, Owner>,
    ) {
        let appeared: Vec<_> = appeared
            .into_iter()
            .filter(|(port, _)| !self.own_ports.contains(port))
            .collect();
        if appeared.is_empty() {
            return;
        }
        let inodes: BTreeSet<u64> = appeared
            .iter()
            .flat_map(|(_, l)| l.inodes.iter().copied())
            .collect();
        let owners = owners(&inodes);
        for (port, listeners) in appeared {
            let owner = listeners
                .inodes
                .iter()
                .find_map(|inode| owners.get(inode))
                .cloned();
            let Ok(reason) = decide(port, owner.as_ref(), &self.watch_ports, self.own_pid) else {
                continue;
            };
            let candidate = Candidate {
                port,
                host: probe_host(&listeners),
                owner,
                reason,
                attempts: 0,
            };
            self.pending.insert(port, candidate);
        }
    }

    /// The listener on `port` answered as a `kind` server: it is no longer
    /// pending, and the registry says whether it is new, back or ignored.
    pub(crate) fn identified(
        &mut self,
        candidate: &Candidate,
        kind: ServerKind,
        now: SystemTime,
    ) -> Arrival {
        self.pending.remove(&candidate.port);
        let by_process = candidate.owner.as_ref().and_then(process_kind);
        let (slug, default_port) = match by_process {
            Some(p) => (p.slug(), p.default_port()),
            None => (kind.slug(), kind.default_port()),
        };
        let identity = ServerIdentity {
            kind: slug.to_owned(),
            port: candidate.port,
        };
        self.registry.up(identity, default_port, now)
    }

    /// The listener on `port` gave no model server's answer this time:
    /// asked again next look, until [`PROBE_ATTEMPTS`].
    pub(crate) fn unanswered(&mut self, port: u16) {
        if let Some(candidate) = self.pending.get_mut(&port) {
            candidate.attempts += 1;
            if candidate.attempts >= PROBE_ATTEMPTS {
                self.pending.remove(&port);
            }
        }
    }

    /// Whether some listener worth probing hasn't answered yet.
    pub(crate) fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// The listeners to ask again, with nothing new seen.
    pub(crate) fn retry(&self) -> Observed {
        Observed {
            probe: self.pending.values().cloned().collect(),
            down: Vec::new(),
        }
    }

    /// The user names other ports to watch (the Settings view): a listener
    /// already on a newly named port is looked at again, as if it had just
    /// appeared. Returns the reading to observe again.
    pub(crate) fn rewatch(&mut self, ports: Vec<u16>) -> ListenerTable {
        let current = self.table.clone();
        for port in ports.iter().filter(|p| !self.watch_ports.contains(p)) {
            self.table.ports.remove(port);
        }
        self.watch_ports = ports;
        current
    }

    /// Every server known, for saving and listing.
    pub(crate) fn servers(&self) -> &[KnownServer] {
        self.registry.servers()
    }
}

/// Where to ask a listener: IPv4 loopback when it listens on an IPv4
/// address (a specific 127.x one as it is), else IPv6's.
fn probe_host(listeners: &PortListeners) -> IpAddr {
    let v4 = listeners.addresses.iter().find_map(|a| match a {
        IpAddr::V4(v4) if v4.is_loopback() => Some(*v4),
        IpAddr::V4(v4) if v4.is_unspecified() => Some(Ipv4Addr::LOCALHOST),
        _ => None,
    });
    match v4 {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(Ipv6Addr::LOCALHOST),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discover::registry::ServerState;
    use std::time::Duration;

    const OWN_PID: i32 = 7;

    fn at(s: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + s)
    }

    fn table(ports: &[(u16, &str, u64)]) -> ListenerTable {
        let mut t = ListenerTable::default();
        for (port, addr, inode) in ports {
            let l = t.ports.entry(*port).or_default();
            l.addresses.insert(addr.parse().unwrap());
            l.inodes.insert(*inode);
        }
        t
    }

    fn owner(pid: i32, comm: &str) -> Owner {
        Owner {
            pid,
            comm: comm.into(),
            exe: None,
            cmdline: vec![comm.into()],
            parent_comm: Some("bash".into()),
        }
    }

    fn owners(map: &[(u64, Owner)]) -> impl FnOnce(&BTreeSet<u64>) -> HashMap<u64, Owner> {
        let map: HashMap<u64, Owner> = map.iter().cloned().collect();
        move |_| map
    }

    fn follow() -> Follow {
        Follow::new(
            Registry::default(),
            vec![],
            OWN_PID,
            BTreeSet::from([17878]),
        )
    }

    #[test]
    fn a_model_server_by_name_on_any_port_is_probed_and_a_stranger_is_not() {
        let mut f = follow();
        let seen = f.observe(
            table(&[
                (41000, "127.0.0.1", 1),
                (42000, "0.0.0.0", 2),
                (17878, "127.0.0.1", 3),
            ]),
            owners(&[(1, owner(100, "llama-server")), (2, owner(101, "postgres"))]),
            at(0),
        );
        let ports: Vec<u16> = seen.probe.iter().map(|c| c.port).collect();
        assert_eq!(ports, [41000]);
        assert_eq!(seen.probe[0].host, IpAddr::from([127, 0, 0, 1]));
    }

    #[test]
    fn a_port_the_user_names_later_has_its_listener_probed_at_once() {
        let mut f = follow();
        let stranger = || owners(&[(2, owner(101, "my-server"))]);
        let seen = f.observe(table(&[(7777, "127.0.0.1", 2)]), stranger(), at(0));
        assert!(seen.probe.is_empty());
        let again = f.rewatch(vec![7777]);
        let seen = f.observe(again, stranger(), at(1));
        let probed: Vec<_> = seen.probe.iter().map(|c| (c.port, c.reason)).collect();
        assert_eq!(probed, [(7777, ProbeReason::Watched)]);
    }

    #[test]
    fn a_well_known_port_is_probed_even_when_its_owner_cant_be_read() {
        let mut f = follow();
        let seen = f.observe(table(&[(11434, "::1", 9)]), owners(&[]), at(0));
        assert_eq!(seen.probe.len(), 1);
        assert_eq!(seen.probe[0].host, IpAddr::V6(Ipv6Addr::LOCALHOST));
        assert_eq!(seen.probe[0].reason, ProbeReason::WellKnownPort);
    }

    #[test]
    fn a_server_goes_down_with_its_listener_and_comes_back_under_its_name() {
        let mut f = follow();
        let seen = f.observe(
            table(&[(9931, "127.0.0.1", 1)]),
            owners(&[(1, owner(100, "llama-server"))]),
            at(0),
        );
        let arrival = f.identified(&seen.probe[0], ServerKind::LlamaCpp, at(1));
        assert_eq!(
            arrival,
            Arrival::New {
                name: "llama-server-9931".into()
            }
        );
        let seen = f.observe(table(&[]), owners(&[]), at(5));
        assert_eq!(seen.down, [(9931, vec!["llama-server-9931".to_owned()])]);
        assert_eq!(f.servers()[0].state, ServerState::Down);
        let seen = f.observe(
            table(&[(9931, "127.0.0.1", 2)]),
            owners(&[(2, owner(200, "llama-server"))]),
            at(10),
        );
        let arrival = f.identified(&seen.probe[0], ServerKind::LlamaCpp, at(11));
        assert_eq!(
            arrival,
            Arrival::Back {
                name: "llama-server-9931".into()
            }
        );
    }

    #[test]
    fn a_restart_between_two_looks_is_a_down_then_an_arrival() {
        let mut f = follow();
        let seen = f.observe(table(&[(11434, "127.0.0.1", 1)]), owners(&[]), at(0));
        f.identified(&seen.probe[0], ServerKind::Ollama, at(0));
        let seen = f.observe(table(&[(11434, "127.0.0.1", 2)]), owners(&[]), at(5));
        assert_eq!(seen.down, [(11434, vec!["ollama".to_owned()])]);
        assert_eq!(seen.probe.len(), 1);
        let arrival = f.identified(&seen.probe[0], ServerKind::Ollama, at(5));
        assert_eq!(
            arrival,
            Arrival::Back {
                name: "ollama".into()
            }
        );
    }

    #[test]
    fn a_silent_listener_is_asked_again_then_left_alone() {
        let mut f = follow();
        let t = table(&[(8080, "127.0.0.1", 1)]);
        let mut probes = 0;
        for look in 0..(PROBE_ATTEMPTS + 5) {
            let seen = f.observe(t.clone(), owners(&[]), at(u64::from(look) * 5));
            for c in &seen.probe {
                probes += 1;
                f.unanswered(c.port);
            }
        }
        assert_eq!(probes, PROBE_ATTEMPTS);
    }

    #[test]
    fn the_name_comes_from_the_process_where_it_can_be_read_else_from_the_answer() {
        let mut f = follow();
        let seen = f.observe(
            table(&[(1234, "127.0.0.1", 1), (8000, "127.0.0.1", 2)]),
            owners(&[(1, owner(100, "lms"))]),
            at(0),
        );
        let names: Vec<Arrival> = seen
            .probe
            .iter()
            .map(|c| f.identified(c, ServerKind::OpenAiCompatible, at(0)))
            .collect();
        assert_eq!(
            names,
            [
                Arrival::New {
                    name: "lm-studio".into()
                },
                Arrival::New {
                    name: "openai-8000".into()
                },
            ]
        );
    }

    #[test]
    fn ollamas_own_runner_is_never_probed() {
        let mut f = follow();
        let mut runner = owner(300, "llama-server");
        runner.parent_comm = Some("ollama".into());
        let seen = f.observe(
            table(&[(39001, "127.0.0.1", 1)]),
            owners(&[(1, runner)]),
            at(0),
        );
        assert!(seen.probe.is_empty());
    }
}
