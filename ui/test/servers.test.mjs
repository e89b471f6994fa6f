import { test } from "node:test";
import assert from "node:assert/strict";
import { describeServer, kindLabel } from "../lib/servers.js";

const server = (over) => ({
  name: "llama-server-9931",
  kind: "llama-server",
  upstream: "http://127.0.0.1:9931",
  state: "measured",
  seen_by: "capture",
  route: "llama-server-9931",
  found_at: 0,
  last_seen: 0,
  ...over,
});

test("a captured server needs no client change and offers no URL", () => {
  const d = describeServer(server({ process: "llama-server", pid: 42, version: "build 6890" }));
  assert.equal(d.title, "llama-server-9931");
  assert.equal(d.subtitle, "llama.cpp · build 6890 · at http://127.0.0.1:9931 · llama-server (pid 42)");
  assert.equal(d.chip, "captured");
  assert.equal(d.proxyUrl, null);
});

test("a proxied server gives the URL clients must use", () => {
  const d = describeServer(server({ state: "proxied", seen_by: "proxy", proxy_listen: "127.0.0.1:9932" }));
  assert.equal(d.chip, "through speedtap");
  assert.equal(d.proxyUrl, "http://127.0.0.1:9932");
});

test("a server behind a configured route names that route", () => {
  const d = describeServer(server({ name: "ollama", kind: "ollama", route: "mine", seen_by: "proxy" }));
  assert.equal(d.chip, "measured by route mine");
});

test("a stopped server is down with its history kept, and unknown kinds show as they are", () => {
  const d = describeServer(server({ state: "down", seen_by: undefined }));
  assert.equal(d.chip, "down");
  assert.match(d.note, /history is kept/);
  assert.equal(kindLabel("something-new"), "something-new");
});
