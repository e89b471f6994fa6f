import { test } from "node:test";
import assert from "node:assert/strict";
import { createScrollMemory, initialView } from "../lib/views.js";

test("the window opens on the view the URL names", () => {
  assert.equal(initialView("#history", { hasCalls: false }), "history");
  assert.equal(initialView("settings", { hasCalls: true }), "settings");
});

test("without a named view the window opens on Live once there are calls, else on Get started", () => {
  assert.equal(initialView("", { hasCalls: true }), "live");
  assert.equal(initialView("", { hasCalls: false }), "start");
  assert.equal(initialView("#nonsense", { hasCalls: false }), "start");
});

test("while it is not known whether there are calls the window shows Live", () => {
  assert.equal(initialView(""), "live");
  assert.equal(initialView(undefined, { hasCalls: null }), "live");
});

test("each view gets back its own scroll position and a new view starts at the top", () => {
  const memory = createScrollMemory();
  memory.leave("history", 640);
  assert.equal(memory.enter("live"), 0);
  memory.leave("live", 120);
  assert.equal(memory.enter("history"), 640);
  assert.equal(memory.enter("live"), 120);
  assert.equal(memory.enter("settings"), 0);
});

test("a position for an unknown view or a non-number is not kept", () => {
  const memory = createScrollMemory();
  memory.leave("nope", 50);
  memory.leave("live", NaN);
  assert.equal(memory.enter("nope"), 0);
  assert.equal(memory.enter("live"), 0);
});
