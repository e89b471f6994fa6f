//! OpenAI Chat Completions (`/v1/chat/completions`) and legacy Completions
//! (`/v1/completions`), shaped like llama-server's output.
//!
//! Choices, written down:
//! - Chat opens with llama.cpp's role chunk (`{"role":"assistant",
//!   "content":null}`) in the first token's frame; reasoning goes in
//!   `delta.reasoning_content` (llama.cpp's field). Completions have no
//!   role chunk and carry reasoning inline as `<think>…</think>`.
//! - The finish chunk has `finish_reason: "stop"`. Usage comes only in a
//!   trailing `choices: []` chunk, sent with `stream_options.include_usage`
//!   or the `usage` switch (the OpenAI spec; llama.cpp's completions route
//!   also puts usage on its finish chunk, which we don't imitate so both
//!   routes behave as the spec says). `timings` ride on the last chunk
//!   before `[DONE]`, as in current llama.cpp.
//! - `completion_tokens_details.reasoning_tokens` is sent only when there
//!   is reasoning (llama.cpp never sends it; OpenAI always does).

use super::llamacpp;
use super::{sse, Reply, Token, Totals};
use crate::decode::event::OutputChannel;
use crate::model::ApiKind;
use crate::simulate::json::Obj;

/// llama-server's `system_fingerprint` field, ours.
const FINGERPRINT: &str = "speedtap-sim";

fn is_chat(r: &Reply) -> bool {
    r.api == ApiKind::OpenaiChat
}

/// One stream chunk in llama.cpp's key order.
fn chunk(r: &Reply, choice: Option<Obj>, usage: Option<Obj>, timings: Option<Obj>) -> String {
    let choices: Vec<Obj> = choice.into_iter().collect();
    let o = Obj::new()
        .arr("choices", choices)
        .field("created", r.created);
    let data = if is_chat(r) {
        o.field("id", &r.id)
            .field("model", &r.model)
            .field("system_fingerprint", FINGERPRINT)
            .field("object", "chat.completion.chunk")
            .opt_obj("usage", usage)
            .opt_obj("timings", timings)
    } else {
        o.field("model", &r.model)
            .field("system_fingerprint", FINGERPRINT)
            .field("object", "text_completion")
            .opt_obj("usage", usage)
            .field("id", &r.id)
            .opt_obj("timings", timings)
    };
    sse(None, &data.finish())
}

fn chat_choice(delta: Obj, finish_reason: Option<&str>) -> Obj {
    Obj::new()
        .field("finish_reason", finish_reason)
        .field("index", 0)
        .obj("delta", delta)
}

fn text_choice(text: &str, finish_reason: Option<&str>) -> Obj {
    Obj::new()
        .field("text", text)
        .field("index", 0)
        .field("logprobs", None::<()>)
        .field("finish_reason", finish_reason)
}

pub(super) fn preamble(r: &mut Reply) -> String {
    if !is_chat(r) {
        return String::new();
    }
    let delta = Obj::new()
        .field("role", "assistant")
        .field("content", None::<&str>);
    chunk(r, Some(chat_choice(delta, None)), None, None)
}

pub(super) fn token(r: &mut Reply, t: &Token) -> String {
    let choice = if is_chat(r) {
        let field = match t.channel {
            OutputChannel::Reasoning => "reasoning_content",
            _ => "content",
        };
        chat_choice(Obj::new().field(field, t.text), None)
    } else {
        text_choice(&r.inline_text(t), None)
    };
    chunk(r, Some(choice), None, None)
}

/// The `usage` object (llama.cpp's key order).
fn usage(totals: &Totals) -> Obj {
    let details = (totals.reasoning_tokens > 0)
        .then(|| Obj::new().field("reasoning_tokens", totals.reasoning_tokens));
    Obj::new()
        .field("completion_tokens", totals.output_tokens)
        .field("prompt_tokens", totals.input_tokens)
        .field("total_tokens", totals.output_tokens + totals.input_tokens)
        .opt_obj("completion_tokens_details", details)
        .obj(
            "prompt_tokens_details",
            Obj::new().field("cached_tokens", 0),
        )
}

pub(super) fn finish(r: &mut Reply, totals: &Totals) -> String {
    let timings = r.timings.then(|| llamacpp::timings(totals));
    let (on_finish, on_usage) = if r.usage_chunk {
        (None, timings)
    } else {
        (timings, None)
    };
    let choice = if is_chat(r) {
        chat_choice(Obj::new(), Some("stop"))
    } else {
        text_choice("", Some("stop"))
    };
    let mut out = chunk(r, Some(choice), None, on_finish);
    if r.usage_chunk {
        out.push_str(&chunk(r, None, Some(usage(totals)), on_usage));
    }
    out.push_str("data: [DONE]\n\n");
    out
}

pub(super) fn whole(r: &Reply, totals: &Totals) -> String {
    let choice = if is_chat(r) {
        let mut message = Obj::new()
            .field("role", "assistant")
            .field("content", &r.answer_text);
        if !r.reasoning_text.is_empty() {
            message = message.field("reasoning_content", &r.reasoning_text);
        }
        Obj::new()
            .field("finish_reason", "stop")
            .field("index", 0)
            .obj("message", message)
    } else {
        text_choice(&r.inline_full(), Some("stop"))
    };
    let object = if is_chat(r) {
        "chat.completion"
    } else {
        "text_completion"
    };
    Obj::new()
        .arr("choices", vec![choice])
        .field("created", r.created)
        .field("model", &r.model)
        .field("system_fingerprint", FINGERPRINT)
        .field("object", object)
        .obj("usage", usage(totals))
        .field("id", &r.id)
        .opt_obj("timings", r.timings.then(|| llamacpp::timings(totals)))
        .finish()
}

/// llama-server's error object, used by every OpenAI-style route (and
/// llama.cpp's native one): `{"error":{"code","message","type"}}`.
pub(super) fn error_object(status: u16, message: &str) -> String {
    let kind = match status {
        400 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        429 => "rate_limit_error",
        501 => "not_supported_error",
        503 => "unavailable_error",
        _ => "server_error",
    };
    Obj::new()
        .obj(
            "error",
            Obj::new()
                .field("code", status)
                .field("message", message)
                .field("type", kind),
        )
        .finish()
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::*;
    use serde_json::Value;

    fn payloads(text: &str) -> Vec<Value> {
        sse_events(text).into_iter().map(|(_, v)| v).collect()
    }

    #[test]
    fn chat_stream_shape() {
        let (mut r, totals) = reply(ApiKind::OpenaiChat, 2, 3, false, false);
        let text = stream(&mut r, &totals);
        let events = payloads(&text);
        // role, 2 reasoning, 3 answer, finish, [DONE]
        assert_eq!(events.len(), 8, "{text}");
        assert_eq!(events[0]["choices"][0]["delta"]["role"], "assistant");
        assert!(events[0]["choices"][0]["delta"]["content"].is_null());
        assert_eq!(
            events[1]["choices"][0]["delta"]["reasoning_content"],
            " the"
        );
        assert_eq!(events[3]["choices"][0]["delta"]["content"], " of");
        assert_eq!(events[6]["choices"][0]["finish_reason"], "stop");
        assert!(events[6].get("usage").is_none() && events[6].get("timings").is_none());
        assert_eq!(events[7], "[DONE]");
        assert!(text.starts_with(r#"data: {"choices":[{"finish_reason":null,"index":0,"delta":{"role":"assistant","content":null}}],"created":"#));
        for e in &events[..7] {
            assert_eq!(e["object"], "chat.completion.chunk");
            assert_eq!(e["model"], "m1");
            assert_eq!(e["id"], events[0]["id"]);
        }
    }

    #[test]
    fn usage_chunk_carries_the_timings() {
        let (mut r, totals) = reply(ApiKind::OpenaiChat, 2, 3, true, true);
        let events = payloads(&stream(&mut r, &totals));
        let n = events.len();
        let finish = &events[n - 3];
        let usage = &events[n - 2];
        assert!(finish.get("timings").is_none());
        assert_eq!(usage["choices"], Value::Array(vec![]));
        assert_eq!(usage["usage"]["completion_tokens"], 5);
        assert_eq!(
            usage["usage"]["completion_tokens_details"]["reasoning_tokens"],
            2
        );
        assert_eq!(usage["usage"]["prompt_tokens"], 4);
        assert_eq!(usage["usage"]["total_tokens"], 9);
        assert_eq!(usage["timings"]["predicted_n"], 5);
    }

    #[test]
    fn timings_without_usage_ride_on_the_finish_chunk() {
        let (mut r, totals) = reply(ApiKind::OpenaiCompletions, 0, 3, true, false);
        let events = payloads(&stream(&mut r, &totals));
        assert_eq!(events.len(), 5);
        assert_eq!(events[0]["choices"][0]["text"], " the");
        assert_eq!(events[3]["choices"][0]["finish_reason"], "stop");
        assert_eq!(events[3]["timings"]["predicted_n"], 3);
        assert!(events[3].get("usage").is_none());
    }

    #[test]
    fn completions_inline_reasoning() {
        let (mut r, totals) = reply(ApiKind::OpenaiCompletions, 1, 1, false, true);
        let events = payloads(&stream(&mut r, &totals));
        assert_eq!(events[0]["choices"][0]["text"], "<think> the</think>");
        assert_eq!(events[1]["choices"][0]["text"], " model");
        assert_eq!(events[3]["usage"]["completion_tokens"], 2);
        assert_eq!(events[3]["object"], "text_completion");
    }

    #[test]
    fn whole_bodies() {
        let (mut r, totals) = reply(ApiKind::OpenaiChat, 1, 2, false, false);
        stream(&mut r, &totals);
        let v: Value = serde_json::from_str(&whole(&r, &totals)).unwrap();
        assert_eq!(v["object"], "chat.completion");
        assert_eq!(v["choices"][0]["message"]["content"], " model of");
        assert_eq!(v["choices"][0]["message"]["reasoning_content"], " the");
        assert_eq!(v["usage"]["completion_tokens"], 3);
        assert!(v.get("timings").is_none());

        let (mut r, totals) = reply(ApiKind::OpenaiCompletions, 0, 2, true, false);
        stream(&mut r, &totals);
        let v: Value = serde_json::from_str(&whole(&r, &totals)).unwrap();
        assert_eq!(v["choices"][0]["text"], " the model");
        assert_eq!(v["timings"]["predicted_n"], 2);
    }

    #[test]
    fn error_object_shape() {
        let v: Value = serde_json::from_str(&error_object(503, "busy")).unwrap();
        assert_eq!(v["error"]["code"], 503);
        assert_eq!(v["error"]["type"], "unavailable_error");
        assert_eq!(v["error"]["message"], "busy");
    }
}
