//! Anthropic Messages (`/v1/messages`), following llama-server's event
//! sequence: `message_start`, `content_block_start`, one
//! `content_block_delta` per token, `content_block_stop`, `message_delta`
//! (cumulative `usage.output_tokens`), `message_stop`.
//!
//! Choices, written down:
//! - Reasoning is a `thinking` block (index 0) streamed as `thinking_delta`;
//!   in the first answer token's frame it gets a `signature_delta` (as the
//!   real API sends before closing a thinking block; a metering decoder
//!   must not count it) and `content_block_stop`, and the `text` block
//!   (index 1) opens.
//! - `message_start.usage` has `input_tokens` and `output_tokens: 0`; no
//!   `ping` events (llama-server sends none).
//! - Errors are `{"type":"error","error":{"type","message"}}`, as an
//!   `event: error` mid-stream and as the body of an `x-sim-status` reply.

use super::{sse, Reply, Token, Totals};
use crate::decode::event::OutputChannel;
use crate::simulate::json::Obj;

/// An opaque stand-in for the thinking block's signature.
const SIGNATURE: &str = "c2ltdWxhdGVkLXNpZ25hdHVyZQ==";

fn event(kind: &str, fill: impl FnOnce(Obj) -> Obj) -> String {
    sse(Some(kind), &fill(Obj::new().field("type", kind)).finish())
}

fn text_index(r: &Reply) -> u64 {
    u64::from(r.reasoning > 0)
}

fn block_start(index: u64, block: Obj) -> String {
    event("content_block_start", |o| {
        o.field("index", index).obj("content_block", block)
    })
}

fn block_stop(index: u64) -> String {
    event("content_block_stop", |o| o.field("index", index))
}

fn delta(index: u64, delta: Obj) -> String {
    event("content_block_delta", |o| {
        o.field("index", index).obj("delta", delta)
    })
}

fn text_block(text: &str) -> Obj {
    Obj::new().field("type", "text").field("text", text)
}

fn thinking_block(thinking: &str, signature: &str) -> Obj {
    Obj::new()
        .field("type", "thinking")
        .field("thinking", thinking)
        .field("signature", signature)
}

fn close_thinking() -> String {
    let mut out = delta(
        0,
        Obj::new()
            .field("type", "signature_delta")
            .field("signature", SIGNATURE),
    );
    out.push_str(&block_stop(0));
    out
}

pub(super) fn preamble(r: &mut Reply) -> String {
    let message = Obj::new()
        .field("id", &r.id)
        .field("type", "message")
        .field("role", "assistant")
        .arr("content", Vec::new())
        .field("model", &r.model)
        .field("stop_reason", None::<&str>)
        .field("stop_sequence", None::<&str>)
        .obj(
            "usage",
            Obj::new()
                .field("input_tokens", r.input_tokens)
                .field("output_tokens", 0),
        );
    let mut out = event("message_start", |o| o.obj("message", message));
    let first = if r.reasoning > 0 {
        thinking_block("", "")
    } else {
        text_block("")
    };
    out.push_str(&block_start(0, first));
    out
}

pub(super) fn token(r: &mut Reply, t: &Token) -> String {
    let mut out = String::new();
    if r.starts_answer(t) {
        out.push_str(&close_thinking());
        out.push_str(&block_start(text_index(r), text_block("")));
    }
    let d = match t.channel {
        OutputChannel::Reasoning => Obj::new()
            .field("type", "thinking_delta")
            .field("thinking", t.text),
        _ => Obj::new().field("type", "text_delta").field("text", t.text),
    };
    let index = match t.channel {
        OutputChannel::Reasoning => 0,
        _ => text_index(r),
    };
    out.push_str(&delta(index, d));
    out
}

pub(super) fn finish(r: &mut Reply, totals: &Totals) -> String {
    let mut out = if r.reasoning > 0 && r.answer == 0 {
        close_thinking()
    } else {
        block_stop(text_index(r))
    };
    out.push_str(&event("message_delta", |o| {
        o.obj(
            "delta",
            Obj::new()
                .field("stop_reason", "end_turn")
                .field("stop_sequence", None::<&str>),
        )
        .obj(
            "usage",
            Obj::new().field("output_tokens", totals.output_tokens),
        )
    }));
    out.push_str(&event("message_stop", |o| o));
    out
}

pub(super) fn whole(r: &Reply, totals: &Totals) -> String {
    let mut content = Vec::new();
    if r.reasoning > 0 {
        content.push(thinking_block(&r.reasoning_text, SIGNATURE));
    }
    if r.answer > 0 || r.reasoning == 0 {
        content.push(text_block(&r.answer_text));
    }
    Obj::new()
        .field("id", &r.id)
        .field("type", "message")
        .field("role", "assistant")
        .arr("content", content)
        .field("model", &r.model)
        .field("stop_reason", "end_turn")
        .field("stop_sequence", None::<&str>)
        .obj(
            "usage",
            Obj::new()
                .field("input_tokens", totals.input_tokens)
                .field("output_tokens", totals.output_tokens),
        )
        .finish()
}

/// Anthropic's error object; the `error.type` follows the status as the
/// real API maps them.
pub(super) fn error_object(status: u16, message: &str) -> String {
    let kind = match status {
        400 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        _ => "api_error",
    };
    Obj::new()
        .field("type", "error")
        .obj(
            "error",
            Obj::new().field("type", kind).field("message", message),
        )
        .finish()
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::*;
    use crate::model::ApiKind;
    use serde_json::Value;

    fn names(events: &[(Option<String>, Value)]) -> Vec<String> {
        events
            .iter()
            .map(|(e, v)| {
                assert_eq!(e.as_deref(), v["type"].as_str());
                e.clone().unwrap()
            })
            .collect()
    }

    #[test]
    fn text_only_sequence_matches_llama_server() {
        let (mut r, totals) = reply(ApiKind::AnthropicMessages, 0, 2, false, false);
        let text = stream(&mut r, &totals);
        let events = sse_events(&text);
        assert_eq!(
            names(&events),
            [
                "message_start",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        assert!(text.starts_with(
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_"
        ));
        assert_eq!(events[0].1["message"]["usage"]["input_tokens"], 4);
        assert_eq!(events[0].1["message"]["model"], "m1");
        assert_eq!(events[2].1["delta"]["text"], " the");
        assert_eq!(events[5].1["usage"]["output_tokens"], 2);
        assert_eq!(events[5].1["delta"]["stop_reason"], "end_turn");
    }

    #[test]
    fn thinking_block_then_text_block() {
        let (mut r, totals) = reply(ApiKind::AnthropicMessages, 2, 1, false, false);
        let events = sse_events(&stream(&mut r, &totals));
        assert_eq!(
            names(&events),
            [
                "message_start",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        assert_eq!(events[1].1["content_block"]["type"], "thinking");
        assert_eq!(events[2].1["delta"]["thinking"], " the");
        assert_eq!(events[4].1["delta"]["type"], "signature_delta");
        assert_eq!(events[6].1["index"], 1);
        assert_eq!(events[7].1["delta"]["text"], " of");
        assert_eq!(events[8].1["index"], 1);
        assert_eq!(events[9].1["usage"]["output_tokens"], 3);

        let v: Value = serde_json::from_str(&whole(&r, &totals)).unwrap();
        assert_eq!(v["content"][0]["thinking"], " the model");
        assert_eq!(v["content"][1]["text"], " of");
        assert_eq!(v["usage"]["output_tokens"], 3);
    }

    #[test]
    fn errors() {
        let v: Value = serde_json::from_str(&error_object(503, "busy")).unwrap();
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], "overloaded_error");
        let v: Value = serde_json::from_str(&error_object(500, "x")).unwrap();
        assert_eq!(v["error"]["type"], "api_error");
    }
}
