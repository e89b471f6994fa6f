// Screenshots of the window's views at the sizes people use it (800×600 and
// 1280×800), against the real binary with demo traffic: what a user sees at
// a glance, not the whole page. Not a test: run by hand for the docs,
//
//   node e2e/screens.mjs OUTDIR [SUFFIX]
//
// which writes OUTDIR/{live,history,start}-WxH[-SUFFIX].png. Env:
// SPEEDTAP_BIN (default ../target/debug/speedtap), CHROMIUM (default
// /usr/bin/chromium).

import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { launchChromium, startStack, UI, waitFor } from "./harness.mjs";

const [outDir = join(UI, "e2e", "out"), suffix = ""] = process.argv.slice(2);
const SIZES = [
  { width: 800, height: 600 },
  { width: 1280, height: 800 },
];
const until = (what, check) => waitFor(what, check, 40_000);

mkdirSync(outDir, { recursive: true });
const stack = await startStack({ name: "speedtap-screens", sim: ["--tps", "40", "--tokens", "60"] });
const api = stack.api;
try {
  // A few stored calls through the proxy, for History.
  for (const model of ["llama3.2:3b", "qwen2.5-coder:7b", "llama3.2:3b"]) {
    const res = await fetch(`${stack.proxy}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", "user-agent": "OpenAI/Python 1.0" },
      body: JSON.stringify({ model, stream: true, messages: [{ role: "user", content: "hi" }] }),
    });
    await res.text();
  }
  await fetch(`${api}/api/v1/demo`, { method: "POST", headers: { "content-type": "application/json" }, body: "{}" });
  const browser = await launchChromium();
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
  await stack.stop();
}
