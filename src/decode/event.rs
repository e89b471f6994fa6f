//! The typed events every protocol decoder produces.
//!
//! Decoders turn wire bytes into these; the metering glue turns these into
//! meter calls. Text is carried only so it can be tokenized: it is never
//! stored, logged or published.

/// Which of the three output channels a piece of text belongs to. The
/// channel decides the phase (`responding`, `reasoning`, `calling_tool`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OutputChannel {
    /// Visible answer text.
    Text,
    /// Reasoning / thinking text (split fields or inline `<think>`).
    Reasoning,
    /// Tool-call arguments (and names), streamed or whole.
    ToolArguments,
}

/// A usage receipt as the API reports it. Absent fields were not reported.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Output tokens, reasoning and tool calls included
    /// (`completion_tokens`, `output_tokens`, `eval_count`, ...).
    pub output_tokens: Option<u64>,
    /// Prompt tokens, cached ones included where the API says so.
    pub input_tokens: Option<u64>,
    /// Reasoning tokens, when the API breaks them out (already part of
    /// `output_tokens`).
    pub reasoning_tokens: Option<u64>,
    /// Prompt tokens served from cache, when reported.
    pub cached_input_tokens: Option<u64>,
}

/// The inference server's own timings (llama.cpp `timings`, Ollama
/// durations converted to milliseconds). Implausible values (zero or
/// nanosecond durations, as KoboldCpp's Ollama emulation sends) are dropped
/// by the decoder, so a present duration is a real one.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ServerTimings {
    /// Tokens generated so far or in all (`predicted_n`, `eval_count`).
    pub generated_tokens: Option<u64>,
    /// Generation time in ms, from the first sampled token
    /// (`predicted_ms`, `eval_duration / 1e6`).
    pub generation_ms: Option<f64>,
    /// Generation speed in tokens/s as the server gives it: the figure it
    /// states itself (llama.cpp `predicted_per_second`, which is
    /// (`predicted_n` − 1) ÷ `predicted_ms` because its clock starts at the
    /// first token), or, for a server that reports only a count and a
    /// duration, the formula its own tools print (Ollama's `--verbose`
    /// "eval rate": `eval_count` ÷ `eval_duration`). Each decoder applies
    /// its server's rule; a rate labelled `server` is always this number.
    /// Absent when the duration failed the plausibility guard.
    pub generation_rate: Option<f64>,
    /// Prompt tokens evaluated this request (`prompt_n`, `prompt_eval_count`).
    pub prompt_tokens: Option<u64>,
    /// Prompt processing time in ms (`prompt_ms`, `prompt_eval_duration`).
    pub prompt_ms: Option<f64>,
    /// Model load time in ms (Ollama `load_duration`).
    pub load_ms: Option<f64>,
    /// Prompt tokens reused from cache (`cache_n`, `tokens_cached`).
    pub cached_tokens: Option<u64>,
    /// Speculative decoding: tokens the draft model proposed (llama.cpp
    /// `draft_n`).
    pub draft_tokens: Option<u64>,
    /// Of those, the tokens the target accepted (`draft_n_accepted`).
    pub draft_accepted: Option<u64>,
}

/// llama.cpp's in-band prefill progress: `prompt_progress` on the chunks
/// before the first token, sent when the request asked for it
/// (`"return_progress": true`). The server's own counts, so they win over
/// any poll or estimate while the call waits.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PromptProgress {
    /// The whole prompt, in tokens (cached ones included).
    pub total: u64,
    /// Of those, tokens reused from the prompt cache.
    pub cache: u64,
    /// Tokens processed so far (cached ones included).
    pub processed: u64,
    /// Server time spent on the prefill so far, in ms.
    pub time_ms: f64,
}

impl ServerTimings {
    /// Takes a later timings report over this one, field by field: a
    /// per-chunk running `timings` object is superseded by the final one,
    /// but a field only an earlier report carried (Ollama's
    /// `load_duration`) is kept. The one merge rule for every consumer.
    pub fn merge_from(&mut self, later: &ServerTimings) {
        self.generated_tokens = later.generated_tokens.or(self.generated_tokens);
        self.generation_ms = later.generation_ms.or(self.generation_ms);
        self.generation_rate = later.generation_rate.or(self.generation_rate);
        self.prompt_tokens = later.prompt_tokens.or(self.prompt_tokens);
        self.prompt_ms = later.prompt_ms.or(self.prompt_ms);
        self.load_ms = later.load_ms.or(self.load_ms);
        self.cached_tokens = later.cached_tokens.or(self.cached_tokens);
        self.draft_tokens = later.draft_tokens.or(self.draft_tokens);
        self.draft_accepted = later.draft_accepted.or(self.draft_accepted);
    }
}

/// One thing a decoder learned from the stream.
#[derive(Clone, Debug, PartialEq)]
pub enum StreamEvent {
    /// Non-empty output text on one channel. Decoders never emit empty text.
    Output {
        channel: OutputChannel,
        text: String,
    },
    /// A usage receipt (may come more than once; later ones win field by field).
    Usage(Usage),
    /// Server timings (may come per chunk with llama.cpp `timings_per_token`;
    /// later ones win field by field).
    ServerTimings(ServerTimings),
    /// The server's own prefill progress (llama.cpp `prompt_progress`).
    PromptProgress(PromptProgress),
    /// The protocol's terminal marker was seen (`[DONE]`, `message_stop`,
    /// `response.completed`, `done: true`, `stop: true`, TGI `details`...).
    Done,
    /// The stream reported an error. `message` is the server's own error
    /// type/code, kept short (its prose when it names none: live
    /// diagnostics only). `text` is its identifier alone (`type`, `code`),
    /// when it has one: what a failed call may keep, since prose can quote
    /// the request or the answer ([`crate::model::Failure`]).
    Error {
        message: String,
        text: Option<String>,
    },
}
