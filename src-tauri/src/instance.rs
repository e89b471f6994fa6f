//! One tray app per user and config file: a second launch asks the first
//! to show its window and exits 0.
//!
//! The first instance listens on a Unix socket in Linux's abstract
//! namespace (no file to go stale after a crash: the name goes with the
//! process), named after the user id and the config file, so a second
//! launch finds it before it starts an engine whose ports the first one
//! already holds. Two different config files are two different setups and
//! may run side by side (the desktop tests rely on that).
//!
//! Why not `tauri-plugin-single-instance`: it checks when the Tauri app is
//! built, which here is after the engine has bound its ports, so a second
//! launch would first run into its own ports being taken.
//!
//! The protocol is one line each way: `show\n` (or `hidden\n` for a
//! `--hidden` launch, which only checks) answered by `ok\n`; and
//! `app <JSON>\n`, the window process asking about the tray app itself
//! (its port conflicts, start at login: [`crate::app_commands`]), answered
//! by one line of JSON. The window process lives in a process of its own
//! ([`crate::window`]) and holds a socket of the same kind, named after
//! this one, so that only one window opens.

use std::io::{self, BufRead, BufReader, Write};
use std::path::Path;

#[cfg(target_os = "linux")]
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};

/// What a second launch asks of the first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// Show, un-minimise and focus the window (creating it if needed).
    Show,
    /// Nothing (a `--hidden` launch, e.g. at login, while already running).
    Nothing,
    /// A question from the window process, as one line of JSON.
    App(String),
}

/// The outcome of [`claim`].
pub enum Claim {
    /// We are the first: serve requests from later launches with this.
    First(UnixListener),
    /// Another instance runs and took the request.
    Forwarded,
}

/// The tray app's socket name for this user and `config` (the default
/// config file when `None`; made absolute, so that every way of naming the
/// same file finds the same app). The window process names it the same way.
pub fn tray_socket(config: Option<&Path>) -> String {
    use std::os::unix::fs::MetadataExt;
    let config = config
        .map(Path::to_path_buf)
        .unwrap_or_else(speedtap::config::default_config_path);
    let config = std::fs::canonicalize(&config).unwrap_or(config);
    let uid = std::fs::metadata("/proc/self")
        .map(|m| m.uid())
        .unwrap_or(0);
    name(uid, &config)
}

/// The socket's abstract name for this user and config file.
pub fn name(uid: u32, config: &Path) -> String {
    format!(
        "speedtap-desktop/{uid}/{:016x}",
        fnv1a(config.to_string_lossy().as_bytes())
    )
}

/// A stable hash (std's `DefaultHasher` may change between releases, and
/// two builds of the app must agree on the name).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(target_os = "linux")]
fn address(name: &str) -> io::Result<SocketAddr> {
    SocketAddr::from_abstract_name(name.as_bytes())
}

#[cfg(not(target_os = "linux"))]
fn address(name: &str) -> io::Result<SocketAddr> {
    let path = std::env::temp_dir().join(name.replace('/', "-"));
    SocketAddr::from_pathname(path)
}

/// Becomes the first instance, or hands `request` to the one running.
pub fn claim(name: &str, request: Request) -> io::Result<Claim> {
    let addr = address(name)?;
    match UnixListener::bind_addr(&addr) {
        Ok(listener) => Ok(Claim::First(listener)),
        Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
            let stream = UnixStream::connect_addr(&addr)?;
            let answer = exchange(stream, &request_line(&request))?;
            if answer.trim() == "ok" {
                Ok(Claim::Forwarded)
            } else {
                Err(io::Error::other(format!(
                    "the running speedtap-desktop answered {answer:?}"
                )))
            }
        }
        Err(e) => Err(e),
    }
}

fn request_line(request: &Request) -> String {
    match request {
        Request::Show => "show\n".to_owned(),
        Request::Nothing => "hidden\n".to_owned(),
        // JSON text holds no raw newline: serde escapes those in strings.
        Request::App(json) => format!("app {}\n", json.replace('\n', " ")),
    }
}

/// Sends one request line and reads the one-line answer.
fn exchange(mut stream: UnixStream, line: &str) -> io::Result<String> {
    stream.set_read_timeout(Some(std::time::Duration::from_secs(10)))?;
    stream.write_all(line.as_bytes())?;
    let mut answer = String::new();
    BufReader::new(stream).read_line(&mut answer)?;
    Ok(answer)
}

/// Asks the instance serving `name` `request` and answers its reply line;
/// an error when none serves it.
pub fn ask(name: &str, request: &Request) -> io::Result<String> {
    let stream = UnixStream::connect_addr(&address(name)?)?;
    exchange(stream, &request_line(request))
}

/// Answers later launches on a thread of its own (blocked in `accept`: no
/// wake-ups while nobody knocks), handing each request to `on_request`,
/// whose answer (one line) goes back.
pub fn serve(listener: UnixListener, on_request: impl Fn(Request) -> String + Send + 'static) {
    let spawned = std::thread::Builder::new()
        .name("single-instance".into())
        .spawn(move || {
            for stream in listener.incoming().flatten() {
                let _ = stream.set_read_timeout(Some(std::time::Duration::from_secs(5)));
                let mut line = String::new();
                let mut reader = BufReader::new(&stream);
                if reader.read_line(&mut line).is_err() {
                    continue;
                }
                let line = line.trim();
                let request = match line {
                    "show" => Request::Show,
                    _ => match line.strip_prefix("app ") {
                        Some(json) => Request::App(json.to_owned()),
                        None => Request::Nothing,
                    },
                };
                let mut answer = on_request(request);
                answer.retain(|c| c != '\n');
                answer.push('\n');
                let _ = (&stream).write_all(answer.as_bytes());
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("second launches will not find this one: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn a_second_claim_is_forwarded_to_the_first() {
        let name = name(
            4242,
            Path::new(&format!("/tmp/test-{}.toml", std::process::id())),
        );
        let Claim::First(listener) = claim(&name, Request::Show).unwrap() else {
            panic!("the first claim must win");
        };
        let (tx, rx) = mpsc::channel();
        serve(listener, move |r| {
            let answer = match &r {
                Request::App(json) => format!("{{\"echo\":{json}}}"),
                _ => "ok".to_owned(),
            };
            tx.send(r).unwrap();
            answer
        });
        assert!(matches!(
            claim(&name, Request::Show).unwrap(),
            Claim::Forwarded
        ));
        assert_eq!(rx.recv().unwrap(), Request::Show);
        assert!(matches!(
            claim(&name, Request::Nothing).unwrap(),
            Claim::Forwarded
        ));
        assert_eq!(rx.recv().unwrap(), Request::Nothing);
        let answer = ask(&name, &Request::App("{\"command\":\"x\"}".into())).unwrap();
        assert_eq!(answer, "{\"echo\":{\"command\":\"x\"}}\n");
        assert_eq!(
            rx.recv().unwrap(),
            Request::App("{\"command\":\"x\"}".into())
        );
    }

    #[test]
    fn asking_where_nobody_serves_is_an_error() {
        let name = name(4243, Path::new("/nonexistent/nobody.toml"));
        assert!(ask(&name, &Request::Show).is_err());
    }

    #[test]
    fn names_differ_by_user_and_config_file() {
        let a = name(1000, Path::new("/home/a/.config/speedtap/config.toml"));
        assert_eq!(
            a,
            name(1000, Path::new("/home/a/.config/speedtap/config.toml"))
        );
        assert_ne!(
            a,
            name(1001, Path::new("/home/a/.config/speedtap/config.toml"))
        );
        assert_ne!(a, name(1000, Path::new("/tmp/other.toml")));
    }
}
