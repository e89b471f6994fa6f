// The vendored chart library must be exactly what the pinned npm package
// ships: ui/vendor/ is served as-is and must not drift from package.json.

import { test } from "node:test";
import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { vendorPaths } from "../scripts/vendor.mjs";

const UI = join(dirname(fileURLToPath(import.meta.url)), "..");
const readJson = (p) => JSON.parse(readFileSync(join(UI, p), "utf8"));

const installed = join(UI, "node_modules", "uplot", "package.json");

test("uplot is pinned to one exact version in package.json and the lockfile", () => {
  const pinned = readJson("package.json").devDependencies.uplot;
  assert.match(pinned, /^\d+\.\d+\.\d+$/, `pin an exact version, not ${pinned}`);
  assert.equal(readJson("package-lock.json").packages["node_modules/uplot"].version, pinned);
});

test("vendored uPlot files are byte-identical to the installed npm package", () => {
  assert.ok(existsSync(installed), "ui/node_modules is missing: run `npm ci` in ui/ first");
  assert.equal(JSON.parse(readFileSync(installed, "utf8")).version, readJson("package.json").devDependencies.uplot, "installed uplot is not the pinned one: run `npm ci`");
  for (const { from, to } of vendorPaths(UI)) {
    const a = readFileSync(from);
    const b = readFileSync(to);
    assert.ok(a.equals(b), `${to} differs from ${from}: run \`npm run vendor\``);
  }
});

test("the vendored module is the ES module build (the page imports its default export)", () => {
  const esm = readFileSync(join(UI, "vendor", "uPlot.esm.js"), "utf8");
  assert.match(esm, /export \{ uPlot as default \};\s*$/);
});
