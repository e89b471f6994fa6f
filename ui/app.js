// The dashboard's entry point: picks the data source (Tauri events and
// commands in the tray window; same-origin HTTP and `/api/v1/events` in a
// browser, see lib/datasource.js), keeps the one state
// (lib/reducer.js), and hands it to the views. Views only render; the rules
// (formatting, ordering, what is hidden) live in lib/ and are unit-tested.

import { emptyCallsText } from "./lib/capture.js";
import { createDataSource } from "./lib/datasource.js";
import { initialState, reduce } from "./lib/reducer.js";
import { VIEWS, createScrollMemory, initialView } from "./lib/views.js";
import { mountCalls } from "./views/calls.js";
import { mountChart } from "./views/chart.js";
import { mountDetails } from "./views/details.js";
import { mountGlobal } from "./views/global.js";
import { mountHistory } from "./views/history.js";
import { mountSettings } from "./views/settings.js";
import { mountStart } from "./views/start.js";

const LIST_LIMIT = 200;
const HIDE_UNMETERED_KEY = "speedtap.hideUnmetered";

const $ = (id) => document.getElementById(id);
const source = createDataSource(window);
document.documentElement.dataset.source = source.kind;

let state = initialState({ maxRows: LIST_LIMIT });
let frame = 0;
/** The view was chosen by the app (no calls yet), not by the user. */
let autoStart = false;

// The details panel, on a live row (kept up to date while it streams) or
// a stored one (History).
let detailsLive = false;
const details = mountDetails({ onClose: () => calls.select(null) });
const calls = mountCalls({
  tbody: $("calls"),
  thead: $("calls-table").tHead,
  empty: $("calls-empty"),
  noneMatch: $("calls-none-match"),
  count: $("calls-count"),
  modelPick: $("live-model"),
  routePick: $("live-route"),
  onChange: () => {
    if (!frame) frame = requestAnimationFrame(render);
  },
  onSelect: (id) => {
    const call = state.calls[id];
    if (!call) return;
    detailsLive = true;
    details.open(call);
    calls.select(id);
  },
});
const historyView = mountHistory(source, {
  onSelect: (call) => {
    detailsLive = false;
    calls.select(null);
    details.open(call);
  },
});
const global = mountGlobal();
const chart = mountChart({ container: $("chart"), empty: $("chart-empty"), note: $("chart-note") });
const settings = mountSettings(source);
const start = mountStart(source, {
  onDemoStarted: () => show("live"),
  onAddRoute: async (route) => {
    show("settings");
    await settings.addRoute(route);
  },
});

// Ports the tray app could not have at start: named, with who holds them
// and the next free port offered (only the tray app reports any).
async function showPortConflicts() {
  const box = $("port-conflicts");
  if (!source.portConflicts) return;
  let list = [];
  try {
    list = (await source.portConflicts()).conflicts ?? [];
  } catch {
    return;
  }
  box.hidden = list.length === 0;
  box.replaceChildren(
    ...list.map((c) => {
      const line = document.createElement("p");
      line.dataset.port = String(c.port);
      const who = c.holder ? ` It is held by ${c.holder.name} (pid ${c.holder.pid}: ${c.holder.command}).` : "";
      line.textContent = `Port ${c.port} is taken: ${c.what} did not start on ${c.listen} (${c.error}).${who}`;
      if (c.route && c.next_free) {
        const use = document.createElement("button");
        use.type = "button";
        use.className = "small";
        use.textContent = `Use ${c.next_free} for ${c.route}`;
        use.addEventListener("click", async () => {
          use.disabled = true;
          try {
            const listen = await source.useFreePort(c.route);
            line.textContent = `Route ${c.route} now listens on ${listen} (until a restart: save it in Settings to keep it).`;
          } catch (err) {
            use.disabled = false;
            line.append(` Not started: ${err.message}`);
          }
        });
        line.append(" ", use);
      }
      return line;
    }),
  );
}
showPortConflicts();

const hideUnmetered = $("hide-unmetered");
hideUnmetered.checked = localStorage.getItem(HIDE_UNMETERED_KEY) === "1";
hideUnmetered.addEventListener("change", () => {
  localStorage.setItem(HIDE_UNMETERED_KEY, hideUnmetered.checked ? "1" : "0");
  render();
});

function dispatch(event) {
  const next = reduce(state, event, Date.now());
  if (next === state) return;
  state = next;
  // The first call to show up leaves the first-run view the app picked by
  // itself (never one the user picked).
  if (autoStart && Object.keys(state.calls).length > 0) {
    autoStart = false;
    show("live");
  }
  if (!frame) frame = requestAnimationFrame(render);
}

let chartDrawn = { history: null, at: 0 };

function render() {
  frame = 0;
  calls.render(state, { hideUnmetered: hideUnmetered.checked });
  global.render(state.stats, state.loaded ? Object.values(state.calls) : undefined);
  const open = details.openId;
  if (detailsLive && open && state.calls[open]) details.update(state.calls[open]);
  // Speed events arrive several times a second per call; the chart changes
  // only with a new reading (about 1 Hz) or when its time axis should slide.
  const now = Date.now();
  if (state.history !== chartDrawn.history || now - chartDrawn.at >= 1000) {
    chart.render(state.history, now);
    chartDrawn = { history: state.history, at: now };
  }
}

// ---- views ---------------------------------------------------------------

/** Each view's own scroll position: a view never opens where another was left. */
const scrolls = createScrollMemory();
let shown = null;

function show(view, { auto = false } = {}) {
  if (!VIEWS.includes(view)) view = "live";
  autoStart = auto;
  const switching = shown !== view;
  if (switching && shown) {
    scrolls.leave(shown, window.scrollY);
    // The drawer belongs to the view it was opened from.
    details.close();
  }
  for (const section of document.querySelectorAll("main > .view")) {
    section.hidden = section.dataset.view !== view;
  }
  for (const tab of document.querySelectorAll(".tabs [data-view]")) {
    const on = tab.dataset.view === view;
    tab.setAttribute("aria-selected", String(on));
    tab.classList.toggle("active", on);
  }
  document.body.dataset.view = view;
  if (location.hash !== `#${view}`) history.replaceState(null, "", `#${view}`);
  historyView.setVisible(view === "history");
  if (view === "start") start.load();
  if (view === "settings") settings.load();
  if (view === "live") render();
  if (switching) window.scrollTo(0, scrolls.enter(view));
  shown = view;
}

window.addEventListener("hashchange", () => show(location.hash.slice(1)));

// ---- data ----------------------------------------------------------------

const conn = $("conn");
function setConn(kind, text) {
  conn.dataset.state = kind;
  conn.textContent = text;
}

let historyLoaded = false;
let reloading = null;

/**
 * Loads the list, the stats and (once) the hour's history. Runs after the
 * event subscription is open, so nothing that happens in between is lost,
 * and again after a reconnect, to pick up calls settled meanwhile.
 */
function reload() {
  reloading ??= (async () => {
    const [list, stats, hist] = await Promise.allSettled([
      source.calls({ limit: LIST_LIMIT }),
      source.stats(),
      historyLoaded ? Promise.resolve(null) : source.statsHistory(),
    ]);
    if (list.status === "fulfilled") dispatch({ type: "calls", calls: list.value.calls ?? [] });
    else setConn("error", `could not load calls: ${list.reason?.message ?? list.reason}`);
    if (stats.status === "fulfilled") dispatch({ type: "stats", stats: stats.value });
    if (hist.status === "fulfilled" && hist.value) {
      historyLoaded = true;
      dispatch({ type: "history", points: hist.value.points ?? [] });
      chart.setNote("");
    } else if (hist.status === "rejected") {
      chart.setNote(
        hist.reason?.unavailable
          ? "History not available from this engine: plotting readings since this page opened."
          : `History failed to load (${hist.reason?.message}): plotting readings since this page opened.`,
      );
    }
    return list.status === "fulfilled" ? list.value.calls ?? [] : null;
  })().finally(() => {
    reloading = null;
  });
  return reloading;
}

// What the empty calls table says: with the capture on, the servers it
// measures (calls to them show up with no client change).
let captureDoc = null;
let serversDoc = null;
function showEmptyText() {
  const empty = emptyCallsText(captureDoc, serversDoc);
  $("calls-empty-text").textContent = empty.text;
  $("calls-empty-link").textContent = empty.link;
}
async function loadCaptureDoc() {
  try {
    captureDoc = await source.capture?.();
  } catch {
    captureDoc = null; // an older engine: no capture to name
  }
  showEmptyText();
}
loadCaptureDoc();

let opened = false;
let everOpened = false;
const firstLoad = new Promise((resolve) => {
  source.subscribe({
    speed: (p) => dispatch({ type: "speed", call: p.call, speed: p.speed, seen_by: p.seen_by }),
    settled: (call) => {
      dispatch({ type: "settled", call });
      historyView.noteSettled();
    },
    stats: (stats) => dispatch({ type: "stats", stats }),
    slow_first_token: (p) => dispatch({ type: "slow_first_token", ...p }),
    prompt_truncated: (p) => dispatch({ type: "prompt_truncated", ...p }),
    servers: (doc) => {
      serversDoc = doc;
      showEmptyText();
      start.onServers(doc);
      settings.onServers(doc);
    },
    open: () => {
      opened = true;
      everOpened = true;
      setConn("live", "live");
      reload().then(resolve);
    },
    error: () => {
      if (opened || !everOpened) setConn("down", "disconnected, retrying…");
      opened = false;
      // Show what can be loaded even if the event stream never opens.
      if (!everOpened) reload().then(resolve);
    },
  });
});

// Initial view: the one in the URL, else Live once there is anything to
// show (calls in the live list, or stored ones from an earlier run), else
// Get started.
const named = VIEWS.includes(location.hash.slice(1));
show(initialView(location.hash));
if (!named) {
  firstLoad.then(async (list) => {
    if (!Array.isArray(list) || list.length > 0 || Object.keys(state.calls).length > 0) return;
    let stored = false;
    try {
      stored = ((await source.history({ limit: 1 })).calls ?? []).length > 0;
    } catch {
      stored = false; // no store: nothing from earlier runs to show
    }
    const view = initialView("", { hasCalls: stored || Object.keys(state.calls).length > 0 });
    if (view === "start" && shown === "live") show("start", { auto: true });
  });
}
