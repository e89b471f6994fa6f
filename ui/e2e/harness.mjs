// What the browser suites share: where the speedtap binary and Chromium
// are, free ports, polling against a deadline, and the stack they drive
// (`speedtap simulate` behind `speedtap run` in a scratch home), so each
// suite starts it and stops it the same way.
//
// Env: SPEEDTAP_BIN (default ../target/debug/speedtap), CHROMIUM (default
// /usr/bin/chromium).

import { spawn } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import net from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

export const UI = resolve(dirname(fileURLToPath(import.meta.url)), "..");
export const BIN = process.env.SPEEDTAP_BIN ? resolve(process.env.SPEEDTAP_BIN) : resolve(UI, "../target/debug/speedtap");
export const CHROMIUM = process.env.CHROMIUM ?? "/usr/bin/chromium";
/** Deadline for anything the page or the engine should do "soon". */
export const SOON = 15_000;

export const CHROMIUM_ARGS = [
  "--headless",
  "--no-sandbox",
  "--disable-gpu",
  "--disable-quic",
  "--no-first-run",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
];

/** A loopback port nobody listens on now. */
export function freePort() {
  return new Promise((ok, fail) => {
    const srv = net.createServer();
    srv.unref();
    srv.on("error", fail);
    srv.listen(0, "127.0.0.1", () => {
      const { port } = srv.address();
      srv.close(() => ok(port));
    });
  });
}

/** Whether something accepts connections on the loopback `port`. */
export function tcpOpen(port) {
  return new Promise((ok) => {
    const s = net.connect(port, "127.0.0.1");
    s.once("connect", () => {
      s.destroy();
      ok(true);
    });
    s.once("error", () => ok(false));
  });
}

/** Polls `check` until it returns a truthy value; fails at the deadline with `what` and the last value. */
export async function waitFor(what, check, timeout = SOON) {
  const deadline = Date.now() + timeout;
  let last;
  for (;;) {
    try {
      last = await check();
      if (last) return last;
    } catch (e) {
      last = e;
    }
    if (Date.now() > deadline) {
      throw new Error(`timed out after ${timeout} ms waiting for ${what}; last: ${last instanceof Error ? last.message : JSON.stringify(last)}`);
    }
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** Headless Chromium for pages of their own (`browser.newPage`). */
export function launchChromium() {
  return chromium.launch({ executablePath: CHROMIUM, headless: true, args: CHROMIUM_ARGS });
}

/**
 * Starts `speedtap simulate SIM...` and `speedtap run` with route `sim` to
 * it, the store in a scratch home and `RUN...` added, and waits until the
 * simulator listens, the control API answers and the proxy accepts.
 * Returns `{home, ports: {sim, proxy, api}, api, proxy, diagnostics(),
 * restartRun(), stop()}`; `api` and `proxy` are base URLs, `diagnostics()`
 * the last output of each process, `restartRun()` stops `speedtap run` and
 * starts it again on the same store and ports, `stop()` ends both and
 * removes the home.
 */
export async function startStack({ name = "speedtap", sim = [], run = [] } = {}) {
  const home = mkdtempSync(join(tmpdir(), `${name}-`));
  mkdirSync(join(home, "config"));
  mkdirSync(join(home, "data"));
  const [simPort, proxyPort, apiPort] = await Promise.all([freePort(), freePort(), freePort()]);
  const procs = [];
  const start = (what, args) => {
    const child = spawn(BIN, args, {
      env: { ...process.env, HOME: home, XDG_CONFIG_HOME: join(home, "config"), XDG_DATA_HOME: join(home, "data"), RUST_LOG: "warn" },
      stdio: ["ignore", "pipe", "pipe"],
    });
    const proc = { name: what, child, log: [], exited: null };
    const keep = (chunk) => {
      proc.log.push(chunk.toString());
      if (proc.log.length > 200) proc.log.shift();
    };
    child.stdout.on("data", keep);
    child.stderr.on("data", keep);
    child.on("exit", (code, signal) => {
      proc.exited = { code, signal };
    });
    procs.push(proc);
    return proc;
  };
  const diagnostics = () =>
    procs.map((p) => `--- ${p.name} (${p.exited ? `exited ${JSON.stringify(p.exited)}` : "running"}):\n${p.log.join("").slice(-2000)}`).join("\n");
  const stop = async () => {
    await Promise.all(
      procs.map(
        (p) =>
          new Promise((ok) => {
            if (p.exited) return ok();
            p.child.once("exit", ok);
            p.child.kill("SIGTERM");
          }),
      ),
    );
    rmSync(home, { recursive: true, force: true });
  };
  const api = `http://127.0.0.1:${apiPort}`;
  let engine = null;
  const startRun = async () => {
    engine = start("run", [
      "run", "--db", join(home, "speedtap.db"),
      "--route", `sim=127.0.0.1:${proxyPort}=http://127.0.0.1:${simPort}`,
      "--api", `127.0.0.1:${apiPort}`,
      ...run,
    ]);
    const started = engine;
    await waitFor("the control API to answer", async () => {
      if (started.exited) throw new Error(`speedtap run exited\n${diagnostics()}`);
      return (await fetch(`${api}/api/v1/stats`)).ok && tcpOpen(proxyPort);
    });
  };
  const restartRun = async () => {
    const old = engine;
    await new Promise((ok) => {
      if (old.exited) return ok();
      old.child.once("exit", ok);
      old.child.kill("SIGTERM");
    });
    await startRun();
  };
  try {
    const simulator = start("simulate", ["simulate", "--listen", `127.0.0.1:${simPort}`, ...sim]);
    await waitFor("the simulator to listen", async () => {
      if (simulator.exited) throw new Error(`simulate exited\n${diagnostics()}`);
      return tcpOpen(simPort);
    });
    await startRun();
  } catch (e) {
    await stop();
    throw e;
  }
  return { home, ports: { sim: simPort, proxy: proxyPort, api: apiPort }, api, proxy: `http://127.0.0.1:${proxyPort}`, diagnostics, restartRun, stop };
}
