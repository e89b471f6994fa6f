// The dashboard's state and the one function that changes it:
// `reduce(state, event, now) -> state`. Pure (the clock is the `now`
// argument, in unix milliseconds) and non-mutating: the previous state is
// never touched, so a view can compare old and new by reference.
//
// Events (`type` plus the payload fields):
// - `calls`    {calls: [Call]}: a list from `calls`; merged, see mergeListed.
// - `speed`    {call: CallIdentity, speed: Snapshot, seen_by}: upserts the call.
// - `settled`  {call: Call}: replaces the call with its final record.
// - `stats`    {stats: Stats}: the global reading; a real `tps` is also
//              appended to the hour's history.
// - `history`  {points: [{t, tps}]}: the engine's readings of the last hour.
// - `slow_first_token` {call, waited_ms, threshold_ms, usual_ms?, reason?}.
// - `prompt_truncated` {call, request_tokens, server_tokens, context_size?}:
//              the server read less of the prompt than was sent; kept on
//              the call as `prompt_truncated`, as its stored record has it.

import { isShowable } from "./format.js";

export const DEFAULTS = Object.freeze({
  /** Rows kept; the oldest settled calls go first. */
  maxRows: 200,
  /** Live rate values kept per call for its sparkline (about 30 s at 4/s). */
  maxSeries: 120,
  /** The chart's window: one hour, as the engine's stats_history. */
  historyMs: 60 * 60 * 1000,
});

export function initialState(options = {}) {
  return {
    options: { ...DEFAULTS, ...options },
    /** id -> Call (identity fields flat, as the API sends them). */
    calls: {},
    /** id -> live rates seen in that call's `speed` events, oldest first. */
    series: {},
    /** id -> {waited_ms, threshold_ms, usual_ms?, reason?} from `slow_first_token`. */
    slow: {},
    /** The latest Stats, or null before the first. */
    stats: null,
    /** [{t: unix ms, tps}] of the last hour, oldest first. */
    history: [],
    /** The calls list was loaded at least once. */
    loaded: false,
  };
}

/**
 * Newest first, in-flight calls above settled ones. Ties on `started_at`
 * (same millisecond) fall back to the id, whose number is the dispatch
 * order, compared numerically so `c-1000000` sorts after `c-999999`.
 */
export function compareCalls(a, b) {
  const fa = a.status === "in_flight" ? 0 : 1;
  const fb = b.status === "in_flight" ? 0 : 1;
  if (fa !== fb) return fa - fb;
  const sa = a.started_at ?? "";
  const sb = b.started_at ?? "";
  if (sa !== sb) return sa < sb ? 1 : -1;
  return String(b.id).localeCompare(String(a.id), "en", { numeric: true });
}

/** The calls in display order. */
export function orderedCalls(state) {
  return Object.values(state.calls).sort(compareCalls);
}

export function reduce(state, event, now) {
  switch (event?.type) {
    case "calls":
      return cap({ ...state, loaded: true, calls: mergeListed(state.calls, event.calls ?? []) });
    case "speed":
      return onSpeed(state, event.call, event.speed, event.seen_by);
    case "settled":
      return onSettled(state, event.call);
    case "stats":
      return onStats(state, event.stats, now);
    case "history":
      return onHistory(state, event.points ?? [], now);
    case "slow_first_token":
      return onSlow(state, event);
    case "prompt_truncated":
      return onTruncated(state, event);
    default:
      return state;
  }
}

/**
 * Merges a listed page into the known calls. The UI subscribes to events
 * before it asks for the list, so whatever it already holds came from an
 * event and is at least as new as the list, with one exception: a listed
 * call that is settled while the held one is still in flight (its
 * `settled` event was missed, e.g. across an EventSource reconnect).
 * Settled is final, so it wins.
 */
function mergeListed(calls, listed) {
  const out = { ...calls };
  for (const call of listed) {
    if (!call || typeof call.id !== "string") continue;
    const held = out[call.id];
    if (!held || (held.status === "in_flight" && call.status !== "in_flight")) {
      out[call.id] = call;
    }
  }
  return out;
}

function onSpeed(state, identity, speed, seenBy) {
  if (!identity || typeof identity.id !== "string" || !speed) return state;
  const held = state.calls[identity.id];
  // A snapshot that arrives after `settled` never undoes the final record.
  if (held && held.status !== "in_flight") return state;
  const call = { ...held, ...identity, status: "in_flight", speed };
  // The event says which interceptor sees the call from its first snapshot
  // on (events of older engines don't: keep what the record said).
  if (typeof seenBy === "string") call.seen_by = seenBy;
  let series = state.series;
  const rate = speed.output_tokens_per_second;
  // Only live readings feed the sparkline: the final snapshot's rate is the
  // settled decode rate, a different measure.
  if (!speed.is_final && isShowable(rate)) {
    const old = series[identity.id] ?? [];
    const next = old.length >= state.options.maxSeries ? old.slice(old.length - state.options.maxSeries + 1) : old.slice();
    next.push(rate);
    series = { ...series, [identity.id]: next };
  }
  return cap({ ...state, calls: { ...state.calls, [identity.id]: call }, series });
}

function onSettled(state, call) {
  if (!call || typeof call.id !== "string") return state;
  const slow = { ...state.slow };
  delete slow[call.id];
  return cap({ ...state, calls: { ...state.calls, [call.id]: call }, slow });
}

function onSlow(state, event) {
  const id = event.call?.id;
  if (typeof id !== "string") return state;
  const held = state.calls[id];
  if (held && held.status !== "in_flight") return state;
  // The identity alone is enough for a row if the call's first snapshot
  // was missed.
  const calls = held
    ? state.calls
    : { ...state.calls, [id]: { ...event.call, status: "in_flight" } };
  return cap({
    ...state,
    calls,
    slow: { ...state.slow, [id]: slowOf(event) },
  });
}

function onTruncated(state, event) {
  const id = typeof event.call === "string" ? event.call : event.call?.id;
  if (typeof id !== "string") return state;
  const held = state.calls[id];
  // The settled record carries its own (stored) flag.
  if (!held || held.status !== "in_flight") return state;
  const prompt_truncated = { request_tokens: event.request_tokens, server_tokens: event.server_tokens };
  if (isShowable(event.context_size)) prompt_truncated.context_size = event.context_size;
  return { ...state, calls: { ...state.calls, [id]: { ...held, prompt_truncated } } };
}

/** What a row needs of the alarm; the route's normal and the reason only when sent. */
function slowOf(event) {
  const slow = { waited_ms: event.waited_ms, threshold_ms: event.threshold_ms };
  if (isShowable(event.usual_ms)) slow.usual_ms = event.usual_ms;
  if (event.reason && typeof event.reason === "object") slow.reason = event.reason;
  return slow;
}

function onStats(state, stats, now) {
  if (!stats || typeof stats !== "object") return state;
  let history = state.history;
  if (stats.tps_available === true && isShowable(stats.tps) && Number.isFinite(now)) {
    history = trim([...history, { t: now, tps: stats.tps }], now, state.options.historyMs);
  }
  return { ...state, stats, history };
}

/**
 * The engine's history is the authority for the time it covers; readings
 * this page took from `stats` events after its last point are kept, so a
 * history that loads late loses nothing.
 */
function onHistory(state, points, now) {
  const valid = points
    .filter((p) => p && Number.isFinite(p.t) && isShowable(p.tps))
    .map((p) => ({ t: p.t, tps: p.tps }))
    .sort((a, b) => a.t - b.t);
  const last = valid.length ? valid[valid.length - 1].t : -Infinity;
  const merged = [...valid, ...state.history.filter((p) => p.t > last)];
  return { ...state, history: trim(merged, now, state.options.historyMs) };
}

function trim(history, now, windowMs) {
  if (!Number.isFinite(now)) return history;
  const from = now - windowMs;
  const first = history.findIndex((p) => p.t >= from);
  return first <= 0 ? (first === 0 ? history : []) : history.slice(first);
}

/** Keeps at most `maxRows` calls, dropping from the end of the display order. */
function cap(state) {
  const ids = Object.keys(state.calls);
  if (ids.length <= state.options.maxRows) return state;
  const keep = orderedCalls(state).slice(0, state.options.maxRows);
  const calls = {};
  const series = {};
  const slow = {};
  for (const call of keep) {
    calls[call.id] = call;
    if (state.series[call.id]) series[call.id] = state.series[call.id];
    if (state.slow[call.id]) slow[call.id] = state.slow[call.id];
  }
  return { ...state, calls, series, slow };
}
