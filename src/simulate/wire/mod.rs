//! The bytes each API puts on the wire, rendered from a reply's state.
//!
//! A [`Reply`] is one response being written. The server asks it for the
//! events that open the stream, one event per token, the closing events, an
//! in-protocol error, or the whole non-streamed body; it dispatches to the
//! API family's module. Rendering is pure: the wall-clock time shown in
//! payloads is a field the caller sets ([`Reply::wall`]) and the measured
//! durations come in as [`Totals`].
//!
//! Shapes follow the real llama-server captures (field order included) and
//! `docs/protocols.md` where llama-server has no such API
//! (Ollama native, TGI). Each module documents its own choices.

mod anthropic;
mod llamacpp;
mod ollama;
mod openai;
mod responses;
mod tgi;

pub(crate) use ollama::rfc3339;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use super::ids::IdSource;
use super::plan::{BodyFlags, Plan, Timeline};
use super::words;
use crate::decode::event::OutputChannel;
use crate::model::ApiKind;

/// How a streamed body is framed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Framing {
    /// Server-Sent Events (`text/event-stream`).
    Sse,
    /// One JSON object per line (`application/x-ndjson`, Ollama native).
    Ndjson,
}

/// Content type of every non-streamed JSON reply, as llama-server and
/// Ollama send it.
pub(crate) const JSON: &str = "application/json; charset=utf-8";

/// One output token about to be written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Token {
    /// 0-based over all output tokens (reasoning first).
    pub index: u64,
    pub channel: OutputChannel,
    /// The word (one o200k token, leading space included).
    pub text: &'static str,
}

/// The measured facts of a finished generation, as the server reports them.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Totals {
    /// Output tokens as the server's tokenizer counts them (factor applied).
    pub output_tokens: u64,
    /// The reasoning part of `output_tokens` (factor applied).
    pub reasoning_tokens: u64,
    /// Prompt tokens (the stand-in count, see `BodyFlags::prompt_tokens`).
    pub input_tokens: u64,
    /// Prompt start (slot held, model loaded) to the first token, ms: the
    /// prefill plus the base ttft, never the queue or load wait (llama.cpp
    /// `prompt_ms`, Ollama `prompt_eval_duration`). Without a load or slot
    /// wait the start is the arrival.
    pub prompt_ms: f64,
    /// First to last token, ms (llama.cpp `predicted_ms`).
    pub predicted_ms: f64,
    /// Arrival to the end of generation, ms (Ollama `total_duration`:
    /// load and queue included).
    pub total_ms: f64,
    /// The wait for the model to load, ms (Ollama `load_duration`).
    pub load_ms: f64,
    /// Speculative decoding `(draft_n, draft_n_accepted)`, if any.
    pub drafts: Option<(u64, u64)>,
}

impl Totals {
    /// From the plan and the measured instants: `first`/`last` are when the
    /// first and last tokens were written (both `end` when there were
    /// none), `end` when generation finished.
    pub(crate) fn measure(
        plan: &Plan,
        input_tokens: u64,
        timeline: &Timeline,
        first: Instant,
        last: Instant,
        end: Instant,
    ) -> Totals {
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        let output_tokens = plan.exact(plan.total());
        Totals {
            output_tokens,
            reasoning_tokens: plan.exact(plan.reasoning),
            input_tokens,
            prompt_ms: ms(first.saturating_duration_since(timeline.start)),
            predicted_ms: ms(last.saturating_duration_since(first)),
            total_ms: ms(end.saturating_duration_since(timeline.arrival)),
            load_ms: ms(timeline.load),
            drafts: plan.drafts(output_tokens),
        }
    }
}

/// One response being written.
#[derive(Clone, Debug)]
pub(crate) struct Reply {
    pub api: ApiKind,
    /// The requested model, echoed.
    pub model: String,
    /// The response id (`chatcmpl-…`, `resp_…`, `msg_…`).
    pub id: String,
    /// Responses API: the message item's id.
    pub message_id: String,
    /// Responses API: the reasoning item's id.
    pub reasoning_id: String,
    /// Unix seconds of the request (`created`, `created_at`).
    pub created: u64,
    /// The wall-clock time of the frame being rendered (Ollama
    /// `created_at`). The server sets it before each render.
    pub wall: SystemTime,
    /// OpenAI chat/completions: send the `choices: []` usage chunk
    /// (`stream_options.include_usage` or the `usage` switch).
    pub usage_chunk: bool,
    /// Send the server's own timings.
    pub timings: bool,
    /// Scheduled reasoning and answer tokens.
    pub reasoning: u64,
    pub answer: u64,
    /// Prompt tokens (stand-in count).
    pub input_tokens: u64,
    /// `x-sim-usage-factor`, for running counts (llama.cpp
    /// `tokens_predicted`).
    pub usage_factor: f64,
    /// The reasoning and answer words written so far (generated text, never
    /// request text), for the APIs that repeat the full text at the end.
    pub reasoning_text: String,
    pub answer_text: String,
    /// Responses API `sequence_number` of the next event.
    seq: u64,
}

impl Reply {
    pub(crate) fn new(
        api: ApiKind,
        flags: &BodyFlags,
        plan: &Plan,
        ids: &IdSource,
        wall: SystemTime,
    ) -> Reply {
        let id = match api {
            ApiKind::OpenaiResponses => ids.next("resp_", 32),
            ApiKind::AnthropicMessages => ids.next("msg_", 24),
            _ => ids.next("chatcmpl-", 32),
        };
        Reply {
            api,
            model: flags.model.clone(),
            id,
            message_id: ids.next("msg_", 32),
            reasoning_id: ids.next("rs_", 32),
            created: wall
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            wall,
            usage_chunk: plan.usage || flags.include_usage,
            timings: plan.server_timings,
            reasoning: plan.reasoning,
            answer: plan.answer,
            input_tokens: flags.prompt_tokens,
            usage_factor: plan.usage_factor,
            reasoning_text: String::new(),
            answer_text: String::new(),
            seq: 0,
        }
    }

    /// How this API frames a stream.
    pub(crate) fn framing(&self) -> Framing {
        match self.api {
            ApiKind::OllamaChat | ApiKind::OllamaGenerate => Framing::Ndjson,
            _ => Framing::Sse,
        }
    }

    /// The content type of a streamed (`true`) or whole reply.
    pub(crate) fn content_type(&self, streamed: bool) -> &'static str {
        match (streamed, self.framing()) {
            (false, _) => JSON,
            (true, Framing::Sse) => "text/event-stream",
            (true, Framing::Ndjson) => "application/x-ndjson",
        }
    }

    /// Events that open the stream; they go out in the first token's frame
    /// (llama.cpp sends its role chunk / `message_start` / `response.created`
    /// together with the first token, not before).
    pub(crate) fn preamble(&mut self) -> String {
        match self.api {
            ApiKind::OpenaiChat | ApiKind::OpenaiCompletions => openai::preamble(self),
            ApiKind::OpenaiResponses => responses::preamble(self),
            ApiKind::AnthropicMessages => anthropic::preamble(self),
            _ => String::new(),
        }
    }

    /// Renders output token `index` (and any block/item transition it
    /// causes), recording its word.
    pub(crate) fn token(&mut self, index: u64) -> String {
        let t = self.record(index);
        match self.api {
            ApiKind::OpenaiChat | ApiKind::OpenaiCompletions => openai::token(self, &t),
            ApiKind::OpenaiResponses => responses::token(self, &t),
            ApiKind::AnthropicMessages => anthropic::token(self, &t),
            ApiKind::OllamaChat | ApiKind::OllamaGenerate => ollama::token(self, &t),
            ApiKind::LlamacppCompletion => llamacpp::token(self, &t),
            ApiKind::TgiGenerate | ApiKind::Unknown => tgi::token(self, &t),
        }
    }

    /// Records output token `index` without rendering it (a non-streamed
    /// reply only needs the full texts).
    pub(crate) fn record(&mut self, index: u64) -> Token {
        let channel = if index < self.reasoning {
            OutputChannel::Reasoning
        } else {
            OutputChannel::Text
        };
        let t = Token {
            index,
            channel,
            text: words::word(index),
        };
        match channel {
            OutputChannel::Reasoning => self.reasoning_text.push_str(t.text),
            _ => self.answer_text.push_str(t.text),
        }
        t
    }

    /// The closing events after the last token (usage, timings, terminal
    /// marker).
    pub(crate) fn finish(&mut self, totals: &Totals) -> String {
        match self.api {
            ApiKind::OpenaiChat | ApiKind::OpenaiCompletions => openai::finish(self, totals),
            ApiKind::OpenaiResponses => responses::finish(self, totals),
            ApiKind::AnthropicMessages => anthropic::finish(self, totals),
            ApiKind::OllamaChat | ApiKind::OllamaGenerate => ollama::finish(self, totals),
            ApiKind::LlamacppCompletion => llamacpp::finish(self, totals),
            ApiKind::TgiGenerate | ApiKind::Unknown => tgi::finish(self, totals),
        }
    }

    /// The in-protocol mid-stream error (`x-sim-error-after`); the body
    /// ends cleanly after it, with no terminal marker.
    pub(crate) fn error_event(&mut self, message: &str) -> String {
        match self.api {
            ApiKind::OpenaiChat | ApiKind::OpenaiCompletions | ApiKind::LlamacppCompletion => {
                sse(None, &openai::error_object(500, message))
            }
            ApiKind::OpenaiResponses => responses::error_event(self, message),
            ApiKind::AnthropicMessages => {
                sse(Some("error"), &anthropic::error_object(500, message))
            }
            ApiKind::OllamaChat | ApiKind::OllamaGenerate => ndjson(&ollama::error_object(message)),
            ApiKind::TgiGenerate | ApiKind::Unknown => tgi::error_event(message),
        }
    }

    /// The whole non-streamed body (every token already rendered via
    /// [`Reply::token`], so the texts are complete).
    pub(crate) fn whole(&self, totals: &Totals) -> String {
        match self.api {
            ApiKind::OpenaiChat | ApiKind::OpenaiCompletions => openai::whole(self, totals),
            ApiKind::OpenaiResponses => responses::whole(self, totals),
            ApiKind::AnthropicMessages => anthropic::whole(self, totals),
            ApiKind::OllamaChat | ApiKind::OllamaGenerate => ollama::whole(self, totals),
            ApiKind::LlamacppCompletion => llamacpp::whole(self, totals),
            ApiKind::TgiGenerate | ApiKind::Unknown => tgi::whole(self, totals),
        }
    }

    /// Extra response headers of a whole reply (TGI's count and timing
    /// headers on `/generate`).
    pub(crate) fn whole_headers(&self, totals: &Totals) -> Vec<(&'static str, String)> {
        match self.api {
            ApiKind::TgiGenerate => tgi::headers(self, totals),
            _ => Vec::new(),
        }
    }

    /// The next Responses `sequence_number`.
    fn next_seq(&mut self) -> u64 {
        let s = self.seq;
        self.seq += 1;
        s
    }

    /// Whether `t` is the first answer token after some reasoning (the
    /// moment split-field APIs close the reasoning block and open the text).
    fn starts_answer(&self, t: &Token) -> bool {
        self.reasoning > 0 && t.index == self.reasoning
    }

    /// A token's text for APIs with no reasoning field: reasoning is inline,
    /// `<think>` glued to the first reasoning word and `</think>` to the
    /// last, so stripping the tags leaves exactly the words.
    fn inline_text(&self, t: &Token) -> String {
        let mut s = String::new();
        if t.channel == OutputChannel::Reasoning && t.index == 0 {
            s.push_str("<think>");
        }
        s.push_str(t.text);
        if t.channel == OutputChannel::Reasoning && t.index + 1 == self.reasoning {
            s.push_str("</think>");
        }
        s
    }

    /// The whole text with inline reasoning, as [`Reply::inline_text`] builds it.
    fn inline_full(&self) -> String {
        if self.reasoning_text.is_empty() {
            return self.answer_text.clone();
        }
        format!("<think>{}</think>{}", self.reasoning_text, self.answer_text)
    }
}

/// The JSON error body of an `x-sim-status` reply, in the API's own shape.
pub(crate) fn error_body(api: ApiKind, status: u16, message: &str) -> String {
    match api {
        ApiKind::AnthropicMessages => anthropic::error_object(status, message),
        ApiKind::OllamaChat | ApiKind::OllamaGenerate => ollama::error_object(message),
        ApiKind::TgiGenerate => tgi::error_object(status, message),
        _ => openai::error_object(status, message),
    }
}

/// The refusal of a prompt too long for the context, as each server family
/// words it: `(status, body)`.
///
/// - llama-server (every route but Ollama's and TGI's): 400 with
///   `exceed_context_size_error` and the two numbers, exactly as the
///   capture `error_context_overflow_stream` (server-task.cpp
///   `server_task_result_error::to_json`, message from server-context.cpp);
/// - Ollama: 400 `{"error":"the prompt is longer than the context length
///   …"}` (llm/llama_server.go, without context shift);
/// - TGI: 422 validation error naming the limit.
pub(crate) fn context_error(api: ApiKind, n_prompt: u64, n_ctx: u64) -> (u16, String) {
    match api {
        ApiKind::OllamaChat | ApiKind::OllamaGenerate => (
            400,
            ollama::error_object(
                "the prompt is longer than the context length currently available to the model; \
                 shorten the prompt, adjust the context length in settings, or use a model with \
                 a longer context length",
            ),
        ),
        ApiKind::TgiGenerate => (
            422,
            tgi::error_object(
                422,
                &format!(
                    "Input validation error: `inputs` must have less than {n_ctx} tokens. \
                     Given: {n_prompt}"
                ),
            ),
        ),
        _ => {
            let message = format!(
                "request ({n_prompt} tokens) exceeds the available context size \
                 ({n_ctx} tokens), try increasing it"
            );
            let error = super::json::Obj::new()
                .field("code", 400)
                .field("message", message)
                .field("type", "exceed_context_size_error")
                .field("n_prompt_tokens", n_prompt)
                .field("n_ctx", n_ctx);
            (400, super::json::Obj::new().obj("error", error).finish())
        }
    }
}

/// The SSE keep-alive comment (`x-sim-keepalive-ms`).
pub(crate) const KEEPALIVE: &str = ": ping\n\n";

/// One SSE event: optional `event:` line, one `data:` line, blank line.
fn sse(event: Option<&str>, data: &str) -> String {
    match event {
        Some(e) => format!("event: {e}\ndata: {data}\n\n"),
        None => format!("data: {data}\n\n"),
    }
}

/// One NDJSON line.
fn ndjson(line: &str) -> String {
    format!("{line}\n")
}

#[cfg(test)]
pub(crate) mod test_support {
    //! Builds replies for the per-API render tests.
    use super::*;
    use crate::simulate::SimConfig;

    /// A reply for `api` with `reasoning` + `answer` tokens, every token
    /// rendered, and fixed totals.
    pub(crate) fn reply(
        api: ApiKind,
        reasoning: u64,
        answer: u64,
        timings: bool,
        usage: bool,
    ) -> (Reply, Totals) {
        let config = SimConfig {
            tokens: answer,
            reasoning_tokens: reasoning,
            server_timings: timings,
            usage,
            ..SimConfig::default()
        };
        let plan = Plan::new(&config, &http::HeaderMap::new()).unwrap();
        let flags = BodyFlags::parse(br#"{"model":"m1"}"#, false).unwrap();
        let wall = UNIX_EPOCH + Duration::from_millis(1_700_000_000_250);
        let reply = Reply::new(api, &flags, &plan, &IdSource::new(), wall);
        let t0 = Instant::now();
        let totals = Totals::measure(
            &plan,
            reply.input_tokens,
            &Timeline::immediate(t0),
            t0 + Duration::from_millis(200),
            t0 + Duration::from_millis(1200),
            t0 + Duration::from_millis(1200),
        );
        (reply, totals)
    }

    /// Renders a full stream: preamble + tokens + finish.
    pub(crate) fn stream(r: &mut Reply, totals: &Totals) -> String {
        let mut out = r.preamble();
        for i in 0..r.reasoning + r.answer {
            out.push_str(&r.token(i));
        }
        out.push_str(&r.finish(totals));
        out
    }

    /// The JSON payloads of an SSE text, with their `event:` names.
    pub(crate) fn sse_events(text: &str) -> Vec<(Option<String>, serde_json::Value)> {
        let mut out = Vec::new();
        for block in text.split("\n\n").filter(|b| !b.is_empty()) {
            let mut event = None;
            let mut data = None;
            for line in block.lines() {
                if let Some(e) = line.strip_prefix("event: ") {
                    event = Some(e.to_owned());
                } else if let Some(d) = line.strip_prefix("data:") {
                    data = Some(d.trim_start().to_owned());
                }
            }
            let data = data.expect("every event has data");
            if data == "[DONE]" {
                out.push((event, serde_json::Value::String("[DONE]".into())));
            } else {
                out.push((event, serde_json::from_str(&data).expect(&data)));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::*;
    use super::*;

    #[test]
    fn totals_apply_the_factor_and_measure() {
        let config = SimConfig {
            tokens: 20,
            reasoning_tokens: 4,
            usage_factor: 1.5,
            ..crate::simulate::SimConfig::default()
        };
        let plan = Plan::new(&config, &http::HeaderMap::new()).unwrap();
        let t0 = Instant::now();
        let t = Totals::measure(
            &plan,
            7,
            &Timeline::immediate(t0),
            t0 + Duration::from_millis(50),
            t0 + Duration::from_millis(165),
            t0 + Duration::from_millis(170),
        );
        assert_eq!(
            (t.output_tokens, t.reasoning_tokens, t.input_tokens),
            (36, 6, 7)
        );
        assert!((t.prompt_ms - 50.0).abs() < 1e-9);
        assert!((t.predicted_ms - 115.0).abs() < 1e-9);
        assert!((t.total_ms - 170.0).abs() < 1e-9);
    }

    use crate::simulate::SimConfig;

    #[test]
    fn inline_reasoning_is_tagged_at_both_ends() {
        let (mut r, _) = reply(ApiKind::OpenaiCompletions, 2, 1, false, false);
        let texts: Vec<String> = (0..3)
            .map(|i| {
                let t = Token {
                    index: i,
                    channel: if i < 2 {
                        OutputChannel::Reasoning
                    } else {
                        OutputChannel::Text
                    },
                    text: words::word(i),
                };
                r.token(i);
                r.inline_text(&t)
            })
            .collect();
        assert_eq!(texts, ["<think> the", " model</think>", " of"]);
        assert_eq!(r.inline_full(), "<think> the model</think> of");
    }

    #[test]
    fn content_types() {
        let (r, _) = reply(ApiKind::OllamaChat, 0, 1, false, false);
        assert_eq!(r.content_type(true), "application/x-ndjson");
        assert_eq!(r.content_type(false), JSON);
        let (r, _) = reply(ApiKind::TgiGenerate, 0, 1, false, false);
        assert_eq!(r.content_type(true), "text/event-stream");
    }

    #[test]
    fn a_llama_server_context_refusal_matches_the_real_capture() {
        let (status, body) = context_error(ApiKind::OpenaiChat, 5031, 2048);
        assert_eq!(status, 400);
        assert_eq!(
            body,
            r#"{"error":{"code":400,"message":"request (5031 tokens) exceeds the available context size (2048 tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":5031,"n_ctx":2048}}"#
        );
        let (status, body) = context_error(ApiKind::OllamaChat, 10, 5);
        assert_eq!(status, 400);
        assert!(
            body.starts_with(r#"{"error":"the prompt is longer"#),
            "{body}"
        );
        assert_eq!(context_error(ApiKind::TgiGenerate, 10, 5).0, 422);
    }

    #[test]
    fn error_bodies_are_json_in_each_shape() {
        for api in ApiKind::METERED {
            let v: serde_json::Value = serde_json::from_str(&error_body(api, 503, "boom")).unwrap();
            assert!(v.get("error").is_some(), "{api}: {v}");
        }
    }
}
