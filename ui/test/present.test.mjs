import { test } from "node:test";
import assert from "node:assert/strict";
import { DASH } from "../lib/format.js";
import { callRow, globalPanel, slowdownCause, slowdownView, stalledText, waitView } from "../lib/present.js";

const settled = {
  id: "c-000042",
  route: "ollama",
  api: "openai_chat",
  model: "qwen3:8b",
  started_at: "2026-11-30T10:42:07.123Z",
  status: "ok",
  http_status: 200,
  speed: {
    phase: "complete", is_final: true, elapsed_ms: 5120, time_to_first_token_ms: 312,
    output_tokens: 201, output_tokens_per_second: 41.7, token_source: "server",
  },
  input_tokens: 37,
};

test("a settled call shows all its numbers", () => {
  const r = callRow(settled);
  assert.equal(r.route, "ollama");
  assert.equal(r.model, "qwen3:8b");
  assert.equal(r.api, "OpenAI chat");
  assert.deepEqual(r.phase, { text: "complete", kind: "complete" });
  assert.equal(r.ttft, "312 ms");
  assert.equal(r.rate, "41.7");
  assert.equal(r.tokens, "201");
  assert.equal(r.source.text, "server");
  assert.deepEqual(r.status, { text: "ok", kind: "ok" });
  assert.equal(r.inFlight, false);
  assert.equal(r.unmetered, false);
});

test("a call waiting for its first token hides TTFT and rate, not the count", () => {
  const r = callRow({
    id: "c-1", route: "sim", api: "openai_chat", started_at: "t", status: "in_flight",
    speed: { phase: "awaiting_first_token", is_final: false, elapsed_ms: 0, output_tokens: 0, token_source: "estimated" },
  });
  assert.equal(r.phase.text, "waiting");
  assert.equal(r.ttft, DASH);
  assert.equal(r.rate, DASH);
  assert.equal(r.tokens, "0", "zero tokens so far is a real count");
  assert.equal(r.model, DASH, "model not known yet");
  assert.equal(r.inFlight, true);
});

test("an absent rate is a dash even when everything else is there", () => {
  const speed = { ...settled.speed };
  delete speed.output_tokens_per_second;
  const r = callRow({ ...settled, speed });
  assert.equal(r.rate, DASH);
  assert.equal(r.ttft, "312 ms");
});

test("an unmetered call (no snapshot) shows dashes and is marked", () => {
  const r = callRow({ id: "c-2", route: "sim", api: "unknown", started_at: "t", status: "unmetered", http_status: 200 });
  assert.equal(r.phase, null);
  assert.equal(r.ttft, DASH);
  assert.equal(r.rate, DASH);
  assert.equal(r.tokens, DASH);
  assert.equal(r.source, null);
  assert.equal(r.status.text, "unmetered");
  assert.equal(r.unmetered, true);
});

test("the slow marker shows only while the call is still waiting", () => {
  const waiting = {
    id: "c-3", route: "sim", api: "ollama_chat", started_at: "t", status: "in_flight",
    speed: { phase: "awaiting_first_token", is_final: false, elapsed_ms: 0, output_tokens: 0, token_source: "estimated" },
  };
  const slow = { waited_ms: 5000, threshold_ms: 5000 };
  assert.equal(callRow(waiting, { slow }).slow, "No first token after 5.0 s (threshold 5.0 s)");
  const responding = { ...waiting, speed: { ...waiting.speed, phase: "responding", time_to_first_token_ms: 6100 } };
  assert.equal(callRow(responding, { slow }).slow, null);
  assert.equal(callRow(waiting).slow, null);
});

const streamingCall = (id, model, rate, extra = {}) => ({
  ...settled,
  id,
  model,
  status: "in_flight",
  http_status: null,
  speed: { ...settled.speed, phase: "responding", is_final: false, output_tokens_per_second: rate, token_source: "provider", ...extra },
});
const contract = { tps: 47.3, tps_available: true, estimated: false, high: 52.1, low: 31.4, active: 1, aggregate_tps: 47.3 };

test("global panel: one streaming call's Now is its own rate, whatever the engine's mean", () => {
  const v = globalPanel({ ...contract, tps: 43.6 }, [streamingCall("c-1", "qwen3:8b", 40.0), settled]);
  assert.deepEqual(v, {
    now: "40.0", who: "qwen3:8b on ollama", perModel: false, estimated: false, aggregate: "47.3",
    active: "1", streaming: "1 streaming", high: "52.1", low: "31.4",
  });
});

test("global panel: several streams give one figure per model, never a mean across models", () => {
  const calls = [
    streamingCall("c-1", "qwen3", 40.0),
    streamingCall("c-2", "gemma", 15.0),
    streamingCall("c-3", "qwen3", 38.0, { token_source: "estimated" }),
  ];
  const v = globalPanel({ ...contract, tps: 31.0 }, calls);
  assert.equal(v.now, "gemma 15 · qwen3 39");
  assert.equal(v.who, "per model, 3 streams");
  assert.equal(v.perModel, true);
  assert.equal(v.estimated, true, "one stream's count is an estimate");
});

test("global panel: the counts are the table's calls in flight, and those streaming", () => {
  const waiting = { ...streamingCall("c-4", "qwen3", undefined), speed: { ...settled.speed, phase: "awaiting_first_token", is_final: false, output_tokens_per_second: undefined } };
  const noRateYet = streamingCall("c-5", "qwen3", undefined);
  const stalled = streamingCall("c-6", "gemma", 14.1, { stalled_ms: 4000 });
  // The engine's own stream count (0) is not what the panel shows.
  const v = globalPanel({ tps_available: false, active: 0 }, [waiting, noRateYet, stalled, settled]);
  assert.equal(v.active, "3");
  assert.equal(v.streaming, "2 streaming");
  assert.equal(v.now, DASH, "no current rate: none streams with one, and a stalled stream's last rate is not current");
  assert.equal(v.who, "no stream with a rate");
});

test("global panel: nothing available shows dashes, never 0", () => {
  const v = globalPanel({ tps_available: false, estimated: false, active: 0 }, []);
  assert.deepEqual(v, { now: DASH, who: "no stream with a rate", perModel: false, estimated: false, aggregate: DASH, active: "0", streaming: "0 streaming", high: DASH, low: DASH });
  const unknown = { now: DASH, who: "", perModel: false, estimated: false, aggregate: DASH, active: DASH, streaming: "", high: DASH, low: DASH };
  assert.deepEqual(globalPanel(null), unknown, "before any stats or calls");
  assert.deepEqual(globalPanel(contract), { ...unknown, aggregate: "47.3", high: "52.1", low: "31.4" }, "before the calls list: no count, no Now");
});

test("a row names the client (app) that made the call, and when it started", () => {
  const now = Date.parse("2026-11-30T12:00:00.000Z");
  const r = callRow({ ...settled, client: "ollama-python" }, { now, timeZone: "UTC" });
  assert.equal(r.client, "ollama-python");
  assert.equal(r.started, "10:42:07");
  // Unknown (a live call before its record arrives, no User-Agent): a dash.
  assert.equal(callRow(settled).client, DASH);
});

test("a live call silent past its stall threshold shows stalled with whole seconds, and a settled one never does", () => {
  const live = { id: "c-9", route: "sim", api: "openai_chat", started_at: "t", status: "in_flight",
    speed: { phase: "responding", is_final: false, elapsed_ms: 15000, output_tokens: 5, token_source: "estimated", stalled_ms: 12400 } };
  assert.equal(callRow(live).stalled, "stalled 12 s");
  assert.equal(stalledText(live.speed), "stalled 12 s");
  const resumed = { ...live, speed: { ...live.speed, stalled_ms: undefined, output_tokens: 6 } };
  assert.equal(callRow(resumed).stalled, null);
  const settled = { ...live, status: "ok", speed: { ...live.speed, is_final: true } };
  assert.equal(callRow(settled).stalled, null);
});

test("a live wait says how long the server has been silent; a past one does not", () => {
  const wait = { reason: "prefilling", progress: 0.41, silent_ms: 400 };
  const live = waitView(wait);
  assert.deepEqual(live.facts.find((f) => f.label === "Server silent")?.value, "400 ms");
  assert.equal(waitView(wait, { past: true }).facts.find((f) => f.label === "Server silent"), undefined);
});

test("a slowdown's causes read as the engine's notification says them", () => {
  assert.equal(slowdownCause({ kind: "cpu_offload", cpu_share: 0.29 }), "29% of the model runs on the CPU");
  assert.equal(slowdownCause({ kind: "server_changed", from: "0.32.13", to: "0.33.2" }), "since the server went from 0.32.13 to 0.33.2");
  assert.equal(slowdownCause({ kind: "concurrent", calls: 1 }), "1 other call streamed beside it");
  assert.equal(slowdownCause({ kind: "concurrent", calls: 2 }), "2 other calls streamed beside it");
  assert.equal(slowdownCause({ kind: "unknown" }), "no cause seen");
  assert.equal(
    slowdownCause({ kind: "draft_acceptance", usual: 0.8, now: 0.3 }),
    "the draft model's tokens are accepted 30% of the time, usually 80%",
  );
  assert.equal(slowdownCause({ kind: "draft_acceptance" }), "the draft model's tokens are accepted less than usual");
  assert.equal(slowdownCause({ kind: "new_kind" }), "new kind", "a kind this UI does not know is shown by its name");
  assert.equal(slowdownCause(null), null);
});

test("a slow settled call's row shows its ratio to the usual, with the causes in its title", () => {
  const slow = {
    ...settled,
    speed: { ...settled.speed, output_tokens_per_second: 12 },
    slowdown: { usual_tps: 40, ratio: 0.3, causes: [{ kind: "cpu_offload", cpu_share: 0.29 }] },
  };
  const row = callRow(slow);
  assert.equal(row.slowdown.badge, "0.3× usual");
  assert.equal(row.slowdown.title, "Decoded at 12.0 tok/s, 0.3× the usual 40.0 tok/s: 29% of the model runs on the CPU");
  assert.equal(callRow(settled).slowdown, null, "a call that was not slow has no badge");
});

test("a slowdown with several causes lists each; one without a rate still says the ratio", () => {
  const v = slowdownView({
    usual_tps: 35,
    ratio: 0.34,
    causes: [
      { kind: "cpu_offload", cpu_share: 0.29 },
      { kind: "server_changed", from: "0.32.13", to: "0.33.2" },
    ],
  });
  assert.equal(v.sentence, "Decoded at 0.34× the usual 35.0 tok/s");
  assert.deepEqual(v.causes, ["29% of the model runs on the CPU", "since the server went from 0.32.13 to 0.33.2"]);
  assert.equal(slowdownView({ usual_tps: 35 }), null, "no ratio, nothing shown");
  assert.equal(slowdownView(undefined), null);
});

test("a failed settled call's pill reads failed and its status says how, never 'upstream error 200'", () => {
  const r = callRow({
    ...settled,
    status: "upstream_error",
    http_status: 200,
    failure: { kind: "stream_error", after_tokens: 12, message: "model 'x' not found" },
  });
  assert.deepEqual(r.phase, { text: "failed", kind: "failed" });
  assert.deepEqual(r.status, { text: "server error mid-stream", kind: "upstream_error" });
  assert.equal(r.outcome, "failed");
  assert.equal(r.failureTitle, "server error mid-stream: model 'x' not found");
});

test("an older failed record without a failure still reads failed, with its HTTP code", () => {
  const r = callRow({ ...settled, status: "upstream_error", http_status: 500 });
  assert.deepEqual(r.phase, { text: "failed", kind: "failed" });
  assert.equal(r.status.text, "HTTP 500");
  assert.equal(r.failureTitle, "HTTP 500");
});

test("a call whose client left reads client left, neutral rather than failed", () => {
  const r = callRow({ ...settled, status: "abandoned", failure: { kind: "client_left", after_tokens: 4 } });
  assert.deepEqual(r.phase, { text: "client left", kind: "client_left" });
  assert.equal(r.status.text, "client left");
  assert.equal(r.outcome, "client_left");
  assert.equal(callRow({ ...settled, status: "abandoned" }).status.text, "ended early");
});

test("a call that ended well keeps its complete pill and ok status, with no outcome", () => {
  const r = callRow(settled);
  assert.equal(r.outcome, null);
  assert.equal(r.failureTitle, "");
  assert.equal(r.stallMark, null);
});

test("a settled call that stalled is marked stalled, with how often and how long in its title", () => {
  const once = callRow({ ...settled, stalls: 1, stalled_ms: 20_100 });
  assert.equal(once.stallMark.text, "stalled");
  assert.match(once.stallMark.title, /once \(20\.1 s in all\)/);
  assert.match(callRow({ ...settled, stalls: 3, stalled_ms: 25_000 }).stallMark.title, /3 times \(25\.0 s in all\)/);
  assert.equal(callRow({ ...settled, status: "in_flight", stalls: 1 }).stallMark, null, "a live call has its own stalled badge");
});
