//! Start at login, the freedesktop way (the XDG Autostart spec): a desktop
//! entry named `speedtap.desktop` in an `autostart` folder. The Debian
//! package installs one for everybody in `/etc/xdg/autostart/` (so it is
//! on by default after install); a user's own entry in
//! `$XDG_CONFIG_HOME/autostart/` (default `~/.config/autostart/`) overrides
//! it, and an entry with `Hidden=true` switches it off.
//!
//! So turning it on writes the user's entry (or, when the system entry
//! applies, removes a user override), and turning it off removes the user's
//! entry (or, when a system entry exists, writes a `Hidden=true` override).
//! The state is what the files say: no setting to drift from them.
//!
//! Written here instead of with `tauri-plugin-autostart`: that plugin
//! writes `~/.config/autostart` from the home directory, ignoring
//! `XDG_CONFIG_HOME` (which the tests and some desktops set), knows
//! nothing of a system-wide entry, and so cannot express "on by default
//! after install"; the few lines below need no new dependency.

use std::io;
use std::path::{Path, PathBuf};

/// The entry's file name, in every autostart folder.
pub const ENTRY: &str = "speedtap.desktop";

/// Where the entries live.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoginItem {
    /// The user's autostart folder.
    pub user_dir: PathBuf,
    /// The system's autostart folders, most important first.
    pub system_dirs: Vec<PathBuf>,
    /// What the entry runs (with `--hidden`: the tray only, no window).
    pub exec: Vec<String>,
}

impl LoginItem {
    /// The folders from the environment (`XDG_CONFIG_HOME`, `HOME`,
    /// `XDG_CONFIG_DIRS`), running this executable with `extra` arguments.
    pub fn from_env(extra: &[String]) -> Option<Self> {
        let var = |v: &str| {
            std::env::var_os(v)
                .filter(|s| !s.is_empty())
                .map(PathBuf::from)
        };
        let config_home =
            var("XDG_CONFIG_HOME").or_else(|| var("HOME").map(|h| h.join(".config")))?;
        let system = std::env::var("XDG_CONFIG_DIRS")
            .ok()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "/etc/xdg".into());
        let exe = std::env::current_exe().ok()?;
        let mut exec = vec![exe.to_string_lossy().into_owned()];
        exec.extend(extra.iter().cloned());
        exec.push("--hidden".into());
        Some(LoginItem {
            user_dir: config_home.join("autostart"),
            system_dirs: system
                .split(':')
                .filter(|s| !s.is_empty())
                .map(|d| Path::new(d).join("autostart"))
                .collect(),
            exec,
        })
    }

    pub fn user_entry(&self) -> PathBuf {
        self.user_dir.join(ENTRY)
    }

    fn system_entry(&self) -> Option<PathBuf> {
        self.system_dirs
            .iter()
            .map(|d| d.join(ENTRY))
            .find(|p| p.is_file())
    }

    /// True when the session will start speedtap at login.
    pub fn is_enabled(&self) -> bool {
        let user = self.user_entry();
        if user.is_file() {
            return !is_hidden(&user);
        }
        self.system_entry().is_some_and(|p| !is_hidden(&p))
    }

    /// Turns start at login on or off (see the module docs).
    pub fn set_enabled(&self, on: bool) -> io::Result<()> {
        let user = self.user_entry();
        let system_on = self.system_entry().is_some_and(|p| !is_hidden(&p));
        match (on, system_on) {
            (true, true) | (false, false) => match std::fs::remove_file(&user) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            },
            (true, false) => write_entry(&user, &entry_text(&self.exec, false)),
            (false, true) => write_entry(&user, &entry_text(&self.exec, true)),
        }
    }
}

fn write_entry(path: &Path, text: &str) -> io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension("desktop.tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

/// `Hidden=true` in the `[Desktop Entry]` group (the spec's "deleted").
fn is_hidden(path: &Path) -> bool {
    std::fs::read_to_string(path).is_ok_and(|text| {
        text.lines()
            .map(str::trim)
            .any(|l| l.replace(' ', "").eq_ignore_ascii_case("hidden=true"))
    })
}

/// The desktop entry's text.
pub fn entry_text(exec: &[String], hidden: bool) -> String {
    let exec = exec.iter().map(|a| quote(a)).collect::<Vec<_>>().join(" ");
    let mut text = format!(
        "[Desktop Entry]\n\
         Type=Application\n\
         Name=speedtap\n\
         Comment=Live time to first token and tokens per second of local LLM calls, in the tray\n\
         Exec={exec}\n\
         Icon=speedtap-desktop\n\
         Terminal=false\n\
         X-GNOME-Autostart-enabled=true\n"
    );
    if hidden {
        text.push_str("Hidden=true\n");
    }
    text
}

/// An `Exec` argument: quoted when it holds anything but plain characters
/// (the spec's rules: inside double quotes, `"`, `` ` ``, `$` and `\` are
/// escaped with a backslash; `%` is doubled everywhere).
fn quote(arg: &str) -> String {
    let arg = arg.replace('%', "%%");
    if !arg.is_empty()
        && arg
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-=:,+@".contains(c))
    {
        return arg;
    }
    let mut out = String::from("\"");
    for c in arg.chars() {
        if matches!(c, '"' | '`' | '$' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(name: &str) -> (LoginItem, PathBuf) {
        let root =
            std::env::temp_dir().join(format!("speedtap-autostart-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let item = LoginItem {
            user_dir: root.join("home/autostart"),
            system_dirs: vec![root.join("etc/autostart")],
            exec: vec!["/usr/bin/speedtap-desktop".into(), "--hidden".into()],
        };
        (item, root)
    }

    #[test]
    fn turning_it_on_writes_the_users_entry_and_off_removes_it() {
        let (item, _root) = item("user");
        assert!(!item.is_enabled());
        item.set_enabled(true).unwrap();
        let text = std::fs::read_to_string(item.user_entry()).unwrap();
        assert!(
            text.contains("Exec=/usr/bin/speedtap-desktop --hidden\n"),
            "{text}"
        );
        assert!(item.is_enabled());
        item.set_enabled(false).unwrap();
        assert!(!item.user_entry().exists());
        assert!(!item.is_enabled());
        // Off when already off is fine.
        item.set_enabled(false).unwrap();
    }

    #[test]
    fn the_installed_system_entry_is_on_until_a_user_hides_it() {
        let (item, root) = item("system");
        write_entry(
            &root.join("etc/autostart").join(ENTRY),
            &entry_text(&item.exec, false),
        )
        .unwrap();
        assert!(item.is_enabled(), "on by default after install");
        item.set_enabled(false).unwrap();
        let text = std::fs::read_to_string(item.user_entry()).unwrap();
        assert!(text.contains("Hidden=true"), "{text}");
        assert!(!item.is_enabled());
        item.set_enabled(true).unwrap();
        assert!(
            !item.user_entry().exists(),
            "the system entry applies again"
        );
        assert!(item.is_enabled());
    }

    #[test]
    fn arguments_with_spaces_or_specials_are_quoted() {
        assert_eq!(quote("/opt/speed tap/bin"), "\"/opt/speed tap/bin\"");
        assert_eq!(quote("a$b"), "\"a\\$b\"");
        assert_eq!(quote("50%"), "\"50%%\"");
        assert_eq!(quote("--config=/x/y.toml"), "--config=/x/y.toml");
    }
}
