// The live calls table. Rows are keyed by call id and updated in place, so
// a row that streams four snapshots a second doesn't flicker or lose its
// tooltip; order changes move the existing rows.

import { seenBy } from "../lib/capture.js";
import { callRow } from "../lib/present.js";
import { orderedCalls } from "../lib/reducer.js";
import { sparklinePoints } from "../lib/sparkline.js";
import { h, setText } from "./dom.js";

const SPARK_W = 88;
const SPARK_H = 22;
const SVG = "http://www.w3.org/2000/svg";

export function mountCalls({ tbody, empty, count, onSelect }) {
  /** id -> {tr, cells} */
  const rows = new Map();
  /** The call whose details are open, marked in the table. */
  let selected = null;

  function create(id) {
    const cell = (col, cls) => h("td", { class: cls, "data-col": col });
    const cells = {
      route: cell("route"),
      model: cell("model", "model"),
      client: cell("client", "client"),
      api: cell("api", "api"),
      phase: cell("phase"),
      ttft: cell("ttft", "num"),
      rate: cell("rate", "num strong"),
      spark: cell("spark", "spark-col"),
      tokens: cell("tokens", "num"),
      source: cell("source"),
      seen: cell("seen"),
      status: cell("status"),
    };
    const badge = h("span", { class: "badge phase" });
    const slow = h("span", { class: "badge slow", hidden: true }, "slow");
    const cut = h("span", { class: "badge cut", hidden: true }, "prompt cut");
    // Why a waiting call waits: a prefill's progress and the ETA under the badge.
    const waitFill = h("span", { class: "wait-fill" });
    const waitBar = h("span", { class: "wait-bar", hidden: true, role: "progressbar", "aria-valuemin": "0", "aria-valuemax": "100" }, waitFill);
    const waitEta = h("span", { class: "wait-eta", hidden: true });
    const waitLine = h("span", { class: "wait-line", hidden: true }, waitBar, waitEta);
    cells.phase.append(badge, slow, cut, waitLine);
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
    return { tr, cells, badge, slow, cut, waitLine, waitBar, waitFill, waitEta, area, line, src, seen, gap, status };
  }

  function update(row, call, state) {
    const v = callRow(call, { slow: state.slow[call.id] });
    const { tr, cells } = row;
    tr.dataset.status = v.status.kind;
    tr.classList.toggle("in-flight", v.inFlight);
    tr.classList.toggle("unmetered", v.unmetered);
    tr.classList.toggle("selected", call.id === selected);
    setText(cells.route, v.route);
    setText(cells.model, v.model);
    cells.model.title = v.model;
    setText(cells.client, v.client);
    setText(cells.api, v.api);
    cells.api.title = v.apiRaw;
    setText(row.badge, v.wait ? v.wait.badge : v.phase ? v.phase.text : "–");
    row.badge.dataset.phase = v.phase ? v.phase.kind : "none";
    row.badge.dataset.wait = v.wait ? v.wait.reason : "";
    row.badge.title = v.wait ? v.wait.title : "";
    drawWait(row, v.wait);
    row.cut.hidden = !v.truncated;
    row.cut.title = v.truncated?.title ?? "";
    row.slow.hidden = !v.slow;
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
      const shown = hideUnmetered
        ? all.filter((c) => c.status !== "unmetered" && c.api !== "unknown")
        : all;
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
      const inFlight = all.filter((c) => c.status === "in_flight").length;
      const hidden = all.length - shown.length;
      setText(
        count,
        all.length === 0
          ? ""
          : `${all.length} ${all.length === 1 ? "call" : "calls"}${inFlight ? ` · ${inFlight} in flight` : ""}${hidden ? ` · ${hidden} unmetered hidden` : ""}`,
      );
    },
  };
}
