//! Every setting, defined once: its config key, its `speedtap run` flag
//! (the doc is the `--help` text), its rule, its resolved type, its default
//! and its merge. From this table the `settings_table!` macro (in
//! `config/define.rs`) generates [`ConfigFile`], the private file keys,
//! [`SettingFlags`], [`CliOverrides`], [`Settings`] with its defaults,
//! [`ProxySettings`], the flag checks and the merge.
//!
//! Order matters twice: a saved config file lists its keys in the table's
//! order, and `--help` lists the flags in it (two flags say
//! `display_order` to keep their place there, as the file orders them
//! differently). The settings with rules of their own (the routes, the API
//! and store addresses) are declared by hand, at the end of their section
//! for the file and in the `by_hand` blocks for the other layers, and
//! resolved in [`super::resolve`](mod@super::resolve).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use toml::Spanned;

use super::define::{
    either_on, first_set, first_set_ms, first_set_or_none, flags_replace, settings_table,
};
use super::entries::{write_routes, ListenAddr, Origin, RouteEntry};
use super::values::{self, check_otlp_endpoint, DbSetting, Millis};
use super::{
    ConfigError, DEFAULT_API, DEFAULT_CAPTURE_INTERFACE, DEFAULT_MAX_DB_MB, DEFAULT_RETENTION_DAYS,
    DEFAULT_SLOW_TTFT_MS,
};
use crate::model::route::{CaptureOnlyRoute, RouteSpec};

settings_table! {
    section {
        /// A first token later than this raises a warning [default: 5000].
        setting slow_ttft_ms {
            file: u64, read_with = "values::de_count";
            flag: [long, value_name = "N"] Option<u64>, check = values::check_count;
            value: Millis = Millis::from_ms(DEFAULT_SLOW_TTFT_MS), merge = first_set_ms;
        }
        flag_only {
            /// One JSON line per published call snapshot on stdout.
            json: [long] bool = false;
        }
        by_hand file {
            /// The control API's address (`api`).
            pub api: Option<SocketAddr>,
            /// The store (`db`): a path, `false` (memory only) or `true`.
            pub db: Option<DbSetting>,
        }
        by_hand flags {}
    }
    section {
        /// Allow listening on non-loopback addresses.
        setting allow_remote {
            file: bool;
            flag: [long] bool;
            value: bool = false, merge = either_on;
        }
        file_only {
            /// Desktop notifications at all (tray; default true).
            notifications: bool = true;
            /// A follow-up notification when a slow call settles (tray;
            /// default false).
            notify_settled: bool = false;
        }
        by_hand file {}
        by_hand flags {}
    }
    section {
        /// Cut a response when its upstream sends nothing for this long, e.g.
        /// `5m` [default: off: a slow model is never cut].
        setting idle_timeout {
            file: Duration, read_with = "values::de_idle_timeout",
                write_with = "values::humantime_opt";
            flag: [
                long, value_name = "DURATION", value_parser = values::parse_idle_timeout,
                display_order = 11
            ] Option<Duration>;
            value: Option<Duration> = None, merge = first_set_or_none;
        }
        /// Keep settled calls in the store this many days [default: 90].
        setting retention_days {
            file: u64, read_with = "values::de_count";
            flag: [long, value_name = "DAYS"] Option<u64>, check = values::check_count;
            value: u64 = DEFAULT_RETENTION_DAYS, merge = first_set;
        }
        /// Cap the store's size; the oldest calls go first [default: 1024].
        setting max_db_mb {
            file: u64, read_with = "values::de_count";
            flag: [long, value_name = "MB"] Option<u64>, check = values::check_count;
            value: u64 = DEFAULT_MAX_DB_MB, merge = first_set;
        }
        /// Also push metrics by OTLP/HTTP to this collector, e.g.
        /// `http://127.0.0.1:4318`.
        setting otlp_endpoint {
            file: String, read_with = "values::de_otlp_endpoint";
            flag: [long, value_name = "URL", display_order = 8] Option<String>,
                check = |url: &String| check_otlp_endpoint(url);
            value: Option<String> = None, merge = first_set_or_none;
        }
        group proxy: ProxySettings {
            /// How long a client may take to send a request head, which is also
            /// how long an idle keep-alive connection is kept [default: 60s].
            setting head_timeout {
                file: Duration, read_with = "values::de_head_timeout",
                    write_with = "values::humantime_opt";
                flag: [long, value_name = "DURATION", value_parser = values::parse_head_timeout];
            }
            /// The most a request head may take, in KiB; a longer one gets 431
            /// [default: 408].
            setting max_head_kib {
                file: u64, read_with = "values::de_count";
                flag: [long, value_name = "KIB"], check = values::check_count;
            }
            /// The most client connections one route serves at once; more wait in
            /// the kernel's backlog [default: 4096].
            setting max_connections {
                file: u64, read_with = "values::de_count";
                flag: [long, value_name = "N"], check = values::check_count;
            }
        }
        by_hand file {}
        by_hand flags {}
    }
    section {
        /// Also measure calls made directly to each route's upstream port, by
        /// passive capture of the loopback traffic (needs a one-time
        /// permission for the helper `speedtap-capture`; without it speedtap
        /// says the command and keeps proxying).
        setting capture {
            file: bool;
            flag: [long] bool;
            value: bool = false, merge = either_on;
        }
        /// The interface to capture [default: lo]; `any` also sees clients in
        /// containers (bridges).
        setting capture_interface {
            file: String, read_with = "values::de_interface";
            flag: [long, value_name = "IFACE"] Option<String>;
            value: String = DEFAULT_CAPTURE_INTERFACE.to_owned(), merge = first_set;
        }
        /// With no route configured, also probe new listeners on this port
        /// whoever owns them (model servers are found by process name and on
        /// the well-known ports anyway); repeat it for more ports.
        setting watch_ports {
            file: Vec<u16>, read_with = "values::de_ports";
            flag: [
                long = "watch-port", value_name = "PORT",
                value_parser = clap::value_parser!(u16).range(1..)
            ] Vec<u16>;
            value: Vec<u16> = Vec::new(), merge = flags_replace;
        }
        by_hand file {
            /// The routes, written as `[[route]]` tables.
            #[serde(
                rename = "route",
                serialize_with = "write_routes",
                skip_serializing_if = "Vec::is_empty"
            )]
            pub routes: Vec<RouteSpec>,
            #[serde(skip)]
            pub(super) origin: Origin,
        }
        by_hand flags {}
    }
    by_hand file_keys {
        pub(super) api: Option<Spanned<ListenAddr>>,
        /// `"path"`, `false` (memory only) or `true` (the default file).
        pub(super) db: Option<DbSetting>,
        pub(super) route: Vec<Spanned<RouteEntry>>,
    }
    by_hand overrides {
        pub routes: Vec<RouteSpec>,
        pub api: Option<SocketAddr>,
        pub db: Option<PathBuf>,
        pub no_db: bool,
        pub capture_routes: Vec<CaptureOnlyRoute>,
    }
    by_hand settings {
        routes: Vec<RouteSpec> = Vec::new(),
        /// Control API and dashboard address (default 127.0.0.1:7878).
        api: SocketAddr = DEFAULT_API,
        db: DbSetting = DbSetting::Default,
        /// Routes measured by capture alone (`--route NAME=UPSTREAM`).
        capture_routes: Vec<CaptureOnlyRoute> = Vec::new(),
    }
}
