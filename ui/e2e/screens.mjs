// Screenshots of the window's views at the sizes people use it (800×600 and
// 1280×800), against the real binary with demo traffic: what a user sees at
// a glance, not the whole page. Not a test: run by hand for the docs,
//
//   node e2e/screens.mjs OUTDIR [SUFFIX]
//
// which writes OUTDIR/{live,history,start}-WxH[-SUFFIX].png. Env:
// SPEEDTAP_BIN (default ../target/debug/speedtap), CHROMIUM (default
// /usr/bin/chromium).

import { spawn } from "node:child_process";
import { mkdirSync, mkdtempSync } from "node:fs";
import net from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

const UI = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const BIN = process.env.SPEEDTAP_BIN ? resolve(process.env.SPEEDTAP_BIN) : resolve(UI, "../target/debug/speedtap");
const CHROMIUM = process.env.CHROMIUM ?? "/usr/bin/chromium";
const [outDir = join(UI, "e2e", "out"), suffix = ""] = process.argv.slice(2);
const SIZES = [
  { width: 800, height: 600 },
  { width: 1280, height: 800 },
];

function freePort() {
  return new Promise((ok, fail) => {
    const srv = net.createServer();
    srv.on("error", fail);
    srv.listen(0, "127.0.0.1", () => {
      const { port } = srv.address();
      srv.close(() => ok(port));
    });
  });
}

async function until(what, check, timeout = 40_000) {
  const deadline = Date.now() + timeout;
  while (!(await check().catch(() => false))) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

const home = mkdtempSync(join(tmpdir(), "speedtap-screens-"));
mkdirSync(outDir, { recursive: true });
const [sim, proxy, apiPort] = await Promise.all([freePort(), freePort(), freePort()]);
const env = { ...process.env, HOME: home, XDG_CONFIG_HOME: join(home, "c"), XDG_DATA_HOME: join(home, "d"), RUST_LOG: "warn" };
const children = [
  spawn(BIN, ["simulate", "--listen", `127.0.0.1:${sim}`, "--tps", "40", "--tokens", "60"], { env, stdio: "ignore" }),
  spawn(BIN, ["run", "--db", join(home, "s.db"), "--route", `sim=127.0.0.1:${proxy}=http://127.0.0.1:${sim}`, "--api", `127.0.0.1:${apiPort}`], { env, stdio: "ignore" }),
];
const api = `http://127.0.0.1:${apiPort}`;
try {
  await until("the control API", async () => (await fetch(`${api}/api/v1/stats`)).ok);
  // A few stored calls through the proxy, for History.
  for (const model of ["llama3.2:3b", "qwen2.5-coder:7b", "llama3.2:3b"]) {
    const res = await fetch(`http://127.0.0.1:${proxy}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", "user-agent": "OpenAI/Python 1.0" },
      body: JSON.stringify({ model, stream: true, messages: [{ role: "user", content: "hi" }] }),
    });
    await res.text();
  }
  await fetch(`${api}/api/v1/demo`, { method: "POST", headers: { "content-type": "application/json" }, body: "{}" });
  const browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: ["--no-sandbox", "--disable-gpu"] });
  for (const size of SIZES) {
    const page = await browser.newPage({ viewport: size, deviceScaleFactor: 1 });
    await page.goto(`${api}/#live`);
    await until("several calls, one streaming", () =>
      page.evaluate(() => document.querySelectorAll("#calls tr").length >= 5 && !!document.querySelector("#calls tr.in-flight")),
    );
    const name = (view) => join(outDir, `${view}-${size.width}x${size.height}${suffix ? `-${suffix}` : ""}.png`);
    await page.screenshot({ path: name("live") });
    for (const view of ["history", "start"]) {
      await page.click(`#tab-${view}`);
      await page.waitForTimeout(1200);
      await page.screenshot({ path: name(view) });
    }
    await page.close();
  }
  await browser.close();
} finally {
  for (const child of children) child.kill("SIGTERM");
}
