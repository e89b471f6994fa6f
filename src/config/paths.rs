//! Where the config file and the store live by default, and how a path
//! written in the config file is anchored (relative to the file, `~/` to
//! the home directory).

use std::path::{Path, PathBuf};

pub(super) fn env_var(name: &str) -> Option<std::ffi::OsString> {
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

/// `~/x` → home/x; relative → base/x; absolute unchanged.
pub(super) fn anchor_path(p: &Path, base: Option<&Path>, home: Option<&Path>) -> PathBuf {
    if let (Ok(rest), Some(home)) = (p.strip_prefix("~"), home) {
        return home.join(rest);
    }
    match base {
        Some(base) if p.is_relative() => base.join(p),
        _ => p.to_path_buf(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;

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
}
