//! The tray entries of the app itself rather than of the engine's calls,
//! added to the [`TrayView`] that [`crate::tray_model`] computes: a line
//! per port the app could not have (at the top, where it is seen first),
//! with the label saying so while nothing else is going on, and the
//! "Start at login" check item after "Pause notifications". Pure, so the
//! menu's shape is unit-tested without a display.

use crate::ports::PortConflict;
use crate::tray_model::{EntryKind, MenuEntry, TrayView, ID_PAUSE};

/// "Start at login" (a check item).
pub const ID_AUTOSTART: &str = "start-at-login";
/// A port conflict's line; the conflict's `what` follows.
pub const ID_CONFLICT_PREFIX: &str = "conflict:";

/// Adds the app's entries to `view`. `autostart` is `None` where start at
/// login is not available (no home directory).
pub fn decorate(view: &mut TrayView, conflicts: &[PortConflict], autostart: Option<bool>) {
    if let Some(on) = autostart {
        let at = view
            .menu
            .iter()
            .position(|e| e.id == ID_PAUSE)
            .map_or(view.menu.len(), |i| i + 1);
        view.menu.insert(
            at,
            MenuEntry {
                id: ID_AUTOSTART.into(),
                kind: EntryKind::Check(on),
                text: "Start at login".into(),
            },
        );
    }
    if conflicts.is_empty() {
        return;
    }
    let lines = conflicts.iter().map(|c| MenuEntry {
        id: format!("{ID_CONFLICT_PREFIX}{}", c.what),
        kind: EntryKind::Info,
        text: c.menu_line(),
    });
    view.menu.splice(0..0, lines);
    if view.title == "idle" {
        view.title = match conflicts {
            [one] => format!("port {} taken", one.port),
            many => format!("{} ports taken", many.len()),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tray_model::{TrayModel, ViewInputs};
    use tokio::time::Instant;

    fn view() -> TrayView {
        TrayModel::new().view(
            Instant::now(),
            &ViewInputs {
                paused: false,
                routes: &[],
                slow_ttft_ms: 5000,
                servers: &[],
                loaded: &[],
                now_unix_ms: 0,
            },
        )
    }

    fn conflict(what: &str, port: u16) -> PortConflict {
        let err = std::io::Error::from(std::io::ErrorKind::AddrInUse);
        let mut c = PortConflict::find(what, ([127, 0, 0, 1], port).into(), &err, None);
        c.holder = None;
        c
    }

    #[test]
    fn start_at_login_follows_pause_notifications() {
        let mut v = view();
        decorate(&mut v, &[], Some(true));
        let i = v.menu.iter().position(|e| e.id == ID_PAUSE).unwrap();
        assert_eq!(v.menu[i + 1].id, ID_AUTOSTART);
        assert_eq!(v.menu[i + 1].kind, EntryKind::Check(true));
        assert_eq!(v.title, "idle");

        let mut v = view();
        decorate(&mut v, &[], None);
        assert!(v.menu.iter().all(|e| e.id != ID_AUTOSTART));
    }

    #[test]
    fn a_taken_port_is_the_first_line_and_the_idle_label() {
        let mut v = view();
        decorate(&mut v, &[conflict("route ollama", 8081)], Some(false));
        assert_eq!(v.menu[0].text, "Port 8081 taken (route ollama)");
        assert_eq!(v.menu[0].kind, EntryKind::Info);
        assert_eq!(v.title, "port 8081 taken");

        let mut v = view();
        decorate(
            &mut v,
            &[conflict("route a", 1), conflict("control API", 2)],
            None,
        );
        assert_eq!(v.title, "2 ports taken");
        assert_eq!(v.menu[1].text, "Port 2 taken (control API)");
    }

    #[test]
    fn a_rate_beats_the_conflict_in_the_label() {
        let mut v = view();
        v.title = "41.7 tok/s".into();
        decorate(&mut v, &[conflict("route a", 1)], None);
        assert_eq!(v.title, "41.7 tok/s");
        assert!(v.menu[0].text.starts_with("Port 1 taken"));
    }
}
