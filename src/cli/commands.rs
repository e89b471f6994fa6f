//! The small commands: `simulate`, `discover` and `export`, and the entry
//! point that dispatches every subcommand.

use std::ffi::OsString;
use std::fs::File;
use std::io::{self, BufWriter};
use std::path::{Path, PathBuf};

use clap::Parser;

use super::args::{Cli, Command, ExportArgs, SimulateArgs};
use super::run::run;
use crate::config::{self, DbSetting};
use crate::host::settings::RunError;
use crate::model::HistoryFilter;
use crate::simulate::{self, SimConfig};
use crate::store::{self, Store, StoreError};

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
    let command = match cli.command {
        // Blocking file I/O from start to end: no runtime needed.
        Command::Export(args) => return exit_code(export_command(&args)),
        other => other,
    };
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
        match command {
            Command::Run(args) => run(args).await,
            Command::Simulate(args) => simulate_command(args).await,
            Command::Discover => discover_command().await,
            Command::Export(args) => export_command(&args),
        }
    });
    exit_code(result)
}

/// Prints a failure and maps it to the contract's exit code.
fn exit_code(result: Result<(), RunError>) -> i32 {
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
        slots: args.slots,
        n_ctx: args.n_ctx,
        overflow: args.overflow,
        load_time: std::time::Duration::from_millis(args.load_ms),
        keep_alive: u64::try_from(args.keep_alive_ms)
            .ok()
            .map(std::time::Duration::from_millis),
        prefill_tokens_per_second: args.prefill_tps,
        ps_while_loading: args.ps_while_loading,
        ping_interval: args.ping_ms.map(std::time::Duration::from_millis),
        stall_after_tokens: args.stall_after,
        stall: std::time::Duration::from_millis(args.stall_ms),
        ..SimConfig::default()
    };
    // Handlers first, so a stop signal right after the banner still drains.
    let stop = super::run::stop_signal();
    simulate::run_forever(&args.listen, config, stop)
        .await
        .map_err(|e| RunError::Runtime(format!("simulate on {}: {e}", args.listen)))
}

async fn discover_command() -> Result<(), RunError> {
    // The same sources as `run`'s watcher: the kernel's listeners, their
    // processes, the probes, and the names saved by earlier runs.
    let saved = crate::config::default_db_path().with_file_name("servers.json");
    let found = crate::host::look_once(std::path::Path::new("/proc"), Some(&saved)).await;
    if found.is_empty() {
        let looked = crate::host::WatchOptions::default().watched();
        println!("No local model server found (looked {looked}).");
        return Ok(());
    }
    for server in found {
        println!("{}", discover_lines(&server));
    }
    Ok(())
}

/// What `speedtap discover` says of one server: what and where, its name,
/// and the route that would measure it through a proxy.
fn discover_lines(server: &crate::host::FoundNow) -> String {
    let d = &server.found;
    let detail = d
        .detail
        .as_deref()
        .map(|s| format!(" ({s})"))
        .unwrap_or_default();
    let process = server
        .process
        .as_ref()
        .map(|(comm, pid)| format!(", process {comm} pid {pid}"))
        .unwrap_or_default();
    let upstream = crate::model::Upstream {
        host: server.host.to_string(),
        port: d.port,
        base_path: String::new(),
    };
    let listen = std::net::SocketAddr::new(server.host, d.port.checked_add(1).unwrap_or(0));
    format!(
        "{}{detail} on port {}{process}\n  name: {} (its calls are filed under it)\n  \
         measured by `speedtap run --capture` with no client change, or through\n  \
         route: --route {}={listen}={}\n  point clients at http://{listen}",
        d.kind.label(),
        d.port,
        server.name,
        server.name,
        upstream.base_url(),
    )
}

/// `speedtap export`: the stored calls the flags select, oldest first, as
/// CSV or JSON Lines, to stdout or `--output`; then one summary line on
/// stderr (`exported 3 calls to out.csv from /path/speedtap.sqlite3`), so
/// stdout carries nothing but the export.
///
/// Exit codes: 2 for bad flags (clap's, a bad time, `--since` not before
/// `--until`) and for a config file that is unreadable or says `db = false`
/// (memory only: there is no history to export); 1 when the database is
/// missing or can't be read, or the output can't be written. A reader that
/// closes stdout early (`| head`) ends the export quietly with 0.
pub fn export_command(args: &ExportArgs) -> Result<(), RunError> {
    if let (Some(since), Some(until)) = (args.since, args.until) {
        if since >= until {
            return Err(RunError::Usage(format!(
                "--since ({}) must be before --until ({}): the range is [since, until)",
                crate::model::time::ms_to_rfc3339(since),
                crate::model::time::ms_to_rfc3339(until)
            )));
        }
    }
    let db = export_db_path(args)?;
    let store = Store::open_existing(&db).map_err(|e| RunError::Runtime(e.to_string()))?;
    let filter = HistoryFilter {
        model: args.model.clone(),
        route: args.route.clone(),
        client: args.client.clone(),
        since_ms: args.since,
        until_ms: args.until,
        status: None,
        limit: None,
    };
    let (written, target) = match &args.output {
        Some(path) if same_file(path, &db) => {
            return Err(RunError::Usage(format!(
                "--output {} is the history database itself",
                path.display()
            )))
        }
        Some(path) => {
            let file = File::create(path).map_err(|e| {
                RunError::Runtime(format!(
                    "cannot write the export to {}: {e}",
                    path.display()
                ))
            })?;
            let mut out = BufWriter::new(file);
            let written = store::export(&store, &filter, args.format, &mut out);
            if written.is_err() {
                // A half-written export must not pass for a whole one.
                let _ = std::fs::remove_file(path);
            }
            (written, path.display().to_string())
        }
        None => {
            let mut out = BufWriter::new(io::stdout().lock());
            let written = store::export(&store, &filter, args.format, &mut out);
            (written, "stdout".to_owned())
        }
    };
    match written {
        Ok(n) => {
            eprintln!(
                "speedtap: exported {n} call{} to {target} from {}",
                if n == 1 { "" } else { "s" },
                db.display()
            );
            Ok(())
        }
        Err(StoreError::ExportWrite(e)) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        Err(StoreError::ExportWrite(e)) => Err(RunError::Runtime(format!(
            "cannot write the export to {target}: {e}"
        ))),
        Err(e) => Err(RunError::Runtime(e.to_string())),
    }
}

/// The database `export` reads: `--db`; else the `db` of the config file
/// (`--config`, or the platform one if it exists), as `speedtap run` would
/// use it; else the platform default.
fn export_db_path(args: &ExportArgs) -> Result<PathBuf, RunError> {
    if let Some(db) = &args.db {
        return Ok(db.clone());
    }
    let config_path = match &args.config {
        Some(path) => Some(path.clone()),
        None => Some(config::default_config_path()).filter(|p| p.exists()),
    };
    let Some(config_path) = config_path else {
        return Ok(config::default_db_path());
    };
    let file = config::load_config(&config_path)?;
    match file.db.unwrap_or(DbSetting::Default) {
        DbSetting::None => Err(memory_only(&config_path)),
        setting => Ok(setting.path().unwrap_or_else(config::default_db_path)),
    }
}

/// True when both paths name one existing file (so `--output` would
/// truncate the database it reads).
fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

fn memory_only(config_path: &Path) -> RunError {
    RunError::Usage(format!(
        "{}: db = false keeps calls in memory only, so there is no history to export; \
         pass --db FILE",
        config_path.display()
    ))
}
