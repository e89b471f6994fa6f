//! The command line, as clap parses it. The doc comments are the `--help`
//! text. The flags are documented in `docs/api.md`.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::host::args::RunArgs;
use crate::model::ExportFormat;

/// speedtap: live TTFT and tokens per second for every local LLM call.
///
/// Put `speedtap run` between your chat clients and your local model
/// servers (Ollama, llama.cpp, LM Studio, vLLM, ...): it forwards every byte
/// unchanged and measures each call's phase, time to first token and
/// tokens per second.
#[derive(Debug, Parser)]
#[command(name = "speedtap", version)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the interceptor headless: proxy routes, control API, live view.
    Run(RunArgs),
    /// Run a scripted local model server that speaks every supported API.
    Simulate(SimulateArgs),
    /// List the local model servers found and the route speedtap would make.
    Discover,
    /// Write the calls in the history database as CSV or JSON Lines,
    /// oldest first.
    Export(ExportArgs),
}

#[derive(Debug, Clone, Args)]
pub struct SimulateArgs {
    /// Where to listen, e.g. 127.0.0.1:11434.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8089")]
    pub listen: String,
    /// Time to first token in milliseconds.
    #[arg(long, value_name = "N", default_value_t = 200)]
    pub ttft_ms: u64,
    /// Output tokens per second.
    #[arg(long, value_name = "N", default_value_t = 50.0)]
    pub tps: f64,
    /// Output (answer) tokens per call.
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub tokens: u64,
    /// Reasoning tokens streamed before the answer.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub reasoning: u64,
    /// Always send a usage receipt.
    #[arg(long)]
    pub usage: bool,
    /// Send the server's own timings (llama.cpp `timings`, Ollama durations).
    #[arg(long)]
    pub server_timings: bool,
    /// Generation slots; calls beyond them queue (FIFO) [default: unlimited].
    #[arg(long, value_name = "N")]
    pub slots: Option<u32>,
    /// Context size in tokens; longer prompts are refused or cut (--overflow).
    #[arg(long, value_name = "N", default_value_t = 131_072)]
    pub n_ctx: u64,
    /// Too-long prompts: auto (Ollama routes cut, others refuse), refuse, truncate.
    #[arg(long, value_name = "MODE", default_value = "auto")]
    pub overflow: crate::simulate::Overflow,
    /// Time to load a model that is not resident, ms.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub load_ms: u64,
    /// Idle time before a model unloads, ms (negative: never).
    #[arg(
        long,
        value_name = "N",
        default_value_t = 300_000,
        allow_hyphen_values = true
    )]
    pub keep_alive_ms: i64,
    /// Prompt processing rate, tokens per second [default: instant].
    #[arg(long, value_name = "N")]
    pub prefill_tps: Option<f64>,
    /// What /api/ps shows while a model loads, as Ollama versions differ:
    /// hidden (listed once loaded), listed (from the load's start), blocks
    /// (answered once the load ends).
    #[arg(long, value_name = "MODE", default_value = "hidden")]
    pub ps_while_loading: crate::simulate::PsWhileLoading,
    /// SSE `: ping` comments every N ms until the first token, as
    /// llama-server's --sse-ping-interval [default: none].
    #[arg(long, value_name = "N")]
    pub ping_ms: Option<u64>,
    /// Stall mid-stream after N output tokens (with --stall-ms).
    #[arg(long, value_name = "N")]
    pub stall_after: Option<u64>,
    /// How long the stall after --stall-after lasts, ms.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub stall_ms: u64,
}

/// `speedtap export`. Every filter is optional; the given ones must all
/// match.
#[derive(Debug, Clone, Args)]
pub struct ExportArgs {
    /// `csv` (a header row, then one row per call) or `jsonl` (one JSON
    /// object per line, as the history API returns calls).
    #[arg(long, value_name = "FORMAT")]
    pub format: ExportFormat,
    /// Only calls started at or after T: unix milliseconds or an RFC 3339
    /// time such as 2026-11-30T10:42:07Z.
    #[arg(long, value_name = "T", value_parser = time_flag)]
    pub since: Option<u64>,
    /// Only calls started before T (same forms as --since).
    #[arg(long, value_name = "T", value_parser = time_flag)]
    pub until: Option<u64>,
    /// Only calls naming this model (`--model ""`: calls that named none).
    #[arg(long, value_name = "M")]
    pub model: Option<String>,
    /// Only calls of this route.
    #[arg(long, value_name = "R")]
    pub route: Option<String>,
    /// Only calls made by this client app (`openai-python`, `curl`...).
    #[arg(long, value_name = "C")]
    pub client: Option<String>,
    /// The history database [default: the config file's `db`, else
    /// speedtap.sqlite3 in the platform data dir]. Never created: a missing
    /// file is an error.
    #[arg(long, value_name = "FILE")]
    pub db: Option<PathBuf>,
    /// Config file whose `db` to export when --db is not given. Default: the
    /// platform config file, if it exists.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Write here instead of stdout (the file is replaced).
    #[arg(long, short = 'o', value_name = "FILE")]
    pub output: Option<PathBuf>,
}

/// `--since`/`--until` as clap parses them, so a bad time is a usage error
/// (exit 2) whose message names the flag.
fn time_flag(text: &str) -> Result<u64, String> {
    crate::store::parse_time(text).map_err(|e| e.to_string())
}
