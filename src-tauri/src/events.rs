//! The engine's events as Tauri events for the window: the same four names
//! and the same payloads as the control API's Server-Sent Events
//! (`docs/api.md`, "GET /api/v1/events"), so the one web UI handles both
//! with the same code. The payloads are the engine's own serde types; the
//! names live here and nowhere else.

use serde::Serialize;
use speedtap::model::{EngineEvent, SpeedEvent};
use tauri::{Emitter, Runtime};

/// `{"call": CallIdentity, "speed": Snapshot}` for every published snapshot.
pub const SPEED: &str = "speed";
/// `Stats`, at the global publishing cadence.
pub const STATS: &str = "stats";
/// The full `Call` when a call ends.
pub const SETTLED: &str = "settled";
/// `{"call": CallIdentity, "waited_ms": n, "threshold_ms": n}`.
pub const SLOW_FIRST_TOKEN: &str = "slow_first_token";
/// `{"call": CallIdentity, "request_tokens": n, "server_tokens": n, "context_size"?: n}`.
pub const PROMPT_TRUNCATED: &str = "prompt_truncated";
/// `{"watching": bool, "servers": [FollowedServer, ...]}`: the followed
/// model servers, whenever one changes.
pub const SERVERS: &str = "servers";

/// The Tauri event name of an engine event.
pub fn name(event: &EngineEvent) -> &'static str {
    match event {
        EngineEvent::Speed { .. } => SPEED,
        EngineEvent::Stats(_) => STATS,
        EngineEvent::Settled(_) => SETTLED,
        EngineEvent::SlowFirstToken(_) => SLOW_FIRST_TOKEN,
        EngineEvent::PromptTruncated(_) => PROMPT_TRUNCATED,
        EngineEvent::Servers(_) => SERVERS,
    }
}

/// The payload of an engine event, exactly as the SSE `data` line.
pub fn payload(event: &EngineEvent) -> serde_json::Value {
    fn value<T: Serialize>(v: &T) -> serde_json::Value {
        serde_json::to_value(v).unwrap_or(serde_json::Value::Null)
    }
    match event {
        EngineEvent::Speed {
            call,
            speed,
            seen_by,
        } => value(&SpeedEvent {
            call: call.clone(),
            speed: speed.clone(),
            seen_by: *seen_by,
        }),
        EngineEvent::Stats(stats) => value(stats),
        EngineEvent::Settled(call) => value(call),
        EngineEvent::SlowFirstToken(slow) => value(slow),
        EngineEvent::PromptTruncated(cut) => value(cut),
        EngineEvent::Servers(servers) => value(servers),
    }
}

/// Sends `event` to every window. A failure (no window yet, the app is
/// closing) is only logged: the next event carries fresh numbers anyway.
pub fn emit<R: Runtime>(app: &impl Emitter<R>, event: &EngineEvent) {
    if let Err(e) = app.emit(name(event), payload(event)) {
        tracing::debug!("event {} not delivered: {e}", name(event));
    }
}

#[cfg(test)]
mod tests {
    use speedtap::model::ApiKind;
    use speedtap::model::Stats;
    use speedtap::model::{CallIdentity, SlowFirstToken};
    use speedtap::model::{Phase, Snapshot, TokenSource};

    use super::*;

    fn ident() -> CallIdentity {
        CallIdentity {
            id: "c-000001".into(),
            route: "ollama".into(),
            api: ApiKind::OpenaiChat,
            model: Some("qwen3:8b".into()),
            started_at: "2026-11-30T10:42:07.123Z".into(),
            demo: false,
        }
    }

    #[test]
    fn speed_payload_is_the_sse_shape() {
        let ev = EngineEvent::Speed {
            call: ident(),
            speed: Snapshot {
                stalled_ms: None,
                phase: Phase::Responding,
                is_final: false,
                elapsed_ms: 800,
                time_to_first_token_ms: Some(312),
                output_tokens: 20,
                output_tokens_per_second: Some(41.7),
                token_source: TokenSource::Estimated,
                wait: None,
            },
            seen_by: speedtap::model::SeenBy::Capture,
        };
        assert_eq!(name(&ev), "speed");
        assert_eq!(
            payload(&ev),
            serde_json::json!({
                "call": {"id": "c-000001", "route": "ollama", "api": "openai_chat",
                         "model": "qwen3:8b", "started_at": "2026-11-30T10:42:07.123Z"},
                "speed": {"phase": "responding", "is_final": false, "elapsed_ms": 800,
                          "time_to_first_token_ms": 312, "output_tokens": 20,
                          "output_tokens_per_second": 41.7, "token_source": "estimated"},
                "seen_by": "capture"
            })
        );
    }

    #[test]
    fn names_and_payloads_of_the_other_events() {
        let stats = EngineEvent::Stats(Stats::default());
        assert_eq!(name(&stats), "stats");
        assert_eq!(payload(&stats)["tps_available"], false);
        assert!(payload(&stats).get("tps").is_none());
        let slow = EngineEvent::SlowFirstToken(SlowFirstToken {
            call: ident(),
            waited_ms: 5001,
            threshold_ms: 5000,
            reason: None,
            usual_ms: None,
        });
        assert_eq!(name(&slow), "slow_first_token");
        assert_eq!(payload(&slow)["waited_ms"], 5001);
        assert_eq!(payload(&slow)["call"]["model"], "qwen3:8b");
    }
}
