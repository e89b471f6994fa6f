"""The /proc readers the footprint scripts share.

`scripts/footprint` (the tray app) and `scripts/footprint-headless`
(`speedtap run`) measure the same things from the same files: a process's
memory from /proc/PID/smaps_rollup and /proc/PID/status, and how often each
of its threads woke, from the context switches in /proc/PID/task/*/status.
Both read them here, so a figure in the tray's table and one in the
headless table mean the same thing.

Every reader tolerates a process or thread that ends between two reads
(they do: WebKit's processes come and go, threads exit): what is gone reads
as empty, never as an error.
"""

import os
import re


def read(path):
    """The text of a /proc file, or "" when it can't be read (gone)."""
    text = read_or_none(path)
    return "" if text is None else text


def read_or_none(path):
    """The text of a /proc file, or None when it can't be read, so a caller
    can tell a process that is gone from a file with nothing in it."""
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def kb(text, field):
    """The `FIELD:   N kB` figure of a status or smaps_rollup text, 0 when
    the text has no such line."""
    m = re.search(rf"^{field}:\s+(\d+) kB", text, re.M)
    return int(m.group(1)) if m else 0


def pss_rss_kb(pid):
    """(PSS, RSS) in kB of one process from its smaps_rollup, or None if it
    is gone. PSS splits each shared page among the processes that map it
    (the fair "what this costs" figure); RSS counts it in full in each."""
    text = read_or_none(f"/proc/{pid}/smaps_rollup")
    if text is None:
        return None
    return kb(text, "Pss"), kb(text, "Rss")


def thread_switches(pid):
    """{thread id: (name, voluntary + involuntary context switches so far)}
    of one process; {} when it is gone. A thread that sleeps until a timer
    or an event switches once each time it wakes, so the growth of these
    counts over a quiet stretch is how often each thread woke."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        status = read_or_none(f"/proc/{pid}/task/{tid}/status")
        if status is None:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        count = int(fields.get("voluntary_ctxt_switches", 0)) + int(fields.get("nonvoluntary_ctxt_switches", 0))
        out[tid] = (fields.get("Name", "").strip(), count)
    return out
