// Why a call waits, and the facts beside it: the live row's wait badge, the
// details panel's wait, truncation warning and facts, the formatting they
// rest on, and the reducer's and data source's part. The JSON is the shape
// docs/api.md gives for `wait`, `prompt_truncated`, `context`, `draft`,
// `placement` and `start`.

import { test } from "node:test";
import assert from "node:assert/strict";
import { browserSource } from "../lib/datasource.js";
import { callDetails, callFacts, truncationWarning, waitPanel } from "../lib/details.js";
import { DASH, formatBytes, formatEta, formatPercent } from "../lib/format.js";
import { callRow, truncationBadge, waitView } from "../lib/present.js";
import { initialState, reduce } from "../lib/reducer.js";

const T0 = Date.UTC(2026, 10, 30, 10, 0, 0);

function waiting(wait, extra = {}) {
  return {
    id: "c-000007",
    route: "ollama",
    api: "ollama_chat",
    model: "qwen3:32b",
    started_at: "2026-11-30T10:00:00.000Z",
    status: "in_flight",
    speed: { phase: "awaiting_first_token", is_final: false, elapsed_ms: 3200, output_tokens: 0, token_source: "estimated", ...(wait ? { wait } : {}) },
    ...extra,
  };
}

// ---- formatting ------------------------------------------------------------

test("a percentage is rounded down, clamped, and never off by binary rounding", () => {
  assert.equal(formatPercent(0.6), "60%");
  assert.equal(formatPercent(0.29), "29%");
  assert.equal(formatPercent(0.996), "99%");
  assert.equal(formatPercent(1), "100%");
  assert.equal(formatPercent(1.4), "100%");
  assert.equal(formatPercent(0), "0%");
  assert.equal(formatPercent(undefined), DASH);
  assert.equal(formatPercent(-0.1), DASH);
});

test("time left reads in whole seconds, then minutes", () => {
  assert.equal(formatEta(3000), "about 3 s left");
  assert.equal(formatEta(2600), "about 3 s left");
  assert.equal(formatEta(400), "under a second left");
  assert.equal(formatEta(89_000), "about 89 s left");
  assert.equal(formatEta(150_000), "about 3 min left");
  assert.equal(formatEta(null), DASH);
});

test("byte sizes use decimal units as servers report them", () => {
  assert.equal(formatBytes(5_000_000_000), "5.0 GB");
  assert.equal(formatBytes(512_000_000), "512 MB");
  assert.equal(formatBytes(undefined), DASH);
});

// ---- the wait, as the live row shows it --------------------------------------

test("a call waiting for its model to load says so, with the usual load time", () => {
  const w = waitView({ reason: "loading_model", eta_ms: 800, usual_ms: 4000 });
  assert.equal(w.badge, "loading model");
  assert.equal(w.sentence, "Loading the model (usually 4.0 s)");
  assert.equal(w.eta, "under a second left");
  assert.equal(w.progress, null, "a load has no progress bar");
  assert.deepEqual(w.facts.map((f) => [f.label, f.value]), [["First token", "under a second left"]], "the usual time is in the sentence");
});

test("a queued call names its place in the queue", () => {
  assert.equal(waitView({ reason: "queued", position: 2 }).badge, "queued #2");
  assert.equal(waitView({ reason: "queued", position: 1 }).sentence, "Queued behind 1 call on this server");
  assert.equal(waitView({ reason: "queued", position: 3 }).sentence, "Queued behind 3 calls on this server");
  const unknown = waitView({ reason: "queued" });
  assert.equal(unknown.badge, "queued", "no position: no number");
  assert.deepEqual(unknown.facts, []);
});

test("a prefill built on speedtap's estimate is labelled an estimate in its badge and sentence", () => {
  const w = waitView({ reason: "prefilling", progress: 0.6, eta_ms: 3000, prompt_tokens: 12000, progress_source: "estimate" });
  assert.equal(w.badge, "prefill ~60%");
  assert.match(w.sentence, /about 12,000 tokens, 60% done \(estimated\)/);
  const server = waitView({ reason: "prefilling", progress: 0.6, prompt_tokens: 12000, progress_source: "server" });
  assert.equal(server.badge, "prefill 60%");
  assert.doesNotMatch(server.sentence, /estimated|about/);
});

test("a prefill shows its progress, the prompt size and the time left", () => {
  const w = waitView({ reason: "prefilling", progress: 0.6, eta_ms: 3000, prompt_tokens: 12000, usual_ms: 7500 });
  assert.equal(w.badge, "prefill 60%");
  assert.equal(w.sentence, "Processing the prompt of 12,000 tokens, 60% done");
  assert.equal(w.progress, 0.6);
  assert.equal(w.eta, "about 3 s left");
  assert.equal(w.title, "Processing the prompt of 12,000 tokens, 60% done; about 3 s left");
  assert.deepEqual(w.facts.map((f) => f.label), ["Usual TTFT", "First token"], "the prompt size and progress are in the sentence");
  // Progress past 1 (a server that counts cached tokens too) is clamped.
  assert.equal(waitView({ reason: "prefilling", progress: 1.3 }).progress, 1);
  const bare = waitView({ reason: "prefilling" });
  assert.equal(bare.badge, "prefill");
  assert.equal(bare.progress, null);
  assert.equal(bare.eta, null);
});

test("an unknown wait says plainly that the server does not tell, and a newer reason shows as itself", () => {
  assert.equal(waitView({ reason: "unknown" }).badge, "waiting");
  assert.equal(waitView({ reason: "unknown" }).sentence, "Waiting; the server does not say why");
  const newer = waitView({ reason: "warming_cache" });
  assert.equal(newer.badge, "warming cache");
  assert.equal(newer.reason, "other");
  assert.equal(waitView(null), null);
  assert.equal(waitView({}), null);
});

test("the live row shows the wait only while the call waits", () => {
  const row = callRow(waiting({ reason: "queued", position: 1 }));
  assert.equal(row.wait.badge, "queued #1");
  assert.equal(row.phase.kind, "awaiting_first_token");
  const streaming = callRow({ ...waiting({ reason: "queued", position: 1 }), speed: { phase: "responding", is_final: false, elapsed_ms: 4000, output_tokens: 3, token_source: "estimated", wait: { reason: "queued" } } });
  assert.equal(streaming.wait, null, "a first token ends the wait, whatever the snapshot still carries");
  assert.equal(callRow(waiting(undefined)).wait, null, "no explanation from the engine: the plain phase");
});

test("the slow badge names the route's normal when the engine knows it", () => {
  const call = waiting({ reason: "loading_model" });
  assert.equal(callRow(call, { slow: { waited_ms: 9100, threshold_ms: 5000, usual_ms: 4000 } }).slow, "No first token after 9.1 s (usually 4.0 s)");
  assert.equal(callRow(call, { slow: { waited_ms: 9100, threshold_ms: 5000 } }).slow, "No first token after 9.1 s (threshold 5.0 s)");
});

test("a cut prompt gets a badge with both numbers in its tooltip", () => {
  const b = truncationBadge({ request_tokens: 9000, server_tokens: 2048, context_size: 2048 });
  assert.equal(b.text, "prompt cut");
  assert.equal(b.title, "The server read 2,048 of the 9,000 prompt tokens sent (context 2,048)");
  assert.equal(truncationBadge({ request_tokens: 9000 }), null, "one number is not a finding");
  assert.equal(callRow({ ...waiting(null), status: "ok", prompt_truncated: { request_tokens: 10, server_tokens: 5 } }).truncated.text, "prompt cut");
  assert.equal(callRow(waiting(null)).truncated, null);
});

// ---- the details panel --------------------------------------------------------

test("the details of a waiting call explain the wait live", () => {
  const p = waitPanel(waiting({ reason: "prefilling", progress: 0.25, prompt_tokens: 8000 }));
  assert.equal(p.live, true);
  assert.equal(p.heading, "Waiting for the first token");
  assert.equal(p.progress, 0.25);
});

test("the details of a settled call keep the last wait before its first token", () => {
  const settled = {
    ...waiting(undefined),
    status: "ok",
    speed: { phase: "complete", is_final: true, elapsed_ms: 12000, time_to_first_token_ms: 9100, output_tokens: 200, output_tokens_per_second: 30, token_source: "server" },
    wait: { reason: "loading_model", usual_ms: 4000 },
  };
  const p = waitPanel(settled);
  assert.equal(p.live, false);
  assert.equal(p.heading, "Before the first token");
  assert.equal(p.sentence, "Waited for the model to load (usually 4.0 s)");
  assert.equal(waitPanel({ ...settled, wait: { reason: "prefilling", progress: 0.4, eta_ms: 900, prompt_tokens: 800 } }).sentence, "Processed the prompt of 800 tokens");
  const over = waitPanel({ ...settled, wait: { reason: "prefilling", progress: 0.4, eta_ms: 900 } });
  assert.equal(over.progress, null, "no progress bar once the wait is over");
  assert.equal(over.eta, null, "no time left once the wait is over");
  assert.equal(waitPanel({ ...settled, wait: { reason: "queued", position: 1 } }).sentence, "Waited behind 1 call on this server");
  assert.equal(waitPanel({ ...settled, wait: undefined }), null);
});

test("a truncated prompt is a warning with both numbers and what to do", () => {
  const t = truncationWarning({ request_tokens: 9000, server_tokens: 2048, context_size: 2048 });
  assert.equal(t.headline, "The server cut the prompt");
  assert.equal(t.text, "9,000 tokens sent, 2,048 read (context 2,048).");
  assert.match(t.hint, /num_ctx/);
  assert.equal(truncationWarning({ request_tokens: 9000, server_tokens: 2048 }).text, "9,000 tokens sent, 2,048 read.");
  assert.equal(truncationWarning(undefined), null);
});

test("the facts show context used, draft acceptance, placement and start, only when reported", () => {
  const facts = callFacts({
    context: { size: 8192, used: 3100 },
    draft: { drafted: 120, accepted: 96 },
    placement: "split",
    model_bytes: 5_000_000_000,
    vram_bytes: 3_100_000_000,
    start: "cold",
  });
  assert.deepEqual(
    facts.map((f) => [f.label, f.value]),
    [
      ["Context used", "3,100 of 8,192 tokens (37%)"],
      ["Draft acceptance", "80% (96 of 120 drafted tokens)"],
      ["Ran on", "split GPU / CPU (3.1 GB of 5.0 GB in VRAM)"],
      ["Start", "cold (the model loaded for this call)"],
    ],
  );
  assert.equal(facts[0].fraction, 3100 / 8192);
  assert.equal(facts[0].full, false);
  assert.equal(callFacts({ context: { size: 2048, used: 2048 } })[0].full, true, "a full context is marked");
  assert.deepEqual(callFacts({ placement: "gpu", start: "warm" }).map((f) => f.value), ["GPU", "warm (the model was already loaded)"]);
  assert.deepEqual(callFacts({ context: { used: 40 } }).map((f) => f.value), ["40 tokens"], "no size: no fraction");
  assert.deepEqual(callFacts({ draft: { drafted: 0, accepted: 0 } }).map((f) => f.value), ["no tokens drafted"]);
  assert.deepEqual(callFacts({}), []);
  assert.deepEqual(callFacts({ start: "lukewarm", context: { size: 10 } }), [], "unknown values are left out");
});

test("callDetails carries the wait, the truncation and the facts", () => {
  const d = callDetails(waiting({ reason: "queued", position: 1 }, { prompt_truncated: { request_tokens: 9000, server_tokens: 2048 }, start: "warm" }));
  assert.equal(d.wait.badge, "queued #1");
  assert.equal(d.truncation.server, 2048);
  assert.deepEqual(d.facts.map((f) => f.key), ["start"]);
  const plain = callDetails(waiting(undefined));
  assert.equal(plain.wait, null);
  assert.equal(plain.truncation, null);
  assert.deepEqual(plain.facts, []);
});

// ---- the reducer and the data source ------------------------------------------

test("a wait rides in the snapshot: the reducer keeps it on the call", () => {
  let s = initialState();
  const identity = { id: "c-1", route: "r", api: "openai_chat", started_at: "2026-11-30T10:00:00.000Z" };
  s = reduce(s, { type: "speed", call: identity, speed: { phase: "awaiting_first_token", is_final: false, elapsed_ms: 100, output_tokens: 0, token_source: "estimated", wait: { reason: "queued", position: 1 } } }, T0);
  assert.equal(callRow(s.calls["c-1"]).wait.badge, "queued #1");
});

test("the slow alarm keeps the route's normal and the reason when sent", () => {
  let s = initialState();
  const call = { id: "c-1", route: "r" };
  s = reduce(s, { type: "slow_first_token", call, waited_ms: 9100, threshold_ms: 5000, usual_ms: 4000, reason: { reason: "loading_model" } }, T0);
  assert.deepEqual(s.slow["c-1"], { waited_ms: 9100, threshold_ms: 5000, usual_ms: 4000, reason: { reason: "loading_model" } });
});

test("a prompt_truncated event flags the call in flight; its settled record has the stored flag", () => {
  let s = initialState();
  const identity = { id: "c-1", route: "r", api: "ollama_chat", started_at: "2026-11-30T10:00:00.000Z" };
  s = reduce(s, { type: "speed", call: identity, speed: { phase: "responding", is_final: false, elapsed_ms: 100, output_tokens: 1, token_source: "estimated" } }, T0);
  s = reduce(s, { type: "prompt_truncated", call: identity, request_tokens: 9000, server_tokens: 2048, context_size: 2048 }, T0);
  assert.deepEqual(s.calls["c-1"].prompt_truncated, { request_tokens: 9000, server_tokens: 2048, context_size: 2048 });
  const before = s;
  s = reduce(s, { type: "prompt_truncated", call: { id: "c-unknown" }, request_tokens: 1, server_tokens: 1 }, T0);
  assert.equal(s, before, "a call this page never saw is not invented");
});

test("the depth curve is GET /api/v1/history/depth in a browser and history_depth in Tauri", async () => {
  const doc = { model: "qwen3:8b", points: [], fit: null };
  const urls = [];
  const browser = browserSource({
    fetch: async (url) => {
      urls.push(url);
      return { ok: true, status: 200, json: async () => doc };
    },
    EventSource: class {},
  });
  assert.deepEqual(await browser.historyDepth({ model: "qwen3:8b", route: "ollama", since: 5, limit: 500, client: "curl" }), doc);
  assert.deepEqual(urls, ["/api/v1/history/depth?model=qwen3%3A8b&route=ollama&since=5"]);
});

test("an engine without the depth endpoint is unavailable, not an error", async () => {
  const browser = browserSource({
    fetch: async () => ({ ok: false, status: 404, json: async () => ({ error: "not found" }) }),
    EventSource: class {},
  });
  await assert.rejects(browser.historyDepth({ model: "m" }), (e) => e.unavailable === true);
});
