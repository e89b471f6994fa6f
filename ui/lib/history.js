// The History view's logic: time range and filters to the engine's query,
// the model comparison rows, the per-model rate chart's data, the export
// URL. Pure: the clock is a `now` argument (unix ms).
//
// A filter is `{since?, until?, model?, route?, client?, limit?}` with only
// the set keys present: the Tauri commands' `filter` argument as is, and
// the HTTP query string through `filterQuery`. `model: ""` (and
// `client: ""`) is a real value: the calls that named none, the `""` row of
// `/api/v1/models`. "Any" is the key left out.

import { DASH, NO_MODEL, formatCompactCount, formatCount, formatMs, formatPercent, formatRate, formatTime, isShowable, modelLabel, parseTime } from "./format.js";

/** The time ranges offered, shortest first. `ms: null` = everything kept. */
export const RANGES = Object.freeze([
  Object.freeze({ key: "hour", label: "Last hour", ms: 3_600_000 }),
  Object.freeze({ key: "day", label: "Last 24 h", ms: 86_400_000 }),
  Object.freeze({ key: "week", label: "Last 7 days", ms: 7 * 86_400_000 }),
  Object.freeze({ key: "all", label: "All", ms: null }),
]);

/** A day: enough to compare today's models without a week of noise. */
export const DEFAULT_RANGE = "day";

/** Calls listed (and charted) per load. The engine clamps at 10,000. */
export const HISTORY_LIMIT = 500;

/**
 * The `since` of a range at `now` (unix ms, whole), or undefined for "all".
 * An unknown key is the default range: a stale key from an older page must
 * not silently widen the query to everything.
 */
export function rangeSince(key, now) {
  const range = RANGES.find((r) => r.key === key) ?? RANGES.find((r) => r.key === DEFAULT_RANGE);
  if (range.ms === null || !Number.isFinite(now)) return undefined;
  return Math.floor(now - range.ms);
}

/**
 * The filter for the engine from the view's choices: `{range, model, route,
 * client}`, each of model/route/client either null/undefined (any) or a
 * string. An empty `route` is "any" (every call has a route, and the API
 * reads `route=` so); an empty `model` or `client` is kept (named none).
 */
export function buildFilter({ range = DEFAULT_RANGE, model, route, client } = {}, now, { limit } = {}) {
  const filter = {};
  const since = rangeSince(range, now);
  if (since !== undefined) filter.since = since;
  if (typeof model === "string") filter.model = model;
  if (typeof route === "string" && route !== "") filter.route = route;
  if (typeof client === "string") filter.client = client;
  if (Number.isInteger(limit) && limit >= 0) filter.limit = limit;
  return filter;
}

const QUERY_KEYS = ["model", "route", "client", "since", "until", "limit"];

/**
 * The filter as a query string (no leading "?"), keys in a fixed order,
 * `extra` (e.g. `{format}`) first. `model=` with an empty value is written
 * (named none); absent keys are not.
 */
export function filterQuery(filter = {}, extra = {}) {
  const q = new URLSearchParams();
  for (const [key, value] of Object.entries(extra)) {
    if (value !== undefined && value !== null) q.set(key, String(value));
  }
  for (const key of QUERY_KEYS) {
    const value = filter[key];
    if (value === undefined || value === null) continue;
    q.set(key, String(value));
  }
  return q.toString();
}

export const EXPORT_FORMATS = Object.freeze(["csv", "jsonl"]);

/**
 * `/api/v1/export?format=...&filters`: what the Export link downloads in a
 * browser. No `limit`: an export is every call the filters select, whatever
 * the list on screen shows.
 */
export function exportUrl(filter, format = "csv") {
  if (!EXPORT_FORMATS.includes(format)) throw new RangeError(`unknown export format ${format}`);
  const { limit: _ignored, ...rest } = filter ?? {};
  return `/api/v1/export?${filterQuery(rest, { format })}`;
}

/** The file name a download gets: the engine's own (content-disposition). */
export function exportFilename(format) {
  return format === "jsonl" ? "speedtap-calls.jsonl" : "speedtap-calls.csv";
}

// ---- filter options --------------------------------------------------------

/**
 * The choices of the model, route and client pickers: every value seen so
 * far (in `prev`) plus those in a new `models` answer and `calls` list,
 * each sorted, and always the selected values (a choice must never vanish
 * from its own picker because the filtered answer no longer lists others).
 * Options only grow while the page is open: the answers are filtered, so
 * what one doesn't list still exists.
 */
export function mergeOptions(prev, { models = [], calls = [], selected = {} } = {}) {
  const sets = {
    models: new Set(prev?.models ?? []),
    routes: new Set(prev?.routes ?? []),
    clients: new Set(prev?.clients ?? []),
  };
  for (const m of models) {
    if (typeof m?.model === "string") sets.models.add(m.model);
    if (typeof m?.route === "string" && m.route !== "") sets.routes.add(m.route);
  }
  for (const c of calls) {
    // A stored call that named no model is in the `""` group.
    sets.models.add(typeof c?.model === "string" ? c.model : "");
    if (typeof c?.route === "string" && c.route !== "") sets.routes.add(c.route);
    sets.clients.add(typeof c?.client === "string" ? c.client : "");
  }
  if (typeof selected.model === "string") sets.models.add(selected.model);
  if (typeof selected.route === "string" && selected.route !== "") sets.routes.add(selected.route);
  if (typeof selected.client === "string") sets.clients.add(selected.client);
  const sorted = (set) => [...set].sort((a, b) => a.localeCompare(b, "en", { numeric: true }));
  return { models: sorted(sets.models), routes: sorted(sets.routes), clients: sorted(sets.clients) };
}

/**
 * A <select>'s option value for a filter choice, and back. `null` (any) is
 * "", and every value (also "", named none) gets a "=" in front, so "any"
 * and "named none" never share a value.
 */
export function pickerValue(choice) {
  return typeof choice === "string" ? `=${choice}` : "";
}
export function pickerChoice(value) {
  return typeof value === "string" && value.startsWith("=") ? value.slice(1) : null;
}

/** A picker option's text: the value, or what "named none" means for it. */
export function optionLabel(kind, value) {
  if (value !== "") return value;
  return kind === "client" ? "(no User-Agent)" : NO_MODEL;
}

// ---- model comparison --------------------------------------------------------

/** A group kept apart from the TTFT figures: "p50 7.0 s, 3 calls", or DASH. */
function apart(calls, ttftP50) {
  if (!(calls > 0)) return DASH;
  const median = isShowable(ttftP50) ? `p50 ${formatMs(ttftP50)}, ` : "";
  return `${median}${formatCount(calls)} ${calls === 1 ? "call" : "calls"}`;
}

/**
 * The comparison table's rows from `/api/v1/models`, in the engine's order
 * (model, then route), as display strings; absent figures are DASH.
 * `best.ttft` / `best.tps` mark the row with the lowest median TTFT / the
 * highest median decode rate, only when at least two rows have that figure
 * (one row is not a comparison) and the best is unique.
 */
export function comparisonRows(models, { now, timeZone } = {}) {
  const list = Array.isArray(models) ? models.filter((m) => m && typeof m === "object") : [];
  const bestOf = (key, better) => {
    const values = list.map((m) => m[key]).filter(isShowable);
    if (values.length < 2) return undefined;
    const best = values.reduce((a, b) => (better(b, a) ? b : a));
    return values.filter((v) => v === best).length === 1 ? best : undefined;
  };
  const bestTtft = bestOf("ttft_ms_p50", (a, b) => a < b);
  const bestTps = bestOf("tps_p50", (a, b) => a > b);
  return list.map((m) => ({
    key: `${m.model ?? ""}\u0000${m.route ?? ""}`,
    model: modelLabel(m.model),
    modelRaw: typeof m.model === "string" ? m.model : "",
    route: m.route || DASH,
    calls: formatCount(m.calls),
    okCalls: formatCount(m.ok_calls),
    // "12 calls, 10 ok": the figures are over the ok ones only.
    callsTitle:
      isShowable(m.calls) && isShowable(m.ok_calls)
        ? `${formatCount(m.calls)} calls, ${formatCount(m.ok_calls)} ended ok (the figures are over those)`
        : "",
    errors: errorsText(m),
    errorsTitle: "Calls that failed (HTTP errors, unreachable, broken streams; not those whose client left) of all calls",
    allFailed: allFailed(m),
    // A model whose every call failed has no figures: say so once.
    ttftP50: allFailed(m) ? "all failed" : formatMs(m.ttft_ms_p50),
    ttftP90: formatMs(m.ttft_ms_p90),
    tpsP50: formatRate(m.tps_p50),
    tpsP90: formatRate(m.tps_p90),
    // The slow tail, in the same sense as TTFT p90.
    tpsP10: formatRate(m.tps_p10),
    prefillP50: formatRate(m.prefill_tps_p50),
    // Median reasoning tokens per answer, "~" on speedtap's estimate.
    reasoningP50: reasoningText(m),
    reasoningTitle:
      m.reasoning_calls > 0
        ? `Median reasoning tokens per answer over the ${formatCount(m.reasoning_calls)} ok ${m.reasoning_calls === 1 ? "call" : "calls"} that reasoned${m.reasoning_tokens_estimated ? " (some counts are speedtap's estimates)" : ""}`
        : "No call of this model reasoned",
    // Cold starts and queued calls are kept out of the TTFT figures and
    // shown apart, each with its own median.
    cold: apart(m.cold_calls, m.cold_ttft_ms_p50),
    queued: apart(m.queued_calls, m.queued_ttft_ms_p50),
    // Absent unless a prompt of 512 tokens or more was seen: say so.
    prefillTitle: isShowable(m.prefill_tps_p50)
      ? "Median prompt processing rate of prompts of 512 tokens or more"
      : "No prompt of 512 tokens or more with a server-reported rate: a short prompt's rate is mostly fixed overhead, so none is shown",
    ttftTitle:
      m.queued_calls > 0 || m.cold_calls > 0
        ? `Over the calls neither queued nor cold (${formatCount(m.queued_calls ?? 0)} queued and ${formatCount(m.cold_calls ?? 0)} cold left out)`
        : "Over the calls neither queued nor cold",
    lastSeen: formatTime(m.last_seen, { now, timeZone }),
    lastSeenRaw: m.last_seen ?? "",
    best: {
      ttft: bestTtft !== undefined && m.ttft_ms_p50 === bestTtft,
      tps: bestTps !== undefined && m.tps_p50 === bestTps,
    },
  }));
}

/**
 * The Errors cell: "2 / 10 (20%)", "0 / 10" when none failed (the engine
 * leaves `failed_calls` out at 0), DASH without calls.
 */
export function errorsText(m) {
  if (!isShowable(m?.calls) || m.calls === 0) return DASH;
  const failed = isShowable(m.failed_calls) ? m.failed_calls : 0;
  if (failed === 0) return `0 / ${formatCount(m.calls)}`;
  return `${formatCount(failed)} / ${formatCount(m.calls)} (${formatPercent(failed / m.calls)})`;
}

/** Every call of the model failed: none ended ok, all are counted failed. */
export function allFailed(m) {
  return isShowable(m?.calls) && m.calls > 0 && m.ok_calls === 0 && m.failed_calls === m.calls;
}

/**
 * A model's median reasoning tokens per answer, compact: "640", "1.8k",
 * "~1.8k" when some counts are speedtap's estimates; DASH when none
 * reasoned.
 */
export function reasoningText(m) {
  const n = m?.reasoning_tokens_p50;
  if (!isShowable(n)) return DASH;
  return `${m.reasoning_tokens_estimated ? "~" : ""}${formatCompactCount(n)}`;
}

// ---- rate over time ----------------------------------------------------------

/**
 * Where the decode chart marks a server version change: the first charted
 * call (ok, with a settled rate, as in `rateSeries`) of a route whose
 * `server_version` differs from the route's previous charted call's.
 * Calls with no version neither mark nor reset. `[{x, route, from, to,
 * label}]`, x in unix seconds, ascending; `label` "ollama: 0.32.13 →
 * 0.33.2".
 */
export function versionMarks(calls) {
  const points = [];
  for (const c of Array.isArray(calls) ? calls : []) {
    if (!c || c.status !== "ok" || c.speed?.is_final !== true || !isShowable(c.speed?.output_tokens_per_second)) continue;
    if (typeof c.server_version !== "string" || c.server_version === "") continue;
    const t = parseTime(c.settled_at) ?? parseTime(c.started_at);
    if (t === null) continue;
    points.push({ t, route: c.route ?? "", version: c.server_version, id: c.id });
  }
  points.sort((a, b) => a.t - b.t || String(a.id).localeCompare(String(b.id), "en", { numeric: true }));
  const last = new Map();
  const marks = [];
  for (const p of points) {
    const from = last.get(p.route);
    if (from !== undefined && from !== p.version) {
      marks.push({ x: p.t / 1000, route: p.route, from, to: p.version, label: `${p.route}: ${from} → ${p.version}` });
    }
    last.set(p.route, p.version);
  }
  return marks;
}

/**
 * The chart of decode tok/s over time, one series per model, in uPlot's
 * shape: `{labels, data: [xs, ...ys]}` with x in unix seconds, ascending.
 *
 * One point per call that ended `ok` with a settled rate (the calls the
 * comparison's tok/s figures are computed over; a failed call's rate
 * describes the failure), at its `settled_at` (when the rate became known),
 * else its `started_at`. Each call is its own x; the other series are
 * `null` there, so every point belongs to exactly one model. Series are
 * sorted by label, so a model keeps its colour across reloads.
 */
export function rateSeries(calls) {
  const points = [];
  for (const c of Array.isArray(calls) ? calls : []) {
    if (!c || c.status !== "ok") continue;
    const rate = c.speed?.output_tokens_per_second;
    if (c.speed?.is_final !== true || !isShowable(rate)) continue;
    const t = parseTime(c.settled_at) ?? parseTime(c.started_at);
    if (t === null) continue;
    points.push({ t, model: modelLabel(c.model), rate, id: c.id });
  }
  points.sort((a, b) => a.t - b.t || String(a.id).localeCompare(String(b.id), "en", { numeric: true }));
  const labels = [...new Set(points.map((p) => p.model))].sort((a, b) => a.localeCompare(b, "en", { numeric: true }));
  const index = new Map(labels.map((l, i) => [l, i]));
  const xs = points.map((p) => p.t / 1000);
  const ys = labels.map(() => new Array(points.length).fill(null));
  points.forEach((p, i) => {
    ys[index.get(p.model)][i] = p.rate;
  });
  return { labels, data: [xs, ...ys] };
}

/** The narrowest x span the rate chart shows (ms). */
export const MIN_RATE_SPAN_MS = 10 * 60_000;

/**
 * The chart's x range in unix seconds, ending at `now` (or the last point,
 * if a clock put it later). It starts a little before the first point, not
 * at the range's start: a day's axis for ten minutes of calls squeezes every
 * point into the right edge. The chosen range still bounds it (no point is
 * older, the query saw to that), and it never spans less than
 * MIN_RATE_SPAN_MS. Without points: the whole range, or null for "all"
 * (uPlot picks).
 */
export function rateRange(rangeKey, now, xs = []) {
  const since = rangeKey === "all" ? undefined : rangeSince(rangeKey, now);
  const end = now / 1000;
  if (xs.length === 0) return since === undefined ? null : [since / 1000, end];
  const first = xs[0];
  const last = Math.max(end, xs[xs.length - 1]);
  const pad = Math.max(30, (last - first) * 0.03);
  let start = Math.min(first - pad, last - MIN_RATE_SPAN_MS / 1000);
  if (since !== undefined) start = Math.max(start, since / 1000);
  return [start, last];
}

// ---- decode speed against context depth ----------------------------------------

/**
 * The models the depth chart can show, from `/api/v1/models` rows: every
 * named model once (a model on two routes is one choice), most calls
 * first, then by name. Calls that named no model have no curve of their own.
 */
export function depthModels(models) {
  const calls = new Map();
  for (const m of Array.isArray(models) ? models : []) {
    if (typeof m?.model !== "string" || m.model === "") continue;
    calls.set(m.model, (calls.get(m.model) ?? 0) + (isShowable(m.calls) ? m.calls : 0));
  }
  return [...calls.entries()]
    .sort((a, b) => b[1] - a[1] || a[0].localeCompare(b[0], "en", { numeric: true }))
    .map(([model]) => model);
}

/**
 * Which model the depth chart shows: the History filter's model when one is
 * picked, else the one the user picked in the chart (if still offered),
 * else the busiest. null when there is none.
 */
export function depthModel({ filterModel, picked, models = [] } = {}) {
  if (typeof filterModel === "string" && filterModel !== "") return filterModel;
  if (typeof picked === "string" && models.includes(picked)) return picked;
  return models[0] ?? null;
}

/**
 * The depth query for `model` within the History filter: the same
 * parameters for `GET /api/v1/history/depth` (through filterQuery) and the
 * `history_depth` command: `{model, route?, since?, until?}`.
 */
export function depthFilter(filter = {}, model) {
  const out = { model };
  for (const key of ["route", "since", "until"]) {
    if (filter[key] !== undefined && filter[key] !== null) out[key] = filter[key];
  }
  return out;
}

/**
 * The depth scatter in uPlot's shape from a `history/depth` answer:
 * `data: [xs, ys, fit]`, x the context depth in tokens (ascending), y the
 * call's decode tok/s, `fit` the fitted line at each x (null where the line
 * would go below 0 tok/s: a rate is never negative, and drawing one would be
 * a wrong number). Points without both numbers are dropped. `fitText`
 * describes the line in words, or is "" without a usable fit (under 3
 * points the engine sends none; an unknown `kind` is not drawn).
 */
export function depthSeries(doc) {
  const points = (Array.isArray(doc?.points) ? doc.points : [])
    .filter((p) => p && isShowable(p.context_tokens) && isShowable(p.tokens_per_second))
    .map((p) => [p.context_tokens, p.tokens_per_second])
    .sort((a, b) => a[0] - b[0] || a[1] - b[1]);
  const xs = points.map((p) => p[0]);
  const ys = points.map((p) => p[1]);
  const f = doc?.fit;
  const linear = f && f.kind === "linear" && Number.isFinite(f.a) && Number.isFinite(f.b) && xs.length > 0;
  const fit = xs.map((x) => {
    if (!linear) return null;
    const y = f.a + f.b * x;
    return y >= 0 ? y : null;
  });
  let fitText = "";
  if (linear) {
    const per1k = f.b * 1000;
    const slope =
      Math.abs(per1k) < 0.05
        ? "about the same at every depth"
        : `${per1k < 0 ? "−" : "+"}${formatRate(Math.abs(per1k))} tok/s per 1,000 tokens of context`;
    fitText = `Fitted line: ${formatRate(Math.max(f.a, 0))} tok/s at an empty context, ${slope}`;
  }
  return {
    model: typeof doc?.model === "string" ? doc.model : null,
    count: xs.length,
    data: [xs, ys, fit],
    fitText,
  };
}
