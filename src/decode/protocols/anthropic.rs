//! Anthropic Messages (`/v1/messages`, `docs/protocols.md` "Anthropic Messages").
//!
//! - `content_block_delta`: `text_delta` is text, `thinking_delta`
//!   reasoning, `input_json_delta` tool arguments; `signature_delta` and
//!   `citations_delta` are not generated text and are ignored. A
//!   `content_block_start` contributes the tool's `name` (generated tokens,
//!   counted as in the other APIs) and any text a server put in the block's
//!   start (normally empty).
//! - `message_start.message.usage` gives the input: `input_tokens +
//!   cache_creation_input_tokens + cache_read_input_tokens` (Anthropic's
//!   `input_tokens` is only the uncached part; llama.cpp sends 1 with 37
//!   cached), cached = `cache_read_input_tokens`. Its `output_tokens` is a
//!   placeholder (0 or 1) and is never reported.
//! - `message_delta.usage` counts are cumulative: each one is emitted as
//!   is and the last wins. Input parts it repeats are merged with the ones
//!   from `message_start`, so a partial repeat cannot shrink the input.
//! - `message_stop` is `Done`; a stream that ends after a `stop_reason`
//!   but without `message_stop` gets `Done` at the end of the body.
//! - `ping` is ignored; `error` events are handled for every API in
//!   `Protocol::message`.

use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::Value;

use crate::decode::event::Usage;

use super::json::{self, Text};
use super::Sink;

/// The hot path: a `content_block_delta` event read into borrowed structs.
/// Declines (false, nothing emitted) every other event type, errors and
/// anything mistyped: the `Value` reader takes those.
pub(crate) fn fast_message(event: Option<&str>, data: &str, sink: &mut Sink<'_>) -> bool {
    let Ok(v) = serde_json::from_str::<FastEvent<'_>>(data) else {
        return false;
    };
    let ty = Text::str(&v.kind).or(event).unwrap_or("");
    if ty != "content_block_delta" || v.error.is_some() {
        return false;
    }
    let Some(delta) = &v.delta else {
        return true;
    };
    match Text::str(&delta.kind) {
        Some("text_delta") => sink.text(Text::nonempty(&delta.text).unwrap_or("")),
        Some("thinking_delta") => sink.reasoning(Text::nonempty(&delta.thinking).unwrap_or("")),
        Some("input_json_delta") => sink.tool(Text::nonempty(&delta.partial_json).unwrap_or("")),
        _ => {}
    }
    true
}

/// One event as the fast path reads it (`IgnoredAny`: only noticed, to
/// decline; `Option`: `null` is absent, as for the `Value` reader).
#[derive(Deserialize)]
struct FastEvent<'a> {
    #[serde(rename = "type", borrow)]
    kind: Option<Text<'a>>,
    #[serde(borrow)]
    delta: Option<FastDelta<'a>>,
    error: Option<IgnoredAny>,
}

#[derive(Deserialize)]
struct FastDelta<'a> {
    #[serde(rename = "type", borrow)]
    kind: Option<Text<'a>>,
    #[serde(borrow)]
    text: Option<Text<'a>>,
    #[serde(borrow)]
    thinking: Option<Text<'a>>,
    #[serde(borrow)]
    partial_json: Option<Text<'a>>,
}

/// Per-call state of the Anthropic decoder.
#[derive(Debug, Default)]
pub(crate) struct Decoder {
    /// Latest `input_tokens`, `cache_creation_input_tokens`,
    /// `cache_read_input_tokens` seen.
    input_parts: [Option<u64>; 3],
    /// A `message_delta` reported a `stop_reason`.
    stopped: bool,
}

const INPUT_PARTS: [&str; 3] = [
    "input_tokens",
    "cache_creation_input_tokens",
    "cache_read_input_tokens",
];

impl Decoder {
    /// One streamed event.
    pub(crate) fn message(&mut self, event: Option<&str>, v: &Value, sink: &mut Sink<'_>) {
        let ty = v
            .get("type")
            .and_then(Value::as_str)
            .or(event)
            .unwrap_or("");
        match ty {
            "message_start" => {
                let usage = v.get("message").and_then(|m| m.get("usage"));
                if let Some(input) = self.input_usage(usage) {
                    sink.usage(Some(input));
                }
            }
            "content_block_start" => {
                if let Some(block) = json::object(v, "content_block") {
                    block_start(block, sink);
                }
            }
            "content_block_delta" => {
                if let Some(delta) = json::object(v, "delta") {
                    delta_output(delta, sink);
                }
            }
            "message_delta" => {
                if v.get("delta")
                    .and_then(|d| d.get("stop_reason"))
                    .is_some_and(|r| r.is_string())
                {
                    self.stopped = true;
                }
                let usage = v.get("usage").filter(|u| u.is_object());
                if let Some(u) = usage {
                    let input = self.input_usage(Some(u)).unwrap_or_default();
                    sink.usage(json::non_empty_usage(Usage {
                        output_tokens: json::count(u.get("output_tokens")),
                        ..input
                    }));
                }
            }
            "message_stop" => sink.done(),
            _ => {}
        }
    }

    /// A whole `message` body. Recognised when `"type": "message"` or it
    /// has a `content` array.
    pub(crate) fn body(&mut self, v: &Value, sink: &mut Sink<'_>) -> bool {
        let content = v.get("content").and_then(Value::as_array);
        if content.is_none() && v.get("type").and_then(Value::as_str) != Some("message") {
            return false;
        }
        for block in content.into_iter().flatten() {
            match block.get("type").and_then(Value::as_str) {
                Some("text") => sink.text(json::nonempty_str(block, "text").unwrap_or("")),
                Some("thinking") => {
                    sink.reasoning(json::nonempty_str(block, "thinking").unwrap_or(""))
                }
                Some("tool_use" | "server_tool_use") => {
                    sink.tool(&json::call_text(block.get("name"), block.get("input")))
                }
                _ => {}
            }
        }
        // In a whole message the output count is final, not a placeholder.
        if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
            let input = self.input_usage(Some(u)).unwrap_or_default();
            sink.usage(json::non_empty_usage(Usage {
                output_tokens: json::count(u.get("output_tokens")),
                ..input
            }));
        }
        true
    }

    /// End of body: `Done` if a stop reason was seen without `message_stop`.
    pub(crate) fn finish(&mut self, sink: &mut Sink<'_>) {
        if self.stopped {
            sink.done();
        }
    }

    /// Merges the input parts present in `usage` into the running ones and
    /// returns the input receipt (no output count), or `None` when no part
    /// has been seen.
    fn input_usage(&mut self, usage: Option<&Value>) -> Option<Usage> {
        let usage = usage?;
        for (slot, key) in self.input_parts.iter_mut().zip(INPUT_PARTS) {
            if let Some(n) = json::count(usage.get(key)) {
                *slot = Some(n);
            }
        }
        if self.input_parts.iter().all(Option::is_none) {
            return None;
        }
        let total = self
            .input_parts
            .iter()
            .flatten()
            .fold(0u64, |a, b| a.saturating_add(*b));
        Some(Usage {
            input_tokens: Some(total),
            cached_input_tokens: self.input_parts[2],
            ..Usage::default()
        })
    }
}

fn block_start(block: &Value, sink: &mut Sink<'_>) {
    match block.get("type").and_then(Value::as_str) {
        Some("text") => sink.text(json::nonempty_str(block, "text").unwrap_or("")),
        Some("thinking") => sink.reasoning(json::nonempty_str(block, "thinking").unwrap_or("")),
        // The input arrives as `input_json_delta`s; the start has `{}`.
        Some("tool_use" | "server_tool_use") => {
            sink.tool(&json::call_text(block.get("name"), None))
        }
        _ => {}
    }
}

fn delta_output(delta: &Value, sink: &mut Sink<'_>) {
    match delta.get("type").and_then(Value::as_str) {
        Some("text_delta") => sink.text(json::nonempty_str(delta, "text").unwrap_or("")),
        Some("thinking_delta") => {
            sink.reasoning(json::nonempty_str(delta, "thinking").unwrap_or(""))
        }
        Some("input_json_delta") => {
            sink.tool(json::nonempty_str(delta, "partial_json").unwrap_or(""))
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use crate::decode::event::{OutputChannel, StreamEvent, Usage};
    use crate::decode::protocols::testing::*;
    use crate::model::ApiKind;

    const API: ApiKind = ApiKind::AnthropicMessages;

    fn e<'a>(t: &'a str, body: &'a str) -> (Option<&'a str>, &'a str) {
        (Some(t), body)
    }

    #[test]
    fn thinking_text_and_tool_blocks() {
        let (out, bad) = messages(
            API,
            None,
            &[
                e(
                    "message_start",
                    r#"{"type":"message_start","message":{"usage":{"input_tokens":42,"output_tokens":1}}}"#,
                ),
                e("ping", r#"{"type":"ping"}"#),
                e(
                    "content_block_start",
                    r#"{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":""}}"#,
                ),
                e(
                    "content_block_delta",
                    r#"{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"Let me"}}"#,
                ),
                e(
                    "content_block_delta",
                    r#"{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"abc"}}"#,
                ),
                e(
                    "content_block_stop",
                    r#"{"type":"content_block_stop","index":0}"#,
                ),
                e(
                    "content_block_start",
                    r#"{"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}"#,
                ),
                e(
                    "content_block_delta",
                    r#"{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Hi"}}"#,
                ),
                e(
                    "content_block_delta",
                    r#"{"type":"content_block_delta","index":1,"delta":{"type":"citations_delta","citation":{"cited_text":"x"}}}"#,
                ),
                e(
                    "content_block_start",
                    r#"{"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"t","name":"get_time","input":{}}}"#,
                ),
                e(
                    "content_block_delta",
                    r#"{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{\"tz\":"}}"#,
                ),
                e(
                    "content_block_delta",
                    r#"{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"\"UTC\"}"}}"#,
                ),
                e(
                    "message_delta",
                    r#"{"type":"message_delta","delta":{"stop_reason":"tool_use"},"usage":{"output_tokens":87}}"#,
                ),
                e("message_stop", r#"{"type":"message_stop"}"#),
            ],
        );
        assert_eq!(bad, 0);
        assert_eq!(text(&out, OutputChannel::Reasoning), "Let me");
        assert_eq!(text(&out, OutputChannel::Text), "Hi");
        assert_eq!(
            text(&out, OutputChannel::ToolArguments),
            "get_time{\"tz\":\"UTC\"}"
        );
        assert_eq!(out.last(), Some(&StreamEvent::Done));
        assert_eq!(count_done(&out), 1);
    }

    #[test]
    fn message_start_placeholder_output_is_not_reported() {
        let (out, _) = messages(
            API,
            None,
            &[e(
                "message_start",
                r#"{"type":"message_start","message":{"usage":{"cache_read_input_tokens":37,"input_tokens":1,"output_tokens":1}}}"#,
            )],
        );
        assert_eq!(
            out,
            vec![StreamEvent::Usage(Usage {
                output_tokens: None,
                input_tokens: Some(38),
                reasoning_tokens: None,
                cached_input_tokens: Some(37)
            })]
        );
    }

    #[test]
    fn cumulative_usage_last_wins() {
        let (out, _) = messages(
            API,
            None,
            &[
                e(
                    "message_start",
                    r#"{"type":"message_start","message":{"usage":{"input_tokens":10,"cache_creation_input_tokens":5,"cache_read_input_tokens":20,"output_tokens":1}}}"#,
                ),
                e(
                    "message_delta",
                    r#"{"type":"message_delta","delta":{},"usage":{"output_tokens":12}}"#,
                ),
                // A later delta repeats only part of the input: the other
                // parts are kept, the total does not shrink.
                e(
                    "message_delta",
                    r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":30,"input_tokens":10}}"#,
                ),
            ],
        );
        let outputs: Vec<Option<u64>> = out
            .iter()
            .filter_map(|ev| match ev {
                StreamEvent::Usage(u) => Some(u.output_tokens),
                _ => None,
            })
            .collect();
        assert_eq!(outputs, vec![None, Some(12), Some(30)]);
        assert_eq!(
            usage(&out),
            Some(Usage {
                output_tokens: Some(30),
                input_tokens: Some(35),
                reasoning_tokens: None,
                cached_input_tokens: Some(20)
            })
        );
        // stop_reason seen, no message_stop: Done at the end of the body.
        assert_eq!(out.last(), Some(&StreamEvent::Done));
    }

    #[test]
    fn error_event_mid_stream() {
        let (out, _) = messages(
            API,
            None,
            &[
                e(
                    "content_block_delta",
                    r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}"#,
                ),
                e(
                    "error",
                    r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
                ),
            ],
        );
        assert_eq!(errors(&out), vec!["overloaded_error"]);
        assert_eq!(count_done(&out), 0);
    }

    #[test]
    fn whole_body_reports_output_count() {
        let (out, _) = body(
            API,
            None,
            r#"{"id":"m","type":"message","role":"assistant","content":[{"type":"thinking","thinking":"t","signature":""},
               {"type":"text","text":"The sea"},{"type":"tool_use","id":"x","name":"f","input":{"a":1}}],
               "stop_reason":"end_turn","usage":{"cache_read_input_tokens":37,"input_tokens":1,"output_tokens":47}}"#,
        );
        assert_eq!(text(&out, OutputChannel::Reasoning), "t");
        assert_eq!(text(&out, OutputChannel::Text), "The sea");
        assert_eq!(text(&out, OutputChannel::ToolArguments), "f{\"a\":1}");
        assert_eq!(
            usage(&out),
            Some(Usage {
                output_tokens: Some(47),
                input_tokens: Some(38),
                reasoning_tokens: None,
                cached_input_tokens: Some(37)
            })
        );
        assert_eq!(out.last(), Some(&StreamEvent::Done));
    }
}
