import { test } from "node:test";
import assert from "node:assert/strict";
import { DASH } from "../lib/format.js";
import {
  allFailed,
  errorsText,
  DEFAULT_RANGE,
  depthFilter,
  depthModel,
  depthModels,
  depthSeries,
  MIN_RATE_SPAN_MS,
  RANGES,
  buildFilter,
  comparisonRows,
  exportFilename,
  exportUrl,
  filterQuery,
  mergeOptions,
  optionLabel,
  pickerChoice,
  pickerValue,
  rangeSince,
  rateRange,
  rateSeries,
  reasoningText,
  versionMarks,
} from "../lib/history.js";

const NOW = Date.parse("2026-11-30T12:00:00.000Z");
const HOUR = 3_600_000;

test("range -> since: an hour, a day, a week back from now; all has none", () => {
  assert.equal(rangeSince("hour", NOW), NOW - HOUR);
  assert.equal(rangeSince("day", NOW), NOW - 24 * HOUR);
  assert.equal(rangeSince("week", NOW), NOW - 7 * 24 * HOUR);
  assert.equal(rangeSince("all", NOW), undefined);
  // Whole milliseconds, whatever the clock gives.
  assert.equal(rangeSince("hour", NOW + 0.7), NOW - HOUR);
  // A stale or unknown key is the default range, never "everything".
  assert.equal(rangeSince("fortnight", NOW), rangeSince(DEFAULT_RANGE, NOW));
  assert.notEqual(rangeSince(DEFAULT_RANGE, NOW), undefined);
  assert.deepEqual(RANGES.map((r) => r.key), ["hour", "day", "week", "all"]);
});

test("filter: only the set choices; model/client '' (named none) kept, route '' dropped", () => {
  assert.deepEqual(buildFilter({ range: "all" }, NOW), {});
  assert.deepEqual(buildFilter({ range: "hour", model: "qwen3:8b", route: "ollama", client: "curl" }, NOW, { limit: 500 }), {
    since: NOW - HOUR,
    model: "qwen3:8b",
    route: "ollama",
    client: "curl",
    limit: 500,
  });
  assert.deepEqual(buildFilter({ range: "all", model: "", route: "", client: "" }, NOW), { model: "", client: "" });
  assert.deepEqual(buildFilter({ range: "all", model: null, route: undefined, client: null }, NOW, { limit: -1 }), {});
  assert.deepEqual(buildFilter(undefined, NOW), { since: NOW - 24 * HOUR });
});

test("filter query: fixed order, extra first, empty model written, spaces and colons encoded", () => {
  assert.equal(filterQuery({}), "");
  assert.equal(
    filterQuery({ limit: 10, since: 5, client: "My App", route: "r", model: "qwen3:8b" }, { format: "csv" }),
    "format=csv&model=qwen3%3A8b&route=r&client=My+App&since=5&limit=10",
  );
  // model= present but empty selects the calls that named none.
  assert.equal(filterQuery({ model: "" }), "model=");
  assert.equal(filterQuery({ model: undefined, client: null }), "");
  // Round trip through the parser the engine mirrors (+ is a space).
  const back = new URLSearchParams(filterQuery({ client: "a+b c&d" }));
  assert.equal(back.get("client"), "a+b c&d");
});

test("export URL: the format and the filters, never the list's limit", () => {
  assert.equal(exportUrl({}, "csv"), "/api/v1/export?format=csv");
  assert.equal(
    exportUrl({ since: NOW - HOUR, model: "m", client: "", limit: 500 }, "jsonl"),
    `/api/v1/export?format=jsonl&model=m&client=&since=${NOW - HOUR}`,
  );
  assert.equal(exportUrl(undefined), "/api/v1/export?format=csv");
  assert.throws(() => exportUrl({}, "xml"), RangeError);
  assert.equal(exportFilename("csv"), "speedtap-calls.csv");
  assert.equal(exportFilename("jsonl"), "speedtap-calls.jsonl");
});

test("picker values keep 'any' and 'named none' apart", () => {
  assert.equal(pickerValue(null), "");
  assert.equal(pickerValue(undefined), "");
  assert.equal(pickerValue(""), "=");
  assert.equal(pickerValue("=odd"), "==odd");
  for (const choice of [null, "", "qwen3:8b", "=odd"]) assert.equal(pickerChoice(pickerValue(choice)), choice);
  assert.equal(optionLabel("model", ""), "(no model named)");
  assert.equal(optionLabel("client", ""), "(no User-Agent)");
  assert.equal(optionLabel("client", "curl"), "curl");
});

test("options grow with what answers list and always hold the selection", () => {
  const first = mergeOptions(null, {
    models: [
      { model: "b", route: "ollama" },
      { model: "", route: "llama" },
    ],
    calls: [{ model: "a", route: "ollama", client: "curl" }, { route: "llama" }],
  });
  assert.deepEqual(first, { models: ["", "a", "b"], routes: ["llama", "ollama"], clients: ["", "curl"] });
  // A filtered answer lists less: nothing seen before disappears, and the
  // selected values stay even when the answer is empty.
  const next = mergeOptions(first, { models: [], calls: [], selected: { model: "z", route: "", client: "MyApp" } });
  assert.deepEqual(next, { models: ["", "a", "b", "z"], routes: ["llama", "ollama"], clients: ["", "curl", "MyApp"] });
  // Numeric-aware order: model2 before model10.
  assert.deepEqual(mergeOptions(null, { calls: [{ model: "m10", route: "r", client: "c" }, { model: "m2", route: "r", client: "c" }] }).models, ["m2", "m10"]);
});

const summary = [
  { model: "", route: "llama", calls: 2, ok_calls: 1, last_seen: "2026-11-29T08:00:00.000Z" },
  {
    model: "llama3.2:3b", route: "ollama", calls: 12, ok_calls: 10, ttft_ms_p50: 180, ttft_ms_p90: 412.5,
    tps_p50: 61.5, tps_p90: 63.1, tps_p10: 48.2, prefill_tps_p50: 840.2, last_seen: "2026-11-30T11:59:58.100Z",
    cold_calls: 3, cold_ttft_ms_p50: 7000, queued_calls: 2, queued_ttft_ms_p50: 15400,
  },
  {
    model: "qwen3:8b", route: "ollama", calls: 3, ok_calls: 3, ttft_ms_p50: 1250, ttft_ms_p90: 2400,
    tps_p50: 25.7, tps_p90: 41, last_seen: "2026-11-30T11:00:00.000Z",
  },
];

test("model comparison rows: formatted figures, absent ones as –, engine order kept", () => {
  const rows = comparisonRows(summary, { now: NOW, timeZone: "UTC" });
  assert.deepEqual(rows.map((r) => r.model), ["(no model named)", "llama3.2:3b", "qwen3:8b"]);
  const [none, llama, qwen] = rows;
  assert.equal(none.modelRaw, "");
  assert.deepEqual(
    [none.ttftP50, none.ttftP90, none.tpsP50, none.tpsP90, none.prefillP50],
    [DASH, DASH, DASH, DASH, DASH],
    "a group with no ok call with numbers shows dashes, not zeros",
  );
  assert.equal(none.calls, "2");
  assert.equal(none.lastSeen, "Nov 29, 08:00", "another day: date and time");
  assert.deepEqual(
    [llama.route, llama.calls, llama.ttftP50, llama.ttftP90, llama.tpsP50, llama.tpsP90, llama.prefillP50, llama.lastSeen],
    ["ollama", "12", "180 ms", "413 ms", "61.5", "63.1", "840.2", "11:59:58"],
  );
  assert.match(llama.callsTitle, /12 calls, 10 ended ok/);
  // Like with like: the slow tail of decode, cold loads apart, and the
  // TTFT figures say which calls they are over.
  assert.equal(llama.tpsP10, "48.2");
  assert.equal(llama.cold, "p50 7.0 s, 3 calls");
  assert.equal(llama.queued, "p50 15.4 s, 2 calls");
  assert.equal(none.queued, DASH);
  // The prefill rate comes from prompts of 512 tokens or more only; when
  // absent, its cell says why instead of leaving a bare dash.
  assert.match(llama.prefillTitle, /512 tokens or more/);
  assert.match(qwen.prefillTitle, /^No prompt of 512 tokens or more/);
  assert.match(llama.ttftTitle, /neither queued nor cold \(2 queued and 3 cold left out\)/);
  assert.equal(none.cold, DASH);
  assert.equal(none.tpsP10, DASH);
  assert.equal(qwen.ttftP50, "1.3 s");
  assert.equal(qwen.tpsP90, "41.0");
  assert.equal(qwen.prefillP50, DASH);
  // The best median TTFT and decode rate are marked, once each.
  assert.deepEqual(rows.map((r) => r.best), [
    { ttft: false, tps: false },
    { ttft: true, tps: true },
    { ttft: false, tps: false },
  ]);
  // Keys are unique per (model, route).
  assert.equal(new Set(rows.map((r) => r.key)).size, 3);
});

test("model comparison: no 'best' with one row or a tie; junk rows ignored", () => {
  assert.deepEqual(comparisonRows([summary[1]], { now: NOW })[0].best, { ttft: false, tps: false });
  const tie = comparisonRows(
    [
      { model: "a", route: "r", calls: 1, ok_calls: 1, ttft_ms_p50: 100, tps_p50: 50, last_seen: "" },
      { model: "b", route: "r", calls: 1, ok_calls: 1, ttft_ms_p50: 100, tps_p50: 40, last_seen: "" },
    ],
    { now: NOW },
  );
  assert.deepEqual(tie.map((r) => r.best), [{ ttft: false, tps: true }, { ttft: false, tps: false }]);
  assert.equal(tie[0].lastSeen, DASH);
  assert.deepEqual(comparisonRows(null), []);
  assert.equal(comparisonRows([null, 3, summary[2]]).length, 1);
});

const call = (id, model, t, rate, extra = {}) => ({
  id,
  route: "r",
  api: "openai_chat",
  model,
  started_at: new Date(t - 2000).toISOString(),
  settled_at: new Date(t).toISOString(),
  status: "ok",
  speed: { phase: "complete", is_final: true, output_tokens: 50, output_tokens_per_second: rate, token_source: "server" },
  ...extra,
});

test("rate series: one series per model, a point per ok call with a settled rate, at settled_at", () => {
  const t0 = NOW - 10 * 60_000;
  const calls = [
    // Newest first, as the history API lists them.
    call("c-5", "b", t0 + 4000, 30.5),
    call("c-4", undefined, t0 + 3000, 70),
    call("c-3", "a", t0 + 2000, 41.7),
    call("c-2", "b", t0 + 1000, 28),
    call("c-1", "a", t0, 40),
    // Left out: no rate, a failed call's rate, a live snapshot.
    call("c-6", "a", t0 + 5000, undefined),
    call("c-7", "a", t0 + 6000, 99, { status: "abandoned" }),
    call("c-8", "a", t0 + 7000, 99, { speed: { phase: "responding", is_final: false, output_tokens_per_second: 99 } }),
  ];
  const { labels, data } = rateSeries(calls);
  assert.deepEqual(labels, ["(no model named)", "a", "b"]);
  assert.deepEqual(data[0], [t0, t0 + 1000, t0 + 2000, t0 + 3000, t0 + 4000].map((t) => t / 1000));
  assert.deepEqual(data[1], [null, null, null, 70, null]);
  assert.deepEqual(data[2], [40, null, 41.7, null, null]);
  assert.deepEqual(data[3], [null, 28, null, null, 30.5]);
});

test("rate series: started_at when settled_at is absent; same-ms calls each keep their point", () => {
  const t = NOW - 60_000;
  const a = call("c-1", "a", t, 10);
  delete a.settled_at;
  const b = call("c-2", "b", t - 2000, 20);
  const { labels, data } = rateSeries([a, b]);
  assert.deepEqual(labels, ["a", "b"]);
  // a's started_at is t - 2000 too: two x values at the same time.
  assert.deepEqual(data[0], [(t - 2000) / 1000, (t - 2000) / 1000]);
  assert.deepEqual(data[1], [10, null]);
  assert.deepEqual(data[2], [null, 20]);
  assert.deepEqual(rateSeries([]), { labels: [], data: [[]] });
  assert.deepEqual(rateSeries(undefined), { labels: [], data: [[]] });
});

test("rate chart range: starts before the first point, at least 10 min, within the chosen range", () => {
  const end = NOW / 1000;
  // Ten seconds of calls a minute ago, last 24 h: not a day-wide axis.
  const [s1, e1] = rateRange("day", NOW, [end - 70, end - 60]);
  assert.equal(e1, end);
  assert.equal(s1, end - MIN_RATE_SPAN_MS / 1000);
  // Calls spread over six hours: a little margin before the first.
  const [s2] = rateRange("day", NOW, [end - 6 * 3600, end - 60]);
  assert.ok(s2 < end - 6 * 3600 && s2 > end - 6.5 * 3600, `${s2}`);
  // Never before the range's start.
  const [s3] = rateRange("hour", NOW, [end - 3590]);
  assert.equal(s3, end - 3600);
  // "all" without points: let uPlot pick; a range without points: the range.
  assert.equal(rateRange("all", NOW, []), null);
  assert.deepEqual(rateRange("hour", NOW, []), [end - 3600, end]);
  // A point later than now (clock skew) is still inside.
  assert.equal(rateRange("all", NOW, [end - 100, end + 5])[1], end + 5);
});

// ---- decode speed against context depth ----------------------------------------

test("the depth chart's models: each named model once, busiest first", () => {
  const models = [
    { model: "b", route: "r1", calls: 3 },
    { model: "a", route: "r1", calls: 2 },
    { model: "a", route: "r2", calls: 2 },
    { model: "", route: "r1", calls: 50 },
    { model: "c", route: "r1", calls: 3 },
  ];
  assert.deepEqual(depthModels(models), ["a", "b", "c"]);
  assert.deepEqual(depthModels(undefined), []);
});

test("the depth chart follows the History filter's model, else the one picked, else the busiest", () => {
  const models = ["a", "b"];
  assert.equal(depthModel({ filterModel: "z", picked: "b", models }), "z");
  assert.equal(depthModel({ filterModel: null, picked: "b", models }), "b");
  assert.equal(depthModel({ filterModel: "", picked: "gone", models }), "a", "named none has no curve; a stale pick falls back");
  assert.equal(depthModel({ models: [] }), null);
});

test("the depth query keeps the range and route of the filter, never its limit or client", () => {
  assert.deepEqual(depthFilter({ since: 10, until: 20, route: "r", client: "curl", limit: 500, model: "x" }, "m"), { model: "m", route: "r", since: 10, until: 20 });
});

test("the depth scatter sorts points by depth and draws the fitted line through them", () => {
  const s = depthSeries({
    model: "qwen3:8b",
    points: [
      { context_tokens: 8000, tokens_per_second: 36.1 },
      { context_tokens: 1000, tokens_per_second: 44.2 },
      { context_tokens: 4000, tokens_per_second: 40.5 },
      { context_tokens: 2000 },
      { tokens_per_second: 20 },
    ],
    fit: { a: 45, b: -0.0011, kind: "linear" },
  });
  assert.equal(s.model, "qwen3:8b");
  assert.equal(s.count, 3, "points without both numbers are dropped");
  assert.deepEqual(s.data[0], [1000, 4000, 8000]);
  assert.deepEqual(s.data[1], [44.2, 40.5, 36.1]);
  assert.deepEqual(s.data[2].map((y) => Math.round(y * 100) / 100), [43.9, 40.6, 36.2]);
  assert.equal(s.fitText, "Fitted line: 45.0 tok/s at an empty context, −1.1 tok/s per 1,000 tokens of context");
});

test("the fitted line is never drawn below 0 tok/s, nor without a fit", () => {
  const steep = depthSeries({ points: [{ context_tokens: 10, tokens_per_second: 5 }, { context_tokens: 100_000, tokens_per_second: 1 }], fit: { a: 5, b: -0.0001, kind: "linear" } });
  assert.deepEqual(steep.data[2], [4.999, null]);
  const none = depthSeries({ points: [{ context_tokens: 10, tokens_per_second: 5 }], fit: null });
  assert.deepEqual(none.data[2], [null]);
  assert.equal(none.fitText, "");
  assert.equal(depthSeries({ points: [{ context_tokens: 1, tokens_per_second: 1 }], fit: { a: 1, b: 0, kind: "power" } }).fitText, "", "an unknown kind is not drawn");
  assert.match(depthSeries({ points: [{ context_tokens: 1, tokens_per_second: 1 }], fit: { a: 30, b: 0.00001, kind: "linear" } }).fitText, /about the same at every depth/);
  assert.equal(depthSeries(null).count, 0);
});

test("a model's median reasoning per answer reads compact, ~ on an estimate, a dash when none reasoned", () => {
  const row = (m) => comparisonRows([{ model: "qwen3:8b", route: "ollama", calls: 4, ok_calls: 4, last_seen: "", ...m }], { now: NOW })[0];
  const thinker = row({ reasoning_tokens_p50: 1_840, reasoning_calls: 3 });
  assert.equal(thinker.reasoningP50, "1.8k");
  assert.equal(thinker.reasoningTitle, "Median reasoning tokens per answer over the 3 ok calls that reasoned");
  const estimated = row({ reasoning_tokens_p50: 640, reasoning_calls: 1, reasoning_tokens_estimated: true });
  assert.equal(estimated.reasoningP50, "~640");
  assert.match(estimated.reasoningTitle, /1 ok call that reasoned \(some counts are speedtap's estimates\)/);
  assert.equal(row({}).reasoningP50, DASH);
  assert.equal(reasoningText({ reasoning_tokens_p50: 2_000 }), "2k");
});

test("the decode chart marks each route's server version change at the first call on the new version", () => {
  const call = (id, route, at, version, extra = {}) => ({
    id, route, model: "qwen3:32b", status: "ok", server_version: version,
    started_at: at, settled_at: at,
    speed: { is_final: true, output_tokens_per_second: 40 },
    ...extra,
  });
  const marks = versionMarks([
    call("c-4", "ollama", "2026-11-30T10:03:00Z", "0.33.2"),
    call("c-1", "ollama", "2026-11-30T10:00:00Z", "0.32.13"),
    call("c-2", "lab", "2026-11-30T10:01:00Z", "b5902"),
    // No version read: neither a change nor a reset.
    call("c-3", "ollama", "2026-11-30T10:02:00Z", undefined),
    call("c-5", "ollama", "2026-11-30T10:04:00Z", "0.33.2"),
    // A failed call is not charted, so it marks nothing.
    call("c-6", "lab", "2026-11-30T10:05:00Z", "b6000", { status: "upstream_error" }),
    call("c-7", "lab", "2026-11-30T10:06:00Z", "b5902"),
  ]);
  assert.deepEqual(marks, [
    { x: Date.parse("2026-11-30T10:03:00Z") / 1000, route: "ollama", from: "0.32.13", to: "0.33.2", label: "ollama: 0.32.13 → 0.33.2" },
  ]);
  assert.deepEqual(versionMarks(undefined), []);
});

test("the Errors cell counts the failed calls of all and their share, 0 when the engine names none", () => {
  const [a, b, c] = comparisonRows([
    { model: "a", route: "r", calls: 10, ok_calls: 8, failed_calls: 2 },
    { model: "b", route: "r", calls: 10, ok_calls: 10 },
    { model: "c", route: "r", calls: 0, ok_calls: 0 },
  ]);
  assert.equal(a.errors, "2 / 10 (20%)");
  assert.equal(b.errors, "0 / 10");
  assert.equal(c.errors, DASH);
  assert.equal(errorsText({ calls: 3, failed_calls: 1 }), "1 / 3 (33%)");
});

test("a model whose calls all failed says all failed in its TTFT cell, dashes in the others", () => {
  const [all, some] = comparisonRows([
    { model: "x", route: "r", calls: 4, ok_calls: 0, failed_calls: 4 },
    { model: "y", route: "r", calls: 4, ok_calls: 0, failed_calls: 3 },
  ]);
  assert.equal(all.allFailed, true);
  assert.equal(all.ttftP50, "all failed");
  assert.deepEqual([all.ttftP90, all.tpsP50, all.tpsP10], [DASH, DASH, DASH]);
  assert.equal(some.allFailed, false, "one call left early, not failed: not all failed");
  assert.equal(some.ttftP50, DASH);
  assert.equal(allFailed({ calls: 0, ok_calls: 0, failed_calls: 0 }), false);
});
