//! Hugging Face TGI native `/generate_stream` (SSE, `data:` with no space)
//! and `/generate` (one JSON object).
//!
//! Choices, written down:
//! - One event per token with a 1-based `index`, a fake token id and a
//!   fixed logprob; reasoning inline as `<think>…</think>` (TGI has no
//!   reasoning field).
//! - The stream ends as real TGI does: one more event for the
//!   end-of-sequence token (`special: true`, text `</s>`, which decoders
//!   must skip) carrying `generated_text` and `details`. `generated_tokens`
//!   is the scheduled count through the usage factor (real TGI also counts
//!   the EOS token; the simulator keeps "count = tokens × factor" on every
//!   route).
//! - `/generate` always returns `details` with the token list, and the
//!   `x-prompt-tokens` / `x-generated-tokens` headers; the timing headers
//!   (`x-total-time`, `x-inference-time`, `x-time-per-token`, …, integer ms)
//!   only with server timings.

use super::{Reply, Token, Totals};
use crate::simulate::json::Obj;
use crate::simulate::words;

/// The end-of-sequence token of the simulated vocabulary.
const EOS_ID: u64 = 2;
const EOS_TEXT: &str = "</s>";
/// Every simulated token is equally likely.
const LOGPROB: f64 = -0.25;

/// One SSE event in TGI's spacing (`data:{…}`).
fn event(data: &str) -> String {
    format!("data:{data}\n\n")
}

fn token_obj(id: u64, text: &str, special: bool) -> Obj {
    Obj::new()
        .field("id", id)
        .field("text", text)
        .field("logprob", if special { -0.01 } else { LOGPROB })
        .field("special", special)
}

pub(super) fn token(r: &mut Reply, t: &Token) -> String {
    let data = Obj::new()
        .field("index", t.index + 1)
        .obj(
            "token",
            token_obj(words::token_id(t.index), &r.inline_text(t), false),
        )
        .field("generated_text", None::<&str>)
        .field("details", None::<()>)
        .finish();
    event(&data)
}

pub(super) fn finish(r: &mut Reply, totals: &Totals) -> String {
    let details = Obj::new()
        .field("finish_reason", "eos_token")
        .field("generated_tokens", totals.output_tokens)
        .field("seed", None::<u64>)
        .field("input_length", totals.input_tokens);
    let data = Obj::new()
        .field("index", r.reasoning + r.answer + 1)
        .obj("token", token_obj(EOS_ID, EOS_TEXT, true))
        .field("generated_text", r.inline_full())
        .obj("details", details)
        .finish();
    event(&data)
}

pub(super) fn whole(r: &Reply, totals: &Totals) -> String {
    let total = r.reasoning + r.answer;
    let mut tokens = Vec::with_capacity(total as usize);
    for index in 0..total {
        let t = Token {
            index,
            channel: if index < r.reasoning {
                crate::decode::event::OutputChannel::Reasoning
            } else {
                crate::decode::event::OutputChannel::Text
            },
            text: words::word(index),
        };
        tokens.push(token_obj(words::token_id(index), &r.inline_text(&t), false));
    }
    let details = Obj::new()
        .field("finish_reason", "eos_token")
        .field("generated_tokens", totals.output_tokens)
        .field("seed", None::<u64>)
        .arr("prefill", Vec::new())
        .arr("tokens", tokens);
    Obj::new()
        .field("generated_text", r.inline_full())
        .obj("details", details)
        .finish()
}

/// `/generate`'s count and (with server timings) timing headers.
pub(super) fn headers(r: &Reply, totals: &Totals) -> Vec<(&'static str, String)> {
    let mut h = vec![
        ("x-prompt-tokens", totals.input_tokens.to_string()),
        ("x-generated-tokens", totals.output_tokens.to_string()),
    ];
    if r.timings {
        let ms = |v: f64| (v.round() as u64).to_string();
        let inference = totals.total_ms;
        let per_token = if totals.output_tokens > 0 {
            inference / totals.output_tokens as f64
        } else {
            0.0
        };
        h.extend([
            ("x-total-time", ms(totals.total_ms)),
            ("x-validation-time", ms(0.0)),
            ("x-queue-time", ms(0.0)),
            ("x-inference-time", ms(inference)),
            ("x-time-per-token", ms(per_token)),
        ]);
    }
    h
}

pub(super) fn error_event(message: &str) -> String {
    event(&error_object(500, message))
}

/// TGI's error object, `{"error","error_type"}`.
pub(super) fn error_object(status: u16, message: &str) -> String {
    let kind = match status {
        429 | 503 => "overloaded",
        400..=499 => "validation",
        _ => "generation",
    };
    Obj::new()
        .field("error", message)
        .field("error_type", kind)
        .finish()
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::*;
    use crate::model::ApiKind;
    use serde_json::Value;

    #[test]
    fn stream_shape() {
        let (mut r, totals) = reply(ApiKind::TgiGenerate, 1, 2, false, false);
        let text = stream(&mut r, &totals);
        assert!(text.starts_with("data:{\"index\":1,\"token\":{"));
        let events: Vec<Value> = sse_events(&text).into_iter().map(|(_, v)| v).collect();
        assert_eq!(events.len(), 4);
        assert_eq!(events[0]["token"]["text"], "<think> the</think>");
        assert_eq!(events[2]["index"], 3);
        assert_eq!(events[2]["token"]["special"], false);
        assert!(events[2]["details"].is_null());
        let last = &events[3];
        assert_eq!(last["token"]["special"], true);
        assert_eq!(last["generated_text"], "<think> the</think> model of");
        assert_eq!(last["details"]["generated_tokens"], 3);
        assert_eq!(last["details"]["finish_reason"], "eos_token");
    }

    #[test]
    fn whole_and_headers() {
        let (mut r, totals) = reply(ApiKind::TgiGenerate, 0, 2, false, false);
        stream(&mut r, &totals);
        let v: Value = serde_json::from_str(&whole(&r, &totals)).unwrap();
        assert_eq!(v["generated_text"], " the model");
        assert_eq!(v["details"]["tokens"].as_array().unwrap().len(), 2);
        let h = headers(&r, &totals);
        assert_eq!(
            h,
            [
                ("x-prompt-tokens", "4".to_string()),
                ("x-generated-tokens", "2".to_string())
            ]
        );
        r.timings = true;
        let h = headers(&r, &totals);
        assert!(h.contains(&("x-total-time", "1200".to_string())));
        assert!(h.contains(&("x-time-per-token", "600".to_string())));
    }

    #[test]
    fn errors() {
        let v: Value = serde_json::from_str(&error_object(503, "busy")).unwrap();
        assert_eq!(v["error_type"], "overloaded");
        let text = error_event("boom");
        assert!(text.starts_with("data:{\"error\":\"boom\""));
    }
}
