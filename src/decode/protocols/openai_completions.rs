//! OpenAI legacy Completions (`/v1/completions`, `docs/protocols.md`
//! "OpenAI Completions"): `choices[].text` is visible text (raw completions are where inline
//! `<think>` is most likely, so the sink's splitter matters here). Usage,
//! timings, finish reasons and `[DONE]` follow the chat rules exactly
//! (see [`super::openai_chat`]), including `Done` at the end of a body that
//! finished without `[DONE]`.

use serde_json::Value;

use super::openai_chat::{choices, scan_envelope};
use super::{json, Sink};

/// Per-call state of the completions decoder.
#[derive(Debug, Default)]
pub(crate) struct Decoder {
    /// A choice reported a real `finish_reason`.
    finished: bool,
}

impl Decoder {
    /// One streamed chunk.
    pub(crate) fn message(&mut self, v: &Value, sink: &mut Sink<'_>) {
        for choice in choices(v) {
            if let Some(text) = json::nonempty_str(choice, "text") {
                sink.text(text);
            }
        }
        scan_envelope(v, &mut self.finished, sink);
    }

    /// A whole `text_completion` body. Recognised when it has `choices`.
    pub(crate) fn body(&mut self, v: &Value, sink: &mut Sink<'_>) -> bool {
        if !v.get("choices").is_some_and(Value::is_array) {
            return false;
        }
        self.message(v, sink);
        true
    }

    /// End of body: `Done` if a finish reason was seen.
    pub(crate) fn finish(&mut self, sink: &mut Sink<'_>) {
        if self.finished {
            sink.done();
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::decode::event::{OutputChannel, StreamEvent, Usage};
    use crate::decode::protocols::testing::*;
    use crate::model::ApiKind;

    const API: ApiKind = ApiKind::OpenaiCompletions;

    #[test]
    fn text_usage_on_finish_chunk_and_done() {
        let (ev, bad) = lines(
            API,
            None,
            &[
                "{\"choices\":[{\"text\":\" a\",\"index\":0,\"finish_reason\":null}]}",
                "{\"choices\":[{\"text\":\" place\",\"index\":0,\"finish_reason\":null}]}",
                "{\"choices\":[{\"text\":\"\",\"index\":0,\"finish_reason\":\"length\"}],\
                 \"usage\":{\"completion_tokens\":2,\"prompt_tokens\":3,\"total_tokens\":5,\"prompt_tokens_details\":{\"cached_tokens\":2}},\
                 \"timings\":{\"cache_n\":2,\"prompt_n\":1,\"prompt_ms\":15.0,\"predicted_n\":2,\"predicted_ms\":30.0}}",
                "[DONE]",
            ],
        );
        assert_eq!(bad, 0);
        assert_eq!(text(&ev, OutputChannel::Text), " a place");
        assert_eq!(
            usage(&ev),
            Some(Usage {
                output_tokens: Some(2),
                input_tokens: Some(3),
                reasoning_tokens: None,
                cached_input_tokens: Some(2)
            })
        );
        assert_eq!(timings(&ev).unwrap().generation_ms, Some(30.0));
        assert_eq!(ev.last(), Some(&StreamEvent::Done));
        assert_eq!(count_done(&ev), 1);
    }

    #[test]
    fn inline_think_in_raw_completion() {
        let (ev, _) = lines(
            API,
            None,
            &[
                "{\"choices\":[{\"text\":\"<thi\"}]}",
                "{\"choices\":[{\"text\":\"nk>plan</think>done\"}]}",
                "{\"choices\":[{\"text\":\"\",\"finish_reason\":\"stop\"}]}",
            ],
        );
        assert_eq!(text(&ev, OutputChannel::Reasoning), "plan");
        assert_eq!(text(&ev, OutputChannel::Text), "done");
        assert_eq!(
            ev.last(),
            Some(&StreamEvent::Done),
            "finish reason, no [DONE]"
        );
    }

    #[test]
    fn no_finish_no_done() {
        let (ev, _) = lines(
            API,
            None,
            &["{\"choices\":[{\"text\":\"cut\",\"finish_reason\":null}]}"],
        );
        assert_eq!(text(&ev, OutputChannel::Text), "cut");
        assert_eq!(count_done(&ev), 0);
    }

    #[test]
    fn whole_body() {
        let (ev, _) = body(
            API,
            None,
            "{\"object\":\"text_completion\",\"choices\":[{\"text\":\" a place\",\"index\":0,\"finish_reason\":\"length\"}],\
             \"usage\":{\"prompt_tokens\":3,\"completion_tokens\":32,\"total_tokens\":35}}",
        );
        assert_eq!(text(&ev, OutputChannel::Text), " a place");
        assert_eq!(usage(&ev).unwrap().output_tokens, Some(32));
        assert_eq!(count_done(&ev), 1);
    }
}
