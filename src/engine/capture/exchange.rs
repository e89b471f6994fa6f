//! One captured HTTP exchange turned into a call: the connection table's
//! events (request head and body, response head and body, the end, lost
//! bytes) become the same call actor messages the proxy's taps send. A
//! request the decoders know starts its call through
//! [`EngineLink::start_call`](crate::engine::link::EngineLink::start_call),
//! as the proxy's do.
//!
//! Lost bytes are never papered over. A gap in the request stops its
//! scanner (bytes after a gap can't be placed in the JSON, and a `model`
//! read from a message's text would be a wrong name); a response that
//! ends while its request is still incomplete had request bytes lost too.
//! Either way the call is flagged [`CaptureGap`], and if the request named
//! no model before its loss, the model the response names is taken
//! ([`ModelSniffer`], [`ResponseModel`]).

use std::sync::Arc;
use std::time::SystemTime;

use actix::Addr;
use http::{header, HeaderMap, HeaderValue};
use tokio::time::Instant;

use super::sniff::ModelSniffer;
use super::CaptureTask;
use crate::capture::flows::{CaptureEvent, ConnId};
use crate::capture::http1::{Event, Headers};
use crate::decode::detect::detect_request;
use crate::decode::request_fields::RequestScanner;
use crate::engine::call_actor::CallActor;
use crate::engine::http_meta;
use crate::engine::link::CallStart;
use crate::engine::messages::{
    BodyEnded, CaptureGap, Frame, FrameQueue, FramesQueued, RequestFieldsSeen, ResponseModel,
    ResponseStarted,
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
    /// The request's body reached its end with nothing lost.
    request_complete: bool,
    /// Bytes of the request were lost (or it was cut short): its scanner
    /// stopped, and a model may come from the response.
    request_lost: bool,
    /// Reads the model the response names.
    sniffer: ModelSniffer,
    /// The response's model was sent to the actor.
    model_sent: bool,
    /// [`FlowQuiet`](crate::engine::messages::FlowQuiet) was sent since
    /// the last response bytes.
    pub(super) quiet_told: bool,
}

impl Exchange {
    /// The request lost bytes: no more scanning, the call is flagged.
    fn lose_request(&mut self) {
        if !self.request_lost {
            self.request_lost = true;
            self.actor.do_send(CaptureGap);
        }
        self.tell_model();
    }

    /// Names the call after the response's model, once, when the request
    /// lost bytes before naming one.
    fn tell_model(&mut self) {
        if self.model_sent || !self.request_lost || self.scanner.fields().model.is_some() {
            return;
        }
        if let Some(model) = self.sniffer.model() {
            self.model_sent = true;
            self.actor.do_send(ResponseModel(model.to_owned()));
        }
    }
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
                    if !ex.request_lost && !ex.scanner.is_finished() && ex.scanner.feed(&bytes) {
                        ex.actor
                            .do_send(RequestFieldsSeen(ex.scanner.fields().clone()));
                    }
                }
            }
            Event::RequestEnd { exchange, complete } => {
                if let Some(ex) = self.exchanges.get_mut(&(conn, exchange)) {
                    if complete {
                        ex.request_complete = true;
                    } else {
                        ex.lose_request();
                    }
                }
            }
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
                if let Some(ex) = self.exchanges.get_mut(&(conn, exchange)) {
                    ex.quiet_told = false;
                    if !ex.model_sent {
                        ex.sniffer.feed(&bytes);
                        ex.tell_model();
                    }
                    if ex.frames.push(Frame { bytes, at }) {
                        ex.actor.do_send(FramesQueued(ex.frames.clone()));
                    }
                }
            }
            Event::ResponseEnd {
                exchange,
                complete,
                gap,
            } => self.response_end(conn, exchange, complete, gap, at),
            Event::Gap {
                exchange: Some(exchange),
                from_client,
                ..
            } => {
                if let Some(ex) = self.exchanges.get_mut(&(conn, exchange)) {
                    if from_client {
                        ex.lose_request();
                    } else {
                        ex.sniffer.gap();
                        ex.actor.do_send(CaptureGap);
                    }
                }
            }
            Event::Gap { exchange: None, .. } => {}
        }
    }

    /// The response of `exchange` ended: the call's end, after its gap
    /// flag and (its request cut short) the response's model.
    fn response_end(
        &mut self,
        conn: ConnId,
        exchange: u64,
        complete: bool,
        gap: bool,
        at: Instant,
    ) {
        let Some(mut ex) = self.exchanges.remove(&(conn, exchange)) else {
            return;
        };
        if gap {
            ex.actor.do_send(CaptureGap);
        }
        // The response is over and its request never was: the rest of the
        // request was lost in capture.
        if !ex.request_complete {
            ex.lose_request();
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
        self.calls_started += 1;
        self.exchanges.insert(
            (conn, exchange),
            Exchange {
                actor,
                scanner: RequestScanner::default(),
                frames: Arc::default(),
                request_complete: false,
                request_lost: false,
                sniffer: ModelSniffer::default(),
                model_sent: false,
                quiet_told: false,
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

    use super::super::rig::{head, lines, play, Rig, SERVER};
    use super::super::HOLE_WAIT;
    use crate::capture::flows::script::Talk;
    use crate::model::{ApiKind, CallStatus, SeenBy};

    /// Plays one Ollama call whose request carries `header_bytes` of one
    /// extra header and `pad_bytes` of prompt before its `model`, in
    /// loopback-sized (60,000-byte) segments.
    async fn play_big(rig: &mut Rig, client: &str, header_bytes: usize, pad_bytes: usize) {
        let body = format!(
            r#"{{"prompt":"{}","stream":true,"model":"big"}}"#,
            "x".repeat(pad_bytes)
        );
        let request = format!(
            "POST /api/generate HTTP/1.1\r\nHost: 127.0.0.1:11434\r\nX-Trace: {}\r\n\
             Content-Length: {}\r\n\r\n{body}",
            "t".repeat(header_bytes),
            body.len()
        );
        let mut talk = Talk::new(client, SERVER, 1, 2);
        for seg in talk.handshake() {
            rig.feed(seg, 0);
        }
        for piece in request.as_bytes().chunks(60_000) {
            let seg = talk.client(piece);
            rig.feed(seg, 0);
        }
        let lines = lines();
        let seg = talk.server(&head(lines.iter().map(String::len).sum()));
        rig.feed(seg, 100);
        for line in &lines {
            let seg = talk.server(line.as_bytes());
            rig.feed(seg, 50);
        }
        for from_client in [true, false] {
            let seg = talk.fin(from_client);
            rig.feed(seg, 1);
        }
    }

    #[actix::test]
    async fn a_call_with_a_capture_gap_teaches_no_calibration_and_a_clean_one_does() {
        let mut rig = Rig::new().await;
        // 29 of 30 lines seen and the receipt's 30: a ratio that is the
        // loss, not the tokenizer's drift.
        play(&mut rig, "127.0.0.1:50010", Some(4)).await;
        rig.task.tick(rig.now() + HOLE_WAIT * 2);
        let call = rig.settled().await;
        assert!(call.details.capture_gap, "{call:?}");
        assert!(rig.calibration.read().expect("table").is_empty());
        play(&mut rig, "127.0.0.1:50011", None).await;
        let call = rig.settled().await;
        assert!(!call.details.capture_gap, "{call:?}");
        assert_eq!(rig.calibration.read().expect("table").len(), 1);
    }

    #[actix::test]
    async fn request_heads_of_150_and_300_kib_are_recorded_once() {
        let mut rig = Rig::new().await;
        for (i, kib) in [150, 300].into_iter().enumerate() {
            play_big(&mut rig, &format!("127.0.0.1:5100{i}"), kib << 10, 10).await;
            let call = rig.settled().await;
            assert_eq!(call.status, CallStatus::Ok, "{kib} KiB: {call:?}");
            assert_eq!(call.identity.model.as_deref(), Some("big"));
        }
        assert_eq!(rig.task.calls_started(), 2, "each once");
    }

    #[actix::test]
    async fn a_request_head_over_the_configured_cap_is_not_taken_for_a_call() {
        let mut rig = Rig::new().await;
        rig.task.flows.set_max_request_head(100 << 10);
        play_big(&mut rig, "127.0.0.1:51003", 150 << 10, 10).await;
        assert_eq!(rig.task.calls_started(), 0);
    }

    #[actix::test]
    async fn a_20_mb_request_keeps_the_model_written_after_its_prompt() {
        let mut rig = Rig::new().await;
        play_big(&mut rig, "127.0.0.1:51004", 10, 20 << 20).await;
        let call = rig.settled().await;
        assert_eq!(call.identity.model.as_deref(), Some("big"), "{call:?}");
        assert!(!call.details.capture_gap);
    }

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
