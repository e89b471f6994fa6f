//! `speedtap-capture`: speedtap's privileged packet source, in the manner of
//! Wireshark's `dumpcap`. It is the only part of speedtap that opens a packet
//! socket; the engine stays unprivileged, starts this helper and reads its
//! standard output.
//!
//! ```text
//! speedtap-capture [--interface lo|any|NAME] [--port N ...] [--snaplen 65568]
//! speedtap-capture --check [--interface NAME]
//! ```
//!
//! With no `--port` it starts capturing nothing (a filter no TCP packet
//! matches: port 0 can't be connected to) and waits for ports on its
//! control input.
//!
//! # Control input (standard input)
//! One command a line, in ASCII:
//! - `ports N M ...`: the whole new set of ports (an empty set is allowed:
//!   capture nothing). It replaces the kernel filter at once, without
//!   losing a packet of the flows the old and new sets share (see *Changing
//!   the filter* below).
//!
//! A bad line (unknown command, bad port, a filter that doesn't compile or
//! attach) is reported on standard error and ignored: the filter in place
//! stays. The end of standard input is not a reason to stop (an engine with
//! nothing to change may close it); the helper then just stops reading it.
//!
//! # Output (the engine's `speedtap::capture::feed` decodes it)
//! All integers little-endian.
//! - once: the magic `STCAP1\n`, then the link type (`u32`, a pcap DLT);
//! - per packet: kind `0u8`, timestamp (`u64`, nanoseconds since the Unix
//!   epoch, CLOCK_REALTIME as the kernel stamped the packet), captured length
//!   (`u32`), original length (`u32`), then the captured bytes;
//! - at the start, then every second while packets come (and once after the
//!   last of them): kind `1u8`, then `u64` received, `u64` dropped by the
//!   kernel (no room in the ring buffer) and `u64` dropped by the interface,
//!   counted from the start (libpcap's 32-bit counters are widened across
//!   wrap). With no packets the counters can't move (a drop is a packet
//!   that found the ring full), so an idle helper sleeps in `poll` with no
//!   timeout and wakes nobody;
//! - after each control line is dealt with: kind `2u8`, then `u64` the
//!   number of lines dealt with so far. Once the engine reads it, the
//!   filter the line asked for is attached: a connection opened after that
//!   is seen from its SYN.
//!
//! It exits when its standard output closes (the engine went away or stopped
//! it) or on SIGTERM, not when its standard input ends. It never parses, prints or logs packet contents: they
//! hold prompts and authorization headers.
//!
//! # Changing the filter
//! Not with `pcap_setfilter`: on Linux, libpcap's `set_kernel_filter` first
//! attaches a "total filter" that rejects every packet (to flush the socket's
//! queue), then the new one, so the packets of *other* flows that arrive in
//! between are lost, and a change would cut a gap into the calls in flight
//! on the ports that stay. Instead the new expression is compiled with
//! `pcap_compile` (libpcap's optimizer, the same code as the first filter)
//! and its instructions are attached with `setsockopt(SO_ATTACH_FILTER)`,
//! which swaps the socket's filter in one step in the kernel. That needs no
//! privilege on a socket one owns, so it works after the privileges were
//! dropped.
//!
//! On a cooked link (`any`: `DLT_LINUX_SLL`, `DLT_LINUX_SLL2`) the kernel
//! hands the filter packets that start at the network header, while the
//! compiled program reads the cooked header libpcap builds in front of it
//! later. libpcap rewrites such a program's absolute and indexed load
//! offsets before it attaches it (its `fix_offset`); [`fix_cooked`] does
//! the same: past the header, the offset less the header's length (16 for
//! SLL, 20 for SLL2); a field of the header itself, the kernel's ancillary
//! field for it (`SKF_AD_PROTOCOL`, `SKF_AD_PKTTYPE`, `SKF_AD_IFINDEX`).
//! A program reading another header field (none that a `tcp and (port
//! ...)` filter makes) can't run in the kernel: that change falls back to
//! `pcap_setfilter`, with its short gap, and says so on standard error.
//!
//! The first filter, at the open, is attached the same way, so libpcap
//! never holds a filter of its own. It would use it: after
//! `pcap_setfilter` libpcap runs that filter in userland on the next ring
//! block(s) too (for packets the kernel let through before the change), so
//! a port added before that block came was rejected there by the *old*
//! filter (seen: the first connection after a change from an idle start
//! was lost whole). Instead the helper runs the current filter in userland
//! on every packet it reads (`pcap_offline_filter`, a few dozen BPF
//! instructions): packets the ring got before the open's filter or before
//! a change pass only if the current set wants them.
//!
//! # Why libpcap (the `pcap` crate) and not AF_PACKET directly
//! libpcap compiles the filter string (`tcp and (port 11434 or ...)`, both IPv4
//! and IPv6) with its optimizer into the kernel's BPF filter, so only those
//! packets ever leave the kernel; it sets up the memory-mapped TPACKET_V3
//! ring (packets packed into blocks, a 2 ms block timeout; see
//! `BUFFER_BYTES`), asks the kernel for nanosecond timestamps, handles the
//! `any` pseudo-interface and its cooked link headers, and reports kernel drops, all maintained upstream
//! and packaged by every distribution. Writing the same over raw AF_PACKET
//! would mean hand-written BPF bytecode and ring handling here, for no gain.
//!
//! # Privileges
//! Opening the socket needs `CAP_NET_RAW` (AF_PACKET sockets) and nothing
//! else: without promiscuous mode (loopback has no use for it) libpcap makes no
//! call that needs `CAP_NET_ADMIN`. Tried as `nobody` on `lo` and on `any`, in
//! immediate mode with the filter attached: no capability fails with `socket:
//! Operation not permitted`, `cap_net_admin` alone fails the same way,
//! `cap_net_raw` alone works. So the grant is the file capability
//! `sudo setcap cap_net_raw=eip speedtap-capture` (what
//! `speedtap::capture::source` prints), or running it as root. Once the capture is
//! open and its filter attached, the process needs nothing more (reading the
//! ring, `poll` and the statistics `getsockopt` need no privilege), so it drops
//! everything: a setuid installation goes back to the real user and group, and
//! all capability sets (effective, permitted, inheritable, ambient) are
//! emptied; `no_new_privs` is set. Run as root, it stays uid 0 but without any
//! capability, and it never executes anything.

mod control;
mod filter;

use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use pcap::{Active, Capture, Precision};

/// The magic that starts the stream; the version is its last digit.
const MAGIC: &[u8; 7] = b"STCAP1\n";
const KIND_PACKET: u8 = 0;
const KIND_STATS: u8 = 1;
const KIND_APPLIED: u8 = 2;
/// Bytes kept of each packet: the largest loopback packet (its MTU is 65536)
/// plus the largest link header (20, Linux cooked v2 on `any`), whole.
const DEFAULT_SNAPLEN: u32 = 65_568;
/// The ring's size as libpcap is asked for it. libpcap's TPACKET_V3 ring is
/// made of blocks the size of one whole packet rounded up to a power of two
/// pages (128 KiB for the snaplen above), `BUFFER_BYTES / snaplen` of them:
/// 255 blocks, a 32 MiB ring, pinned kernel memory mapped into this process
/// and freed when it exits. Packets are packed into a block one after the
/// other, so a block holds ~600 SSE-sized segments, or one full-size
/// loopback segment (64 KiB) and a few small ones.
///
/// Sized for bursts at loopback speed: a server flushing a finished
/// generation writes megabytes at once, in full-size segments, one block
/// each. The first V3 ring (4 MiB asked, 63 blocks) held 63 of them, 4 MB:
/// six 7 MB responses written at once lost about 1,000 to 1,500 packets a
/// run; 255 blocks lose about 130 to 780, and 511 blocks (32 MiB asked)
/// none in most runs, but with 511 a capture test racing a runtime port
/// change failed far more often (docs/reliability.md), so the ring stays
/// at 255 until that is understood.
///
/// Why not the immediate mode's TPACKET_V2 ring: it gives every packet a
/// fixed slot the size of the snaplen, so the 32 MiB ring of the first
/// version held only about 500 packets (whatever their size) and took
/// 64 MiB of the helper's memory; at 500 concurrent streams it overflowed
/// whenever the helper was descheduled for a few milliseconds.
const BUFFER_BYTES: i32 = 16 << 20;
/// The size asked for the pipe to the engine (`F_SETPIPE_SZ`), from Linux's
/// 64 KiB default: the most an unprivileged process may ask
/// (`/proc/sys/fs/pipe-max-size`), so a burst waits in the pipe, not in
/// the ring, while the engine reads.
const PIPE_BYTES: libc::c_int = 1 << 20;
/// How long the kernel fills a block before handing it over anyway (the
/// V3 block timeout). This delays when a packet is *read*, never its
/// timestamp, which the kernel takes on arrival; what speedtap measures
/// (TTFT, rates) comes from those timestamps, so it only delays the live
/// view by at most this much. Short enough that a lone token is seen at
/// once, long enough that a burst shares a block.
const BLOCK_TIMEOUT_MS: i32 = 2;
/// How often the counters are sent while packets come.
const STATS_EVERY: Duration = Duration::from_secs(1);
/// What the engine's stdout pipe is flushed at, at most, when packets keep
/// coming; it is flushed at once whenever the ring is empty.
const WRITE_BUFFER: usize = 256 << 10;

struct Args {
    interface: String,
    ports: Vec<u16>,
    snaplen: u32,
    check: bool,
}

const USAGE: &str = "usage: speedtap-capture [--interface lo] [--port N ...] [--snaplen 65568] | --check [--interface lo]\n\
    control lines on standard input: ports N M ... (the whole new set)";

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut parsed = Args {
        interface: "lo".into(),
        ports: Vec::new(),
        snaplen: DEFAULT_SNAPLEN,
        check: false,
    };
    while let Some(arg) = args.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) => (n.to_string(), Some(v.to_string())),
            None => (arg, None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| args.next())
                .ok_or_else(|| format!("{name} needs a value"))
        };
        match name.as_str() {
            "--interface" | "-i" => parsed.interface = value()?,
            "--port" | "-p" => {
                let v = value()?;
                let port = v.parse::<u16>().ok().filter(|p| *p != 0);
                parsed
                    .ports
                    .push(port.ok_or_else(|| format!("bad port {v:?}"))?);
            }
            "--snaplen" => {
                let v = value()?;
                parsed.snaplen = v
                    .parse::<u32>()
                    .ok()
                    .filter(|n| (64..=16 << 20).contains(n))
                    .ok_or_else(|| format!("bad snaplen {v:?}"))?;
            }
            "--check" => parsed.check = true,
            "--help" | "-h" => return Err(USAGE.into()),
            _ => return Err(format!("unknown argument {name:?}\n{USAGE}")),
        }
    }
    Ok(parsed)
}

/// The kernel filter: TCP to or from any of the ports, IPv4 and IPv6.
///
/// Loopback packets reach a packet socket twice, as sent and as received;
/// libpcap drops the sent copy after the kernel queued it. Dropping it in the
/// kernel (`inbound`) would halve the ring's use, but libpcap runs the filter
/// in userland on the packets that were in the ring when it was set, where
/// `inbound` (packet metadata) matches nothing. With it, a connection's SYN
/// went missing in 2 of about 40 starts while other loopback traffic ran
/// (not reproduced on purpose since). So, no `inbound`.
///
/// No port: TCP port 0, which no connection can use, so nothing matches.
/// (An expression that rejects everything outright is refused by libpcap's
/// optimizer: "expression rejects all packets".)
fn filter_for(ports: &[u16]) -> String {
    if ports.is_empty() {
        return "tcp port 0".into();
    }
    let ports: Vec<String> = ports.iter().map(|p| format!("port {p}")).collect();
    format!("tcp and ({})", ports.join(" or "))
}

/// Opens the capture with the filter for `args.ports` attached (the same
/// way as every later change, see [`filter`]).
fn open(args: &Args) -> Result<(Capture<Active>, filter::Filter), String> {
    let cap = open_unfiltered(args).map_err(|e| e.to_string())?;
    let mut cap = cap.setnonblock().map_err(|e| e.to_string())?;
    let (filter, _) = filter::replace(&mut cap, &filter_for(&args.ports))?;
    Ok((cap, filter))
}

fn open_unfiltered(args: &Args) -> Result<Capture<Active>, pcap::Error> {
    Capture::from_device(args.interface.as_str())?
        .promisc(false)
        // Not immediate mode: libpcap then uses the TPACKET_V3 ring (see
        // BUFFER_BYTES), with BLOCK_TIMEOUT_MS as the block timeout.
        .immediate_mode(false)
        .precision(Precision::Nano)
        .snaplen(args.snaplen as i32)
        .buffer_size(BUFFER_BYTES.max(args.snaplen as i32 * 4))
        .timeout(BLOCK_TIMEOUT_MS)
        .open()
}

/// Asks for a [`PIPE_BYTES`] pipe to the engine. Best effort: standard
/// output may not be a pipe (a file, a terminal), and a smaller pipe only
/// means bursts wait in the ring instead.
fn grow_pipe() {
    // SAFETY: fcntl on this process's own standard output, no pointers.
    unsafe {
        libc::fcntl(libc::STDOUT_FILENO, libc::F_SETPIPE_SZ, PIPE_BYTES);
    }
}

/// Drops what the open capture no longer needs; see the crate doc.
fn drop_privileges() -> io::Result<()> {
    fn check(r: libc::c_int) -> io::Result<()> {
        if r == -1 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }
    // SAFETY: plain syscalls on this process's own credentials, with
    // pointers to live locals.
    unsafe {
        let (gid, uid) = (libc::getgid(), libc::getuid());
        if libc::getegid() != gid {
            check(libc::setresgid(gid, gid, gid))?;
        }
        if libc::geteuid() != uid {
            check(libc::setresuid(uid, uid, uid))?;
        }
        check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))?;
        // Ambient capabilities exist since Linux 4.3; EINVAL before.
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        );
        // capset(2) with all sets empty; version 3 covers 64 capabilities.
        #[repr(C)]
        struct Header {
            version: u32,
            pid: libc::c_int,
        }
        #[repr(C)]
        #[derive(Clone, Copy)]
        struct Data {
            effective: u32,
            permitted: u32,
            inheritable: u32,
        }
        let header = Header {
            version: 0x2008_0522, // _LINUX_CAPABILITY_VERSION_3
            pid: 0,
        };
        let data = [Data {
            effective: 0,
            permitted: 0,
            inheritable: 0,
        }; 2];
        check(libc::syscall(libc::SYS_capset, &header, data.as_ptr()) as libc::c_int)?;
    }
    Ok(())
}

/// libpcap's counters are `u32`; widened here across wrap.
#[derive(Default)]
struct Counter {
    last: u32,
    total: u64,
}

impl Counter {
    fn update(&mut self, now: u32) -> u64 {
        self.total += u64::from(now.wrapping_sub(self.last));
        self.last = now;
        self.total
    }
}

/// The three counters of a stats record, widened from libpcap's.
#[derive(Default)]
struct Counters {
    received: Counter,
    dropped: Counter,
    if_dropped: Counter,
}

impl Counters {
    /// Writes a stats record with the capture's counters now.
    fn write(&mut self, cap: &mut Capture<Active>, out: &mut impl Write) -> io::Result<()> {
        let s = cap.stats().map_err(|e| io::Error::other(e.to_string()))?;
        let mut rec = [0u8; 25];
        rec[0] = KIND_STATS;
        rec[1..9].copy_from_slice(&self.received.update(s.received).to_le_bytes());
        rec[9..17].copy_from_slice(&self.dropped.update(s.dropped).to_le_bytes());
        rec[17..25].copy_from_slice(&self.if_dropped.update(s.if_dropped).to_le_bytes());
        out.write_all(&rec)
    }
}

fn run(args: &Args) -> io::Result<()> {
    let (mut cap, mut filter) = open(args).map_err(io::Error::other)?;
    drop_privileges()?;
    let link = cap.get_datalink().0 as u32;

    grow_pipe();
    let stdout = io::stdout();
    let mut out = io::BufWriter::with_capacity(WRITE_BUFFER, stdout.lock());
    out.write_all(MAGIC)?;
    out.write_all(&link.to_le_bytes())?;
    out.flush()?;

    let mut counters = Counters::default();
    let mut next_stats = Instant::now();
    // Packets read since the counters were last sent (true at the start:
    // the first counters go out at once).
    let mut fresh = true;
    let mut fds = [
        libc::pollfd {
            fd: cap.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        // The engine's end of the pipe closing shows as POLLERR here.
        libc::pollfd {
            fd: io::stdout().as_raw_fd(),
            events: 0,
            revents: 0,
        },
        // Control lines; set to -1 (ignored by poll) once the input ends.
        libc::pollfd {
            fd: libc::STDIN_FILENO,
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    let mut lines = control::Lines::default();
    // Control lines answered so far (the count each applied record says).
    let mut applied = 0u64;
    loop {
        // Everything the ring holds, then flush, then wait.
        if copy_ring(&mut cap, &filter, &mut out, next_stats)? {
            fresh = true;
        }
        let now = Instant::now();
        if fresh && now >= next_stats {
            counters.write(&mut cap, &mut out)?;
            next_stats = now + STATS_EVERY;
            fresh = false;
        }
        out.flush()?;
        let timeout_ms = if fresh {
            let wait = next_stats.saturating_duration_since(Instant::now());
            wait.as_millis() as libc::c_int + 1
        } else {
            -1
        };
        if wait_closed(&mut fds, timeout_ms)? {
            return Ok(());
        }
        if fds[2].revents != 0
            && !read_control(&mut cap, &mut filter, &mut lines, &mut applied, &mut out)?
        {
            fds[2].fd = -1;
        }
    }
}

/// Reads the control input once (it is readable) and applies the
/// complete lines, each answered with an applied record (so the engine
/// knows from when a new port's connections are seen). False once the
/// input has ended (or failed): stop polling it, keep capturing.
fn read_control(
    cap: &mut Capture<Active>,
    filter: &mut filter::Filter,
    lines: &mut control::Lines,
    applied: &mut u64,
    out: &mut impl Write,
) -> io::Result<bool> {
    let mut buf = [0u8; 4096];
    let n = match control::read_stdin(&mut buf) {
        Ok(Some(n)) => n,
        Ok(None) => return Ok(false),
        Err(e) => {
            eprintln!("speedtap-capture: control input: {e}; no longer read");
            return Ok(false);
        }
    };
    for line in lines.push(&buf[..n]) {
        let command = match line.map(|l| control::parse(&l)) {
            Ok(None) => continue,
            Ok(Some(Ok(command))) => command,
            Ok(Some(Err(e))) | Err(e) => {
                eprintln!("speedtap-capture: ignored control line: {e}");
                continue;
            }
        };
        let control::Command::Ports(ports) = command;
        match filter::replace(cap, &filter_for(&ports)) {
            Ok((new, filter::Applied::Attached)) => *filter = new,
            Ok((new, filter::Applied::SetFilter)) => {
                *filter = new;
                eprintln!(
                    "speedtap-capture: the new filter can't run in the kernel as compiled; \
                 set through libpcap (packets arriving during the change may be lost)"
                );
            }
            Err(e) => eprintln!("speedtap-capture: ports {ports:?} not applied: {e}"),
        }
        *applied += 1;
        let mut rec = [0u8; 9];
        rec[0] = KIND_APPLIED;
        rec[1..9].copy_from_slice(&applied.to_le_bytes());
        out.write_all(&rec)?;
        out.flush()?;
    }
    Ok(true)
}

/// Copies the packets the ring holds that pass `filter` to `out`, until
/// it is empty or the counters are due at `next_stats`. True if any packet
/// was copied.
fn copy_ring(
    cap: &mut Capture<Active>,
    filter: &filter::Filter,
    out: &mut impl Write,
    next_stats: Instant,
) -> io::Result<bool> {
    let mut copied = false;
    loop {
        match cap.next_packet() {
            Ok(p) if !filter.matches(p.data) => {}
            Ok(p) => {
                let h = p.header;
                let ts = (h.ts.tv_sec as u64)
                    .wrapping_mul(1_000_000_000)
                    .wrapping_add(h.ts.tv_usec as u64);
                let mut head = [0u8; 17];
                head[0] = KIND_PACKET;
                head[1..9].copy_from_slice(&ts.to_le_bytes());
                head[9..13].copy_from_slice(&(p.data.len() as u32).to_le_bytes());
                head[13..17].copy_from_slice(&h.len.to_le_bytes());
                out.write_all(&head)?;
                out.write_all(p.data)?;
                copied = true;
            }
            Err(pcap::Error::TimeoutExpired) => break,
            Err(e) => return Err(io::Error::other(e.to_string())),
        }
        if Instant::now() >= next_stats {
            break;
        }
    }
    Ok(copied)
}

/// Sleeps in `poll` until packets or a control line come, `timeout_ms`
/// passes (-1: no timeout) or a signal arrives. True when the engine's end
/// of standard output has closed.
fn wait_closed(fds: &mut [libc::pollfd; 3], timeout_ms: libc::c_int) -> io::Result<bool> {
    // SAFETY: `fds` is a live array of three pollfd.
    let r = unsafe { libc::poll(fds.as_mut_ptr(), 3, timeout_ms) };
    if r == -1 {
        let e = io::Error::last_os_error();
        // Nothing is known of the descriptors after a failed poll.
        for fd in fds.iter_mut() {
            fd.revents = 0;
        }
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    Ok(fds[1].revents & (libc::POLLERR | libc::POLLHUP) != 0)
}

fn main() -> ExitCode {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("speedtap-capture: {e}");
            return ExitCode::from(2);
        }
    };
    if args.check {
        return match open(&args) {
            Ok(_) => {
                println!("ok");
                ExitCode::SUCCESS
            }
            Err(e) => {
                println!(
                    "speedtap-capture: cannot capture on {}: {e}",
                    args.interface
                );
                ExitCode::FAILURE
            }
        };
    }
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("speedtap-capture: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Result<Args, String> {
        parse_args(list.iter().map(|s| s.to_string()))
    }

    #[test]
    fn filter_covers_every_port() {
        assert_eq!(filter_for(&[]), "tcp port 0");
        assert_eq!(filter_for(&[11434]), "tcp and (port 11434)");
        assert_eq!(
            filter_for(&[11434, 8080]),
            "tcp and (port 11434 or port 8080)"
        );
    }

    #[test]
    fn parses_arguments() {
        let a = args(&["--port", "8080", "--port=11434", "-i", "any"]).unwrap();
        assert_eq!(
            (a.interface.as_str(), a.ports, a.snaplen),
            ("any", vec![8080, 11434], DEFAULT_SNAPLEN)
        );
        assert!(args(&["--check"]).unwrap().check);
        assert!(
            args(&[]).unwrap().ports.is_empty(),
            "no port: capture nothing yet"
        );
        assert!(args(&["--port", "0"]).is_err());
        assert!(args(&["--port", "70000"]).is_err());
        assert!(args(&["--port"]).is_err());
        assert!(args(&["--bogus"]).is_err());
        assert_eq!(
            args(&["--port", "1", "--snaplen", "1500"]).unwrap().snaplen,
            1500
        );
    }

    #[test]
    fn counters_widen_across_wrap() {
        let mut c = Counter::default();
        assert_eq!(c.update(10), 10);
        assert_eq!(c.update(u32::MAX), u64::from(u32::MAX));
        assert_eq!(c.update(5), u64::from(u32::MAX) + 6);
    }
}
