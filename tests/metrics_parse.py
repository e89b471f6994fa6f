"""`GET /metrics` of a real `speedtap run`, read by a real Prometheus text
parser (the `prometheus_client` package's), after real streamed calls.

Starts `speedtap simulate` and `speedtap run --no-db` on free loopback
ports, streams a few chat completions through the proxy with urllib, waits
until the control API reports them settled, then scrapes `/metrics` and
checks what a Prometheus server would see: every family with its type, the
OTel GenAI bucket boundaries exactly, and counts that match the calls made.

Run: `SPEEDTAP_BIN=target/debug/speedtap target/py/bin/python -m pytest -q tests/metrics_parse.py`
"""
import json
import math
import os
import subprocess
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pyhelpers import free_port, get_json, get_text, wait_until

BIN = os.environ.get("SPEEDTAP_BIN", "target/debug/speedtap")
CALLS = 3
TOKENS = 60
TTFT_MS = 120
TPS = 50  # 60 tokens in ~1.2 s: long enough for 1 Hz readings with a rate
MODEL = "sim-model"
WAIT_S = 30.0  # how long each wait below may take before the test fails

# The OTel GenAI semantic conventions' recommended bucket boundaries.
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
                0.75, 1.0, 2.5, 5.0, 7.5, 10.0]
TPOT_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                0.75, 1.0, 2.5]
DURATION_BUCKETS = [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56,
                    5.12, 10.24, 20.48, 40.96, 81.92]
TOKEN_BUCKETS = [1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144,
                 1048576, 4194304, 16777216, 67108864]

# Family name as the parser reports it (counters lose `_total`) -> type.
EXPECTED = {
    "gen_ai_server_time_to_first_token_seconds": "histogram",
    "gen_ai_server_time_per_output_token_seconds": "histogram",
    "gen_ai_server_request_duration_seconds": "histogram",
    "gen_ai_client_operation_duration_seconds": "histogram",
    "gen_ai_client_operation_time_to_first_chunk_seconds": "histogram",
    "gen_ai_client_token_usage": "histogram",
    "speedtap_calls": "counter",
    "speedtap_output_tokens": "counter",
    "speedtap_active_calls": "gauge",
    "speedtap_subscribers_dropped": "counter",
    "speedtap_tokens_per_second_hour_high": "gauge",
    "speedtap_tokens_per_second_hour_low": "gauge",
    "speedtap_proxy_added_latency_seconds": "histogram",
}


@pytest.fixture
def stack(tmp_path):
    sim_port, proxy_port, api_port = free_port(), free_port(), free_port()
    # Keep the user's config and data out of it.
    env = dict(os.environ, HOME=str(tmp_path), XDG_CONFIG_HOME=str(tmp_path / "config"),
               XDG_DATA_HOME=str(tmp_path / "data"))
    procs = []
    try:
        procs.append(subprocess.Popen(
            [BIN, "simulate", "--listen", f"127.0.0.1:{sim_port}", "--ttft-ms", str(TTFT_MS),
             "--tps", str(TPS), "--tokens", str(TOKENS), "--usage"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env))
        wait_until(lambda: get_text(f"http://127.0.0.1:{sim_port}/health"), "simulate", WAIT_S)
        procs.append(subprocess.Popen(
            [BIN, "run", "--no-db", "--json",
             "--route", f"sim=127.0.0.1:{proxy_port}=http://127.0.0.1:{sim_port}",
             "--api", f"127.0.0.1:{api_port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env))
        api = f"http://127.0.0.1:{api_port}"
        wait_until(lambda: get_text(f"{api}/api/v1/stats"), "speedtap run", WAIT_S)
        yield {"api": api, "proxy": f"http://127.0.0.1:{proxy_port}", "sim_port": sim_port}
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(2)
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


def stream_chat(proxy):
    body = json.dumps({
        "model": MODEL, "stream": True, "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "count to sixty"}],
    }).encode()
    req = urllib.request.Request(f"{proxy}/v1/chat/completions", data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200
        data = r.read()
    assert b"data: [DONE]" in data


def settled(api):
    calls = get_json(f"{api}/api/v1/calls")["calls"]
    return [c for c in calls if c["status"] != "in_flight"]


def scrape(api):
    with urllib.request.urlopen(f"{api}/metrics", timeout=5) as r:
        assert r.headers["Content-Type"].startswith("text/plain")
        text = r.read().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def samples(family, suffix):
    return [s for s in family.samples if s.name == family.name + suffix]


def bounds(family, labels_without_le):
    return [float(s.labels["le"]) for s in samples(family, "_bucket")
            if {k: v for k, v in s.labels.items() if k != "le"} == labels_without_le]


def test_metrics_parse_with_the_prometheus_parser(stack):
    for _ in range(CALLS):
        stream_chat(stack["proxy"])
    wait_until(lambda: len(settled(stack["api"])) >= CALLS, f"{CALLS} settled calls", WAIT_S)
    calls = settled(stack["api"])
    assert [c["status"] for c in calls] == ["ok"] * CALLS
    # The hourly high/low come with the next stats publication that saw a
    # rate; the calls streamed for over a second each, at 1 Hz readings.
    wait_until(lambda: "high" in get_json(f"{stack['api']}/api/v1/stats"), "an hourly high",
               WAIT_S)

    families = scrape(stack["api"])
    for name, kind in EXPECTED.items():
        assert name in families, f"{name} missing; got {sorted(families)}"
        assert families[name].type == kind, (name, families[name].type)
        assert families[name].documentation, f"{name} has no help text"

    # TTFT: exactly the OTel boundaries plus +Inf, one series for our model,
    # and as many observations as calls.
    ttft = families["gen_ai_server_time_to_first_token_seconds"]
    counts = samples(ttft, "_count")
    # Two series for our model: the calls, which carry the model the
    # answer named, and its sibling without one (a failure before any
    # answer names none), made at zero with the first call.
    answered = [s for s in counts if "gen_ai_response_model" in s.labels]
    assert len(answered) == 1 and len(counts) == 2, counts
    (unnamed,) = [s for s in counts if "gen_ai_response_model" not in s.labels]
    assert unnamed.value == 0, unnamed
    labels = answered[0].labels
    assert labels["gen_ai_request_model"] == MODEL
    assert labels["gen_ai_response_model"] == MODEL
    assert labels["gen_ai_operation_name"] == "chat"
    # A route configured by hand: speedtap doesn't know the server's kind
    # and says so (the conventions' _OTHER); the API it decoded is its own.
    assert labels["gen_ai_provider_name"] == "_OTHER"
    assert labels["speedtap_api"] == "openai_chat"
    assert labels["route"] == "sim"
    assert "error_type" not in labels
    if "server_address" in labels:  # once the host tells the metrics the upstream
        assert labels["server_address"] == "127.0.0.1"
        assert labels["server_port"] == str(stack["sim_port"])
    assert answered[0].value == CALLS
    assert bounds(ttft, labels) == TTFT_BUCKETS + [math.inf]
    ours = [s for s in samples(ttft, "_bucket")
            if {k: v for k, v in s.labels.items() if k != "le"} == labels]
    buckets = [s.value for s in ours]
    assert buckets == sorted(buckets), "buckets are cumulative"
    assert buckets[-1] == CALLS
    # Each TTFT is at least the simulator's 120 ms: nothing at or under 0.1 s.
    le_01 = [s.value for s in ours if float(s.labels["le"]) == 0.1]
    assert le_01 == [0.0]
    (ttft_sum,) = [s.value for s in samples(ttft, "_sum") if s.labels == labels]
    assert CALLS * TTFT_MS / 1000 <= ttft_sum < CALLS * 5.0

    for name, expected in [
        ("gen_ai_server_time_per_output_token_seconds", TPOT_BUCKETS),
        ("gen_ai_server_request_duration_seconds", DURATION_BUCKETS),
        ("gen_ai_client_operation_duration_seconds", DURATION_BUCKETS),
        ("gen_ai_client_operation_time_to_first_chunk_seconds", DURATION_BUCKETS),
    ]:
        fam = families[name]
        # The error_type series exist at zero from the first call on.
        (count,) = [s for s in samples(fam, "_count")
                    if "error_type" not in s.labels and "gen_ai_response_model" in s.labels]
        assert count.value == CALLS, name
        assert bounds(fam, count.labels) == expected + [math.inf], name

    usage = families["gen_ai_client_token_usage"]
    named = [s for s in samples(usage, "_count") if "gen_ai_response_model" in s.labels]
    by_type = {s.labels["gen_ai_token_type"]: s for s in named}
    assert set(by_type) == {"input", "output"} and len(named) == 2, named
    assert by_type["output"].value == CALLS
    assert bounds(usage, by_type["output"].labels) == [float(b) for b in TOKEN_BUCKETS] + [math.inf]
    (output_sum,) = [s for s in samples(usage, "_sum") if s.labels == by_type["output"].labels]
    assert output_sum.value == CALLS * TOKENS

    (ok_calls,) = [s for s in families["speedtap_calls"].samples
                   if s.name == "speedtap_calls_total" and s.labels == {"route": "sim", "status": "ok"}]
    assert ok_calls.value == CALLS
    (tokens_total,) = [s for s in families["speedtap_output_tokens"].samples
                       if s.name == "speedtap_output_tokens_total"
                       and "gen_ai_response_model" in s.labels]
    assert tokens_total.value == CALLS * TOKENS

    (active,) = families["speedtap_active_calls"].samples
    assert active.value >= 0
    (high,) = families["speedtap_tokens_per_second_hour_high"].samples
    (low,) = families["speedtap_tokens_per_second_hour_low"].samples
    assert 1.0 <= low.value <= high.value

    proxy = families["speedtap_proxy_added_latency_seconds"]
    (frames,) = samples(proxy, "_count")
    # At least one frame per call (the simulator sends one per token).
    assert frames.value >= CALLS
    assert samples(proxy, "_sum")[0].value >= 0
