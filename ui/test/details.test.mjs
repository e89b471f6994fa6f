import { test } from "node:test";
import assert from "node:assert/strict";
import { breakdownSegments, callDetails, callFacts, callFlags, failureLine, rateExplanation, reasoningSplit, slowLimitFact, stallLine } from "../lib/details.js";

const ollama = {
  id: "c-000042",
  route: "ollama",
  api: "ollama_chat",
  model: "llama3.2:3b",
  client: "ollama-python",
  started_at: "2026-11-30T10:42:07.123Z",
  settled_at: "2026-11-30T10:42:12.243Z",
  status: "ok",
  http_status: 200,
  speed: {
    phase: "complete", is_final: true, elapsed_ms: 5120, time_to_first_token_ms: 700,
    output_tokens: 201, output_tokens_per_second: 41.7, token_source: "server",
  },
  input_tokens: 26,
  ttft_breakdown: { load_ms: 535, prefill_ms: 107.3, prefill_tokens: 26, prefill_tokens_per_second: 242.2, other_ms: 57.7 },
};

test("breakdown: load, prefill (with its tokens and rate) and the rest, as fractions of the TTFT", () => {
  const b = breakdownSegments(ollama);
  assert.equal(b.ttft, "700 ms");
  assert.equal(b.totalMs, 700);
  assert.deepEqual(b.segments.map((s) => s.key), ["load", "prefill", "other"]);
  assert.deepEqual(b.segments.map((s) => s.label), ["Cold load", "Prefill", "The rest"]);
  assert.deepEqual(b.segments.map((s) => s.text), ["535 ms", "107 ms", "58 ms"]);
  assert.deepEqual(b.segments.map((s) => s.fraction), [535 / 700, 107.3 / 700, 57.7 / 700]);
  assert.equal(b.segments[1].detail, "26 tokens · 242.2 tok/s");
  assert.equal(b.segments[0].detail, "");
  assert.equal(b.cached, "", "no cached count reported: no note");
});

test("breakdown: a queue wait is its own part, with the calls ahead, and not in the rest", () => {
  const b = breakdownSegments({
    speed: { time_to_first_token_ms: 27_000 },
    queued_ms: 25_000,
    queue_position: 2,
    ttft_breakdown: { prefill_ms: 909, prefill_tokens: 30, other_ms: 1_091 },
  });
  assert.deepEqual(b.segments.map((s) => s.key), ["queue", "prefill", "other"]);
  assert.equal(b.segments[0].label, "Queued");
  assert.equal(b.segments[0].text, "25.0 s");
  assert.equal(b.segments[0].detail, "behind 2 calls");
  // A server that reported nothing: the queue alone still shows.
  const only = breakdownSegments({ speed: { time_to_first_token_ms: 1_500 }, queued_ms: 1_200, queue_position: 1 });
  assert.deepEqual(only.segments.map((s) => [s.key, s.detail]), [["queue", "behind 1 call"]]);
  assert.equal(breakdownSegments({ speed: { time_to_first_token_ms: 10 } }), null);
});

test("breakdown: only the parts present; a reported 0 is a part; cached tokens are a note", () => {
  // llama.cpp: no load time; 1 prompt token, 37 from the cache.
  const b = breakdownSegments({
    speed: { time_to_first_token_ms: 23 },
    ttft_breakdown: { prefill_ms: 19.5, prefill_tokens: 1, cached_tokens: 37, prefill_tokens_per_second: 51.2, other_ms: 3.5 },
  });
  assert.deepEqual(b.segments.map((s) => s.key), ["prefill", "other"]);
  assert.equal(b.segments[0].detail, "1 token · 51.2 tok/s");
  assert.equal(b.cached, "37 prompt tokens reused from the server's cache");
  // Ollama with the model already loaded: load 0 is shown, with no width.
  const warm = breakdownSegments({ speed: { time_to_first_token_ms: 100 }, ttft_breakdown: { load_ms: 0, prefill_ms: 80, other_ms: 20 } });
  assert.deepEqual(warm.segments.map((s) => [s.key, s.text, s.fraction]), [
    ["load", "0 ms", 0],
    ["prefill", "80 ms", 0.8],
    ["other", "20 ms", 0.2],
  ]);
  assert.equal(breakdownSegments({ ttft_breakdown: { cached_tokens: 0 } })?.segments, undefined);
});

test("breakdown: parts summing past the TTFT (server clocks) never overflow the bar", () => {
  const b = breakdownSegments({ speed: { time_to_first_token_ms: 100 }, ttft_breakdown: { load_ms: 30, prefill_ms: 90, other_ms: 0 } });
  assert.equal(b.totalMs, 120);
  const sum = b.segments.reduce((a, s) => a + s.fraction, 0);
  assert.ok(Math.abs(sum - 1) < 1e-12, `${sum}`);
  // No TTFT (a call that failed before its first token): fractions of the sum.
  const noTtft = breakdownSegments({ ttft_breakdown: { prefill_ms: 50, other_ms: 50 } });
  assert.equal(noTtft.ttft, null);
  assert.deepEqual(noTtft.segments.map((s) => s.fraction), [0.5, 0.5]);
});

test("breakdown: none without server prompt timings; prompt tokens alone are a note", () => {
  assert.equal(breakdownSegments({ speed: { time_to_first_token_ms: 10 } }), null);
  assert.equal(breakdownSegments({ ttft_breakdown: {} }), null);
  assert.equal(breakdownSegments({ ttft_breakdown: { prefill_ms: -1, other_ms: null } }), null);
  assert.equal(breakdownSegments(null), null);
  const b = breakdownSegments({ speed: { time_to_first_token_ms: 40 }, ttft_breakdown: { prefill_tokens: 12, other_ms: 40 } });
  assert.deepEqual(b.segments.map((s) => s.key), ["other"]);
  assert.equal(b.note, "12 prompt tokens processed");
});

test("details: identity, outcome, TTFT, output and the rate's source, all present", () => {
  const d = callDetails(ollama, { timeZone: "UTC" });
  assert.equal(d.title, "llama3.2:3b");
  assert.equal(d.id, "c-000042");
  assert.deepEqual(d.status, { text: "ok", kind: "ok" });
  assert.deepEqual(
    d.identity.map((r) => [r.label, r.value]),
    [
      ["ID", "c-000042"],
      ["Route", "ollama"],
      ["Model", "llama3.2:3b"],
      ["API", "Ollama chat"],
      ["Client", "ollama-python"],
      ["Started", "2026-11-30 10:42:07.123"],
      ["Settled", "2026-11-30 10:42:12.243"],
    ],
  );
  assert.deepEqual(d.outcome.map((r) => [r.label, r.value]), [["Status", "ok"], ["HTTP status", "200"], ["Duration", "5.1 s"]]);
  assert.equal(d.ttft, "700 ms");
  assert.equal(d.breakdown.segments.length, 3);
  assert.deepEqual(d.output.map((r) => [r.label, r.value]), [
    ["Output tokens", "201"],
    ["tok/s", "41.7 tok/s"],
    ["Token source", "server"],
    ["Input tokens", "26"],
  ]);
  assert.match(d.rateNote, /server's own generation timings/);
  assert.deepEqual(d.flags, []);
});

test("details: only what is present (an in-flight call, an unmetered call)", () => {
  const waiting = callDetails({
    id: "c-7", route: "sim", api: "openai_chat", started_at: "2026-11-30T10:00:00.000Z", status: "in_flight",
    speed: { phase: "awaiting_first_token", is_final: false, elapsed_ms: 900, output_tokens: 0, token_source: "estimated" },
  }, { timeZone: "UTC" });
  assert.equal(waiting.title, "Call");
  assert.deepEqual(waiting.identity.map((r) => r.label), ["ID", "Route", "API", "Started"], "no model, client or settle time yet");
  assert.deepEqual(waiting.outcome.map((r) => r.label), ["Status", "Duration"]);
  assert.equal(waiting.ttft, null);
  assert.equal(waiting.breakdown, null);
  assert.deepEqual(waiting.output.map((r) => r.label), ["Output tokens", "Token source"]);
  assert.match(waiting.rateNote, /No live rate yet/);

  const unmetered = callDetails({ id: "c-8", route: "sim", api: "unknown", started_at: "x", status: "unmetered", http_status: 200 });
  assert.equal(unmetered.title, "(no model named)");
  assert.deepEqual(unmetered.identity.map((r) => r.label), ["ID", "Route", "API", "Started"]);
  assert.equal(unmetered.identity[3].value, "–", "an unparsable time is shown as not known");
  assert.deepEqual(unmetered.output, []);
  assert.equal(unmetered.rateNote, "");
  assert.equal(callDetails(null), null);
});

test("flags: one burst and unstreamed reasoning, only when set", () => {
  assert.deepEqual(callFlags({}), []);
  assert.deepEqual(callFlags({ one_burst: false, unstreamed_reasoning: false }), []);
  assert.deepEqual(callFlags({ one_burst: true, unstreamed_reasoning: true }), [
    { key: "one_burst", text: "Output came in one burst (no honest rate)" },
    { key: "unstreamed_reasoning", text: "The server billed reasoning it never streamed" },
  ]);
  const d = callDetails({ ...ollama, one_burst: true, speed: { ...ollama.speed, output_tokens_per_second: undefined } });
  assert.deepEqual(d.flags.map((f) => f.key), ["one_burst"]);
  assert.deepEqual(d.output.map((r) => r.label), ["Output tokens", "Token source", "Input tokens"]);
  assert.match(d.rateNote, /one burst/);
});

test("rate explanation follows the source and why a rate is missing", () => {
  const settled = (speed, extra = {}) => ({ status: "ok", ...extra, speed: { is_final: true, ...speed } });
  assert.match(rateExplanation(settled({ output_tokens_per_second: 40, token_source: "provider" })), /\(output tokens − 1\).*exact, from the API's usage receipt/);
  assert.match(rateExplanation(settled({ output_tokens_per_second: 40, token_source: "estimated" })), /speedtap's estimate/);
  assert.match(rateExplanation(settled({ output_tokens: 5 })), /at least 20 output tokens/);
  assert.match(rateExplanation(settled({}, { status: "abandoned" })), /ended before/);
  assert.match(rateExplanation(settled({}, { status: "upstream_error" })), /error/);
  assert.match(rateExplanation({ status: "in_flight", speed: { is_final: false, output_tokens_per_second: 12 } }), /^Live: the rate over the last 2 seconds/);
  assert.equal(rateExplanation({ status: "unmetered" }), "");
});

test("the details of a slow call say how slow, against what, and why; and its server's version", () => {
  const d = callDetails({
    ...ollama,
    server_version: "0.33.2",
    speed: { ...ollama.speed, output_tokens_per_second: 12 },
    slowdown: { usual_tps: 35, ratio: 0.34, causes: [{ kind: "server_changed", from: "0.32.13", to: "0.33.2" }] },
  });
  assert.equal(d.slowdown.sentence, "Decoded at 12.0 tok/s, 0.34× the usual 35.0 tok/s");
  assert.deepEqual(d.slowdown.causes, ["since the server went from 0.32.13 to 0.33.2"]);
  assert.equal(d.identity.find((r) => r.label === "Server version").value, "0.33.2");
  const fine = callDetails(ollama);
  assert.equal(fine.slowdown, null);
  assert.equal(fine.identity.find((r) => r.label === "Server version"), undefined, "absent, not a dash");
});

const reasoned = {
  ...ollama,
  speed: { ...ollama.speed, elapsed_ms: 45_000, time_to_first_token_ms: 1_000, output_tokens: 2_000 },
  reasoning_ms: 41_000,
  reasoning_tokens: 1_800,
};

test("reasoning: a call that thought then answered says how long each took and the thinking's tokens", () => {
  assert.equal(reasoningSplit(reasoned), "thought 41 s / 1.8k tokens · answered in 3 s");
  const row = callDetails(reasoned).output.find((r) => r.label === "Reasoning");
  assert.equal(row.value, "thought 41 s / 1.8k tokens · answered in 3 s");
});

test("reasoning: speedtap's estimated count is marked with ~", () => {
  assert.equal(
    reasoningSplit({ ...reasoned, reasoning_tokens_estimated: true }),
    "thought 41 s / ~1.8k tokens · answered in 3 s",
  );
});

test("reasoning: a call that never answered thought to its end and shows no answer time", () => {
  const thoughtOnly = { ...reasoned, speed: { ...reasoned.speed, output_tokens: 1_800 }, reasoning_ms: 43_900 };
  assert.equal(reasoningSplit(thoughtOnly), "thought 44 s / 1.8k tokens");
});

test("reasoning: absent parts are left out, and a call that did not reason has no row", () => {
  assert.equal(reasoningSplit({ ...reasoned, reasoning_tokens: undefined }), "thought 41 s");
  assert.equal(reasoningSplit({ ...reasoned, reasoning_ms: undefined }), "thought 1.8k tokens");
  assert.equal(reasoningSplit({ ...reasoned, reasoning_ms: 2_500, reasoning_tokens: 90 }), "thought 2.5 s / 90 tokens · answered in 42 s");
  assert.equal(reasoningSplit(ollama), null);
  assert.equal(callDetails(ollama).output.find((r) => r.label === "Reasoning"), undefined);
  assert.equal(reasoningSplit({ ...reasoned, status: "in_flight" }), null, "a call still in flight has not settled its split");
});

test("the slow limit is shown as it was applied: learned from the usual, or the starting limit", () => {
  assert.equal(slowLimitFact({}), null, "no limit applied, nothing shown");
  const fixed = slowLimitFact({ slow_after_ms: 5000 });
  assert.equal(fixed.label, "Slow after");
  assert.equal(fixed.value, "5.0 s (the starting limit, until this model's usual is learned)");
  const learned = slowLimitFact({ slow_after_ms: 16000, slow_after_usual_ms: 8000 });
  assert.equal(learned.value, "16.0 s (learned from the usual 8.0 s for this model and prompt)");
});

test("a failed call's details say how it failed, with the server's message as text", () => {
  const failed = { ...ollama, status: "upstream_error", http_status: 500, failure: { kind: "http", after_tokens: 0, message: "model 'x' not found" } };
  assert.deepEqual(failureLine(failed), { kind: "http", text: `Failed: HTTP 500 · "model 'x' not found"` });
  assert.equal(callDetails(failed).failure.text, `Failed: HTTP 500 · "model 'x' not found"`);
  assert.equal(failureLine({ ...ollama, status: "upstream_error", failure: { kind: "broke_off", after_tokens: 30 } }).text, "Failed: broke after 30 tokens");
  assert.equal(failureLine({ ...ollama, status: "upstream_error", http_status: 502 }).text, "Failed: HTTP 502", "an older record");
  assert.equal(failureLine({ ...ollama, status: "abandoned", failure: { kind: "client_left" } }), null, "a client that left is no failure");
  assert.equal(failureLine(ollama), null);
});

test("a failed call's missing rate is explained by how it failed", () => {
  const failed = (kind) => ({ status: "upstream_error", failure: { kind }, speed: { is_final: true, output_tokens: 3 } });
  assert.equal(rateExplanation(failed("http")), "No rate: the server answered with an error.");
  assert.match(rateExplanation(failed("stream_error")), /error mid-stream/);
  assert.match(rateExplanation(failed("broke_off")), /broke off/);
  assert.match(rateExplanation(failed("unreachable")), /could not be reached/);
});

test("a call that stalled once says how long, after which token, and its rate without the stall", () => {
  const once = { ...ollama, stalls: 1, stalled_ms: 20_100, longest_stall_ms: 20_100, longest_stall_after_token: 40, output_tokens_per_second_excluding_stalls: 30.2 };
  assert.equal(stallLine(once), "Stalled 20.1 s after token 40 · 30.2 tok/s without the stall");
  assert.equal(callDetails(once).stall, "Stalled 20.1 s after token 40 · 30.2 tok/s without the stall");
  const { output_tokens_per_second_excluding_stalls: _, ...noRate } = once;
  assert.equal(stallLine(noRate), "Stalled 20.1 s after token 40", "no rate part without speedtap's figure");
});

test("a call that stalled several times says how often, in all, and the longest", () => {
  const many = { ...ollama, stalls: 3, stalled_ms: 25_000, longest_stall_ms: 20_100, longest_stall_after_token: 40, output_tokens_per_second_excluding_stalls: 30.2 };
  assert.equal(stallLine(many), "Stalled 3 times, 25.0 s in all; the longest 20.1 s after token 40 · 30.2 tok/s without the stalls");
  assert.equal(stallLine(ollama), null, "a call that never stalled has no line");
});

test("a failed call is said to start cold only when it carries start cold", () => {
  const failed = { ...ollama, status: "upstream_error", http_status: 500, failure: { kind: "http" } };
  assert.equal(callFacts(failed).some((f) => f.key === "start"), false);
  assert.match(callFacts({ ...failed, start: "cold" }).find((f) => f.key === "start").value, /^cold/);
});
