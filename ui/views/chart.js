// The tok/s-over-the-last-hour chart, drawn by uPlot (vendored from npm).

import uPlot from "../vendor/uPlot.esm.js";
import { chartData, chartRange } from "../lib/chart.js";

const HEIGHT = 180;
const TIME = new Intl.DateTimeFormat(undefined, { hour: "2-digit", minute: "2-digit" });

function cssVar(name, fallback) {
  const v = getComputedStyle(document.documentElement).getPropertyValue(name).trim();
  return v || fallback;
}

export function mountChart({ container, empty, note }) {
  let plot = null;
  let last = { history: [], now: Date.now() };

  function options(width) {
    const text = cssVar("--muted", "#6b7280");
    const grid = cssVar("--grid", "rgba(0,0,0,.06)");
    const accent = cssVar("--accent", "#2563eb");
    const fill = cssVar("--accent-fill", "rgba(37,99,235,.12)");
    const axis = { stroke: text, grid: { stroke: grid, width: 1 }, ticks: { stroke: grid, width: 1 }, font: "11px system-ui, sans-serif" };
    return {
      width,
      height: HEIGHT,
      legend: { show: false },
      cursor: { y: false, points: { size: 6 } },
      scales: { x: { time: true }, y: { range: (u, min, max) => [0, Math.max(10, Math.ceil((max ?? 0) * 1.15))] } },
      axes: [
        // Hours and minutes only: the range is at most an hour, ending now.
        // Whole-minute ticks, so no two labels read the same.
        {
          ...axis,
          space: 70,
          incrs: [60, 120, 300, 600, 900, 1800, 3600],
          values: (u, splits) => splits.map((v) => TIME.format(new Date(v * 1000))),
        },
        { ...axis, size: 44, values: (u, splits) => splits.map((v) => v.toFixed(0)) },
      ],
      series: [
        {},
        {
          label: "tok/s",
          stroke: accent,
          width: 2,
          fill,
          spanGaps: false,
          // Dots only while readings are sparse; a dense hour is a line.
          points: { show: (u, i, i0, i1) => i1 - i0 < 90, size: 5 },
          value: (u, v) => (v === null || v === undefined ? "–" : `${v.toFixed(1)} tok/s`),
        },
      ],
    };
  }

  function build() {
    plot?.destroy();
    const width = Math.max(200, container.clientWidth);
    plot = new uPlot(options(width), chartData(last.history, { now: last.now }), container);
    setRange();
  }

  function setRange() {
    const [min, max] = chartRange(last.now, last.history);
    plot.setScale("x", { min, max });
  }

  new ResizeObserver(() => {
    if (plot && Math.abs(plot.width - container.clientWidth) > 1) {
      plot.setSize({ width: Math.max(200, container.clientWidth), height: HEIGHT });
    }
  }).observe(container);
  // Colours come from CSS variables; redraw when the theme flips.
  matchMedia("(prefers-color-scheme: dark)").addEventListener("change", () => plot && build());

  return {
    render(history, now) {
      last = { history, now };
      if (!plot) build();
      else {
        plot.setData(chartData(history, { now }), false);
        setRange();
      }
      empty.hidden = history.length > 0;
    },
    setNote(text) {
      note.textContent = text;
    },
  };
}
