//! llama.cpp native `/completion` (`docs/protocols.md` "llama.cpp"): SSE
//! without `[DONE]`, or one JSON body when not streamed.
//!
//! - `content` is visible text; the endpoint does no reasoning parsing, so
//!   `<think>` stays inline and the sink's splitter handles it.
//! - `timings`, on the last event or on every event with
//!   `timings_per_token`, is emitted as server timings each time it comes:
//!   a running `predicted_n`/`predicted_ms` is exactly what a live rate
//!   wants.
//! - `tokens_predicted` is also a running count on every event, but it is
//!   only reported (as usage, with `tokens_evaluated` as input) on the
//!   `stop: true` event: usage means "the receipt", and the running count
//!   adds nothing the timings don't already carry when asked for.
//! - `stop: true` ends the call: usage, timings, `Done`.
//! - `tokens_cached` is not reported as cached input: it is the slot's
//!   whole KV-cache fill after the request (prompt and generated tokens,
//!   34 = 3 + 32 - 1 in the captures), not the prompt tokens served from
//!   cache; those are `timings.cache_n`.

use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::Value;

use crate::decode::event::Usage;

use super::json::{self, Text};
use super::Sink;

/// The hot path: an event with text and no `timings`, before `stop`, read
/// into a borrowed struct. Declines (false, nothing emitted) the last event,
/// events with timings (`timings_per_token`), errors and anything mistyped.
pub(crate) fn fast_message(data: &str, sink: &mut Sink<'_>) -> bool {
    let Ok(event) = serde_json::from_str::<FastEvent<'_>>(data) else {
        return false;
    };
    if event.stop == Some(true)
        || event.timings.is_some()
        || event.prompt_progress.is_some()
        || event.error.is_some()
        || event.kind.is_some()
    {
        return false;
    }
    if let Some(t) = Text::nonempty(&event.content) {
        sink.text(t);
    }
    true
}

/// One streamed event as the fast path reads it (`IgnoredAny`: only
/// noticed, to decline; `Option`: `null` is absent).
#[derive(Deserialize)]
struct FastEvent<'a> {
    #[serde(borrow)]
    content: Option<Text<'a>>,
    stop: Option<bool>,
    timings: Option<IgnoredAny>,
    prompt_progress: Option<IgnoredAny>,
    error: Option<IgnoredAny>,
    #[serde(rename = "type")]
    kind: Option<IgnoredAny>,
}

/// The native decoder keeps no state: every event stands alone.
#[derive(Debug, Default)]
pub(crate) struct Decoder;

impl Decoder {
    /// One streamed event.
    pub(crate) fn message(&mut self, v: &Value, sink: &mut Sink<'_>) {
        if let Some(t) = json::nonempty_str(v, "content") {
            sink.text(t);
        }
        let stop = v.get("stop").and_then(Value::as_bool) == Some(true);
        if stop {
            sink.usage(json::non_empty_usage(Usage {
                output_tokens: json::count(v.get("tokens_predicted")),
                input_tokens: json::count(v.get("tokens_evaluated")),
                ..Usage::default()
            }));
        }
        sink.timings(json::llamacpp_timings(v.get("timings")));
        sink.prompt_progress(json::llamacpp_prompt_progress(v.get("prompt_progress")));
        if stop {
            sink.done();
        }
    }

    /// A whole non-streamed response: the final event's shape with all the
    /// text. Recognised when it has `content` or `stop`.
    pub(crate) fn body(&mut self, v: &Value, sink: &mut Sink<'_>) -> bool {
        if v.get("content").is_none() && v.get("stop").is_none() {
            return false;
        }
        self.message(v, sink);
        true
    }
}

#[cfg(test)]
mod tests {
    use crate::decode::event::{OutputChannel, ServerTimings, StreamEvent, Usage};
    use crate::decode::protocols::testing::*;
    use crate::model::ApiKind;

    const API: ApiKind = ApiKind::LlamacppCompletion;

    #[test]
    fn running_timings_then_stop() {
        let (out, bad) = lines(
            API,
            None,
            &[
                r#"{"index":0,"content":" a","tokens":[253],"stop":false,"tokens_predicted":1,"tokens_evaluated":3,
                   "timings":{"cache_n":2,"prompt_n":1,"prompt_ms":16.247,"predicted_n":1,"predicted_ms":0.001}}"#,
                r#"{"index":0,"content":" place","tokens":[1379],"stop":false,"tokens_predicted":2,"tokens_evaluated":3,
                   "timings":{"cache_n":2,"prompt_n":1,"prompt_ms":16.247,"predicted_n":2,"predicted_ms":15.907}}"#,
                r#"{"index":0,"content":"","tokens":[],"stop":true,"tokens_predicted":2,"tokens_evaluated":3,"tokens_cached":4,
                   "stop_type":"limit","timings":{"cache_n":2,"prompt_n":1,"prompt_ms":16.247,"predicted_n":2,"predicted_ms":16.0}}"#,
            ],
        );
        assert_eq!(bad, 0);
        assert_eq!(text(&out, OutputChannel::Text), " a place");
        let generation: Vec<(Option<u64>, Option<f64>)> = out
            .iter()
            .filter_map(|e| match e {
                StreamEvent::ServerTimings(t) => Some((t.generated_tokens, t.generation_ms)),
                _ => None,
            })
            .collect();
        assert_eq!(
            generation,
            vec![
                (Some(1), None),
                (Some(2), Some(15.907)),
                (Some(2), Some(16.0))
            ]
        );
        let usages: Vec<&StreamEvent> = out
            .iter()
            .filter(|e| matches!(e, StreamEvent::Usage(_)))
            .collect();
        assert_eq!(
            usages,
            vec![&StreamEvent::Usage(Usage {
                output_tokens: Some(2),
                input_tokens: Some(3),
                reasoning_tokens: None,
                cached_input_tokens: None
            })],
            "usage only at stop"
        );
        assert_eq!(
            timings(&out),
            Some(ServerTimings {
                generated_tokens: Some(2),
                generation_ms: Some(16.0),
                generation_rate: Some(62.5),
                prompt_tokens: Some(1),
                prompt_ms: Some(16.247),
                load_ms: None,
                cached_tokens: Some(2),
                draft_tokens: None,
                draft_accepted: None,
            })
        );
        assert_eq!(out.last(), Some(&StreamEvent::Done));
    }

    #[test]
    fn no_stop_no_done() {
        let (out, _) = lines(
            API,
            None,
            &[r#"{"content":"cut","stop":false,"tokens_predicted":1}"#],
        );
        assert_eq!(text(&out, OutputChannel::Text), "cut");
        assert_eq!(count_done(&out), 0);
        assert_eq!(usage(&out), None);
    }

    #[test]
    fn inline_think_stays_in_content() {
        let (out, _) = lines(
            API,
            None,
            &[
                r#"{"content":"<think>","stop":false}"#,
                r#"{"content":"why","stop":false}"#,
                r#"{"content":"</think>","stop":false}"#,
                r#"{"content":"because","stop":true}"#,
            ],
        );
        assert_eq!(text(&out, OutputChannel::Reasoning), "why");
        assert_eq!(text(&out, OutputChannel::Text), "because");
        assert_eq!(out.last(), Some(&StreamEvent::Done));
    }

    #[test]
    fn legacy_error_line_and_error_object() {
        let (out, _) = messages(
            API,
            None,
            &[
                (None, r#"{"content":"a","stop":false}"#),
                (
                    Some("error"),
                    r#"{"code":500,"message":"slot unavailable","type":"unavailable_error"}"#,
                ),
            ],
        );
        assert_eq!(errors(&out), vec!["unavailable_error"]);
        let (out, _) = lines(
            API,
            None,
            &[r#"{"error":{"code":400,"message":"m","type":"invalid_request_error"}}"#],
        );
        assert_eq!(errors(&out), vec!["invalid_request_error"]);
    }

    #[test]
    fn whole_body() {
        let (out, _) = body(
            API,
            None,
            r#"{"index":0,"content":" a place of endless","stop":true,"tokens_predicted":32,"tokens_evaluated":3,
               "timings":{"cache_n":2,"prompt_n":1,"prompt_ms":15.255,"predicted_n":32,"predicted_ms":464.333}}"#,
        );
        assert_eq!(text(&out, OutputChannel::Text), " a place of endless");
        assert_eq!(usage(&out).unwrap().output_tokens, Some(32));
        assert_eq!(timings(&out).unwrap().generation_ms, Some(464.333));
        assert_eq!(count_done(&out), 1);
    }
}
