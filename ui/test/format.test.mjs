import { test } from "node:test";
import assert from "node:assert/strict";
import {
  DASH,
  apiLabel,
  clientLeft,
  failureLabel,
  formatCount,
  formatMs,
  formatRate,
  formatTime,
  formatTimestamp,
  isFailed,
  isShowable,
  modelLabel,
  parseTime,
  phaseLabel,
  sourceBadge,
  statusLabel,
} from "../lib/format.js";

test("durations: ms below a second, one decimal in seconds, whole seconds from 100 s", () => {
  assert.equal(formatMs(0), "0 ms");
  assert.equal(formatMs(312), "312 ms");
  assert.equal(formatMs(312.4), "312 ms");
  assert.equal(formatMs(999), "999 ms");
  assert.equal(formatMs(999.6), "1.0 s", "rounding to 1000 ms switches unit");
  assert.equal(formatMs(1000), "1.0 s");
  assert.equal(formatMs(1234), "1.2 s");
  assert.equal(formatMs(1250), "1.3 s");
  assert.equal(formatMs(59_940), "59.9 s");
  assert.equal(formatMs(99_949), "99.9 s");
  assert.equal(formatMs(99_960), "100 s");
  assert.equal(formatMs(125_400), "125 s");
});

test("rates have one decimal and are never padded with a unit", () => {
  assert.equal(formatRate(41.7), "41.7");
  assert.equal(formatRate(40), "40.0");
  assert.equal(formatRate(0.04), "0.0");
  assert.equal(formatRate(1234.56), "1234.6");
});

test("counts are whole numbers with thousands separators", () => {
  assert.equal(formatCount(0), "0");
  assert.equal(formatCount(201), "201");
  assert.equal(formatCount(12345), "12,345");
});

test("absent or impossible numbers show a dash, never 0", () => {
  for (const absent of [undefined, null, NaN, Infinity, -Infinity, -1, "41.7", "", {}, []]) {
    assert.equal(formatMs(absent), DASH, `formatMs(${String(absent)})`);
    assert.equal(formatRate(absent), DASH, `formatRate(${String(absent)})`);
    assert.equal(formatCount(absent), DASH, `formatCount(${String(absent)})`);
    assert.equal(isShowable(absent), false);
  }
  assert.equal(isShowable(0), true, "a real zero is a number");
});

test("phase labels: 'waiting' for the first token, words for the rest", () => {
  assert.equal(phaseLabel("awaiting_first_token"), "waiting");
  assert.equal(phaseLabel("reasoning"), "reasoning");
  assert.equal(phaseLabel("responding"), "responding");
  assert.equal(phaseLabel("calling_tool"), "calling tool");
  assert.equal(phaseLabel("complete"), "complete");
  assert.equal(phaseLabel("loading_model"), "loading model", "a newer engine's phase is shown, not hidden");
  assert.equal(phaseLabel(undefined), DASH);
});

test("status labels; an upstream error names its HTTP status when known", () => {
  assert.equal(statusLabel("in_flight"), "in flight");
  assert.equal(statusLabel("ok", 200), "ok");
  assert.equal(statusLabel("abandoned"), "abandoned");
  assert.equal(statusLabel("upstream_error"), "upstream error");
  assert.equal(statusLabel("upstream_error", 502), "upstream error 502");
  assert.equal(statusLabel("upstream_error", 200), "upstream error", "a 200 is no error code");
  assert.equal(statusLabel("unmetered", 200), "unmetered");
  assert.equal(statusLabel(undefined), DASH);
});

test("source badge tells estimated, provider and server apart, each with a tooltip", () => {
  const est = sourceBadge("estimated");
  const exact = sourceBadge("provider");
  const server = sourceBadge("server");
  assert.deepEqual([est.text, exact.text, server.text], ["est.", "exact", "server"]);
  assert.deepEqual([est.kind, exact.kind, server.kind], ["estimated", "provider", "server"]);
  const titles = new Set([est.title, exact.title, server.title]);
  assert.equal(titles.size, 3, "three different explanations");
  assert.match(est.title, /^Estimated/);
  assert.match(exact.title, /usage receipt/);
  assert.match(server.title, /server's own/);
  assert.equal(sourceBadge(undefined), null, "no snapshot, no badge");
  assert.equal(sourceBadge(""), null);
  assert.deepEqual(
    { text: sourceBadge("tokenizer_v2").text, kind: sourceBadge("tokenizer_v2").kind },
    { text: "tokenizer_v2", kind: "unknown" },
  );
});

test("API labels are readable and cover the contract's kinds", () => {
  const kinds = [
    "openai_chat", "openai_completions", "openai_responses", "anthropic_messages",
    "ollama_chat", "ollama_generate", "llamacpp_completion", "tgi_generate", "unknown",
  ];
  const labels = kinds.map(apiLabel);
  assert.equal(new Set(labels).size, kinds.length);
  for (const l of labels) assert.doesNotMatch(l, /_/);
  assert.equal(apiLabel("openai_chat"), "OpenAI chat");
  assert.equal(apiLabel("future_api"), "future api");
});

test("times: today's calls by time of day, older ones by date; full timestamps with ms", () => {
  const now = Date.parse("2026-11-30T12:00:00.000Z");
  assert.equal(formatTime("2026-11-30T09:05:07.900Z", { now, timeZone: "UTC" }), "09:05:07");
  assert.equal(formatTime("2026-11-29T23:59:59.000Z", { now, timeZone: "UTC" }), "Nov 29, 23:59");
  // The day is the viewer's: 23:59 UTC on the 29th is the 30th in Tokyo.
  assert.equal(formatTime("2026-11-29T23:59:59.000Z", { now, timeZone: "Asia/Tokyo" }), "08:59:59");
  assert.equal(formatTime("", { now }), DASH);
  assert.equal(formatTime("not a time", { now }), DASH);
  assert.equal(formatTime(undefined), DASH);
  assert.equal(formatTimestamp("2026-11-30T10:42:07.123Z", { timeZone: "UTC" }), "2026-11-30 10:42:07.123");
  assert.equal(formatTimestamp("2026-11-30T00:00:00Z", { timeZone: "UTC" }), "2026-11-30 00:00:00.000");
  assert.equal(formatTimestamp(null), DASH);
  assert.equal(parseTime("2026-11-30T10:42:07.123Z"), Date.parse("2026-11-30T10:42:07.123Z"));
  assert.equal(parseTime(42), null);
  assert.equal(modelLabel(""), "(no model named)");
  assert.equal(modelLabel(undefined), "(no model named)");
  assert.equal(modelLabel("qwen3:8b"), "qwen3:8b");
});

test("a failure's label names its kind in a few words", () => {
  const failed = (kind, extra = {}) => ({ status: "upstream_error", failure: { kind, ...extra } });
  assert.equal(failureLabel({ ...failed("http"), http_status: 500 }), "HTTP 500");
  assert.equal(failureLabel(failed("http")), "HTTP error");
  assert.equal(failureLabel(failed("unreachable")), "unreachable");
  assert.equal(failureLabel({ ...failed("stream_error"), http_status: 200 }), "server error mid-stream");
  assert.equal(failureLabel(failed("broke_off", { after_tokens: 30 })), "broke after 30 tokens");
  assert.equal(failureLabel(failed("broke_off", { after_tokens: 1 })), "broke after 1 token");
  assert.equal(failureLabel(failed("broke_off", { after_tokens: 0 })), "broke before any token");
  assert.equal(failureLabel({ status: "abandoned", failure: { kind: "client_left", after_tokens: 5 } }), "client left");
});

test("an older record without a failure is labelled from its status", () => {
  assert.equal(failureLabel({ status: "upstream_error", http_status: 502 }), "HTTP 502");
  assert.equal(failureLabel({ status: "upstream_error" }), "HTTP error");
  assert.equal(failureLabel({ status: "upstream_error", http_status: 200 }), "HTTP error");
  assert.equal(failureLabel({ status: "abandoned" }), "ended early");
  assert.equal(failureLabel({ status: "ok", http_status: 200 }), null, "a call that ended well has none");
});

test("no label ever reads 'error 200', and every label fits 26 characters", () => {
  const labels = [
    statusLabel("upstream_error", 200),
    failureLabel({ status: "upstream_error", http_status: 200 }),
    failureLabel({ status: "upstream_error", http_status: 200, failure: { kind: "http" } }),
    failureLabel({ status: "upstream_error", failure: { kind: "broke_off", after_tokens: 123_456 } }),
    failureLabel({ status: "upstream_error", failure: { kind: "stream_error" } }),
  ];
  for (const l of labels) {
    assert.doesNotMatch(l, /error 200/);
    assert.ok(l.length <= 26, l);
  }
});

test("a call is failed unless it ended well or its client left", () => {
  assert.equal(isFailed({ status: "upstream_error", failure: { kind: "http" } }), true);
  assert.equal(isFailed({ status: "ok", failure: { kind: "broke_off", after_tokens: 3 } }), true, "the failure decides, not the status");
  assert.equal(isFailed({ status: "abandoned", failure: { kind: "client_left" } }), false);
  assert.equal(isFailed({ status: "upstream_error" }), true, "an older record");
  assert.equal(isFailed({ status: "abandoned" }), false);
  assert.equal(isFailed({ status: "ok" }), false);
  assert.equal(clientLeft({ status: "abandoned", failure: { kind: "client_left" } }), true);
  assert.equal(clientLeft({ status: "abandoned" }), false);
});
