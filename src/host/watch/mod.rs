//! Following the machine: the watcher that notices model servers start,
//! stop, restart or move while speedtap runs, and measures each one under
//! a name that never changes, with no user action.
//!
//! One task owns the whole state (an actor in all but name: nothing else
//! touches it; the rest of the engine sees its [`ServersDoc`]). Every
//! [`WATCH_EVERY`] its [`reader`] thread reads the kernel's listener table
//! (see [`crate::discover::listeners`] for why `/proc/net/tcp{,6}`), which
//! is its only wake-up when nothing changes. What appeared is looked up to its
//! process, probed when the process or the port says it may be a model
//! server ([`crate::discover::known`]), named by the registry, and routed
//! ([`route`]): captured where the capture runs, else behind a proxy route.
//! What went away is marked down and keeps its name and history.

pub(crate) mod command;
mod follow;
mod reader;
mod relays;
mod route;
mod saved;

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use crate::discover::known::WELL_KNOWN_PORTS;
use crate::discover::listeners::ListenerTable;
use crate::discover::owner::find_owners;
use crate::discover::registry::{Arrival, Registry};
use crate::discover::{discover_on, Discovered, PORT_BUDGET};
use crate::model::{EngineEvent, ServersDoc};

use super::EngineHandle;
use command::WatchCommand;
use follow::{Candidate, Follow};
use route::Routed;

/// How often the listener table is read: a new server is measured within
/// one interval and its probe (so within 10 s of its `listen()`), and an
/// idle speedtap wakes for this once per interval.
pub const WATCH_EVERY: Duration = Duration::from_secs(5);

/// Prints one line for people (a server found, down, back): each front
/// end in its own words and place.
pub type Announce = Arc<dyn Fn(&str) + Send + Sync>;

/// How to follow the machine.
#[derive(Clone)]
pub struct WatchOptions {
    /// Where the kernel's tables are (`/proc`; a fake root in tests).
    pub proc_root: PathBuf,
    /// Ports the user asked to watch whoever owns them.
    pub watch_ports: Vec<u16>,
    pub every: Duration,
    /// Where the servers found are saved between runs; `None` keeps them
    /// for this run only.
    pub saved: Option<PathBuf>,
    pub announce: Option<Announce>,
}

impl Default for WatchOptions {
    fn default() -> Self {
        WatchOptions {
            proc_root: PathBuf::from("/proc"),
            watch_ports: Vec::new(),
            every: WATCH_EVERY,
            saved: None,
            announce: None,
        }
    }
}

impl WatchOptions {
    /// The line said while nothing is found: what is being watched.
    pub fn waiting_line(&self) -> String {
        format!(
            "waiting for a local model server (watching {})",
            self.watched()
        )
    }

    /// What is watched: `model servers by process name on any port, and
    /// ports 11434, 8080, …`.
    pub fn watched(&self) -> String {
        let mut ports: Vec<u16> = WELL_KNOWN_PORTS.to_vec();
        ports.extend(&self.watch_ports);
        let ports: Vec<String> = ports.iter().map(u16::to_string).collect();
        format!(
            "for model servers by process name on any port, and ports {}",
            ports.join(", ")
        )
    }
}

/// The watcher's state: the bookkeeping, and how each server is measured.
struct Watcher {
    follow: Follow,
    handle: EngineHandle,
    options: WatchOptions,
    /// How each server (by name) is measured now, and what it said.
    routed: HashMap<String, Routed>,
    /// Whether the "capture would measure it without a proxy" hint was
    /// given (once per run).
    told_grant: bool,
    doc: Arc<RwLock<ServersDoc>>,
}

/// Starts following the machine for `handle`'s engine; runs until the
/// engine stops. Its list is published in `doc`.
pub(super) fn spawn(
    handle: EngineHandle,
    options: WatchOptions,
    doc: Arc<RwLock<ServersDoc>>,
    commands: tokio::sync::mpsc::UnboundedReceiver<WatchCommand>,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let saved = match &options.saved {
        Some(path) => saved::load(path).unwrap_or_else(|why| {
            tracing::warn!("{why}; starting with no saved servers");
            Vec::new()
        }),
        None => Vec::new(),
    };
    let reserved: BTreeSet<String> = route::configured_names(&handle);
    let own_ports = route::own_ports(&handle);
    let follow = Follow::new(
        Registry::new(saved, reserved),
        options.watch_ports.clone(),
        std::process::id() as i32,
        own_ports,
    );
    {
        let mut doc = doc.write().unwrap_or_else(|p| p.into_inner());
        doc.watching = true;
        doc.watch_ports = options.watch_ports.clone();
    }
    handle
        .shared
        .link
        .set_relay_judge(Some(Arc::new(relays::FollowedRelays {
            proc_root: options.proc_root.clone(),
            doc: doc.clone(),
        })));
    let watcher = Watcher {
        follow,
        handle,
        options,
        routed: HashMap::new(),
        told_grant: false,
        doc,
    };
    watcher.run(commands)
}

impl Watcher {
    async fn run(mut self, mut commands: tokio::sync::mpsc::UnboundedReceiver<WatchCommand>) {
        let mut stop = self.handle.shared.stop.clone();
        let every = self.options.every;
        let mut tables = reader::spawn(self.options.proc_root.clone(), every);
        // Listeners that didn't answer yet are asked again one interval
        // after the last look, and only while there are some.
        let mut retry_at = tokio::time::Instant::now() + every;
        let mut first = true;
        loop {
            let table = tokio::select! {
                _ = stop.wait_for(|s| *s) => break,
                Some(table) = tables.recv() => Ok(Some(table)),
                () = tokio::time::sleep_until(retry_at), if self.follow.has_pending() => Ok(None),
                Some(command) = commands.recv() => Err(command),
            };
            let table = match table {
                Ok(table) => table,
                Err(command) => {
                    self.command(command).await;
                    continue;
                }
            };
            self.look(table).await;
            retry_at = tokio::time::Instant::now() + every;
            if std::mem::take(&mut first) && self.routed.is_empty() {
                let line = self.options.waiting_line();
                self.say(&line);
            }
        }
    }

    /// One look at the machine: what went, what came (from `table`, a new
    /// reading; `None` asks the silent listeners again), and each new
    /// server routed.
    async fn look(&mut self, table: Option<ListenerTable>) {
        let proc_root = self.options.proc_root.clone();
        let now = SystemTime::now();
        let observed = match table {
            Some(table) => tokio::task::block_in_place(|| {
                self.follow
                    .observe(table, |inodes| find_owners(&proc_root, inodes), now)
            }),
            None => self.follow.retry(),
        };
        let mut changed = !observed.down.is_empty();
        for (port, names) in observed.down {
            for name in names {
                self.went_down(&name, port);
            }
        }
        for (candidate, found) in probe_all(&observed.probe).await {
            match found {
                Some(found) => changed |= self.arrived(candidate, found).await,
                None => self.follow.unanswered(candidate.port),
            }
        }
        if changed {
            self.publish();
        }
    }

    /// A probe answered: the server is named, then measured if it is new
    /// or back. Whether anything changed.
    async fn arrived(&mut self, candidate: &Candidate, found: Discovered) -> bool {
        let arrival = self
            .follow
            .identified(candidate, found.kind, SystemTime::now());
        let (name, back) = match arrival {
            Arrival::New { name } => (name, false),
            Arrival::Back { name } => (name, true),
            Arrival::AlreadyUp { .. } => return false,
            Arrival::Ignored { .. } => return true,
        };
        let routed = route::measure(
            &self.handle,
            &name,
            candidate,
            &found,
            self.routed.get(&name),
        )
        .await;
        let line = route::arrival_line(&name, &found, candidate, &routed, back);
        self.say(&line);
        if routed.proxy_listen.is_some() && !self.told_grant {
            if let Some(hint) = route::grant_hint(&self.handle) {
                self.told_grant = true;
                self.say(&hint);
            }
        }
        if let Some(listen) = routed.proxy_listen {
            self.follow.own_port(listen.port());
        }
        self.routed.insert(name, routed);
        true
    }

    async fn command(&mut self, command: WatchCommand) {
        match command {
            WatchCommand::WatchPorts(ports) => {
                self.options.watch_ports = ports.clone();
                let table = self.follow.rewatch(ports);
                self.look(Some(table)).await;
                self.publish();
            }
            WatchCommand::Ignore { name, reply } => match self.ignore(&name) {
                // The answer waits for the proxy port to close.
                Ok(Some(route)) => {
                    let handle = self.handle.clone();
                    tokio::spawn(async move {
                        handle.remove_route(&route).await;
                        let _ = reply.send(Ok(()));
                    });
                }
                answer => {
                    let _ = reply.send(answer.map(|_| ()));
                }
            },
        }
    }

    /// The user asks never to measure `name`: its capture route (if the
    /// watcher added one) goes at once; saved, so it stays ignored. The
    /// answer names the proxy route opened for it, to close.
    fn ignore(&mut self, name: &str) -> Result<Option<String>, String> {
        let port = self
            .follow
            .servers()
            .iter()
            .find(|s| s.name == name)
            .map(|s| s.identity.port)
            .ok_or_else(|| format!("no followed server named {name:?}"))?;
        self.follow.registry.ignore(name);
        let routed = self.routed.remove(name);
        if let Some(routed) = &routed {
            route::unmeasure(&self.handle, routed, port);
        }
        self.say(&format!(
            "route \"{name}\" is ignored: it won't be measured again"
        ));
        self.publish();
        // Its proxy port too: nothing would be measured there any more.
        Ok(routed.filter(|r| r.proxy_listen.is_some()).map(|r| r.route))
    }

    /// The server `name` stopped listening on `port`.
    fn went_down(&mut self, name: &str, port: u16) {
        if let Some(routed) = self.routed.get(name) {
            route::unmeasure(&self.handle, routed, port);
        }
        self.say(&format!(
            "route \"{name}\" is down: nothing listens on port {port} (its history is kept)"
        ));
    }

    /// Publishes the list and saves the servers.
    fn publish(&mut self) {
        let doc = ServersDoc {
            watching: true,
            watch_ports: self.options.watch_ports.clone(),
            servers: route::documents(self.follow.servers(), &self.routed),
            // Read from the pollers on request, never in the event.
            loaded: Vec::new(),
        };
        *self.doc.write().unwrap_or_else(|p| p.into_inner()) = doc.clone();
        self.handle
            .supervisor
            .do_send(crate::engine::messages::Broadcast(EngineEvent::Servers(
                doc,
            )));
        if let Some(path) = &self.options.saved {
            if let Err(e) = saved::save(path, self.follow.servers()) {
                tracing::warn!("cannot save the servers found to {}: {e}", path.display());
            }
        }
    }

    fn say(&self, line: &str) {
        match &self.options.announce {
            Some(announce) => announce(line),
            None => tracing::info!("{line}"),
        }
    }
}

/// A model server found by one look at the machine ([`look_once`]).
#[derive(Clone, Debug)]
pub struct FoundNow {
    /// The name it has (saved) or would get.
    pub name: String,
    pub found: Discovered,
    /// The address it was asked at.
    pub host: std::net::IpAddr,
    /// Its owning process's name and pid, where they can be read.
    pub process: Option<(String, i32)>,
}

/// One look at the machine, as the watcher takes it, for `speedtap
/// discover`: every model server listening now, named as the watcher
/// names it (from the servers saved at `saved`, which is not written).
pub async fn look_once(
    proc_root: &std::path::Path,
    saved: Option<&std::path::Path>,
) -> Vec<FoundNow> {
    let known = saved.and_then(|p| saved::load(p).ok()).unwrap_or_default();
    let mut follow = Follow::new(
        Registry::new(known, BTreeSet::new()),
        Vec::new(),
        std::process::id() as i32,
        BTreeSet::new(),
    );
    let Ok(table) = ListenerTable::read(proc_root) else {
        return Vec::new();
    };
    let observed = follow.observe(
        table,
        |inodes| find_owners(proc_root, inodes),
        SystemTime::now(),
    );
    let mut out = Vec::new();
    for (candidate, found) in probe_all(&observed.probe).await {
        let Some(found) = found else { continue };
        let name = match follow.identified(candidate, found.kind, SystemTime::now()) {
            Arrival::New { name }
            | Arrival::Back { name }
            | Arrival::AlreadyUp { name }
            | Arrival::Ignored { name } => name,
        };
        out.push(FoundNow {
            name,
            found,
            host: candidate.host,
            process: candidate.owner.as_ref().map(|o| (o.comm.clone(), o.pid)),
        });
    }
    out
}

/// Asks every candidate at once what it is (the existing identification,
/// each within its budget): the answer, or `None` for no model server.
async fn probe_all(candidates: &[Candidate]) -> Vec<(&Candidate, Option<Discovered>)> {
    let probes = candidates.iter().map(|c| async move {
        let found = discover_on(c.host, &[c.port], PORT_BUDGET).await;
        (c, found.into_iter().next())
    });
    futures_util::future::join_all(probes).await
}
