//! Per-API decoders: one framed message (an SSE event's data, an NDJSON
//! line) or one whole JSON body in, [`StreamEvent`]s out.
//!
//! Each API family has its own module; this one holds what they share:
//! - `Protocol`, the dispatch over the families, with the checks every
//!   API gets the same way (`[DONE]`, bad JSON, error objects);
//! - `Sink`, where decoders put what they learned. It owns the rules that
//!   hold for every API: output text is never empty, visible text goes
//!   through the inline-`<think>` splitter, `Done` is emitted at most once.
//!
//! Decoders are liberal: unknown fields and event types are ignored, a
//! message that does not parse is counted (`Sink::unparsed`) and skipped,
//! and nothing here panics on any input.

use serde_json::Value;

use crate::decode::event::{OutputChannel, PromptProgress, ServerTimings, StreamEvent, Usage};
use crate::decode::ndjson::NdjsonFramer;
use crate::decode::sse::SseFramer;
use crate::decode::think::ThinkSplitter;
use crate::model::ApiKind;

pub mod anthropic;
pub mod json;
pub mod llamacpp;
pub mod ollama;
pub mod openai_chat;
pub mod openai_completions;
pub mod openai_responses;
pub mod tgi;

/// The decoder of one API family, chosen once per call from its [`ApiKind`].
#[derive(Debug)]
pub(crate) enum Protocol {
    OpenaiChat(openai_chat::Decoder),
    OpenaiCompletions(openai_completions::Decoder),
    OpenaiResponses(openai_responses::Decoder),
    Anthropic(anthropic::Decoder),
    /// Ollama `/api/chat` and `/api/generate` share one decoder: they differ
    /// only in where the text sits (`message.content` vs `response`).
    Ollama(ollama::Decoder),
    Llamacpp(llamacpp::Decoder),
    Tgi(tgi::Decoder),
    /// Not an LLM call: decodes nothing.
    Unknown,
}

impl Protocol {
    pub(crate) fn new(api: ApiKind) -> Self {
        match api {
            ApiKind::OpenaiChat => Self::OpenaiChat(Default::default()),
            ApiKind::OpenaiCompletions => Self::OpenaiCompletions(Default::default()),
            ApiKind::OpenaiResponses => Self::OpenaiResponses(Default::default()),
            ApiKind::AnthropicMessages => Self::Anthropic(Default::default()),
            ApiKind::OllamaChat | ApiKind::OllamaGenerate => Self::Ollama(Default::default()),
            ApiKind::LlamacppCompletion => Self::Llamacpp(Default::default()),
            ApiKind::TgiGenerate => Self::Tgi(Default::default()),
            ApiKind::Unknown => Self::Unknown,
        }
    }

    /// False for `Protocol::Unknown`: its bodies need not be framed at all.
    pub(crate) fn is_metered(&self) -> bool {
        !matches!(self, Self::Unknown)
    }

    /// One framed message. `event` is the SSE event type (`None` for the
    /// default type and for NDJSON lines), `data` its payload.
    ///
    /// Checks shared by every API, in order: empty data is nothing (a bare
    /// `event:` or keep-alive); `[DONE]` is `Done` (an OpenAI convention,
    /// but no other API sends that text, so it is honoured everywhere);
    /// data that is not a JSON object is counted as unparsed, except under
    /// an SSE `error` event, which is an error whatever its payload; an
    /// object under an `error` event, with a non-null `error` field or with
    /// `"type": "error"` is an `Error` and nothing else.
    pub(crate) fn message(&mut self, event: Option<&str>, data: &str, sink: &mut Sink<'_>) {
        if !self.is_metered() {
            return;
        }
        let is_error_event = event == Some("error");
        let data = data.trim();
        if data.is_empty() {
            if is_error_event {
                sink.error("error".to_owned());
            }
            return;
        }
        if data == "[DONE]" {
            sink.done();
            return;
        }
        // The hot path: the common chunk shapes read into borrowed typed
        // structs, no `Value` tree built. Anything they don't cover (a
        // receipt, an error, a tool call, an odd type, a repeated key) is
        // declined and read below, exactly as before.
        if !is_error_event && data.starts_with('{') && self.fast_message(event, data, sink) {
            return;
        }
        self.value_message(event, data, sink);
    }

    /// The rest of [`message`](Self::message): `data` (trimmed, not
    /// `[DONE]`) read as a `serde_json::Value`, whatever its shape.
    fn value_message(&mut self, event: Option<&str>, data: &str, sink: &mut Sink<'_>) {
        let is_error_event = event == Some("error");
        let value = match serde_json::from_str::<Value>(data) {
            Ok(v) if v.is_object() => v,
            _ => {
                if is_error_event {
                    sink.error("error".to_owned());
                } else {
                    sink.unparsed();
                }
                return;
            }
        };
        if is_error_event || is_error_object(&value) {
            sink.error_value(&value);
            return;
        }
        match self {
            Self::OpenaiChat(d) => d.message(&value, sink),
            Self::OpenaiCompletions(d) => d.message(&value, sink),
            Self::OpenaiResponses(d) => d.message(event, &value, sink),
            Self::Anthropic(d) => d.message(event, &value, sink),
            Self::Ollama(d) => d.message(&value, sink),
            Self::Llamacpp(d) => d.message(&value, sink),
            Self::Tgi(d) => d.message(&value, sink),
            Self::Unknown => {}
        }
    }

    /// One message read by its decoder's typed fast path; false when the
    /// decoder declines it (then nothing was emitted and nothing changed).
    fn fast_message(&mut self, event: Option<&str>, data: &str, sink: &mut Sink<'_>) -> bool {
        match self {
            Self::OpenaiChat(d) => d.fast_message(data, sink),
            Self::Anthropic(_) => anthropic::fast_message(event, data, sink),
            Self::Ollama(_) => ollama::fast_message(data, sink),
            Self::Llamacpp(_) => llamacpp::fast_message(data, sink),
            _ => false,
        }
    }

    /// A whole non-streamed body (`BodyFraming::Json`).
    ///
    /// It normally is one JSON value, decoded into the same events a stream
    /// would give, ending with `Done` when it is a recognised response. An
    /// array is decoded element by element (TGI and llama.cpp answer a
    /// batch of prompts with one). An error body (`{"error": ...}`,
    /// `"type": "error"`, FastAPI's `{"detail": ...}`) gives `Error`.
    ///
    /// Being liberal: a body that is not one JSON value but looks like an
    /// event stream (`data:`/`event:` lines, a server that mislabelled its
    /// stream) is framed as SSE; otherwise it is tried as NDJSON, line by
    /// line. Whatever still does not parse is counted as unparsed.
    pub(crate) fn body(&mut self, body: &[u8], sink: &mut Sink<'_>) {
        if !self.is_metered() {
            return;
        }
        let body = trim_body(body);
        if body.is_empty() {
            return;
        }
        let parsed = serde_json::from_slice::<Value>(body).or_else(|_| {
            // Invalid UTF-8 inside a string: decode lossily and retry.
            serde_json::from_str::<Value>(&String::from_utf8_lossy(body))
        });
        match parsed {
            Ok(v) => {
                if self.body_value(&v, sink) {
                    sink.done();
                }
            }
            Err(_) if looks_like_sse(body) => {
                let mut framer = SseFramer::new();
                let mut messages = Vec::new();
                framer.feed(body, &mut messages);
                framer.finish(&mut messages);
                for m in &messages {
                    self.message(m.event.as_deref(), &m.data, sink);
                }
            }
            Err(_) => {
                let mut framer = NdjsonFramer::new();
                let mut lines = Vec::new();
                framer.feed(body, &mut lines);
                framer.finish(&mut lines);
                for line in &lines {
                    self.message(None, line, sink);
                }
            }
        }
    }

    /// Decodes one body value; true when it was a recognised response (the
    /// caller then emits `Done` once, after every element of a batch).
    fn body_value(&mut self, v: &Value, sink: &mut Sink<'_>) -> bool {
        match v {
            Value::Array(items) => {
                let mut recognised = false;
                for item in items {
                    recognised |= self.body_value(item, sink);
                }
                recognised
            }
            Value::Object(map) => {
                if is_error_object(v) {
                    sink.error_value(v);
                    return false;
                }
                let recognised = match self {
                    Self::OpenaiChat(d) => d.body(v, sink),
                    Self::OpenaiCompletions(d) => d.body(v, sink),
                    Self::OpenaiResponses(d) => d.body(v, sink),
                    Self::Anthropic(d) => d.body(v, sink),
                    Self::Ollama(d) => d.body(v, sink),
                    Self::Llamacpp(d) => d.body(v, sink),
                    Self::Tgi(d) => d.body(v, sink),
                    Self::Unknown => false,
                };
                if !recognised {
                    if map.contains_key("detail") {
                        // FastAPI (llama-cpp-python, vLLM) errors: `{"detail": ...}`.
                        sink.error_value(v);
                    } else {
                        sink.unparsed();
                    }
                }
                recognised
            }
            _ => {
                sink.unparsed();
                false
            }
        }
    }

    /// End of body: a stream that ended without its terminal marker but
    /// after the protocol said generation finished (`finish_reason`,
    /// `stop_reason`) gets its `Done` here. See each decoder's `finish`.
    pub(crate) fn finish(&mut self, sink: &mut Sink<'_>) {
        match self {
            Self::OpenaiChat(d) => d.finish(sink),
            Self::OpenaiCompletions(d) => d.finish(sink),
            Self::OpenaiResponses(_) | Self::Ollama(_) | Self::Llamacpp(_) | Self::Tgi(_) => {}
            Self::Anthropic(d) => d.finish(sink),
            Self::Unknown => {}
        }
        sink.flush_text();
    }
}

/// `{"error": <non-null>}` or `{"type": "error"}`: an error report, in
/// every API's spelling (OpenAI, Ollama, TGI, Anthropic, Responses).
fn is_error_object(v: &Value) -> bool {
    v.get("error")
        .is_some_and(|e| !e.is_null() && e != &Value::Bool(false))
        || v.get("type").and_then(Value::as_str) == Some("error")
}

/// Strips a UTF-8 BOM and surrounding ASCII whitespace.
fn trim_body(body: &[u8]) -> &[u8] {
    let body = body.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(body);
    let start = body.iter().position(|b| !b.is_ascii_whitespace());
    let end = body.iter().rposition(|b| !b.is_ascii_whitespace());
    match (start, end) {
        (Some(s), Some(e)) => &body[s..=e],
        _ => &[],
    }
}

fn looks_like_sse(body: &[u8]) -> bool {
    body.starts_with(b"data:") || body.starts_with(b"event:") || body.starts_with(b":")
}

/// The per-call state behind a `Sink`: the inline-think stage, the `Done`
/// latch and the unparsed-message count. Kept by the stream decoder across
/// feeds.
#[derive(Debug)]
pub(crate) struct SinkState {
    think: InlineThink,
    done: bool,
    unparsed: u64,
}

impl SinkState {
    /// `model` is the request's model name, only a hint for inline thinking
    /// ([`ThinkSplitter::model_forces_open`]).
    pub(crate) fn new(model: Option<&str>) -> Self {
        Self {
            think: InlineThink {
                model_forces_open: model.is_some_and(ThinkSplitter::model_forces_open),
                split_reasoning_seen: false,
                splitter: None,
                splitters_made: 0,
                scratch: Vec::new(),
            },
            done: false,
            unparsed: 0,
        }
    }

    /// Messages (or bodies) that could not be understood so far.
    pub(crate) fn unparsed(&self) -> u64 {
        self.unparsed
    }

    /// Binds the state to an output vector for one feed.
    pub(crate) fn sink<'a>(&'a mut self, out: &'a mut Vec<StreamEvent>) -> Sink<'a> {
        Sink { out, state: self }
    }
}

/// Visible text can still hold inline `<think>...</think>` (servers that do
/// not split reasoning, raw completions, llama.cpp `/completion`), so all
/// `Text` output passes through one [`ThinkSplitter`] per call.
///
/// Forced-open thinking (DeepSeek-R1 style: the prompt already ends in
/// `<think>`, the output only has `</think>`) is assumed from the model
/// name, but only while the server has not shown that it splits reasoning
/// itself: once a separate reasoning field was seen (`reasoning_content`,
/// `thinking`, `thinking_delta`, ...), the text that follows is the answer,
/// and treating it as open reasoning waiting for a `</think>` that never
/// comes would misfile the whole answer. The splitter is created on the
/// first text, so a server that sends reasoning first (they all do) is
/// recognised in time. Known limit: a forced-open model whose server splits
/// reasoning but sent none (thinking disabled) has its text filed as
/// reasoning; the counts are right, only the phase is off.
struct InlineThink {
    model_forces_open: bool,
    split_reasoning_seen: bool,
    splitter: Option<ThinkSplitter>,
    /// After the first splitter was finished (at `Done`), any later text
    /// gets a fresh splitter that is never forced open.
    splitters_made: u32,
    scratch: Vec<(OutputChannel, String)>,
}

impl std::fmt::Debug for InlineThink {
    // By hand: the splitter's state is text, which is never printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InlineThink")
            .field("model_forces_open", &self.model_forces_open)
            .field("split_reasoning_seen", &self.split_reasoning_seen)
            .field("splitter_active", &self.splitter.is_some())
            .field("splitters_made", &self.splitters_made)
            .finish()
    }
}

/// Where a decoder puts what it learned. Bound to one output vector.
pub(crate) struct Sink<'a> {
    out: &'a mut Vec<StreamEvent>,
    state: &'a mut SinkState,
}

impl Sink<'_> {
    /// Visible answer text (through the inline-think splitter).
    pub(crate) fn text(&mut self, text: &str) {
        if text.is_empty() {
            return;
        }
        let think = &mut self.state.think;
        if think.splitter.is_none() {
            let forced =
                think.model_forces_open && !think.split_reasoning_seen && think.splitters_made == 0;
            think.splitters_made = think.splitters_made.saturating_add(1);
            think.splitter = Some(ThinkSplitter::new(forced));
        }
        if let Some(splitter) = think.splitter.as_mut() {
            splitter.push(text, &mut think.scratch);
        }
        self.drain_think();
    }

    /// Reasoning text from a field the server split out itself.
    pub(crate) fn reasoning(&mut self, text: &str) {
        self.state.think.split_reasoning_seen = true;
        self.output(OutputChannel::Reasoning, text);
    }

    /// Tool-call text (names and arguments).
    pub(crate) fn tool(&mut self, text: &str) {
        self.output(OutputChannel::ToolArguments, text);
    }

    pub(crate) fn usage(&mut self, usage: Option<Usage>) {
        if let Some(u) = usage {
            self.out.push(StreamEvent::Usage(u));
        }
    }

    pub(crate) fn prompt_progress(&mut self, progress: Option<PromptProgress>) {
        if let Some(p) = progress {
            self.out.push(StreamEvent::PromptProgress(p));
        }
    }

    pub(crate) fn timings(&mut self, timings: Option<ServerTimings>) {
        if let Some(t) = timings {
            self.out.push(StreamEvent::ServerTimings(t));
        }
    }

    /// The terminal marker. Text held back by the think splitter is flushed
    /// first, so no output follows `Done` for a well-formed stream; a
    /// second marker is ignored.
    pub(crate) fn done(&mut self) {
        if self.state.done {
            return;
        }
        self.flush_text();
        self.state.done = true;
        self.out.push(StreamEvent::Done);
    }

    pub(crate) fn error(&mut self, message: String) {
        self.out.push(StreamEvent::Error {
            message,
            text: None,
        });
    }

    /// An error event read from a JSON value: its type or code, and its
    /// prose.
    pub(crate) fn error_value(&mut self, value: &Value) {
        self.out.push(StreamEvent::Error {
            message: json::error_message(value),
            text: json::error_code(value),
        });
    }

    /// A message that could not be understood (counted, never fatal).
    pub(crate) fn unparsed(&mut self) {
        self.state.unparsed += 1;
    }

    /// Releases text the think splitter holds back (end of body or `Done`).
    pub(crate) fn flush_text(&mut self) {
        let think = &mut self.state.think;
        if let Some(mut splitter) = think.splitter.take() {
            splitter.finish(&mut think.scratch);
            self.drain_think();
        }
    }

    fn drain_think(&mut self) {
        let scratch = std::mem::take(&mut self.state.think.scratch);
        for (channel, text) in &scratch {
            self.output(*channel, text);
        }
        let mut scratch = scratch;
        scratch.clear();
        self.state.think.scratch = scratch;
    }

    fn output(&mut self, channel: OutputChannel, text: &str) {
        if text.is_empty() {
            return;
        }
        self.out.push(StreamEvent::Output {
            channel,
            text: text.to_owned(),
        });
    }
}

#[cfg(test)]
pub(crate) mod testing {
    //! Helpers for the per-protocol unit tests: feed messages straight to a
    //! protocol (no framing), or bytes through the whole stream decoder.

    use super::*;

    /// Decodes SSE-style messages `(event, data)` with a fresh protocol,
    /// then finishes the stream.
    pub(crate) fn messages(
        api: ApiKind,
        model: Option<&str>,
        msgs: &[(Option<&str>, &str)],
    ) -> (Vec<StreamEvent>, u64) {
        let mut proto = Protocol::new(api);
        let mut state = SinkState::new(model);
        let mut out = Vec::new();
        {
            let mut sink = state.sink(&mut out);
            for (event, data) in msgs {
                proto.message(*event, data, &mut sink);
            }
            proto.finish(&mut sink);
        }
        (out, state.unparsed())
    }

    /// Data-only messages (OpenAI-style SSE data, NDJSON lines).
    pub(crate) fn lines(
        api: ApiKind,
        model: Option<&str>,
        lines: &[&str],
    ) -> (Vec<StreamEvent>, u64) {
        let msgs: Vec<(Option<&str>, &str)> = lines.iter().map(|l| (None, *l)).collect();
        messages(api, model, &msgs)
    }

    /// A whole JSON body.
    pub(crate) fn body(api: ApiKind, model: Option<&str>, body: &str) -> (Vec<StreamEvent>, u64) {
        let mut proto = Protocol::new(api);
        let mut state = SinkState::new(model);
        let mut out = Vec::new();
        {
            let mut sink = state.sink(&mut out);
            proto.body(body.as_bytes(), &mut sink);
            proto.finish(&mut sink);
        }
        (out, state.unparsed())
    }

    /// Concatenated output text of one channel.
    pub(crate) fn text(events: &[StreamEvent], channel: OutputChannel) -> String {
        events
            .iter()
            .filter_map(|e| match e {
                StreamEvent::Output { channel: c, text } if *c == channel => Some(text.as_str()),
                _ => None,
            })
            .collect()
    }

    /// The usage receipts merged field by field, later ones winning.
    pub(crate) fn usage(events: &[StreamEvent]) -> Option<Usage> {
        let mut merged: Option<Usage> = None;
        for e in events {
            if let StreamEvent::Usage(u) = e {
                let m = merged.get_or_insert_with(Usage::default);
                m.output_tokens = u.output_tokens.or(m.output_tokens);
                m.input_tokens = u.input_tokens.or(m.input_tokens);
                m.reasoning_tokens = u.reasoning_tokens.or(m.reasoning_tokens);
                m.cached_input_tokens = u.cached_input_tokens.or(m.cached_input_tokens);
            }
        }
        merged
    }

    /// The last server timings event.
    pub(crate) fn timings(events: &[StreamEvent]) -> Option<ServerTimings> {
        events.iter().rev().find_map(|e| match e {
            StreamEvent::ServerTimings(t) => Some(t.clone()),
            _ => None,
        })
    }

    pub(crate) fn count_done(events: &[StreamEvent]) -> usize {
        events.iter().filter(|e| **e == StreamEvent::Done).count()
    }

    pub(crate) fn errors(events: &[StreamEvent]) -> Vec<String> {
        events
            .iter()
            .filter_map(|e| match e {
                StreamEvent::Error { message, .. } => Some(message.clone()),
                _ => None,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;

    /// Decodes `messages` in order twice, once as `Protocol::message` does
    /// (fast path first) and once through the `Value` reader only: the
    /// events, the unparsed count and the end must be the same.
    fn fast_and_value_agree(api: ApiKind, messages: &[(Option<&str>, &str)]) -> usize {
        let mut taken = 0;
        let (mut fast, mut slow) = (Protocol::new(api), Protocol::new(api));
        let (mut fast_state, mut slow_state) = (SinkState::new(None), SinkState::new(None));
        let (mut fast_out, mut slow_out) = (Vec::new(), Vec::new());
        for (event, data) in messages {
            let mut sink = fast_state.sink(&mut fast_out);
            let before = sink.out.len();
            if fast.fast_message(*event, data, &mut sink) {
                taken += 1;
            } else {
                assert_eq!(sink.out.len(), before, "a declined message emitted nothing");
                fast.value_message(*event, data, &mut sink);
            }
            slow.value_message(*event, data, &mut slow_state.sink(&mut slow_out));
        }
        fast.finish(&mut fast_state.sink(&mut fast_out));
        slow.finish(&mut slow_state.sink(&mut slow_out));
        assert_eq!(fast_out, slow_out, "{messages:?}");
        assert_eq!(fast_state.unparsed(), slow_state.unparsed());
        taken
    }

    #[test]
    fn the_typed_fast_paths_decode_exactly_like_the_value_reader() {
        let chat = [
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":null},"finish_reason":null}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":"Hel\u00e9 \"q\"\n"}}],"id":"x","object":"chat.completion.chunk"}"#,
            r#"{"choices":[{"delta":{"reasoning_content":"why","reasoning":"why"}}]}"#,
            r#"{"choices":[{"delta":{"reasoning_content":"a","reasoning":"b","content":"<think>c"}}]}"#,
            r#"{"choices":[{"delta":{"content":"</think>d","refusal":"no"}}]}"#,
            r#"{"choices":[{"delta":{"content":["x"]}}]}"#,
            r#"{"choices":[{"delta":{"content":"dup"},"delta":{"content":"again"}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"function":{"name":"f","arguments":"{}"}}]}}]}"#,
            r#"{"choices":[{"delta":{},"finish_reason":"null"}]}"#,
            r#"{"choices":[{"delta":{},"finish_reason":"stop"}],"usage":null}"#,
            r#"{"choices":[],"usage":{"completion_tokens":5}}"#,
            r#"{"error":false,"choices":[{"delta":{"content":"e"}}]}"#,
        ];
        let chat: Vec<_> = chat.iter().map(|d| (None, *d)).collect();
        assert!(fast_and_value_agree(ApiKind::OpenaiChat, &chat) >= 6);

        let ollama = [
            r#"{"model":"m","message":{"role":"assistant","content":"","thinking":"Let"},"done":false}"#,
            r#"{"model":"m","message":{"role":"assistant","content":"Hi\n"},"done":false}"#,
            r#"{"model":"m","response":"<think>x</think>y","thinking":null,"done":false}"#,
            r#"{"model":"m","message":{"tool_calls":[{"function":{"name":"f","arguments":{}}}]},"done":false}"#,
            r#"{"model":"m","message":{"content":5},"done":false}"#,
            r#"{"model":"m","response":"","done":true,"eval_count":3,"eval_duration":3000000}"#,
        ];
        let ollama: Vec<_> = ollama.iter().map(|d| (None, *d)).collect();
        assert!(fast_and_value_agree(ApiKind::OllamaChat, &ollama) >= 3);

        let llamacpp = [
            r#"{"index":0,"content":" a","tokens":[253],"stop":false,"tokens_predicted":1}"#,
            r#"{"index":0,"content":" b","stop":false,"timings":{"predicted_n":2,"predicted_ms":15.9}}"#,
            r#"{"index":0,"content":"","stop":true,"tokens_predicted":2,"tokens_evaluated":3}"#,
        ];
        let llamacpp: Vec<_> = llamacpp.iter().map(|d| (None, *d)).collect();
        assert!(fast_and_value_agree(ApiKind::LlamacppCompletion, &llamacpp) >= 1);

        let ev = Some("content_block_delta");
        let anthropic = [
            (
                Some("message_start"),
                r#"{"type":"message_start","message":{"usage":{"input_tokens":4}}}"#,
            ),
            (
                ev,
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":""}}"#,
            ),
            (
                ev,
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi \ud83d\ude00"}}"#,
            ),
            (
                ev,
                r#"{"index":1,"delta":{"type":"input_json_delta","partial_json":"{\"a\""}}"#,
            ),
            (
                ev,
                r#"{"type":"content_block_delta","delta":{"type":"signature_delta","signature":"s"}}"#,
            ),
            (ev, r#"{"type":"content_block_delta","delta":null}"#),
            (
                Some("message_delta"),
                r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":3}}"#,
            ),
            (Some("message_stop"), r#"{"type":"message_stop"}"#),
        ];
        assert!(fast_and_value_agree(ApiKind::AnthropicMessages, &anthropic) >= 5);
    }

    #[test]
    fn done_marker_is_honoured_once() {
        let (ev, bad) = lines(ApiKind::OpenaiChat, None, &["[DONE]", " [DONE] "]);
        assert_eq!(ev, vec![StreamEvent::Done]);
        assert_eq!(bad, 0);
    }

    #[test]
    fn bad_json_and_non_objects_are_counted_not_fatal() {
        let (ev, bad) = lines(
            ApiKind::OpenaiChat,
            None,
            &["{not json", "42", "[1,2]", "\"s\"", "", "   "],
        );
        assert!(ev.is_empty());
        assert_eq!(bad, 4);
    }

    #[test]
    fn error_event_is_an_error_whatever_its_payload() {
        for api in ApiKind::METERED {
            let (ev, bad) = messages(
                api,
                None,
                &[
                    (
                        Some("error"),
                        "{\"code\":500,\"message\":\"x\",\"type\":\"server_error\"}",
                    ),
                    (Some("error"), "not json"),
                ],
            );
            assert_eq!(errors(&ev), vec!["server_error", "error"], "{api}");
            assert_eq!(bad, 0);
        }
    }

    #[test]
    fn unknown_api_decodes_nothing() {
        let (ev, bad) = lines(
            ApiKind::Unknown,
            None,
            &["{\"error\":\"x\"}", "[DONE]", "{bad"],
        );
        assert!(ev.is_empty());
        assert_eq!(bad, 0);
        let (ev, bad) = body(ApiKind::Unknown, None, "{\"status\":\"ok\"}");
        assert!(ev.is_empty());
        assert_eq!(bad, 0);
    }

    #[test]
    fn error_bodies_in_every_spelling() {
        let cases = [
            (
                "{\"error\":{\"code\":400,\"message\":\"m\",\"type\":\"invalid_request_error\"}}",
                "invalid_request_error",
                Some("invalid_request_error"),
            ),
            // Prose is never kept: it may quote the request.
            (
                "{\"error\":\"model 'x' not found\"}",
                "model 'x' not found",
                None,
            ),
            ("{\"detail\":\"Not Found\"}", "Not Found", None),
            (
                "{\"type\":\"error\",\"error\":{\"type\":\"not_found_error\",\"message\":\"m\"}}",
                "not_found_error",
                Some("not_found_error"),
            ),
        ];
        for api in ApiKind::METERED {
            for (b, msg, text) in cases {
                let (ev, bad) = body(api, None, b);
                assert_eq!(
                    ev,
                    vec![StreamEvent::Error {
                        message: msg.into(),
                        text: text.map(str::to_owned),
                    }],
                    "{api} {b}"
                );
                assert_eq!(bad, 0);
            }
        }
    }

    #[test]
    fn unrecognised_json_body_is_counted() {
        for api in ApiKind::METERED {
            let (ev, bad) = body(api, None, "{\"input_tokens\": 12}");
            assert!(ev.is_empty(), "{api}: {ev:?}");
            assert_eq!(bad, 1);
            let (ev, bad) = body(api, None, "Internal Server Error");
            assert!(ev.is_empty(), "{api}: {ev:?}");
            assert_eq!(bad, 1);
            let (ev, bad) = body(api, None, " \r\n ");
            assert!(ev.is_empty());
            assert_eq!(bad, 0);
        }
    }

    #[test]
    fn mislabelled_stream_in_a_json_body_is_still_decoded() {
        let b = "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\ndata: [DONE]\n\n";
        let (ev, bad) = body(ApiKind::OpenaiChat, None, b);
        assert_eq!(text(&ev, OutputChannel::Text), "Hi");
        assert_eq!(count_done(&ev), 1);
        assert_eq!(bad, 0);
        let b = "{\"response\":\"a\",\"done\":false}\n{\"response\":\"b\",\"done\":true,\"eval_count\":2}\n";
        let (ev, bad) = body(ApiKind::OllamaGenerate, None, b);
        assert_eq!(text(&ev, OutputChannel::Text), "ab");
        assert_eq!(count_done(&ev), 1);
        assert_eq!(bad, 0);
    }

    #[test]
    fn forced_open_thinking_is_not_assumed_once_the_server_splits_reasoning() {
        // A forced-open model whose server already split the reasoning: the
        // content is the answer, not reasoning awaiting `</think>`.
        let (ev, _) = lines(
            ApiKind::OpenaiChat,
            Some("deepseek-r1:7b"),
            &[
                "{\"choices\":[{\"delta\":{\"reasoning_content\":\"hmm\"}}]}",
                "{\"choices\":[{\"delta\":{\"content\":\"Answer\"}}]}",
                "[DONE]",
            ],
        );
        assert_eq!(text(&ev, OutputChannel::Reasoning), "hmm");
        assert_eq!(text(&ev, OutputChannel::Text), "Answer");
    }

    #[test]
    fn held_back_text_is_flushed_before_done() {
        // A trailing `<` could start a tag: the splitter may hold it, but it
        // must come out before `Done`.
        let (ev, _) = lines(
            ApiKind::OpenaiChat,
            None,
            &[
                "{\"choices\":[{\"delta\":{\"content\":\"a <\"}}]}",
                "[DONE]",
            ],
        );
        assert_eq!(ev.last(), Some(&StreamEvent::Done));
        assert_eq!(text(&ev, OutputChannel::Text), "a <");
    }
}
