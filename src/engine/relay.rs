//! Each client call once, through a local relay.
//!
//! A relay (LiteLLM in front of Ollama, Open WebUI's backend, llama-swap in
//! front of a server it did not start) is a followed server that is itself
//! the client of another measured server. When speedtap measures both
//! sides, one client call shows up twice: once on the relay's route (the
//! client's call, with the client's own view of the time to first token)
//! and once on the inner server's route (the relay's *leg*, with the inner
//! server's own figures). The rule (`docs/metering.md`, "each client call
//! once"):
//!
//! - the leg is told apart by who holds its client socket: the host's
//!   [`RelayJudge`] looks the connection up in the kernel's table and
//!   finds a relay's process holding it;
//! - the leg is listed live, marked `relay`, but never stored, never
//!   counted in the global rate, the hour's high and low or the active
//!   count, and never the subject of a notification;
//! - the client's call on the relay's route is the one record. It takes
//!   from its leg what only the inner server knows and it lacks: the
//!   model, the prompt count, the server's time breakdown and an exact
//!   output count.
//!
//! Which client call a leg belongs to: the relay's oldest call still in
//! flight that dispatched before the leg and has no leg yet (relays
//! forward in the order calls arrive). A leg that settles after its
//! client's call gives nothing (the record is already made).

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;

use crate::model::{Call, TokenSource};

/// Tells whether a connection's client is a relay: the route of the
/// followed server whose process holds the client side of the
/// `client -> server` connection, if any. Implemented by the host, which
/// knows the followed servers and their processes; blocking (it reads
/// `/proc`), so it is called off the async threads.
pub trait RelayJudge: Send + Sync {
    fn relay_of(&self, client: SocketAddr, server: SocketAddr) -> Option<String>;
}

/// The supervisor's book of legs: which leg belongs to which client call,
/// and the settled legs waiting for their client's call to settle.
#[derive(Default)]
pub struct Legs {
    /// The legs still in flight.
    in_flight: HashSet<u64>,
    /// Leg's sequence number -> its client call's sequence number.
    owner: HashMap<u64, u64>,
    /// Client call's sequence number -> its settled leg.
    settled: HashMap<u64, Call>,
}

impl Legs {
    /// Whether the call `seq` is a leg in flight.
    pub fn is_leg(&self, seq: u64) -> bool {
        self.in_flight.contains(&seq)
    }

    /// The call `seq` is a leg of the relay whose route is `relay`: pairs
    /// it with its client call among `active` (the calls in flight).
    pub fn found<'a>(
        &mut self,
        seq: u64,
        relay: &str,
        active: impl Iterator<Item = (&'a u64, &'a Call)>,
    ) {
        if !self.in_flight.insert(seq) {
            return;
        }
        let taken: Vec<u64> = self.owner.values().copied().collect();
        let client = active
            .filter(|(s, c)| {
                **s < seq
                    && c.identity.route == relay
                    && c.details.relay.is_none()
                    && !taken.contains(s)
            })
            .map(|(s, _)| *s)
            .min();
        if let Some(client) = client {
            self.owner.insert(seq, client);
        }
    }

    /// A leg settled: kept for its client call, if that is still in flight.
    pub fn leg_settled(&mut self, seq: u64, leg: Call, in_flight: impl Fn(u64) -> bool) {
        self.in_flight.remove(&seq);
        if let Some(client) = self.owner.remove(&seq) {
            if in_flight(client) {
                self.settled.insert(client, leg);
            }
        }
    }

    /// A client call settled: it takes what its leg knows and it lacks.
    pub fn complete(&mut self, seq: u64, call: &mut Call) {
        self.owner.retain(|_, client| *client != seq);
        if let Some(leg) = self.settled.remove(&seq) {
            take_inner_truth(call, &leg);
        }
    }
}

/// What the inner server reported, given to the client's call where it
/// lacks it: the model, the prompt count, the time breakdown, and the
/// output count when the client's was only an estimate.
fn take_inner_truth(call: &mut Call, leg: &Call) {
    if call.identity.model.is_none() {
        call.identity.model = leg.identity.model.clone();
    }
    if call.input_tokens.is_none() {
        call.input_tokens = leg.input_tokens;
    }
    if call.details.ttft_breakdown.is_none() {
        call.details.ttft_breakdown = leg.details.ttft_breakdown.clone();
    }
    if let (Some(outer), Some(inner)) = (call.speed.as_mut(), leg.speed.as_ref()) {
        if outer.token_source == TokenSource::Estimated
            && inner.token_source != TokenSource::Estimated
        {
            outer.output_tokens = inner.output_tokens;
            outer.token_source = inner.token_source;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ApiKind, CallIdentity, CallStatus, Phase, Snapshot};

    fn call(seq: u64, route: &str, model: Option<&str>) -> Call {
        Call {
            identity: CallIdentity {
                id: format!("c-{seq:06}"),
                route: route.into(),
                api: ApiKind::OpenaiChat,
                model: model.map(str::to_owned),
                started_at: String::new(),
                demo: false,
            },
            status: CallStatus::InFlight,
            http_status: Some(200),
            speed: None,
            input_tokens: None,
            details: Default::default(),
        }
    }

    fn snapshot(output_tokens: u64, token_source: TokenSource) -> Snapshot {
        Snapshot {
            stalled_ms: None,
            phase: Phase::Complete,
            is_final: true,
            elapsed_ms: 1_000,
            time_to_first_token_ms: Some(100),
            output_tokens,
            output_tokens_per_second: None,
            token_source,
            wait: None,
        }
    }

    fn leg(seq: u64, relay: &str) -> Call {
        let mut c = call(seq, "llama-server-9931", Some("qwen3:8b"));
        c.details.relay = Some(relay.into());
        c
    }

    #[test]
    fn a_leg_pairs_with_the_relays_oldest_unpaired_call_dispatched_before_it() {
        let active: HashMap<u64, Call> = [
            (1, call(1, "litellm", None)),
            (2, call(2, "litellm", None)),
            (3, call(3, "ollama", None)),
            (5, call(5, "litellm", None)),
        ]
        .into();
        let mut legs = Legs::default();
        legs.found(4, "litellm", active.iter());
        legs.found(6, "litellm", active.iter());
        legs.found(4, "litellm", active.iter());
        assert_eq!(legs.owner.get(&4), Some(&1));
        assert_eq!(legs.owner.get(&6), Some(&2), "call 1 already has its leg");
        assert!(legs.is_leg(4) && legs.is_leg(6) && !legs.is_leg(1));
        let mut lone = Legs::default();
        lone.found(3, "litellm-4000", active.iter());
        assert!(lone.owner.is_empty(), "no call of that relay");
    }

    #[test]
    fn a_client_call_takes_the_model_prompt_and_exact_count_its_leg_reported() {
        let mut legs = Legs::default();
        let active: HashMap<u64, Call> = [(1, call(1, "litellm", None))].into();
        legs.found(2, "litellm", active.iter());
        let mut inner = leg(2, "litellm");
        inner.input_tokens = Some(1_553);
        inner.speed = Some(snapshot(100, TokenSource::Server));
        legs.leg_settled(2, inner, |s| active.contains_key(&s));

        let mut outer = call(1, "litellm", None);
        outer.speed = Some(snapshot(97, TokenSource::Estimated));
        legs.complete(1, &mut outer);
        assert_eq!(outer.identity.model.as_deref(), Some("qwen3:8b"));
        assert_eq!(outer.input_tokens, Some(1_553));
        let speed = outer.speed.unwrap();
        assert_eq!(
            (speed.output_tokens, speed.token_source),
            (100, TokenSource::Server)
        );
        assert_eq!(
            outer.identity.route, "litellm",
            "the record stays the client's"
        );
    }

    #[test]
    fn a_client_call_keeps_what_it_measured_itself() {
        let mut legs = Legs::default();
        let active: HashMap<u64, Call> = [(1, call(1, "litellm", Some("alias")))].into();
        legs.found(2, "litellm", active.iter());
        let mut inner = leg(2, "litellm");
        inner.input_tokens = Some(10);
        legs.leg_settled(2, inner, |_| true);
        let mut outer = call(1, "litellm", Some("alias"));
        outer.input_tokens = Some(12);
        legs.complete(1, &mut outer);
        assert_eq!(outer.identity.model.as_deref(), Some("alias"));
        assert_eq!(outer.input_tokens, Some(12));
    }

    #[test]
    fn a_leg_that_outlives_its_client_call_gives_nothing_and_is_forgotten() {
        let mut legs = Legs::default();
        let active: HashMap<u64, Call> = [(1, call(1, "litellm", None))].into();
        legs.found(2, "litellm", active.iter());
        let mut outer = call(1, "litellm", None);
        legs.complete(1, &mut outer);
        legs.leg_settled(2, leg(2, "litellm"), |_| false);
        assert!(legs.owner.is_empty() && legs.settled.is_empty() && !legs.is_leg(2));
        assert_eq!(outer.identity.model, None);
    }
}
