//! The arms: the ways a client can reach the upstream, each a process this
//! harness starts, watches and stops.
//!
//! - `direct`: the upstream itself (the floor every "added" figure is
//!   measured from).
//! - `speedtap`: the real `speedtap run` binary of this tree, with a temp
//!   config (one route to the upstream, the control API on a free port)
//!   and a temp store, its XDG dirs and HOME in a scratch dir so it never
//!   touches the user's. Metering is on as users run it: the store writes
//!   every settled call, and stdout (not a terminal, so one JSON line per
//!   snapshot) goes to /dev/null, as it would under a service manager
//!   that discards it.
//! - `capture`: the same binary with `--capture` and a capture-only route
//!   (`--route bench=UPSTREAM`, no proxy port) to a second port of the
//!   same upstream; the client streams straight to that port and speedtap
//!   meters what the packet capture helper (`speedtap-capture`, a child of
//!   speedtap, so in its process tree) reads off the loopback interface.
//!   It has its own port so that it sees none of the other arms' streams.
//!   Skipped, with the engine's reason, where capture can't run (the
//!   helper unbuilt, no permission).
//! - `nginx`: a plain streaming reverse proxy, the reference's config
//!   (`proxy_buffering off`, one worker; `worker_connections` raised for
//!   the 2,000-stream level), in the foreground.
//! - `litellm`: LiteLLM's proxy from the venv, the reference's recipe (one
//!   worker, no database, local cost map).
//!
//! Each child gets its own process group so stopping it (SIGTERM, then
//! SIGKILL after 5 s) reaches nginx's worker and anything LiteLLM starts.
//! Ports: speedtap binds port 0 and says where; nginx and LiteLLM can't,
//! so a free port is found by binding port 0 and letting it go just before
//! the start (a race with other programs, reported as a start failure).

use std::collections::VecDeque;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::client;
use crate::install;
use crate::procfs;

/// The route name of the speedtap arm (its calls are filed under it).
pub const ROUTE: &str = "bench";

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum ArmKind {
    Direct,
    Speedtap,
    Capture,
    Nginx,
    Litellm,
}

impl ArmKind {
    pub const ALL: [ArmKind; 5] = [
        ArmKind::Direct,
        ArmKind::Speedtap,
        ArmKind::Capture,
        ArmKind::Nginx,
        ArmKind::Litellm,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ArmKind::Direct => "direct",
            ArmKind::Speedtap => "speedtap",
            ArmKind::Capture => "capture",
            ArmKind::Nginx => "nginx",
            ArmKind::Litellm => "litellm",
        }
    }

    /// speedtap meters this arm's streams (its history is checked).
    pub fn meters(self) -> bool {
        matches!(self, ArmKind::Speedtap | ArmKind::Capture)
    }
}

/// A running child and the tail of what it said.
struct Proc {
    child: Child,
    log: Arc<Mutex<VecDeque<String>>>,
    log_file: Option<PathBuf>,
}

/// One arm that is up.
pub struct Arm {
    pub kind: ArmKind,
    /// Where clients connect.
    pub addr: SocketAddr,
    /// What ran, for the report.
    pub version: String,
    /// speedtap's control API.
    pub api: Option<SocketAddr>,
    proc: Option<Proc>,
}

impl Arm {
    pub fn direct(upstream: SocketAddr) -> Arm {
        Arm {
            kind: ArmKind::Direct,
            addr: upstream,
            version: "in-process upstream".into(),
            api: None,
            proc: None,
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.proc.as_ref().map(|p| p.child.id())
    }

    /// CPU seconds of the arm's process tree so far (0 for direct: its CPU
    /// is the harness's own).
    pub fn cpu_secs(&self) -> f64 {
        self.pid().map(procfs::tree_cpu_secs).unwrap_or(0.0)
    }

    /// Context switches of the process tree so far (0 for direct).
    pub fn ctx_switches(&self) -> u64 {
        self.pid().map(procfs::tree_ctx_switches).unwrap_or(0)
    }

    /// Peak RSS of the process tree, bytes (None for direct).
    pub fn peak_rss(&self) -> Option<u64> {
        self.pid().map(procfs::tree_peak_rss)
    }

    /// `Err` with its last words when the child has exited.
    pub fn check_alive(&mut self) -> Result<(), String> {
        let Some(p) = self.proc.as_mut() else {
            return Ok(());
        };
        match p.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(format!("exited ({status}): {}", p.tail())),
            Err(e) => Err(format!("cannot wait: {e}")),
        }
    }

    /// Stops the child (and its group); idempotent.
    pub fn stop(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.stop();
        }
    }
}

impl Drop for Arm {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Proc {
    fn spawn(cmd: &mut Command, log_file: Option<PathBuf>) -> Result<Proc, String> {
        cmd.stdin(Stdio::null()).process_group(0);
        let child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {:?}: {e}", cmd.get_program()))?;
        Ok(Proc {
            child,
            log: Arc::default(),
            log_file,
        })
    }

    /// The last lines the child wrote (its log file, or the captured pipe).
    fn tail(&self) -> String {
        let lines: Vec<String> = match &self.log_file {
            Some(path) => std::fs::read_to_string(path)
                .unwrap_or_default()
                .lines()
                .rev()
                .take(5)
                .map(str::to_owned)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect(),
            None => self.log.lock().expect("log").iter().cloned().collect(),
        };
        lines.join(" / ")
    }

    fn signal_group(&self, sig: i32) {
        let pgid = self.child.id() as i32;
        // SAFETY: kill has no memory preconditions; the group is our own
        // child's (process_group(0) made its pid the group id).
        unsafe {
            libc::kill(-pgid, sig);
        }
    }

    fn stop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.signal_group(libc::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = self.child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        // Whatever is left of the group (nginx's worker, LiteLLM helpers).
        self.signal_group(libc::SIGKILL);
        let _ = self.child.wait();
    }
}

/// A fresh scratch dir for one arm under the target's tmp dir.
pub fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("compare")
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// A loopback port that was free a moment ago.
fn free_port() -> Result<u16, String> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("no free port: {e}"))?;
    Ok(l.local_addr().map_err(|e| e.to_string())?.port())
}

/// Polls `ready` every 50 ms until it answers, the child exits, or
/// `timeout` passes.
async fn wait_ready<F, Fut>(arm: &mut Arm, timeout: Duration, mut ready: F) -> Result<(), String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if ready().await {
            return Ok(());
        }
        arm.check_alive()?;
        if Instant::now() >= deadline {
            let tail = arm.proc.as_ref().map(Proc::tail).unwrap_or_default();
            return Err(format!("not ready after {} s: {tail}", timeout.as_secs()));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Starts `speedtap run` with a temp config and store.
pub fn start_speedtap(upstream: SocketAddr, dir: &Path) -> Result<Arm, String> {
    let config = format!(
        "api = \"127.0.0.1:0\"\n\n[[route]]\nname = \"{ROUTE}\"\nlisten = \"127.0.0.1:0\"\nupstream = \"http://{upstream}\"\n"
    );
    spawn_speedtap(ArmKind::Speedtap, upstream, dir, &config, &[])
}

/// Starts `speedtap run --capture` with a capture-only route to
/// `upstream`: clients stream straight to it.
pub fn start_capture(upstream: SocketAddr, dir: &Path) -> Result<Arm, String> {
    let route = format!("{ROUTE}=http://{upstream}");
    spawn_speedtap(
        ArmKind::Capture,
        upstream,
        dir,
        "api = \"127.0.0.1:0\"\n",
        &["--capture", "--route", &route],
    )
}

/// Runs the speedtap binary as `kind`'s arm and waits for its start lines:
/// the control API, and the route (the proxy arm) or the capture (the
/// capture arm, whose clients connect to `upstream` itself).
fn spawn_speedtap(
    kind: ArmKind,
    upstream: SocketAddr,
    dir: &Path,
    config_text: &str,
    extra: &[&str],
) -> Result<Arm, String> {
    let config = dir.join("speedtap.toml");
    std::fs::write(&config, config_text)
        .map_err(|e| format!("cannot write {}: {e}", config.display()))?;
    let wrap: Vec<String> = std::env::var("SPEEDTAP_BENCH_WRAP")
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    let mut cmd = match wrap.split_first() {
        Some((program, args)) => {
            let mut c = Command::new(program);
            c.args(args).arg(env!("CARGO_BIN_EXE_speedtap"));
            c
        }
        None => Command::new(env!("CARGO_BIN_EXE_speedtap")),
    };
    cmd.arg("run")
        .arg("--config")
        .arg(&config)
        .arg("--db")
        .arg(dir.join("speedtap.sqlite3"))
        .args(extra)
        .env("XDG_CONFIG_HOME", dir.join("config"))
        .env("XDG_DATA_HOME", dir.join("data"))
        .env("HOME", dir)
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut proc = Proc::spawn(&mut cmd, None)?;
    // stderr: the start lines name the bound addresses; keep reading it
    // (a full pipe would block speedtap's warnings) and keep its tail.
    let stderr = proc.child.stderr.take().expect("piped stderr");
    let (tx, rx) = mpsc::channel::<String>();
    let log = Arc::clone(&proc.log);
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            {
                let mut log = log.lock().expect("log");
                if log.len() == 20 {
                    log.pop_front();
                }
                log.push_back(line.clone());
            }
            let _ = tx.send(line);
        }
    });
    let build = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    let mut arm = Arm {
        kind,
        addr: upstream,
        version: match kind {
            ArmKind::Capture => format!(
                "speedtap {} --capture, capture-only route (this tree, {build} build; client streams straight to the upstream)",
                env!("CARGO_PKG_VERSION")
            ),
            _ => format!(
                "speedtap {} (this tree, {build} build)",
                env!("CARGO_PKG_VERSION")
            ),
        },
        api: None,
        proc: Some(proc),
    };
    // "speedtap: route bench: http://ADDR -> ..." (or, capturing,
    // "speedtap: capturing calls to port N ...") and
    // "speedtap: dashboard and control API on http://ADDR/".
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut route: Option<SocketAddr> = (kind == ArmKind::Capture).then_some(upstream);
    let mut capturing = kind != ArmKind::Capture;
    while route.is_none() || arm.api.is_none() || !capturing {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                if let Some(rest) = line.strip_prefix(&format!("speedtap: route {ROUTE}: http://"))
                {
                    route = rest.split_whitespace().next().and_then(|a| a.parse().ok());
                } else if line.starts_with("speedtap: capturing calls to port") {
                    capturing = true;
                } else if let Some(why) = line.strip_prefix("speedtap: warning: capture is off: ") {
                    return Err(format!("capture can't run here: {why}"));
                } else if let Some(rest) =
                    line.strip_prefix("speedtap: dashboard and control API on http://")
                {
                    arm.api = rest.trim_end_matches('/').parse().ok();
                }
            }
            Err(RecvTimeoutError::Timeout) => {
                return Err(format!(
                    "speedtap did not announce its addresses in 30 s: {}",
                    arm.proc.as_ref().map(Proc::tail).unwrap_or_default()
                ))
            }
            Err(RecvTimeoutError::Disconnected) => {
                arm.check_alive()?;
                return Err("speedtap closed stderr before announcing".into());
            }
        }
    }
    arm.addr = route.expect("route address");
    Ok(arm)
}

/// Starts nginx with the reference config, except `worker_connections`:
/// 8192 instead of 4096, because every proxied stream holds two
/// connections (client and upstream) and with 4096 nginx resets about 80
/// of 2,000 concurrent streams.
pub async fn start_nginx(bin: &Path, upstream: SocketAddr, dir: &Path) -> Result<Arm, String> {
    let port = free_port()?;
    let conf = dir.join("nginx.conf");
    let tmp = dir.join("tmp");
    std::fs::create_dir_all(&tmp).map_err(|e| e.to_string())?;
    // `SPEEDTAP_BENCH_NGINX_KEEPALIVE=0`: no idle upstream connections, a
    // fresh one per request as speedtap opens (to tell the connect's share
    // of the added time to first token from the rest).
    let keepalive = match std::env::var("SPEEDTAP_BENCH_NGINX_KEEPALIVE")
        .ok()
        .as_deref()
    {
        Some("0") => String::new(),
        Some(n) if n.parse::<u32>().is_ok() => format!(" keepalive {n};"),
        _ => " keepalive 64;".to_owned(),
    };
    let text = format!(
        "worker_processes 1; pid {pid}; error_log {err};\n\
         events {{ worker_connections 8192; }}\n\
         http {{ access_log off; client_body_temp_path {tmp}; proxy_temp_path {tmp};\n\
         \x20 upstream u {{ server {upstream};{keepalive} }}\n\
         \x20 server {{ listen 127.0.0.1:{port}; location / {{ proxy_pass http://u; proxy_http_version 1.1;\n\
         \x20   proxy_set_header Connection \"\"; proxy_buffering off; proxy_request_buffering off; tcp_nodelay on; }} }} }}\n",
        pid = dir.join("nginx.pid").display(),
        err = dir.join("error.log").display(),
        tmp = tmp.display(),
    );
    std::fs::write(&conf, text).map_err(|e| e.to_string())?;
    let version = Command::new(bin)
        .arg("-v")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stderr).trim().to_owned())
        .and_then(|v| v.strip_prefix("nginx version: ").map(str::to_owned))
        .unwrap_or_else(|| "nginx".into());
    let log = dir.join("stderr.log");
    let mut cmd = Command::new(bin);
    cmd.arg("-p")
        .arg(dir)
        .arg("-e")
        .arg(dir.join("error.log"))
        .arg("-c")
        .arg(&conf)
        .args(["-g", "daemon off;"])
        .stdout(Stdio::null())
        .stderr(File::create(&log).map_err(|e| e.to_string())?);
    let proc = Proc::spawn(&mut cmd, Some(dir.join("error.log")))?;
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let mut arm = Arm {
        kind: ArmKind::Nginx,
        addr,
        version,
        api: None,
        proc: Some(proc),
    };
    wait_ready(&mut arm, Duration::from_secs(10), || async move {
        tokio::net::TcpStream::connect(addr).await.is_ok()
    })
    .await?;
    Ok(arm)
}

/// Starts LiteLLM's proxy from the venv.
pub async fn start_litellm(bin: &Path, upstream: SocketAddr, dir: &Path) -> Result<Arm, String> {
    let port = free_port()?;
    let conf = dir.join("litellm.yaml");
    let text = format!(
        "model_list:\n  - model_name: \"*\"\n    litellm_params:\n      model: \"openai/*\"\n      api_base: \"http://{upstream}/v1\"\n      api_key: \"x\"\n\
         litellm_settings:\n  num_retries: 0\n  drop_params: true\n\
         general_settings:\n  always_include_stream_usage: false\n  master_key: \"{}\"\n",
        client::MASTER_KEY
    );
    std::fs::write(&conf, text).map_err(|e| e.to_string())?;
    let log = dir.join("litellm.log");
    let mut cmd = Command::new(bin);
    cmd.arg("--config")
        .arg(&conf)
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--num_workers", "1"])
        .env("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        .env("HOME", dir)
        .current_dir(dir)
        .stdout(File::create(&log).map_err(|e| e.to_string())?)
        .stderr(File::create(dir.join("litellm.err.log")).map_err(|e| e.to_string())?);
    let proc = Proc::spawn(&mut cmd, Some(dir.join("litellm.err.log")))?;
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let mut arm = Arm {
        kind: ArmKind::Litellm,
        addr,
        version: format!("LiteLLM {} (1 worker)", install::LITELLM_VERSION),
        api: None,
        proc: Some(proc),
    };
    wait_ready(&mut arm, Duration::from_secs(120), || async move {
        matches!(
            client::get(addr, "/health/liveliness").await,
            Some((200, _))
        )
    })
    .await?;
    Ok(arm)
}
