// What each row and panel shows, as plain strings: the step between the
// engine's JSON and the DOM. Pure, so the "no number rather than a wrong
// one" rule is tested here once instead of being re-checked in every view.

import {
  DASH,
  apiLabel,
  formatCount,
  formatMs,
  formatRate,
  formatTime,
  isShowable,
  phaseLabel,
  sourceBadge,
  statusLabel,
} from "./format.js";

/**
 * The cells of one calls-table row.
 *
 * - An unmetered call (no snapshot) shows DASH for phase, numbers and source.
 * - TTFT and tok/s are DASH while absent (waiting for a first token, too few
 *   tokens for an honest rate, an abandoned call).
 * - `slow` (from a `slow_first_token` event) is shown only while the call is
 *   still waiting: once a first token arrives, the TTFT cell tells the story.
 * - `now` and `timeZone` only shape `started` (see formatTime).
 */
export function callRow(call, { slow, now, timeZone } = {}) {
  const speed = call.speed ?? null;
  const status = call.status ?? "in_flight";
  const waiting = speed?.phase === "awaiting_first_token" && status === "in_flight";
  return {
    id: call.id,
    route: call.route || DASH,
    model: call.model || DASH,
    // The app that made the call (from its User-Agent). Live calls learn it
    // from the list or when they settle: speed events carry only identity.
    client: call.client || DASH,
    started: formatTime(call.started_at, { now, timeZone }),
    api: apiLabel(call.api),
    apiRaw: call.api ?? "",
    phase: speed ? { text: phaseLabel(speed.phase), kind: speed.phase } : null,
    slow:
      waiting && slow && isShowable(slow.waited_ms)
        ? `No first token after ${formatMs(slow.waited_ms)} (threshold ${formatMs(slow.threshold_ms)})`
        : null,
    ttft: formatMs(speed?.time_to_first_token_ms),
    rate: formatRate(speed?.output_tokens_per_second),
    tokens: speed ? formatCount(speed.output_tokens) : DASH,
    source: speed ? sourceBadge(speed.token_source) : null,
    status: { text: statusLabel(status, call.http_status), kind: status },
    inFlight: status === "in_flight",
    unmetered: status === "unmetered" || call.api === "unknown",
  };
}

/**
 * The global panel: current tok/s (with whether it is an estimate),
 * aggregate tok/s, active calls, the hour's high and low.
 *
 * The current rate shows only when `tps_available` is true AND `tps` is a
 * number: either alone is not enough (a payload that says "available" with
 * no number, or a number flagged unavailable, shows DASH). Without any
 * stats yet, everything is DASH, including the active count.
 */
export function globalPanel(stats) {
  if (!stats || typeof stats !== "object") {
    return { now: DASH, estimated: false, aggregate: DASH, active: DASH, high: DASH, low: DASH };
  }
  const nowAvailable = stats.tps_available === true && isShowable(stats.tps);
  return {
    now: nowAvailable ? formatRate(stats.tps) : DASH,
    estimated: nowAvailable && stats.estimated === true,
    aggregate: formatRate(stats.aggregate_tps),
    active: Number.isInteger(stats.active) && stats.active >= 0 ? String(stats.active) : DASH,
    high: formatRate(stats.high),
    low: formatRate(stats.low),
  };
}
