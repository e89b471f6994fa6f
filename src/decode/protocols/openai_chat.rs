//! OpenAI Chat Completions (`/v1/chat/completions`), streamed chunks and
//! whole responses, with the local servers' extensions
//! (`docs/protocols.md` "OpenAI Chat Completions").
//!
//! Channels:
//! - `content` and `refusal` are visible text (`content` may also be an
//!   array of text parts); inline `<think>` in it is split by the sink;
//! - `reasoning_content` (llama.cpp, LM Studio, older vLLM) and `reasoning`
//!   (vLLM, Ollama, LM Studio for gpt-oss) are reasoning. A delta that
//!   carries both with the same text (servers in the middle of the rename
//!   send the old and the new name) counts it once;
//! - `tool_calls[].function` and the deprecated `function_call` are the
//!   tool channel: the function `name` (first fragment only) followed by the
//!   `arguments` fragment, as one piece of text. The name is generated
//!   tokens like the arguments, and the usage receipt counts it too.
//!
//! Receipts are taken wherever they appear ("servers move them"): `usage`
//! and `timings` at the top level of any chunk (the finish chunk, the
//! `choices: []` chunk, every chunk with vLLM `continuous_usage_stats` or
//! llama.cpp `timings_per_token`) and inside a choice.
//!
//! End of stream: `data: [DONE]` is `Done`. A `finish_reason` alone is not
//! (a usage chunk may follow it), but a stream that ends without `[DONE]`
//! after a finish reason was seen gets `Done` at the end of the body: the
//! generation did finish, only the marker is missing (KoboldCpp wrote it
//! without its blank line; the SSE framer recovers that case too).
//! KoboldCpp's `"finish_reason": "null"` string is not a finish reason.

use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::Value;

use super::json::{self, Text};
use super::Sink;

/// Per-call state of the chat decoder.
#[derive(Debug, Default)]
pub(crate) struct Decoder {
    /// A choice reported a real `finish_reason`.
    finished: bool,
}

impl Decoder {
    /// One streamed chunk.
    pub(crate) fn message(&mut self, v: &Value, sink: &mut Sink<'_>) {
        for choice in choices(v) {
            // Streams carry `delta`; a server that streams whole `message`s
            // (or a non-streamed body) is read the same way.
            if let Some(delta) =
                json::object(choice, "delta").or_else(|| json::object(choice, "message"))
            {
                delta_output(delta, sink);
            }
        }
        self.envelope(v, sink);
    }

    /// The hot path: a chunk of plain text or reasoning deltas and finish
    /// reasons, read into borrowed structs. Declines (false, nothing
    /// emitted) a chunk with anything else the `Value` reader looks at:
    /// receipts, tool calls, whole messages, errors, a mistyped field.
    pub(crate) fn fast_message(&mut self, data: &str, sink: &mut Sink<'_>) -> bool {
        let Ok(chunk) = serde_json::from_str::<FastChunk<'_>>(data) else {
            return false;
        };
        let choices = chunk.choices.unwrap_or_default();
        let plain = chunk.usage.is_none()
            && chunk.timings.is_none()
            && chunk.prompt_progress.is_none()
            && chunk.error.is_none()
            && chunk.kind.is_none()
            && choices.iter().all(|c| {
                c.message.is_none()
                    && c.usage.is_none()
                    && c.timings.is_none()
                    && c.delta
                        .as_ref()
                        .is_none_or(|d| d.tool_calls.is_none() && d.function_call.is_none())
            });
        if !plain {
            return false;
        }
        for choice in &choices {
            if let Some(d) = &choice.delta {
                let rc = Text::nonempty(&d.reasoning_content);
                let r = Text::nonempty(&d.reasoning);
                match (rc, r) {
                    (Some(a), Some(b)) if a == b => sink.reasoning(a),
                    (a, b) => {
                        if let Some(a) = a {
                            sink.reasoning(a);
                        }
                        if let Some(b) = b {
                            sink.reasoning(b);
                        }
                    }
                }
                if let Some(text) = Text::nonempty(&d.content) {
                    sink.text(text);
                }
                if let Some(refusal) = Text::nonempty(&d.refusal) {
                    sink.text(refusal);
                }
            }
        }
        for choice in &choices {
            if Text::str(&choice.finish_reason).is_some_and(|s| !s.is_empty() && s != "null") {
                self.finished = true;
            }
        }
        true
    }

    /// A whole `chat.completion` body. Recognised when it has `choices`.
    pub(crate) fn body(&mut self, v: &Value, sink: &mut Sink<'_>) -> bool {
        if !v.get("choices").is_some_and(Value::is_array) {
            return false;
        }
        self.message(v, sink);
        true
    }

    /// End of body: `Done` if a finish reason was seen (see module doc).
    pub(crate) fn finish(&mut self, sink: &mut Sink<'_>) {
        if self.finished {
            sink.done();
        }
    }

    /// Usage, timings and finish reasons, shared with legacy completions.
    pub(super) fn envelope(&mut self, v: &Value, sink: &mut Sink<'_>) {
        scan_envelope(v, &mut self.finished, sink);
    }
}

/// A streamed chunk as the fast path reads it. The `IgnoredAny` fields are
/// only there to notice the parts the fast path leaves to the `Value`
/// reader; `Option` makes `null` the same as absent, as it is there.
#[derive(Deserialize)]
struct FastChunk<'a> {
    #[serde(borrow)]
    choices: Option<Vec<FastChoice<'a>>>,
    usage: Option<IgnoredAny>,
    timings: Option<IgnoredAny>,
    prompt_progress: Option<IgnoredAny>,
    error: Option<IgnoredAny>,
    #[serde(rename = "type")]
    kind: Option<IgnoredAny>,
}

#[derive(Deserialize)]
struct FastChoice<'a> {
    #[serde(borrow)]
    delta: Option<FastDelta<'a>>,
    #[serde(borrow)]
    finish_reason: Option<Text<'a>>,
    message: Option<IgnoredAny>,
    usage: Option<IgnoredAny>,
    timings: Option<IgnoredAny>,
}

#[derive(Deserialize)]
struct FastDelta<'a> {
    #[serde(borrow)]
    content: Option<Text<'a>>,
    #[serde(borrow)]
    reasoning_content: Option<Text<'a>>,
    #[serde(borrow)]
    reasoning: Option<Text<'a>>,
    #[serde(borrow)]
    refusal: Option<Text<'a>>,
    tool_calls: Option<IgnoredAny>,
    function_call: Option<IgnoredAny>,
}

/// The `choices` array of a chunk (empty if absent or not an array).
pub(super) fn choices(v: &Value) -> &[Value] {
    v.get("choices")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

/// Receipts and finish reasons of an OpenAI-shaped chunk or body, wherever
/// they sit: per choice, then at the top level.
pub(super) fn scan_envelope(v: &Value, finished: &mut bool, sink: &mut Sink<'_>) {
    for choice in choices(v) {
        if is_finish_reason(choice.get("finish_reason")) {
            *finished = true;
        }
        sink.usage(json::openai_usage(choice.get("usage")));
        sink.timings(json::llamacpp_timings(choice.get("timings")));
    }
    sink.usage(json::openai_usage(v.get("usage")));
    sink.timings(json::llamacpp_timings(v.get("timings")));
    sink.prompt_progress(json::llamacpp_prompt_progress(v.get("prompt_progress")));
}

/// A real finish reason: a non-empty string other than KoboldCpp's `"null"`.
pub(super) fn is_finish_reason(v: Option<&Value>) -> bool {
    v.and_then(Value::as_str)
        .is_some_and(|s| !s.is_empty() && s != "null")
}

/// The output of one `delta` (or `message`), reasoning first: when a delta
/// carries both, the reasoning was generated first.
fn delta_output(d: &Value, sink: &mut Sink<'_>) {
    let rc = json::nonempty_str(d, "reasoning_content");
    let r = json::nonempty_str(d, "reasoning");
    match (rc, r) {
        (Some(a), Some(b)) if a == b => sink.reasoning(a),
        (a, b) => {
            if let Some(a) = a {
                sink.reasoning(a);
            }
            if let Some(b) = b {
                sink.reasoning(b);
            }
        }
    }
    if let Some(text) = json::content_text(d.get("content")) {
        sink.text(&text);
    }
    if let Some(refusal) = json::nonempty_str(d, "refusal") {
        sink.text(refusal);
    }
    if let Some(calls) = d.get("tool_calls").and_then(Value::as_array) {
        for call in calls {
            if let Some(f) = json::object(call, "function") {
                sink.tool(&json::call_text(f.get("name"), f.get("arguments")));
            }
        }
    }
    if let Some(f) = json::object(d, "function_call") {
        sink.tool(&json::call_text(f.get("name"), f.get("arguments")));
    }
}

#[cfg(test)]
mod tests {
    use crate::decode::detect::BodyFraming;
    use crate::decode::event::{OutputChannel, PromptProgress, ServerTimings, StreamEvent, Usage};
    use crate::decode::protocols::testing::*;
    use crate::decode::stream::StreamDecoder;
    use crate::model::ApiKind;

    const API: ApiKind = ApiKind::OpenaiChat;

    fn chunk(delta: &str) -> String {
        format!("{{\"choices\":[{{\"index\":0,\"delta\":{delta},\"finish_reason\":null}}]}}")
    }

    #[test]
    fn content_role_only_and_empty_deltas() {
        let (ev, bad) = lines(
            API,
            None,
            &[
                &chunk("{\"role\":\"assistant\",\"content\":null}"),
                &chunk("{\"content\":\"\"}"),
                &chunk("{\"content\":\"Hel\"}"),
                &chunk("{\"content\":\"lo\"}"),
                "{\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}",
                "[DONE]",
            ],
        );
        assert_eq!(bad, 0);
        assert_eq!(
            ev,
            vec![
                StreamEvent::Output {
                    channel: OutputChannel::Text,
                    text: "Hel".into()
                },
                StreamEvent::Output {
                    channel: OutputChannel::Text,
                    text: "lo".into()
                },
                StreamEvent::Done,
            ]
        );
    }

    #[test]
    fn llamacpp_prompt_progress_on_role_only_chunks_is_the_servers_own_progress() {
        let (ev, _) = lines(
            API,
            None,
            &[
                "{\"choices\":[{\"delta\":{\"role\":\"assistant\"}}],\"prompt_progress\":{\"total\":1553,\"cache\":0,\"processed\":512,\"time_ms\":3400.5}}",
                "{\"choices\":[{\"delta\":{\"role\":\"assistant\"}}],\"prompt_progress\":{\"total\":1553,\"cache\":0,\"processed\":1553,\"time_ms\":10300}}",
                // Mistyped or impossible: ignored.
                "{\"choices\":[{\"delta\":{}}],\"prompt_progress\":{\"total\":10,\"processed\":11}}",
                &chunk("{\"content\":\"Hi\"}"),
            ],
        );
        let progress: Vec<PromptProgress> = ev
            .iter()
            .filter_map(|e| match e {
                StreamEvent::PromptProgress(p) => Some(*p),
                _ => None,
            })
            .collect();
        assert_eq!(progress.len(), 2);
        assert_eq!((progress[0].total, progress[0].processed), (1553, 512));
        assert_eq!(progress[0].time_ms, 3400.5);
        assert_eq!(progress[1].processed, 1553);
        assert!(ev.contains(&StreamEvent::Output {
            channel: OutputChannel::Text,
            text: "Hi".into()
        }));
    }

    #[test]
    fn usage_chunk_with_empty_choices() {
        let (ev, _) = lines(
            API,
            None,
            &[
                &chunk("{\"content\":\"Hi\"}"),
                "{\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":null}",
                "{\"choices\":[],\"usage\":{\"prompt_tokens\":42,\"completion_tokens\":17,\"total_tokens\":59,\
                 \"completion_tokens_details\":{\"reasoning_tokens\":3},\"prompt_tokens_details\":{\"cached_tokens\":40}}}",
                "[DONE]",
            ],
        );
        let usage = Usage {
            output_tokens: Some(17),
            input_tokens: Some(42),
            reasoning_tokens: Some(3),
            cached_input_tokens: Some(40),
        };
        assert_eq!(ev[1], StreamEvent::Usage(usage));
        assert_eq!(ev.len(), 3);
        assert_eq!(ev[2], StreamEvent::Done);
    }

    #[test]
    fn tool_call_fragments_across_chunks() {
        let (ev, _) = lines(
            API,
            None,
            &[
                &chunk("{\"tool_calls\":[{\"index\":0,\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"get_time\",\"arguments\":\"\"}}]}"),
                &chunk("{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{\\\"tz\\\":\"}}]}"),
                &chunk("{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"\\\"UTC\\\"}\"}}]}"),
                "{\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}",
                "[DONE]",
            ],
        );
        let tool: Vec<&str> = ev
            .iter()
            .filter_map(|e| match e {
                StreamEvent::Output {
                    channel: OutputChannel::ToolArguments,
                    text,
                } => Some(text.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(tool, vec!["get_time", "{\"tz\":", "\"UTC\"}"]);
        assert_eq!(text(&ev, OutputChannel::Text), "");
        assert_eq!(count_done(&ev), 1);
    }

    #[test]
    fn parallel_tool_calls_in_one_delta() {
        let (ev, _) = lines(
            API,
            None,
            &[&chunk(
                "{\"tool_calls\":[{\"index\":0,\"function\":{\"name\":\"a\",\"arguments\":\"{}\"}},\
                 {\"index\":1,\"function\":{\"name\":\"b\",\"arguments\":\"{\\\"x\\\":1}\"}}]}",
            )],
        );
        assert_eq!(
            ev,
            vec![
                StreamEvent::Output {
                    channel: OutputChannel::ToolArguments,
                    text: "a{}".into()
                },
                StreamEvent::Output {
                    channel: OutputChannel::ToolArguments,
                    text: "b{\"x\":1}".into()
                },
            ]
        );
    }

    #[test]
    fn deprecated_function_call_and_refusal() {
        let (ev, _) = lines(
            API,
            None,
            &[
                &chunk("{\"function_call\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\"\"}}"),
                &chunk("{\"function_call\":{\"arguments\":\":1}\"}}"),
                &chunk("{\"refusal\":\"I can't\"}"),
            ],
        );
        assert_eq!(text(&ev, OutputChannel::ToolArguments), "f{\"a\":1}");
        assert_eq!(text(&ev, OutputChannel::Text), "I can't");
    }

    #[test]
    fn reasoning_content_and_reasoning_fields() {
        let (ev, _) = lines(
            API,
            None,
            &[
                &chunk("{\"reasoning_content\":\"llama \"}"),
                &chunk("{\"reasoning\":\"vllm \"}"),
                // Both names with the same text: counted once.
                &chunk("{\"reasoning\":\"both \",\"reasoning_content\":\"both \"}"),
                &chunk("{\"reasoning_content\":null,\"content\":\"answer\"}"),
            ],
        );
        assert_eq!(text(&ev, OutputChannel::Reasoning), "llama vllm both ");
        assert_eq!(text(&ev, OutputChannel::Text), "answer");
    }

    #[test]
    fn error_mid_stream() {
        let (ev, _) = lines(
            API,
            None,
            &[
                &chunk("{\"content\":\"Hi\"}"),
                "{\"error\":{\"code\":500,\"message\":\"boom\",\"type\":\"server_error\"}}",
            ],
        );
        assert_eq!(errors(&ev), vec!["server_error"]);
        assert_eq!(count_done(&ev), 0);
    }

    #[test]
    fn koboldcpp_string_null_finish_reason_is_not_a_finish() {
        let (ev, _) = lines(
            API,
            None,
            &["{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"},\"finish_reason\":\"null\"}]}"],
        );
        assert_eq!(count_done(&ev), 0, "stream cut without a real finish");
        let (ev, _) = lines(
            API,
            None,
            &[
                "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"},\"finish_reason\":\"null\"}]}",
                "{\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}]}",
            ],
        );
        assert_eq!(
            ev.last(),
            Some(&StreamEvent::Done),
            "finished but no [DONE]"
        );
    }

    #[test]
    fn vllm_continuous_usage_on_every_chunk() {
        let (ev, _) = lines(
            API,
            None,
            &[
                "{\"choices\":[{\"delta\":{\"content\":\"a\"}}],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":1,\"total_tokens\":6}}",
                "{\"choices\":[{\"delta\":{\"content\":\"b\"}}],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2,\"total_tokens\":7}}",
                "{\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2,\"total_tokens\":7}}",
                "[DONE]",
            ],
        );
        let outputs: Vec<Option<u64>> = ev
            .iter()
            .filter_map(|e| match e {
                StreamEvent::Usage(u) => Some(u.output_tokens),
                _ => None,
            })
            .collect();
        assert_eq!(outputs, vec![Some(1), Some(2), Some(2)]);
        assert_eq!(usage(&ev).unwrap().input_tokens, Some(5));
    }

    #[test]
    fn llamacpp_timings_per_token_and_placeholder_durations() {
        let (ev, _) = lines(
            API,
            None,
            &[
                "{\"choices\":[{\"delta\":{\"content\":\"a\"}}],\"timings\":{\"cache_n\":24,\"prompt_n\":14,\"prompt_ms\":128.6,\"predicted_n\":1,\"predicted_ms\":0.001}}",
                "{\"choices\":[{\"delta\":{\"content\":\"b\"}}],\"timings\":{\"cache_n\":24,\"prompt_n\":14,\"prompt_ms\":128.6,\"predicted_n\":2,\"predicted_ms\":12.5,\"predicted_per_second\":null}}",
                "{\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}],\"timings\":{\"predicted_n\":0,\"predicted_ms\":0,\"prompt_ms\":null}}",
            ],
        );
        let timings: Vec<ServerTimings> = ev
            .iter()
            .filter_map(|e| match e {
                StreamEvent::ServerTimings(t) => Some(t.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(
            timings.len(),
            2,
            "the all-placeholder timings are not emitted"
        );
        assert_eq!(timings[0].generated_tokens, Some(1));
        assert_eq!(
            timings[0].generation_ms, None,
            "0.001 ms for 1 token is a placeholder"
        );
        assert_eq!(timings[0].prompt_ms, Some(128.6));
        assert_eq!(timings[1].generation_ms, Some(12.5));
        assert_eq!(timings[1].cached_tokens, Some(24));
    }

    #[test]
    fn inline_think_in_content() {
        let (ev, _) = lines(
            API,
            None,
            &[
                &chunk("{\"content\":\"<think>\\nI should\"}"),
                &chunk("{\"content\":\" greet</thi\"}"),
                &chunk("{\"content\":\"nk>\\n\\nHello\"}"),
                "[DONE]",
            ],
        );
        let reasoning = text(&ev, OutputChannel::Reasoning);
        assert!(reasoning.contains("I should greet"), "{reasoning:?}");
        assert!(!reasoning.contains("think>"), "{reasoning:?}");
        let answer = text(&ev, OutputChannel::Text);
        assert_eq!(answer.trim(), "Hello");
        assert_eq!(ev.last(), Some(&StreamEvent::Done));
    }

    #[test]
    fn forced_open_model_with_close_tag_only() {
        let (ev, _) = lines(
            API,
            Some("deepseek-r1:7b"),
            &[
                &chunk("{\"content\":\"Let me think\"}"),
                &chunk("{\"content\":\".</think>\\n\\nAnswer\"}"),
                "[DONE]",
            ],
        );
        assert!(text(&ev, OutputChannel::Reasoning).contains("Let me think."));
        assert_eq!(text(&ev, OutputChannel::Text).trim(), "Answer");
        // The same stream for a model not known to force thinking open:
        // without an opening tag the text is the answer.
        let (ev, _) = lines(
            API,
            Some("llama3"),
            &[&chunk("{\"content\":\"Let me think\"}"), "[DONE]"],
        );
        assert_eq!(text(&ev, OutputChannel::Text), "Let me think");
    }

    #[test]
    fn whole_body_with_tool_calls_usage_and_timings() {
        let b = r#"{"choices":[{"finish_reason":"tool_calls","index":0,"message":{"role":"assistant","content":"",
            "reasoning_content":"r","tool_calls":[{"type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"},"id":"x"}]}}],
            "usage":{"completion_tokens":29,"prompt_tokens":211,"total_tokens":240,"prompt_tokens_details":{"cached_tokens":210}},
            "timings":{"cache_n":210,"prompt_n":1,"prompt_ms":19.184,"predicted_n":29,"predicted_ms":563.319}}"#;
        let (ev, bad) = body(API, None, b);
        assert_eq!(bad, 0);
        assert_eq!(
            text(&ev, OutputChannel::ToolArguments),
            "get_weather{\"city\":\"Paris\"}"
        );
        assert_eq!(text(&ev, OutputChannel::Reasoning), "r");
        assert_eq!(usage(&ev).unwrap().output_tokens, Some(29));
        assert_eq!(timings(&ev).unwrap().generation_ms, Some(563.319));
        assert_eq!(ev.last(), Some(&StreamEvent::Done));
    }

    #[test]
    fn invalid_utf8_split_across_reads_and_multiline_data() {
        // "é" is C3 A9; the read boundary falls between the two bytes, and
        // the JSON is spread over two `data:` lines. A lone invalid byte
        // (FF) becomes U+FFFD instead of failing.
        let mut d = StreamDecoder::new(API, BodyFraming::Sse, None);
        let mut ev = Vec::new();
        d.feed(b"data: {\"choices\":[{\"delta\":\n", &mut ev);
        d.feed(b"data: {\"content\":\"caf\xC3", &mut ev);
        d.feed(b"\xA9 \xFF\"}}]}\n\ndata: [DONE]\n\n", &mut ev);
        d.finish(&mut ev);
        assert_eq!(text(&ev, OutputChannel::Text), "café \u{FFFD}");
        assert_eq!(d.unparsed_messages(), 0);
        assert_eq!(count_done(&ev), 1);
    }
}
