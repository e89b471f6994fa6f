// Data for the tok/s-over-the-last-hour chart, in uPlot's shape. Pure.

/**
 * Readings further apart than this are not joined by a line. The engine
 * publishes at 1 Hz while tokens flow and emits no readings while idle, so a
 * longer silence is a gap in activity, not a slope between two rates.
 */
export const GAP_MS = 5_000;

/**
 * `[xs, ys]` for uPlot: x in unix seconds (uPlot's default time unit), y in
 * tok/s, with a `null` y inserted inside every gap longer than `gapMs` so the
 * line breaks there. Only readings inside `[now - windowMs, now]` are drawn.
 */
export function chartData(history, { now, windowMs = 3_600_000, gapMs = GAP_MS } = {}) {
  const xs = [];
  const ys = [];
  let prev = null;
  for (const p of history) {
    if (Number.isFinite(now) && (p.t < now - windowMs || p.t > now)) continue;
    if (prev !== null && p.t - prev > gapMs) {
      xs.push((prev + p.t) / 2 / 1000);
      ys.push(null);
    }
    xs.push(p.t / 1000);
    ys.push(p.tps);
    prev = p.t;
  }
  return [xs, ys];
}

/** The narrowest x range drawn, so a few readings don't fill the width. */
export const MIN_SPAN_MS = 5 * 60_000;

/**
 * The x range shown, in unix seconds, ending at `now`. It covers the part of
 * the last hour that has readings (plus a little margin before the first),
 * but never less than MIN_SPAN_MS: a whole hour for a minute of traffic would
 * squeeze every reading into the right edge, where a new user sees nothing.
 */
export function chartRange(now, history = [], windowMs = 3_600_000) {
  const from = now - windowMs;
  const first = history.find((p) => p.t >= from && p.t <= now)?.t;
  const start = first === undefined ? now - MIN_SPAN_MS : Math.max(from, Math.min(first - 30_000, now - MIN_SPAN_MS));
  return [start / 1000, now / 1000];
}
