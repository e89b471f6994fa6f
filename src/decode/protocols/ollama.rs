//! Ollama native `/api/chat` and `/api/generate` (NDJSON,
//! `docs/protocols.md` "Ollama"). One decoder serves both: chat puts its
//! output under `message`, generate at the top level, and each line is
//! read both ways.
//!
//! - `content` / `response`: visible text (inline `<think>` split by the
//!   sink: models without Ollama's thinking support, or `think` unset on
//!   older versions, leave the tags in);
//! - `thinking`: reasoning;
//! - `tool_calls`: arrive whole, `arguments` a JSON object: each call is
//!   one tool-channel output, the function name followed by the compact
//!   serialised arguments;
//! - `done: true`: usage (`eval_count`, `prompt_eval_count`), server
//!   timings (nanosecond durations converted to ms), then `Done`.
//!
//! Durations are guarded ([`json::plausible_ms`]): KoboldCpp's Ollama
//! emulation sends 1 ns placeholders, and a 0 or absurd duration is left
//! out rather than divided by. When no duration survives, no timings event
//! is emitted at all; the counts still come as usage.

use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::Value;

use crate::decode::event::{ServerTimings, Usage};

use super::json::{self, Text, MAX_GENERATION_TOKENS_PER_S, MAX_PROMPT_TOKENS_PER_S};
use super::Sink;

/// The Ollama decoder keeps no state: every line stands alone.
#[derive(Debug, Default)]
pub(crate) struct Decoder;

impl Decoder {
    /// One NDJSON line.
    pub(crate) fn message(&mut self, v: &Value, sink: &mut Sink<'_>) {
        if let Some(m) = json::object(v, "message") {
            output(m, "content", sink);
        }
        output(v, "response", sink);
        if v.get("done").and_then(Value::as_bool) == Some(true) {
            final_receipts(v, sink);
            sink.done();
        }
    }

    /// A whole non-streamed response (`"stream": false`): the same object
    /// as the final line, with all the text. Recognised when it has
    /// `message`, `response` or `done`.
    pub(crate) fn body(&mut self, v: &Value, sink: &mut Sink<'_>) -> bool {
        if v.get("message").is_none() && v.get("response").is_none() && v.get("done").is_none() {
            return false;
        }
        self.message(v, sink);
        true
    }
}

/// The hot path: a line of thinking or text that is not the last one,
/// read into borrowed structs. Declines (false, nothing emitted) the final
/// line (`done: true`, with its receipts), tool calls, errors and anything
/// mistyped: the `Value` reader takes those.
pub(crate) fn fast_message(data: &str, sink: &mut Sink<'_>) -> bool {
    let Ok(line) = serde_json::from_str::<FastLine<'_>>(data) else {
        return false;
    };
    let plain = line.done != Some(true)
        && line.tool_calls.is_none()
        && line.error.is_none()
        && line.kind.is_none()
        && line.message.as_ref().is_none_or(|m| m.tool_calls.is_none());
    if !plain {
        return false;
    }
    if let Some(m) = &line.message {
        fast_output(Text::str(&m.thinking), Text::str(&m.content), sink);
    }
    fast_output(Text::str(&line.thinking), Text::str(&line.response), sink);
    true
}

fn fast_output(thinking: Option<&str>, text: Option<&str>, sink: &mut Sink<'_>) {
    if let Some(t) = thinking.filter(|t| !t.is_empty()) {
        sink.reasoning(t);
    }
    if let Some(t) = text.filter(|t| !t.is_empty()) {
        sink.text(t);
    }
}

/// One NDJSON line as the fast path reads it (`IgnoredAny`: only noticed,
/// to decline; `Option`: `null` is absent, as for the `Value` reader).
#[derive(Deserialize)]
struct FastLine<'a> {
    #[serde(borrow)]
    message: Option<FastMessage<'a>>,
    #[serde(borrow)]
    response: Option<Text<'a>>,
    #[serde(borrow)]
    thinking: Option<Text<'a>>,
    done: Option<bool>,
    tool_calls: Option<IgnoredAny>,
    error: Option<IgnoredAny>,
    #[serde(rename = "type")]
    kind: Option<IgnoredAny>,
}

#[derive(Deserialize)]
struct FastMessage<'a> {
    #[serde(borrow)]
    content: Option<Text<'a>>,
    #[serde(borrow)]
    thinking: Option<Text<'a>>,
    tool_calls: Option<IgnoredAny>,
}

/// Thinking, then text (`text_key`), then tool calls of one object.
fn output(obj: &Value, text_key: &str, sink: &mut Sink<'_>) {
    if let Some(t) = json::nonempty_str(obj, "thinking") {
        sink.reasoning(t);
    }
    if let Some(t) = json::nonempty_str(obj, text_key) {
        sink.text(t);
    }
    if let Some(calls) = obj.get("tool_calls").and_then(Value::as_array) {
        for call in calls {
            if let Some(f) = json::object(call, "function") {
                sink.tool(&json::call_text(f.get("name"), f.get("arguments")));
            }
        }
    }
}

fn final_receipts(v: &Value, sink: &mut Sink<'_>) {
    let eval = json::count(v.get("eval_count"));
    let prompt = json::count(v.get("prompt_eval_count"));
    sink.usage(json::non_empty_usage(Usage {
        output_tokens: eval,
        input_tokens: prompt,
        ..Usage::default()
    }));
    let generation_ms = json::plausible_ms(
        json::ns_to_ms(v.get("eval_duration")),
        eval,
        MAX_GENERATION_TOKENS_PER_S,
    );
    sink.timings(json::real_timings(ServerTimings {
        generated_tokens: eval,
        generation_ms,
        generation_rate: generation_ms.and_then(|ms| json::rate_over_all_tokens(eval?, ms)),
        prompt_tokens: prompt,
        prompt_ms: json::plausible_ms(
            json::ns_to_ms(v.get("prompt_eval_duration")),
            prompt,
            MAX_PROMPT_TOKENS_PER_S,
        ),
        load_ms: json::plausible_ms(json::ns_to_ms(v.get("load_duration")), None, f64::INFINITY),
        cached_tokens: None,
        draft_tokens: None,
        draft_accepted: None,
    }));
}

#[cfg(test)]
mod tests {
    use crate::decode::detect::BodyFraming;
    use crate::decode::event::{OutputChannel, ServerTimings, StreamEvent, Usage};
    use crate::decode::protocols::testing::*;
    use crate::decode::stream::StreamDecoder;
    use crate::model::ApiKind;

    #[test]
    fn chat_thinking_content_and_final_metrics() {
        let (out, bad) = lines(
            ApiKind::OllamaChat,
            None,
            &[
                r#"{"model":"qwen3","message":{"role":"assistant","content":"","thinking":"Let"},"done":false}"#,
                r#"{"model":"qwen3","message":{"role":"assistant","content":"Hi"},"done":false}"#,
                r#"{"model":"qwen3","message":{"role":"assistant","content":""},"done":true,"done_reason":"stop",
                   "total_duration":4935886791,"load_duration":534986708,"prompt_eval_count":26,"prompt_eval_duration":107345000,
                   "eval_count":237,"eval_duration":4289432000}"#,
            ],
        );
        assert_eq!(bad, 0);
        assert_eq!(text(&out, OutputChannel::Reasoning), "Let");
        assert_eq!(text(&out, OutputChannel::Text), "Hi");
        assert_eq!(
            usage(&out),
            Some(Usage {
                output_tokens: Some(237),
                input_tokens: Some(26),
                reasoning_tokens: None,
                cached_input_tokens: None
            })
        );
        assert_eq!(
            timings(&out),
            Some(ServerTimings {
                generated_tokens: Some(237),
                generation_ms: Some(4289.432),
                // Ollama's own "eval rate": 237 / 4.289432 s.
                generation_rate: Some(237.0 / 4.289432),
                prompt_tokens: Some(26),
                prompt_ms: Some(107.345),
                load_ms: Some(534.986708),
                cached_tokens: None,
                draft_tokens: None,
                draft_accepted: None,
            })
        );
        assert_eq!(out.last(), Some(&StreamEvent::Done));
    }

    #[test]
    fn koboldcpp_one_nanosecond_durations_are_dropped() {
        let (out, _) = lines(
            ApiKind::OllamaGenerate,
            None,
            &[
                r#"{"response":"x","done":true,"total_duration":1,"load_duration":1,"prompt_eval_count":12,
                 "prompt_eval_duration":1,"eval_count":40,"eval_duration":1}"#,
            ],
        );
        assert_eq!(timings(&out), None, "no real duration: no timings event");
        assert_eq!(
            usage(&out).unwrap().output_tokens,
            Some(40),
            "counts kept as usage"
        );
        // One real duration among placeholders: only that one is kept.
        let (out, _) = lines(
            ApiKind::OllamaGenerate,
            None,
            &[
                r#"{"done":true,"prompt_eval_count":12,"prompt_eval_duration":0,"eval_count":40,"eval_duration":800000000,"load_duration":1}"#,
            ],
        );
        let t = timings(&out).unwrap();
        assert_eq!(t.generation_ms, Some(800.0));
        assert_eq!(t.prompt_ms, None);
        assert_eq!(t.load_ms, None);
        // A duration implying an absurd rate (40 tokens in 2 µs) is dropped.
        let (out, _) = lines(
            ApiKind::OllamaGenerate,
            None,
            &[
                r#"{"done":true,"eval_count":40,"eval_duration":2000,"prompt_eval_duration":5000000,"prompt_eval_count":3}"#,
            ],
        );
        let t = timings(&out).unwrap();
        assert_eq!(t.generation_ms, None);
        assert_eq!(t.prompt_ms, Some(5.0));
    }

    #[test]
    fn tool_calls_arrive_whole() {
        let (out, _) = lines(
            ApiKind::OllamaChat,
            None,
            &[
                r#"{"message":{"role":"assistant","content":"","tool_calls":[
                    {"function":{"index":0,"name":"get_time","arguments":{"tz":"UTC"}}},
                    {"function":{"index":1,"name":"get_date","arguments":{}}}]},"done":false}"#,
            ],
        );
        assert_eq!(
            out,
            vec![
                StreamEvent::Output {
                    channel: OutputChannel::ToolArguments,
                    text: "get_time{\"tz\":\"UTC\"}".into()
                },
                StreamEvent::Output {
                    channel: OutputChannel::ToolArguments,
                    text: "get_date{}".into()
                },
            ]
        );
    }

    #[test]
    fn generate_with_inline_think() {
        let (out, _) = lines(
            ApiKind::OllamaGenerate,
            None,
            &[
                r#"{"response":"<think>","done":false}"#,
                r#"{"response":"plan","done":false}"#,
                r#"{"response":"</think>","done":false}"#,
                r#"{"response":"Answer","done":false}"#,
                r#"{"response":"","done":true,"eval_count":4}"#,
            ],
        );
        assert_eq!(text(&out, OutputChannel::Reasoning), "plan");
        assert_eq!(text(&out, OutputChannel::Text), "Answer");
        assert_eq!(out.last(), Some(&StreamEvent::Done));
    }

    #[test]
    fn generate_thinking_field_and_forced_open_model() {
        let (out, _) = lines(
            ApiKind::OllamaGenerate,
            Some("deepseek-r1:7b"),
            &[
                r#"{"response":"Hmm, the user","done":false}"#,
                r#"{"response":" asks.</think>Hello","done":false}"#,
                r#"{"response":"","done":true}"#,
            ],
        );
        assert_eq!(text(&out, OutputChannel::Reasoning), "Hmm, the user asks.");
        assert_eq!(text(&out, OutputChannel::Text), "Hello");
        let (out, _) = lines(
            ApiKind::OllamaGenerate,
            None,
            &[r#"{"thinking":"t","response":"","done":false}"#],
        );
        assert_eq!(text(&out, OutputChannel::Reasoning), "t");
    }

    #[test]
    fn error_line_after_output() {
        let (out, _) = lines(
            ApiKind::OllamaChat,
            None,
            &[
                r#"{"message":{"content":"Hi"},"done":false}"#,
                r#"{"error":"an error was encountered while running the model"}"#,
            ],
        );
        assert_eq!(
            errors(&out),
            vec!["an error was encountered while running the model"]
        );
        assert_eq!(count_done(&out), 0);
    }

    #[test]
    fn whole_body_and_byte_level_stream() {
        let (out, _) = body(
            ApiKind::OllamaChat,
            None,
            r#"{"message":{"role":"assistant","content":"Hello"},"done":true,"eval_count":2,"eval_duration":20000000}"#,
        );
        assert_eq!(text(&out, OutputChannel::Text), "Hello");
        assert_eq!(count_done(&out), 1);

        // NDJSON through the real framer, a multibyte character split
        // across reads and a bad line in the middle.
        let mut d = StreamDecoder::new(ApiKind::OllamaChat, BodyFraming::Ndjson, None);
        let mut ev = Vec::new();
        d.feed(b"{\"message\":{\"content\":\"\xE2\x82", &mut ev);
        d.feed(
            b"\xAC\"},\"done\":false}\n{oops\n{\"done\":true,\"eval_count\":1}",
            &mut ev,
        );
        d.finish(&mut ev);
        assert_eq!(text(&ev, OutputChannel::Text), "€");
        assert_eq!(d.unparsed_messages(), 1);
        assert_eq!(count_done(&ev), 1);
        assert!(d.is_streamed());
    }
}
