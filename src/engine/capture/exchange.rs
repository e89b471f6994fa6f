//! One captured HTTP exchange turned into a call: the connection table's
//! events (request head and body, response head and body, the end, lost
//! bytes) become the same call actor messages the proxy's taps send. A
//! request the decoders know starts its call through
//! [`EngineLink::start_call`](crate::engine::link::EngineLink::start_call),
//! as the proxy's do.

use std::sync::Arc;
use std::time::SystemTime;

use actix::Addr;
use http::{header, HeaderMap, HeaderValue};
use tokio::time::Instant;

use super::CaptureTask;
use crate::capture::flows::{CaptureEvent, ConnId};
use crate::capture::http1::{Event, Headers};
use crate::decode::detect::detect_request;
use crate::decode::request_fields::RequestScanner;
use crate::engine::call_actor::CallActor;
use crate::engine::http_meta;
use crate::engine::link::CallStart;
use crate::engine::messages::{
    BodyEnded, CaptureGap, Frame, FrameQueue, FramesQueued, RequestFieldsSeen, ResponseStarted,
};
use crate::meter::pipeline::StreamEnd;
use crate::model::{ApiKind, SeenBy};

/// One HTTP exchange being metered.
pub(super) struct Exchange {
    pub(super) actor: Addr<CallActor>,
    scanner: RequestScanner,
    /// Its response frames on their way to the actor: queued like the
    /// proxy tap's, so a burst of packets wakes the actor once, not once
    /// per packet (see [`FrameQueue`]).
    frames: Arc<FrameQueue>,
}

impl CaptureTask {
    pub(super) fn handle(&mut self, events: Vec<CaptureEvent>) {
        for ev in events {
            let at = self.instant(ev.at);
            self.event(ev.conn, ev.event, at);
        }
    }

    fn event(&mut self, conn: ConnId, event: Event, at: Instant) {
        match event {
            Event::RequestHead {
                exchange,
                method,
                path,
                headers,
            } => self.start_call(conn, exchange, &method, &path, &headers, at),
            Event::RequestBody { exchange, bytes } => {
                if let Some(ex) = self.exchanges.get_mut(&(conn, exchange)) {
                    if !ex.scanner.is_finished() && ex.scanner.feed(&bytes) {
                        ex.actor
                            .do_send(RequestFieldsSeen(ex.scanner.fields().clone()));
                    }
                }
            }
            Event::RequestEnd { .. } => {}
            Event::ResponseHead {
                exchange,
                status,
                headers,
            } => {
                if let Some(ex) = self.exchanges.get(&(conn, exchange)) {
                    ex.actor.do_send(ResponseStarted {
                        status,
                        content_type: tap_content_type(&headers),
                        at,
                    });
                }
            }
            Event::ResponseBody { exchange, bytes } => {
                if let Some(ex) = self.exchanges.get(&(conn, exchange)) {
                    if ex.frames.push(Frame { bytes, at }) {
                        ex.actor.do_send(FramesQueued(ex.frames.clone()));
                    }
                }
            }
            Event::ResponseEnd {
                exchange,
                complete,
                gap,
            } => {
                if let Some(ex) = self.exchanges.remove(&(conn, exchange)) {
                    if gap {
                        ex.actor.do_send(CaptureGap);
                    }
                    let end = if complete {
                        StreamEnd::Complete
                    } else if self.client_closed.contains(&(conn.client, conn.server)) {
                        StreamEnd::ClientGone
                    } else {
                        StreamEnd::UpstreamCut
                    };
                    ex.actor.do_send(BodyEnded { end, at });
                }
            }
            Event::Gap {
                exchange: Some(exchange),
                ..
            } => {
                if let Some(ex) = self.exchanges.get(&(conn, exchange)) {
                    ex.actor.do_send(CaptureGap);
                }
            }
            Event::Gap { exchange: None, .. } => {}
        }
    }

    /// Starts a call actor for a request the decoders know, as the proxy
    /// does (through the link, under the route's name, `seen_by: capture`).
    fn start_call(
        &mut self,
        conn: ConnId,
        exchange: u64,
        method: &str,
        path: &str,
        headers: &Headers,
        at: Instant,
    ) {
        let api = detect_request(method, path, b"").api;
        if api == ApiKind::Unknown {
            return;
        }
        let Some(route) = self.routes.get(&conn.server.port()).filter(|r| !r.retiring) else {
            return;
        };
        let call = CallStart {
            seq: self.engine.next_seq(),
            route: route.name.clone(),
            api,
            started_at: SystemTime::now(),
            method: method.to_owned(),
            path: path.to_owned(),
            dispatched_at: at,
            client: headers
                .user_agent
                .as_deref()
                .and_then(crate::engine::details::client_app),
            seen_by: SeenBy::Capture,
            // The route's poller (shared with its proxy, if it has one):
            // a captured call's wait is explained like a proxied one's.
            telemetry: route.telemetry.clone(),
            peer: Some((conn.client, conn.server)),
        };
        let actor = self.engine.start_call(call);
        self.exchanges.insert(
            (conn, exchange),
            Exchange {
                actor,
                scanner: RequestScanner::default(),
                frames: Arc::default(),
            },
        );
    }
}

/// The proxy's content-type rule ([`http_meta::tap_content_type`]) applied to
/// the captured header values: an encoded body reads as opaque bytes.
fn tap_content_type(h: &Headers) -> Option<String> {
    let mut map = HeaderMap::new();
    if let Some(v) = h
        .content_type
        .as_deref()
        .and_then(|v| HeaderValue::from_str(v).ok())
    {
        map.insert(header::CONTENT_TYPE, v);
    }
    if let Some(v) = h
        .content_encoding
        .as_deref()
        .and_then(|v| HeaderValue::from_str(v).ok())
    {
        map.insert(header::CONTENT_ENCODING, v);
    }
    http_meta::tap_content_type(&map)
}

/// Whole captured calls, packet by packet, down to their settled records.
#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::rig::{play, Rig};
    use super::super::HOLE_WAIT;
    use crate::model::{ApiKind, CallStatus, SeenBy};

    #[actix::test]
    async fn a_clean_captured_call_is_metered_like_a_proxied_one_and_says_capture() {
        let mut rig = Rig::new().await;
        play(&mut rig, "127.0.0.1:50000", None).await;
        let call = rig.settled().await;
        assert_eq!(call.status, CallStatus::Ok, "{call:?}");
        assert_eq!(call.identity.route, "ollama");
        assert_eq!(call.identity.model.as_deref(), Some("m"));
        assert_eq!(call.identity.api, ApiKind::OllamaGenerate);
        assert_eq!(call.details.seen_by, SeenBy::Capture);
        assert_eq!(call.details.client.as_deref(), Some("curl"));
        assert!(!call.details.capture_gap);
        let speed = call.speed.expect("a snapshot");
        // Head 101 ms after the request, first line 50 ms later.
        assert_eq!(speed.time_to_first_token_ms, Some(150));
        assert_eq!(speed.output_tokens, 30);
        // 29 tokens after the first over 29 × 50 ms.
        assert_eq!(speed.output_tokens_per_second, Some(20.0));
    }

    #[actix::test]
    async fn a_lost_segment_flags_the_call_capture_gap_keeps_the_counts_and_shows_no_rate() {
        let mut rig = Rig::new().await;
        play(&mut rig, "127.0.0.1:50001", Some(4)).await;
        // The hole is given up after HOLE_WAIT.
        let later = rig.base + Duration::from_nanos(rig.ts) + HOLE_WAIT * 2;
        rig.task.tick(later);
        let call = rig.settled().await;
        assert!(call.details.capture_gap, "{call:?}");
        assert_eq!(call.details.seen_by, SeenBy::Capture);
        let speed = call.speed.expect("a snapshot");
        assert_eq!(speed.output_tokens_per_second, None);
        assert_eq!(speed.output_tokens, 30, "the server's count is kept");
        assert_eq!(call.input_tokens, Some(7));
    }
}
