// The plain speedtap dashboard: fetch /api/v1/calls once, then follow
// /api/v1/events. Rows are keyed by call id: `speed` upserts a row's live
// numbers, `settled` replaces it with the final record. Absent numbers
// (not measured) show as "–", never 0.
"use strict";

const MAX_ROWS = 200;
const DASH = "\u2013";
const calls = new Map(); // id -> Call (identity fields flattened, as the API sends them)
const tbody = document.getElementById("calls");

function num(value, digits, unit) {
  if (value === undefined || value === null) return DASH;
  return value.toFixed(digits) + (unit || "");
}

function ttft(speed) {
  if (!speed || speed.time_to_first_token_ms === undefined) return DASH;
  const ms = speed.time_to_first_token_ms;
  return ms < 1000 ? ms + " ms" : (ms / 1000).toFixed(2) + " s";
}

function cell(row, text, cls) {
  const td = row.insertCell();
  td.textContent = text;
  if (cls) td.className = cls;
}

function render() {
  const rows = [...calls.values()].sort((a, b) =>
    a.started_at < b.started_at ? 1 : a.started_at > b.started_at ? -1 : b.id.localeCompare(a.id));
  for (const old of rows.slice(MAX_ROWS)) calls.delete(old.id);
  tbody.textContent = "";
  for (const c of rows.slice(0, MAX_ROWS)) {
    const s = c.speed;
    const row = tbody.insertRow();
    row.className = c.status;
    cell(row, c.route);
    cell(row, c.model || DASH);
    cell(row, c.api);
    cell(row, s ? s.phase.replace(/_/g, " ") : DASH);
    cell(row, ttft(s), "num");
    cell(row, s ? num(s.output_tokens_per_second, 1) : DASH, "num");
    cell(row, s ? String(s.output_tokens) : DASH, "num");
    cell(row, s ? s.token_source : DASH);
    cell(row, c.status.replace(/_/g, " "), c.status);
  }
  document.getElementById("empty").hidden = rows.length > 0;
}

function renderStats(st) {
  const parts = [
    "Now " + (st.tps_available ? num(st.tps, 1, " tok/s") + (st.estimated ? " (est.)" : "") : DASH),
    "high " + num(st.high, 1),
    "low " + num(st.low, 1),
    "total " + num(st.aggregate_tps, 1, " tok/s"),
    st.active + " active",
  ];
  document.getElementById("stats").textContent = parts.join(" · ");
}

function upsertSpeed(ev) {
  const old = calls.get(ev.call.id);
  if (old && old.status !== "in_flight") return; // a late snapshot never undoes "settled"
  calls.set(ev.call.id, Object.assign({ status: "in_flight" }, old, ev.call, { speed: ev.speed }));
  render();
}

// Subscribe first, then load the list: anything that happens while the list
// is loading arrives as an event, and events (newer) win over listed rows.
async function start() {
  const conn = document.getElementById("conn");
  const events = new EventSource("/api/v1/events");
  events.onopen = () => { conn.textContent = "live"; };
  events.onerror = () => { conn.textContent = "disconnected, retrying…"; };
  events.addEventListener("speed", (e) => upsertSpeed(JSON.parse(e.data)));
  events.addEventListener("settled", (e) => {
    const c = JSON.parse(e.data);
    calls.set(c.id, c);
    render();
  });
  events.addEventListener("stats", (e) => renderStats(JSON.parse(e.data)));
  try {
    const [list, stats] = await Promise.all([
      fetch("/api/v1/calls").then((r) => r.json()),
      fetch("/api/v1/stats").then((r) => r.json()),
    ]);
    for (const c of list.calls) if (!calls.has(c.id)) calls.set(c.id, c);
    render();
    renderStats(stats);
  } catch (e) {
    conn.textContent = "could not load calls: " + e;
  }
}

start();
