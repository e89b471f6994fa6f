//! The servers found on this machine, each under a name that never
//! changes: the route name its calls, history, calibration and normals are
//! filed under.
//!
//! A server is known by what it is and where: its kind's slug (`ollama`,
//! `llama-server`...) and its port. Its name comes from those two alone,
//! never from which other servers happened to be up, so the same server
//! gets the same name whatever order servers start in, and keeps it across
//! restarts once saved: the kind alone on the kind's own default port
//! (`ollama` on 11434, `lm-studio` on 1234), the kind and the port
//! elsewhere (`llama-server-9931`). A name already taken (by a configured
//! route, or a saved server) gets the port, then a counter.
//!
//! A server that stops is kept, `Down`, with its name; the same kind on
//! the same port is that server back. Another kind on that port is
//! another server. A server the user ignored stays ignored whenever it
//! comes back.

use std::collections::BTreeSet;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

/// What a server is and where: the key it is known by.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ServerIdentity {
    /// The kind's slug (`ollama`, `llama-server`, `lm-studio`...).
    pub kind: String,
    pub port: u16,
}

/// Where a known server stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ServerState {
    /// Listening now.
    Up,
    /// Not listening; kept with its name and history.
    Down,
    /// The user asked never to measure it.
    Ignored,
}

/// One server this machine has had.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KnownServer {
    pub name: String,
    pub identity: ServerIdentity,
    pub state: ServerState,
    /// Whether it is listening (an ignored server may be).
    pub listening: bool,
    pub found_at: SystemTime,
    pub last_seen: SystemTime,
}

/// What a server that started listening is to the registry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Arrival {
    /// Never seen: named now.
    New { name: String },
    /// Known and down: up again under its name.
    Back { name: String },
    /// Already up (seen twice): nothing changes.
    AlreadyUp { name: String },
    /// Ignored by the user: stays unmeasured.
    Ignored { name: String },
}

/// The servers found so far, and the names they hold.
#[derive(Clone, Debug, Default)]
pub struct Registry {
    servers: Vec<KnownServer>,
    /// Names the registry must not give (configured routes).
    reserved: BTreeSet<String>,
}

impl Registry {
    /// A registry holding `saved` servers (all down until seen again) and
    /// keeping clear of `reserved` names.
    pub fn new(saved: Vec<KnownServer>, reserved: BTreeSet<String>) -> Registry {
        let servers = saved
            .into_iter()
            .map(|mut s| {
                s.listening = false;
                if s.state == ServerState::Up {
                    s.state = ServerState::Down;
                }
                s
            })
            .collect();
        Registry { servers, reserved }
    }

    /// Every known server, in the order found.
    pub fn servers(&self) -> &[KnownServer] {
        &self.servers
    }

    /// The server now listening on `identity`.
    pub fn up(
        &mut self,
        identity: ServerIdentity,
        default_port: Option<u16>,
        now: SystemTime,
    ) -> Arrival {
        if let Some(server) = self.servers.iter_mut().find(|s| s.identity == identity) {
            let name = server.name.clone();
            let was_listening = std::mem::replace(&mut server.listening, true);
            server.last_seen = now;
            return match server.state {
                ServerState::Ignored => Arrival::Ignored { name },
                ServerState::Up if was_listening => Arrival::AlreadyUp { name },
                _ => {
                    server.state = ServerState::Up;
                    Arrival::Back { name }
                }
            };
        }
        let name = self.fresh_name(&identity, default_port);
        self.servers.push(KnownServer {
            name: name.clone(),
            identity,
            state: ServerState::Up,
            listening: true,
            found_at: now,
            last_seen: now,
        });
        Arrival::New { name }
    }

    /// Nothing listens on `port` any more: the server there is down.
    /// Returns the names of the servers that went down.
    pub fn down(&mut self, port: u16, now: SystemTime) -> Vec<String> {
        let mut gone = Vec::new();
        for server in self
            .servers
            .iter_mut()
            .filter(|s| s.identity.port == port && s.listening)
        {
            server.listening = false;
            server.last_seen = now;
            if server.state == ServerState::Up {
                server.state = ServerState::Down;
                gone.push(server.name.clone());
            }
        }
        gone
    }

    /// The user asks never to measure `name`. False when no server has it.
    pub fn ignore(&mut self, name: &str) -> bool {
        let Some(server) = self.servers.iter_mut().find(|s| s.name == name) else {
            return false;
        };
        server.state = ServerState::Ignored;
        true
    }

    /// The name for a server never seen: its kind on the kind's default
    /// port, else kind and port, else kind, port and a counter.
    fn fresh_name(&self, identity: &ServerIdentity, default_port: Option<u16>) -> String {
        let kind = &identity.kind;
        let with_port = format!("{kind}-{}", identity.port);
        let mut candidates = Vec::new();
        if default_port == Some(identity.port) {
            candidates.push(kind.clone());
        }
        candidates.push(with_port.clone());
        candidates
            .into_iter()
            .chain((2..).map(|n| format!("{with_port}-{n}")))
            .find(|name| !self.is_taken(name))
            .unwrap_or(with_port)
    }

    fn is_taken(&self, name: &str) -> bool {
        self.reserved.contains(name) || self.servers.iter().any(|s| s.name == name)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::time::Duration;

    /// The identity of a `kind` server on `port`.
    pub(crate) fn id(kind: &str, port: u16) -> ServerIdentity {
        ServerIdentity {
            kind: kind.into(),
            port,
        }
    }

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn name_of(arrival: Arrival) -> String {
        match arrival {
            Arrival::New { name }
            | Arrival::Back { name }
            | Arrival::AlreadyUp { name }
            | Arrival::Ignored { name } => name,
        }
    }

    #[test]
    fn a_server_on_its_kinds_default_port_is_named_by_its_kind_and_elsewhere_by_kind_and_port() {
        let mut registry = Registry::default();
        assert_eq!(
            registry.up(id("ollama", 11434), Some(11434), at(0)),
            Arrival::New {
                name: "ollama".into()
            }
        );
        assert_eq!(
            registry.up(id("llama-server", 9931), Some(8080), at(0)),
            Arrival::New {
                name: "llama-server-9931".into()
            }
        );
        assert_eq!(
            registry.up(id("ollama", 11500), Some(11434), at(0)),
            Arrival::New {
                name: "ollama-11500".into()
            }
        );
    }

    #[test]
    fn names_do_not_depend_on_the_order_servers_start_in() {
        let servers = [
            (id("llama-server", 8080), Some(8080)),
            (id("lm-studio", 1234), Some(1234)),
            (id("ollama", 11434), Some(11434)),
        ];
        let mut forward = Registry::default();
        let mut backward = Registry::default();
        let names = |registry: &mut Registry, order: Vec<&(ServerIdentity, Option<u16>)>| {
            let mut names: Vec<(ServerIdentity, String)> = order
                .into_iter()
                .map(|(identity, port)| {
                    (
                        identity.clone(),
                        name_of(registry.up(identity.clone(), *port, at(0))),
                    )
                })
                .collect();
            names.sort();
            names
        };
        assert_eq!(
            names(&mut forward, servers.iter().collect()),
            names(&mut backward, servers.iter().rev().collect())
        );
    }

    #[test]
    fn a_saved_server_keeps_its_name_after_a_restart_and_starts_down() {
        let mut first = Registry::default();
        first.up(id("ollama", 11434), Some(11434), at(0));
        let saved = first.servers().to_vec();
        let mut restarted = Registry::new(saved, BTreeSet::new());
        assert_eq!(restarted.servers()[0].state, ServerState::Down);
        assert_eq!(
            restarted.up(id("ollama", 11434), Some(11434), at(50)),
            Arrival::Back {
                name: "ollama".into()
            }
        );
    }

    #[test]
    fn a_stopped_server_is_down_with_its_name_and_the_same_kind_on_its_port_is_it_back() {
        let mut registry = Registry::default();
        registry.up(id("llama-server", 9931), Some(8080), at(0));
        assert_eq!(
            registry.down(9931, at(10)),
            vec!["llama-server-9931".to_string()]
        );
        assert_eq!(registry.servers()[0].state, ServerState::Down);
        assert_eq!(registry.servers()[0].last_seen, at(10));
        assert_eq!(
            registry.up(id("llama-server", 9931), Some(8080), at(20)),
            Arrival::Back {
                name: "llama-server-9931".into()
            }
        );
        assert_eq!(
            registry.up(id("llama-server", 9931), Some(8080), at(25)),
            Arrival::AlreadyUp {
                name: "llama-server-9931".into()
            }
        );
    }

    #[test]
    fn another_kind_on_a_known_port_is_another_server() {
        let mut registry = Registry::default();
        registry.up(id("llama-server", 8080), Some(8080), at(0));
        registry.down(8080, at(1));
        assert_eq!(
            registry.up(id("local-ai", 8080), Some(8080), at(2)),
            Arrival::New {
                name: "local-ai".into()
            }
        );
        let states: Vec<_> = registry
            .servers()
            .iter()
            .map(|s| (s.name.as_str(), s.state))
            .collect();
        assert_eq!(
            states,
            vec![
                ("llama-server", ServerState::Down),
                ("local-ai", ServerState::Up)
            ]
        );
    }

    #[test]
    fn an_ignored_server_stays_ignored_when_it_comes_back() {
        let mut registry = Registry::default();
        registry.up(id("ollama", 11434), Some(11434), at(0));
        assert!(registry.ignore("ollama"));
        assert!(
            registry.down(11434, at(1)).is_empty(),
            "an ignored server does not go down"
        );
        assert_eq!(
            registry.up(id("ollama", 11434), Some(11434), at(2)),
            Arrival::Ignored {
                name: "ollama".into()
            }
        );
        assert!(!registry.ignore("nothing-by-that-name"));
    }

    #[test]
    fn a_name_a_configured_route_holds_is_never_given_to_a_found_server() {
        let mut registry = Registry::new(
            Vec::new(),
            BTreeSet::from(["ollama".to_string(), "ollama-11434".to_string()]),
        );
        assert_eq!(
            registry.up(id("ollama", 11434), Some(11434), at(0)),
            Arrival::New {
                name: "ollama-11434-2".into()
            }
        );
    }
}
