// Copies the chart library from the installed npm package into ui/vendor/.
//
// Why vendor at all: the UI has no build step. The same folder is embedded in
// the `speedtap` binary and loaded by the tray window, so the files it loads
// must be in it, committed, byte for byte as npm shipped them. This script is
// the only way they get there; test/vendor.test.mjs fails when they drift
// from the installed package (after a version bump, run `npm run vendor`).
//
// Usage (from ui/): npm ci && npm run vendor

import { copyFileSync, mkdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const UI = join(dirname(fileURLToPath(import.meta.url)), "..");

/** [from (relative to ui/node_modules), to (relative to ui/vendor)]. */
export const VENDORED = [
  ["uplot/dist/uPlot.esm.js", "uPlot.esm.js"],
  ["uplot/dist/uPlot.min.css", "uPlot.min.css"],
  ["uplot/LICENSE", "uPlot.LICENSE"],
];

export function vendorPaths(ui = UI) {
  return VENDORED.map(([from, to]) => ({
    from: join(ui, "node_modules", from),
    to: join(ui, "vendor", to),
  }));
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  mkdirSync(join(UI, "vendor"), { recursive: true });
  for (const { from, to } of vendorPaths()) {
    copyFileSync(from, to);
    console.log(`vendored ${from} -> ${to}`);
  }
}
