//! Every captured call settles, even when the packet socket dropped the
//! end of its connection. Two ways out for a call whose connection went
//! quiet for [`QUIET`] while its response was not over:
//!
//! - the kernel's socket table no longer lists the connection (both
//!   sockets closed, or past sending): the connection is ended as if its
//!   FIN had come, and its call ends incomplete (`ok` if the protocol's end
//!   marker came, as for any end after the marker; `abandoned` otherwise);
//! - the protocol's end marker has arrived (the actor knows, told by
//!   [`FlowQuiet`]): the call settles `ok` at the marker even though the
//!   connection stays open (a keep-alive connection whose end of body was
//!   dropped).
//!
//! A quiet connection whose call has no marker and whose sockets still
//! exist keeps waiting: it may be a long prefill. A quiet connection with
//! no call in flight whose sockets are gone (its FIN was dropped after a
//! complete response) leaves the table too, rather than at the 10-minute
//! sweep. Calls whose actor has settled are dropped from the table here.

use tokio::time::Instant;

use super::{CaptureTask, QUIET};
use crate::capture::sockets::is_gone;
use crate::capture::Nanos;
use crate::engine::messages::FlowQuiet;

impl CaptureTask {
    /// Settles what the quiet connections hold, at `now` (`now_ts` on the
    /// packet clock).
    pub(super) fn settle_quiet(&mut self, now: Instant, now_ts: Nanos) {
        self.exchanges.retain(|_, ex| ex.actor.connected());
        if self.flows.is_empty() || !self.caught_up {
            return;
        }
        let quiet = self.flows.quiet(now_ts, QUIET.as_nanos() as u64);
        if quiet.is_empty() {
            return;
        }
        for ((conn, _), ex) in &mut self.exchanges {
            if !ex.quiet_told && quiet.contains(conn) {
                ex.quiet_told = true;
                ex.actor.do_send(FlowQuiet { at: now });
            }
        }
        let due = self
            .sockets_read
            .is_none_or(|at| now.saturating_duration_since(at) >= QUIET);
        if !due {
            return;
        }
        self.sockets_read = Some(now);
        let Some(open) = self.sockets.open_pairs() else {
            return;
        };
        let mut events = Vec::new();
        for id in quiet {
            if is_gone(&open, id.client, id.server) {
                events.extend(self.flows.end(id, now_ts));
            }
        }
        self.handle(events);
    }
}
