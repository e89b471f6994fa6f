//! The engine's side of the packet source: finds the privileged helper
//! `speedtap-capture`, checks that it may open the packet socket, runs it on
//! the ports to watch and hands its packets, stamped on the engine's
//! monotonic clock, to a bounded channel.
//!
//! The ports can change while it runs ([`CaptureSource::set_ports`]): the
//! helper's standard input is its control pipe, one `ports N M ...` line a
//! change, the whole new set (possibly empty); the helper swaps its kernel
//! filter without losing the packets of the flows both sets share.
//!
//! The engine itself never opens a packet socket, also when it runs as root:
//! one path. The helper needs the capability `CAP_NET_RAW` and nothing else
//! (`CAP_NET_ADMIN` only serves promiscuous mode, which loopback capture
//! doesn't use; see the helper's crate doc for what was tried).
//! [`CaptureError::NoPermission`] names the one command that grants it,
//! `sudo setcap cap_net_raw=eip <the helper's absolute path>`. A file
//! capability is lost when the helper is rebuilt or copied, and is ignored on
//! a file system mounted `nosuid`.
//!
//! # Timestamps
//! The kernel stamps each packet on the wall clock (CLOCK_REALTIME, ns); the
//! engine measures on the monotonic clock ([`tokio::time::Instant`]). The
//! reader keeps the offset `realtime - monotonic`, read from both clocks side
//! by side (a reading is kept only if the two monotonic readings around the
//! wall-clock one are within 50 µs) at every read of the helper's pipe; see
//! [`ClockMap`] for when a reading replaces the offset in use. A packet's
//! instant is then `ts - offset`, with two guards:
//! - it is never later than the moment its bytes were read (it was captured
//!   before), nor earlier than [`MAX_LAG`] before that moment or than the
//!   source's start: a wall-clock step can't move packets into the future or
//!   far into the past;
//! - right after a step (the offset moved by more than 1 ms), packets still in
//!   flight were stamped on the old wall clock: a packet that the new offset
//!   puts outside that window but the previous one puts inside it uses the
//!   previous one. A forward step shorter than [`MAX_LAG`] can still misplace
//!   the few packets in flight across it by up to the step.

use std::ffi::OsString;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::feed::{CaptureStats, CapturedPacket, FeedDecoder, LinkType, Record};

/// The helper's file name.
pub const HELPER_NAME: &str = "speedtap-capture";
/// An environment variable naming the helper's path, overriding the search.
pub const HELPER_ENV: &str = "SPEEDTAP_CAPTURE_BIN";
/// The oldest a packet may be placed before the moment it was read.
pub const MAX_LAG: Duration = Duration::from_secs(5);
/// An offset change larger than this is a wall-clock step, not drift.
const STEP_NS: i64 = 1_000_000;
/// How often the offset follows the wall clock's slewing.
const RESAMPLE_NS: i64 = 1_000_000_000;
/// How long [`CaptureSource::start`] waits for the helper to open the capture.
pub const START_TIMEOUT: Duration = Duration::from_secs(10);
/// A clock reading whose monotonic bracket is wider than this is dropped.
const MAX_BRACKET_NS: i64 = 50_000;

/// Why capture can't start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error(
        "the packet capture helper {HELPER_NAME} was not found (looked in: {searched}); \
         build it with `cargo build -p speedtap-capture` (add --release for a release build) \
         so that it sits next to speedtap, or set {HELPER_ENV} to its path"
    )]
    HelperMissing { searched: String },
    #[error("packet capture needs a permission, granted once with: {command} ({detail})")]
    NoPermission {
        helper: PathBuf,
        /// The one command that grants it.
        command: String,
        /// What the helper said.
        detail: String,
    },
    #[error("could not run {}: {source}", helper.display())]
    Spawn { helper: PathBuf, source: io::Error },
    #[error("packet capture failed: {0}")]
    Helper(String),
}

impl CaptureError {
    /// The command that grants the permission, for the terminal, Settings and
    /// Get started.
    pub fn grant_command(&self) -> Option<&str> {
        match self {
            CaptureError::NoPermission { command, .. } => Some(command),
            _ => None,
        }
    }
}

/// The command that gives `helper` the capability it needs.
pub fn grant_command(helper: &Path) -> String {
    format!("sudo setcap cap_net_raw=eip {}", helper.display())
}

/// Finds the helper: `$SPEEDTAP_CAPTURE_BIN` if set; else next to the current
/// executable (or one level up from a `deps` folder, where test binaries
/// live); else on `PATH`. The path returned is absolute, symlinks resolved
/// (`setcap` wants the file itself).
pub fn find_helper() -> Result<PathBuf, CaptureError> {
    let exe_dir = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf));
    find_helper_in(
        std::env::var_os(HELPER_ENV),
        exe_dir.as_deref(),
        std::env::var_os("PATH"),
    )
}

fn find_helper_in(
    env: Option<OsString>,
    exe_dir: Option<&Path>,
    path: Option<OsString>,
) -> Result<PathBuf, CaptureError> {
    let mut candidates = Vec::new();
    if let Some(env) = env.filter(|e| !e.is_empty()) {
        candidates.push(PathBuf::from(env));
    } else {
        if let Some(dir) = exe_dir {
            candidates.push(dir.join(HELPER_NAME));
            if dir.file_name().is_some_and(|n| n == "deps") {
                if let Some(up) = dir.parent() {
                    candidates.push(up.join(HELPER_NAME));
                }
            }
        }
        if let Some(path) = path {
            candidates.extend(std::env::split_paths(&path).map(|d| d.join(HELPER_NAME)));
        }
    }
    for c in &candidates {
        if c.is_file() {
            return Ok(c.canonicalize().unwrap_or_else(|_| c.clone()));
        }
    }
    let searched: Vec<String> = candidates.iter().map(|c| c.display().to_string()).collect();
    Err(CaptureError::HelperMissing {
        searched: if searched.is_empty() {
            "nowhere".into()
        } else {
            searched.join(", ")
        },
    })
}

fn is_permission_error(text: &str) -> bool {
    // libpcap says "socket: Operation not permitted" (EPERM), or "You don't
    // have permission to capture on that device (...)".
    let t = text.to_ascii_lowercase();
    t.contains("not permitted") || t.contains("permission")
}

/// Classifies the helper's words on a failure.
fn helper_failure(helper: &Path, detail: String) -> CaptureError {
    if is_permission_error(&detail) {
        CaptureError::NoPermission {
            helper: helper.to_path_buf(),
            command: grant_command(helper),
            detail,
        }
    } else {
        CaptureError::Helper(detail)
    }
}

/// Runs `helper --check` on `interface`: can it open the packet socket? It
/// blocks for the few milliseconds the helper takes (use `spawn_blocking`
/// from async code).
pub fn check(helper: &Path, interface: &str) -> Result<(), CaptureError> {
    let out = Command::new(helper)
        .args(["--check", "--interface", interface])
        .stdin(Stdio::null())
        .output()
        .map_err(|source| CaptureError::Spawn {
            helper: helper.to_path_buf(),
            source,
        })?;
    if out.status.success() {
        return Ok(());
    }
    let mut said = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let err = String::from_utf8_lossy(&out.stderr);
    if !err.trim().is_empty() {
        said = format!("{said} {}", err.trim()).trim().to_string();
    }
    if said.is_empty() {
        said = format!("{HELPER_NAME} --check: {}", out.status);
    }
    Err(helper_failure(helper, said))
}

/// What to capture.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaptureConfig {
    /// `lo` (the default), `any`, or an interface name.
    pub interface: String,
    /// TCP ports to watch, either direction; none captures nothing until
    /// [`CaptureSource::set_ports`] gives some.
    pub ports: Vec<u16>,
    /// Bytes kept of each packet; the default, the helper's, keeps every
    /// loopback packet whole (larger wastes the kernel ring, see the helper).
    pub snaplen: u32,
}

impl Default for CaptureConfig {
    fn default() -> Self {
        Self {
            interface: "lo".into(),
            ports: Vec::new(),
            snaplen: 65_568,
        }
    }
}

/// A packet and the monotonic instant it was captured at.
#[derive(Debug, Clone)]
pub struct SourcePacket {
    pub at: Instant,
    pub packet: CapturedPacket,
}

/// The source's counters since its start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SourceStats {
    /// The helper's (the kernel's) counters, as of its last report (about
    /// every second while packets come; the counters can't move without).
    pub kernel: CaptureStats,
    /// Packets handed to the sink.
    pub delivered: u64,
    /// Packets dropped here because the sink was full.
    pub sink_dropped: u64,
}

impl SourceStats {
    /// Every packet lost so far, in the kernel, the interface or here.
    pub fn lost(&self) -> u64 {
        self.kernel.dropped + self.kernel.if_dropped + self.sink_dropped
    }
}

#[derive(Default)]
struct Shared {
    stats: SourceStats,
    /// Why the reader stopped, if it did.
    ended: Option<String>,
}

/// A running helper and the thread reading it. Dropping it (or [`stop`])
/// kills the helper.
///
/// [`stop`]: CaptureSource::stop
pub struct CaptureSource {
    child: Child,
    /// The helper's control pipe (`None` once a write to it failed).
    control: Mutex<Option<ChildStdin>>,
    reader: Option<JoinHandle<()>>,
    shared: Arc<Mutex<Shared>>,
    link: LinkType,
    /// Control lines written, and the count the helper says it dealt with.
    requested: std::sync::atomic::AtomicU64,
    applied: Arc<tokio::sync::watch::Sender<u64>>,
}

impl CaptureSource {
    /// Finds the helper, checks its permission and starts it: the whole path
    /// the engine takes. Blocking, as [`check`].
    pub fn open(
        config: &CaptureConfig,
        sink: mpsc::Sender<SourcePacket>,
    ) -> Result<Self, CaptureError> {
        let helper = find_helper()?;
        check(&helper, &config.interface)?;
        Self::start(&helper, config, sink)
    }

    /// Starts `helper` on `config` and returns once the capture is open (its
    /// stream's header read, within [`START_TIMEOUT`]), so packets sent after
    /// this are seen. Packets go
    /// to `sink` with `try_send`: when it is full they are dropped and counted
    /// in [`SourceStats::sink_dropped`], the reader never waits for the
    /// consumer. The reader stops when the sink closes.
    pub fn start(
        helper: &Path,
        config: &CaptureConfig,
        sink: mpsc::Sender<SourcePacket>,
    ) -> Result<Self, CaptureError> {
        let base = Instant::now();
        let mut cmd = Command::new(helper);
        cmd.args(["--interface", &config.interface])
            .args(["--snaplen", &config.snaplen.to_string()]);
        for p in &config.ports {
            cmd.args(["--port", &p.to_string()]);
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| CaptureError::Spawn {
                helper: helper.to_path_buf(),
                source,
            })?;
        let stdout = child.stdout.take().expect("piped");
        let stderr = child.stderr.take().expect("piped");
        let control = Mutex::new(child.stdin.take());
        let (opened_tx, opened) = std::sync::mpsc::sync_channel(1);
        let shared = Arc::new(Mutex::new(Shared::default()));
        let applied = Arc::new(tokio::sync::watch::Sender::new(0));
        let reader = Reader {
            applied: applied.clone(),
            stdout,
            stderr,
            decoder: FeedDecoder::new(),
            pending: Vec::new(),
            buf: vec![0u8; 64 << 10],
            clock: ClockMap::new(),
            base,
            read_at: 0,
            sink,
            shared: shared.clone(),
            opened: Some(opened_tx),
        };
        let reader = match std::thread::Builder::new()
            .name("capture-reader".into())
            .spawn(move || reader.run())
        {
            Ok(r) => r,
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(CaptureError::Helper(e.to_string()));
            }
        };
        let mut source = Self {
            child,
            control,
            reader: Some(reader),
            shared,
            link: LinkType(0),
            requested: Default::default(),
            applied,
        };
        match opened.recv_timeout(START_TIMEOUT) {
            Ok(Ok(link)) => {
                source.link = link;
                Ok(source)
            }
            Ok(Err(said)) => {
                source.shutdown();
                Err(helper_failure(helper, said))
            }
            Err(_) => {
                source.shutdown();
                Err(CaptureError::Helper(format!(
                    "{HELPER_NAME} did not open the capture within {START_TIMEOUT:?}"
                )))
            }
        }
    }

    /// Replaces the ports captured with `ports` (the whole new set; empty
    /// captures nothing). The helper applies it as soon as it reads the
    /// line, in well under a millisecond; packets of the flows on ports in
    /// both sets keep coming. A line of a few bytes on a pipe: the write
    /// doesn't wait unless the helper stopped reading 64 KiB of them ago.
    /// Returns the line's ticket: the filter is attached once
    /// [`applied`](Self::applied) reaches it.
    pub fn set_ports(&self, ports: &[u16]) -> Result<u64, CaptureError> {
        let mut line = String::from("ports");
        for p in ports {
            line.push(' ');
            line.push_str(&p.to_string());
        }
        line.push('\n');
        let mut control = self.control.lock().unwrap_or_else(|p| p.into_inner());
        let Some(pipe) = control.as_mut() else {
            return Err(CaptureError::Helper(format!(
                "{HELPER_NAME}'s control pipe is closed"
            )));
        };
        if let Err(e) = pipe.write_all(line.as_bytes()).and_then(|()| pipe.flush()) {
            *control = None;
            return Err(CaptureError::Helper(format!(
                "could not change {HELPER_NAME}'s ports: {e}"
            )));
        }
        Ok(self
            .requested
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1)
    }

    /// How many control lines the helper has dealt with (its filter then
    /// attached), as it says.
    pub fn applied(&self) -> tokio::sync::watch::Receiver<u64> {
        self.applied.subscribe()
    }

    /// The link-layer type of the packets' `data`.
    pub fn link_type(&self) -> LinkType {
        self.link
    }

    /// The counters so far.
    pub fn stats(&self) -> SourceStats {
        self.shared.lock().unwrap_or_else(|p| p.into_inner()).stats
    }

    /// Why the source stopped delivering, if it did (the helper died, its
    /// stream broke or the sink closed).
    pub fn ended(&self) -> Option<String> {
        self.shared
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .ended
            .clone()
    }

    /// Kills the helper and waits for the reader; returns the final counters.
    pub fn stop(mut self) -> SourceStats {
        self.shutdown();
        self.stats()
    }

    fn shutdown(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

impl Drop for CaptureSource {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The last few hundred bytes the helper wrote to stderr (it writes one line
/// on a fatal error, and never packet contents).
fn read_tail(stderr: &mut ChildStderr) -> String {
    let mut said = Vec::new();
    let _ = stderr.take(64 << 10).read_to_end(&mut said);
    let said = String::from_utf8_lossy(&said);
    let said = said.trim();
    let start = said.len().saturating_sub(512);
    let start = (start..said.len())
        .find(|i| said.is_char_boundary(*i))
        .unwrap_or(said.len());
    said[start..].to_string()
}

struct Reader {
    stdout: ChildStdout,
    stderr: ChildStderr,
    decoder: FeedDecoder,
    pending: Vec<Record>,
    buf: Vec<u8>,
    clock: ClockMap,
    base: Instant,
    /// When the bytes being decoded were read, ns since `base`.
    read_at: i64,
    sink: mpsc::Sender<SourcePacket>,
    shared: Arc<Mutex<Shared>>,
    /// Where the helper's applied records go.
    applied: Arc<tokio::sync::watch::Sender<u64>>,
    /// Told the link type once the header is read, or why the stream ended
    /// before it.
    opened: Option<std::sync::mpsc::SyncSender<Result<LinkType, String>>>,
}

impl Reader {
    fn run(mut self) {
        self.read_now();
        let ended = loop {
            if let Some(why) = self.deliver() {
                break why;
            }
            let n = match self.stdout.read(&mut self.buf) {
                Ok(0) => {
                    let said = read_tail(&mut self.stderr);
                    break if said.is_empty() {
                        format!("{HELPER_NAME} exited")
                    } else {
                        said
                    };
                }
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => break e.to_string(),
            };
            self.read_now();
            if let Err(e) = self.decoder.push_into(&self.buf[..n], &mut self.pending) {
                // Deliver what came before the error, then stop.
                let why = self.deliver().unwrap_or_else(|| e.to_string());
                break why;
            }
            if let Some(link) = self.decoder.link_type() {
                if let Some(opened) = self.opened.take() {
                    let _ = opened.send(Ok(link));
                }
            }
        };
        if let Some(opened) = self.opened.take() {
            let _ = opened.send(Err(ended.clone()));
        }
        // Dropping stdout closes the pipe: the helper exits on its own.
        self.shared.lock().unwrap_or_else(|p| p.into_inner()).ended = Some(ended);
    }

    fn read_now(&mut self) {
        self.read_at = self.base.elapsed().as_nanos() as i64;
        if let Some((real, mono)) = read_clocks(self.base) {
            self.clock.sample(real, mono);
        }
    }

    /// Hands the pending records on; `Some(why)` if the sink closed.
    fn deliver(&mut self) -> Option<String> {
        if self.pending.is_empty() {
            return None;
        }
        let (mut delivered, mut dropped, mut kernel, mut closed) = (0, 0, None, false);
        for r in self.pending.drain(..) {
            match r {
                Record::Packet(packet) if !closed => {
                    let mono = self.clock.convert(packet.ts_ns, self.read_at);
                    let at = self.base + Duration::from_nanos(mono as u64);
                    match self.sink.try_send(SourcePacket { at, packet }) {
                        Ok(()) => delivered += 1,
                        Err(mpsc::error::TrySendError::Full(_)) => dropped += 1,
                        Err(mpsc::error::TrySendError::Closed(_)) => closed = true,
                    }
                }
                Record::Stats(s) => kernel = Some(s),
                Record::Applied(n) => {
                    self.applied.send_replace(n);
                }
                _ => {}
            }
        }
        let mut shared = self.shared.lock().unwrap_or_else(|p| p.into_inner());
        shared.stats.delivered += delivered;
        shared.stats.sink_dropped += dropped;
        if let Some(k) = kernel {
            shared.stats.kernel = k;
        }
        closed.then(|| "the packet consumer went away".to_string())
    }
}

/// Reads the wall clock (ns since the epoch) and the monotonic clock (ns
/// since `base`) side by side; `None` if a preemption made the pair loose.
fn read_clocks(base: Instant) -> Option<(i64, i64)> {
    let m1 = Instant::now();
    let real = SystemTime::now().duration_since(UNIX_EPOCH).ok()?;
    let m2 = Instant::now();
    let bracket = m2.duration_since(m1).as_nanos() as i64;
    if bracket > MAX_BRACKET_NS {
        return None;
    }
    let mono = m1.duration_since(base).as_nanos() as i64 + bracket / 2;
    Some((i64::try_from(real.as_nanos()).ok()?, mono))
}

/// Maps kernel wall-clock timestamps to nanoseconds on the monotonic clock
/// since the source's start: the rule in the [module doc](self), as a pure
/// state machine (clock readings in, instants out).
#[derive(Debug, Clone, Default)]
pub struct ClockMap {
    /// The offset in use, `realtime - monotonic`, and when it was read.
    current: Option<(i64, i64)>,
    /// The offset before the last wall-clock step, and when the step was seen.
    previous: Option<(i64, i64)>,
}

impl ClockMap {
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes a reading of both clocks, taken at `mono_ns`.
    pub fn sample(&mut self, realtime_ns: i64, mono_ns: i64) {
        let offset = realtime_ns - mono_ns;
        match self.current {
            None => self.current = Some((offset, mono_ns)),
            Some((cur, _)) if (offset - cur).abs() > STEP_NS => {
                self.previous = Some((cur, mono_ns));
                self.current = Some((offset, mono_ns));
            }
            Some((_, at)) if mono_ns - at >= RESAMPLE_NS => self.current = Some((offset, mono_ns)),
            Some(_) => {}
        }
        // A step is over once every packet stamped before it is long read.
        if self
            .previous
            .is_some_and(|(_, at)| mono_ns - at > MAX_LAG.as_nanos() as i64)
        {
            self.previous = None;
        }
    }

    /// The monotonic instant (ns since the start) of a packet stamped `ts_ns`
    /// and read at `now_ns`.
    pub fn convert(&self, ts_ns: u64, now_ns: i64) -> i64 {
        let offsets = [self.current, self.previous];
        to_monotonic_ns(
            ts_ns,
            offsets.iter().flatten().map(|(o, _)| *o),
            now_ns,
            MAX_LAG.as_nanos() as i64,
        )
    }
}

/// The conversion rule as a pure function: `offsets` newest first (each
/// `realtime` minus `monotonic`, ns); the first that places the packet within
/// `[now_ns - max_lag_ns, now_ns]` (and not before the start, 0) wins, else
/// the newest one's result is clamped into that window. Without any offset
/// the packet is placed at `now_ns`.
pub fn to_monotonic_ns(
    ts_ns: u64,
    offsets: impl IntoIterator<Item = i64>,
    now_ns: i64,
    max_lag_ns: i64,
) -> i64 {
    let lo = (now_ns - max_lag_ns).max(0);
    let hi = now_ns.max(lo);
    let ts = i64::try_from(ts_ns).unwrap_or(i64::MAX);
    let mut first = None;
    for off in offsets {
        let m = ts.saturating_sub(off);
        if (lo..=hi).contains(&m) {
            return m;
        }
        first.get_or_insert(m);
    }
    first.map_or(hi, |m| m.clamp(lo, hi))
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000_000;
    const MS: i64 = 1_000_000;
    const LAG: i64 = 5 * S;
    /// A wall clock reading about 2026.
    const WALL: i64 = 1_764_000_000 * S;

    #[test]
    fn conversion_subtracts_the_offset() {
        let off = WALL - 10 * S;
        // Read at 12 s, captured at 11.9 s.
        let ts = (off + 11 * S + 900 * MS) as u64;
        assert_eq!(to_monotonic_ns(ts, [off], 12 * S, LAG), 11 * S + 900 * MS);
        // Exactly now, and exactly the oldest allowed, are kept.
        assert_eq!(
            to_monotonic_ns((off + 12 * S) as u64, [off], 12 * S, LAG),
            12 * S
        );
        assert_eq!(
            to_monotonic_ns((off + 7 * S) as u64, [off], 12 * S, LAG),
            7 * S
        );
    }

    #[test]
    fn never_in_the_future_nor_far_in_the_past_nor_before_the_start() {
        let off = WALL;
        // Stamped 3 s after it was read: now.
        assert_eq!(
            to_monotonic_ns((off + 15 * S) as u64, [off], 12 * S, LAG),
            12 * S
        );
        // Stamped an hour before: the oldest allowed.
        assert_eq!(
            to_monotonic_ns((off - 3600 * S) as u64, [off], 12 * S, LAG),
            7 * S
        );
        // Early on, the window starts at the source's start.
        assert_eq!(to_monotonic_ns(0, [off], 2 * S, LAG), 0);
        assert_eq!(to_monotonic_ns(u64::MAX, [off], 2 * S, LAG), 2 * S);
        // No offset yet: now.
        assert_eq!(to_monotonic_ns(WALL as u64, [], 2 * S, LAG), 2 * S);
    }

    #[test]
    fn previous_offset_places_packets_stamped_before_a_backward_step() {
        let old = WALL;
        let new = WALL - 60 * S; // the wall clock went back a minute
        let ts = (old + 11 * S) as u64; // captured at 11 s, before the step
                                        // The new offset would put it 60 s in the future: the old one fits.
        assert_eq!(to_monotonic_ns(ts, [new, old], 12 * S, LAG), 11 * S);
        // A packet stamped after the step fits the new offset first.
        let ts = (new + 11 * S + 500 * MS) as u64;
        assert_eq!(
            to_monotonic_ns(ts, [new, old], 12 * S, LAG),
            11 * S + 500 * MS
        );
    }

    #[test]
    fn clock_map_keeps_a_stable_offset_and_follows_steps() {
        let mut c = ClockMap::new();
        c.sample(WALL + S, S); // offset WALL at 1 s
        assert_eq!(c.convert((WALL + S) as u64, S), S);
        // Reading noise of a few µs doesn't move the offset within a second.
        c.sample(WALL + 3 * S / 2 + 7_000, 3 * S / 2);
        assert_eq!(c.convert((WALL + 2 * S) as u64, 2 * S), 2 * S);
        // After a second it follows the slewing clock (+200 µs).
        c.sample(WALL + 3 * S + 200_000, 3 * S);
        assert_eq!(c.convert((WALL + 3 * S) as u64, 3 * S), 3 * S - 200_000);
        // The wall clock steps back 30 s at 4 s.
        c.sample(WALL - 30 * S + 4 * S, 4 * S);
        // A packet stamped just before the step on the old clock.
        let before = (WALL + 200_000 + 4 * S - 10_000) as u64;
        assert_eq!(c.convert(before, 4 * S), 4 * S - 10_000);
        // One stamped after it, on the new clock.
        let after = (WALL - 30 * S + 4 * S) as u64;
        assert_eq!(c.convert(after, 4 * S), 4 * S);
        // Long after the step, the previous offset is forgotten: a packet on
        // the old clock is clamped into the window instead.
        c.sample(WALL - 30 * S + 10 * S, 10 * S);
        assert_eq!(c.convert((WALL + 10 * S) as u64, 10 * S), 10 * S);
    }

    #[test]
    fn helper_search_order() {
        let dir = std::env::temp_dir().join(format!("speedtap-find-{}", std::process::id()));
        let (a, b, deps) = (dir.join("a"), dir.join("b"), dir.join("t/deps"));
        for d in [&a, &b, &deps] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(b.join(HELPER_NAME), b"").unwrap();
        std::fs::write(dir.join("t").join(HELPER_NAME), b"").unwrap();
        let path = std::env::join_paths([&a, &b]).unwrap();
        let canon = |p: PathBuf| p.canonicalize().unwrap();
        // Next to the executable, or above `deps`, before PATH.
        assert_eq!(
            find_helper_in(None, Some(&deps), Some(path.clone())).unwrap(),
            canon(dir.join("t").join(HELPER_NAME))
        );
        // Then PATH.
        assert_eq!(
            find_helper_in(None, Some(&a), Some(path.clone())).unwrap(),
            canon(b.join(HELPER_NAME))
        );
        // The variable overrides; missing, it is an error naming the build.
        let env = Some(OsString::from(a.join(HELPER_NAME)));
        let err = find_helper_in(env, Some(&deps), Some(path)).unwrap_err();
        assert!(matches!(err, CaptureError::HelperMissing { .. }));
        let msg = err.to_string();
        assert!(msg.contains("cargo build -p speedtap-capture"), "{msg}");
        assert!(
            msg.contains(&a.join(HELPER_NAME).display().to_string()),
            "{msg}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn permission_error_names_the_grant_command() {
        let helper = Path::new("/opt/speedtap/speedtap-capture");
        let e = helper_failure(
            helper,
            "speedtap-capture: cannot capture on lo: libpcap error: socket: Operation not permitted"
                .into(),
        );
        assert_eq!(
            e.grant_command(),
            Some("sudo setcap cap_net_raw=eip /opt/speedtap/speedtap-capture")
        );
        assert!(e
            .to_string()
            .contains("sudo setcap cap_net_raw=eip /opt/speedtap/speedtap-capture"));
        let e = helper_failure(helper, "No such device exists".into());
        assert!(matches!(e, CaptureError::Helper(_)), "{e}");
        assert_eq!(e.grant_command(), None);
    }

    /// A stand-in helper: a shell script in its own temporary folder.
    fn fake_helper(name: &str, script: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("speedtap-fake-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(HELPER_NAME);
        std::fs::write(&path, format!("#!/bin/sh\n{script}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    /// Retries while another test thread's fork still holds the script open
    /// for writing (ETXTBSY).
    fn retry_busy<T>(mut f: impl FnMut() -> Result<T, CaptureError>) -> Result<T, CaptureError> {
        for _ in 0..50 {
            match f() {
                Err(CaptureError::Spawn { source, .. })
                    if source.raw_os_error() == Some(libc::ETXTBSY) =>
                {
                    std::thread::sleep(Duration::from_millis(20))
                }
                r => return r,
            }
        }
        f()
    }

    fn config(port: u16) -> CaptureConfig {
        CaptureConfig {
            ports: vec![port],
            ..CaptureConfig::default()
        }
    }

    #[test]
    fn without_permission_check_and_start_name_the_grant_command() {
        let said = "speedtap-capture: cannot capture on lo: libpcap error: socket: Operation not permitted";
        // As the helper does: the answer to --check on stdout, errors on stderr.
        let helper = fake_helper(
            "denied",
            &format!("[ \"$1\" = --check ] && echo '{said}' || echo '{said}' >&2; exit 1"),
        );
        let e = retry_busy(|| check(&helper, "lo")).unwrap_err();
        let grant = format!("sudo setcap cap_net_raw=eip {}", helper.display());
        assert_eq!(e.grant_command(), Some(grant.as_str()), "{e}");
        let (tx, _rx) = mpsc::channel(8);
        let e = retry_busy(|| CaptureSource::start(&helper, &config(1), tx.clone()))
            .err()
            .unwrap();
        assert_eq!(e.grant_command(), Some(grant.as_str()), "{e}");
        assert!(e.to_string().contains(said), "{e}");
        std::fs::remove_dir_all(helper.parent().unwrap()).unwrap();
    }

    #[test]
    fn a_fake_stream_is_delivered_and_its_end_reported() {
        // Header (Ethernet), one 3-byte packet stamped at the epoch, stats.
        let helper = fake_helper(
            "stream",
            r"printf 'STCAP1\n\001\000\000\000'
printf '\000\000\000\000\000\000\000\000\000\003\000\000\000\003\000\000\000abc'
printf '\001\001\000\000\000\000\000\000\000\002\000\000\000\000\000\000\000\000\000\000\000\000\000\000\000'
echo 'speedtap-capture: the end' >&2",
        );
        let (tx, mut rx) = mpsc::channel(8);
        let before = Instant::now();
        let source = retry_busy(|| CaptureSource::start(&helper, &config(1), tx.clone())).unwrap();
        drop(tx);
        assert_eq!(source.link_type(), LinkType(1));
        let p = rx.blocking_recv().expect("the packet");
        assert_eq!(&p.packet.data[..], b"abc");
        // Stamped long before the start: placed at the start at the earliest.
        assert!(p.at >= before && p.at <= Instant::now());
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while source.ended().is_none() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(source.ended().as_deref(), Some("speedtap-capture: the end"));
        let stats = source.stop();
        assert_eq!(stats.delivered, 1);
        assert_eq!(
            stats.kernel,
            CaptureStats {
                received: 1,
                dropped: 2,
                if_dropped: 0
            }
        );
        assert_eq!(stats.lost(), 2);
        std::fs::remove_dir_all(helper.parent().unwrap()).unwrap();
    }

    #[test]
    fn set_ports_writes_the_whole_new_set_as_one_control_line() {
        // The stand-in reads one control line and says it on stderr, which
        // the source reports as the stream's end.
        let helper = fake_helper(
            "control",
            r#"printf 'STCAP1\n\001\000\000\000'
read line
echo "got $line" >&2"#,
        );
        let (tx, _rx) = mpsc::channel(8);
        let empty = CaptureConfig::default();
        let source = retry_busy(|| CaptureSource::start(&helper, &empty, tx.clone())).unwrap();
        source.set_ports(&[8080, 11434]).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while source.ended().is_none() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(source.ended().as_deref(), Some("got ports 8080 11434"));
        // The helper is gone: the next change fails, and says so.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let mut refused = None;
        while refused.is_none() && std::time::Instant::now() < deadline {
            refused = source.set_ports(&[1]).err();
        }
        assert!(refused.is_some(), "a write to a helper that exited fails");
        source.stop();
        std::fs::remove_dir_all(helper.parent().unwrap()).unwrap();
    }

    #[test]
    fn a_full_sink_drops_and_counts_without_blocking() {
        let packet = r"\000\000\000\000\000\000\000\000\000\001\000\000\000\001\000\000\000x";
        let helper = fake_helper(
            "full",
            &format!("printf 'STCAP1\\n\\001\\000\\000\\000'\nfor i in 1 2 3 4 5; do printf '{packet}'; done\nexec sleep 5"),
        );
        let (tx, mut rx) = mpsc::channel(2);
        let source = retry_busy(|| CaptureSource::start(&helper, &config(1), tx.clone())).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while source.stats().delivered + source.stats().sink_dropped < 5
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        let stats = source.stop();
        assert_eq!((stats.delivered, stats.sink_dropped), (2, 3));
        assert!(rx.try_recv().is_ok() && rx.try_recv().is_ok());
        std::fs::remove_dir_all(helper.parent().unwrap()).unwrap();
    }

    /// The helper as built beside this test binary, or in the package's
    /// `target/debug`.
    fn built_helper() -> Option<PathBuf> {
        let exe_dir = std::env::current_exe()
            .ok()
            .and_then(|e| e.parent().map(Path::to_path_buf));
        find_helper_in(None, exe_dir.as_deref(), None)
            .ok()
            .or_else(|| {
                let p = Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("target/debug")
                    .join(HELPER_NAME);
                p.is_file().then_some(p)
            })
    }

    /// The TCP flags and payload of an Ethernet + IPv4 packet, as on `lo`.
    fn tcp_of(frame: &[u8]) -> Option<(u8, &[u8])> {
        let ip = frame.get(14..)?;
        if frame.get(12..14)? != [0x08, 0x00] {
            return None;
        }
        let ihl = usize::from(ip.first()? & 0x0f) * 4;
        let total = usize::from(u16::from_be_bytes([*ip.get(2)?, *ip.get(3)?]));
        let tcp = ip.get(ihl..total)?;
        let data_off = usize::from(tcp.get(12)? >> 4) * 4;
        Some((*tcp.get(13)?, tcp.get(data_off..)?))
    }

    #[test]
    fn real_capture_on_loopback() {
        use std::io::Write;
        let Some(helper) = built_helper() else {
            eprintln!("skipped: {HELPER_NAME} is not built (cargo build -p speedtap-capture)");
            return;
        };
        match check(&helper, "lo") {
            Ok(()) => {}
            Err(e @ CaptureError::NoPermission { .. }) => {
                eprintln!("skipped: the helper can't open the packet socket here: {e}");
                return;
            }
            Err(e) => panic!("{e}"),
        }
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (tx, mut rx) = mpsc::channel(1024);
        let config = CaptureConfig {
            ports: vec![port],
            ..CaptureConfig::default()
        };
        let source = CaptureSource::start(&helper, &config, tx).unwrap();
        assert_eq!(source.link_type(), LinkType(1), "Ethernet framing on lo");

        let before = Instant::now();
        let mut client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (mut server, _) = listener.accept().unwrap();
        client.write_all(b"speedtap capture test").unwrap();
        let mut got = [0u8; 21];
        server.read_exact(&mut got).unwrap();
        let after = Instant::now();

        let (mut syn, mut data) = (None, None);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while (syn.is_none() || data.is_none()) && std::time::Instant::now() < deadline {
            match rx.try_recv() {
                Ok(p) => {
                    let Some((flags, payload)) = tcp_of(&p.packet.data) else {
                        continue;
                    };
                    if flags & 0x12 == 0x02 {
                        syn = Some(p.at);
                    } else if payload == b"speedtap capture test" {
                        assert_eq!(p.packet.orig_len as usize, p.packet.data.len());
                        data = Some(p.at);
                    }
                }
                Err(_) => std::thread::sleep(Duration::from_millis(5)),
            }
        }
        let (syn, data) = (
            syn.expect("the SYN was captured"),
            data.expect("the data was captured"),
        );
        assert!(
            before <= syn && syn <= data && data <= after,
            "{before:?} {syn:?} {data:?} {after:?}"
        );
        let stats = source.stop();
        assert!(stats.delivered >= 3, "{stats:?}");
        assert_eq!(stats.sink_dropped, 0);
    }
}
