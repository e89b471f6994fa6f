// Why calls wait, as a user sees it, in real headless Chromium against a
// fixture engine: a small node HTTP server serves ui/ and answers the
// control API from e2e/fixtures/wait.json (one call per wait reason, settled
// calls with a cut prompt, context, drafts, placement and start, and a
// depth curve), and pushes live `speed` events over SSE. No speedtap
// binary is needed, so the presentation is checked without a model server
// that can be made to load, queue or prefill on cue.
//
// Run from ui/: `node --test e2e/wait.e2e.mjs` (part of `npm run e2e`).
// Env: CHROMIUM (default /usr/bin/chromium); SPEEDTAP_SHOTS: where the
// screenshots go (default e2e/out/).

import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { existsSync, mkdirSync, mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, extname, join, normalize, resolve, sep } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

const UI = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const CHROMIUM = process.env.CHROMIUM ?? "/usr/bin/chromium";
const OUT = process.env.SPEEDTAP_SHOTS ? resolve(process.env.SPEEDTAP_SHOTS) : join(UI, "e2e", "out");
const FIXTURE = JSON.parse(readFileSync(join(UI, "e2e", "fixtures", "wait.json"), "utf8"));
const SOON = 10_000;
const TYPES = { ".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml", ".json": "application/json" };

let server = null;
let base = "";
let browser = null;
let page = null;
const pageErrors = [];
/** Open SSE responses, to push events to the page. */
const streams = new Set();
const depthQueries = [];

/** The fixture's calls, started a minute ago (the table shows today's as hh:mm:ss), a second apart. */
const START = Date.now() - 60_000;
const CALLS = FIXTURE.calls.map((c, i) => {
  const started = START + i * 1000;
  const settled = c.status === "in_flight" ? {} : { settled_at: new Date(started + c.speed.elapsed_ms).toISOString() };
  return { ...c, started_at: new Date(started).toISOString(), ...settled };
});
const calls = () => CALLS;

function send(res, status, body) {
  res.writeHead(status, { "content-type": "application/json" });
  res.end(JSON.stringify(body));
}

function answer(req, res) {
  const url = new URL(req.url, "http://x");
  const now = Date.now();
  switch (url.pathname) {
    case "/api/v1/events":
      res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-store" });
      res.write(": open\n\n");
      streams.add(res);
      req.on("close", () => streams.delete(res));
      return;
    case "/api/v1/calls":
      return send(res, 200, { calls: calls() });
    case "/api/v1/stats":
      return send(res, 200, { tps_available: false, estimated: false, active: 3, dropped_subscribers: 0 });
    case "/api/v1/stats/history":
      return send(res, 200, { points: [] });
    case "/api/v1/history":
      return send(res, 200, { calls: calls().filter((c) => c.status !== "in_flight") });
    case "/api/v1/models":
      return send(res, 200, { models: FIXTURE.models.map((m) => ({ ...m, last_seen: new Date(now).toISOString() })) });
    case "/api/v1/history/depth": {
      depthQueries.push(Object.fromEntries(url.searchParams));
      const model = url.searchParams.get("model");
      return send(res, 200, FIXTURE.depth[model] ?? { model, points: [], fit: null });
    }
    default:
      if (url.pathname.startsWith("/api/")) return send(res, 404, { error: "not in the fixture" });
  }
  const path = normalize(join(UI, url.pathname === "/" ? "index.html" : decodeURIComponent(url.pathname)));
  if (!path.startsWith(UI + sep) || !existsSync(path)) {
    res.writeHead(404);
    return res.end();
  }
  res.writeHead(200, { "content-type": TYPES[extname(path)] ?? "application/octet-stream" });
  res.end(readFileSync(path));
}

function push(event, data) {
  for (const res of streams) res.write(`event: ${event}\ndata: ${JSON.stringify(data)}\n\n`);
}

async function shot(name) {
  await page.screenshot({ path: join(OUT, `${name}.png`), fullPage: true });
}

const row = (id) => page.locator(`#calls tr[data-id="${id}"]`);
const text = async (locator) => (await locator.textContent())?.trim();

before(async () => {
  if (!existsSync(CHROMIUM)) throw new Error(`no Chromium at ${CHROMIUM} (apt-get install chromium, or set CHROMIUM)`);
  mkdirSync(OUT, { recursive: true });
  server = createServer(answer);
  await new Promise((ok) => server.listen(0, "127.0.0.1", ok));
  base = `http://127.0.0.1:${server.address().port}`;
  browser = await chromium.launchPersistentContext(mkdtempSync(join(tmpdir(), "speedtap-wait-e2e-")), {
    executablePath: CHROMIUM,
    headless: true,
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"],
    viewport: { width: 1360, height: 900 },
    deviceScaleFactor: 1,
  });
  page = browser.pages()[0] ?? (await browser.newPage());
  page.on("pageerror", (e) => pageErrors.push(String(e?.stack ?? e)));
  await page.goto(`${base}/#live`);
  await page.waitForSelector('#calls tr[data-id="c-000101"]', { timeout: SOON });
});

after(async () => {
  for (const res of streams) res.end();
  await browser?.close();
  await new Promise((ok) => (server ? server.close(ok) : ok()));
  assert.deepEqual(pageErrors, [], "the page threw");
});

test("each waiting row names its reason, a prefill shows its progress and time left", async () => {
  assert.equal(await text(row("c-000101").locator(".badge.phase")), "loading model");
  assert.equal(await text(row("c-000102").locator(".badge.phase")), "queued #2");
  assert.equal(await text(row("c-000103").locator(".badge.phase")), "prefill 60%");
  assert.equal(await text(row("c-000104").locator(".badge.phase")), "waiting");
  assert.equal(await row("c-000103").locator(".wait-bar").isVisible(), true);
  assert.equal(await row("c-000103").locator(".wait-bar").getAttribute("aria-valuenow"), "60");
  assert.equal(await text(row("c-000103").locator(".wait-eta")), "about 3 s left");
  assert.equal(await row("c-000102").locator(".wait-bar").isVisible(), false, "a queue has no progress bar");
  assert.match(await row("c-000101").locator(".badge.phase").getAttribute("title"), /Loading the model \(usually 4\.0 s\)/);
  assert.equal(await text(row("c-000105").locator(".badge.cut")), "prompt cut");
  assert.equal(await row("c-000106").locator(".badge.cut").isVisible(), false);
  await shot("wait-live");
});

test("a live snapshot moves the prefill on, and its first token ends the wait", async () => {
  const c = CALLS.find((x) => x.id === "c-000103");
  const identity = { id: c.id, route: c.route, api: c.api, model: c.model, started_at: c.started_at };
  push("speed", { call: identity, speed: { ...c.speed, elapsed_ms: 6000, wait: { ...c.speed.wait, progress: 0.85, eta_ms: 1000 } } });
  await page.waitForFunction(() => document.querySelector('#calls tr[data-id="c-000103"] .badge.phase')?.textContent === "prefill 85%", null, { timeout: SOON });
  assert.equal(await text(row("c-000103").locator(".wait-eta")), "about 1 s left");
  push("speed", { call: identity, speed: { phase: "responding", is_final: false, elapsed_ms: 7100, time_to_first_token_ms: 7000, output_tokens: 3, token_source: "estimated" } });
  await page.waitForFunction(() => document.querySelector('#calls tr[data-id="c-000103"] .badge.phase')?.textContent === "responding", null, { timeout: SOON });
  assert.equal(await row("c-000103").locator(".wait-line").isVisible(), false);
  // Back to the fixture's state for the screenshots below.
  push("speed", { call: identity, speed: c.speed });
  await page.waitForFunction(() => document.querySelector('#calls tr[data-id="c-000103"] .badge.phase')?.textContent === "prefill 60%", null, { timeout: SOON });
});

test("the details of a waiting call explain the wait: prefill progress, prompt size, ETA", async () => {
  await row("c-000103").click();
  await page.waitForSelector("#details:not([hidden]) #details-wait", { timeout: SOON });
  assert.equal(await text(page.locator("#details-wait")), "Processing the prompt of 12,000 tokens, 60% done");
  assert.equal(await page.locator('#details [data-section="wait"] .wait-meter').getAttribute("aria-valuenow"), "60");
  assert.equal(await text(page.locator('#details dd[data-field="First token"]')), "about 3 s left");
  assert.equal(await text(page.locator('#details dd[data-field="Usual TTFT"]')), "7.4 s");
  await shot("wait-details-prefill");
  await row("c-000102").click();
  await page.waitForFunction(() => document.querySelector("#details-wait")?.textContent === "Queued behind 2 calls on this server", null, { timeout: SOON });
  await shot("wait-details-queued");
  await row("c-000101").click();
  await page.waitForFunction(() => document.querySelector("#details-wait")?.textContent === "Loading the model (usually 4.0 s)", null, { timeout: SOON });
  await shot("wait-details-loading");
});

test("the details of a settled call warn about the cut prompt and show the facts", async () => {
  await row("c-000105").click();
  await page.waitForSelector("#details-truncated", { timeout: SOON });
  assert.equal(await text(page.locator("#details-truncated .warning-numbers")), "9,000 tokens sent, 2,048 read (context 2,048).");
  const first = await page.locator("#details-body > *").first().getAttribute("id");
  assert.equal(first, "details-truncated", "the warning comes first");
  assert.equal(await text(page.locator('#details dd[data-fact="context"]')), "2,048 of 2,048 tokens (100%)");
  assert.equal(await text(page.locator('#details dd[data-fact="placement"]')), "split GPU / CPU (3.1 GB of 5.0 GB in VRAM)");
  assert.equal(await text(page.locator('#details dd[data-fact="start"]')), "cold (the model loaded for this call)");
  assert.equal(await text(page.locator('#details [data-section="wait"] h3')), "Before the first token");
  assert.equal(await text(page.locator("#details-wait")), "Waited for the model to load (usually 4.0 s)");
  await shot("wait-details-truncated");
  await page.locator('#details [data-section="facts"]').scrollIntoViewIfNeeded();
  await shot("wait-details-truncated-facts");
  await row("c-000106").click();
  await page.waitForFunction(() => document.querySelector('#details dd[data-fact="draft"]')?.textContent === "80% (96 of 120 drafted tokens)", null, { timeout: SOON });
  assert.equal(await page.locator("#details-truncated").count(), 0);
  assert.equal(await text(page.locator('#details dd[data-fact="placement"]')), "GPU (5.0 GB of 5.0 GB in VRAM)");
  await page.locator('#details [data-section="facts"]').scrollIntoViewIfNeeded();
  await shot("wait-details-facts");
  await page.emulateMedia({ colorScheme: "dark" });
  await shot("wait-details-facts-dark");
  await page.emulateMedia({ colorScheme: "light" });
  await page.keyboard.press("Escape");
});

test("the History view plots decode speed against context depth with the fitted line", async () => {
  await page.goto(`${base}/#history`);
  await page.waitForSelector("#h-depth-card:not([hidden]) #h-depth canvas", { timeout: SOON });
  assert.equal(await page.locator("#h-depth-model").inputValue(), "qwen3:8b", "the busiest model first");
  assert.match(await text(page.locator("#h-depth-fit")), /^Fitted line: 45\.0 tok\/s at an empty context, −1\.1 tok\/s per 1,000 tokens of context$/);
  assert.equal(await page.locator("#h-depth-empty").isVisible(), false);
  assert.equal(depthQueries.at(-1).model, "qwen3:8b");
  assert.ok(depthQueries.at(-1).since, "the History range bounds the curve");
  await shot("wait-history-depth");
  await page.selectOption("#h-depth-model", "qwen3:32b");
  await page.waitForFunction(() => document.querySelector("#h-depth-fit")?.textContent === "A fitted line needs at least 3 calls.", null, { timeout: SOON });
  assert.equal(depthQueries.at(-1).model, "qwen3:32b");
});
