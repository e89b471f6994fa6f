// Both data sources against fakes of their globals: the same interface
// must produce the contract's HTTP requests in a browser and in the tray
// app's window, and the window's own questions go to its one command.

import { test } from "node:test";
import assert from "node:assert/strict";
import { EVENTS, SourceError, browserSource, createDataSource, windowSource } from "../lib/datasource.js";

function fakeFetch(answers) {
  const requests = [];
  const fetch = async (url, init) => {
    requests.push({ url, method: init.method, headers: init.headers, body: init.body });
    const a = answers[`${init.method} ${url}`] ?? { status: 404, body: { error: "not found" } };
    if (a.throws) throw new TypeError(a.throws);
    return {
      ok: a.status >= 200 && a.status < 300,
      status: a.status,
      json: async () => (typeof a.body === "string" ? JSON.parse(a.body) : a.body),
    };
  };
  return { fetch, requests };
}

class FakeEventSource {
  static last = null;
  constructor(url) {
    this.url = url;
    this.listeners = {};
    this.closed = false;
    FakeEventSource.last = this;
  }
  addEventListener(name, fn) {
    this.listeners[name] = fn;
  }
  emit(name, data) {
    this.listeners[name]?.({ data });
  }
  close() {
    this.closed = true;
  }
}

test("createDataSource picks the window when window.__TAURI__ exists, else the browser", () => {
  const tauri = { core: { invoke: async () => null } };
  const inWindow = createDataSource({ __TAURI__: tauri, fetch() {}, EventSource: FakeEventSource });
  assert.equal(inWindow.kind, "window");
  assert.equal(typeof inWindow.getAutostart, "function");
  const inBrowser = createDataSource({ fetch() {}, EventSource: FakeEventSource });
  assert.equal(inBrowser.kind, "browser");
  assert.equal(inBrowser.getAutostart, undefined, "a browser cannot ask the tray app");
});

test("browser: every request is the contract's method, path and body", async () => {
  const ok = (body) => ({ status: 200, body });
  const { fetch, requests } = fakeFetch({
    "GET /api/v1/calls?limit=200&route=a+b": ok({ calls: [] }),
    "GET /api/v1/stats": ok({ tps_available: false, active: 0 }),
    "GET /api/v1/stats/history": ok({ points: [] }),
    "GET /api/v1/routes": ok({ routes: [] }),
    "GET /api/v1/discover": ok({ servers: [] }),
    "GET /api/v1/settings": ok({ routes: [] }),
    "PUT /api/v1/settings": ok({ saved: true, restart_required: false }),
    "POST /api/v1/demo": ok({ running: true }),
  });
  const s = browserSource({ fetch, EventSource: FakeEventSource });
  assert.deepEqual(await s.calls({ limit: 200, route: "a b" }), { calls: [] });
  await s.stats();
  await s.statsHistory();
  await s.routes();
  await s.discover();
  await s.getSettings();
  const settings = { routes: [], slow_ttft_ms: 5000, notifications: true, notify_settled: false };
  assert.deepEqual(await s.saveSettings(settings), { saved: true, restart_required: false });
  assert.deepEqual(await s.startDemo(), { running: true });
  const put = requests.find((r) => r.method === "PUT");
  assert.equal(put.headers["Content-Type"], "application/json");
  assert.deepEqual(JSON.parse(put.body), settings);
  const post = requests.find((r) => r.method === "POST");
  assert.equal(post.headers["Content-Type"], "application/json", "writes need the JSON content type");
  assert.equal(post.body, "{}");
  for (const r of requests.filter((r) => r.method === "GET")) assert.equal(r.body, undefined);
});

test("browser: errors carry the engine's message; 404 and 405 mean unavailable", async () => {
  const { fetch } = fakeFetch({
    "PUT /api/v1/settings": { status: 400, body: { error: "routes[0].listen: not host:port" } },
    "GET /api/v1/stats": { status: 500, body: "not json at all" },
    "POST /api/v1/demo": { status: 405, body: { error: "method not allowed" } },
    "GET /api/v1/routes": { throws: "connection refused" },
  });
  const s = browserSource({ fetch, EventSource: FakeEventSource });
  await assert.rejects(s.saveSettings({}), (e) => e instanceof SourceError && e.status === 400 && !e.unavailable && e.message === "routes[0].listen: not host:port");
  await assert.rejects(s.statsHistory(), (e) => e.status === 404 && e.unavailable === true && e.message === "not found");
  await assert.rejects(s.startDemo(), (e) => e.unavailable === true);
  await assert.rejects(s.routes(), (e) => e instanceof SourceError && /not reachable/.test(e.message) && !e.unavailable);
});

test("browser: events come from /api/v1/events, parsed; broken frames are dropped", () => {
  const s = browserSource({ fetch() {}, EventSource: FakeEventSource });
  const got = [];
  let opened = 0;
  const close = s.subscribe({
    speed: (d) => got.push(["speed", d]),
    stats: (d) => got.push(["stats", d]),
    settled: (d) => got.push(["settled", d]),
    slow_first_token: (d) => got.push(["slow", d]),
    open: () => opened++,
  });
  const es = FakeEventSource.last;
  assert.equal(es.url, "/api/v1/events");
  assert.deepEqual(Object.keys(es.listeners).sort(), [...EVENTS].sort());
  es.onopen();
  es.emit("speed", '{"call":{"id":"c-1"},"speed":{"phase":"responding"}}');
  es.emit("stats", "{not json");
  es.emit("slow_first_token", '{"waited_ms":5000}');
  assert.equal(opened, 1);
  assert.deepEqual(got, [
    ["speed", { call: { id: "c-1" }, speed: { phase: "responding" } }],
    ["slow", { waited_ms: 5000 }],
  ]);
  close();
  assert.equal(es.closed, true);
});

function fakeTauri(results) {
  const invoked = [];
  const listeners = {};
  const unlistened = [];
  return {
    invoked,
    listeners,
    unlistened,
    core: {
      invoke: async (cmd, args) => {
        invoked.push([cmd, args]);
        if (!(cmd in results)) throw `command ${cmd} not found`;
        const r = results[cmd];
        if (r instanceof Error) throw r.message;
        return r;
      },
    },
    event: {
      listen: async (name, fn) => {
        listeners[name] = fn;
        return () => unlistened.push(name);
      },
    },
  };
}

test("window: the data is the browser's HTTP, the tray app's questions go to the app command", async () => {
  const tauri = fakeTauri({ app: { available: true, enabled: false } });
  const { fetch, requests } = fakeFetch({ "GET /api/v1/stats": { status: 200, body: { tokens_per_second: 1 } } });
  const s = windowSource({ fetch, EventSource: FakeEventSource }, tauri);
  assert.deepEqual(await s.stats(), { tokens_per_second: 1 });
  assert.deepEqual(requests.map((r) => r.url), ["/api/v1/stats"]);
  await s.portConflicts();
  await s.useFreePort("ollama");
  await s.getAutostart();
  await s.setAutostart(true);
  assert.deepEqual(tauri.invoked, [
    ["app", { command: "port_conflicts", args: {} }],
    ["app", { command: "use_free_port", args: { route: "ollama" } }],
    ["app", { command: "get_autostart", args: {} }],
    ["app", { command: "set_autostart", args: { enabled: true } }],
  ]);
  s.subscribe({});
  assert.equal(FakeEventSource.last.url, "/api/v1/events", "events come over HTTP too");
});

test("window: a refused question is a SourceError; a missing or ungranted command means unavailable", async () => {
  const s = windowSource({ fetch() {}, EventSource: FakeEventSource }, fakeTauri({ app: new Error("no port conflict for route x") }));
  await assert.rejects(s.useFreePort("x"), (e) => e instanceof SourceError && !e.unavailable && e.message === "no port conflict for route x");
  const old = windowSource({ fetch() {}, EventSource: FakeEventSource }, fakeTauri({}));
  await assert.rejects(old.getAutostart(), (e) => e.unavailable === true);
  const ungranted = windowSource({ fetch() {}, EventSource: FakeEventSource }, fakeTauri({ app: new Error("Command app not allowed by ACL") }));
  await assert.rejects(ungranted.getAutostart(), (e) => e.unavailable === true);
});

// ---- History ---------------------------------------------------------------

test("browser: history and models are GETs with the filter as the query; models drop the limit", async () => {
  const ok = (body) => ({ status: 200, body });
  const { fetch, requests } = fakeFetch({
    "GET /api/v1/history?model=qwen3%3A8b&client=&since=1000&limit=500": ok({ calls: [{ id: "c-1" }] }),
    "GET /api/v1/history": ok({ calls: [] }),
    "GET /api/v1/models?model=qwen3%3A8b&client=&since=1000": ok({ models: [] }),
    "GET /api/v1/models": ok({ models: [] }),
  });
  const s = browserSource({ fetch, EventSource: FakeEventSource });
  const filter = { since: 1000, model: "qwen3:8b", client: "", limit: 500 };
  assert.deepEqual(await s.history(filter), { calls: [{ id: "c-1" }] });
  assert.deepEqual(await s.models(filter), { models: [] });
  await s.history();
  await s.models();
  assert.equal(requests.length, 4);
  assert.deepEqual(filter, { since: 1000, model: "qwen3:8b", client: "", limit: 500 }, "the caller's filter is not changed");
});

test("browser: no store is a 503 carrying the engine's message; export is a link, not a fetch", async () => {
  const message = "no store: history needs --db (it is off with --no-db)";
  const { fetch, requests } = fakeFetch({
    "GET /api/v1/history": { status: 503, body: { error: message } },
  });
  const s = browserSource({ fetch, EventSource: FakeEventSource }, "http://127.0.0.1:9");
  const fresh = browserSource({ fetch, EventSource: FakeEventSource });
  await assert.rejects(fresh.history(), (e) => e instanceof SourceError && e.status === 503 && !e.unavailable && e.message === message);
  const before = requests.length;
  assert.deepEqual(await s.exportFile({ route: "ollama", limit: 10 }, "jsonl"), {
    url: "http://127.0.0.1:9/api/v1/export?format=jsonl&route=ollama",
  });
  assert.equal(requests.length, before, "the browser follows the link itself");
});

test("the live list never asks for unmetered calls: they are shown only on request", async () => {
  const { fetch, requests } = fakeFetch({
    "GET /api/v1/calls": { status: 200, body: { calls: [] } },
    "GET /api/v1/calls?limit=200": { status: 200, body: { calls: [] } },
  });
  const s = browserSource({ fetch, EventSource: FakeEventSource });
  await s.calls();
  await s.calls({ limit: 200 });
  assert.deepEqual(requests.map((r) => r.url), ["/api/v1/calls", "/api/v1/calls?limit=200"]);
  for (const r of requests) assert.ok(!r.url.includes("unmetered"), r.url);
});
