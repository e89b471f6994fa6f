//! The flags `speedtap run` and `speedtap-desktop` share, as clap parses
//! them. The doc comments are the `--help` text; the flags are documented
//! in `docs/api.md`. The flags of the settings come from the settings
//! table ([`SettingFlags`]); here are the ones that say what to run.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;

use crate::config::SettingFlags;

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
    /// Every flag that sets a setting, from the settings table
    /// (`config/defs.rs`), in its `--help` order.
    #[command(flatten)]
    pub settings: SettingFlags,
    /// Don't ask the model servers what they publish (`/api/ps`, `/slots`,
    /// `/props`, `/metrics`): waits are then not explained beyond what the
    /// stream shows.
    #[arg(long)]
    pub no_telemetry: bool,
}

/// `args.slow_ttft_ms` reads the setting's flag, wherever the table puts it.
impl std::ops::Deref for RunArgs {
    type Target = SettingFlags;

    fn deref(&self) -> &SettingFlags {
        &self.settings
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The flags the table generates keep a place of their own in `--help`:
    /// two of them say `display_order` (the file orders them differently),
    /// and a tie would let clap reorder them by name instead.
    #[test]
    fn no_two_flags_share_a_place_in_help() {
        let cmd = RunArgs::augment_args(clap::Command::new("run"));
        let mut orders: Vec<(usize, String)> = cmd
            .get_arguments()
            .filter_map(|a| Some((a.get_display_order(), a.get_long()?.to_owned())))
            .collect();
        orders.sort();
        for pair in orders.windows(2) {
            assert_ne!(pair[0].0, pair[1].0, "{} and {} tie", pair[0].1, pair[1].1);
        }
        let longs: Vec<&str> = orders.iter().map(|(_, l)| l.as_str()).collect();
        let at = |flag: &str| longs.iter().position(|l| *l == flag).unwrap();
        assert!(at("allow-remote") < at("otlp-endpoint"), "{longs:?}");
        assert!(at("otlp-endpoint") < at("retention-days"), "{longs:?}");
        assert!(at("max-db-mb") < at("idle-timeout"), "{longs:?}");
        assert!(at("idle-timeout") < at("head-timeout"), "{longs:?}");
    }
}
