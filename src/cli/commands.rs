//! The small commands: `simulate` and `discover`, and the entry point that
//! dispatches every subcommand.

use std::ffi::OsString;

use clap::Parser;

use super::args::{Cli, Command, SimulateArgs};
use super::run::{run, RunError};
use crate::simulate::{self, SimConfig};

/// Parses `args`, runs the command, and returns the process exit code
/// (0 clean stop, 1 runtime failure, 2 bad usage or config).
pub fn main_with_args<I, T>(args: I) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return code;
        }
    };
    init_tracing();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("speedtap-proxy")
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("speedtap: cannot start the runtime: {e}");
            return 1;
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Run(args) => run(args).await,
            Command::Simulate(args) => simulate_command(args).await,
            Command::Discover => discover_command().await,
        }
    });
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("speedtap: {e}");
            e.exit_code()
        }
    }
}

/// Logs go to stderr, filtered by `RUST_LOG` (default: warnings). They
/// never carry prompt or completion text: nothing logs bodies.
fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

async fn simulate_command(args: SimulateArgs) -> Result<(), RunError> {
    if !(args.tps > 0.0 && args.tps.is_finite()) {
        return Err(RunError::Usage("--tps must be a positive number".into()));
    }
    let config = SimConfig {
        ttft: std::time::Duration::from_millis(args.ttft_ms),
        tokens_per_second: args.tps,
        tokens: args.tokens,
        reasoning_tokens: args.reasoning,
        usage: args.usage,
        server_timings: args.server_timings,
        ..SimConfig::default()
    };
    // Handlers first, so a stop signal right after the banner still drains.
    let stop = super::run::stop_signal();
    simulate::run_forever(&args.listen, config, stop)
        .await
        .map_err(|e| RunError::Runtime(format!("simulate on {}: {e}", args.listen)))
}

async fn discover_command() -> Result<(), RunError> {
    let found = crate::discover::discover().await;
    if found.is_empty() {
        println!(
            "No local model server found on the usual ports \
             (Ollama 11434, llama.cpp 8080, LM Studio 1234, vLLM 8000, KoboldCpp 5001, Jan 1337)."
        );
        return Ok(());
    }
    for d in found {
        let r = &d.suggested_route;
        println!(
            "{} on port {}{}\n  route: --route {}={}={}\n  point clients at http://{}",
            d.kind.label(),
            d.port,
            d.detail.map(|s| format!(" ({s})")).unwrap_or_default(),
            r.name,
            r.listen,
            d.upstream,
            r.listen
        );
    }
    Ok(())
}
