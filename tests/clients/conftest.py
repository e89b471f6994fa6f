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


class Stack:
    def __init__(self, tmp_path):
        self.sim_port, self.proxy_port, self.api_port = free_port(), free_port(), free_port()
        self.procs = []
        self.tmp = tmp_path

    def start(self):
        sim = subprocess.Popen(
            [BIN, "simulate", "--listen", f"127.0.0.1:{self.sim_port}",
             "--ttft-ms", str(TTFT_MS), "--tps", str(TPS), "--tokens", str(TOKENS), "--usage"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.procs.append(sim)
        wait_until(lambda: get_json(f"http://127.0.0.1:{self.sim_port}/health"), "simulate")
        self.run_out = open(self.tmp / "run.jsonl", "w")
        run = subprocess.Popen(
            [BIN, "run", "--no-db", "--json",
             "--route", f"sim=127.0.0.1:{self.proxy_port}=http://127.0.0.1:{self.sim_port}",
             "--api", f"127.0.0.1:{self.api_port}"],
            stdout=self.run_out, stderr=subprocess.DEVNULL)
        self.procs.append(run)
        wait_until(lambda: get_json(f"{self.api}/api/v1/stats") is not None, "speedtap run")
        return self

    @property
    def api(self):
        return f"http://127.0.0.1:{self.api_port}"

    @property
    def proxy(self):
        return f"http://127.0.0.1:{self.proxy_port}"

    def calls(self):
        return get_json(f"{self.api}/api/v1/calls?limit=1000")["calls"]

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
        return code


@pytest.fixture
def stack(tmp_path):
    s = Stack(tmp_path).start()
    yield s
    assert s.stop() == 0, "speedtap run must exit 0 on SIGINT"
