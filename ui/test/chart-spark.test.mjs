import { test } from "node:test";
import assert from "node:assert/strict";
import { GAP_MS, MIN_SPAN_MS, chartData, chartRange } from "../lib/chart.js";
import { sparklinePoints } from "../lib/sparkline.js";

const T0 = 1_800_000_000_000;

test("chart data: seconds on x, tok/s on y, in time order", () => {
  const [xs, ys] = chartData([{ t: T0, tps: 40 }, { t: T0 + 1000, tps: 41.5 }], { now: T0 + 2000 });
  assert.deepEqual(xs, [T0 / 1000, T0 / 1000 + 1]);
  assert.deepEqual(ys, [40, 41.5]);
});

test("chart data: a silence longer than the gap breaks the line with a null", () => {
  const h = [{ t: T0, tps: 40 }, { t: T0 + 1000, tps: 41 }, { t: T0 + 1000 + GAP_MS + 1, tps: 30 }];
  const [xs, ys] = chartData(h, { now: T0 + 60_000 });
  assert.deepEqual(ys, [40, 41, null, 30]);
  assert.equal(xs.length, 4);
  assert.ok(xs[1] < xs[2] && xs[2] < xs[3], "the gap marker sits between its neighbours");
  const [, joined] = chartData([{ t: T0, tps: 1 }, { t: T0 + GAP_MS, tps: 2 }], { now: T0 + GAP_MS });
  assert.deepEqual(joined, [1, 2], "exactly the gap still joins");
});

test("chart data: only the window before now is drawn", () => {
  const h = [{ t: T0 - 3_600_001, tps: 1 }, { t: T0 - 10, tps: 2 }, { t: T0 + 10, tps: 3 }];
  assert.deepEqual(chartData(h, { now: T0 })[1], [2]);
});

test("chart range: the part of the hour with readings, at least MIN_SPAN_MS, never more than the hour", () => {
  const s = (ms) => ms / 1000;
  assert.deepEqual(chartRange(T0, []), [s(T0 - MIN_SPAN_MS), s(T0)], "no readings: the minimum span");
  assert.deepEqual(chartRange(T0, [{ t: T0 - 60_000, tps: 1 }]), [s(T0 - MIN_SPAN_MS), s(T0)], "a minute of traffic: still five minutes wide");
  assert.deepEqual(chartRange(T0, [{ t: T0 - 20 * 60_000, tps: 1 }]), [s(T0 - 20 * 60_000 - 30_000), s(T0)], "from just before the first reading");
  assert.deepEqual(chartRange(T0, [{ t: T0 - 3_599_000, tps: 1 }]), [s(T0 - 3_600_000), s(T0)], "capped at the hour");
  assert.deepEqual(chartRange(T0, [{ t: T0 - 7_200_000, tps: 1 }]), [s(T0 - MIN_SPAN_MS), s(T0)], "readings older than the hour don't count");
});

test("sparkline: fewer than two values draw nothing", () => {
  assert.equal(sparklinePoints([], 88, 22), "");
  assert.equal(sparklinePoints([40], 88, 22), "");
  assert.equal(sparklinePoints([40, NaN, -1], 88, 22), "");
});

test("sparkline: spans the width, 0 at the bottom, headroom at the top", () => {
  const pts = sparklinePoints([0, 50, 100], 100, 24, 2).split(" ").map((p) => p.split(",").map(Number));
  assert.deepEqual(pts.map(([x]) => x), [2, 50, 98]);
  assert.equal(pts[0][1], 22, "0 tok/s on the bottom edge");
  assert.ok(pts[2][1] > 2 && pts[2][1] < 5, `the max sits just under the top: ${pts[2][1]}`);
  assert.ok(pts[1][1] < pts[0][1] && pts[1][1] > pts[2][1]);
});

test("sparkline: a steady rate is a flat line, not a saw", () => {
  const ys = sparklinePoints([40, 41, 40, 41], 88, 22, 1).split(" ").map((p) => Number(p.split(",")[1]));
  const spread = Math.max(...ys) - Math.min(...ys);
  assert.ok(spread < 1, `spread ${spread}px`);
});
