// The History view: a time range and filters, the side-by-side model
// comparison (`models`), decode tok/s over time per model and the stored
// calls (`history`), and the Export link. The query building, the rows and
// the chart's data are lib/history.js's; this only wires and draws.

import {
  DEFAULT_RANGE,
  HISTORY_LIMIT,
  RANGES,
  buildFilter,
  comparisonRows,
  depthFilter,
  depthModel,
  depthModels,
  depthSeries,
  exportFilename,
  exportUrl,
  mergeOptions,
  optionLabel,
  pickerChoice,
  pickerValue,
} from "../lib/history.js";
import { formatTime } from "../lib/format.js";
import { callRow } from "../lib/present.js";
import { sortCalls } from "../lib/table.js";
import { mountDepthChart, mountHistoryChart } from "./historychart.js";
import { h, setText } from "./dom.js";
import { loadSort, mountSortHeaders, saveSort } from "./sort.js";

const RANGE_KEY = "speedtap.historyRange";
const FORMAT_KEY = "speedtap.exportFormat";
const SORT_KEY = "speedtap.historySort";
/** New calls settling while the view is open reload it, at most this often. */
const RELOAD_AFTER_SETTLED_MS = 3_000;

export function mountHistory(source, { onSelect }, doc = document) {
  const el = (id) => doc.getElementById(id);
  const rangeBox = el("h-range");
  const pickers = { model: el("h-model"), route: el("h-route"), client: el("h-client") };
  const format = el("h-format");
  const exportLink = el("h-export");
  const status = el("h-status");
  const unavailable = el("h-unavailable");
  const cards = [el("h-models-card"), el("h-chart-card"), el("h-calls-card")];
  const modelsBody = el("models");
  const modelsEmpty = el("models-empty");
  const callsBody = el("h-calls");
  const callsEmpty = el("h-calls-empty");
  const callsCount = el("h-calls-count");
  /** The stored calls last loaded, in the engine's order (newest first). */
  let loadedCalls = [];
  const sorting = mountSortHeaders(el("h-calls-table").tHead, {
    initial: loadSort(localStorage, SORT_KEY),
    onChange: (sort) => {
      saveSort(localStorage, SORT_KEY, sort);
      drawCalls(loadedCalls, Date.now());
    },
  });
  const chart = mountHistoryChart({ container: el("h-chart"), empty: el("h-chart-empty"), note: el("h-chart-note") });
  const depthCard = el("h-depth-card");
  const depthPicker = el("h-depth-model");
  const depth = mountDepthChart({ container: el("h-depth"), empty: el("h-depth-empty"), note: el("h-depth-note"), fit: el("h-depth-fit") });
  /** The model picked in the depth chart itself (when the filter names none). */
  let depthPicked = null;
  /** Counts depth loads, so a slow answer never overwrites a newer one. */
  let depthSeq = 0;
  /** The engine has no depth endpoint (an older engine): the card stays hidden. */
  let depthUnavailable = false;
  let lastFilter = {};
  let lastModels = [];

  const stored = localStorage.getItem(RANGE_KEY);
  const choice = {
    range: RANGES.some((r) => r.key === stored) ? stored : DEFAULT_RANGE,
    model: null,
    route: null,
    client: null,
  };
  format.value = localStorage.getItem(FORMAT_KEY) === "jsonl" ? "jsonl" : "csv";
  let options = { models: [], routes: [], clients: [] };
  /** The filter of the data on screen: the export downloads the same. */
  let shownFilter = buildFilter(choice, Date.now());
  /** id -> Call of the listed history, for the details panel. */
  let byId = new Map();
  let visible = false;
  let loading = null;
  let again = false;
  let reloadTimer = 0;

  // ---- controls --------------------------------------------------------------

  const rangeButtons = RANGES.map((r) =>
    h(
      "button",
      { type: "button", role: "radio", "data-range": r.key, onclick: () => setRange(r.key) },
      r.label,
    ),
  );
  rangeBox.replaceChildren(...rangeButtons);

  function markRange() {
    for (const b of rangeButtons) {
      const on = b.dataset.range === choice.range;
      b.setAttribute("aria-checked", String(on));
      b.classList.toggle("active", on);
    }
  }

  function setRange(key) {
    choice.range = key;
    localStorage.setItem(RANGE_KEY, key);
    markRange();
    load();
  }

  function fillPicker(kind, values) {
    const select = pickers[kind];
    const all = { model: "All models", route: "All routes", client: "All clients" }[kind];
    const wanted = pickerValue(choice[kind]);
    select.replaceChildren(
      h("option", { value: "" }, all),
      ...values.map((v) => h("option", { value: pickerValue(v) }, optionLabel(kind, v))),
    );
    select.value = wanted;
  }

  for (const [kind, select] of Object.entries(pickers)) {
    select.addEventListener("change", () => {
      choice[kind] = pickerChoice(select.value);
      // "" means any route (every call has one): no "named none" for routes.
      if (kind === "route" && choice.route === "") choice.route = null;
      load();
    });
  }
  el("h-refresh").addEventListener("click", () => load());
  depthPicker.addEventListener("change", () => {
    depthPicked = depthPicker.value || null;
    loadDepth(lastFilter, lastModels);
  });
  el("history-filters").addEventListener("submit", (e) => e.preventDefault());

  function updateExport() {
    exportLink.href = exportUrl(shownFilter, format.value);
    exportLink.setAttribute("download", exportFilename(format.value));
  }
  format.addEventListener("change", () => {
    localStorage.setItem(FORMAT_KEY, format.value);
    updateExport();
  });

  // The link downloads by itself, in a browser and in the window alike:
  // the engine answers with an attachment, so nothing is buffered here.

  // ---- drawing -----------------------------------------------------------------

  function drawModels(models, now) {
    const rows = comparisonRows(models, { now });
    modelsBody.replaceChildren(
      ...rows.map((r) => {
        const td = (col, text, cls, extra = {}) => h("td", { "data-col": col, class: cls, ...extra }, text);
        return h(
          "tr",
          { "data-model": r.modelRaw, "data-route": r.route },
          td("model", r.model, `model${r.modelRaw === "" ? " none" : ""}`, { title: r.model }),
          // The key numbers first (TTFT and decode medians), so they fit
          // at 800 px; the tails, the kept-apart waits and the rest after.
          td("calls", r.calls, "num", { title: r.callsTitle }),
          td("errors", r.errors, `num errors${r.errors.startsWith("0 /") ? "" : " some"}`, { title: r.errorsTitle }),
          r.allFailed
            ? td("ttft_p50", r.ttftP50, "num all-failed", { title: "Every call of this model failed: there are no figures" })
            : td("ttft_p50", r.ttftP50, `num${r.best.ttft ? " best" : ""}`, { title: r.best.ttft ? `Lowest median TTFT. ${r.ttftTitle}` : r.ttftTitle }),
          td("tps_p50", r.tpsP50, `num strong${r.best.tps ? " best" : ""}`, { title: r.best.tps ? "Fastest median decode rate" : undefined }),
          td("ttft_p90", r.ttftP90, "num", { title: r.ttftTitle }),
          td("tps_p10", r.tpsP10, "num"),
          td("cold", r.cold, "num"),
          td("queued", r.queued, "num"),
          td("prefill_p50", r.prefillP50, "num", { title: r.prefillTitle }),
          td("reasoning_p50", r.reasoningP50, "num", { title: r.reasoningTitle }),
          td("route", r.route),
          td("last_seen", r.lastSeen, "muted", { title: r.lastSeenRaw }),
        );
      }),
    );
    modelsEmpty.hidden = rows.length > 0;
  }

  function drawCalls(loaded, now) {
    loadedCalls = loaded;
    const calls = sortCalls(loaded, sorting.get());
    byId = new Map(calls.map((c) => [c.id, c]));
    callsBody.replaceChildren(
      ...calls.map((call) => {
        const v = callRow(call, { now });
        const td = (col, text, cls) => h("td", { "data-col": col, class: cls }, text);
        const src = v.source
          ? h("span", { class: "badge src", "data-source": v.source.kind, title: v.source.title }, v.source.text)
          : h("span", { class: "badge src", "data-source": "none" }, "–");
        return h(
          "tr",
          {
            dataset: { id: call.id, status: v.status.kind },
            class: v.unmetered ? "unmetered" : undefined,
            tabindex: "0",
            title: "Show this call's details",
          },
          td("started", v.started, "muted"),
          td("route", v.route),
          h("td", { "data-col": "model", class: "model", title: v.model }, v.model),
          td("client", v.client, "client"),
          h("td", { "data-col": "api", class: "api", title: v.apiRaw }, v.api),
          td("ttft", v.ttft, "num"),
          h(
            "td",
            { "data-col": "rate", class: "num strong" },
            v.rate,
            v.slowdown ? h("span", { class: "badge slowdown", title: v.slowdown.title }, v.slowdown.badge) : null,
          ),
          td("tokens", v.tokens, "num"),
          h("td", { "data-col": "source" }, src),
          h(
            "td",
            { "data-col": "status" },
            h("span", { class: "status", "data-status": v.status.kind, "data-outcome": v.outcome ?? "", title: v.failureTitle || undefined }, v.status.text),
            v.stallMark ? h("span", { class: "badge stall-mark", title: v.stallMark.title }, v.stallMark.text) : null,
            v.truncated ? h("span", { class: "badge cut", title: v.truncated.title }, "prompt cut") : null,
          ),
        );
      }),
    );
    callsEmpty.hidden = calls.length > 0;
    setText(
      callsCount,
      calls.length === 0
        ? ""
        : calls.length >= HISTORY_LIMIT
          ? `newest ${calls.length} calls (export for all)`
          : `${calls.length} ${calls.length === 1 ? "call" : "calls"}`,
    );
  }

  const pick = (e) => {
    const tr = e.target.closest("tr[data-id]");
    const call = tr && byId.get(tr.dataset.id);
    if (call) onSelect(call);
  };
  callsBody.addEventListener("click", pick);
  callsBody.addEventListener("keydown", (e) => {
    if (e.key === "Enter") pick(e);
  });

  // ---- decode speed against context depth ----------------------------------------

  /** Loads and draws the depth chart for the model the filter or the picker names. */
  async function loadDepth(filter, summary) {
    if (depthUnavailable) return;
    const models = depthModels(summary);
    const model = depthModel({ filterModel: filter.model, picked: depthPicked, models });
    const offered = model !== null && !models.includes(model) ? [model, ...models] : models;
    depthPicker.replaceChildren(...offered.map((m) => h("option", { value: m }, m)));
    depthPicker.disabled = typeof filter.model === "string" && filter.model !== "";
    depthPicker.title = depthPicker.disabled ? "The History filter picks the model" : "";
    if (model === null) {
      depthCard.hidden = true;
      return;
    }
    depthPicker.value = model;
    const query = depthFilter(filter, model);
    const seq = ++depthSeq;
    try {
      const doc = await source.historyDepth(query);
      if (seq !== depthSeq) return;
      depthCard.hidden = false;
      depth.resize();
      depth.render(depthSeries(doc));
    } catch (err) {
      if (seq !== depthSeq) return;
      if (err?.unavailable) {
        // An engine without the endpoint: no card rather than an error.
        depthUnavailable = true;
        depthCard.hidden = true;
        return;
      }
      depthCard.hidden = false;
      depth.clear();
      setText(el("h-depth-fit"), `Could not load the depth chart: ${err?.message ?? err}`);
    }
  }

  function showUnavailable(text) {
    unavailable.textContent = text;
    unavailable.hidden = false;
    for (const c of cards) c.hidden = true;
    depthCard.hidden = true;
    exportLink.classList.add("disabled");
    exportLink.setAttribute("aria-disabled", "true");
  }

  function showData() {
    unavailable.hidden = true;
    for (const c of cards) c.hidden = false;
    exportLink.classList.remove("disabled");
    exportLink.removeAttribute("aria-disabled");
  }

  // ---- loading -----------------------------------------------------------------

  async function loadOnce() {
    const now = Date.now();
    const filter = buildFilter(choice, now, { limit: HISTORY_LIMIT });
    setText(status, "Loading…");
    const [hist, models] = await Promise.allSettled([source.history(filter), source.models(filter)]);
    const failed = hist.status === "rejected" ? hist.reason : models.status === "rejected" ? models.reason : null;
    if (failed) {
      setText(status, "");
      // 503: the engine runs without a store; its message says so ("no
      // store: ..."), and is shown as is.
      showUnavailable(
        failed.unavailable
          ? "History isn't available in this engine version."
          : failed.status === 503 || /^no store/i.test(failed.message ?? "")
            ? failed.message
            : `Could not load the history: ${failed.message}`,
      );
      return;
    }
    showData();
    const calls = hist.value.calls ?? [];
    const summary = models.value.models ?? [];
    // The export is every call these filters select (the limit is only the
    // list's: exportUrl and the `export` command leave it out).
    shownFilter = filter;
    updateExport();
    options = mergeOptions(options, { models: summary, calls, selected: choice });
    for (const kind of Object.keys(pickers)) fillPicker(kind, options[`${kind}s`]);
    drawModels(summary, now);
    chart.render(calls, { range: choice.range, now });
    drawCalls(calls, now);
    lastFilter = filter;
    lastModels = summary;
    // Not awaited: the depth chart never holds up the rest of the view.
    loadDepth(filter, summary);
    setText(status, `Loaded at ${formatTime(new Date(now).toISOString(), { now })}.`);
  }

  /** Loads with the current choices; a load asked for meanwhile runs after. */
  function load() {
    if (loading) {
      again = true;
      return loading;
    }
    loading = (async () => {
      try {
        do {
          again = false;
          await loadOnce();
        } while (again);
      } finally {
        loading = null;
      }
    })();
    return loading;
  }

  markRange();
  updateExport();

  return {
    /** The view was shown (reloads) or hidden. */
    setVisible(on) {
      visible = on;
      if (on) {
        chart.resize();
        depth.resize();
        load();
      }
    },
    /** A call settled: reload soon if the view is open. */
    noteSettled() {
      if (!visible || reloadTimer) return;
      reloadTimer = setTimeout(() => {
        reloadTimer = 0;
        if (visible) load();
      }, RELOAD_AFTER_SETTLED_MS);
    },
    load,
  };
}
