// What each row and panel shows, as plain strings: the step between the
// engine's JSON and the DOM. Pure, so the "no number rather than a wrong
// one" rule is tested here once instead of being re-checked in every view.

import {
  DASH,
  apiLabel,
  clientLeft,
  failureLabel,
  formatCount,
  formatEta,
  formatMs,
  formatPercent,
  formatRate,
  formatTime,
  isFailed,
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
    phase: phaseOf(call, status),
    slow: waiting && slow && isShowable(slow.waited_ms) ? slowText(slow) : null,
    // Why it waits, while it waits (the engine sends it in the snapshot).
    wait: waiting ? waitView(speed.wait) : null,
    // Streamed, then silent past its stall threshold (live only).
    stalled: status === "in_flight" ? stalledText(speed) : null,
    // The server read less of the prompt than was sent (settled calls).
    truncated: truncationBadge(call.prompt_truncated),
    // Decoded below its usual rate (settled calls): "0.3× usual".
    slowdown: slowdownView(call.slowdown, speed?.output_tokens_per_second),
    ttft: formatMs(speed?.time_to_first_token_ms),
    rate: formatRate(speed?.output_tokens_per_second),
    tokens: speed ? formatCount(speed.output_tokens) : DASH,
    source: speed ? sourceBadge(speed.token_source) : null,
    status: { text: statusText(call, status), kind: status },
    // How it ended, when not well: "failed" (red) or "client_left" (neutral).
    outcome: outcomeOf(call, status),
    // The server's own words about the failure, for the status's tooltip.
    failureTitle: failureTitle(call),
    // A settled call that went silent mid-stream (History's "stalled" tag).
    stallMark: stallMark(call, status),
    inFlight: status === "in_flight",
    unmetered: status === "unmetered" || call.api === "unknown",
  };
}

/** "failed", "client_left" or null (in flight, or ended well). */
function outcomeOf(call, status) {
  if (status === "in_flight") return null;
  if (isFailed(call)) return "failed";
  return clientLeft(call) ? "client_left" : null;
}

/**
 * The phase badge: a settled call that failed reads "failed" (not
 * "complete"), one whose client left "client left"; else the snapshot's.
 */
function phaseOf(call, status) {
  const outcome = outcomeOf(call, status);
  if (outcome === "failed") return { text: "failed", kind: "failed" };
  if (outcome === "client_left") return { text: "client left", kind: "client_left" };
  const speed = call.speed;
  return speed ? { text: phaseLabel(speed.phase), kind: speed.phase } : null;
}

/** The status cell: how a settled call went wrong in a few words, else its status. */
function statusText(call, status) {
  const label = status === "in_flight" ? null : failureLabel(call);
  return label ?? statusLabel(status, call.http_status);
}

/** The failure's label and the server's message, as a tooltip; "" without one. */
function failureTitle(call) {
  const label = call.status === "in_flight" ? null : failureLabel(call);
  if (!label) return "";
  const message = call.failure?.message;
  return typeof message === "string" && message !== "" ? `${label}: ${message}` : label;
}

/** The "stalled" tag of a settled call that stalled, with its tooltip; or null. */
function stallMark(call, status) {
  if (status === "in_flight" || !(isShowable(call.stalls) && call.stalls > 0)) return null;
  const total = isShowable(call.stalled_ms) ? ` (${formatMs(call.stalled_ms)} in all)` : "";
  const times = call.stalls === 1 ? "once" : `${formatCount(call.stalls)} times`;
  return { text: "stalled", title: `The stream went silent mid-answer ${times}${total}; the details say when` };
}

/**
 * The global panel: whose rate "Now" is (with whether it rests on an
 * estimate), aggregate tok/s, the calls in flight and how many stream,
 * the hour's high and low.
 *
 * "Now" is made of the calls' own live rates, never the engine's mean over
 * every stream (`stats.tps`, which across two models matches neither):
 * the one streaming call's own rate, or with several, one figure per
 * model, each the mean of that model's streams (`qwen3 40 · gemma 15`).
 * `who` says whose it is. A stalled stream's last rate is not current and
 * counts for nothing.
 *
 * The counts come from the same calls as the table below, so they agree
 * with its "N in flight": `active` is the calls in flight, `streaming`
 * those of them past their first token. Before the calls list is known
 * (`calls` absent), and before any stats, the numbers are DASH.
 */
export function globalPanel(stats, calls) {
  const panel = { now: DASH, who: "", perModel: false, estimated: false, aggregate: DASH, active: DASH, streaming: "", high: DASH, low: DASH };
  if (Array.isArray(calls)) {
    const inFlight = calls.filter((c) => (c.status ?? "in_flight") === "in_flight" && c.speed?.is_final !== true);
    const streaming = inFlight.filter((c) => c.speed && c.speed.phase !== "awaiting_first_token");
    Object.assign(panel, nowOf(inFlight), {
      active: String(inFlight.length),
      streaming: `${streaming.length} streaming`,
    });
  }
  if (!stats || typeof stats !== "object") return panel;
  return { ...panel, aggregate: formatRate(stats.aggregate_tps), high: formatRate(stats.high), low: formatRate(stats.low) };
}

/** A call's own current rate, when it streams with one. */
function ownRate(call) {
  const speed = call.speed;
  if (!speed || isShowable(speed.stalled_ms)) return null;
  const rate = speed.output_tokens_per_second;
  return isShowable(rate) && rate > 0 ? rate : null;
}

/** "Now" from the calls in flight: {now, who, perModel, estimated}. */
function nowOf(inFlight) {
  const rated = inFlight.filter((c) => ownRate(c) !== null);
  if (rated.length === 0) return { now: DASH, who: "no stream with a rate", perModel: false, estimated: false };
  const estimated = rated.some((c) => c.speed.token_source === "estimated");
  if (rated.length === 1) {
    const [call] = rated;
    return { now: formatRate(ownRate(call)), who: `${call.model ?? call.route} on ${call.route}`, perModel: false, estimated };
  }
  const byModel = new Map();
  for (const call of rated) {
    const model = call.model ?? call.route;
    byModel.set(model, [...(byModel.get(model) ?? []), ownRate(call)]);
  }
  const now = [...byModel.keys()]
    .sort()
    .map((model) => {
      const rates = byModel.get(model);
      return `${model} ${Math.round(rates.reduce((a, b) => a + b, 0) / rates.length)}`;
    })
    .join(" · ");
  return { now, who: `per model, ${rated.length} streams`, perModel: true, estimated };
}

/**
 * The slow badge's tooltip: against the route's normal when the engine
 * knows it, else against the threshold.
 */
function slowText(slow) {
  const after = `No first token after ${formatMs(slow.waited_ms)}`;
  if (isShowable(slow.usual_ms)) return `${after} (usually ${formatMs(slow.usual_ms)})`;
  return `${after} (threshold ${formatMs(slow.threshold_ms)})`;
}

/**
 * "stalled 12 s" for a live snapshot with `stalled_ms` (whole seconds,
 * rounded down), else null: a final snapshot is never stalled.
 */
export function stalledText(speed) {
  if (!speed || speed.is_final === true || !isShowable(speed.stalled_ms)) return null;
  return `stalled ${Math.floor(speed.stalled_ms / 1000)} s`;
}

/** Calls ahead, in words: "1 call", "3 calls". */
function callsAhead(n) {
  return `${formatCount(n)} ${n === 1 ? "call" : "calls"}`;
}

/** The reasons this dashboard knows; any other shows as itself. */
const WAIT_REASONS = new Set(["loading_model", "queued", "prefilling", "unknown"]);

/**
 * A snapshot's `wait` (why a call has no first token yet) as what the
 * live row and the details panel show, or null without one:
 *
 * - `badge`: the short text ("loading model", "queued #2", "prefill 60%",
 *   "prefill ~60%" when the progress is speedtap's estimate);
 * - `sentence`: the same in words, with the prompt size and the usual time;
 * - `progress`: 0..1 for a prefill with known progress, else null;
 * - `eta`: "about 3 s left", or null when the engine gave no estimate;
 * - `facts`: `{label, value}` rows for the details panel (only those known).
 *
 * `past`: the wait is over (a settled call's stored `wait`): the sentence
 * is in the past tense, without progress or time left.
 *
 * Every number is optional (absent = not known): a queued call without a
 * position says "queued", a prefill without progress "prefill". A reason
 * this dashboard does not know (a newer engine) shows as itself.
 */
export function waitView(wait, { past = false } = {}) {
  if (!wait || typeof wait !== "object" || typeof wait.reason !== "string" || wait.reason === "") return null;
  const reason = wait.reason;
  const position = Number.isInteger(wait.position) && wait.position >= 0 ? wait.position : null;
  const progress = isShowable(wait.progress) ? Math.min(wait.progress, 1) : null;
  // An estimate of time left means nothing once the wait is over.
  const eta = !past && isShowable(wait.eta_ms) ? formatEta(wait.eta_ms) : null;
  const usual = isShowable(wait.usual_ms) ? formatMs(wait.usual_ms) : null;
  // Progress and prompt size from speedtap's estimate, not the server's
  // counts: labelled as such wherever they show (docs/api.md, `wait`).
  const estimated = wait.progress_source === "estimate";
  const about = estimated ? "about " : "";
  const prompt = isShowable(wait.prompt_tokens) ? `${about}${formatCount(wait.prompt_tokens)} ${wait.prompt_tokens === 1 ? "token" : "tokens"}` : null;
  const usually = usual ? ` (usually ${usual})` : "";
  let badge;
  let sentence;
  const facts = [];
  switch (reason) {
    case "loading_model":
      badge = "loading model";
      sentence = `${past ? "Waited for the model to load" : "Loading the model"}${usually}`;
      break;
    case "queued": {
      badge = position !== null ? `queued #${position}` : "queued";
      const behind = position === null || position === 0 ? "other calls" : callsAhead(position);
      sentence = `${past ? "Waited" : "Queued"} behind ${behind} on this server`;
      if (!past && position === 0) sentence = "Queued, next in line on this server";
      break;
    }
    case "prefilling":
      badge = progress !== null ? `prefill ${estimated ? "~" : ""}${formatPercent(progress)}` : "prefill";
      sentence = past
        ? `Processed the prompt${prompt ? ` of ${prompt}` : ""}`
        : `Processing the prompt${prompt ? ` of ${prompt}` : ""}${progress !== null ? `, ${formatPercent(progress)} done${estimated ? " (estimated)" : ""}` : ""}`;
      if (usual) facts.push({ label: "Usual TTFT", value: usual, title: "Usual time to first token for a prompt this size on this route" });
      break;
    case "unknown":
      badge = "waiting";
      sentence = past ? "The server did not say why it waited" : "Waiting; the server does not say why";
      break;
    default:
      badge = reason.replace(/_/g, " ");
      sentence = `${past ? "Waited" : "Waiting"} (${badge})`;
  }
  if (eta) facts.push({ label: "First token", value: eta, title: "speedtap's estimate of the time until the first token" });
  if (!past && isShowable(wait.silent_ms)) {
    facts.push({ label: "Server silent", value: formatMs(wait.silent_ms), title: "Time since the server last showed life for this call (a ping, prompt progress, a load)" });
  }
  return {
    reason: WAIT_REASONS.has(reason) ? reason : "other",
    badge,
    sentence,
    progress: reason === "prefilling" && !past ? progress : null,
    eta,
    title: eta ? `${sentence}; ${eta}` : sentence,
    facts,
  };
}

/** The row's "prompt cut" badge for a `prompt_truncated`, or null. */
export function truncationBadge(t) {
  if (!t || typeof t !== "object" || !isShowable(t.request_tokens) || !isShowable(t.server_tokens)) return null;
  return {
    text: "prompt cut",
    title: `The server read ${formatCount(t.server_tokens)} of the ${formatCount(t.request_tokens)} prompt tokens sent${isShowable(t.context_size) ? ` (context ${formatCount(t.context_size)})` : ""}`,
  };
}

/**
 * One slowdown cause in words, as the engine's notification says it
 * (`meter::slowdown_notice`): "29% of the model runs on the CPU", "since
 * the server went from 0.32.13 to 0.33.2", "2 other calls streamed beside
 * it"; `unknown` (no evidence) reads "no cause seen". A kind this page
 * does not know shows as itself.
 */
export function slowdownCause(cause) {
  if (!cause || typeof cause !== "object" || typeof cause.kind !== "string") return null;
  switch (cause.kind) {
    case "cpu_offload":
      return isShowable(cause.cpu_share) ? `${formatPercent(cause.cpu_share)} of the model runs on the CPU` : "part of the model runs on the CPU";
    case "server_changed":
      return typeof cause.from === "string" && typeof cause.to === "string"
        ? `since the server went from ${cause.from} to ${cause.to}`
        : "since the server's version changed";
    case "concurrent":
      return isShowable(cause.calls) ? `${formatCount(cause.calls)} other ${cause.calls === 1 ? "call" : "calls"} streamed beside it` : "other calls streamed beside it";
    case "draft_acceptance":
      return isShowable(cause.now) && isShowable(cause.usual)
        ? `the draft model's tokens are accepted ${formatPercent(cause.now)} of the time, usually ${formatPercent(cause.usual)}`
        : "the draft model's tokens are accepted less than usual";
    case "unknown":
      return "no cause seen";
    default:
      return cause.kind.replace(/_/g, " ");
  }
}

/**
 * A settled call's `slowdown` (docs/api.md, Slowdown) as shown, or null:
 * - `badge`: "0.3× usual" (the History row and the live table);
 * - `sentence`: "Decoded at 12 tok/s, 0.3× the usual 40 tok/s";
 * - `causes`: each cause in words;
 * - `title`: the sentence and its causes in one line.
 * `rate` is the call's settled tok/s (left out of the sentence when absent).
 */
export function slowdownView(slowdown, rate) {
  if (!slowdown || typeof slowdown !== "object" || !isShowable(slowdown.usual_tps) || !isShowable(slowdown.ratio)) return null;
  const ratio = `${Number(slowdown.ratio.toFixed(2))}×`;
  const usual = `${formatRate(slowdown.usual_tps)} tok/s`;
  const sentence = isShowable(rate)
    ? `Decoded at ${formatRate(rate)} tok/s, ${ratio} the usual ${usual}`
    : `Decoded at ${ratio} the usual ${usual}`;
  const causes = (Array.isArray(slowdown.causes) ? slowdown.causes : []).map(slowdownCause).filter((c) => c);
  return {
    badge: `${ratio} usual`,
    sentence,
    causes,
    title: causes.length ? `${sentence}: ${causes.join("; ")}` : sentence,
  };
}
