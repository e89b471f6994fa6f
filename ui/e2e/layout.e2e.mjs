// The window for daily use, in headless Chromium against the real binary
// (`speedtap simulate` behind `speedtap run`, plus demo traffic): at 800×600
// and 1280×800 each call's model, phase, TTFT and tok/s are on the first
// screen with no horizontal scrolling, rows are cards below 900 px, column
// widths hold as rows arrive, headers sort and the pickers filter, each tab
// keeps its own scroll position and the drawer closes on a tab switch, and
// after a restart the hour's high, low and chart come back from the store.
//
// Run from ui/ with `npm run e2e` (after `cargo build --bin speedtap`).

import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { BIN, launchChromium, startStack, waitFor as waitUntil } from "./harness.mjs";

let stack = null;
let browser = null;
let api = "";
let proxy = "";

/** The harness's poll, with this suite's longer deadline (several calls load). */
const waitFor = (what, check, timeout = 20_000) => waitUntil(what, check, timeout);

async function call(model) {
  const res = await fetch(`${proxy}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model, stream: true, messages: [{ role: "user", content: "layout" }] }),
  });
  assert.equal(res.status, 200);
  await res.text();
}

before(async () => {
  assert.ok(existsSync(BIN), `no speedtap binary at ${BIN}`);
  stack = await startStack({ name: "speedtap-layout", sim: ["--tps", "200", "--tokens", "20"] });
  api = stack.api;
  proxy = stack.proxy;
  // Models whose order by name differs from their order by time.
  for (const model of ["m-b", "m-a", "m-c", "m-a"]) await call(model);
  browser = await launchChromium();
});

after(async () => {
  await browser?.close().catch(() => {});
  await stack?.stop();
});

async function open(width, height) {
  const page = await browser.newPage({ viewport: { width, height }, deviceScaleFactor: 1 });
  await page.goto(`${api}/#live`);
  await waitFor("the four calls", () => page.evaluate(() => document.querySelectorAll("#calls tr[data-id]").length >= 4));
  return page;
}

/** Where the first row's key cells are, against the viewport. */
function keyCells(page) {
  return page.evaluate(() => {
    const tr = document.querySelector("#calls tr[data-id]");
    const box = (col) => {
      const r = tr.querySelector(`[data-col="${col}"]`).getBoundingClientRect();
      return { left: r.left, right: r.right, top: r.top, bottom: r.bottom, width: r.width };
    };
    return {
      cells: Object.fromEntries(["model", "phase", "ttft", "rate"].map((c) => [c, box(c)])),
      vw: window.innerWidth,
      vh: window.innerHeight,
      scrollWidth: document.documentElement.scrollWidth,
      wrapScroll: document.querySelector("#calls-table").closest(".table-wrap").scrollWidth,
      wrapWidth: document.querySelector("#calls-table").closest(".table-wrap").clientWidth,
      cards: getComputedStyle(document.querySelector("#calls-table thead")).display === "none",
    };
  });
}

for (const [width, height, cards] of [
  [800, 600, true],
  [1280, 800, false],
]) {
  test(`at ${width}×${height} the key numbers of a call are on the first screen with no horizontal scrolling`, async () => {
    const page = await open(width, height);
    const at = await keyCells(page);
    assert.equal(at.cards, cards, cards ? "below 900 px the rows are cards" : "at full size the calls are a table");
    for (const [col, r] of Object.entries(at.cells)) {
      assert.ok(r.width > 0, `${col} is shown`);
      assert.ok(r.left >= 0 && r.right <= at.vw, `${col} is within the width: ${JSON.stringify(r)} of ${at.vw}`);
      assert.ok(r.top >= 0 && r.bottom <= at.vh, `${col} is within the first screen: ${JSON.stringify(r)} of ${at.vh}`);
    }
    assert.ok(at.scrollWidth <= at.vw, `the page does not scroll sideways (${at.scrollWidth} > ${at.vw})`);
    assert.ok(at.wrapScroll <= at.wrapWidth + 1, `the table does not scroll sideways (${at.wrapScroll} > ${at.wrapWidth})`);
    await page.close();
  });
}

test("the live table's column widths hold while rows arrive", async () => {
  const page = await open(1280, 800);
  const widths = () => page.evaluate(() => [...document.querySelectorAll("#calls-table thead th")].map((th) => th.getBoundingClientRect().width));
  const before = await widths();
  const rows = await page.evaluate(() => document.querySelectorAll("#calls tr[data-id]").length);
  await call("a-model-with-a-much-longer-name-than-the-others:70b-instruct-q4_K_M");
  await waitFor("the new row", () => page.evaluate((n) => document.querySelectorAll("#calls tr[data-id]").length > n, rows));
  assert.deepEqual(await widths(), before);
  await page.close();
});

test("a header click sorts the live table, a second reverses it, and the model and route pickers filter it", async () => {
  const page = await open(1280, 800);
  const models = () => page.evaluate(() => [...document.querySelectorAll('#calls tr[data-id] [data-col="model"]')].map((td) => td.textContent));
  const byTime = await models();
  // The table redraws on the next frame: wait for the order asked for.
  const shows = (what, want) => waitFor(what, async () => JSON.stringify(await models()) === JSON.stringify(want));
  await page.click('#calls-table th[data-sort="model"]');
  await shows("the models from A", [...byTime].sort());
  assert.equal(await page.getAttribute('#calls-table th[data-sort="model"]', "aria-sort"), "ascending");
  await page.click('#calls-table th[data-sort="model"]');
  await shows("the models from Z", [...byTime].sort().reverse());
  await page.click('#calls-table th[data-sort="model"]');
  await shows("the newest first again after a third click", byTime);

  await page.selectOption("#live-model", "m-a");
  const filtered = byTime.filter((m) => m === "m-a");
  assert.ok(filtered.length >= 2);
  await shows("only m-a", filtered);
  assert.match(await page.textContent("#calls-count"), /filtered out/);
  await page.selectOption("#live-route", "sim");
  await shows("only m-a on route sim", filtered);
  await page.selectOption("#live-model", "");
  await page.selectOption("#live-route", "");
  await shows("every call again", byTime);
  await page.close();
});

test("each tab keeps its own scroll position and the details drawer closes on a tab switch", async () => {
  const page = await open(800, 600);
  // Enough rows that Live scrolls.
  for (let i = 0; i < 8; i++) await call(`m-${i}`);
  await waitFor("Live to scroll", () => page.evaluate(() => document.documentElement.scrollHeight > window.innerHeight + 300));
  await page.evaluate(() => window.scrollTo(0, 300));
  // A click without scrolling the row into view (a real click does not move the page).
  await page.evaluate(() => [...document.querySelectorAll("#calls tr[data-id]")].at(-1).click());
  await page.waitForSelector("#details:not([hidden])");
  assert.equal(await page.evaluate(() => window.scrollY), 300);
  // The drawer's close control is visible after its body scrolls.
  await page.evaluate(() => {
    document.getElementById("details").scrollTop = 10_000;
  });
  const close = await page.evaluate(() => {
    const r = document.getElementById("details-close").getBoundingClientRect();
    return r.top >= 0 && r.bottom <= window.innerHeight && r.height > 0;
  });
  assert.ok(close, "the close button stays in view");

  await page.click("#tab-settings");
  await page.waitForSelector('body[data-view="settings"]');
  assert.equal(await page.evaluate(() => document.getElementById("details").hidden), true, "the drawer closed");
  assert.equal(await page.evaluate(() => window.scrollY), 0, "Settings opens at its top, not at Live's position");
  await page.click("#tab-live");
  await page.waitForSelector('body[data-view="live"]');
  assert.equal(await page.evaluate(() => window.scrollY), 300, "Live is back where it was");
  await page.close();
});

test("after a restart the hour's high, low and chart come back from the store", async () => {
  // A call long enough for a settled rate (the ones above are too short).
  const res = await fetch(`${proxy}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", "x-sim-tokens": "60", "x-sim-tps": "80" },
    body: JSON.stringify({ model: "m-rate", stream: true, messages: [{ role: "user", content: "layout" }] }),
  });
  await res.text();
  const before = await waitFor("a settled rate", async () => {
    const s = await (await fetch(`${api}/api/v1/stats`)).json();
    return s.high ? s : null;
  });
  await stack.restartRun();
  const restarted = await (await fetch(`${api}/api/v1/stats`)).json();
  assert.deepEqual([restarted.high, restarted.low], [before.high, before.low], "the same hour after the restart");
  const page = await browser.newPage({ viewport: { width: 1280, height: 800 }, deviceScaleFactor: 1 });
  await page.goto(`${api}/#live`);
  await waitFor("the hour's high and low", () =>
    page.evaluate(() => !["", "–"].includes(document.getElementById("g-high").textContent) && !["", "–"].includes(document.getElementById("g-low").textContent)),
  );
  await waitFor("the hour chart", () => page.evaluate(() => document.getElementById("chart-empty").hidden));
  const stats = await (await fetch(`${api}/api/v1/stats`)).json();
  assert.ok(stats.high >= stats.low && stats.low > 0, JSON.stringify(stats));
  await page.close();
});
