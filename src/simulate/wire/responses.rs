//! OpenAI Responses API (`/v1/responses`), following llama-server's event
//! sequence: `response.created`, `response.in_progress`,
//! `response.output_item.added`, `response.content_part.added`, one
//! `response.output_text.delta` per token, then `output_text.done`,
//! `content_part.done`, `output_item.done`, `response.completed`.
//!
//! Choices, written down:
//! - Every event carries the spec's `sequence_number`, `output_index` and
//!   `content_index` (llama-server omits them; OpenAI's SDKs expect them).
//! - Reasoning is a `reasoning` output item (index 0) streamed as
//!   `response.reasoning_text.delta`, closed with `reasoning_text.done` and
//!   `output_item.done` in the first answer token's frame, where the message
//!   item (index 1) opens.
//! - `usage` always comes with `response.completed` (the API always
//!   reports it), with `output_tokens_details.reasoning_tokens`.
//!   `timings` sit beside `response` in that event, as llama-server puts
//!   them, and at the top level of a non-streamed response (llama-server
//!   sends none there; we send them when asked so the switch means the same
//!   on every route).
//! - A mid-stream error is one `error` event (`code: server_error`).

use super::{sse, Reply, Token, Totals};
use crate::decode::event::OutputChannel;
use crate::simulate::json::Obj;

/// One event: `type` first, then `fill`'s fields, then `sequence_number`.
fn event(r: &mut Reply, kind: &str, fill: impl FnOnce(Obj) -> Obj) -> String {
    let seq = r.next_seq();
    let data = fill(Obj::new().field("type", kind))
        .field("sequence_number", seq)
        .finish();
    sse(Some(kind), &data)
}

fn message_index(r: &Reply) -> u64 {
    u64::from(r.reasoning > 0)
}

fn response_obj(r: &Reply, status: &str, output: Vec<Obj>, usage: Option<Obj>) -> Obj {
    Obj::new()
        .field("id", &r.id)
        .field("object", "response")
        .field("created_at", r.created)
        .field("status", status)
        .field("model", &r.model)
        .arr("output", output)
        .opt_obj("usage", usage)
}

fn text_part(text: &str) -> Obj {
    Obj::new()
        .field("type", "output_text")
        .arr("annotations", Vec::new())
        .arr("logprobs", Vec::new())
        .field("text", text)
}

/// The reasoning item; `text` is `None` while it is still open.
fn reasoning_item(r: &Reply, text: Option<&str>) -> Obj {
    let (status, content) = match text {
        Some(t) => (
            "completed",
            vec![Obj::new().field("type", "reasoning_text").field("text", t)],
        ),
        None => ("in_progress", Vec::new()),
    };
    Obj::new()
        .field("id", &r.reasoning_id)
        .field("type", "reasoning")
        .arr("summary", Vec::new())
        .arr("content", content)
        .field("status", status)
}

/// The message item; `text` is `None` while it is still open.
fn message_item(r: &Reply, text: Option<&str>) -> Obj {
    let (status, content) = match text {
        Some(t) => ("completed", vec![text_part(t)]),
        None => ("in_progress", Vec::new()),
    };
    Obj::new()
        .field("type", "message")
        .field("status", status)
        .field("id", &r.message_id)
        .arr("content", content)
        .field("role", "assistant")
}

/// Items of the finished response, in output order.
fn completed_items(r: &Reply) -> Vec<Obj> {
    let mut items = Vec::new();
    if r.reasoning > 0 {
        items.push(reasoning_item(r, Some(&r.reasoning_text)));
    }
    if r.answer > 0 || r.reasoning == 0 {
        items.push(message_item(r, Some(&r.answer_text)));
    }
    items
}

fn usage(totals: &Totals) -> Obj {
    Obj::new()
        .field("input_tokens", totals.input_tokens)
        .obj("input_tokens_details", Obj::new().field("cached_tokens", 0))
        .field("output_tokens", totals.output_tokens)
        .obj(
            "output_tokens_details",
            Obj::new().field("reasoning_tokens", totals.reasoning_tokens),
        )
        .field("total_tokens", totals.input_tokens + totals.output_tokens)
}

fn open_reasoning(r: &mut Reply) -> String {
    let item = reasoning_item(r, None);
    event(r, "response.output_item.added", |o| {
        o.field("output_index", 0).obj("item", item)
    })
}

fn open_message(r: &mut Reply) -> String {
    let index = message_index(r);
    let item = message_item(r, None);
    let item_id = r.message_id.clone();
    let mut out = event(r, "response.output_item.added", |o| {
        o.field("output_index", index).obj("item", item)
    });
    out.push_str(&event(r, "response.content_part.added", |o| {
        o.field("item_id", &item_id)
            .field("output_index", index)
            .field("content_index", 0)
            .obj("part", text_part(""))
    }));
    out
}

fn close_reasoning(r: &mut Reply) -> String {
    let text = r.reasoning_text.clone();
    let item_id = r.reasoning_id.clone();
    let item = reasoning_item(r, Some(&text));
    let mut out = event(r, "response.reasoning_text.done", |o| {
        o.field("item_id", &item_id)
            .field("output_index", 0)
            .field("content_index", 0)
            .field("text", &text)
    });
    out.push_str(&event(r, "response.output_item.done", |o| {
        o.field("output_index", 0).obj("item", item)
    }));
    out
}

fn close_message(r: &mut Reply) -> String {
    let text = r.answer_text.clone();
    let item_id = r.message_id.clone();
    let index = message_index(r);
    let item = message_item(r, Some(&text));
    let mut out = event(r, "response.output_text.done", |o| {
        o.field("item_id", &item_id)
            .field("output_index", index)
            .field("content_index", 0)
            .field("text", &text)
            .arr("logprobs", Vec::new())
    });
    out.push_str(&event(r, "response.content_part.done", |o| {
        o.field("item_id", &item_id)
            .field("output_index", index)
            .field("content_index", 0)
            .obj("part", text_part(&text))
    }));
    out.push_str(&event(r, "response.output_item.done", |o| {
        o.field("output_index", index).obj("item", item)
    }));
    out
}

pub(super) fn preamble(r: &mut Reply) -> String {
    let created = response_obj(r, "in_progress", Vec::new(), None);
    let in_progress = response_obj(r, "in_progress", Vec::new(), None);
    let mut out = event(r, "response.created", |o| o.obj("response", created));
    out.push_str(&event(r, "response.in_progress", |o| {
        o.obj("response", in_progress)
    }));
    if r.reasoning > 0 {
        out.push_str(&open_reasoning(r));
    } else {
        out.push_str(&open_message(r));
    }
    out
}

pub(super) fn token(r: &mut Reply, t: &Token) -> String {
    let mut out = String::new();
    if r.starts_answer(t) {
        out.push_str(&close_reasoning(r));
        out.push_str(&open_message(r));
    }
    if t.channel == OutputChannel::Reasoning {
        let item_id = r.reasoning_id.clone();
        out.push_str(&event(r, "response.reasoning_text.delta", |o| {
            o.field("item_id", &item_id)
                .field("output_index", 0)
                .field("content_index", 0)
                .field("delta", t.text)
        }));
    } else {
        let item_id = r.message_id.clone();
        let index = message_index(r);
        out.push_str(&event(r, "response.output_text.delta", |o| {
            o.field("item_id", &item_id)
                .field("output_index", index)
                .field("content_index", 0)
                .field("delta", t.text)
                .arr("logprobs", Vec::new())
        }));
    }
    out
}

pub(super) fn finish(r: &mut Reply, totals: &Totals) -> String {
    let mut out = if r.answer > 0 || r.reasoning == 0 {
        close_message(r)
    } else {
        close_reasoning(r)
    };
    let response = response_obj(r, "completed", completed_items(r), Some(usage(totals)));
    let timings = r.timings.then(|| super::llamacpp::timings(totals));
    out.push_str(&event(r, "response.completed", |o| {
        o.obj("response", response).opt_obj("timings", timings)
    }));
    out
}

pub(super) fn error_event(r: &mut Reply, message: &str) -> String {
    event(r, "error", |o| {
        o.field("code", "server_error")
            .field("message", message)
            .field("param", None::<&str>)
    })
}

pub(super) fn whole(r: &Reply, totals: &Totals) -> String {
    response_obj(r, "completed", completed_items(r), Some(usage(totals)))
        .opt_obj(
            "timings",
            r.timings.then(|| super::llamacpp::timings(totals)),
        )
        .finish()
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::*;
    use crate::model::ApiKind;
    use serde_json::Value;

    fn kinds(events: &[(Option<String>, Value)]) -> Vec<String> {
        events
            .iter()
            .map(|(e, v)| {
                assert_eq!(e.as_deref(), v["type"].as_str(), "event name = type");
                e.clone().unwrap()
            })
            .collect()
    }

    #[test]
    fn plain_sequence_matches_llama_server() {
        let (mut r, totals) = reply(ApiKind::OpenaiResponses, 0, 2, false, false);
        let events = sse_events(&stream(&mut r, &totals));
        assert_eq!(
            kinds(&events),
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        for (i, (_, v)) in events.iter().enumerate() {
            assert_eq!(v["sequence_number"], i as u64);
        }
        assert_eq!(events[4].1["delta"], " the");
        assert_eq!(events[6].1["text"], " the model");
        let done = &events[9].1;
        assert_eq!(done["response"]["status"], "completed");
        assert_eq!(done["response"]["usage"]["output_tokens"], 2);
        assert_eq!(
            done["response"]["output"][0]["content"][0]["text"],
            " the model"
        );
        assert!(done.get("timings").is_none());
    }

    #[test]
    fn reasoning_item_comes_first() {
        let (mut r, totals) = reply(ApiKind::OpenaiResponses, 2, 1, true, false);
        let events = sse_events(&stream(&mut r, &totals));
        assert_eq!(
            kinds(&events),
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.reasoning_text.delta",
                "response.reasoning_text.delta",
                "response.reasoning_text.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        assert_eq!(events[2].1["item"]["type"], "reasoning");
        assert_eq!(events[5].1["text"], " the model");
        assert_eq!(events[9].1["output_index"], 1);
        let done = &events[13].1;
        assert_eq!(done["response"]["usage"]["output_tokens"], 3);
        assert_eq!(
            done["response"]["usage"]["output_tokens_details"]["reasoning_tokens"],
            2
        );
        assert_eq!(done["response"]["output"].as_array().unwrap().len(), 2);
        assert_eq!(done["timings"]["predicted_n"], 3);
    }

    #[test]
    fn reasoning_only_closes_the_reasoning_item() {
        let (mut r, totals) = reply(ApiKind::OpenaiResponses, 1, 0, false, false);
        let events = sse_events(&stream(&mut r, &totals));
        let k = kinds(&events);
        assert_eq!(
            k[k.len() - 3..],
            [
                "response.reasoning_text.done",
                "response.output_item.done",
                "response.completed"
            ]
        );
        let v: Value = serde_json::from_str(&whole(&r, &totals)).unwrap();
        assert_eq!(v["output"][0]["type"], "reasoning");
        assert_eq!(v["output"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn error_event_shape() {
        let (mut r, _) = reply(ApiKind::OpenaiResponses, 0, 2, false, false);
        let events = sse_events(&error_event(&mut r, "boom"));
        assert_eq!(events[0].0.as_deref(), Some("error"));
        assert_eq!(events[0].1["code"], "server_error");
        assert_eq!(events[0].1["message"], "boom");
    }
}
