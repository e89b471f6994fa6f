//! The relay judge the engine asks about each captured call (see
//! `engine::relay`): a call is a relay's leg when its client end is held by
//! the process of a followed server that is measured itself, so the
//! client's call is already on that server's route.
//!
//! The candidates are the followed servers measured now (by capture or
//! through their proxy port) whose process could be read; a server is
//! never its own relay.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use crate::discover::peer::client_process;
use crate::engine::relay::RelayJudge;
use crate::model::{FollowedState, ServersDoc};

/// Judges from the watcher's published list of servers.
pub(super) struct FollowedRelays {
    pub proc_root: PathBuf,
    pub doc: Arc<RwLock<ServersDoc>>,
}

impl FollowedRelays {
    /// The measured servers' processes and routes, but the one on `port`.
    fn candidates(&self, port: u16) -> Vec<(i32, String)> {
        let doc = self.doc.read().unwrap_or_else(|p| p.into_inner());
        let port = format!(":{port}");
        doc.servers
            .iter()
            .filter(|s| matches!(s.state, FollowedState::Measured | FollowedState::Proxied))
            .filter(|s| !s.upstream.ends_with(&port))
            .filter_map(|s| Some((s.pid?, s.route.clone())))
            .collect()
    }
}

impl RelayJudge for FollowedRelays {
    fn relay_of(&self, client: SocketAddr, server: SocketAddr) -> Option<String> {
        let candidates = self.candidates(server.port());
        let pids: Vec<i32> = candidates.iter().map(|(pid, _)| *pid).collect();
        let relay = client_process(&self.proc_root, client, server, &pids)?;
        candidates
            .into_iter()
            .find(|(pid, _)| *pid == relay)
            .map(|(_, route)| route)
    }
}
