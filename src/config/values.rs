//! The settings' value types and their checks. Each check is written once
//! here and used by every way a value arrives: the config file (through
//! serde, so toml names the offending line), the `speedtap run` flags
//! (through [`super::resolve()`], naming the flag) and the settings form the
//! tray saves (through the host).

use std::path::PathBuf;
use std::time::Duration;

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// What a count of 0 is told, after the key (`max_db_mb must be at least
/// 1`) or the flag (`--max-db-mb: must be at least 1`).
pub const AT_LEAST_ONE: &str = "must be at least 1";

/// What a `db` that is neither a path nor a boolean is told, after the key.
pub const DB_SHAPE: &str = "must be a file path, or false for memory only";

/// A count that must be at least 1 (`slow_ttft_ms`, `retention_days`,
/// `max_db_mb`, `max_head_kib`, `max_connections`): 0 would mean "never"
/// or "nothing", which is what leaving the key out is for.
pub fn at_least_one(n: u64) -> Result<u64, &'static str> {
    if n == 0 {
        Err(AT_LEAST_ONE)
    } else {
        Ok(n)
    }
}

/// [`at_least_one`] as a flag's check (the settings table hands it the
/// flag's value by reference).
pub fn check_count(n: &u64) -> Result<u64, &'static str> {
    at_least_one(*n)
}

/// A duration the user writes in whole milliseconds (`slow_ttft_ms`): the
/// file and the flag hold the number, the resolved settings and the engine
/// the [`Duration`]. Compares equal to its number of milliseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Millis(Duration);

impl Millis {
    pub const fn from_ms(ms: u64) -> Millis {
        Millis(Duration::from_millis(ms))
    }

    /// The duration itself, as the engine uses it.
    pub fn duration(self) -> Duration {
        self.0
    }

    /// Whole milliseconds, as the file and the control API write it.
    pub fn as_ms(self) -> u64 {
        u64::try_from(self.0.as_millis()).unwrap_or(u64::MAX)
    }
}

impl PartialEq<u64> for Millis {
    fn eq(&self, ms: &u64) -> bool {
        self.as_ms() == *ms
    }
}

/// Where settled calls and calibration are stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DbSetting {
    /// `speedtap.sqlite3` in the platform data dir ([`super::default_db_path`]).
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
            DbSetting::Default => Some(super::default_db_path()),
            DbSetting::File(p) => Some(p.clone()),
            DbSetting::None => None,
        }
    }
}

/// `db = "path"`, `db = false` (memory only) or `db = true` (the default
/// file); anything else is refused with [`DB_SHAPE`].
impl<'de> Deserialize<'de> for DbSetting {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match toml::Value::deserialize(d)? {
            toml::Value::Boolean(true) => Ok(DbSetting::Default),
            toml::Value::Boolean(false) => Ok(DbSetting::None),
            toml::Value::String(s) if !s.trim().is_empty() => Ok(DbSetting::File(PathBuf::from(s))),
            _ => Err(D::Error::custom(DB_SHAPE)),
        }
    }
}

impl Serialize for DbSetting {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            DbSetting::Default => s.serialize_bool(true),
            DbSetting::None => s.serialize_bool(false),
            DbSetting::File(p) => s.serialize_str(&p.to_string_lossy()),
        }
    }
}

/// Parses an idle timeout (`"90s"`, `"5m"`, `"1h 30m"`): a humantime
/// duration above zero. The config key and `--idle-timeout` share it.
pub fn parse_idle_timeout(text: &str) -> Result<Duration, String> {
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
pub fn parse_head_timeout(text: &str) -> Result<Duration, String> {
    parse_duration(text).and_then(|d| {
        if d.is_zero() {
            Err("must be above zero (leave it out for the default, 60s)".into())
        } else {
            Ok(d)
        }
    })
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim())
        .map_err(|e| format!("{text:?} is not a duration such as \"90s\" or \"5m\" ({e})"))
}

/// An OTLP/HTTP collector's base URL, checked by the exporter's own rule
/// ([`crate::model::otlp_endpoint::otlp_metrics_url`]), so the file and
/// `--otlp-endpoint` refuse a bad endpoint before anything starts, naming
/// the line or the flag. Returns the endpoint as written (trimmed).
pub fn check_otlp_endpoint(text: &str) -> Result<String, String> {
    crate::model::otlp_endpoint::otlp_metrics_url(text)?;
    Ok(text.trim().to_string())
}

/// The interface to capture: any name but an empty one.
pub fn check_interface(text: &str) -> Result<String, &'static str> {
    if text.trim().is_empty() {
        Err("must name an interface (lo, any, eth0...)")
    } else {
        Ok(text.to_string())
    }
}

// ---------------------------------------------------------------------------
// The checks as serde sees them (`deserialize_with` in the file's keys)
// ---------------------------------------------------------------------------

/// A whole number through [`at_least_one`].
pub(super) fn de_count<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    at_least_one(u64::deserialize(d)?)
        .map(Some)
        .map_err(D::Error::custom)
}

/// Ports to watch (`watch_ports`): each one 1 to 65535.
pub(super) fn de_ports<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u16>>, D::Error> {
    let ports = Vec::<u64>::deserialize(d)?;
    ports
        .into_iter()
        .map(|p| {
            u16::try_from(p)
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| format!("{p} is not a port (1 to 65535)"))
        })
        .collect::<Result<Vec<u16>, String>>()
        .map(Some)
        .map_err(D::Error::custom)
}

/// A string through `check`, whose message toml places at the value.
fn de_text<'de, D, T, E>(
    d: D,
    check: impl FnOnce(&str) -> Result<T, E>,
) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    E: std::fmt::Display,
{
    check(&String::deserialize(d)?)
        .map(Some)
        .map_err(D::Error::custom)
}

pub(super) fn de_idle_timeout<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<Duration>, D::Error> {
    de_text(d, parse_idle_timeout)
}

pub(super) fn de_head_timeout<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<Duration>, D::Error> {
    de_text(d, parse_head_timeout)
}

pub(super) fn de_otlp_endpoint<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<String>, D::Error> {
    de_text(d, check_otlp_endpoint)
}

pub(super) fn de_interface<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    de_text(d, check_interface)
}

/// A listen address (`api`), by the routes' rule.
pub(super) fn de_listen<'de, D: Deserializer<'de>>(d: D) -> Result<std::net::SocketAddr, D::Error> {
    crate::model::route::parse_listen(&String::deserialize(d)?).map_err(D::Error::custom)
}

/// A duration as the file writes it (`"5m"`); `None` is left out.
pub(super) fn humantime_opt<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_str(&humantime::format_duration(*d).to_string()),
        None => s.serialize_none(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_refuse_zero_only() {
        assert_eq!(at_least_one(0), Err(AT_LEAST_ONE));
        assert_eq!(at_least_one(1), Ok(1));
        assert_eq!(at_least_one(u64::MAX), Ok(u64::MAX));
    }

    #[test]
    fn millis_holds_a_duration_and_compares_to_its_number() {
        let m = Millis::from_ms(1234);
        assert_eq!(m.duration(), Duration::from_millis(1234));
        assert_eq!(m.as_ms(), 1234);
        assert_eq!(m, 1234);
    }

    #[test]
    fn durations_refuse_zero_with_their_own_hint() {
        assert_eq!(parse_idle_timeout("5m"), Ok(Duration::from_secs(300)));
        assert!(parse_idle_timeout("0s").unwrap_err().contains("never cut"));
        assert!(parse_head_timeout("0s").unwrap_err().contains("60s"));
        assert!(parse_head_timeout("soon")
            .unwrap_err()
            .contains("is not a duration"));
    }
}
