"""Helpers shared by the Python tests that drive a real `speedtap`
(`tests/clients/conftest.py`, `tests/metrics_parse.py`): free loopback
ports, waiting on a condition with a deadline, and plain HTTP GETs.

Not a test module itself (pytest collects only `test_*.py` and the files
named on its command line). `tests/metrics_parse.py` imports it from its
own directory; `tests/clients/conftest.py` puts this directory on
`sys.path` first.
"""
import json
import socket
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate, what, timeout=20.0):
    """Polls `predicate` until it is truthy; an exception counts as "not
    yet" (the server may not be up), and the last one is reported if the
    deadline passes."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except Exception as e:  # not up yet
            last = e
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}: {last}")


def get_text(url):
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read().decode()


def get_json(url):
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.load(r)
