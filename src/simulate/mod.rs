//! `simulate`: a scripted local model server that speaks every protocol
//! speedtap meters, with a precise, known token schedule.
//!
//! It exists for demos (`speedtap simulate`), for the proxy's integration
//! tests, and for benchmarks and accuracy checks: because the schedule is
//! known, a meter's TTFT, token count and rate can be checked against the
//! truth.
//!
//! # What it does
//! - Routes (POST): `/v1/chat/completions`, `/v1/completions`,
//!   `/v1/responses`, `/v1/messages`, `/api/chat`, `/api/generate`,
//!   `/completion`, `/generate_stream`, `/generate`. Discovery (GET):
//!   `/health`, `/v1/models`, `/api/tags`, `/api/version`. Telemetry (GET):
//!   Ollama's `/api/ps`, llama-server's `/slots`, `/props`, `/metrics`.
//!   Anything else is a JSON 404.
//! - Server behaviour, all off by default (see [`SimConfig`]): model
//!   residency (a load time, then the model stays until its keep-alive of
//!   idleness runs out), slots with a FIFO queue, a prefill rate, a context
//!   size that refuses (llama-server) or cuts (Ollama) a longer prompt, and
//!   speculative decoding counts. TTFT = load wait + slot wait + prefill
//!   (`prompt tokens / rate`) + the base `ttft`; the telemetry endpoints
//!   show the same state at any instant (`state`, `telemetry`).
//! - Output is [`WORDS`] cycled, each one o200k token, so an o200k estimate of
//!   the streamed text equals the scheduled count exactly. Reasoning tokens
//!   come first, in each API's reasoning field (`reasoning_content`,
//!   `thinking`, `reasoning_text`, Anthropic `thinking_delta`), or inline as
//!   `<think>…</think>` for APIs without one (legacy completions, llama.cpp
//!   `/completion`, TGI): `<think>` is glued to the first reasoning word and
//!   `</think>` to the last, so stripping the tags leaves exactly the words.
//! - Token `i` (0-based over all output tokens) is written at
//!   `arrival + ttft + i / tokens_per_second`, against absolute deadlines, one
//!   SSE event / NDJSON line per token in its own body frame. The closing
//!   events follow the last token in the same frame, as llama.cpp writes them.
//! - The wire shapes imitate the real llama-server captures in
//!   `tests/fixtures/real/llama-server` (key order included); see the
//!   per-API modules under `wire` for each family's choices.
//! - Per-request overrides and faults come from `x-sim-*` request headers
//!   (see [`SimServer`]). Nothing of the request text is stored or logged:
//!   the body is read for its `stream`, `model` and
//!   `stream_options.include_usage` and `keep_alive` fields and its length
//!   (the prompt token count is `ceil(body bytes / 4)`, a stable stand-in,
//!   unless `x-sim-prompt-tokens` says) and then dropped.

mod body;
mod ids;
mod json;
mod plan;
mod server;
mod state;
mod telemetry;
mod wire;
mod words;

use std::net::SocketAddr;
use std::time::Duration;

pub use server::SimServer;

pub use words::WORDS;

/// The script every simulated request follows unless its `x-sim-*` headers
/// say otherwise.
#[derive(Clone, Debug, PartialEq)]
pub struct SimConfig {
    /// Request arrival to the first output token (default 200 ms).
    pub ttft: Duration,
    /// Output rate (default 50 tokens per second): token `i` is due at
    /// `ttft + i / tokens_per_second`. Must be finite and > 0.
    pub tokens_per_second: f64,
    /// Answer tokens (default 64).
    pub tokens: u64,
    /// Reasoning tokens streamed before the answer (default 0).
    pub reasoning_tokens: u64,
    /// Always send a usage receipt (default false). When false each API
    /// behaves naturally: OpenAI chat/completions streams carry usage only
    /// with `stream_options.include_usage`; Anthropic, Responses, Ollama,
    /// llama.cpp native and TGI always carry their counts; non-streamed
    /// responses always carry usage.
    pub usage: bool,
    /// Send the server's own timings (default false): llama.cpp `timings`
    /// (chat, completions, responses, `/completion`), Ollama durations
    /// (`eval_duration` = measured ns from first to last token) and TGI's
    /// timing headers on `/generate`.
    pub server_timings: bool,
    /// Reported exact counts are `round(streamed tokens * usage_factor)`
    /// (default 1.0): a server tokenizer that differs from o200k by a known
    /// factor. Must be finite and >= 0.
    pub usage_factor: f64,
    /// Generation slots (llama-server `-np`): at most this many calls are
    /// admitted at once; the rest wait in FIFO order and their wait is part
    /// of their TTFT. `None` (default) is unlimited: every call gets a slot
    /// at once, `/slots` grows to the largest concurrency seen and always
    /// lists one idle slot more (there is room for the next call).
    pub slots: Option<u32>,
    /// Context size per slot in tokens (llama-server `-c`, Ollama
    /// `num_ctx`), default 131072, so no ordinary prompt reaches it. A
    /// prompt at or over it is refused or cut, see [`Overflow`].
    pub n_ctx: u64,
    /// What a prompt too long for `n_ctx` does (default [`Overflow::Auto`]).
    pub overflow: Overflow,
    /// Time to load a model that is not resident (default 0: models load
    /// instantly). A call for an unloaded model waits this long before its
    /// prefill; Ollama replies report it as `load_duration`.
    pub load_time: Duration,
    /// How long a model stays loaded after its last call ends (Ollama
    /// `keep_alive`, default 5 minutes); `None` keeps it forever. A request
    /// body's `keep_alive` on the Ollama routes overrides it, as in Ollama.
    pub keep_alive: Option<Duration>,
    /// Prompt processing rate in tokens per second; the prefill of a call
    /// takes `prompt tokens / rate`. `None` (default) is an instant prefill.
    pub prefill_tokens_per_second: Option<f64>,
    /// Speculative decoding: the share of draft tokens the target accepts,
    /// 0..=1. `None` (default) is no draft model: llama.cpp timings carry
    /// no `draft_n` / `draft_n_accepted`.
    pub draft_acceptance: Option<f64>,
    /// A loaded model's size in bytes as Ollama's `/api/ps` reports it
    /// (default 4.9 GB, a 7B Q4 with its context).
    pub model_size: u64,
    /// The share of `model_size` in GPU memory (`size_vram`), 0..=1: 1.0
    /// (default) is all on the GPU, 0.0 all on the CPU, between is a split.
    pub vram_fraction: f64,
    /// What `/api/ps` shows while a model loads (default
    /// [`PsWhileLoading::Hidden`]).
    pub ps_while_loading: PsWhileLoading,
    /// Answer llama-server's `/slots`, `/props` and `/metrics` (default
    /// true); false answers them 404, as Ollama does, so a server that runs
    /// one call at a time (`slots: Some(1)`) publishes no queue of its own.
    pub publishes_slots: bool,
    /// Answer Ollama's `/api/ps` (default true); false answers it 404, as
    /// llama-server does, so the simulator is taken for a llama-server
    /// alone (whose telemetry looks are spaced to leave room for pings).
    pub publishes_ps: bool,
    /// What `/api/version` answers at start (default
    /// `0.0.0-speedtap-sim`); `SimServer::set_version` plays an upgrade.
    pub version: String,
    /// SSE `: ping` comments this often from the prompt's start until the
    /// first token (llama-server's `--sse-ping-interval`), on the SSE APIs;
    /// `None` (default) sends none. `x-sim-keepalive-ms` overrides it.
    pub ping_interval: Option<Duration>,
    /// A stall mid-stream: after this many output tokens the stream goes
    /// silent for [`SimConfig::stall`] before the next one (default `None`:
    /// no stall). Every later token comes that much later.
    pub stall_after_tokens: Option<u64>,
    /// How long the stall of [`SimConfig::stall_after_tokens`] lasts
    /// (default 0).
    pub stall: Duration,
}

/// What Ollama's `/api/ps` shows while a model loads. Ollama has done
/// each of these (server/sched.go, server/routes.go `PsHandler`), so
/// speedtap's loading rule is tested against all of them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PsWhileLoading {
    /// Not listed until loaded.
    #[default]
    Hidden,
    /// Listed from the start of the load (Ollama until mid 2026: the
    /// runner joins the loaded map before it has loaded, with an estimated
    /// expiry).
    Listed,
    /// The request is answered only once no model is loading (Ollama since
    /// mid 2026: `loadedModels` takes each runner's lock, which the load
    /// holds until the runner is up).
    Blocks,
}

impl std::str::FromStr for PsWhileLoading {
    type Err = String;

    fn from_str(s: &str) -> Result<PsWhileLoading, String> {
        match s {
            "hidden" => Ok(PsWhileLoading::Hidden),
            "listed" => Ok(PsWhileLoading::Listed),
            "blocks" => Ok(PsWhileLoading::Blocks),
            other => Err(format!(
                "ps-while-loading must be hidden, listed or blocks, got {other:?}"
            )),
        }
    }
}

/// What the simulated server does with a prompt too long for its context.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Overflow {
    /// Each API family as its usual server does: Ollama's native routes
    /// (`/api/chat`, `/api/generate`) cut the prompt, every other route
    /// refuses like llama-server.
    Auto,
    /// Refuse: llama-server's 400 `exceed_context_size_error` (when prompt
    /// tokens >= `n_ctx`), Ollama's 400 `{"error":"the prompt is longer
    /// than the context length…"}`, TGI's 422 validation error.
    Refuse,
    /// Cut silently to `n_ctx` tokens (when prompt tokens > `n_ctx`), as
    /// Ollama's runner does; the reported prompt count is the cut count.
    Truncate,
}

impl std::str::FromStr for Overflow {
    type Err = String;

    fn from_str(s: &str) -> Result<Overflow, String> {
        match s {
            "auto" => Ok(Overflow::Auto),
            "refuse" => Ok(Overflow::Refuse),
            "truncate" => Ok(Overflow::Truncate),
            other => Err(format!(
                "overflow must be auto, refuse or truncate, got {other:?}"
            )),
        }
    }
}

impl Default for SimConfig {
    fn default() -> SimConfig {
        SimConfig {
            ttft: Duration::from_millis(200),
            tokens_per_second: 50.0,
            tokens: 64,
            reasoning_tokens: 0,
            usage: false,
            server_timings: false,
            usage_factor: 1.0,
            slots: None,
            n_ctx: 131_072,
            overflow: Overflow::Auto,
            load_time: Duration::ZERO,
            keep_alive: Some(Duration::from_secs(300)),
            prefill_tokens_per_second: None,
            draft_acceptance: None,
            model_size: 4_920_000_000,
            vram_fraction: 1.0,
            ps_while_loading: PsWhileLoading::Hidden,
            publishes_slots: true,
            publishes_ps: true,
            version: "0.0.0-speedtap-sim".to_owned(),
            ping_interval: None,
            stall_after_tokens: None,
            stall: Duration::ZERO,
        }
    }
}

/// Runs until `shutdown` resolves (the CLI's `speedtap simulate --listen
/// ADDR ...` passes its SIGINT/SIGTERM future). Prints one line saying
/// where it listens and which paths it serves.
pub async fn run_forever(
    addr: &str,
    config: SimConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    let server = SimServer::start(addr, config).await?;
    println!("{}", banner(server.local_addr()));
    shutdown.await;
    server.shutdown().await;
    Ok(())
}

/// The one-line startup message of [`run_forever`].
fn banner(addr: SocketAddr) -> String {
    let posts: Vec<&str> = server::POST_ROUTES.iter().map(|r| r.path).collect();
    format!(
        "speedtap simulate listening on http://{addr} (POST {}; GET {})",
        posts.join(", "),
        server::GET_PATHS.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_documented_ones() {
        let c = SimConfig::default();
        assert_eq!(c.ttft, Duration::from_millis(200));
        assert_eq!(c.tokens_per_second, 50.0);
        assert_eq!(c.tokens, 64);
        assert_eq!(c.reasoning_tokens, 0);
        assert!(!c.usage && !c.server_timings);
        assert_eq!(c.usage_factor, 1.0);
    }

    #[test]
    fn banner_names_address_and_every_path() {
        let line = banner("127.0.0.1:9".parse().unwrap());
        assert!(line.contains("http://127.0.0.1:9"), "{line}");
        for p in [
            "/v1/chat/completions",
            "/v1/completions",
            "/v1/responses",
            "/v1/messages",
            "/api/chat",
            "/api/generate",
            "/completion",
            "/generate_stream",
            "/generate",
            "/health",
            "/v1/models",
            "/api/tags",
            "/api/version",
            "/api/ps",
            "/slots",
            "/props",
            "/metrics",
        ] {
            assert!(line.contains(p), "{p} missing from {line}");
        }
        assert!(!line.contains('\n'));
    }
}
