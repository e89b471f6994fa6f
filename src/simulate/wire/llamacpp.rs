//! llama.cpp's native `POST /completion` and the `timings` object every
//! llama-server route shares.
//!
//! Choices, written down:
//! - Partial events carry `tokens_predicted` as a running count through the
//!   usage factor (the server's tokenizer) and a fake token id; reasoning is
//!   inline (`<think>…</think>`), as this endpoint does no reasoning parsing.
//! - The final `stop: true` event always carries the counts (they are part
//!   of the endpoint, not an option); `timings` only with server timings.
//!   llama-server also echoes `prompt` and `generation_settings` there: we
//!   omit both (the prompt is request text, which the simulator never
//!   repeats; the settings would be invented).
//! - `stop_type` is `eos`: the simulated model ends on its own.

use super::{sse, Reply, Token, Totals};
use crate::simulate::json::Obj;
use crate::simulate::words;

/// llama.cpp's `timings` object from measured totals (server-task.cpp
/// `result_timings::to_json`). `prompt_n` is the stand-in prompt count and
/// nothing is cached; the derived rates divide by zero for a single token
/// or an instant prompt and then serialize as `null`, exactly as
/// llama.cpp's do. `draft_n` / `draft_n_accepted` follow only when a draft
/// model drafted something (`if (draft_n > 0)` upstream).
pub(super) fn timings(t: &Totals) -> Obj {
    let prompt_n = t.input_tokens as f64;
    let predicted_n = t.output_tokens as f64;
    let o = Obj::new()
        .field("cache_n", 0)
        .field("prompt_n", t.input_tokens)
        .field("prompt_ms", t.prompt_ms)
        .field("prompt_per_token_ms", t.prompt_ms / prompt_n)
        .field("prompt_per_second", 1000.0 / t.prompt_ms * prompt_n)
        .field("predicted_n", t.output_tokens)
        .field("predicted_ms", t.predicted_ms)
        .field("predicted_per_token_ms", t.predicted_ms / predicted_n)
        .field(
            "predicted_per_second",
            1000.0 / t.predicted_ms * predicted_n,
        );
    match t.drafts {
        Some((drafted, accepted)) if drafted > 0 => o
            .field("draft_n", drafted)
            .field("draft_n_accepted", accepted),
        _ => o,
    }
}

pub(super) fn token(r: &mut Reply, t: &Token) -> String {
    let data = Obj::new()
        .field("index", 0)
        .field("content", r.inline_text(t))
        .field("tokens", [words::token_id(t.index)])
        .field("stop", false)
        .field("id_slot", -1)
        .field(
            "tokens_predicted",
            (((t.index + 1) as f64) * r.usage_factor).round() as u64,
        )
        .field("tokens_evaluated", r.input_tokens)
        .finish();
    sse(None, &data)
}

/// The final object, streamed (`content: ""`) or whole (all the text).
fn last(r: &Reply, totals: &Totals, content: &str) -> String {
    Obj::new()
        .field("index", 0)
        .field("content", content)
        .field("tokens", [0u64; 0])
        .field("id_slot", 0)
        .field("stop", true)
        .field("model", &r.model)
        .field("tokens_predicted", totals.output_tokens)
        .field("tokens_evaluated", totals.input_tokens)
        .field("has_new_line", false)
        .field("truncated", false)
        .field("stop_type", "eos")
        .field("stopping_word", "")
        .field("tokens_cached", totals.input_tokens + totals.output_tokens)
        .opt_obj("timings", r.timings.then(|| timings(totals)))
        .finish()
}

pub(super) fn finish(r: &mut Reply, totals: &Totals) -> String {
    sse(None, &last(r, totals, ""))
}

pub(super) fn whole(r: &Reply, totals: &Totals) -> String {
    last(r, totals, &r.inline_full())
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::*;
    use crate::model::ApiKind;
    use serde_json::Value;

    #[test]
    fn native_stream_shape() {
        let (mut r, totals) = reply(ApiKind::LlamacppCompletion, 1, 2, true, false);
        let text = stream(&mut r, &totals);
        assert!(!text.contains("[DONE]"));
        let events: Vec<Value> = sse_events(&text).into_iter().map(|(_, v)| v).collect();
        assert_eq!(events.len(), 4);
        assert_eq!(events[0]["content"], "<think> the</think>");
        assert_eq!(events[1]["content"], " model");
        assert_eq!(events[2]["tokens_predicted"], 3);
        assert_eq!(events[2]["stop"], false);
        let last = &events[3];
        assert_eq!(last["stop"], true);
        assert_eq!(last["content"], "");
        assert_eq!(last["tokens_predicted"], 3);
        assert_eq!(last["model"], "m1");
        assert!(last.get("prompt").is_none());
        let t = &last["timings"];
        assert_eq!(t["predicted_n"], 3);
        assert_eq!(t["predicted_ms"], 1000.0);
        assert_eq!(t["predicted_per_second"], 3.0);
        assert_eq!(t["prompt_ms"], 200.0);
        assert_eq!(t["prompt_n"], 4);
        assert_eq!(t["prompt_per_second"], 20.0);
    }

    #[test]
    fn timings_only_when_asked_and_null_on_zero_spans() {
        let (mut r, mut totals) = reply(ApiKind::LlamacppCompletion, 0, 1, false, false);
        stream(&mut r, &totals);
        let v: Value = serde_json::from_str(&whole(&r, &totals)).unwrap();
        assert!(v.get("timings").is_none());
        assert_eq!(v["content"], " the");
        totals.predicted_ms = 0.0;
        let t: Value = serde_json::from_str(&timings(&totals).finish()).unwrap();
        assert!(t["predicted_per_second"].is_null());
    }
}
