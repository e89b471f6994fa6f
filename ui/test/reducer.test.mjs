import { test } from "node:test";
import assert from "node:assert/strict";
import { compareCalls, initialState, orderedCalls, reduce } from "../lib/reducer.js";
import { seenBy } from "../lib/capture.js";

const T0 = Date.UTC(2026, 10, 30, 10, 0, 0);

function identity(n, extra = {}) {
  const ms = String(n % 1000).padStart(3, "0");
  return { id: `c-${String(n).padStart(6, "0")}`, route: "sim", api: "openai_chat", started_at: `2026-11-30T10:00:${String(Math.floor(n / 1000) % 60).padStart(2, "0")}.${ms}Z`, ...extra };
}
function snapshot(extra = {}) {
  return { phase: "responding", is_final: false, elapsed_ms: 500, time_to_first_token_ms: 200, output_tokens: 10, token_source: "estimated", ...extra };
}
function settledCall(n, extra = {}) {
  return { ...identity(n), status: "ok", http_status: 200, speed: snapshot({ phase: "complete", is_final: true, output_tokens_per_second: 40 }), ...extra };
}
const speed = (n, s = {}, id = {}) => ({ type: "speed", call: identity(n, id), speed: snapshot(s) });

test("speed upserts: first creates an in-flight row, later ones replace its snapshot", () => {
  let s = initialState();
  s = reduce(s, speed(1, { phase: "awaiting_first_token", output_tokens: 0, time_to_first_token_ms: undefined }), T0);
  assert.equal(s.calls["c-000001"].status, "in_flight");
  assert.equal(s.calls["c-000001"].speed.phase, "awaiting_first_token");
  s = reduce(s, speed(1, { output_tokens: 22, output_tokens_per_second: 38.2 }, { model: "m1" }), T0);
  assert.equal(Object.keys(s.calls).length, 1);
  assert.equal(s.calls["c-000001"].speed.output_tokens, 22);
  assert.equal(s.calls["c-000001"].model, "m1");
});

test("a captured call says capture from its first snapshot, and an event without seen_by keeps it", () => {
  let s = reduce(initialState(), { ...speed(1, { phase: "awaiting_first_token" }), seen_by: "capture" }, T0);
  assert.equal(seenBy(s.calls["c-000001"]).text, "capture");
  s = reduce(s, speed(1, { output_tokens: 5 }), T0);
  assert.equal(seenBy(s.calls["c-000001"]).text, "capture");
  s = reduce(s, { ...speed(2), seen_by: "proxy" }, T0);
  assert.equal(seenBy(s.calls["c-000002"]).text, "proxy");
});

test("a later identity without the model keeps the model already known", () => {
  let s = reduce(initialState(), speed(1, {}, { model: "m1" }), T0);
  s = reduce(s, speed(1, { output_tokens: 30 }), T0);
  assert.equal(s.calls["c-000001"].model, "m1");
});

test("settled replaces the row with the final record, and late snapshots don't undo it", () => {
  let s = reduce(initialState(), speed(1, { output_tokens_per_second: 38 }), T0);
  const final = settledCall(1, { input_tokens: 15 });
  s = reduce(s, { type: "settled", call: final }, T0);
  assert.deepEqual(s.calls["c-000001"], final);
  const after = reduce(s, speed(1, { output_tokens: 99 }), T0);
  assert.equal(after, s, "state unchanged by a late snapshot");
});

test("the reducer never mutates the state it was given", () => {
  const s0 = reduce(initialState(), speed(1, { output_tokens_per_second: 10 }), T0);
  const frozen = JSON.stringify(s0);
  reduce(s0, speed(1, { output_tokens_per_second: 20 }), T0);
  reduce(s0, { type: "settled", call: settledCall(1) }, T0);
  reduce(s0, { type: "stats", stats: { tps: 20, tps_available: true, active: 1 } }, T0);
  assert.equal(JSON.stringify(s0), frozen);
});

test("ordering: in-flight rows on top, then newest first; ids break ties numerically", () => {
  let s = initialState();
  s = reduce(s, { type: "settled", call: settledCall(3) }, T0);
  s = reduce(s, speed(1), T0); // oldest, but in flight
  s = reduce(s, { type: "settled", call: settledCall(2) }, T0);
  s = reduce(s, speed(4), T0);
  assert.deepEqual(orderedCalls(s).map((c) => c.id), ["c-000004", "c-000001", "c-000003", "c-000002"]);
  const a = { id: "c-999999", status: "ok", started_at: "x" };
  const b = { id: "c-1000000", status: "ok", started_at: "x" };
  assert.ok(compareCalls(b, a) < 0, "c-1000000 is newer than c-999999");
});

test("a listed page merges: events win, except a settled listing over an in-flight row", () => {
  let s = initialState();
  s = reduce(s, speed(1, { output_tokens: 50 }), T0); // event, newer than the list's in-flight copy
  s = reduce(s, speed(2), T0); // its settled event was missed
  const listed = [
    { ...identity(1), status: "in_flight", speed: snapshot({ output_tokens: 10 }) },
    settledCall(2),
    settledCall(3),
  ];
  s = reduce(s, { type: "calls", calls: listed }, T0);
  assert.equal(s.loaded, true);
  assert.equal(s.calls["c-000001"].speed.output_tokens, 50);
  assert.equal(s.calls["c-000002"].status, "ok");
  assert.equal(s.calls["c-000003"].status, "ok");
  // A settled row is never replaced by a listing.
  const again = reduce(s, { type: "calls", calls: [{ ...settledCall(3), http_status: 599 }] }, T0);
  assert.equal(again.calls["c-000003"].http_status, 200);
});

test("rows are capped at maxRows, dropping the oldest settled ones first", () => {
  let s = initialState({ maxRows: 3 });
  s = reduce(s, speed(1, { output_tokens_per_second: 10 }), T0); // oldest but in flight: kept
  for (const n of [2, 3, 4, 5]) s = reduce(s, { type: "settled", call: settledCall(n) }, T0);
  assert.deepEqual(orderedCalls(s).map((c) => c.id), ["c-000001", "c-000005", "c-000004"]);
  assert.ok(s.series["c-000001"], "a kept row keeps its series");
  s = reduce(s, { type: "slow_first_token", call: identity(9), waited_ms: 5000, threshold_ms: 5000 }, T0);
  assert.deepEqual(Object.keys(s.calls).sort(), ["c-000001", "c-000005", "c-000009"]);
});

test("a dropped row takes its series and slow marker with it", () => {
  let s = initialState({ maxRows: 1 });
  s = reduce(s, speed(1, { output_tokens_per_second: 10 }), T0);
  s = reduce(s, { type: "slow_first_token", call: identity(1), waited_ms: 1, threshold_ms: 1 }, T0);
  s = reduce(s, { type: "settled", call: settledCall(1) }, T0);
  s = reduce(s, speed(2, { output_tokens_per_second: 10 }), T0);
  assert.deepEqual(Object.keys(s.calls), ["c-000002"]);
  assert.deepEqual(Object.keys(s.series), ["c-000002"]);
  assert.deepEqual(s.slow, {});
});

test("sparkline series: live rates only, absent ones skipped, capped at maxSeries", () => {
  let s = initialState({ maxSeries: 4 });
  s = reduce(s, speed(1, { output_tokens_per_second: undefined }), T0);
  assert.equal(s.series["c-000001"], undefined, "no rate, no point");
  for (const r of [10, 20, 30, 40, 50, 60]) s = reduce(s, speed(1, { output_tokens_per_second: r }), T0);
  assert.deepEqual(s.series["c-000001"], [30, 40, 50, 60]);
  s = reduce(s, speed(1, { phase: "complete", is_final: true, output_tokens_per_second: 99 }), T0);
  assert.deepEqual(s.series["c-000001"], [30, 40, 50, 60], "the final decode rate is a different measure");
});

test("stats: kept as the latest reading; only a real tps joins the history", () => {
  let s = initialState();
  s = reduce(s, { type: "stats", stats: { tps_available: false, estimated: false, active: 0 } }, T0);
  assert.deepEqual(s.stats, { tps_available: false, estimated: false, active: 0 });
  assert.deepEqual(s.history, []);
  s = reduce(s, { type: "stats", stats: { tps: 41.3, tps_available: true, active: 1 } }, T0 + 1000);
  s = reduce(s, { type: "stats", stats: { tps: 7, tps_available: false, active: 1 } }, T0 + 2000);
  assert.deepEqual(s.history, [{ t: T0 + 1000, tps: 41.3 }]);
  assert.equal(s.stats.tps, 7, "the panel still sees the latest payload (and hides it)");
});

test("history: older than an hour falls off", () => {
  let s = initialState();
  s = reduce(s, { type: "stats", stats: { tps: 10, tps_available: true, active: 1 } }, T0);
  s = reduce(s, { type: "stats", stats: { tps: 20, tps_available: true, active: 1 } }, T0 + 30 * 60_000);
  s = reduce(s, { type: "stats", stats: { tps: 30, tps_available: true, active: 1 } }, T0 + 61 * 60_000);
  assert.deepEqual(s.history.map((p) => p.tps), [20, 30]);
});

test("history load: the engine's points, then this page's readings newer than them", () => {
  let s = initialState();
  s = reduce(s, { type: "stats", stats: { tps: 5, tps_available: true, active: 1 } }, T0 + 5000);
  s = reduce(s, { type: "stats", stats: { tps: 6, tps_available: true, active: 1 } }, T0 + 6000);
  const points = [
    { t: T0 + 5200, tps: 50 },
    { t: T0 + 1000, tps: 10 },
    { t: T0 + 2000, tps: null }, // invalid: dropped
    { t: T0 - 2 * 3_600_000, tps: 99 }, // too old: dropped
  ];
  s = reduce(s, { type: "history", points }, T0 + 7000);
  assert.deepEqual(s.history, [
    { t: T0 + 1000, tps: 10 },
    { t: T0 + 5200, tps: 50 },
    { t: T0 + 6000, tps: 6 },
  ]);
});

test("slow_first_token marks the row; settling clears it; unknown events change nothing", () => {
  let s = reduce(initialState(), speed(1, { phase: "awaiting_first_token" }), T0);
  s = reduce(s, { type: "slow_first_token", call: identity(1), waited_ms: 5000, threshold_ms: 5000 }, T0);
  assert.deepEqual(s.slow["c-000001"], { waited_ms: 5000, threshold_ms: 5000 });
  s = reduce(s, { type: "settled", call: settledCall(1) }, T0);
  assert.equal(s.slow["c-000001"], undefined);
  assert.equal(reduce(s, { type: "nope" }, T0), s);
  assert.equal(reduce(s, { type: "speed" }, T0), s, "a malformed event is ignored");
});
