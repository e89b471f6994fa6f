//! The dashboard window, in a process of its own. A WebKit webview costs
//! two helper processes (WebKit's web and network processes), GTK's and
//! WebKit's libraries and most of the app's footprint; the tray, the
//! notifications and the engine need none of it, and a tray app mostly
//! runs with its window closed. So the tray process never loads them:
//! opening the window starts `speedtap-window --window-of <dashboard URL>`
//! (installed beside `speedtap-desktop`), which shows the dashboard the
//! control API serves, and closing the window ends that process, WebKit's
//! with it. Nothing of the window's stays behind in the tray process.
//!
//! Opening while a window is up starts a second window process that finds
//! the first one's socket, asks it to show itself and exits: one window,
//! however many times it is opened, with no state to go stale here.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::process::{Command, Stdio};

/// The window's title (the desktop tests find it by this name).
pub const TITLE: &str = "speedtap";
/// The window's label (its capability names it).
pub const MAIN_WINDOW: &str = "main";
/// The window process's program, beside this one.
pub const WINDOW_PROGRAM: &str = "speedtap-window";

/// The window process's flag naming the dashboard to show.
pub const WINDOW_FLAG: &str = "--window-of";
/// The window process's flag: exit when standard input ends.
pub const ENDS_WITH_STDIN_FLAG: &str = "--ends-with-stdin";

/// The dashboard's address for the window: the control API's, with an
/// unspecified listen address (`0.0.0.0`, `::`) reached over loopback, by
/// the names the window's capability grants (`127.0.0.1`, `localhost`).
pub fn dashboard_url(api: SocketAddr) -> String {
    match api.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => {
            format!(
                "http://{}/",
                SocketAddr::new(Ipv4Addr::LOCALHOST.into(), api.port())
            )
        }
        IpAddr::V6(ip) if ip.is_unspecified() || ip == Ipv6Addr::LOCALHOST => {
            format!("http://localhost:{}/", api.port())
        }
        _ => format!("http://{api}/"),
    }
}

/// The window process's command line: its program, the dashboard's URL
/// and the config file (which names the tray's single-instance socket).
pub fn command_line(exe: &Path, url: &str, config: &Path) -> Command {
    let mut command = Command::new(exe);
    command
        .arg(WINDOW_FLAG)
        .arg(url)
        .arg("--config")
        .arg(config)
        .arg(ENDS_WITH_STDIN_FLAG)
        .stdin(Stdio::piped());
    command
}

/// Shows the window: starts a window process (which shows the one already
/// open instead, if there is one) and reaps it when it ends, on a thread
/// that sleeps in `wait` (no wake-ups).
///
/// The window process ends with the tray process, however that ends (Quit,
/// a signal, a crash): its standard input is a pipe whose only writer is
/// this process, so it reads end-of-file once the tray process is gone
/// ([`ENDS_WITH_STDIN_FLAG`]). (`PR_SET_PDEATHSIG` was tried first: the
/// window process was sent its signal while it ran, when a second window
/// process started by another thread ended.)
pub fn open(api: Option<SocketAddr>, config: &Path) {
    let Some(api) = api else {
        tracing::warn!("no window: the control API is not listening");
        return;
    };
    let exe = match std::env::current_exe() {
        Ok(exe) => exe.with_file_name(WINDOW_PROGRAM),
        Err(e) => {
            tracing::warn!("no window: cannot find this program's path: {e}");
            return;
        }
    };
    let mut command = command_line(&exe, &dashboard_url(api), config);
    let started = std::thread::Builder::new()
        .name("window-process".into())
        .spawn(move || match command.spawn() {
            // `wait` would close the child's stdin first: keep the pipe's
            // write end open until the window process has ended.
            Ok(mut child) => {
                let pipe = child.stdin.take();
                let _ = child.wait();
                drop(pipe);
            }
            Err(e) => eprintln!(
                "speedtap-desktop: cannot open the window ({}): {e}",
                exe.display()
            ),
        });
    if let Err(e) = started {
        tracing::warn!("cannot open the window: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dashboard_url_reaches_an_unspecified_listen_address_over_loopback() {
        assert_eq!(
            dashboard_url("0.0.0.0:7878".parse().unwrap()),
            "http://127.0.0.1:7878/"
        );
        assert_eq!(
            dashboard_url("[::]:7878".parse().unwrap()),
            "http://localhost:7878/"
        );
        assert_eq!(
            dashboard_url("127.0.0.1:9000".parse().unwrap()),
            "http://127.0.0.1:9000/"
        );
    }

    #[test]
    fn the_window_process_is_its_program_with_the_url_and_the_config() {
        let command = command_line(
            Path::new("/usr/bin/speedtap-window"),
            "http://127.0.0.1:7878/",
            Path::new("/home/u/.config/speedtap/config.toml"),
        );
        let args: Vec<_> = command.get_args().map(|a| a.to_string_lossy()).collect();
        assert_eq!(
            args,
            [
                WINDOW_FLAG,
                "http://127.0.0.1:7878/",
                "--config",
                "/home/u/.config/speedtap/config.toml",
                ENDS_WITH_STDIN_FLAG,
            ]
        );
    }
}
