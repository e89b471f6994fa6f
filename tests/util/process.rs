//! The real `speedtap` binary as a child process, for every test that
//! runs it: a scratch directory per test, the command with its config and
//! data dirs pointed into it, each output pipe read by its own thread
//! (every byte kept, complete lines handed over for waiting on), and the
//! start-up lines `speedtap run` and `speedtap simulate` print.
//!
//! Output is kept as raw bytes, not only lines, because one test scans it
//! for secrets and must see every byte, valid UTF-8 or not.

use std::io::Read;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_speedtap");

/// Generous: a debug build on a busy 2-core machine starts slowly.
pub const STARTUP: Duration = Duration::from_secs(30);

/// A fresh, empty scratch directory for one test of an area (`cli`,
/// `store_engine`, ...).
pub fn scratch(area: &str, test: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(area)
        .join(test);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `speedtap ARGS` with the platform config and data dirs pointed into
/// `dir` (a user's own config and database are never touched), default
/// logging, and every pipe captured.
pub fn speedtap(dir: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .env("XDG_CONFIG_HOME", dir.join("config"))
        .env("XDG_DATA_HOME", dir.join("data"))
        .env("HOME", dir)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// One output pipe, read by its own thread: every byte is kept, and every
/// complete line is also handed over through a channel for waiting on.
pub struct Output {
    bytes: Arc<Mutex<Vec<u8>>>,
    lines: Receiver<String>,
    reader: Option<JoinHandle<()>>,
}

impl Output {
    pub fn new(mut pipe: impl Read + Send + 'static) -> Output {
        let bytes = Arc::new(Mutex::new(Vec::new()));
        let (tx, lines) = mpsc::channel();
        let sink = Arc::clone(&bytes);
        let reader = thread::spawn(move || {
            let mut pending = Vec::new();
            let mut buf = vec![0; 16 * 1024];
            loop {
                let n = match pipe.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                sink.lock().unwrap().extend_from_slice(&buf[..n]);
                pending.extend_from_slice(&buf[..n]);
                while let Some(nl) = pending.iter().position(|&b| b == b'\n') {
                    let line: Vec<u8> = pending.drain(..=nl).collect();
                    let line = String::from_utf8_lossy(&line);
                    let _ = tx.send(line.trim_end_matches(['\n', '\r']).to_owned());
                }
            }
        });
        Output {
            bytes,
            lines,
            reader: Some(reader),
        }
    }

    /// The first line from now on that `pred` accepts.
    pub fn wait_for(&self, what: &str, timeout: Duration, pred: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if pred(&line) => return line,
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => {
                    panic!("timed out waiting for {what}; so far: {}", self.text())
                }
                Err(RecvTimeoutError::Disconnected) => {
                    panic!("output ended before {what}; it was: {}", self.text())
                }
            }
        }
    }

    /// Every byte so far.
    pub fn bytes(&self) -> Vec<u8> {
        self.bytes.lock().unwrap().clone()
    }

    /// Every byte so far, as (lossy) text, for messages.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes()).into_owned()
    }

    /// Every line so far (lossy text).
    pub fn lines_so_far(&self) -> Vec<String> {
        self.text().lines().map(str::to_owned).collect()
    }

    /// Every byte, once the pipe has closed (the process exited).
    pub fn finish(&mut self) -> Vec<u8> {
        if let Some(reader) = self.reader.take() {
            reader.join().unwrap();
        }
        self.bytes()
    }

    /// Every line, once the pipe has closed (the process exited).
    pub fn finish_lines(&mut self) -> Vec<String> {
        self.finish();
        self.lines_so_far()
    }
}

/// A running `speedtap` process. Killed on drop if still running, so a
/// failing test leaves nothing behind.
pub struct Proc {
    pub child: Child,
    pub stdout: Output,
    pub stderr: Output,
}

impl Proc {
    pub fn spawn(mut cmd: Command) -> Proc {
        let mut child = cmd.spawn().expect("speedtap starts");
        let stdout = Output::new(child.stdout.take().unwrap());
        let stderr = Output::new(child.stderr.take().unwrap());
        Proc {
            child,
            stdout,
            stderr,
        }
    }

    /// Sends `signal` (`TERM`, `INT`) through the `kill` utility.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -{signal} failed");
    }

    /// `kill -9` (what `Child::kill` sends on Unix), then reaps it.
    pub fn kill_9(&mut self) -> ExitStatus {
        self.child.kill().expect("SIGKILL sent");
        self.child.wait().expect("reaped")
    }

    /// Waits for the exit, polling with a deadline.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        self.wait_exit_timed(timeout).0
    }

    /// Waits for the exit, polling with a deadline; returns the status and
    /// how long it took.
    pub fn wait_exit_timed(&mut self, timeout: Duration) -> (ExitStatus, Duration) {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return (status, start.elapsed());
            }
            if start.elapsed() > timeout {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "still running after {timeout:?}; stderr: {}",
                    String::from_utf8_lossy(&self.stderr.finish())
                );
            }
            thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `speedtap simulate --listen 127.0.0.1:0 EXTRA`, and its address read
/// from its banner.
pub fn start_simulate(dir: &Path, extra: &[&str]) -> (Proc, SocketAddr) {
    let mut args = vec!["simulate", "--listen", "127.0.0.1:0"];
    args.extend_from_slice(extra);
    let sim = Proc::spawn(speedtap(dir, &args));
    let banner = sim.stdout.wait_for("the simulate banner", STARTUP, |l| {
        l.contains("listening on")
    });
    let addr = url_addr(&banner, "listening on http://");
    (sim, addr)
}

/// A running `speedtap run` with one route `sim`, and the addresses it
/// printed.
pub struct Run {
    pub proc: Proc,
    pub proxy: SocketAddr,
    pub api: SocketAddr,
}

/// `speedtap run --json --api 127.0.0.1:0 --route
/// sim=127.0.0.1:0=http://UPSTREAM STORE_ARGS`, with `env` added to its
/// environment (`store_args`: `["--no-db"]` or `["--db", PATH]`).
pub fn start_run_with(
    dir: &Path,
    upstream: SocketAddr,
    store_args: &[&str],
    env: &[(&str, &str)],
) -> Run {
    let route = format!("sim=127.0.0.1:0=http://{upstream}");
    let mut args = vec!["run", "--json", "--api", "127.0.0.1:0", "--route", &route];
    args.extend_from_slice(store_args);
    let mut cmd = speedtap(dir, &args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let proc = Proc::spawn(cmd);
    let (proxy, api) = read_announcement(&proc, "sim");
    Run { proc, proxy, api }
}

/// The proxy address of `route` and the API address, from the start lines
/// `speedtap run` prints on stderr.
pub fn read_announcement(proc: &Proc, route: &str) -> (SocketAddr, SocketAddr) {
    let prefix = format!("speedtap: route {route}: http://");
    let line = proc
        .stderr
        .wait_for("the route line", STARTUP, |l| l.starts_with(&prefix));
    let proxy = url_addr(&line, &prefix);
    let prefix = "speedtap: dashboard and control API on http://";
    let line = proc
        .stderr
        .wait_for("the API line", STARTUP, |l| l.starts_with(prefix));
    (proxy, url_addr(&line, prefix))
}

/// The `host:port` right after `prefix` in `line`.
pub fn url_addr(line: &str, prefix: &str) -> SocketAddr {
    let at = line.find(prefix).unwrap_or_else(|| panic!("{line}")) + prefix.len();
    let rest = &line[at..];
    let end = rest
        .find(|c: char| c == '/' || c.is_whitespace())
        .unwrap_or(rest.len());
    rest[..end]
        .parse()
        .unwrap_or_else(|e| panic!("{line}: {e}"))
}
