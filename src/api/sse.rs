//! `GET /api/v1/events`: the engine's events as Server-Sent Events.
//!
//! Frames (the `data` is one line of JSON):
//! - `event: speed`, data `{"call": CallIdentity, "speed": Snapshot}` for
//!   every published snapshot (contract);
//! - `event: stats`, data `Stats` at the global publishing cadence (contract);
//! - `event: settled`, data the full `Call` with its final status, when a call
//!   ends (extension: lets a client replace its row with the settled record
//!   without polling `/api/v1/calls/{id}`);
//! - `event: slow_first_token`, data `{"call": CallIdentity, "waited_ms": N,
//!   "threshold_ms": N}` when a first token is later than the route's
//!   threshold (extension: the tray's notification, for web clients);
//! - a `: keep-alive` comment after [`KEEP_ALIVE`] without any frame, so
//!   proxies and browsers don't time the idle connection out.
//!
//! The stream ends when the engine drops the subscriber (its channel closes;
//! a subscriber that falls behind is dropped that way, and `EventSource`
//! reconnects by itself) or when the server shuts down.

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream;
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use serde::Serialize;
use tokio::sync::{mpsc, watch};

use super::BoxBody;
use crate::model::{EngineEvent, SpeedEvent};

/// The idle interval after which a keep-alive comment is sent.
pub const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// The SSE frame for one engine event: `event: NAME\ndata: JSON\n\n`.
pub fn frame(event: &EngineEvent) -> String {
    match event {
        EngineEvent::Speed {
            call,
            speed,
            seen_by,
        } => encode(
            "speed",
            &SpeedEvent {
                call: call.clone(),
                speed: speed.clone(),
                seen_by: *seen_by,
            },
        ),
        EngineEvent::Stats(stats) => encode("stats", stats),
        EngineEvent::Settled(call) => encode("settled", call),
        EngineEvent::SlowFirstToken(slow) => encode("slow_first_token", slow),
        EngineEvent::PromptTruncated(cut) => encode("prompt_truncated", cut),
        EngineEvent::Servers(servers) => encode("servers", servers),
    }
}

fn encode<T: Serialize>(name: &str, data: &T) -> String {
    // serde_json never writes a raw newline in compact output (newlines in
    // strings are escaped), so the data is always one `data:` line.
    let json = serde_json::to_string(data).unwrap_or_else(|_| "null".into());
    format!("event: {name}\ndata: {json}\n\n")
}

/// The SSE body over a subscription. Ends when `events` closes or when
/// `shutdown` (if any) turns true; a dropped shutdown sender means no
/// shutdown will come, and the stream goes on.
pub fn body(
    events: mpsc::Receiver<EngineEvent>,
    shutdown: Option<watch::Receiver<bool>>,
    keep_alive: Duration,
) -> BoxBody {
    let frames = stream::unfold(
        (events, shutdown),
        move |(mut events, mut shutdown)| async move {
            let chunk = tokio::select! {
                biased;
                () = shutdown_signalled(&mut shutdown) => return None,
                event = events.recv() => frame(&event?),
                () = tokio::time::sleep(keep_alive) => ": keep-alive\n\n".to_string(),
            };
            let frame: Result<Frame<Bytes>, Infallible> = Ok(Frame::data(Bytes::from(chunk)));
            Some((frame, (events, shutdown)))
        },
    );
    StreamBody::new(frames).boxed_unsync()
}

/// Resolves once `shutdown` reads true; never if there is none or its sender
/// is gone. Cancel-safe (only `watch::Receiver::changed` is awaited).
async fn shutdown_signalled(shutdown: &mut Option<watch::Receiver<bool>>) {
    loop {
        let Some(rx) = shutdown else {
            return std::future::pending().await;
        };
        if *rx.borrow_and_update() {
            return;
        }
        if rx.changed().await.is_err() {
            *shutdown = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ApiKind;
    use crate::model::Stats;
    use crate::model::{Call, CallIdentity, CallStatus, SlowFirstToken};
    use crate::model::{Phase, Snapshot, TokenSource};
    use http_body_util::BodyExt;

    fn identity() -> CallIdentity {
        CallIdentity {
            id: "c-000001".into(),
            route: "ollama".into(),
            api: ApiKind::OllamaChat,
            model: Some("qwen3:8b".into()),
            started_at: "2026-11-30T10:42:07.123Z".into(),
            demo: false,
        }
    }

    fn snapshot() -> Snapshot {
        Snapshot {
            stalled_ms: None,
            phase: Phase::Responding,
            is_final: false,
            elapsed_ms: 900,
            time_to_first_token_ms: Some(312),
            output_tokens: 20,
            output_tokens_per_second: Some(41.7),
            token_source: TokenSource::Estimated,
            wait: None,
        }
    }

    fn data_of(frame: &str, name: &str) -> serde_json::Value {
        let rest = frame
            .strip_prefix(&format!("event: {name}\ndata: "))
            .unwrap_or_else(|| panic!("not a {name} frame: {frame:?}"));
        let json = rest
            .strip_suffix("\n\n")
            .expect("frame ends with a blank line");
        assert!(!json.contains('\n'));
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn frames_carry_contract_shapes() {
        let speed = frame(&EngineEvent::Speed {
            call: identity(),
            speed: snapshot(),
            seen_by: crate::model::SeenBy::Capture,
        });
        let v = data_of(&speed, "speed");
        assert_eq!(v["seen_by"], "capture");
        assert_eq!(v["call"]["id"], "c-000001");
        assert_eq!(v["call"]["api"], "ollama_chat");
        assert_eq!(v["speed"]["phase"], "responding");
        assert_eq!(v["speed"]["output_tokens_per_second"], 41.7);

        let stats = frame(&EngineEvent::Stats(Stats {
            tps: Some(47.3),
            tps_available: true,
            active: 1,
            ..Stats::default()
        }));
        let v = data_of(&stats, "stats");
        assert_eq!(v["tps"], 47.3);
        assert!(v.get("high").is_none());

        let settled = frame(&EngineEvent::Settled(Call {
            identity: identity(),
            status: CallStatus::Ok,
            http_status: Some(200),
            speed: Some(snapshot()),
            input_tokens: None,
            details: Default::default(),
        }));
        let v = data_of(&settled, "settled");
        assert_eq!(v["status"], "ok");
        assert_eq!(v["route"], "ollama");

        let slow = frame(&EngineEvent::SlowFirstToken(SlowFirstToken {
            call: identity(),
            waited_ms: 5000,
            threshold_ms: 5000,
            reason: None,
            usual_ms: None,
        }));
        let v = data_of(&slow, "slow_first_token");
        assert_eq!(v["waited_ms"], 5000);
    }

    async fn next_chunk(body: &mut BoxBody) -> Option<String> {
        let frame = body.frame().await?.unwrap();
        Some(String::from_utf8(frame.into_data().unwrap().to_vec()).unwrap())
    }

    #[tokio::test(start_paused = true)]
    async fn idle_stream_sends_keep_alive_then_ends_with_the_channel() {
        let (tx, rx) = mpsc::channel(4);
        let (stop, stop_rx) = watch::channel(false);
        let mut body = body(rx, Some(stop_rx), KEEP_ALIVE);
        // A dropped shutdown sender does not end the stream.
        drop(stop);

        // Paused time advances to the keep-alive deadline once idle.
        let t0 = tokio::time::Instant::now();
        assert_eq!(next_chunk(&mut body).await.unwrap(), ": keep-alive\n\n");
        assert_eq!(t0.elapsed(), KEEP_ALIVE);

        tx.send(EngineEvent::Stats(Stats::default())).await.unwrap();
        let chunk = next_chunk(&mut body).await.unwrap();
        assert!(chunk.starts_with("event: stats\n"), "{chunk}");

        drop(tx);
        assert_eq!(next_chunk(&mut body).await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_ends_the_stream() {
        let (_tx, rx) = mpsc::channel::<EngineEvent>(4);
        let (stop, stop_rx) = watch::channel(false);
        let mut body = body(rx, Some(stop_rx), KEEP_ALIVE);
        stop.send(true).unwrap();
        assert_eq!(next_chunk(&mut body).await, None);
    }
}
