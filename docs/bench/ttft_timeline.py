"""Breaks speedtap's time to first token into syscall-to-syscall steps.

Made with (release build, the compare bench's own TTFT workload):

    SPEEDTAP_BENCH_WRAP="perf trace -o /tmp/ttft.trace -e accept4,read,recvfrom,write,writev,sendto,connect --" \
    SPEEDTAP_BENCH_ARMS=direct,speedtap SPEEDTAP_BENCH_LEVELS=1 SPEEDTAP_BENCH_ROUNDS=1 \
    cargo bench --bench compare
    python3 docs/bench/ttft_timeline.py /tmp/ttft.trace

Reads `perf trace` output of `speedtap run` under the compare bench's TTFT
workload (20 sequential 4-token streams per round). For each call: the
client connection's accept, the request read, the upstream connect, the
request written upstream, the response head read from upstream, the head
written to the client, the first chunk read from upstream and written to
the client. Prints the median of each step over the calls."""
import re, sys, statistics
line_re = re.compile(r"^\s*([\d.]+)\s+\(\s*([\d.]+) ms\): (\S+?)/(\d+) (\w+)\((.*)\)\s+=\s+(-?\d+)")
ev = []
for line in open(sys.argv[1], errors="replace"):
    m = line_re.match(line)
    if not m:
        continue
    t, dur, comm, tid, name, args, ret = m.groups()
    fd = re.match(r"fd: (\d+)", args)
    ev.append((float(t), float(dur), comm, int(tid), name, int(fd.group(1)) if fd else None, int(ret), args))
# Calls: from each accept4 (the client's connection) on.
calls = []
i = 0
while i < len(ev) and len(calls) < 20:
    t, dur, comm, tid, name, fd, ret, args = ev[i]
    if name == "accept4" and ret > 0:
        client = ret
        steps = {"accept": t + dur}
        upstream = None
        j = i + 1
        while j < len(ev):
            t2, d2, c2, tid2, n2, fd2, r2, a2 = ev[j]
            end = t2 + d2
            if n2 in ("read", "recvfrom") and fd2 == client and r2 > 0 and "request_read" not in steps:
                steps["request_read"] = end
            elif n2 == "connect" and "connect_start" not in steps and "request_read" in steps:
                steps["connect_start"] = t2
                upstream = fd2
                steps["connect_end"] = end
            elif upstream is not None and fd2 == upstream and n2 in ("write", "writev", "sendto") and "upstream_write" not in steps:
                steps["upstream_write"] = end
            elif upstream is not None and fd2 == upstream and n2 in ("read", "recvfrom") and r2 > 0:
                if "head_read" not in steps:
                    steps["head_read"] = end
                elif "chunk_read" not in steps and "head_written" in steps:
                    steps["chunk_read"] = end
            elif fd2 == client and n2 in ("write", "writev", "sendto") and r2 > 0:
                if "head_written" not in steps and "head_read" in steps:
                    steps["head_written"] = end
                elif "chunk_read" in steps and "chunk_written" not in steps:
                    steps["chunk_written"] = end
                    break
            j += 1
        calls.append(steps)
        i = j
    i += 1
order = ["accept", "request_read", "connect_start", "connect_end", "upstream_write", "head_read", "head_written", "chunk_read", "chunk_written"]
print(f"{len(calls)} calls")
for a, b in zip(order, order[1:]):
    gaps = [ (c[b] - c[a]) * 1000 for c in calls if a in c and b in c]
    if gaps:
        print(f"{a:>15} -> {b:<15} median {statistics.median(gaps):8.1f} us  (n={len(gaps)})")
