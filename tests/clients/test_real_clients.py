"""Unchanged client code from the openai and ollama packages, streaming
through `speedtap run` to `speedtap simulate`; the calls are then checked
through the control API."""
import json
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import ollama
import openai

from conftest import TOKENS, TTFT_MS, TPS


def check_call(call, api):
    assert call["api"] == api, call
    assert call["status"] == "ok", call
    assert call["http_status"] == 200
    speed = call["speed"]
    assert speed["is_final"] and speed["phase"] == "complete"
    assert speed["output_tokens"] == TOKENS, speed
    # TTFT measured at the proxy: at least the scripted wait, not much more.
    assert TTFT_MS <= speed["time_to_first_token_ms"] < TTFT_MS + 250, speed
    # The settled decode rate against the scripted one.
    rate = speed["output_tokens_per_second"]
    assert abs(rate - TPS) / TPS < 0.15, speed


def test_openai_chat_stream(stack):
    client = openai.OpenAI(base_url=f"{stack.proxy}/v1", api_key="sk-test")
    stream = client.chat.completions.create(
        model="sim-model", messages=[{"role": "user", "content": "hi"}], stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert len(text.split()) == TOKENS
    (call,) = stack.settled(1)
    check_call(call, "openai_chat")
    assert call["model"] == "sim-model"


def test_openai_completions_and_responses(stack):
    client = openai.OpenAI(base_url=f"{stack.proxy}/v1", api_key="sk-test")
    text = "".join(c.choices[0].text for c in client.completions.create(
        model="sim-model", prompt="hi", stream=True) if c.choices)
    assert len(text.split()) == TOKENS
    events = list(client.responses.create(model="sim-model", input="hi", stream=True))
    assert events[-1].type == "response.completed"
    calls = stack.settled(2)
    by_api = {c["api"]: c for c in calls}
    check_call(by_api["openai_completions"], "openai_completions")
    check_call(by_api["openai_responses"], "openai_responses")


def test_openai_completions_and_responses_thirty_times_are_never_abandoned(stack):
    """The openai SDK stops reading at the end marker and closes the
    response, often before the proxy has forwarded the upstream's end of
    body. A finished call must still be `ok` every time, whoever closed
    first (5 clients at once, 30 rounds of both calls)."""
    client = openai.OpenAI(base_url=f"{stack.proxy}/v1", api_key="sk-test")

    def one_round(_):
        list(client.completions.create(model="sim-model", prompt="hi", stream=True))
        list(client.responses.create(model="sim-model", input="hi", stream=True))

    with ThreadPoolExecutor(max_workers=5) as pool:
        list(pool.map(one_round, range(30)))
    calls = stack.settled(60)
    assert Counter(c["status"] for c in calls) == {"ok": 60}, calls
    for call in calls:
        assert call["speed"]["output_tokens_per_second"] is not None, call
        assert call["model"] == "sim-model", call


def test_ollama_chat_and_generate(stack):
    client = ollama.Client(host=stack.proxy)
    parts = [p["message"]["content"] for p in client.chat(
        model="sim-model", messages=[{"role": "user", "content": "hi"}], stream=True)]
    assert len("".join(parts).split()) == TOKENS
    parts = [p["response"] for p in client.generate(model="sim-model", prompt="hi", stream=True)]
    assert len("".join(parts).split()) == TOKENS
    calls = stack.settled(2)
    by_api = {c["api"]: c for c in calls}
    check_call(by_api["ollama_chat"], "ollama_chat")
    check_call(by_api["ollama_generate"], "ollama_generate")


def test_json_lines_follow_the_contract(stack):
    client = openai.OpenAI(base_url=f"{stack.proxy}/v1", api_key="sk-test")
    list(client.chat.completions.create(
        model="sim-model", messages=[{"role": "user", "content": "hi"}], stream=True))
    (call,) = stack.settled(1)
    stack.stop()
    lines = [json.loads(l) for l in (stack.tmp / "run.jsonl").read_text().splitlines() if l]
    assert lines, "no --json output"
    for line in lines:
        assert set(line) == {"call", "speed", "seen_by"}
        assert line["seen_by"] == "proxy"
        assert line["call"]["id"] == call["id"]
        assert line["speed"]["phase"] in (
            "awaiting_first_token", "reasoning", "responding", "calling_tool", "complete")
    assert lines[0]["speed"]["phase"] == "awaiting_first_token"
    assert lines[-1]["speed"]["is_final"] is True
    assert lines[-1]["speed"] == call["speed"]


def test_capture_measures_unchanged_clients_talking_to_the_server_itself(capture_stack):
    """No client is re-pointed: the openai and ollama packages talk to the
    simulator's own port, and `speedtap run --capture` measures both calls
    from the loopback packets, once each, as seen by capture."""
    import time

    stopwatch = {}
    client = openai.OpenAI(base_url=f"{capture_stack.upstream}/v1", api_key="sk-test")
    t0 = time.monotonic()
    first = None
    text = ""
    for c in client.chat.completions.create(
            model="sim-model", messages=[{"role": "user", "content": "hi"}], stream=True):
        if c.choices and c.choices[0].delta.content:
            first = first or time.monotonic()
            text += c.choices[0].delta.content
    stopwatch["openai_chat"] = (first - t0) * 1000
    assert len(text.split()) == TOKENS

    t0 = time.monotonic()
    first = None
    for part in ollama.Client(host=capture_stack.upstream).chat(
            model="sim-model", messages=[{"role": "user", "content": "hi"}], stream=True):
        if part["message"]["content"]:
            first = first or time.monotonic()
    stopwatch["ollama_chat"] = (first - t0) * 1000

    calls = capture_stack.settled(2)
    assert len(calls) == 2, calls
    by_api = {c["api"]: c for c in calls}
    for api in ("openai_chat", "ollama_chat"):
        call = by_api[api]
        check_call(call, api)
        assert call["seen_by"] == "capture", call
        assert call["model"] == "sim-model", call
        # The wire TTFT can't exceed the client's own stopwatch, which also
        # holds the SDK's request building and parsing (2 ms for rounding).
        ttft = call["speed"]["time_to_first_token_ms"]
        assert ttft <= stopwatch[api] + 2, (ttft, stopwatch[api])
