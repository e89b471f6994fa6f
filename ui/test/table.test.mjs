import { test } from "node:test";
import assert from "node:assert/strict";
import { filterCalls, filterOptions, nextSort, parseSort, sortCalls } from "../lib/table.js";

const call = (id, extra = {}, speed = {}) => ({ id, route: "sim", model: "m", status: "ok", ...extra, speed: { phase: "complete", ...speed } });
const ids = (calls) => calls.map((c) => c.id);

test("a numeric column sorts from the highest first, and a second click reverses it", () => {
  const calls = [call("a", {}, { output_tokens_per_second: 10 }), call("b", {}, { output_tokens_per_second: 30 }), call("c", {}, { output_tokens_per_second: 20 })];
  const first = nextSort(null, "rate");
  assert.deepEqual(first, { key: "rate", dir: "desc" });
  assert.deepEqual(ids(sortCalls(calls, first)), ["b", "c", "a"]);
  assert.deepEqual(ids(sortCalls(calls, nextSort(first, "rate"))), ["a", "c", "b"]);
});

test("a third click on the same header returns to the table's own order", () => {
  const calls = [call("a"), call("b")];
  const third = nextSort(nextSort(nextSort(null, "ttft"), "ttft"), "ttft");
  assert.equal(third, null);
  assert.equal(sortCalls(calls, third), calls);
});

test("a call without the number sorts after those with one in both directions", () => {
  const calls = [call("waiting", {}, { phase: "awaiting_first_token" }), call("slow", {}, { time_to_first_token_ms: 900 }), call("fast", {}, { time_to_first_token_ms: 100 })];
  assert.deepEqual(ids(sortCalls(calls, { key: "ttft", dir: "asc" })), ["fast", "slow", "waiting"]);
  assert.deepEqual(ids(sortCalls(calls, { key: "ttft", dir: "desc" })), ["slow", "fast", "waiting"]);
});

test("text columns sort from A, with numbers inside names in numeric order, and ties keep the table's order", () => {
  const calls = [call("1", { model: "qwen-14b" }), call("2", { model: "qwen-7b" }), call("3", { model: "llama" }), call("4", { model: "qwen-7b" })];
  assert.deepEqual(ids(sortCalls(calls, nextSort(null, "model"))), ["3", "2", "4", "1"]);
});

test("an unknown or malformed sort choice is no sort", () => {
  assert.equal(parseSort({ key: "nope", dir: "asc" }), null);
  assert.equal(parseSort({ key: "rate", dir: "sideways" }), null);
  assert.equal(parseSort("rate"), null);
  assert.deepEqual(nextSort(null, "nope"), null);
});

test("the live filter keeps the calls of the chosen model and route, and an empty choice keeps all", () => {
  const calls = [call("a", { model: "m1", route: "r1" }), call("b", { model: "m2", route: "r1" }), call("c", { model: "m1", route: "r2" })];
  assert.equal(filterCalls(calls, {}), calls);
  assert.deepEqual(ids(filterCalls(calls, { model: "m1" })), ["a", "c"]);
  assert.deepEqual(ids(filterCalls(calls, { model: "m1", route: "r2" })), ["c"]);
  assert.deepEqual(ids(filterCalls(calls, { route: "r9" })), []);
});

test("the filter offers each model and route once, sorted, and keeps a chosen one whose calls are gone", () => {
  const calls = [call("a", { model: "b-model", route: "sim" }), call("b", { model: "a-model", route: "sim" }), call("c", { model: undefined, route: "demo" })];
  assert.deepEqual(filterOptions(calls), { models: ["a-model", "b-model"], routes: ["demo", "sim"] });
  assert.deepEqual(filterOptions(calls, { model: "gone" }).models, ["a-model", "b-model", "gone"]);
});
