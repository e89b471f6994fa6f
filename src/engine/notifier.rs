//! `Notifier`: turns "this call is still waiting for its first token"
//! alarms into notifications, at most one per route per minute.
//!
//! Each call actor raises its own alarm once, when its wait crosses
//! `slow_ttft_ms` while it is still waiting; the notifier only throttles
//! and fans out: to the engine's subscribers (the headless view prints a
//! warning line) and to the hooks a host registers (the tray app shows a
//! desktop notification). "Pause notifications" silences the hooks only;
//! subscribers still see the event.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use tokio::time::Instant;

use super::messages::{Broadcast, FirstTokenLate, SetNotificationsPaused};
use super::model::{EngineEvent, SlowFirstToken};

/// At most one slow-first-token notification per route in this period.
pub const NOTIFY_THROTTLE: Duration = Duration::from_secs(60);

/// A host's reaction to a slow first token (e.g. a desktop notification).
/// Called on the notifier's thread: keep it short, hand real work off.
pub type SlowFirstTokenHook = Arc<dyn Fn(&SlowFirstToken) + Send + Sync>;

pub struct Notifier {
    last_fired: HashMap<String, Instant>,
    paused: bool,
    hooks: Vec<SlowFirstTokenHook>,
    broadcast: Recipient<Broadcast>,
}

impl Notifier {
    pub fn new(broadcast: Recipient<Broadcast>, hooks: Vec<SlowFirstTokenHook>) -> Self {
        Notifier {
            last_fired: HashMap::new(),
            paused: false,
            hooks,
            broadcast,
        }
    }

    /// True when `route` may notify at `now`, and records that it did.
    fn take_slot(&mut self, route: &str, now: Instant) -> bool {
        match self.last_fired.get(route) {
            Some(last) if now.saturating_duration_since(*last) < NOTIFY_THROTTLE => false,
            _ => {
                self.last_fired.insert(route.to_owned(), now);
                true
            }
        }
    }
}

impl Actor for Notifier {
    type Context = Context<Self>;
}

impl Handler<FirstTokenLate> for Notifier {
    type Result = ();
    fn handle(&mut self, msg: FirstTokenLate, _: &mut Self::Context) {
        if !self.take_slot(&msg.0.call.route, Instant::now()) {
            return;
        }
        if !self.paused {
            for hook in &self.hooks {
                hook(&msg.0);
            }
        }
        self.broadcast
            .do_send(Broadcast(EngineEvent::SlowFirstToken(msg.0)));
    }
}

impl Handler<SetNotificationsPaused> for Notifier {
    type Result = ();
    fn handle(&mut self, msg: SetNotificationsPaused, _: &mut Self::Context) {
        self.paused = msg.0;
    }
}
