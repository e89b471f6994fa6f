"""Starts `speedtap simulate` and `speedtap run` for the real-client tests.

The clients under test are the published `openai` and `ollama` Python
packages, used exactly as their docs show, with only the base URL pointed
at speedtap.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

# `tests/pyhelpers.py` is one directory up, which pytest does not put on
# `sys.path` for this directory's modules.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from pyhelpers import free_port, get_json, wait_until  # noqa: E402

BIN = os.environ.get("SPEEDTAP_BIN", "target/debug/speedtap")
TOKENS = 40
TTFT_MS = 120
TPS = 50  # 40 tokens over 0.78 s: above the 500 ms a settled rate needs


SIM_ARGS = ["--ttft-ms", str(TTFT_MS), "--tps", str(TPS), "--tokens", str(TOKENS), "--usage"]


class Stack:
    def __init__(self, tmp_path, capture=False, proxy=None, sim_args=SIM_ARGS):
        self.sim_port, self.proxy_port, self.api_port = free_port(), free_port(), free_port()
        self.procs = []
        self.tmp = tmp_path
        # Capture: `--capture`; the clients may then talk to the simulator
        # itself, unchanged. The route has a proxy port unless capture is
        # on and `proxy` is not asked for (a capture-only route,
        # NAME=UPSTREAM).
        self.capture = capture
        self.with_proxy = (not capture) if proxy is None else proxy
        self.sim_args = sim_args

    def start(self):
        sim = subprocess.Popen(
            [BIN, "simulate", "--listen", f"127.0.0.1:{self.sim_port}", *self.sim_args],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.procs.append(sim)
        wait_until(lambda: get_json(f"http://127.0.0.1:{self.sim_port}/health"), "simulate")
        self.run_out = open(self.tmp / "run.jsonl", "w")
        self.run_err = open(self.tmp / "run.stderr", "w")
        if self.with_proxy:
            route = ["--route", f"sim=127.0.0.1:{self.proxy_port}=http://127.0.0.1:{self.sim_port}"]
        else:
            route = ["--route", f"sim=http://127.0.0.1:{self.sim_port}"]
        if self.capture:
            route.append("--capture")
        run = subprocess.Popen(
            [BIN, "run", "--no-db", "--json", *route, "--api", f"127.0.0.1:{self.api_port}"],
            stdout=self.run_out, stderr=self.run_err)
        self.procs.append(run)
        wait_until(lambda: get_json(f"{self.api}/api/v1/stats") is not None, "speedtap run")
        return self

    def stderr(self):
        return (self.tmp / "run.stderr").read_text()

    def wait_capture_status(self):
        """Waits for the capture's status line; skips the test, with the
        reason speedtap printed, where the capture helper can't open its
        packet socket (CI runs as root, so it runs there)."""
        wait_until(lambda: "captur" in self.stderr(), "the capture status line")
        if "capture is off" in self.stderr():
            reason = self.stderr().strip().splitlines()[-1]
            self.stop()
            # CI sets this: there the capture must run, never skip.
            assert not os.environ.get("SPEEDTAP_CAPTURE_REQUIRE"), reason
            pytest.skip(reason)

    @property
    def upstream(self):
        return f"http://127.0.0.1:{self.sim_port}"

    @property
    def api(self):
        return f"http://127.0.0.1:{self.api_port}"

    @property
    def proxy(self):
        return f"http://127.0.0.1:{self.proxy_port}"

    def calls(self):
        return get_json(f"{self.api}/api/v1/calls?limit=1000&unmetered=1")["calls"]

    def settled(self, n):
        """Waits until at least n calls have settled, returns them."""
        out = []

        def ready():
            out[:] = [c for c in self.calls() if c["status"] != "in_flight"]
            return len(out) >= n
        wait_until(ready, f"{n} settled calls")
        return out

    def stop(self):
        run = self.procs[-1]
        run.send_signal(2)
        try:
            code = run.wait(timeout=10)
        finally:
            for p in self.procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            self.run_out.close()
            self.run_err.close()
        return code


@pytest.fixture
def stack(tmp_path):
    s = Stack(tmp_path).start()
    yield s
    assert s.stop() == 0, "speedtap run must exit 0 on SIGINT"


@pytest.fixture
def capture_stack(tmp_path):
    """`speedtap run --capture` with a capture-only route to the simulator.
    Skipped, with the reason speedtap printed, where the capture helper
    can't open its packet socket (CI runs as root, so it runs there)."""
    s = Stack(tmp_path, capture=True).start()
    s.wait_capture_status()
    yield s
    assert s.stop() == 0, "speedtap run must exit 0 on SIGINT"
