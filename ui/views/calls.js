// The live calls table. Rows are keyed by call id and updated in place, so
// a row that streams four snapshots a second doesn't flicker or lose its
// tooltip; order changes move the existing rows. The key numbers lead
// (model, phase, TTFT, tok/s), the rest follow in narrow secondary columns
// (below 900 px the rows are cards, style.css). Its headers sort it and
// its model and route pickers filter it (lib/table.js); both are kept in
// the window's storage.

import { seenBy } from "../lib/capture.js";
import { callRow } from "../lib/present.js";
import { orderedCalls } from "../lib/reducer.js";
import { sparklinePoints } from "../lib/sparkline.js";
import { filterCalls, filterOptions, sortCalls } from "../lib/table.js";
import { h, setText } from "./dom.js";
import { loadSort, mountSortHeaders, saveSort } from "./sort.js";

const SPARK_W = 88;
const SPARK_H = 22;
const SVG = "http://www.w3.org/2000/svg";
const SORT_KEY = "speedtap.liveSort";
const FILTER_KEY = "speedtap.liveFilter";

export function mountCalls({ tbody, thead, empty, noneMatch, count, modelPick, routePick, onSelect, onChange, storage = localStorage }) {
  /** id -> {tr, cells} */
  const rows = new Map();
  /** The call whose details are open, marked in the table. */
  let selected = null;
  const sorting = mountSortHeaders(thead, {
    initial: loadSort(storage, SORT_KEY),
    onChange: (sort) => {
      saveSort(storage, SORT_KEY, sort);
      onChange?.();
    },
  });
  const filter = loadFilter();
  for (const [pick, kind] of [[modelPick, "model"], [routePick, "route"]]) {
    pick.addEventListener("change", () => {
      filter[kind] = pick.value;
      try {
        storage.setItem(FILTER_KEY, JSON.stringify(filter));
      } catch {
        // forgets, still filters
      }
      onChange?.();
    });
  }

  function loadFilter() {
    try {
      const saved = JSON.parse(storage.getItem(FILTER_KEY) ?? "{}") ?? {};
      return { model: String(saved.model ?? ""), route: String(saved.route ?? "") };
    } catch {
      return { model: "", route: "" };
    }
  }

  /** Refills a picker only when its choices changed (an open select keeps its place). */
  function fillPick(pick, values, chosen, all) {
    const want = ["", ...values];
    const have = [...pick.options].map((o) => o.value);
    if (have.length !== want.length || have.some((v, i) => v !== want[i])) {
      pick.replaceChildren(...want.map((v) => h("option", { value: v }, v || all)));
    }
    pick.value = chosen;
  }

  function create(id) {
    const cell = (col, cls) => h("td", { class: cls, "data-col": col });
    // In the headers' order: the key numbers first.
    const cells = {
      model: cell("model", "model"),
      phase: cell("phase", "phase-col"),
      ttft: cell("ttft", "num"),
      rate: cell("rate", "num strong"),
      spark: cell("spark", "spark-col"),
      tokens: cell("tokens", "num"),
      status: cell("status", "status-col"),
      route: cell("route", "secondary"),
      client: cell("client", "client secondary"),
      api: cell("api", "api secondary"),
      source: cell("source", "secondary"),
      seen: cell("seen", "secondary"),
    };
    const badge = h("span", { class: "badge phase" });
    const slow = h("span", { class: "badge slow", hidden: true }, "slow");
    const cut = h("span", { class: "badge cut", hidden: true }, "prompt cut");
    const stalled = h("span", { class: "badge stalled", hidden: true, title: "No output for longer than this call's stall threshold" });
    // Why a waiting call waits: a prefill's progress and the ETA under the badge.
    const waitFill = h("span", { class: "wait-fill" });
    const waitBar = h("span", { class: "wait-bar", hidden: true, role: "progressbar", "aria-valuemin": "0", "aria-valuemax": "100" }, waitFill);
    const waitEta = h("span", { class: "wait-eta", hidden: true });
    const waitLine = h("span", { class: "wait-line", hidden: true }, waitBar, waitEta);
    cells.phase.append(badge, slow, stalled, cut, waitLine);
    const svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("viewBox", `0 0 ${SPARK_W} ${SPARK_H}`);
    svg.setAttribute("width", SPARK_W);
    svg.setAttribute("height", SPARK_H);
    svg.setAttribute("class", "spark");
    svg.setAttribute("aria-hidden", "true");
    const area = document.createElementNS(SVG, "polygon");
    const line = document.createElementNS(SVG, "polyline");
    svg.append(area, line);
    cells.spark.append(svg);
    const src = h("span", { class: "badge src" });
    cells.source.append(src);
    const seen = h("span", { class: "badge seen" });
    const gap = h("span", { class: "badge gap", hidden: true }, "gap");
    cells.seen.append(seen, gap);
    const status = h("span", { class: "status" });
    cells.status.append(status);
    const tr = h("tr", { dataset: { id }, tabindex: "0", title: "Show this call's details" }, Object.values(cells));
    return { tr, cells, badge, slow, stalled, cut, waitLine, waitBar, waitFill, waitEta, area, line, src, seen, gap, status };
  }

  function update(row, call, state) {
    const v = callRow(call, { slow: state.slow[call.id] });
    const { tr, cells } = row;
    tr.dataset.status = v.status.kind;
    tr.classList.toggle("in-flight", v.inFlight);
    tr.classList.toggle("unmetered", v.unmetered);
    tr.classList.toggle("selected", call.id === selected);
    setText(cells.route, v.route);
    cells.route.title = v.route;
    cells.client.title = v.client;
    setText(cells.model, v.model);
    cells.model.title = v.model;
    setText(cells.client, v.client);
    setText(cells.api, v.api);
    cells.api.title = v.apiRaw;
    setText(row.badge, v.wait ? v.wait.badge : v.phase ? v.phase.text : "–");
    row.badge.dataset.phase = v.phase ? v.phase.kind : "none";
    row.badge.classList.toggle("phase-failed", v.outcome === "failed");
    row.badge.classList.toggle("phase-client-left", v.outcome === "client_left");
    row.badge.dataset.wait = v.wait ? v.wait.reason : "";
    row.badge.title = v.wait ? v.wait.title : v.failureTitle;
    drawWait(row, v.wait);
    row.cut.hidden = !v.truncated;
    row.cut.title = v.truncated?.title ?? "";
    row.slow.hidden = !v.slow;
    row.stalled.hidden = !v.stalled;
    setText(row.stalled, v.stalled ?? "");
    row.slow.title = v.slow ?? "";
    setText(cells.ttft, v.ttft);
    setText(cells.rate, v.rate);
    setText(cells.tokens, v.tokens);
    const points = sparklinePoints(state.series[call.id] ?? [], SPARK_W, SPARK_H, 2);
    if (row.line.getAttribute("points") !== points) {
      row.line.setAttribute("points", points);
      // The area under the line: the same points closed along the bottom.
      row.area.setAttribute("points", points ? `${points} ${SPARK_W - 2},${SPARK_H - 2} 2,${SPARK_H - 2}` : "");
    }
    row.line.classList.toggle("live", v.inFlight);
    row.area.classList.toggle("live", v.inFlight);
    if (v.source) {
      setText(row.src, v.source.text);
      row.src.title = v.source.title;
      row.src.dataset.source = v.source.kind;
      row.src.hidden = false;
    } else {
      setText(row.src, "–");
      row.src.title = "No token source: this call was not metered.";
      row.src.dataset.source = "none";
    }
    const how = seenBy(call);
    setText(row.seen, how.text);
    row.seen.title = how.title;
    row.seen.dataset.seen = how.kind;
    row.gap.hidden = !how.gap;
    row.gap.title = how.gap ? how.gapTitle : "";
    setText(row.status, v.status.text);
    row.status.dataset.status = v.status.kind;
    row.status.dataset.outcome = v.outcome ?? "";
    row.status.title = v.failureTitle;
  }

  function drawWait(row, wait) {
    const progress = wait?.progress ?? null;
    row.waitBar.hidden = progress === null;
    if (progress !== null) {
      const pct = `${(progress * 100).toFixed(1)}%`;
      if (row.waitFill.style.width !== pct) row.waitFill.style.width = pct;
      row.waitBar.setAttribute("aria-valuenow", String(Math.floor(progress * 100 + 1e-9)));
    }
    row.waitEta.hidden = !wait?.eta;
    setText(row.waitEta, wait?.eta ?? "");
    row.waitLine.hidden = row.waitBar.hidden && row.waitEta.hidden;
  }

  // One listener for every row: a click (or Enter) opens its details.
  const pick = (e) => {
    const tr = e.target.closest("tr[data-id]");
    if (tr && tbody.contains(tr)) onSelect?.(tr.dataset.id);
  };
  tbody.addEventListener("click", pick);
  tbody.addEventListener("keydown", (e) => {
    if (e.key === "Enter") pick(e);
  });

  return {
    /** Marks the row whose details are open. */
    select(id) {
      selected = id;
      for (const [rid, row] of rows) row.tr.classList.toggle("selected", rid === id);
    },
    render(state, { hideUnmetered = false } = {}) {
      const all = orderedCalls(state);
      const options = filterOptions(all, filter);
      fillPick(modelPick, options.models, filter.model, "All models");
      fillPick(routePick, options.routes, filter.route, "All routes");
      const metered = hideUnmetered ? all.filter((c) => c.status !== "unmetered" && c.api !== "unknown") : all;
      const shown = sortCalls(filterCalls(metered, filter), sorting.get());
      const keep = new Set();
      let before = tbody.firstChild;
      for (const call of shown) {
        keep.add(call.id);
        let row = rows.get(call.id);
        if (!row) {
          row = create(call.id);
          rows.set(call.id, row);
        }
        update(row, call, state);
        if (row.tr !== before) tbody.insertBefore(row.tr, before);
        else before = before.nextSibling;
      }
      for (const [id, row] of rows) {
        if (!keep.has(id)) {
          row.tr.remove();
          rows.delete(id);
        }
      }
      empty.hidden = all.length > 0;
      noneMatch.hidden = all.length === 0 || shown.length > 0;
      const inFlight = all.filter((c) => c.status === "in_flight").length;
      const hidden = all.length - metered.length;
      const filtered = metered.length - shown.length;
      setText(
        count,
        all.length === 0
          ? ""
          : `${all.length} ${all.length === 1 ? "call" : "calls"}${inFlight ? ` · ${inFlight} in flight` : ""}${hidden ? ` · ${hidden} unmetered hidden` : ""}${filtered ? ` · ${filtered} filtered out` : ""}`,
      );
    },
  };
}
