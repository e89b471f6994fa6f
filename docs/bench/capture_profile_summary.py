"""Summarises a `perf script` dump of `speedtap run --capture` (and its
helper `speedtap-capture`, recorded as its child) into where the capture's
CPU goes: by process and thread, and by component (inclusive buckets),
so the capture's cost per token can be explained, not guessed.

It reads perf's own text (no stack-collapsing tool needed):

  perf script -i perf.data > capture.txt
  python3 docs/bench/capture_profile_summary.py capture.txt [--steady]

`--steady` leaves out the one-off start-up samples (the o200k tables
built at the first call, the helper's ring allocated at its start), so a
short run's percentages are those of the per-token work.

Percentages are of all samples of the recorded process tree (cpu-clock,
the only event in a VM without hardware counters). "Inclusive" counts a
frame and everything it calls, so buckets overlap; a bucket's first match
in a stack counts it once.
"""
import collections
import re
import sys

# (name, regex searched in each frame of a stack, thread regex or None)
BUCKETS = [
    ("helper: whole process (speedtap-capture)", None, r"^speedtap-captur"),
    ("helper: reading the ring (copy_ring: pcap next packet + encode)", r"speedtap_capture::copy_ring", r"^speedtap-captur"),
    ("helper: writing the pipe to the engine (write syscall)", r"^(__GI___libc_write|__libc_write|write|ksys_write|pipe_write)$", r"^speedtap-captur"),
    ("helper: waiting in poll (kernel)", r"^(__GI___poll|__poll|do_sys_poll|__x64_sys_poll)$", r"^speedtap-captur"),
    ("helper: libpcap (pcap_* and its BPF filter)", r"^(pcap_|bpf_filter|pcapint_)", r"^speedtap-captur"),
    ("engine: capture-reader thread (pipe read + record decode)", None, r"^capture-reader"),
    ("engine: pipe read (read syscall)", r"^(__GI___libc_read|__libc_read|read|ksys_read|pipe_read)$", r"^capture-reader"),
    ("engine: record decode (FeedDecoder)", r"speedtap::capture::feed::FeedDecoder", None),
    ("engine: capture task, all (CaptureTask::packet/tick)", r"speedtap::engine::capture::CaptureTask::(packet|tick|run)", None),
    ("engine: packet parse (capture::packet::parse)", r"speedtap::capture::packet::", None),
    ("engine: TCP reassembly (capture::reassembly)", r"speedtap::capture::reassembly::", None),
    ("engine: HTTP/1 parsing (capture::http1)", r"speedtap::capture::http1::", None),
    ("engine: connection table (Flows::feed)", r"speedtap::capture::flows::Flows::feed", None),
    ("engine: exchange -> actor messages (engine::capture::exchange)", r"speedtap::engine::capture::exchange::", None),
    ("engine: kernel socket table read (/proc/net/tcp, capture::sockets)", r"speedtap::capture::sockets::", None),
    ("engine: the 100 ms tick (holes, quiet flows, sweep)", r"speedtap::engine::capture::CaptureTask::tick", None),
    ("metering: call actors draining frames (shared with the proxy)", r"speedtap::engine::call_actor::CallActor::drain_frames", None),
    ("metering: token counting (o200k)", r"O200kEstimator as speedtap::tokens::TokenEstimator>::count_tokens", None),
    ("metering: snapshot publish (CallMeter::publish)", r"speedtap::meter::call::CallMeter::publish", None),
    ("supervisor: CallProgress handling", r"Supervisor as actix::handler::Handler<speedtap::engine::messages::CallProgress>>::handle", None),
    ("output: JSON lines to stdout", r"<&std::fs::File as std::io::Write>::write", None),
    ("store: SQLite writer", r"speedtap::store::writer", r"^speedtap-store"),
    ("startup: o200k tables build (one-off)", r"tiktoken_rs::singleton::o200k_base_singleton", None),
]
SCHED = re.compile(r"^(finish_task_switch|_raw_spin_unlock_irq|try_to_wake_up)")
ALLOC = re.compile(r"^(malloc|_int_malloc|_int_free|cfree|free|malloc_consolidate|realloc|_int_realloc)(@.*)?$")
ONE_OFF = re.compile(r"(tiktoken_rs::singleton::o200k_base_singleton|^packet_set_ring$)")
HEADER = re.compile(r"^(\S.*?)\s+(\d+)(?:/(\d+))?\s+")


def clean(frame):
    frame = re.sub(r"\+0x[0-9a-f]+$", "", frame)
    frame = re.sub(r"::h[0-9a-f]{16}$", "", frame)
    return frame


def stacks(path):
    """Yields (thread name, [frames leaf first]) for each sample."""
    comm, frames = None, []
    for line in open(path, errors="replace"):
        if not line.strip():
            if comm is not None:
                yield comm, frames
            comm, frames = None, []
        elif not line[0].isspace():
            m = HEADER.match(line)
            comm = m.group(1) if m else line.split()[0]
        else:
            parts = line.strip().split(None, 1)
            if len(parts) == 2:
                sym = parts[1].rsplit(" (", 1)[0]
                frames.append(clean(sym))
    if comm is not None:
        yield comm, frames


def main():
    total = 0
    threads, selfc = collections.Counter(), collections.Counter()
    bucket = collections.Counter()
    compiled = [(n, re.compile(f) if f else None, re.compile(t) if t else None) for n, f, t in BUCKETS]
    sched = alloc = left_out = 0
    steady = "--steady" in sys.argv[2:]
    for comm, frames in stacks(sys.argv[1]):
        if steady and any(ONE_OFF.search(f) for f in frames):
            left_out += 1
            continue
        total += 1
        threads[comm] += 1
        leaf = frames[0] if frames else "[unknown]"
        selfc[leaf] += 1
        sched += bool(SCHED.search(leaf))
        alloc += bool(ALLOC.search(leaf))
        for name, frx, trx in compiled:
            if trx and not trx.search(comm):
                continue
            if frx is None or any(frx.search(f) for f in frames):
                bucket[name] += 1
    pct = lambda n: f"{100 * n / max(total, 1):5.1f}%"
    print(f"samples: {total}" + (f" (one-off start-up samples left out: {left_out})" if steady else ""))
    print("\n== CPU by thread (comm)")
    for c, n in threads.most_common(15):
        print(f"{pct(n)}  {c}")
    print("\n== By component (inclusive; buckets overlap)")
    for name, _, _ in compiled:
        print(f"{pct(bucket[name])}  {name}")
    print(f"{pct(sched)}  kernel: scheduler wake-ups and switches (self)")
    print(f"{pct(alloc)}  allocator: malloc+free (self)")
    print("\n== Top 30 frames by self time")
    sys.stdout.flush()
    for f, n in selfc.most_common(30):
        print(f"{pct(n)}  {f[:140]}")


if __name__ == "__main__":
    main()
