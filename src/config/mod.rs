//! The configuration: the TOML file, the `speedtap run` flags, and the
//! resolved [`Settings`] the engine runs with.
//!
//! Layers, lowest first: built-in defaults < config file < flags.
//!
//! Every error a user can cause names where to fix it: a file error names the
//! file and the 1-based line of the offending entry (TOML syntax, unknown
//! keys, wrong types and semantic problems alike), a flag error names the
//! flag. Both mean exit code 2 (`docs/api.md`).
//!
//! By concern:
//! - [`defs`]: **the settings table**: every setting once, with its key,
//!   flag, rule, resolved type, default and doc; it generates
//!   [`ConfigFile`], [`SettingFlags`], [`CliOverrides`] and [`Settings`]
//!   (by the macro and merge rules in `define`);
//! - [`values`]: the value types and their checks, each written once (a
//!   count of at least 1, the two timeouts, the OTLP endpoint, `db`);
//! - [`file`](mod@file): the TOML file, read into the typed [`ConfigFile`] (the raw
//!   layer: what the file says) and written back ([`save_config`]); the
//!   entries the table leaves to it (routes, `api`) and where each value
//!   came from are in `entries`;
//! - [`resolve`](mod@resolve): the merge of [`CliOverrides`] (the flags,
//!   also raw) and the file into [`Settings`] (resolved: every value
//!   decided and checked), with the rules that need more than one value;
//! - [`paths`]: the default config and store paths;
//! - [`loops`]: whether a route's upstream is one of speedtap's own
//!   listeners (refused: every request would come back round).
//!
//! # How to add a setting
//!
//! Three places. Say `max_calls`, a count, in the file and as
//! `--max-calls`, default 64:
//!
//! 1. **Its definition, default and doc**: one entry in the table in
//!    `config/defs.rs`, in the section where its key should sit in a saved
//!    file (and its flag in `--help`):
//!    ```text
//!    /// Refuse calls beyond this many at once [default: 64].
//!    setting max_calls {
//!        file: u64, read_with = "values::de_count";
//!        flag: [long, value_name = "N"] Option<u64>, check = values::check_count;
//!        value: u64 = 64, merge = first_set;
//!    }
//!    ```
//!    `file` is the key's type and the rule serde reads it by (toml then
//!    names the line of a bad value); `flag` the flag's clap attributes and
//!    type (the doc is its `--help` text) and the same rule as a check
//!    (a bad flag is named `--max-calls`); `value` the resolved type, the
//!    default and the merge rule (`define.rs`: `first_set`, `first_set_ms`,
//!    `first_set_or_none`, `either_on`, `flags_replace`). A new rule goes
//!    in [`values`] once, for both. A key without a flag goes in the
//!    section's `file_only` block, a flag without a key in `flag_only`,
//!    a setting kept with others in one struct in a `group`.
//! 2. **Any special resolution rule**, in `config/resolve.rs`, when the
//!    value depends on others (as the API address depends on
//!    `allow_remote`); a plain setting has none.
//! 3. **Its use**: read `settings.max_calls` where it is needed, e.g. one
//!    line in `EngineOptions::from_settings` (`host/options.rs`) when the
//!    engine takes it.
//!
//! Tests: a fixture in `tests/configs/valid/full.toml` (and one in
//! `tests/configs/invalid/` per rule), checked by `tests/config.rs`.

mod define;
pub mod defs;
mod entries;
mod error;
pub mod file;
pub mod loops;
pub mod paths;
pub mod resolve;
pub mod values;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

pub use defs::{CliOverrides, ProxySettings, SettingFlags, Settings};
pub use error::ConfigError;
pub use file::{load_config, parse_config, save_config, ConfigFile};
pub use paths::{default_config_path, default_db_path};
pub use resolve::resolve;
pub use values::{check_otlp_endpoint, parse_head_timeout, parse_idle_timeout, DbSetting, Millis};

pub use crate::model::route::{
    parse_capture_route_flag, parse_listen, parse_route_flag, CaptureOnlyRoute,
};

/// Default control API / dashboard address.
pub const DEFAULT_API: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 7878);

/// Default slow-first-token threshold.
pub const DEFAULT_SLOW_TTFT_MS: u64 = 5000;

/// Settled calls are kept this many days by default (`retention_days`).
pub const DEFAULT_RETENTION_DAYS: u64 = 90;

/// The store's default size cap in MB (`max_db_mb`); the oldest calls go
/// first.
pub const DEFAULT_MAX_DB_MB: u64 = 1024;

/// The interface captured by default.
pub const DEFAULT_CAPTURE_INTERFACE: &str = "lo";

/// The route rules the file and `--route` share (they live with the routes,
/// in `model::route`), as the config relies on them.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::route::Upstream;

    #[test]
    fn upstream_parses_host_port_and_base_path() {
        let u = Upstream::parse("http://127.0.0.1:11434").unwrap();
        assert_eq!(
            u,
            Upstream {
                host: "127.0.0.1".into(),
                port: 11434,
                base_path: String::new()
            }
        );
        assert_eq!(u.authority(), "127.0.0.1:11434");
        assert_eq!(
            u.join("/api/chat?x=1"),
            "http://127.0.0.1:11434/api/chat?x=1"
        );
        assert_eq!(u.join("v1/models"), "http://127.0.0.1:11434/v1/models");

        let u = Upstream::parse("http://localhost/prefix/").unwrap();
        assert_eq!(u.port, 80);
        assert_eq!(u.base_path, "/prefix");
        assert_eq!(u.base_url(), "http://localhost:80/prefix");
        assert_eq!(u.join("/v1/models"), "http://localhost:80/prefix/v1/models");

        let u = Upstream::parse("HTTP://[::1]:8080").unwrap();
        assert_eq!(u.host, "::1");
        assert_eq!(u.authority(), "[::1]:8080");
        assert_eq!(Upstream::parse(&u.base_url()).unwrap(), u);
    }

    #[test]
    fn upstream_rejects_what_it_cannot_forward_to() {
        for (bad, fragment) in [
            ("https://127.0.0.1:8080", "https:// is not supported"),
            ("ftp://x", "is not an http:// URL"),
            ("127.0.0.1:8080", "is not an http:// URL"),
            ("http://", "no host"),
            ("http://:8080", "no host"),
            ("http://host:0", "not a valid port"),
            ("http://host:99999", "not a valid port"),
            ("http://host:80x", "not a valid port"),
            ("http://u:p@host:80", "credentials"),
            ("http://host/?q=1", "query"),
            ("http://[::1:80", "unclosed"),
            ("http://ho st:80", "not a valid host"),
        ] {
            let e = Upstream::parse(bad).unwrap_err();
            assert!(e.contains(fragment), "{bad}: {e}");
        }
    }

    /// Found by the `config` fuzz target (fuzz/regressions/config): an
    /// unbracketed host with a `:` was accepted unchecked, and the config
    /// the tray saves back (`to_toml`) then held an upstream that does not
    /// parse.
    #[test]
    fn unbracketed_host_with_colon_is_rejected() {
        for bad in [
            "http://local>>:1]:1337",
            "http://127.0.0.*:808:8081",
            "http://::1",
            "http://::1:8080",
        ] {
            let e = Upstream::parse(bad).unwrap_err();
            assert!(e.contains("not a valid host"), "{bad}: {e}");
        }
        for good in [
            "http://[::1]:8080/v1",
            "http://h_1.local:80",
            "http://10.0.0.1",
        ] {
            let u = Upstream::parse(good).unwrap();
            assert_eq!(Upstream::parse(&u.base_url()), Ok(u), "{good} round trip");
        }
    }

    #[test]
    fn listen_accepts_localhost_and_v6() {
        assert_eq!(
            parse_listen("localhost:1").unwrap(),
            "127.0.0.1:1".parse().unwrap()
        );
        assert_eq!(
            parse_listen("[::1]:80").unwrap(),
            "[::1]:80".parse().unwrap()
        );
        assert!(parse_listen("127.0.0.1").is_err());
        assert!(parse_listen("example.com:80").is_err());
    }
}
