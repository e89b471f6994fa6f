//! The glue between a decoder and a meter: response bytes and a clock in,
//! snapshots out. This is all the interceptor has to drive per call.
//!
//! A [`CallMetering`] exists from the moment a request is dispatched
//! upstream, because the clock starts then and the first-token wait may
//! happen before the response head arrives (Ollama sends its head with the
//! first chunk). The decoder and the meter are only built when the head
//! arrives, since the API, the framing and the model are only known then.
//!
//! Contract for the caller:
//! - [`CallMetering::start`] once, at dispatch: the first snapshot;
//! - [`CallMetering::on_response_head`] at most once;
//! - [`CallMetering::on_frame`] for every body frame, in order, with its
//!   arrival time; a chunk is never the whole body;
//! - [`CallMetering::tick`] from time to time (every `SNAPSHOT_INTERVAL`),
//!   so a stream that pauses still publishes its pending count;
//! - [`CallMetering::finish`] exactly once, however the call ends.
//!
//! Nothing here fails: input the decoder can't parse is counted and
//! skipped, so a metering problem can never become a proxy problem.

use std::sync::Arc;

use tokio::time::Instant;

use crate::decode::detect::BodyFraming;
use crate::decode::sniff::{sniff_framing, Sniffed};
use crate::decode::stream::StreamDecoder;
use crate::decode::{PromptProgress, ServerTimings, StreamEvent};
use crate::meter::call::CallMeter;
use crate::meter::reasoning::{ReasoningCost, ReasoningSplit};
use crate::model::ApiKind;
use crate::model::{Phase, Snapshot, TokenSource};
use crate::tokens::TokenEstimator;

/// How the response body ended, as the interceptor saw it. This is the
/// transport's story; the protocol's own end marker comes first when
/// [`CallMetering::finish`] decides the [`Outcome`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamEnd {
    /// The upstream finished the body cleanly.
    Complete,
    /// The upstream connection failed or was cut mid-body.
    UpstreamCut,
    /// The client went away before the body ended.
    ClientGone,
}

/// How a metered call came out, decided by [`CallMetering::finish`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Settled: the protocol's terminal marker was seen and no error came
    /// in the stream, however the transport ended afterwards.
    Ok,
    /// The client hung up or the stream was cut before the terminal
    /// marker, or the body ended without one (a truncated stream: counts
    /// kept, no rate).
    Abandoned,
    /// The upstream answered non-2xx, or reported an error inside the
    /// stream (counts kept, no rate).
    UpstreamError,
}

/// Everything known about a call once it ended.
#[derive(Clone, Debug, PartialEq)]
pub struct CallReport {
    /// The final snapshot (`is_final`, phase `complete`).
    pub snapshot: Snapshot,
    /// How it ended.
    pub outcome: Outcome,
    /// A plausible exact/estimate ratio to feed route calibration.
    pub calibration_ratio: Option<f64>,
    /// Prompt tokens, when the server reported them.
    pub input_tokens: Option<u64>,
    /// The server's own timings, merged field by field (latest wins).
    pub server_timings: Option<ServerTimings>,
    /// The server's error type or code when the stream carried an error.
    pub stream_error: Option<String>,
    /// The server's own prose for that error, when it gave one.
    pub stream_error_text: Option<String>,
    /// Messages the decoder could not understand (diagnostics).
    pub unparsed_messages: u64,
    /// The provider's exact output count, when it sent one.
    pub exact_output_tokens: Option<u64>,
    /// The uncalibrated tokenizer estimate of what was streamed.
    pub raw_estimate: u64,
    /// More than one token, all of it in the same frame.
    pub one_burst: bool,
    /// What the call spent reasoning, when it reasoned.
    pub reasoning: Option<ReasoningCost>,
}

/// What the response head said, as far as metering cares.
#[derive(Clone, Debug, PartialEq)]
pub struct ResponseHead {
    pub status: u16,
    pub api: ApiKind,
    pub framing: BodyFraming,
    pub model: Option<String>,
    /// The route's calibration factor for (route, model) at this moment.
    pub calibration: f64,
    /// The request asked for a stream: the body's first bytes decide its
    /// framing ([`sniff_framing`]), `framing` (the label's) only when they
    /// don't.
    pub sniff: bool,
}

/// A 2xx body whose framing its first bytes will decide: the frames so
/// far, kept (at most [`crate::decode::sniff::SNIFF_LIMIT`] and a frame) with their arrival
/// times until then.
struct Sniffing {
    head: ResponseHead,
    prefix: Vec<u8>,
    /// Each frame's end offset in `prefix` and its arrival.
    frames: Vec<(usize, Instant)>,
}

struct Active {
    decoder: StreamDecoder,
    meter: CallMeter,
}

/// One call's decoder and meter, driven by bytes and a clock.
pub struct CallMetering {
    dispatched_at: Instant,
    estimator: Arc<dyn TokenEstimator>,
    active: Option<Active>,
    /// Non-2xx head: the body is passed through but not metered.
    upstream_status_error: bool,
    /// A streamed reply waiting for its first bytes to name its framing.
    sniffing: Option<Sniffing>,
    /// The body turned out to be nothing the decoders read: unmetered.
    not_understood: bool,
    /// When the protocol's terminal marker arrived, if it did.
    done_at: Option<Instant>,
    stream_error: Option<String>,
    stream_error_text: Option<String>,
    input_tokens: Option<u64>,
    server_timings: Option<ServerTimings>,
    /// The latest in-band prefill progress the server sent.
    prompt_progress: Option<PromptProgress>,
    events: Vec<StreamEvent>,
    latest: Snapshot,
    reasoning: ReasoningSplit,
}

impl CallMetering {
    /// A call dispatched upstream at `dispatched_at`.
    pub fn new(dispatched_at: Instant, estimator: Arc<dyn TokenEstimator>) -> Self {
        // The tokenizer loads while this call waits for its first token.
        estimator.prepare();
        CallMetering {
            dispatched_at,
            estimator,
            active: None,
            upstream_status_error: false,
            sniffing: None,
            not_understood: false,
            done_at: None,
            stream_error: None,
            stream_error_text: None,
            input_tokens: None,
            server_timings: None,
            prompt_progress: None,
            events: Vec::new(),
            latest: waiting_snapshot(0),
            reasoning: ReasoningSplit::default(),
        }
    }

    /// The first snapshot, published at once (phase `awaiting_first_token`).
    pub fn start(&mut self) -> Snapshot {
        self.latest = waiting_snapshot(0);
        self.latest.clone()
    }

    /// The response head arrived. A non-2xx status means the body is the
    /// server's error, passed through but not metered.
    pub fn on_response_head(&mut self, head: &ResponseHead) {
        if !(200..300).contains(&head.status) {
            self.upstream_status_error = true;
            return;
        }
        if head.sniff {
            self.sniffing = Some(Sniffing {
                head: head.clone(),
                prefix: Vec::new(),
                frames: Vec::new(),
            });
            return;
        }
        self.activate(head, head.framing);
    }

    /// Starts decoding and metering the body as `framing`; a framing no
    /// decoder reads leaves the call unmetered.
    fn activate(&mut self, head: &ResponseHead, framing: BodyFraming) {
        if framing == BodyFraming::Other {
            self.not_understood = true;
            return;
        }
        let decoder = StreamDecoder::new(head.api, framing, head.model.as_deref());
        let streamed = decoder.is_streamed();
        let mut meter = CallMeter::new(
            self.dispatched_at,
            streamed,
            head.calibration,
            self.estimator.clone(),
        );
        meter.start();
        self.active = Some(Active { decoder, meter });
    }

    /// When the protocol's end marker arrived, if it did: the call is
    /// over then, and its actor settles it without waiting for the body's
    /// end (`docs/metering.md`, "How a call ends").
    pub fn marker_at(&self) -> Option<Instant> {
        self.done_at
    }

    /// Whether the protocol's terminal marker has arrived (the call will
    /// settle `ok` however the transport ends).
    pub fn saw_end_marker(&self) -> bool {
        self.done_at.is_some()
    }

    /// True once a response head with a metered body has been seen (or
    /// one whose first bytes are still to name its framing).
    pub fn is_metering(&self) -> bool {
        self.active.is_some() || self.sniffing.is_some()
    }

    /// The body's bytes turned out to be nothing the decoders read (the
    /// call is listed `unmetered`).
    pub fn not_understood(&self) -> bool {
        self.not_understood
    }

    /// Keeps a frame of a body whose framing is not known yet; once its
    /// bytes (or its end, `ended`) decide, meters every kept frame in
    /// order at its own arrival time. Returns the snapshot due, if any.
    fn sniff_frame(&mut self, bytes: &[u8], now: Instant, ended: bool) -> Option<Snapshot> {
        let sniffing = self.sniffing.as_mut()?;
        if !bytes.is_empty() {
            sniffing.prefix.extend_from_slice(bytes);
            sniffing.frames.push((sniffing.prefix.len(), now));
        }
        let framing = match sniff_framing(&sniffing.prefix, sniffing.head.framing, ended) {
            Sniffed::NeedMore => return None,
            Sniffed::Framing(framing) => framing,
            Sniffed::Undecided => sniffing.head.framing,
        };
        let Sniffing {
            head,
            prefix,
            frames,
        } = self.sniffing.take()?;
        self.activate(&head, framing);
        let mut due = None;
        let mut start = 0;
        for (end, at) in frames {
            if let Some(s) = self.meter_frame(&prefix[start..end], at) {
                due = Some(s);
            }
            start = end;
        }
        due
    }

    /// The latest published snapshot.
    pub fn latest(&self) -> &Snapshot {
        &self.latest
    }

    /// When the first output arrived, if it did.
    pub fn first_output_at(&self) -> Option<Instant> {
        self.active.as_ref().and_then(|a| a.meter.first_output_at())
    }

    /// When the latest output arrived, if any did.
    pub fn last_output_at(&self) -> Option<Instant> {
        self.active.as_ref().and_then(|a| a.meter.last_output_at())
    }

    /// One body frame arrived at `now`. Returns the snapshot to publish, if
    /// one is due (the latest one when several became due in this frame).
    pub fn on_frame(&mut self, bytes: &[u8], now: Instant) -> Option<Snapshot> {
        if self.sniffing.is_some() {
            return self.sniff_frame(bytes, now, false);
        }
        self.meter_frame(bytes, now)
    }

    fn meter_frame(&mut self, bytes: &[u8], now: Instant) -> Option<Snapshot> {
        let active = self.active.as_mut()?;
        if !active.decoder.is_streamed() {
            // A non-streamed body: TTFT is the time to the response body.
            if active.meter.first_output_at().is_none() {
                active.meter.on_response_body(now);
            }
        }
        self.events.clear();
        active.decoder.feed(bytes, &mut self.events);
        self.apply_events(now)
    }

    /// The latest in-band prefill progress (llama.cpp `prompt_progress`),
    /// when the server sent any.
    pub fn prompt_progress(&self) -> Option<PromptProgress> {
        self.prompt_progress
    }

    /// Time passed without a frame: publish pending counts if due.
    pub fn tick(&mut self, now: Instant) -> Option<Snapshot> {
        let snapshot = self.active.as_mut()?.meter.tick(now)?;
        self.latest = snapshot.clone();
        Some(snapshot)
    }

    /// The call ended. Call exactly once.
    ///
    /// The protocol decides before the transport: a call whose stream
    /// carried its terminal marker (`[DONE]`, `message_stop`,
    /// `response.completed`, Ollama's `done: true`, llama.cpp's
    /// `stop: true`, TGI's final `details`) and no error is [`Outcome::Ok`],
    /// whatever the transport's end (`_end`) says. Many clients (the `openai` SDK among them) stop
    /// reading at the marker and close the connection, often before the
    /// upstream's end of body (the chunked terminator) has been forwarded;
    /// an upstream may reset the connection or stall after it, and the idle
    /// timeout may fire. None of that takes anything from a call the server
    /// had finished. Such a call settles at the marker's arrival, so the
    /// transport's tail does not count in its duration. A client gone, a
    /// cut or an end of body before the marker leaves the call
    /// [`Outcome::Abandoned`]; an error in the stream or a non-2xx head
    /// makes it [`Outcome::UpstreamError`].
    pub fn finish(&mut self, _end: StreamEnd, now: Instant) -> CallReport {
        if self.sniffing.is_some() {
            // The body ended before its bytes decided: its end does.
            let _ = self.sniff_frame(&[], now, true);
        }
        if let Some(active) = self.active.as_mut() {
            self.events.clear();
            active.decoder.finish(&mut self.events);
            // A final publish is coming anyway; ignore intermediate ones.
            let _ = self.apply_events(now);
        }
        let unparsed = self
            .active
            .as_ref()
            .map_or(0, |a| a.decoder.unparsed_messages());

        let outcome = if self.upstream_status_error || self.stream_error.is_some() {
            Outcome::UpstreamError
        } else if self.done_at.is_some() {
            Outcome::Ok
        } else {
            Outcome::Abandoned
        };
        // Whatever ended the transport, a call that had its marker ends at
        // the marker: the body's end may come much later (an upstream that
        // stalls before closing, the idle timeout, a client that lingers).
        let now = self.done_at.map_or(now, |done_at| done_at.min(now));
        let (snapshot, calibration_ratio, input_tokens) = match self.active.as_mut() {
            Some(active) if outcome == Outcome::Ok => {
                let settled = active.meter.settle(now);
                (
                    settled.snapshot,
                    settled.calibration_ratio,
                    settled.input_tokens.or(self.input_tokens),
                )
            }
            Some(active) => (active.meter.abandon(now), None, self.input_tokens),
            None => (
                abandoned_before_head(elapsed_ms(self.dispatched_at, now)),
                None,
                None,
            ),
        };
        self.latest = snapshot.clone();
        let (exact_output_tokens, raw_estimate, one_burst) = match &self.active {
            Some(a) => (
                a.meter.usage().output_tokens.filter(|n| *n > 0),
                a.meter.raw_estimate(),
                a.meter.first_output_at().is_some()
                    && a.meter.first_output_at() == a.meter.last_output_at()
                    && snapshot.output_tokens > 1,
            ),
            None => (None, 0, false),
        };
        let reasoning = self.active.as_ref().and_then(|a| {
            self.reasoning
                .settle(snapshot.output_tokens, a.meter.usage().reasoning_tokens)
        });
        CallReport {
            reasoning,
            snapshot,
            outcome,
            calibration_ratio,
            input_tokens,
            server_timings: self.server_timings.clone(),
            stream_error: self.stream_error.clone(),
            stream_error_text: self.stream_error_text.clone(),
            unparsed_messages: unparsed,
            exact_output_tokens,
            raw_estimate,
            one_burst,
        }
    }

    fn apply_events(&mut self, now: Instant) -> Option<Snapshot> {
        let active = self.active.as_mut()?;
        let mut due = None;
        for event in self.events.drain(..) {
            match event {
                StreamEvent::Output { channel, text } => {
                    if !text.is_empty() && !active.meter.is_ended() {
                        let before = self
                            .reasoning
                            .answer_begins(channel)
                            .then(|| active.meter.count_so_far());
                        self.reasoning.on_output(channel, now, before);
                    }
                    if let Some(s) = active.meter.on_output(channel, &text, now) {
                        due = Some(s);
                    }
                }
                StreamEvent::Usage(usage) => {
                    if usage.input_tokens.is_some() {
                        self.input_tokens = usage.input_tokens;
                    }
                    active.meter.on_usage(&usage);
                }
                StreamEvent::ServerTimings(timings) => {
                    merge_timings(&mut self.server_timings, &timings);
                    if let Some(s) = active.meter.on_server_timings(&timings, now) {
                        due = Some(s);
                    }
                }
                StreamEvent::PromptProgress(progress) => {
                    self.prompt_progress = Some(progress);
                }
                StreamEvent::Done => {
                    self.done_at.get_or_insert(now);
                }
                StreamEvent::Error { message, text } => {
                    if self.stream_error.is_none() {
                        self.stream_error = Some(message);
                        self.stream_error_text = text;
                    }
                }
            }
        }
        if let Some(s) = &due {
            self.latest = s.clone();
        }
        due
    }
}

/// Later timings win field by field ([`ServerTimings::merge_from`]).
fn merge_timings(into: &mut Option<ServerTimings>, new: &ServerTimings) {
    into.get_or_insert_with(ServerTimings::default)
        .merge_from(new);
}

fn elapsed_ms(from: Instant, now: Instant) -> u64 {
    now.saturating_duration_since(from).as_millis() as u64
}

fn waiting_snapshot(elapsed_ms: u64) -> Snapshot {
    Snapshot {
        stalled_ms: None,
        phase: Phase::AwaitingFirstToken,
        is_final: false,
        elapsed_ms,
        time_to_first_token_ms: None,
        output_tokens: 0,
        output_tokens_per_second: None,
        token_source: TokenSource::Estimated,
        wait: None,
    }
}

/// A call that ended before any metered body arrived (connection failure,
/// client gone during the wait, non-2xx head).
fn abandoned_before_head(elapsed_ms: u64) -> Snapshot {
    Snapshot {
        stalled_ms: None,
        phase: Phase::Complete,
        is_final: true,
        ..waiting_snapshot(elapsed_ms)
    }
}

#[cfg(test)]
mod tests {
    //! How a call ends: one named test per way the transport can end
    //! around the protocol's terminal marker.

    use std::time::Duration;

    use super::*;
    use crate::tokens::WordCounter;

    const WORDS: u64 = 40;

    fn at(t0: Instant, ms: u64) -> Instant {
        t0 + Duration::from_millis(ms)
    }

    /// An OpenAI chat stream, head received.
    fn chat(t0: Instant) -> CallMetering {
        let mut m = CallMetering::new(t0, Arc::new(WordCounter));
        m.start();
        m.on_response_head(&ResponseHead {
            status: 200,
            api: ApiKind::OpenaiChat,
            framing: BodyFraming::Sse,
            model: Some("m".into()),
            calibration: 1.0,
            sniff: false,
        });
        m
    }

    fn word_frame() -> &'static [u8] {
        b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"w \"}}]}\n\n"
    }

    /// 40 one-word frames every 50 ms from 200 ms (the last at 2,150 ms).
    fn stream_words(m: &mut CallMetering, t0: Instant) {
        for i in 0..WORDS {
            m.on_frame(word_frame(), at(t0, 200 + 50 * i));
        }
    }

    /// The words, then the finish chunk and `[DONE]` at 2,200 ms.
    fn stream_to_marker(m: &mut CallMetering, t0: Instant) {
        stream_words(m, t0);
        m.on_frame(
            b"data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n",
            at(t0, 2200),
        );
    }

    /// (40 - 1) words over the 1.95 s from the first to the last.
    const RATE: f64 = 20.0;

    #[test]
    fn a_clean_end_after_the_marker_is_ok() {
        let t0 = Instant::now();
        let mut m = chat(t0);
        stream_to_marker(&mut m, t0);
        let r = m.finish(StreamEnd::Complete, at(t0, 2201));
        assert_eq!(r.outcome, Outcome::Ok);
        assert_eq!(r.snapshot.output_tokens_per_second, Some(RATE));
        assert_eq!(r.snapshot.elapsed_ms, 2200);
    }

    /// A chat stream labelled `label`, whose framing its bytes decide.
    fn sniffed_chat(t0: Instant, label: BodyFraming) -> CallMetering {
        let mut m = CallMetering::new(t0, Arc::new(WordCounter));
        m.start();
        m.on_response_head(&ResponseHead {
            status: 200,
            api: ApiKind::OpenaiChat,
            framing: label,
            model: Some("m".into()),
            calibration: 1.0,
            sniff: true,
        });
        m
    }

    #[test]
    fn an_sse_stream_labelled_json_or_text_is_metered_as_a_stream() {
        for label in [BodyFraming::Json, BodyFraming::Other] {
            let t0 = Instant::now();
            let mut m = sniffed_chat(t0, label);
            stream_to_marker(&mut m, t0);
            let r = m.finish(StreamEnd::Complete, at(t0, 2201));
            assert_eq!(r.outcome, Outcome::Ok, "{label:?}");
            assert_eq!(r.snapshot.time_to_first_token_ms, Some(200), "{label:?}");
            assert_eq!(r.snapshot.output_tokens_per_second, Some(RATE), "{label:?}");
            assert!(!r.one_burst);
        }
    }

    #[test]
    fn text_that_is_no_stream_labelled_text_stays_unmetered() {
        let t0 = Instant::now();
        let mut m = sniffed_chat(t0, BodyFraming::Other);
        assert_eq!(m.on_frame(b"upstream says hello\n", at(t0, 100)), None);
        assert!(m.not_understood());
        assert!(!m.is_metering());
    }

    #[test]
    fn a_body_that_ends_3_s_after_the_marker_settles_at_the_marker() {
        let t0 = Instant::now();
        let mut m = chat(t0);
        stream_to_marker(&mut m, t0);
        assert_eq!(m.marker_at(), Some(at(t0, 2200)));
        let r = m.finish(StreamEnd::Complete, at(t0, 5200));
        assert_eq!(r.outcome, Outcome::Ok);
        assert_eq!(
            r.snapshot.elapsed_ms, 2200,
            "a stall before the body's end is not the call's time"
        );
    }

    #[test]
    fn a_client_gone_after_the_marker_is_ok_and_settles_at_the_marker() {
        let t0 = Instant::now();
        let mut m = chat(t0);
        stream_to_marker(&mut m, t0);
        let r = m.finish(StreamEnd::ClientGone, at(t0, 9000));
        assert_eq!(r.outcome, Outcome::Ok);
        assert_eq!(r.snapshot.output_tokens, WORDS);
        assert_eq!(r.snapshot.output_tokens_per_second, Some(RATE));
        assert_eq!(
            r.snapshot.elapsed_ms, 2200,
            "the transport's tail is not the call's"
        );
        assert!(r.snapshot.is_final);
    }

    #[test]
    fn an_upstream_cut_after_the_marker_is_ok() {
        let t0 = Instant::now();
        let mut m = chat(t0);
        stream_to_marker(&mut m, t0);
        let r = m.finish(StreamEnd::UpstreamCut, at(t0, 2300));
        assert_eq!(r.outcome, Outcome::Ok);
        assert_eq!(r.snapshot.output_tokens_per_second, Some(RATE));
        assert_eq!(r.snapshot.elapsed_ms, 2200);
    }

    #[test]
    fn a_client_gone_one_frame_before_the_marker_is_abandoned() {
        let t0 = Instant::now();
        let mut m = chat(t0);
        stream_words(&mut m, t0);
        let r = m.finish(StreamEnd::ClientGone, at(t0, 2180));
        assert_eq!(r.outcome, Outcome::Abandoned);
        assert_eq!(r.snapshot.output_tokens, WORDS);
        assert_eq!(r.snapshot.output_tokens_per_second, None);
        assert_eq!(r.snapshot.elapsed_ms, 2180);
        assert_eq!(r.calibration_ratio, None);
    }

    #[test]
    fn a_clean_end_without_the_marker_is_abandoned() {
        let t0 = Instant::now();
        let mut m = chat(t0);
        stream_words(&mut m, t0);
        let r = m.finish(StreamEnd::Complete, at(t0, 2200));
        assert_eq!(r.outcome, Outcome::Abandoned);
        assert_eq!(r.snapshot.output_tokens_per_second, None);
    }

    #[test]
    fn an_error_in_the_stream_wins_over_the_marker() {
        let t0 = Instant::now();
        let mut m = chat(t0);
        stream_words(&mut m, t0);
        m.on_frame(
            b"data: {\"error\":{\"type\":\"server_error\",\"message\":\"boom\"}}\n\ndata: [DONE]\n\n",
            at(t0, 2200),
        );
        let r = m.finish(StreamEnd::ClientGone, at(t0, 2300));
        assert_eq!(r.outcome, Outcome::UpstreamError);
        assert_eq!(r.snapshot.output_tokens_per_second, None);
    }

    #[test]
    fn a_client_gone_before_the_head_is_abandoned() {
        let t0 = Instant::now();
        let mut m = CallMetering::new(t0, Arc::new(WordCounter));
        m.start();
        let r = m.finish(StreamEnd::ClientGone, at(t0, 700));
        assert_eq!(r.outcome, Outcome::Abandoned);
        assert_eq!(r.snapshot.elapsed_ms, 700);
    }
}
