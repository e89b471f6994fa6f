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
//! The TOML is read through private serde structs whose fields are
//! [`toml::Spanned`], so checks that run after deserialising (a bad listen
//! address, a duplicate route name) still know the line. What callers get is
//! the typed, validated [`ConfigFile`], which the tray can also edit and
//! [`save_config`] back.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::model::route::{check_route_name, RouteSpec, Upstream};
pub use crate::model::route::{
    parse_capture_route_flag, parse_listen, parse_route_flag, CaptureOnlyRoute,
};
use toml::Spanned;

/// Default control API / dashboard address.
pub const DEFAULT_API: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 7878);

/// Default slow-first-token threshold.
pub const DEFAULT_SLOW_TTFT_MS: u64 = 5000;

/// Settled calls are kept this many days by default (`retention_days`).
pub const DEFAULT_RETENTION_DAYS: u64 = 90;

/// The store's default size cap in MB (`max_db_mb`); the oldest calls go
/// first.
pub const DEFAULT_MAX_DB_MB: u64 = 1024;

// ---------------------------------------------------------------------------
// Settings
// ---------------------------------------------------------------------------

/// Where settled calls and calibration are stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DbSetting {
    /// `speedtap.sqlite3` in the platform data dir ([`default_db_path`]).
    Default,
    /// This file.
    File(PathBuf),
    /// Memory only (`--no-db`, or `db = false` in the file).
    None,
}

impl DbSetting {
    /// The file to open, or `None` for memory only.
    pub fn path(&self) -> Option<PathBuf> {
        match self {
            DbSetting::Default => Some(default_db_path()),
            DbSetting::File(p) => Some(p.clone()),
            DbSetting::None => None,
        }
    }
}

/// The resolved settings the engine runs with.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    pub routes: Vec<RouteSpec>,
    /// Control API and dashboard address (default 127.0.0.1:7878).
    pub api: SocketAddr,
    pub db: DbSetting,
    /// Slow-first-token threshold (default 5000).
    pub slow_ttft_ms: u64,
    /// One JSON line per snapshot instead of the live view (flag only).
    pub json: bool,
    /// Non-loopback listen/API addresses are allowed.
    pub allow_remote: bool,
    /// Notify (tray) when a call settles (default false).
    pub notify_settled: bool,
    /// Desktop notifications at all (default true).
    pub notifications: bool,
    /// Cut a response whose upstream sends nothing for this long
    /// (`idle_timeout`, `--idle-timeout`); `None`, the default, never does.
    pub idle_timeout: Option<std::time::Duration>,
    /// Keep settled calls this many days (`retention_days`, default 90).
    pub retention_days: u64,
    /// Cap the store at this many MB (`max_db_mb`, default 1024).
    pub max_db_mb: u64,
    /// Push metrics by OTLP/HTTP to this collector (`otlp_endpoint`);
    /// `None`, the default, pushes nothing.
    pub otlp_endpoint: Option<String>,
    /// The proxy's per-connection limits; each `None` is the engine's
    /// default (documented on the engine's proxy limits).
    pub proxy: ProxySettings,
    /// Also measure calls made directly to each route's upstream port, by
    /// passive capture of the loopback traffic (`capture`, `--capture`;
    /// default false).
    pub capture: bool,
    /// The interface captured (`capture_interface`, `--capture-interface`;
    /// default `lo`; `any` also sees clients in containers).
    pub capture_interface: String,
    /// Routes measured by capture alone (`--route NAME=UPSTREAM`).
    pub capture_routes: Vec<CaptureOnlyRoute>,
}

/// The interface captured by default.
pub const DEFAULT_CAPTURE_INTERFACE: &str = "lo";

/// The proxy's connection limits as the user sets them (`head_timeout`,
/// `max_head_kib`, `max_connections`). `None` means the engine's default,
/// so the defaults live in one place (the proxy's limits).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProxySettings {
    /// How long a client may take to send a request head (also how long
    /// an idle keep-alive connection is kept).
    pub head_timeout: Option<std::time::Duration>,
    /// The most a connection buffers while reading a request head, in KiB.
    pub max_head_kib: Option<u64>,
    /// The most client connections one route serves at once.
    pub max_connections: Option<u64>,
}

impl ProxySettings {
    /// Each field the other sets wins (flags over the file).
    fn or(self, lower: ProxySettings) -> ProxySettings {
        ProxySettings {
            head_timeout: self.head_timeout.or(lower.head_timeout),
            max_head_kib: self.max_head_kib.or(lower.max_head_kib),
            max_connections: self.max_connections.or(lower.max_connections),
        }
    }
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            routes: Vec::new(),
            api: DEFAULT_API,
            db: DbSetting::Default,
            slow_ttft_ms: DEFAULT_SLOW_TTFT_MS,
            json: false,
            allow_remote: false,
            notify_settled: false,
            notifications: true,
            idle_timeout: None,
            retention_days: DEFAULT_RETENTION_DAYS,
            max_db_mb: DEFAULT_MAX_DB_MB,
            otlp_endpoint: None,
            proxy: ProxySettings::default(),
            capture: false,
            capture_interface: DEFAULT_CAPTURE_INTERFACE.to_owned(),
            capture_routes: Vec::new(),
        }
    }
}

/// What the command line says; `None`/`false`/empty means "not given".
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CliOverrides {
    pub routes: Vec<RouteSpec>,
    pub api: Option<SocketAddr>,
    pub db: Option<PathBuf>,
    pub no_db: bool,
    pub slow_ttft_ms: Option<u64>,
    pub json: bool,
    pub allow_remote: bool,
    pub idle_timeout: Option<std::time::Duration>,
    pub retention_days: Option<u64>,
    pub max_db_mb: Option<u64>,
    pub otlp_endpoint: Option<String>,
    pub proxy: ProxySettings,
    pub capture: bool,
    pub capture_interface: Option<String>,
    pub capture_routes: Vec<CaptureOnlyRoute>,
}

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

/// A bad config file or flag. Every variant means exit code 2.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{file}: {source}")]
    Io {
        file: String,
        #[source]
        source: std::io::Error,
    },
    /// A problem at a known line: syntax, unknown key, wrong type, or a
    /// semantic check.
    #[error("{file} line {line}: {message}")]
    AtLine {
        file: String,
        line: usize,
        message: String,
    },
    /// A problem the TOML parser could not place (rare).
    #[error("{file}: {message}")]
    InFile { file: String, message: String },
    /// A problem with a command-line flag, e.g. `--route ollama: ...`.
    #[error("{flag}: {message}")]
    Flag { flag: String, message: String },
}

impl ConfigError {
    /// The 1-based line, for errors that have one.
    pub fn line(&self) -> Option<usize> {
        match self {
            ConfigError::AtLine { line, .. } => Some(*line),
            _ => None,
        }
    }
}

/// 1-based line of a byte offset.
fn line_of(text: &str, offset: usize) -> usize {
    let end = offset.min(text.len());
    1 + text.as_bytes()[..end]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
}

// ---------------------------------------------------------------------------
// The config file
// ---------------------------------------------------------------------------

/// The file as serde sees it. Private: callers get [`ConfigFile`].
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    slow_ttft_ms: Option<Spanned<u64>>,
    api: Option<Spanned<String>>,
    /// `"path"`, `false` (memory only) or `true` (the default file).
    db: Option<Spanned<toml::Value>>,
    allow_remote: Option<bool>,
    notifications: Option<bool>,
    notify_settled: Option<bool>,
    /// A duration such as `"90s"` or `"5m"` (humantime).
    idle_timeout: Option<Spanned<String>>,
    retention_days: Option<Spanned<u64>>,
    max_db_mb: Option<Spanned<u64>>,
    otlp_endpoint: Option<Spanned<String>>,
    /// A duration, like `idle_timeout`.
    head_timeout: Option<Spanned<String>>,
    max_head_kib: Option<Spanned<u64>>,
    max_connections: Option<Spanned<u64>>,
    capture: Option<bool>,
    capture_interface: Option<Spanned<String>>,
    #[serde(default)]
    route: Vec<Spanned<RawRoute>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRoute {
    name: Spanned<String>,
    listen: Spanned<String>,
    upstream: Spanned<String>,
}

/// Lines of one route's entries, for errors found in [`resolve`].
#[derive(Clone, Debug)]
struct RouteLines {
    name: usize,
    listen: usize,
}

/// Where a parsed file's values came from.
#[derive(Clone, Debug)]
struct Origin {
    file: String,
    api_line: Option<usize>,
    /// Each parsed route with its lines. Looked up by value, so routes the
    /// tray added or edited since simply have no line.
    routes: Vec<(RouteSpec, RouteLines)>,
}

/// The config file's contents, typed and validated. Every field is optional:
/// absent means "not set here", so a lower layer (the defaults) applies.
///
/// Build one with `ConfigFile::default()` and set fields; [`parse_config`]
/// also remembers the file name and lines, so [`resolve`] can name them.
/// Equality compares the settings only, not where they came from.
#[derive(Clone, Debug, Default)]
pub struct ConfigFile {
    pub slow_ttft_ms: Option<u64>,
    pub api: Option<SocketAddr>,
    pub db: Option<DbSetting>,
    pub allow_remote: Option<bool>,
    pub notifications: Option<bool>,
    pub notify_settled: Option<bool>,
    pub idle_timeout: Option<std::time::Duration>,
    pub retention_days: Option<u64>,
    pub max_db_mb: Option<u64>,
    pub otlp_endpoint: Option<String>,
    pub proxy: ProxySettings,
    pub capture: Option<bool>,
    pub capture_interface: Option<String>,
    pub routes: Vec<RouteSpec>,
    origin: Option<Origin>,
}

impl PartialEq for ConfigFile {
    fn eq(&self, other: &Self) -> bool {
        self.slow_ttft_ms == other.slow_ttft_ms
            && self.api == other.api
            && self.db == other.db
            && self.allow_remote == other.allow_remote
            && self.notifications == other.notifications
            && self.notify_settled == other.notify_settled
            && self.idle_timeout == other.idle_timeout
            && self.retention_days == other.retention_days
            && self.max_db_mb == other.max_db_mb
            && self.otlp_endpoint == other.otlp_endpoint
            && self.proxy == other.proxy
            && self.capture == other.capture
            && self.capture_interface == other.capture_interface
            && self.routes == other.routes
    }
}

impl ConfigFile {
    /// The name the file was parsed under, if it was parsed.
    pub fn file_name(&self) -> Option<&str> {
        self.origin.as_ref().map(|o| o.file.as_str())
    }

    /// Serialises to the TOML [`save_config`] writes (and [`parse_config`]
    /// reads back to an equal value).
    pub fn to_toml(&self) -> String {
        #[derive(Serialize)]
        struct Out {
            #[serde(skip_serializing_if = "Option::is_none")]
            slow_ttft_ms: Option<u64>,
            #[serde(skip_serializing_if = "Option::is_none")]
            api: Option<String>,
            #[serde(skip_serializing_if = "Option::is_none")]
            db: Option<toml::Value>,
            #[serde(skip_serializing_if = "Option::is_none")]
            allow_remote: Option<bool>,
            #[serde(skip_serializing_if = "Option::is_none")]
            notifications: Option<bool>,
            #[serde(skip_serializing_if = "Option::is_none")]
            notify_settled: Option<bool>,
            #[serde(skip_serializing_if = "Option::is_none")]
            idle_timeout: Option<String>,
            #[serde(skip_serializing_if = "Option::is_none")]
            retention_days: Option<u64>,
            #[serde(skip_serializing_if = "Option::is_none")]
            max_db_mb: Option<u64>,
            #[serde(skip_serializing_if = "Option::is_none")]
            otlp_endpoint: Option<String>,
            #[serde(skip_serializing_if = "Option::is_none")]
            head_timeout: Option<String>,
            #[serde(skip_serializing_if = "Option::is_none")]
            max_head_kib: Option<u64>,
            #[serde(skip_serializing_if = "Option::is_none")]
            max_connections: Option<u64>,
            #[serde(skip_serializing_if = "Option::is_none")]
            capture: Option<bool>,
            #[serde(skip_serializing_if = "Option::is_none")]
            capture_interface: Option<String>,
            #[serde(skip_serializing_if = "Vec::is_empty")]
            route: Vec<OutRoute>,
        }
        #[derive(Serialize)]
        struct OutRoute {
            name: String,
            listen: String,
            upstream: String,
        }
        let out = Out {
            slow_ttft_ms: self.slow_ttft_ms,
            api: self.api.map(|a| a.to_string()),
            db: self.db.as_ref().map(|d| match d {
                DbSetting::Default => toml::Value::Boolean(true),
                DbSetting::None => toml::Value::Boolean(false),
                DbSetting::File(p) => toml::Value::String(p.to_string_lossy().into_owned()),
            }),
            allow_remote: self.allow_remote,
            notifications: self.notifications,
            notify_settled: self.notify_settled,
            idle_timeout: self
                .idle_timeout
                .map(|d| humantime::format_duration(d).to_string()),
            retention_days: self.retention_days,
            max_db_mb: self.max_db_mb,
            otlp_endpoint: self.otlp_endpoint.clone(),
            head_timeout: self
                .proxy
                .head_timeout
                .map(|d| humantime::format_duration(d).to_string()),
            max_head_kib: self.proxy.max_head_kib,
            max_connections: self.proxy.max_connections,
            capture: self.capture,
            capture_interface: self.capture_interface.clone(),
            route: self
                .routes
                .iter()
                .map(|r| OutRoute {
                    name: r.name.clone(),
                    listen: r.listen.to_string(),
                    upstream: r.upstream.base_url(),
                })
                .collect(),
        };
        // Only strings, integers, booleans and tables: serialising can't fail.
        toml::to_string(&out).unwrap_or_default()
    }
}

/// Parses and validates config text. Pure; `file_name` is only used in
/// messages. A relative `db` path is returned as written ([`load_config`]
/// anchors it to the file's directory).
pub fn parse_config(text: &str, file_name: &str) -> Result<ConfigFile, ConfigError> {
    let at = |offset: usize, message: String| ConfigError::AtLine {
        file: file_name.to_string(),
        line: line_of(text, offset),
        message,
    };
    let at_err = |(offset, message): (usize, String)| at(offset, message);
    let raw: RawConfig = toml::from_str(text).map_err(|e| match e.span() {
        Some(span) => at(span.start, with_key(text, span.start, e.message().trim())),
        None => ConfigError::InFile {
            file: file_name.to_string(),
            message: e.message().trim().to_string(),
        },
    })?;

    let slow_ttft_ms = match raw.slow_ttft_ms {
        Some(v) if *v.get_ref() == 0 => {
            return Err(at(v.span().start, "slow_ttft_ms must be at least 1".into()))
        }
        v => v.map(Spanned::into_inner),
    };
    let (api, api_line) = match raw.api {
        Some(a) => {
            let addr =
                parse_listen(a.get_ref()).map_err(|e| at(a.span().start, format!("api: {e}")))?;
            (Some(addr), Some(line_of(text, a.span().start)))
        }
        None => (None, None),
    };
    let db = match raw.db {
        None => None,
        Some(v) => Some(match v.get_ref() {
            toml::Value::Boolean(true) => DbSetting::Default,
            toml::Value::Boolean(false) => DbSetting::None,
            toml::Value::String(s) if !s.trim().is_empty() => DbSetting::File(PathBuf::from(s)),
            _ => {
                return Err(at(
                    v.span().start,
                    "db must be a file path, or false for memory only".into(),
                ))
            }
        }),
    };

    let idle_timeout = match raw.idle_timeout {
        None => None,
        Some(v) => Some(
            parse_idle_timeout(v.get_ref())
                .map_err(|e| at(v.span().start, format!("idle_timeout: {e}")))?,
        ),
    };

    let retention_days = at_least_one(raw.retention_days, "retention_days").map_err(&at_err)?;
    let max_db_mb = at_least_one(raw.max_db_mb, "max_db_mb").map_err(&at_err)?;
    let max_head_kib = at_least_one(raw.max_head_kib, "max_head_kib").map_err(&at_err)?;
    let max_connections = at_least_one(raw.max_connections, "max_connections").map_err(&at_err)?;
    let otlp_endpoint = match raw.otlp_endpoint {
        None => None,
        Some(v) => Some(
            check_otlp_endpoint(v.get_ref())
                .map_err(|e| at(v.span().start, format!("otlp_endpoint: {e}")))?,
        ),
    };
    let head_timeout = match raw.head_timeout {
        None => None,
        Some(v) => Some(
            parse_head_timeout(v.get_ref())
                .map_err(|e| at(v.span().start, format!("head_timeout: {e}")))?,
        ),
    };

    let capture_interface = match raw.capture_interface {
        None => None,
        Some(v) if v.get_ref().trim().is_empty() => {
            return Err(at(
                v.span().start,
                "capture_interface: must name an interface (lo, any, eth0...)".into(),
            ))
        }
        Some(v) => Some(v.into_inner()),
    };

    let mut routes: Vec<(RouteSpec, RouteLines)> = Vec::with_capacity(raw.route.len());
    for entry in raw.route {
        let r = entry.into_inner();
        let name = r.name.get_ref().clone();
        check_route_name(&name).map_err(|e| at(r.name.span().start, e))?;
        let listen = parse_listen(r.listen.get_ref())
            .map_err(|e| at(r.listen.span().start, format!("route {name:?}: listen {e}")))?;
        let upstream = Upstream::parse(r.upstream.get_ref())
            .map_err(|e| at(r.upstream.span().start, format!("route {name:?}: {e}")))?;
        if routes.iter().any(|(o, _)| o.name == name) {
            return Err(at(
                r.name.span().start,
                format!("route name {name:?} is used twice"),
            ));
        }
        let lines = RouteLines {
            name: line_of(text, r.name.span().start),
            listen: line_of(text, r.listen.span().start),
        };
        routes.push((
            RouteSpec {
                name,
                listen,
                upstream,
            },
            lines,
        ));
    }

    Ok(ConfigFile {
        slow_ttft_ms,
        api,
        db,
        allow_remote: raw.allow_remote,
        notifications: raw.notifications,
        notify_settled: raw.notify_settled,
        idle_timeout,
        retention_days,
        max_db_mb,
        otlp_endpoint,
        proxy: ProxySettings {
            head_timeout,
            max_head_kib,
            max_connections,
        },
        capture: raw.capture,
        capture_interface,
        routes: routes.iter().map(|(r, _)| r.clone()).collect(),
        origin: Some(Origin {
            file: file_name.to_string(),
            api_line,
            routes,
        }),
    })
}

/// A count that must be at least 1, with the byte offset to blame.
fn at_least_one(v: Option<Spanned<u64>>, key: &str) -> Result<Option<u64>, (usize, String)> {
    match v {
        Some(v) if *v.get_ref() == 0 => Err((v.span().start, format!("{key} must be at least 1"))),
        v => Ok(v.map(Spanned::into_inner)),
    }
}

/// An OTLP/HTTP collector's base URL, checked by the exporter's own rule
/// ([`crate::model::endpoint::otlp_metrics_url`]), so the file and
/// `--otlp-endpoint` refuse a bad endpoint before anything starts, naming
/// the line or the flag. Returns the endpoint as written (trimmed).
pub fn check_otlp_endpoint(text: &str) -> Result<String, String> {
    crate::model::endpoint::otlp_metrics_url(text)?;
    Ok(text.trim().to_string())
}

/// Puts the key (or table header) of the offending line in front of a TOML
/// parser message that doesn't name it, so "invalid type: string \"yes\",
/// expected a boolean" reads "notifications: invalid type: ...". A single
/// `[route]` table gets a hint, since `[[route]]` is what was meant.
fn with_key(text: &str, offset: usize, message: &str) -> String {
    let start = text[..offset.min(text.len())]
        .rfind('\n')
        .map_or(0, |i| i + 1);
    let line = text[start..].lines().next().unwrap_or("").trim();
    if line == "[route]" {
        return "write [[route]] (double brackets): each route is one entry of a list".into();
    }
    let context = if line.starts_with('#') {
        String::new()
    } else if line.starts_with('[') {
        line.rfind(']')
            .map_or(line, |end| &line[..=end])
            .to_string()
    } else if let Some((key, _)) = line.split_once('=') {
        key.trim().trim_matches('"').to_string()
    } else {
        String::new()
    };
    // serde speaks Rust types; users read TOML.
    let message = message.replace("expected u64", "expected a whole number of 0 or more");
    if context.is_empty() || message.contains(&format!("`{context}`")) {
        message
    } else {
        format!("{context}: {message}")
    }
}

/// Reads and parses a config file. A relative `db` path is taken relative
/// to the config file's directory (where a user reading the file expects it),
/// and a leading `~/` means the home directory.
pub fn load_config(path: &Path) -> Result<ConfigFile, ConfigError> {
    let name = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
        file: name.clone(),
        source,
    })?;
    let mut file = parse_config(&text, &name)?;
    if let Some(DbSetting::File(p)) = &mut file.db {
        *p = anchor_path(
            p,
            path.parent(),
            env_var("HOME").map(PathBuf::from).as_deref(),
        );
    }
    Ok(file)
}

/// `~/x` → home/x; relative → base/x; absolute unchanged.
fn anchor_path(p: &Path, base: Option<&Path>, home: Option<&Path>) -> PathBuf {
    if let (Ok(rest), Some(home)) = (p.strip_prefix("~"), home) {
        return home.join(rest);
    }
    match base {
        Some(base) if p.is_relative() => base.join(p),
        _ => p.to_path_buf(),
    }
}

/// Where a setting came from, for error messages.
enum Source<'a> {
    Flag(&'a str),
    Line(usize),
    Default,
}

/// Merges defaults < config file < flags and validates the result.
///
/// Choices:
/// - Routes given as flags replace the file's routes rather than add to them,
///   so a one-off `--route` isn't mixed with (and doesn't collide with) the
///   file's.
/// - `allow_remote` is on if either the flag or the file says so.
/// - `--db` together with `--no-db` is a usage error.
/// - Two listeners collide when their ports match and their addresses are
///   equal or either is a wildcard (0.0.0.0 / ::), because binding would fail
///   the same way. Port 0 ("any free port") never collides.
pub fn resolve(file: Option<ConfigFile>, flags: CliOverrides) -> Result<Settings, ConfigError> {
    let file = file.unwrap_or_default();
    let origin = file.origin.clone();
    let file_name = origin
        .as_ref()
        .map(|o| o.file.clone())
        .unwrap_or_else(|| "config".into());
    let err_at = |src: &Source<'_>, message: String| match src {
        Source::Flag(flag) => ConfigError::Flag {
            flag: (*flag).to_string(),
            message,
        },
        Source::Line(line) => ConfigError::AtLine {
            file: file_name.clone(),
            line: *line,
            message,
        },
        Source::Default => ConfigError::InFile {
            file: file_name.clone(),
            message,
        },
    };

    if flags.no_db && flags.db.is_some() {
        return Err(ConfigError::Flag {
            flag: "--no-db".into(),
            message: "can't be combined with --db".into(),
        });
    }
    for (flag, value) in [
        ("--slow-ttft-ms", flags.slow_ttft_ms),
        ("--retention-days", flags.retention_days),
        ("--max-db-mb", flags.max_db_mb),
        ("--max-head-kib", flags.proxy.max_head_kib),
        ("--max-connections", flags.proxy.max_connections),
    ] {
        if value == Some(0) {
            return Err(ConfigError::Flag {
                flag: flag.into(),
                message: "must be at least 1".into(),
            });
        }
    }
    if let Some(url) = &flags.otlp_endpoint {
        check_otlp_endpoint(url).map_err(|message| ConfigError::Flag {
            flag: "--otlp-endpoint".into(),
            message,
        })?;
    }

    let allow_remote = flags.allow_remote || file.allow_remote.unwrap_or(false);
    let remote_hint = if origin.is_some() {
        " (or allow_remote = true in the config file)"
    } else {
        ""
    };

    let (api, api_src) = match (flags.api, file.api) {
        (Some(a), _) => (a, Source::Flag("--api")),
        (None, Some(a)) => (
            a,
            origin
                .as_ref()
                .and_then(|o| o.api_line)
                .map_or(Source::Default, Source::Line),
        ),
        (None, None) => (DEFAULT_API, Source::Default),
    };
    if !allow_remote && !api.ip().is_loopback() {
        return Err(err_at(
            &api_src,
            format!("api: listening on {api} needs --allow-remote{remote_hint}"),
        ));
    }

    let flag_routes = !flags.routes.is_empty();
    let routes = if flag_routes {
        flags.routes
    } else {
        file.routes
    };
    for (i, route) in routes.iter().enumerate() {
        let lines = if flag_routes {
            None
        } else {
            origin
                .as_ref()
                .and_then(|o| o.routes.iter().find(|(r, _)| r == route).map(|(_, l)| l))
        };
        let flag = format!("--route {}", route.name);
        let name_src = lines.map_or(Source::Flag(&flag), |l| Source::Line(l.name));
        let listen_src = lines.map_or(Source::Flag(&flag), |l| Source::Line(l.listen));
        let name = &route.name;
        let listen = route.listen;

        if routes[..i].iter().any(|r| r.name == *name) {
            return Err(err_at(
                &name_src,
                format!("route name {name:?} is used twice"),
            ));
        }
        if !allow_remote && !listen.ip().is_loopback() {
            return Err(err_at(
                &listen_src,
                format!("route {name:?}: listening on {listen} needs --allow-remote{remote_hint}"),
            ));
        }
        if collides(listen, api) {
            return Err(err_at(
                &listen_src,
                format!(
                    "route {name:?}: listen address {listen} is the control API's address ({api})"
                ),
            ));
        }
        if let Some(other) = routes[..i].iter().find(|r| collides(r.listen, listen)) {
            return Err(err_at(
                &listen_src,
                format!(
                    "route {name:?}: listen address {listen} is already used by route {:?}",
                    other.name
                ),
            ));
        }
    }

    let db = if flags.no_db {
        DbSetting::None
    } else if let Some(p) = flags.db {
        DbSetting::File(p)
    } else {
        file.db.unwrap_or(DbSetting::Default)
    };

    Ok(Settings {
        routes,
        api,
        db,
        slow_ttft_ms: flags
            .slow_ttft_ms
            .or(file.slow_ttft_ms)
            .unwrap_or(DEFAULT_SLOW_TTFT_MS),
        json: flags.json,
        allow_remote,
        notify_settled: file.notify_settled.unwrap_or(false),
        notifications: file.notifications.unwrap_or(true),
        idle_timeout: flags.idle_timeout.or(file.idle_timeout),
        retention_days: flags
            .retention_days
            .or(file.retention_days)
            .unwrap_or(DEFAULT_RETENTION_DAYS),
        max_db_mb: flags
            .max_db_mb
            .or(file.max_db_mb)
            .unwrap_or(DEFAULT_MAX_DB_MB),
        otlp_endpoint: flags.otlp_endpoint.or(file.otlp_endpoint),
        proxy: flags.proxy.or(file.proxy),
        capture: flags.capture || file.capture.unwrap_or(false),
        capture_interface: flags
            .capture_interface
            .or(file.capture_interface)
            .unwrap_or_else(|| DEFAULT_CAPTURE_INTERFACE.to_owned()),
        capture_routes: flags.capture_routes,
    })
}

/// Parses an idle timeout (`"90s"`, `"5m"`, `"1h 30m"`): a humantime
/// duration above zero. The config key and `--idle-timeout` share it.
pub fn parse_idle_timeout(text: &str) -> Result<std::time::Duration, String> {
    parse_duration(text).and_then(|d| {
        if d.is_zero() {
            Err("must be above zero (leave it out to never cut a stream)".into())
        } else {
            Ok(d)
        }
    })
}

/// Parses a head timeout (`head_timeout`, `--head-timeout`): a humantime
/// duration above zero.
pub fn parse_head_timeout(text: &str) -> Result<std::time::Duration, String> {
    parse_duration(text).and_then(|d| {
        if d.is_zero() {
            Err("must be above zero (leave it out for the default, 60s)".into())
        } else {
            Ok(d)
        }
    })
}

fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    humantime::parse_duration(text.trim())
        .map_err(|e| format!("{text:?} is not a duration such as \"90s\" or \"5m\" ({e})"))
}

/// Whether binding both addresses would clash. See [`resolve`].
fn collides(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() != 0
        && a.port() == b.port()
        && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

/// Writes the config file (the tray's settings view saves here): every field
/// that is set, routes as `[[route]]` tables. Comments in an existing file
/// are not preserved. The parent directory is created if needed; the file is
/// written beside the target and renamed over it (so a crash never leaves a
/// half-written config) with user-only permissions (0600 on unix), because
/// it describes the user's local setup.
pub fn save_config(path: &Path, file: &ConfigFile) -> std::io::Result<()> {
    let text = format!(
        "# speedtap configuration (written by speedtap; comments are not kept)\n{}",
        file.to_toml()
    );
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    // Directories it creates are user-only too (0700), as the data dir is.
    let mut dir_builder = std::fs::DirBuilder::new();
    dir_builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        dir_builder.mode(0o700);
    }
    dir_builder.create(&dir)?;
    let file_name = path
        .file_name()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "no file name"))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(file_name);
    tmp_name.push(format!(".tmp{}", std::process::id()));
    let tmp = dir.join(tmp_name);

    let result = (|| {
        use std::io::Write;
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create(true).truncate(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            options.mode(0o600);
        }
        let mut f = options.open(&tmp)?;
        #[cfg(unix)]
        {
            // `mode` only applies when the file is created; a stale temp file
            // could have other bits.
            use std::os::unix::fs::PermissionsExt;
            f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        }
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

// ---------------------------------------------------------------------------
// Default paths
// ---------------------------------------------------------------------------

fn env_var(name: &str) -> Option<std::ffi::OsString> {
    std::env::var_os(name).filter(|v| !v.is_empty())
}

/// Picks a per-user directory from environment variables, without a `dirs`
/// dependency: `$XDG_*` when set to an absolute path (on every platform, so
/// it can be overridden), else `%APPDATA%`/`%LOCALAPPDATA%` on Windows, else
/// `$HOME/<home_rel>`, else the current directory.
fn user_dir(
    env: &dyn Fn(&str) -> Option<std::ffi::OsString>,
    xdg: &str,
    windows: &str,
    home_rel: &str,
) -> PathBuf {
    if let Some(p) = env(xdg).map(PathBuf::from).filter(|p| p.is_absolute()) {
        return p;
    }
    if cfg!(windows) {
        if let Some(p) = env(windows) {
            return PathBuf::from(p);
        }
    }
    match env("HOME").or_else(|| env("USERPROFILE")) {
        Some(home) => PathBuf::from(home).join(home_rel),
        None => PathBuf::from("."),
    }
}

fn config_path_with(env: &dyn Fn(&str) -> Option<std::ffi::OsString>) -> PathBuf {
    user_dir(env, "XDG_CONFIG_HOME", "APPDATA", ".config")
        .join("speedtap")
        .join("speedtap.toml")
}

fn db_path_with(env: &dyn Fn(&str) -> Option<std::ffi::OsString>) -> PathBuf {
    user_dir(env, "XDG_DATA_HOME", "LOCALAPPDATA", ".local/share")
        .join("speedtap")
        .join("speedtap.sqlite3")
}

/// `$XDG_CONFIG_HOME/speedtap/speedtap.toml`, else
/// `~/.config/speedtap/speedtap.toml` (`%APPDATA%\speedtap\speedtap.toml` on
/// Windows). macOS uses the XDG layout too: one place to document.
pub fn default_config_path() -> PathBuf {
    config_path_with(&env_var)
}

/// `$XDG_DATA_HOME/speedtap/speedtap.sqlite3`, else
/// `~/.local/share/speedtap/speedtap.sqlite3` (`%LOCALAPPDATA%\speedtap\...`
/// on Windows).
pub fn default_db_path() -> PathBuf {
    db_path_with(&env_var)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;

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

    #[test]
    fn line_of_counts_from_one() {
        let t = "a\nb\nc";
        assert_eq!(line_of(t, 0), 1);
        assert_eq!(line_of(t, 2), 2);
        assert_eq!(line_of(t, 4), 3);
        assert_eq!(line_of(t, 100), 3);
    }

    #[test]
    fn paths_follow_xdg_then_home() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                vars.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| OsString::from(*v))
            }
        };
        let xdg = env(&[
            ("XDG_CONFIG_HOME", "/cfg"),
            ("XDG_DATA_HOME", "/data"),
            ("HOME", "/home/u"),
        ]);
        assert_eq!(
            config_path_with(&xdg),
            PathBuf::from("/cfg/speedtap/speedtap.toml")
        );
        assert_eq!(
            db_path_with(&xdg),
            PathBuf::from("/data/speedtap/speedtap.sqlite3")
        );
        if !cfg!(windows) {
            // A relative XDG value is ignored, as the XDG spec says.
            let home = env(&[("XDG_CONFIG_HOME", "rel"), ("HOME", "/home/u")]);
            assert_eq!(
                config_path_with(&home),
                PathBuf::from("/home/u/.config/speedtap/speedtap.toml")
            );
            assert_eq!(
                db_path_with(&home),
                PathBuf::from("/home/u/.local/share/speedtap/speedtap.sqlite3")
            );
        }
    }

    #[test]
    fn db_paths_are_anchored_to_the_config_dir() {
        let base = Path::new("/etc/speedtap");
        let home = Path::new("/home/u");
        assert_eq!(
            anchor_path(Path::new("x.db"), Some(base), Some(home)),
            PathBuf::from("/etc/speedtap/x.db")
        );
        assert_eq!(
            anchor_path(Path::new("/abs.db"), Some(base), Some(home)),
            PathBuf::from("/abs.db")
        );
        assert_eq!(
            anchor_path(Path::new("~/d/x.db"), Some(base), Some(home)),
            PathBuf::from("/home/u/d/x.db")
        );
    }

    #[test]
    fn resolve_names_the_file_line_for_file_routes_and_the_flag_for_flag_routes() {
        let text = "[[route]]\nname = \"a\"\nlisten = \"0.0.0.0:9001\"\nupstream = \"http://127.0.0.1:9000\"\n";
        let file = parse_config(text, "s.toml").unwrap();
        let e = resolve(Some(file), CliOverrides::default())
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("s.toml line 3: "), "{e}");
        assert!(
            e.contains("listening on 0.0.0.0:9001 needs --allow-remote"),
            "{e}"
        );

        let flags = CliOverrides {
            routes: vec![parse_route_flag("b=0.0.0.0:9001=http://127.0.0.1:9000").unwrap()],
            ..Default::default()
        };
        let e = resolve(None, flags).unwrap_err().to_string();
        assert_eq!(
            e,
            "--route b: route \"b\": listening on 0.0.0.0:9001 needs --allow-remote"
        );
    }

    #[test]
    fn wildcard_listeners_collide_with_specific_ones_on_the_same_port() {
        let a: SocketAddr = "0.0.0.0:80".parse().unwrap();
        let b: SocketAddr = "127.0.0.1:80".parse().unwrap();
        let c: SocketAddr = "127.0.0.2:80".parse().unwrap();
        let z: SocketAddr = "127.0.0.1:0".parse().unwrap();
        assert!(collides(a, b) && collides(b, a));
        assert!(!collides(b, c));
        assert!(!collides(z, z));
    }
}
