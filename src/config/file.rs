//! The config file: reading it ([`parse_config`], [`load_config`]) into the
//! typed [`ConfigFile`], and writing it back ([`save_config`]) when the tray
//! saves its settings view.
//!
//! The TOML is read through the private `FileKeys` (generated, with
//! [`ConfigFile`], from the settings table in [`super::defs`]), whose values check
//! themselves as serde reads them (see [`super::values`]), so toml places
//! every error at its line; routes and the `api` address keep their
//! [`toml::Spanned`] lines, because [`super::resolve()`] checks them again
//! against the flags and still has to name the line.

use std::path::{Path, PathBuf};

use toml::Spanned;

pub use super::defs::ConfigFile;
use super::defs::FileKeys;
use super::entries::{Lines, Origin, RouteEntry, RouteLines};
use super::error::line_of;
use super::paths::{anchor_path, env_var};
use super::values::{DbSetting, AT_LEAST_ONE, DB_SHAPE};
use super::ConfigError;
use crate::model::route::{check_route_name, parse_listen, RouteSpec, Upstream};

impl ConfigFile {
    /// The name the file was parsed under, if it was parsed.
    pub fn file_name(&self) -> Option<&str> {
        self.origin.0.as_ref().map(|o| o.file.as_str())
    }

    /// Serialises to the TOML [`save_config`] writes (and [`parse_config`]
    /// reads back to an equal value).
    pub fn to_toml(&self) -> String {
        // Only strings, integers, booleans and tables: serialising can't fail.
        toml::to_string(self).unwrap_or_default()
    }
}

impl FileKeys {
    /// The typed file, remembering where its values came from: the
    /// table's keys as read, the others as their rules say.
    fn into_file(mut self, routes: Vec<(RouteSpec, RouteLines)>, lines: Lines) -> ConfigFile {
        let table = self.take_table_keys();
        ConfigFile {
            api: self.api.map(|a| a.into_inner().0),
            db: self.db,
            routes: routes.iter().map(|(r, _)| r.clone()).collect(),
            origin: Origin(Some(Lines { routes, ..lines })),
            ..table
        }
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
    let mut keys: FileKeys = toml::from_str(text).map_err(|e| match e.span() {
        Some(span) => at(span.start, with_key(text, span.start, e.message().trim())),
        None => ConfigError::InFile {
            file: file_name.to_string(),
            message: e.message().trim().to_string(),
        },
    })?;
    let routes = read_routes(std::mem::take(&mut keys.route), text, &at)?;
    let lines = Lines {
        file: file_name.to_string(),
        api_line: keys.api.as_ref().map(|a| line_of(text, a.span().start)),
        routes: Vec::new(),
    };
    Ok(keys.into_file(routes, lines))
}

/// Checks each `[[route]]` (name, listen address, upstream, a name used
/// twice), naming the route and the line of the offending entry.
fn read_routes(
    entries: Vec<Spanned<RouteEntry>>,
    text: &str,
    at: &dyn Fn(usize, String) -> ConfigError,
) -> Result<Vec<(RouteSpec, RouteLines)>, ConfigError> {
    let mut routes: Vec<(RouteSpec, RouteLines)> = Vec::with_capacity(entries.len());
    for entry in entries {
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
            upstream: line_of(text, r.upstream.span().start),
        };
        let spec = RouteSpec {
            name,
            listen,
            upstream,
        };
        routes.push((spec, lines));
    }
    Ok(routes)
}

/// Puts the key (or table header) of the offending line in front of a TOML
/// parser message that doesn't name it, so "invalid type: string \"yes\",
/// expected a boolean" reads "notifications: invalid type: ...". A single
/// `[route]` table gets a hint, since `[[route]]` is what was meant. The
/// checks that read as the end of a sentence ([`AT_LEAST_ONE`],
/// [`DB_SHAPE`]) follow the key without a colon: "max_db_mb must be at
/// least 1".
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
    } else if message == AT_LEAST_ONE || message == DB_SHAPE {
        format!("{context} {message}")
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
    create_user_dir(&dir)?;
    let file_name = path
        .file_name()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "no file name"))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(file_name);
    tmp_name.push(format!(".tmp{}", std::process::id()));
    let tmp = dir.join(tmp_name);

    let result = write_user_file(&tmp, text.as_bytes()).and_then(|()| std::fs::rename(&tmp, path));
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Creates `dir` and its parents; directories it creates are user-only
/// (0700), as the data dir is.
fn create_user_dir(dir: &Path) -> std::io::Result<()> {
    let mut dir_builder = std::fs::DirBuilder::new();
    dir_builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        dir_builder.mode(0o700);
    }
    dir_builder.create(dir)
}

/// Writes `bytes` to `path` (replaced), user-only (0600), synced to disk.
fn write_user_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut f = options.open(path)?;
    #[cfg(unix)]
    {
        // `mode` only applies when the file is created; a stale temp file
        // could have other bits.
        use std::os::unix::fs::PermissionsExt;
        f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    }
    f.write_all(bytes)?;
    f.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_that_end_a_sentence_follow_the_key_without_a_colon() {
        let e = parse_config("\nmax_db_mb = 0\n", "s.toml").unwrap_err();
        assert_eq!(e.to_string(), "s.toml line 2: max_db_mb must be at least 1");
        let e = parse_config("db = 5\n", "s.toml").unwrap_err();
        assert_eq!(
            e.to_string(),
            "s.toml line 1: db must be a file path, or false for memory only"
        );
        let e = parse_config("idle_timeout = \"0s\"\n", "s.toml").unwrap_err();
        assert_eq!(
            e.to_string(),
            "s.toml line 1: idle_timeout: must be above zero (leave it out to never cut a stream)"
        );
        let e = parse_config("capture_interface = \" \"\n", "s.toml").unwrap_err();
        assert_eq!(
            e.to_string(),
            "s.toml line 1: capture_interface: must name an interface (lo, any, eth0...)"
        );
        let e = parse_config("\n\napi = \"nowhere\"\n", "s.toml").unwrap_err();
        assert!(e.to_string().starts_with("s.toml line 3: api: "), "{e}");
    }

    #[test]
    fn saved_keys_keep_the_documented_order() {
        let mut file = parse_config(
            "capture = true\nmax_connections = 7\nslow_ttft_ms = 9\nidle_timeout = \"5m\"\n",
            "s.toml",
        )
        .unwrap();
        file.db = Some(DbSetting::None);
        assert_eq!(
            file.to_toml(),
            "slow_ttft_ms = 9\ndb = false\nidle_timeout = \"5m\"\nmax_connections = 7\ncapture = true\n"
        );
    }
}
