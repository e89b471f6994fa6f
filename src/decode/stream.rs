//! [`StreamDecoder`]: response body bytes of one call in, [`StreamEvent`]s
//! out. It ties a framer (SSE, NDJSON, or a buffered JSON body) to the
//! call's protocol decoder; this is what the proxy feeds, read by read.
//!
//! Pure and synchronous: no I/O, no clock. Any byte slicing of the same body
//! gives the same events (only the cut of output text into pieces may
//! differ), and no input makes it panic.

use crate::decode::detect::BodyFraming;
use crate::decode::event::StreamEvent;
use crate::decode::ndjson::NdjsonFramer;
use crate::decode::protocols::{Protocol, SinkState};
use crate::decode::sse::{SseFramer, SseMessage};
use crate::model::ApiKind;

/// The most of a non-streamed body that is buffered for parsing. Far above
/// any real completion (a 32k-token answer is a few hundred KiB of JSON);
/// past it the body is passed on undecoded and counted as unparsed rather
/// than held in memory without bound.
pub const MAX_JSON_BODY_BYTES: usize = 32 * 1024 * 1024;

/// Decodes one response body. Feed it every body slice as it arrives, then
/// call [`finish`](Self::finish) once at the end of the body.
#[derive(Debug)]
pub struct StreamDecoder {
    framer: Framer,
    protocol: Protocol,
    state: SinkState,
    /// Set by `finish`: later feeds are ignored.
    finished: bool,
    /// Reused between feeds to avoid an allocation per read.
    sse_scratch: Vec<SseMessage>,
    line_scratch: Vec<String>,
}

#[derive(Debug)]
enum Framer {
    Sse(SseFramer),
    Ndjson(NdjsonFramer),
    Json(JsonBody),
    /// `BodyFraming::Other`, or an API that is not metered: nothing is
    /// framed or decoded.
    Off {
        streamed: bool,
    },
}

/// A non-streamed body, buffered up to [`MAX_JSON_BODY_BYTES`].
#[derive(Debug, Default)]
struct JsonBody {
    bytes: Vec<u8>,
    overflowed: bool,
}

impl StreamDecoder {
    /// `model`: the request's model name, used only as a hint for
    /// inline-think handling (`ThinkSplitter::model_forces_open`).
    pub fn new(api: ApiKind, framing: BodyFraming, model: Option<&str>) -> Self {
        let protocol = Protocol::new(api);
        let streamed = matches!(framing, BodyFraming::Sse | BodyFraming::Ndjson);
        let framer = if !protocol.is_metered() {
            Framer::Off { streamed }
        } else {
            match framing {
                BodyFraming::Sse => Framer::Sse(SseFramer::new()),
                BodyFraming::Ndjson => Framer::Ndjson(NdjsonFramer::new()),
                BodyFraming::Json => Framer::Json(JsonBody::default()),
                BodyFraming::Other => Framer::Off { streamed },
            }
        };
        Self {
            framer,
            protocol,
            state: SinkState::new(model),
            finished: false,
            sse_scratch: Vec::new(),
            line_scratch: Vec::new(),
        }
    }

    /// Feed any byte slice of the response body (arbitrary split points).
    /// Events are appended to `out`.
    pub fn feed(&mut self, bytes: &[u8], out: &mut Vec<StreamEvent>) {
        if self.finished || bytes.is_empty() {
            return;
        }
        match &mut self.framer {
            Framer::Sse(f) => f.feed(bytes, &mut self.sse_scratch),
            Framer::Ndjson(f) => f.feed(bytes, &mut self.line_scratch),
            Framer::Json(body) => body.push(bytes),
            Framer::Off { .. } => {}
        }
        self.dispatch(out);
    }

    /// End of body: flushes a last unterminated message, decodes a buffered
    /// JSON body, and emits what only the end can tell (a `Done` for a
    /// stream that finished without its marker, text the think splitter
    /// held back). Later calls do nothing.
    pub fn finish(&mut self, out: &mut Vec<StreamEvent>) {
        if self.finished {
            return;
        }
        self.finished = true;
        match &mut self.framer {
            Framer::Sse(f) => f.finish(&mut self.sse_scratch),
            Framer::Ndjson(f) => f.finish(&mut self.line_scratch),
            Framer::Json(_) | Framer::Off { .. } => {}
        }
        self.dispatch(out);
        let mut sink = self.state.sink(out);
        if let Framer::Json(body) = &mut self.framer {
            if body.overflowed {
                sink.unparsed();
            } else {
                let bytes = std::mem::take(&mut body.bytes);
                self.protocol.body(&bytes, &mut sink);
            }
        }
        if !matches!(self.framer, Framer::Off { .. }) {
            self.protocol.finish(&mut sink);
        }
    }

    /// True for SSE/NDJSON framing (a streamed response), false for a JSON
    /// body.
    pub fn is_streamed(&self) -> bool {
        match &self.framer {
            Framer::Sse(_) | Framer::Ndjson(_) => true,
            Framer::Json(_) => false,
            Framer::Off { streamed } => *streamed,
        }
    }

    /// Messages/lines that could not be understood (bad JSON, lines over
    /// the framer's size cap, an oversized JSON body): counted, never fatal.
    pub fn unparsed_messages(&self) -> u64 {
        let dropped = match &self.framer {
            Framer::Sse(f) => f.dropped_lines(),
            Framer::Ndjson(f) => f.dropped_lines(),
            Framer::Json(_) | Framer::Off { .. } => 0,
        };
        self.state.unparsed().saturating_add(dropped)
    }

    /// Hands the framed messages to the protocol decoder.
    fn dispatch(&mut self, out: &mut Vec<StreamEvent>) {
        if self.sse_scratch.is_empty() && self.line_scratch.is_empty() {
            return;
        }
        let mut sink = self.state.sink(out);
        for m in self.sse_scratch.drain(..) {
            self.protocol
                .message(m.event.as_deref(), &m.data, &mut sink);
        }
        for line in self.line_scratch.drain(..) {
            self.protocol.message(None, &line, &mut sink);
        }
    }
}

impl JsonBody {
    fn push(&mut self, bytes: &[u8]) {
        if self.overflowed {
            return;
        }
        if self.bytes.len().saturating_add(bytes.len()) > MAX_JSON_BODY_BYTES {
            // Give the memory back: this body will not be decoded.
            self.overflowed = true;
            self.bytes = Vec::new();
            return;
        }
        self.bytes.extend_from_slice(bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::event::OutputChannel;
    use crate::decode::protocols::testing::text;

    #[test]
    fn json_body_split_anywhere_is_decoded_at_finish() {
        let body = br#"{"choices":[{"message":{"content":"Hi"},"finish_reason":"stop"}],"usage":{"completion_tokens":1}}"#;
        let mut d = StreamDecoder::new(ApiKind::OpenaiChat, BodyFraming::Json, None);
        let mut ev = Vec::new();
        for piece in body.chunks(7) {
            d.feed(piece, &mut ev);
            assert!(ev.is_empty(), "nothing before the body is complete");
        }
        d.finish(&mut ev);
        assert_eq!(text(&ev, OutputChannel::Text), "Hi");
        assert_eq!(ev.last(), Some(&StreamEvent::Done));
        assert!(!d.is_streamed());
        // finish is idempotent, feeds after it are ignored.
        let n = ev.len();
        d.feed(b"more", &mut ev);
        d.finish(&mut ev);
        assert_eq!(ev.len(), n);
    }

    #[test]
    fn oversized_json_body_is_counted_not_buffered() {
        let mut d = StreamDecoder::new(ApiKind::OpenaiChat, BodyFraming::Json, None);
        let mut ev = Vec::new();
        let chunk = vec![b' '; 1024 * 1024];
        for _ in 0..33 {
            d.feed(&chunk, &mut ev);
        }
        d.finish(&mut ev);
        assert!(ev.is_empty());
        assert_eq!(d.unparsed_messages(), 1);
    }

    #[test]
    fn other_framing_and_unknown_api_yield_nothing() {
        let body = b"data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\ndata: [DONE]\n\n";
        for (api, framing, streamed) in [
            (ApiKind::OpenaiChat, BodyFraming::Other, false),
            (ApiKind::Unknown, BodyFraming::Sse, true),
            (ApiKind::Unknown, BodyFraming::Json, false),
        ] {
            let mut d = StreamDecoder::new(api, framing, None);
            let mut ev = Vec::new();
            d.feed(body, &mut ev);
            d.finish(&mut ev);
            assert!(ev.is_empty(), "{api:?} streamed={streamed}");
            assert_eq!(d.unparsed_messages(), 0);
            assert_eq!(d.is_streamed(), streamed);
        }
    }

    /// Pieces that stress the framers and decoders when strung together at
    /// random: field prefixes, every line ending, markers, JSON of every
    /// API, think tags, multibyte and invalid UTF-8.
    const FRAGMENTS: &[&[u8]] = &[
        b"data: ",
        b"data:",
        b"event: error\n",
        b"event: message_stop\n",
        b"error: {\"type\":\"x\"}\n",
        b"\n",
        b"\r\n",
        b"\r",
        b"\n\n",
        b": ping\n\n",
        b"[DONE]",
        b"{\"choices\":[{\"delta\":{\"content\":\"a<think>b\"},\"finish_reason\":\"stop\"}]}",
        b"{\"choices\":[{\"delta\":{\"reasoning\":\"r\",\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]}}]}",
        b"{\"choices\":[],\"usage\":{\"completion_tokens\":3},\"timings\":{\"predicted_n\":3,\"predicted_ms\":9.5}}",
        b"{\"type\":\"response.output_text.delta\",\"delta\":\"t\"}",
        b"{\"type\":\"response.completed\",\"response\":{\"usage\":{\"output_tokens\":2}}}",
        b"{\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"x</think>y\"}}",
        b"{\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":4}}",
        b"{\"message\":{\"content\":\"c\",\"thinking\":\"t\"},\"done\":false}",
        b"{\"response\":\"</think>\",\"done\":true,\"eval_count\":5,\"eval_duration\":1}",
        b"{\"content\":\"n\",\"stop\":true,\"tokens_predicted\":1}",
        b"{\"token\":{\"text\":\"k\",\"special\":false},\"details\":{\"generated_tokens\":1}}",
        b"{\"error\":{\"type\":\"server_error\"}}",
        b"{\"detail\":\"Not Found\"}",
        b"{\"bad json",
        b"}",
        "é€😀".as_bytes(),
        b"\xC3",
        b"\xFF\xFE",
        b"\xEF\xBB\xBF",
        b"  ",
    ];

    fn decode(api: ApiKind, framing: BodyFraming, pieces: &[&[u8]]) -> (Vec<StreamEvent>, u64) {
        let mut d = StreamDecoder::new(api, framing, Some("deepseek-r1"));
        let mut ev = Vec::new();
        for p in pieces {
            d.feed(p, &mut ev);
        }
        d.finish(&mut ev);
        (merge_outputs(ev), d.unparsed_messages())
    }

    /// Adjacent outputs of one channel merged (their cut may follow the
    /// read boundaries; nothing else may).
    fn merge_outputs(events: Vec<StreamEvent>) -> Vec<StreamEvent> {
        let mut out: Vec<StreamEvent> = Vec::new();
        for e in events {
            if let (
                Some(StreamEvent::Output {
                    channel: c0,
                    text: acc,
                }),
                StreamEvent::Output { channel, text },
            ) = (out.last_mut(), &e)
            {
                if c0 == channel {
                    acc.push_str(text);
                    continue;
                }
            }
            out.push(e);
        }
        out
    }

    const FRAMINGS: [BodyFraming; 4] = [
        BodyFraming::Sse,
        BodyFraming::Ndjson,
        BodyFraming::Json,
        BodyFraming::Other,
    ];

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config::with_cases(96))]

        /// Any body, any API, any framing: no panic, no empty output, at
        /// most one `Done`, and the same events however the body is cut.
        #[test]
        fn any_input_is_safe_and_split_invariant(
            picks in proptest::collection::vec(0..FRAGMENTS.len(), 0..40),
            cut_seed in proptest::prelude::any::<u64>(),
        ) {
            let body: Vec<u8> = picks.iter().flat_map(|&i| FRAGMENTS[i].iter().copied()).collect();
            let at = if body.is_empty() { 0 } else { (cut_seed as usize) % (body.len() + 1) };
            let (x, y) = body.split_at(at);
            for api in ApiKind::METERED {
                for framing in FRAMINGS {
                    let whole = decode(api, framing, &[&body]);
                    let split = decode(api, framing, &[x, y]);
                    let bytes: Vec<&[u8]> = body.chunks(1).collect();
                    let byte_by_byte = decode(api, framing, &bytes);
                    proptest::prop_assert_eq!(&split, &whole, "{:?} cut at {}", api, at);
                    proptest::prop_assert_eq!(&byte_by_byte, &whole, "{:?} byte by byte", api);
                    let dones = whole.0.iter().filter(|e| **e == StreamEvent::Done).count();
                    proptest::prop_assert!(dones <= 1);
                    for e in &whole.0 {
                        if let StreamEvent::Output { text, .. } = e {
                            proptest::prop_assert!(!text.is_empty());
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn sse_stream_without_trailing_blank_line() {
        // KoboldCpp wrote its final `[DONE]` without the blank line.
        let mut d = StreamDecoder::new(ApiKind::OpenaiChat, BodyFraming::Sse, None);
        let mut ev = Vec::new();
        d.feed(
            b"data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\r\n\r\ndata: [DONE]",
            &mut ev,
        );
        d.finish(&mut ev);
        assert_eq!(text(&ev, OutputChannel::Text), "x");
        assert_eq!(ev.last(), Some(&StreamEvent::Done));
    }
}
