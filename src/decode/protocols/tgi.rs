//! Hugging Face TGI native API (`docs/protocols.md` "TGI").
//!
//! `/generate_stream` (SSE, `data:` without a space): one event per token.
//! `token.text` is visible text unless `token.special` is true (an EOS
//! token's `</s>` is not output a user sees). The last event carries
//! `details` (usage: `generated_tokens`, `input_length`) and, again, the
//! whole `generated_text`, which is ignored so nothing is counted twice;
//! non-null `details` is `Done`. Errors are `{"error": "...", "error_type":
//! "..."}`, handled for every API in `Protocol::message`.
//!
//! `/generate` (JSON): `generated_text` is the text, `details` the usage
//! (`generated_tokens`; `input_length` when present).
//!
//! TGI never splits reasoning: thinking models leave `<think>` inline, and
//! the sink's splitter files it.

use serde_json::Value;

use crate::decode::event::Usage;

use super::{json, Sink};

/// The TGI decoder keeps no state: every event stands alone.
#[derive(Debug, Default)]
pub(crate) struct Decoder;

impl Decoder {
    /// One streamed event.
    pub(crate) fn message(&mut self, v: &Value, sink: &mut Sink<'_>) {
        if let Some(token) = json::object(v, "token") {
            let special = token.get("special").and_then(Value::as_bool) == Some(true);
            if !special {
                if let Some(t) = json::nonempty_str(token, "text") {
                    sink.text(t);
                }
            }
        }
        if let Some(details) = json::object(v, "details") {
            sink.usage(details_usage(details));
            sink.done();
        }
    }

    /// A whole `/generate` response. Recognised when it has
    /// `generated_text`.
    pub(crate) fn body(&mut self, v: &Value, sink: &mut Sink<'_>) -> bool {
        if v.get("generated_text").is_none() {
            return false;
        }
        if let Some(t) = json::nonempty_str(v, "generated_text") {
            sink.text(t);
        }
        if let Some(details) = json::object(v, "details") {
            sink.usage(details_usage(details));
        }
        true
    }
}

fn details_usage(details: &Value) -> Option<Usage> {
    json::non_empty_usage(Usage {
        output_tokens: json::count(details.get("generated_tokens")),
        input_tokens: json::count(details.get("input_length")),
        ..Usage::default()
    })
}

#[cfg(test)]
mod tests {
    use crate::decode::detect::BodyFraming;
    use crate::decode::event::{OutputChannel, StreamEvent, Usage};
    use crate::decode::protocols::testing::*;
    use crate::decode::stream::StreamDecoder;
    use crate::model::ApiKind;

    const API: ApiKind = ApiKind::TgiGenerate;

    #[test]
    fn tokens_special_tokens_and_details() {
        let (out, bad) = lines(
            API,
            None,
            &[
                r#"{"index":1,"token":{"id":15043,"text":" Hello","logprob":-0.12,"special":false},"generated_text":null,"details":null}"#,
                r#"{"index":2,"token":{"id":29892,"text":",","logprob":-0.3,"special":false},"generated_text":null,"details":null}"#,
                r#"{"index":3,"token":{"id":2,"text":"</s>","logprob":-0.01,"special":true},"generated_text":" Hello,",
                   "details":{"finish_reason":"eos_token","generated_tokens":3,"seed":null,"input_length":8}}"#,
            ],
        );
        assert_eq!(bad, 0);
        assert_eq!(text(&out, OutputChannel::Text), " Hello,");
        assert_eq!(
            usage(&out),
            Some(Usage {
                output_tokens: Some(3),
                input_tokens: Some(8),
                reasoning_tokens: None,
                cached_input_tokens: None
            })
        );
        assert_eq!(out.last(), Some(&StreamEvent::Done));
    }

    #[test]
    fn data_without_space_and_error_event() {
        let mut d = StreamDecoder::new(API, BodyFraming::Sse, None);
        let mut ev = Vec::new();
        d.feed(
            b"data:{\"token\":{\"text\":\"a\",\"special\":false},\"details\":null}\n\n:\n\n",
            &mut ev,
        );
        d.feed(b"data:{\"error\":\"Request failed during generation: Server error\",\"error_type\":\"generation\"}\n\n", &mut ev);
        d.finish(&mut ev);
        assert_eq!(text(&ev, OutputChannel::Text), "a");
        assert_eq!(errors(&ev), vec!["generation"]);
        assert_eq!(count_done(&ev), 0);
        assert_eq!(d.unparsed_messages(), 0);
    }

    #[test]
    fn whole_generate_body() {
        let (out, _) = body(
            API,
            None,
            r#"{"generated_text":"Hello there","details":{"finish_reason":"length","generated_tokens":2,"seed":null,"prefill":[],"tokens":[]}}"#,
        );
        assert_eq!(text(&out, OutputChannel::Text), "Hello there");
        assert_eq!(usage(&out).unwrap().output_tokens, Some(2));
        assert_eq!(count_done(&out), 1);
        // A batch answer: an array of responses.
        let (out, _) = body(
            API,
            None,
            r#"[{"generated_text":"a"},{"generated_text":"b"}]"#,
        );
        assert_eq!(text(&out, OutputChannel::Text), "ab");
    }
}
