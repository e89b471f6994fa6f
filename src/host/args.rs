//! The flags `speedtap run` and `speedtap-desktop` share, as clap parses
//! them. The doc comments are the `--help` text; the flags are documented
//! in `docs/api.md`.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;

/// The options of `speedtap run`, which the tray app takes too.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// Config file (TOML). Default: the platform config file, if it exists.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// A route: a listener at LISTEN forwarding to the base URL UPSTREAM,
    /// e.g. `ollama=127.0.0.1:11435=http://127.0.0.1:11434`. Repeatable.
    /// Without LISTEN (`ollama=http://127.0.0.1:11434`) the route is
    /// measured by capture alone (with --capture), no port is opened.
    #[arg(long = "route", value_name = "NAME=[LISTEN=]UPSTREAM")]
    pub routes: Vec<String>,
    /// Address of the control API and web dashboard [default: 127.0.0.1:7878].
    #[arg(long, value_name = "ADDR")]
    pub api: Option<SocketAddr>,
    /// The store of settled calls and calibration.
    #[arg(long, value_name = "FILE", conflicts_with = "no_db")]
    pub db: Option<PathBuf>,
    /// Keep everything in memory only.
    #[arg(long)]
    pub no_db: bool,
    /// A first token later than this raises a warning [default: 5000].
    #[arg(long, value_name = "N")]
    pub slow_ttft_ms: Option<u64>,
    /// One JSON line per published call snapshot on stdout.
    #[arg(long)]
    pub json: bool,
    /// Allow listening on non-loopback addresses.
    #[arg(long)]
    pub allow_remote: bool,
    /// Also push metrics by OTLP/HTTP to this collector, e.g.
    /// `http://127.0.0.1:4318`.
    #[arg(long, value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    /// Keep settled calls in the store this many days [default: 90].
    #[arg(long, value_name = "DAYS")]
    pub retention_days: Option<u64>,
    /// Cap the store's size; the oldest calls go first [default: 1024].
    #[arg(long, value_name = "MB")]
    pub max_db_mb: Option<u64>,
    /// Cut a response when its upstream sends nothing for this long, e.g.
    /// `5m` [default: off: a slow model is never cut].
    #[arg(long, value_name = "DURATION", value_parser = crate::config::parse_idle_timeout)]
    pub idle_timeout: Option<std::time::Duration>,
    /// How long a client may take to send a request head, which is also
    /// how long an idle keep-alive connection is kept [default: 60s].
    #[arg(long, value_name = "DURATION", value_parser = crate::config::parse_head_timeout)]
    pub head_timeout: Option<std::time::Duration>,
    /// The most a request head may take, in KiB; a longer one gets 431
    /// [default: 408].
    #[arg(long, value_name = "KIB")]
    pub max_head_kib: Option<u64>,
    /// The most client connections one route serves at once; more wait in
    /// the kernel's backlog [default: 4096].
    #[arg(long, value_name = "N")]
    pub max_connections: Option<u64>,
    /// Also measure calls made directly to each route's upstream port, by
    /// passive capture of the loopback traffic (needs a one-time
    /// permission for the helper `speedtap-capture`; without it speedtap
    /// says the command and keeps proxying).
    #[arg(long)]
    pub capture: bool,
    /// The interface to capture [default: lo]; `any` also sees clients in
    /// containers (bridges).
    #[arg(long, value_name = "IFACE")]
    pub capture_interface: Option<String>,
    /// With no route configured, also probe new listeners on this port
    /// whoever owns them (model servers are found by process name and on
    /// the well-known ports anyway); repeat it for more ports.
    #[arg(long = "watch-port", value_name = "PORT", value_parser = clap::value_parser!(u16).range(1..))]
    pub watch_ports: Vec<u16>,
    /// Don't ask the model servers what they publish (`/api/ps`, `/slots`,
    /// `/props`, `/metrics`): waits are then not explained beyond what the
    /// stream shows.
    #[arg(long)]
    pub no_telemetry: bool,
}
