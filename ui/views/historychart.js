// Decode tok/s over time, one uPlot series per model (History view). Each
// settled call is a point; a model's points are joined by a thin line. A
// server's version change is a dashed vertical line with the new version,
// listed under the chart too.

import uPlot from "../vendor/uPlot.esm.js";
import { formatRate } from "../lib/format.js";
import { rateRange, rateSeries, versionMarks } from "../lib/history.js";
import { h } from "./dom.js";

const HEIGHT = 220;
/** Series colours, light and dark: distinct hues, readable on the card. */
const PALETTE = {
  light: ["#2563eb", "#16a34a", "#d97706", "#7c3aed", "#db2777", "#0891b2", "#65a30d", "#dc2626", "#4b5563"],
  dark: ["#58a6ff", "#3fb950", "#e3b341", "#bc8cff", "#f778ba", "#39c5cf", "#a5d6a7", "#ff7b72", "#9ca3af"],
};
const TIME = new Intl.DateTimeFormat("en-US", { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", second: "2-digit", hourCycle: "h23" });

function cssVar(name, fallback) {
  const v = getComputedStyle(document.documentElement).getPropertyValue(name).trim();
  return v || fallback;
}

const dark = () => matchMedia("(prefers-color-scheme: dark)").matches;

export function mountHistoryChart({ container, empty, note }) {
  let plot = null;
  let labels = null;
  let last = { calls: [], range: "day", now: Date.now() };
  /** The version changes drawn (see versionMarks). */
  let marks = [];
  const legend = h("ul", { class: "series-legend", "aria-label": "Models" });
  const changes = h("ul", { class: "version-marks small muted", "aria-label": "Server version changes" });
  container.after(legend, changes);

  /** Each version change as a dashed line across the plot, its new version at the top. */
  function drawMarks(u) {
    if (marks.length === 0) return;
    const ratio = window.devicePixelRatio || 1;
    const { ctx, bbox } = u;
    ctx.save();
    ctx.strokeStyle = cssVar("--muted", "#6b7280");
    ctx.fillStyle = ctx.strokeStyle;
    ctx.lineWidth = ratio;
    ctx.setLineDash([4 * ratio, 3 * ratio]);
    ctx.font = `${10 * ratio}px system-ui, sans-serif`;
    for (const m of marks) {
      const x = Math.round(u.valToPos(m.x, "x", true));
      if (x < bbox.left || x > bbox.left + bbox.width) continue;
      ctx.beginPath();
      ctx.moveTo(x, bbox.top);
      ctx.lineTo(x, bbox.top + bbox.height);
      ctx.stroke();
      ctx.fillText(m.to, x + 3 * ratio, bbox.top + 10 * ratio);
    }
    ctx.restore();
  }

  function color(i) {
    const p = dark() ? PALETTE.dark : PALETTE.light;
    return p[i % p.length];
  }

  function options(width, names) {
    const text = cssVar("--muted", "#6b7280");
    const grid = cssVar("--grid", "rgba(0,0,0,.06)");
    const axis = { stroke: text, grid: { stroke: grid, width: 1 }, ticks: { stroke: grid, width: 1 }, font: "11px system-ui, sans-serif" };
    return {
      width,
      height: HEIGHT,
      legend: { show: false },
      cursor: { y: false, points: { size: 8 } },
      scales: { x: { time: true }, y: { range: (u, min, max) => [0, Math.max(10, Math.ceil((max ?? 0) * 1.15))] } },
      axes: [{ ...axis, space: 80 }, { ...axis, size: 44, values: (u, splits) => splits.map((v) => v.toFixed(0)) }],
      series: [
        {},
        ...names.map((name, i) => ({
          label: name,
          stroke: color(i),
          width: 1.5,
          // Every other model's points are nulls here: join this model's.
          spanGaps: true,
          points: { show: true, size: 6, fill: color(i) },
        })),
      ],
      hooks: {
        draw: [drawMarks],
        setCursor: [
          (u) => {
            const i = u.cursor.idx;
            if (i === null || i === undefined) {
              note.textContent = "";
              return;
            }
            const s = u.data.slice(1).findIndex((ys) => ys[i] !== null && ys[i] !== undefined);
            note.textContent =
              s < 0 ? "" : `${names[s]}: ${formatRate(u.data[s + 1][i])} tok/s at ${TIME.format(new Date(u.data[0][i] * 1000))}`;
          },
        ],
      },
    };
  }

  function build(series) {
    plot?.destroy();
    labels = series.labels;
    plot = new uPlot(options(Math.max(200, container.clientWidth), labels), series.data, container);
  }

  function draw() {
    const series = rateSeries(last.calls);
    marks = versionMarks(last.calls);
    const same = labels && labels.length === series.labels.length && labels.every((l, i) => l === series.labels[i]);
    if (!plot || !same) build(series);
    else plot.setData(series.data, false);
    const range = rateRange(last.range, last.now, series.data[0]);
    if (range) plot.setScale("x", { min: range[0], max: range[1] });
    else plot.redraw();
    empty.hidden = series.data[0].length > 0;
    legend.replaceChildren(
      ...series.labels.map((name, i) => {
        const n = series.data[i + 1].filter((v) => v !== null).length;
        return h(
          "li",
          { "data-series": name },
          h("span", { class: "swatch", style: `background: ${color(i)}` }),
          name,
          h("span", { class: "muted" }, ` ${n} ${n === 1 ? "call" : "calls"}`),
        );
      }),
    );
    changes.replaceChildren(...marks.map((m) => h("li", { "data-route": m.route }, `${m.label} at ${TIME.format(new Date(m.x * 1000))}`)));
  }

  new ResizeObserver(() => {
    if (plot && container.clientWidth > 0 && Math.abs(plot.width - container.clientWidth) > 1) {
      plot.setSize({ width: Math.max(200, container.clientWidth), height: HEIGHT });
    }
  }).observe(container);
  // Colours follow the theme.
  matchMedia("(prefers-color-scheme: dark)").addEventListener("change", () => {
    if (plot) {
      labels = null;
      draw();
    }
  });

  return {
    /** `calls`: the history list; `range`: the range key; `now`: unix ms. */
    render(calls, { range, now }) {
      last = { calls, range, now };
      draw();
    },
    /** The container may have been hidden (width 0) when last drawn. */
    resize() {
      if (plot && container.clientWidth > 0) plot.setSize({ width: container.clientWidth, height: HEIGHT });
    },
  };
}

const DEPTH_HEIGHT = 220;

/** "3.1k" tokens on the depth axis, "800" below a thousand. */
function tokensTick(v) {
  if (Math.abs(v) >= 1000) return `${(v / 1000).toFixed(v % 1000 === 0 ? 0 : 1)}k`;
  return v.toFixed(0);
}

/**
 * Decode tok/s against context depth for one model (History view): each
 * settled call is a dot, the engine's fitted line runs through them. The
 * data is lib/history.js's depthSeries.
 */
export function mountDepthChart({ container, empty, note, fit }) {
  let plot = null;
  let last = null;

  function options(width) {
    const text = cssVar("--muted", "#6b7280");
    const grid = cssVar("--grid", "rgba(0,0,0,.06)");
    const axis = { stroke: text, grid: { stroke: grid, width: 1 }, ticks: { stroke: grid, width: 1 }, font: "11px system-ui, sans-serif" };
    const dot = color(0);
    const line = dark() ? "#e3b341" : "#d97706";
    return {
      width,
      height: DEPTH_HEIGHT,
      legend: { show: false },
      cursor: { y: false, points: { size: 9 } },
      scales: {
        x: { time: false, range: (u, min, max) => [0, Math.max(1000, Math.ceil(((max ?? 0) * 1.05) / 1000) * 1000)] },
        y: { range: (u, min, max) => [0, Math.max(10, Math.ceil((max ?? 0) * 1.15))] },
      },
      axes: [
        { ...axis, space: 90, values: (u, splits) => splits.map(tokensTick), label: "context tokens", labelSize: 18, labelFont: "11px system-ui, sans-serif" },
        { ...axis, size: 44, values: (u, splits) => splits.map((v) => v.toFixed(0)), label: "tok/s", labelSize: 18, labelFont: "11px system-ui, sans-serif" },
      ],
      series: [
        {},
        { label: "calls", stroke: dot, fill: undefined, width: 0, paths: () => null, points: { show: true, size: 7, fill: dot, stroke: dot } },
        { label: "fitted", stroke: line, width: 2, dash: [6, 4], points: { show: false }, spanGaps: false },
      ],
      hooks: {
        setCursor: [
          (u) => {
            const i = u.cursor.idx;
            if (i === null || i === undefined || u.data[1][i] === null || u.data[1][i] === undefined) {
              note.textContent = "";
              return;
            }
            note.textContent = `${formatRate(u.data[1][i])} tok/s at ${Math.round(u.data[0][i]).toLocaleString("en-US")} tokens of context`;
          },
        ],
      },
    };
  }

  function color(i) {
    const p = dark() ? PALETTE.dark : PALETTE.light;
    return p[i % p.length];
  }

  function draw() {
    if (!last) return;
    plot?.destroy();
    plot = new uPlot(options(Math.max(200, container.clientWidth)), last.data, container);
    empty.hidden = last.count > 0;
    fit.textContent = last.count === 0 ? "" : last.fitText || (last.count < 3 ? "A fitted line needs at least 3 calls." : "");
  }

  new ResizeObserver(() => {
    if (plot && container.clientWidth > 0 && Math.abs(plot.width - container.clientWidth) > 1) {
      plot.setSize({ width: Math.max(200, container.clientWidth), height: DEPTH_HEIGHT });
    }
  }).observe(container);
  matchMedia("(prefers-color-scheme: dark)").addEventListener("change", draw);

  return {
    /** `series`: lib/history.js's depthSeries of the engine's answer. */
    render(series) {
      last = series;
      draw();
    },
    clear() {
      last = null;
      plot?.destroy();
      plot = null;
      empty.hidden = false;
      fit.textContent = "";
      note.textContent = "";
    },
    resize() {
      if (plot && container.clientWidth > 0) plot.setSize({ width: container.clientWidth, height: DEPTH_HEIGHT });
    },
  };
}
