//! Told once, plainly: the line that says a settled call decoded slowly
//! for a named cause ("qwen3:32b on ollama decodes at 12 tok/s, usually
//! 35: 29% of the model runs on the CPU"), at most once per route, model
//! and cause kind per [`TELL_AGAIN_AFTER`] (`docs/metering.md`, "The
//! slowdown explained"). A slowdown with no named cause (`unknown`) is
//! not told: a line must say why. A version change names the server's
//! product where the `servers` event said what a route reaches ("since
//! Ollama 0.32.13 → 0.33.2"), else "the server".
//!
//! Pure and clock-injected: the caller passes `now`.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::model::{product_name, Call, ServersDoc, SlowdownCause};

/// A route, model and cause kind told once is not told again sooner.
pub const TELL_AGAIN_AFTER: Duration = Duration::from_secs(3_600);

/// When each (route, model, cause kind) was last told.
#[derive(Debug, Default)]
pub struct SlowdownNotices {
    told: HashMap<(String, String, &'static str), Instant>,
    /// Each route's server product, where a followed server said it.
    products: HashMap<String, &'static str>,
}

impl SlowdownNotices {
    pub fn new() -> SlowdownNotices {
        SlowdownNotices::default()
    }

    /// What each route reaches, from the engine's `servers` event (the
    /// whole list each time).
    pub fn know_servers(&mut self, doc: &ServersDoc) {
        self.products = doc
            .servers
            .iter()
            .filter_map(|s| Some((s.route.clone(), product_name(&s.kind)?)))
            .collect();
    }

    /// The line to tell for a settled `call` at `now`, naming the causes
    /// not told within the hour for its route and model; `None` when it
    /// has no slowdown, no named cause, or all were told.
    pub fn line(&mut self, call: &Call, now: Instant) -> Option<String> {
        let slowdown = call.details.slowdown.as_ref()?;
        let model = call.identity.model.as_deref()?;
        let tps = call.speed.as_ref()?.output_tokens_per_second?;
        let route = &call.identity.route;
        let mut reasons = Vec::new();
        for cause in &slowdown.causes {
            let product = self.products.get(route).copied();
            let Some(reason) = reason(cause, product) else {
                continue;
            };
            let key = (route.clone(), model.to_owned(), kind(cause));
            let due = self
                .told
                .get(&key)
                .is_none_or(|at| now.saturating_duration_since(*at) >= TELL_AGAIN_AFTER);
            if due {
                self.told.insert(key, now);
                reasons.push(reason);
            }
        }
        (!reasons.is_empty()).then(|| {
            format!(
                "{model} on {route} decodes at {tps:.0} tok/s, usually {:.0}: {}",
                slowdown.usual_tps,
                reasons.join("; ")
            )
        })
    }
}

fn kind(cause: &SlowdownCause) -> &'static str {
    match cause {
        SlowdownCause::CpuOffload { .. } => "cpu_offload",
        SlowdownCause::ServerChanged { .. } => "server_changed",
        SlowdownCause::Concurrent { .. } => "concurrent",
        SlowdownCause::DraftAcceptance { .. } => "draft_acceptance",
        SlowdownCause::Unknown => "unknown",
    }
}

/// The cause in words, naming the server's `product` where known; `None`
/// for `unknown`.
fn reason(cause: &SlowdownCause, product: Option<&str>) -> Option<String> {
    match cause {
        SlowdownCause::CpuOffload { cpu_share } => Some(format!(
            "{:.0}% of the model runs on the CPU",
            cpu_share * 100.0
        )),
        SlowdownCause::ServerChanged { from, to } => Some(match product {
            Some(product) => format!("since {product} {from} \u{2192} {to}"),
            None => format!("since the server went from {from} to {to}"),
        }),
        SlowdownCause::Concurrent { calls: 1 } => Some("1 other call streamed beside it".into()),
        SlowdownCause::Concurrent { calls } => {
            Some(format!("{calls} other calls streamed beside it"))
        }
        SlowdownCause::DraftAcceptance { usual, now } => Some(format!(
            "the draft model's tokens are accepted {:.0}% of the time, usually {:.0}%",
            now * 100.0,
            usual * 100.0
        )),
        SlowdownCause::Unknown => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ApiKind, CallIdentity, CallStatus, Phase, Slowdown, Snapshot, TokenSource};

    fn slow_call(route: &str, tps: f64, causes: Vec<SlowdownCause>) -> Call {
        let mut call = Call {
            identity: CallIdentity {
                id: "c-000001".into(),
                route: route.into(),
                api: ApiKind::OllamaChat,
                model: Some("qwen3:32b".into()),
                started_at: String::new(),
                demo: false,
            },
            status: CallStatus::Ok,
            http_status: Some(200),
            speed: Some(Snapshot {
                phase: Phase::Complete,
                is_final: true,
                elapsed_ms: 5_000,
                time_to_first_token_ms: Some(300),
                output_tokens: 50,
                output_tokens_per_second: Some(tps),
                token_source: TokenSource::Server,
                wait: None,
                stalled_ms: None,
            }),
            input_tokens: None,
            details: Default::default(),
        };
        call.details.slowdown = Some(Slowdown {
            usual_tps: 35.0,
            ratio: (tps / 35.0 * 100.0).round() / 100.0,
            causes,
        });
        call
    }

    fn offload() -> Vec<SlowdownCause> {
        vec![SlowdownCause::CpuOffload { cpu_share: 0.29 }]
    }

    #[test]
    fn a_cpu_offload_is_told_plainly_once_per_route_model_and_cause_per_hour() {
        let mut n = SlowdownNotices::new();
        let t0 = Instant::now();
        assert_eq!(
            n.line(&slow_call("ollama", 12.0, offload()), t0).as_deref(),
            Some("qwen3:32b on ollama decodes at 12 tok/s, usually 35: 29% of the model runs on the CPU")
        );
        let later = t0 + Duration::from_secs(3_599);
        assert_eq!(n.line(&slow_call("ollama", 11.0, offload()), later), None);
        // Another route is told on its own.
        assert!(n.line(&slow_call("lan", 12.0, offload()), later).is_some());
        // Another cause on the same route and model is told, alone.
        let both = vec![
            SlowdownCause::CpuOffload { cpu_share: 0.29 },
            SlowdownCause::ServerChanged {
                from: "0.32.13".into(),
                to: "0.33.2".into(),
            },
        ];
        assert_eq!(
            n.line(&slow_call("ollama", 12.0, both.clone()), later).as_deref(),
            Some("qwen3:32b on ollama decodes at 12 tok/s, usually 35: since the server went from 0.32.13 to 0.33.2")
        );
        // An hour after it was told, the offload is told again.
        let hour = t0 + TELL_AGAIN_AFTER;
        assert_eq!(
            n.line(&slow_call("ollama", 12.0, both), hour).as_deref(),
            Some("qwen3:32b on ollama decodes at 12 tok/s, usually 35: 29% of the model runs on the CPU")
        );
    }

    #[test]
    fn a_slowdown_with_no_named_cause_or_no_slowdown_is_not_told() {
        let mut n = SlowdownNotices::new();
        let t0 = Instant::now();
        let unknown = slow_call("ollama", 12.0, vec![SlowdownCause::Unknown]);
        assert_eq!(n.line(&unknown, t0), None);
        let mut fine = slow_call("ollama", 40.0, offload());
        fine.details.slowdown = None;
        assert_eq!(n.line(&fine, t0), None);
        let busy = slow_call("ollama", 20.0, vec![SlowdownCause::Concurrent { calls: 2 }]);
        assert_eq!(
            n.line(&busy, t0).as_deref(),
            Some("qwen3:32b on ollama decodes at 20 tok/s, usually 35: 2 other calls streamed beside it")
        );
    }

    #[test]
    fn drafts_accepted_less_than_usual_are_told_with_both_shares() {
        let mut n = SlowdownNotices::new();
        let drafts = vec![SlowdownCause::DraftAcceptance {
            usual: 0.8,
            now: 0.3,
        }];
        assert_eq!(
            n.line(&slow_call("llama", 20.0, drafts), Instant::now()).as_deref(),
            Some("qwen3:32b on llama decodes at 20 tok/s, usually 35: the draft model's tokens are accepted 30% of the time, usually 80%")
        );
    }

    fn upgraded() -> Vec<SlowdownCause> {
        vec![SlowdownCause::ServerChanged {
            from: "0.32.13".into(),
            to: "0.33.2".into(),
        }]
    }

    fn followed(route: &str, kind: &str) -> crate::model::FollowedServer {
        serde_json::from_value(serde_json::json!({
            "name": route, "kind": kind, "upstream": "http://127.0.0.1:11434",
            "state": "measured", "route": route, "found_at": 0, "last_seen": 0
        }))
        .unwrap()
    }

    #[test]
    fn a_version_change_names_the_servers_product_where_the_servers_event_said_it() {
        let mut n = SlowdownNotices::new();
        n.know_servers(&ServersDoc {
            watching: true,
            servers: vec![followed("ollama", "ollama"), followed("lan", "openai")],
            ..ServersDoc::default()
        });
        let t0 = Instant::now();
        assert_eq!(
            n.line(&slow_call("ollama", 12.0, upgraded()), t0).as_deref(),
            Some("qwen3:32b on ollama decodes at 12 tok/s, usually 35: since Ollama 0.32.13 \u{2192} 0.33.2")
        );
        // A server of no one product, and a route no server was found on.
        for route in ["lan", "configured"] {
            assert_eq!(
                n.line(&slow_call(route, 12.0, upgraded()), t0).as_deref(),
                Some(format!("qwen3:32b on {route} decodes at 12 tok/s, usually 35: since the server went from 0.32.13 to 0.33.2").as_str())
            );
        }
    }
}
