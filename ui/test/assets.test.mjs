// Every file the page loads must be embedded by the `speedtap` binary
// (src/api/dashboard.rs lists them in ASSETS); a file that exists here but
// not there works in the Tauri window and 404s in the browser.

import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync, readdirSync, statSync } from "node:fs";
import { dirname, join, relative } from "node:path";
import { fileURLToPath } from "node:url";

const UI = join(dirname(fileURLToPath(import.meta.url)), "..");
const DASHBOARD_RS = join(UI, "..", "src", "api", "dashboard.rs");

/** Folders and files of ui/ that are for development, never served. */
const NOT_SERVED = new Set(["node_modules", "test", "e2e", "scripts", "package.json", "package-lock.json", ".gitignore", "README.md"]);

function servedFiles(dir = UI) {
  const out = [];
  for (const name of readdirSync(dir)) {
    if (dir === UI && NOT_SERVED.has(name)) continue;
    const path = join(dir, name);
    if (statSync(path).isDirectory()) out.push(...servedFiles(path));
    else if (!name.endsWith(".LICENSE")) out.push(relative(UI, path).split("\\").join("/"));
  }
  return out;
}

test("every served ui/ file is listed in src/api/dashboard.rs", () => {
  const rs = readFileSync(DASHBOARD_RS, "utf8");
  const listed = new Set([...rs.matchAll(/ui!\("([^"]+)"/g)].map((m) => m[1]));
  const files = servedFiles();
  assert.ok(files.includes("index.html") && files.includes("app.js"));
  const missing = files.filter((f) => !listed.has(f));
  assert.deepEqual(missing, [], "add these to ASSETS in src/api/dashboard.rs");
  const stale = [...listed].filter((f) => !files.includes(f));
  assert.deepEqual(stale, [], "listed in ASSETS but not in ui/");
});
