//! OpenAI Responses API (`/v1/responses`, `docs/protocols.md` "OpenAI Responses").
//!
//! Events are told apart by the JSON `type` (the SSE event name is the
//! fallback for a body without one):
//! - `response.output_text.delta`, `response.refusal.delta`: visible text;
//! - `response.reasoning_text.delta`, `response.reasoning_summary_text.delta`:
//!   reasoning;
//! - `response.function_call_arguments.delta`: tool arguments, and the
//!   function's `name` from the `function_call` item's
//!   `response.output_item.added` (generated tokens too, counted like the
//!   chat decoder counts them);
//! - `response.completed` / `response.incomplete`: usage from
//!   `response.usage`, server timings from the top-level `timings`
//!   (llama.cpp) or `response.timings`, then `Done`;
//! - `response.failed`: its usage and timings if any, `Error` with
//!   `response.error`'s code, then `Done`; `error`: `Error` (handled for
//!   every API in `Protocol::message`).
//!
//! Every `.done` event (`output_text.done`, `content_part.done`,
//! `output_item.done`, ...) repeats text already streamed as deltas and is
//! ignored, so nothing is counted twice. Only the function name is taken
//! from an `output_item.added`, never its `arguments`: servers send them
//! empty there and stream them as deltas.

use serde_json::Value;

use super::{json, Sink};

/// The Responses decoder keeps no state: every event stands alone.
#[derive(Debug, Default)]
pub(crate) struct Decoder;

impl Decoder {
    /// One streamed event.
    pub(crate) fn message(&mut self, event: Option<&str>, v: &Value, sink: &mut Sink<'_>) {
        let ty = v
            .get("type")
            .and_then(Value::as_str)
            .or(event)
            .unwrap_or("");
        match ty {
            "response.output_text.delta" | "response.refusal.delta" => {
                if let Some(d) = json::nonempty_str(v, "delta") {
                    sink.text(d);
                }
            }
            "response.reasoning_text.delta" | "response.reasoning_summary_text.delta" => {
                if let Some(d) = json::nonempty_str(v, "delta") {
                    sink.reasoning(d);
                }
            }
            "response.function_call_arguments.delta" => {
                if let Some(d) = json::nonempty_str(v, "delta") {
                    sink.tool(d);
                }
            }
            "response.output_item.added" => {
                if let Some(item) = json::object(v, "item") {
                    if item.get("type").and_then(Value::as_str) == Some("function_call") {
                        sink.tool(&json::call_text(item.get("name"), None));
                    }
                }
            }
            "response.completed" | "response.incomplete" => {
                receipts(v, sink);
                sink.done();
            }
            "response.failed" => {
                receipts(v, sink);
                let error = v
                    .get("response")
                    .and_then(|r| r.get("error"))
                    .filter(|e| !e.is_null());
                match error {
                    Some(e) => sink.error_value(e),
                    None => sink.error("response.failed".to_owned()),
                }
                sink.done();
            }
            _ => {}
        }
    }

    /// A whole `response` object. Recognised when it has an `output`
    /// array or `"object": "response"`.
    pub(crate) fn body(&mut self, v: &Value, sink: &mut Sink<'_>) -> bool {
        let output = v.get("output").and_then(Value::as_array);
        if output.is_none() && v.get("object").and_then(Value::as_str) != Some("response") {
            return false;
        }
        for item in output.into_iter().flatten() {
            item_output(item, sink);
        }
        sink.usage(json::openai_usage(v.get("usage")));
        sink.timings(json::llamacpp_timings(v.get("timings")));
        if v.get("status").and_then(Value::as_str) == Some("failed") {
            let error = v.get("error").filter(|e| !e.is_null());
            match error {
                Some(e) => sink.error_value(e),
                None => sink.error("response.failed".to_owned()),
            }
        }
        true
    }
}

/// Usage and timings of a terminal event, wherever the server put them.
fn receipts(v: &Value, sink: &mut Sink<'_>) {
    let response = v.get("response");
    let usage = response
        .and_then(|r| r.get("usage"))
        .or_else(|| v.get("usage"));
    sink.usage(json::openai_usage(usage));
    let timings = v
        .get("timings")
        .or_else(|| response.and_then(|r| r.get("timings")));
    sink.timings(json::llamacpp_timings(timings));
}

/// The text of one finished output item (non-streamed body).
fn item_output(item: &Value, sink: &mut Sink<'_>) {
    let parts = |key: &str| {
        item.get(key)
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or(&[])
    };
    match item.get("type").and_then(Value::as_str) {
        Some("message") => {
            for part in parts("content") {
                match part.get("type").and_then(Value::as_str) {
                    Some("output_text") => {
                        if let Some(t) = json::nonempty_str(part, "text") {
                            sink.text(t);
                        }
                    }
                    Some("refusal") => {
                        if let Some(t) = json::nonempty_str(part, "refusal") {
                            sink.text(t);
                        }
                    }
                    _ => {}
                }
            }
        }
        Some("reasoning") => {
            for part in parts("content").iter().chain(parts("summary")) {
                if let Some(t) = json::nonempty_str(part, "text") {
                    sink.reasoning(t);
                }
            }
        }
        Some("function_call") => {
            sink.tool(&json::call_text(item.get("name"), item.get("arguments")))
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use crate::decode::event::{OutputChannel, StreamEvent, Usage};
    use crate::decode::protocols::testing::*;
    use crate::model::ApiKind;

    const API: ApiKind = ApiKind::OpenaiResponses;

    fn ev<'a>(t: &'a str, body: &'a str) -> (Option<&'a str>, &'a str) {
        (Some(t), body)
    }

    #[test]
    fn deltas_by_type_and_done_events_not_double_counted() {
        let (out, bad) = messages(
            API,
            None,
            &[
                ev(
                    "response.created",
                    r#"{"type":"response.created","response":{"status":"in_progress"}}"#,
                ),
                ev(
                    "response.reasoning_text.delta",
                    r#"{"type":"response.reasoning_text.delta","delta":"hm"}"#,
                ),
                ev(
                    "response.reasoning_text.done",
                    r#"{"type":"response.reasoning_text.done","text":"hm"}"#,
                ),
                ev(
                    "response.output_text.delta",
                    r#"{"type":"response.output_text.delta","delta":"Hi"}"#,
                ),
                ev(
                    "response.output_text.delta",
                    r#"{"type":"response.output_text.delta","delta":" there"}"#,
                ),
                ev(
                    "response.output_text.done",
                    r#"{"type":"response.output_text.done","text":"Hi there"}"#,
                ),
                ev(
                    "response.content_part.done",
                    r#"{"type":"response.content_part.done","part":{"type":"output_text","text":"Hi there"}}"#,
                ),
                ev(
                    "response.output_item.done",
                    r#"{"type":"response.output_item.done","item":{"type":"message","content":[{"type":"output_text","text":"Hi there"}]}}"#,
                ),
                ev(
                    "response.completed",
                    r#"{"type":"response.completed","response":{"status":"completed",
                    "output":[{"type":"message","content":[{"type":"output_text","text":"Hi there"}]}],
                    "usage":{"input_tokens":38,"output_tokens":47,"total_tokens":85,"input_tokens_details":{"cached_tokens":37},
                    "output_tokens_details":{"reasoning_tokens":1}}},
                    "timings":{"cache_n":37,"prompt_n":1,"prompt_ms":16.795,"predicted_n":47,"predicted_ms":710.542}}"#,
                ),
            ],
        );
        assert_eq!(bad, 0);
        assert_eq!(text(&out, OutputChannel::Text), "Hi there");
        assert_eq!(text(&out, OutputChannel::Reasoning), "hm");
        assert_eq!(
            usage(&out),
            Some(Usage {
                output_tokens: Some(47),
                input_tokens: Some(38),
                reasoning_tokens: Some(1),
                cached_input_tokens: Some(37)
            })
        );
        assert_eq!(timings(&out).unwrap().generation_ms, Some(710.542));
        assert_eq!(out.last(), Some(&StreamEvent::Done));
    }

    #[test]
    fn type_field_wins_and_event_name_is_the_fallback() {
        let (out, _) = messages(
            API,
            None,
            &[
                // No `type` in the body: the SSE event name decides.
                (Some("response.output_text.delta"), r#"{"delta":"a"}"#),
                // The body's type disagrees with the event name: the body wins.
                (
                    Some("response.output_text.delta"),
                    r#"{"type":"response.reasoning_summary_text.delta","delta":"b"}"#,
                ),
                (None, r#"{"type":"response.refusal.delta","delta":"c"}"#),
            ],
        );
        assert_eq!(text(&out, OutputChannel::Text), "ac");
        assert_eq!(text(&out, OutputChannel::Reasoning), "b");
    }

    #[test]
    fn function_call_name_and_argument_deltas() {
        let (out, _) = messages(
            API,
            None,
            &[
                ev(
                    "response.output_item.added",
                    r#"{"type":"response.output_item.added","item":{"type":"function_call","name":"get_weather","arguments":""}}"#,
                ),
                ev(
                    "response.function_call_arguments.delta",
                    r#"{"type":"response.function_call_arguments.delta","delta":"{\"city\":"}"#,
                ),
                ev(
                    "response.function_call_arguments.delta",
                    r#"{"type":"response.function_call_arguments.delta","delta":"\"Paris\"}"}"#,
                ),
                ev(
                    "response.function_call_arguments.done",
                    r#"{"type":"response.function_call_arguments.done","name":"get_weather","arguments":"{\"city\":\"Paris\"}"}"#,
                ),
                ev(
                    "response.output_item.added",
                    r#"{"type":"response.output_item.added","item":{"type":"message","content":[]}}"#,
                ),
            ],
        );
        assert_eq!(
            text(&out, OutputChannel::ToolArguments),
            "get_weather{\"city\":\"Paris\"}"
        );
        assert_eq!(count_done(&out), 0, "no terminal event");
    }

    #[test]
    fn failed_and_error_events() {
        let (out, _) = messages(
            API,
            None,
            &[
                ev(
                    "response.output_text.delta",
                    r#"{"type":"response.output_text.delta","delta":"x"}"#,
                ),
                ev(
                    "response.failed",
                    r#"{"type":"response.failed","response":{"status":"failed","error":{"code":"server_error","message":"m"}}}"#,
                ),
            ],
        );
        assert_eq!(errors(&out), vec!["server_error"]);
        assert_eq!(out.last(), Some(&StreamEvent::Done));
        let (out, _) = messages(
            API,
            None,
            &[ev(
                "error",
                r#"{"type":"error","code":"rate_limit_exceeded","message":"m"}"#,
            )],
        );
        assert_eq!(errors(&out), vec!["rate_limit_exceeded"]);
        assert_eq!(count_done(&out), 0);
    }

    #[test]
    fn incomplete_is_terminal_with_usage() {
        let (out, _) = messages(
            API,
            None,
            &[ev(
                "response.incomplete",
                r#"{"type":"response.incomplete","response":{"status":"incomplete","usage":{"input_tokens":3,"output_tokens":16}}}"#,
            )],
        );
        assert_eq!(usage(&out).unwrap().output_tokens, Some(16));
        assert_eq!(count_done(&out), 1);
    }

    #[test]
    fn whole_body() {
        let (out, bad) = body(
            API,
            None,
            r#"{"object":"response","status":"completed","output":[
                {"type":"reasoning","summary":[{"type":"summary_text","text":"s"}],"content":[{"type":"reasoning_text","text":"r"}]},
                {"type":"message","content":[{"type":"output_text","text":"Hello"},{"type":"refusal","refusal":" no"}]},
                {"type":"function_call","name":"f","arguments":"{}"}],
                "usage":{"input_tokens":38,"output_tokens":47,"input_tokens_details":{"cached_tokens":37}}}"#,
        );
        assert_eq!(bad, 0);
        assert_eq!(text(&out, OutputChannel::Reasoning), "rs");
        assert_eq!(text(&out, OutputChannel::Text), "Hello no");
        assert_eq!(text(&out, OutputChannel::ToolArguments), "f{}");
        assert_eq!(usage(&out).unwrap().cached_input_tokens, Some(37));
        assert_eq!(out.last(), Some(&StreamEvent::Done));
    }
}
