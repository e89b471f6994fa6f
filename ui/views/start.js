// The first-run view: whether the passive capture measures every call with
// no client changes (or the one command that enables it), the proxy URLs to
// point clients at, the local servers discovery finds (with the exact
// setting per client), and a button that starts demo traffic so a new user
// sees speedtap work at once.

import { captureStatus } from "../lib/capture.js";
import { clientHints, isOllama, routeLooksLikeOllama, routesForClients } from "../lib/clients.js";
import { WAITING, describeServer } from "../lib/servers.js";
import { renderCaptureStatus } from "./capture.js";
import { copyable, h } from "./dom.js";

export function mountStart(source, { onDemoStarted, onAddRoute }, doc = document) {
  const el = (id) => doc.getElementById(id);
  const routesBox = el("routes");
  const serversBox = el("servers");
  const demo = el("demo-start");
  const demoStatus = el("demo-status");
  const rescan = el("rescan");
  const captureBox = el("capture-status");
  let boundUrls = new Set();
  /** Ports the capture measures now. */
  let capturedPorts = new Set();
  let scanning = null;

  /** The proxy URL and the exact setting per client, one aligned list. */
  function hints(proxyUrl, list) {
    return h(
      "dl",
      { class: "hints" },
      [{ label: "Proxy URL", value: proxyUrl }, ...list].map((hint) => [h("dt", {}, hint.label), h("dd", {}, copyable(hint.value))]),
    );
  }

  function message(box, text, cls = "muted") {
    box.replaceChildren(h("p", { class: cls }, text));
  }

  async function loadCapture() {
    try {
      const doc = await source.capture();
      capturedPorts = new Set(doc.state === "on" ? (doc.routes ?? []).map((r) => r.port) : []);
      renderCaptureStatus(captureBox, captureStatus(doc));
    } catch {
      // An older engine without capture: the proxy URLs say it all.
      renderCaptureStatus(captureBox, captureStatus(null));
    }
  }

  async function loadRoutes() {
    try {
      const { routes: all = [] } = await source.routes();
      boundUrls = new Set(all.map((r) => r.proxy_url));
      // The demo's route feeds its own simulator: never a URL for clients.
      const routes = routesForClients(all);
      if (routes.length === 0) {
        message(routesBox, "No routes are bound. Add one in Settings, or start demo traffic.");
        return;
      }
      routesBox.replaceChildren(
        ...routes.map((r) =>
          h(
            "div",
            { class: "item", "data-route": r.name },
            h(
              "div",
              { class: "item-head" },
              h("span", { class: "item-title" }, r.name),
              h("span", { class: "muted small" }, `forwards to ${r.upstream}`),
            ),
            hints(r.proxy_url, clientHints(r.proxy_url, { ollama: routeLooksLikeOllama(r) })),
          ),
        ),
      );
    } catch (err) {
      message(
        routesBox,
        err.unavailable
          ? "This engine version can't list its routes here; the start-up message of speedtap names them."
          : `Could not load routes: ${err.message}`,
        "notice",
      );
    }
  }

  /** The servers speedtap follows, live; false when it doesn't follow. */
  async function loadFollowed() {
    try {
      const doc = await source.servers();
      if (!doc?.watching) return false;
      renderFollowed(doc);
      return true;
    } catch {
      return false; // an older engine: discovery it is
    }
  }

  function renderFollowed(doc) {
    rescan.hidden = true;
    const servers = doc.servers ?? [];
    if (servers.length === 0) {
      message(serversBox, WAITING);
      return;
    }
    serversBox.replaceChildren(...servers.map(followedItem));
  }

  function followedItem(s) {
    const d = describeServer(s);
    const ignore =
      s.state === "ignored"
        ? null
        : h(
            "button",
            {
              type: "button",
              class: "small",
              title: "Never measure this server (kept across restarts)",
              onclick: async () => {
                try {
                  renderFollowed(await source.ignoreServer(s.name));
                } catch (err) {
                  message(serversBox, `Could not ignore ${s.name}: ${err.message}`, "notice");
                }
              },
            },
            "Ignore",
          );
    return h(
      "div",
      { class: "item", "data-server": s.upstream, "data-state": s.state },
      h(
        "div",
        { class: "item-head" },
        h("span", { class: "item-title" }, d.title),
        h("span", { class: "muted small" }, d.subtitle),
        h("span", { class: `chip ${d.chipClass}` }, d.chip),
        ignore,
      ),
      d.note ? h("p", { class: "small muted" }, d.note) : null,
      d.proxyUrl ? hints(d.proxyUrl, clientHints(d.proxyUrl, { ollama: isOllama(s.kind) })) : null,
    );
  }

  async function loadServers() {
    if (scanning) return scanning;
    if (await loadFollowed()) return;
    rescan.disabled = true;
    message(serversBox, "Looking for local model servers…");
    scanning = (async () => {
      try {
        const { servers = [] } = await source.discover();
        if (servers.length === 0) {
          message(
            serversBox,
            "No model server found on the usual ports (Ollama 11434, llama.cpp 8080, LM Studio 1234, vLLM 8000, KoboldCpp 5001, Jan 1337). Start one and scan again.",
          );
          return;
        }
        serversBox.replaceChildren(...servers.map(serverItem));
      } catch (err) {
        message(
          serversBox,
          err.unavailable ? "Server discovery isn't available in this engine version." : `Discovery failed: ${err.message}`,
          "notice",
        );
      } finally {
        rescan.disabled = false;
        scanning = null;
      }
    })();
    return scanning;
  }

  function serverItem(s) {
    const captured = capturedPorts.has(s.port);
    const routed = boundUrls.has(s.proxy_url);
    const ollama = isOllama(s.kind) || isOllama(s.label);
    if (captured) {
      return h(
        "div",
        { class: "item", "data-server": s.upstream },
        h(
          "div",
          { class: "item-head" },
          h("span", { class: "item-title" }, s.label || s.kind),
          s.detail ? h("span", { class: "muted small" }, s.detail) : null,
          h("span", { class: "muted small" }, `at ${s.upstream}`),
          h("span", { class: "chip chip-ok", title: "Calls to this port are captured: clients need no change" }, "captured"),
        ),
      );
    }
    return h(
      "div",
      { class: "item", "data-server": s.upstream },
      h(
        "div",
        { class: "item-head" },
        h("span", { class: "item-title" }, s.label || s.kind),
        s.detail ? h("span", { class: "muted small" }, s.detail) : null,
        h("span", { class: "muted small" }, `at ${s.upstream}`),
        routed
          ? h("span", { class: "chip chip-ok" }, "routed")
          : h(
              "button",
              {
                type: "button",
                class: "small",
                title: "Add the suggested route in Settings",
                onclick: () => onAddRoute(s.suggested_route),
              },
              `Add route "${s.suggested_route?.name ?? ""}"`,
            ),
      ),
      routed
        ? null
        : h("p", { class: "small muted" }, "Not routed yet: once the route is added and speedtap restarted, point clients at:"),
      hints(s.proxy_url, clientHints(s.proxy_url, { ollama })),
    );
  }

  demo.addEventListener("click", async () => {
    demo.disabled = true;
    demoStatus.textContent = "Starting…";
    try {
      const answer = await source.startDemo();
      demoStatus.textContent = `Demo traffic running on route "${answer.route?.name ?? "demo"}" for about a minute. Its calls are marked demo and kept out of History.`;
      loadRoutes();
      onDemoStarted(answer);
    } catch (err) {
      demoStatus.textContent = err.unavailable
        ? "Demo traffic isn't available in this engine version: run `speedtap simulate` and point a route at it."
        : `Could not start the demo: ${err.message}`;
    } finally {
      demo.disabled = false;
    }
  });
  rescan.addEventListener("click", () => loadServers());

  let loaded = false;
  return {
    /** A `servers` event: the followed list changed. */
    onServers(doc) {
      if (doc?.watching) renderFollowed(doc);
    },
    async load() {
      if (loaded) return;
      loaded = true;
      await loadCapture();
      await loadRoutes();
      await loadServers();
    },
  };
}
