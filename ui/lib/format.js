// Number and label formatting for the dashboard. Pure: no DOM, no clock.
//
// The one rule that runs through every function here: an absent number (not
// measured) is shown as DASH, never as 0 or a guess. The engine omits a field
// it could not measure honestly (docs/metering.md: absent, never zero; no
// consumer may read a missing number as 0), so `undefined`, `null`,
// NaN, infinities and negative values all mean "no number" on screen.

/** What the UI shows in place of a number that is not available. */
export const DASH = "\u2013";

/** True for a finite, non-negative number: the only kind the UI displays. */
export function isShowable(value) {
  return typeof value === "number" && Number.isFinite(value) && value >= 0;
}

/**
 * A duration in milliseconds: "312 ms" below one second, "1.2 s" (one
 * decimal) below 100 s, then whole seconds ("125 s"). Rounding happens
 * before the unit is chosen, so 999.6 ms reads "1.0 s", not "1000 ms".
 */
export function formatMs(ms) {
  if (!isShowable(ms)) return DASH;
  const whole = Math.round(ms);
  if (whole < 1000) return `${whole} ms`;
  const seconds = ms / 1000;
  if (seconds < 99.95) return `${seconds.toFixed(1)} s`;
  return `${Math.round(seconds)} s`;
}

/**
 * A duration as a short phrase reads it: "640 ms" below one second, "2.5 s"
 * (a trailing ".0" dropped: "3 s") below 10 s, whole seconds after ("41 s").
 */
export function formatSpan(ms) {
  if (!isShowable(ms)) return DASH;
  if (Math.round(ms) < 1000) return `${Math.round(ms)} ms`;
  const seconds = ms / 1000;
  if (seconds < 9.95) return `${Number(seconds.toFixed(1))} s`;
  return `${Math.round(seconds)} s`;
}

/** A token count, compact: "640", then thousands with one decimal ("1.8k", "2k"). */
export function formatCompactCount(count) {
  if (!isShowable(count)) return DASH;
  return count >= 1000 ? `${Number((count / 1000).toFixed(1))}k` : formatCount(Math.round(count));
}

/** A rate in tokens per second with one decimal, as the engine publishes it. */
export function formatRate(rate) {
  if (!isShowable(rate)) return DASH;
  return rate.toFixed(1);
}

/** A token count: a whole number with thousands separators ("1,234"). */
export function formatCount(count) {
  if (!isShowable(count)) return DASH;
  return Math.round(count).toLocaleString("en-US");
}

const PHASES = {
  awaiting_first_token: "waiting",
  reasoning: "reasoning",
  responding: "responding",
  calling_tool: "calling tool",
  complete: "complete",
};

/**
 * The phase badge's text. "waiting" is shorter than the contract's
 * `awaiting_first_token` and says the same to a person. An unknown phase
 * (a newer engine) is shown with its underscores as spaces rather than
 * hidden.
 */
export function phaseLabel(phase) {
  if (typeof phase !== "string" || phase === "") return DASH;
  return PHASES[phase] ?? phase.replace(/_/g, " ");
}

const STATUSES = {
  in_flight: "in flight",
  ok: "ok",
  abandoned: "abandoned",
  upstream_error: "upstream error",
  unmetered: "unmetered",
};

/**
 * The status as a word; an upstream error names its HTTP code when it is
 * an error code (a stream that failed after a 200 is not "error 200").
 */
export function statusLabel(status, httpStatus) {
  if (typeof status !== "string" || status === "") return DASH;
  const label = STATUSES[status] ?? status.replace(/_/g, " ");
  if (status === "upstream_error" && isErrorCode(httpStatus)) {
    return `${label} ${httpStatus}`;
  }
  return label;
}

/** An HTTP status that says the request failed (4xx, 5xx). */
function isErrorCode(code) {
  return Number.isInteger(code) && code >= 400;
}

/** "HTTP 500", or "HTTP error" without an error code. */
function httpLabel(code) {
  return isErrorCode(code) ? `HTTP ${code}` : "HTTP error";
}

/** "broke after 30 tokens", "broke after 1 token", "broke before any token". */
function brokeLabel(tokens) {
  if (!isShowable(tokens) || tokens === 0) return "broke before any token";
  return `broke after ${formatCount(tokens)} ${tokens === 1 ? "token" : "tokens"}`;
}

/**
 * How a settled call went wrong, in a few words (at most 26 characters),
 * or null when it ended well. From its `failure` (docs/api.md) when it has
 * one; an older record without it falls back on its status.
 */
export function failureLabel(call) {
  const failure = call?.failure;
  if (failure && typeof failure === "object") {
    switch (failure.kind) {
      case "http":
        return httpLabel(call.http_status);
      case "unreachable":
        return "unreachable";
      case "stream_error":
        return "server error mid-stream";
      case "broke_off":
        return brokeLabel(failure.after_tokens);
      case "client_left":
        return "client left";
      default:
        return typeof failure.kind === "string" && failure.kind !== "" ? failure.kind.replace(/_/g, " ") : "failed";
    }
  }
  if (call?.status === "upstream_error") return httpLabel(call.http_status);
  if (call?.status === "abandoned") return "ended early";
  return null;
}

/**
 * Whether a call failed (shown red): a failure other than the client
 * leaving, or, in an older record without `failure`, an upstream error.
 */
export function isFailed(call) {
  const failure = call?.failure;
  if (failure && typeof failure === "object") return failure.kind !== "client_left";
  return call?.status === "upstream_error";
}

/** Whether the call ended because its client left (neutral, not red). */
export function clientLeft(call) {
  return call?.failure?.kind === "client_left";
}

const SOURCES = {
  estimated: {
    text: "est.",
    kind: "estimated",
    title:
      "Estimated: counted by speedtap's tokenizer over the streamed text, " +
      "calibrated per route and model. Close, not exact.",
  },
  provider: {
    text: "exact",
    kind: "provider",
    title:
      "Exact: the token count comes from the API's own usage receipt " +
      "(e.g. usage.completion_tokens).",
  },
  server: {
    text: "server",
    kind: "server",
    title:
      "Server timings: count and rate come from the inference server's own " +
      "generation timings (llama.cpp timings, Ollama eval_count/eval_duration).",
  },
};

/**
 * The source badge for a snapshot's `token_source`: `{text, kind, title}`,
 * or null when there is no source (an unmetered call has no snapshot). An
 * unknown source is shown as itself, with a title that says so.
 */
export function sourceBadge(source) {
  if (typeof source !== "string" || source === "") return null;
  return (
    SOURCES[source] ?? {
      text: source,
      kind: "unknown",
      title: `Token source "${source}" (not known to this dashboard).`,
    }
  );
}

const APIS = {
  openai_chat: "OpenAI chat",
  openai_completions: "OpenAI completions",
  openai_responses: "OpenAI responses",
  anthropic_messages: "Anthropic messages",
  ollama_chat: "Ollama chat",
  ollama_generate: "Ollama generate",
  llamacpp_completion: "llama.cpp completion",
  tgi_generate: "TGI generate",
  unknown: "unknown",
};

/** The API column's text, e.g. "OpenAI chat" for `openai_chat`. */
export function apiLabel(api) {
  if (typeof api !== "string" || api === "") return DASH;
  return APIS[api] ?? api.replace(/_/g, " ");
}

/** Unix ms of an RFC 3339 time, or null when it doesn't parse. */
export function parseTime(iso) {
  if (typeof iso !== "string" || iso === "") return null;
  const ms = Date.parse(iso);
  return Number.isFinite(ms) ? ms : null;
}

const timeFormats = new Map();
function timeFormat(timeZone, withDate, withSeconds) {
  const key = `${timeZone ?? ""}|${withDate}|${withSeconds}`;
  let f = timeFormats.get(key);
  if (!f) {
    // en-US with a 24-hour clock: the dashboard's text is English, and a
    // fixed locale keeps "13:37:08" the same in every browser and under
    // Tauri's WebKit (whose default locale may be "C").
    f = new Intl.DateTimeFormat("en-US", {
      timeZone,
      hourCycle: "h23",
      hour: "2-digit",
      minute: "2-digit",
      ...(withSeconds ? { second: "2-digit" } : {}),
      ...(withDate ? { month: "short", day: "numeric" } : {}),
    });
    timeFormats.set(key, f);
  }
  return f;
}

/** "YYYY-MM-DD" of `ms` in `timeZone` (local when undefined). */
function dayOf(ms, timeZone) {
  return new Intl.DateTimeFormat("en-CA", { timeZone, year: "numeric", month: "2-digit", day: "2-digit" }).format(ms);
}

/**
 * A call's time in a table: "13:37:08" on the day of `now`, "Nov 29,
 * 13:37" before (seconds matter for calls seconds apart today; the date
 * matters more for older ones). DASH when absent or unparsable. `timeZone`
 * defaults to the viewer's (tests pass "UTC").
 */
export function formatTime(iso, { now, timeZone } = {}) {
  const ms = parseTime(iso);
  if (ms === null) return DASH;
  const sameDay = Number.isFinite(now) && dayOf(ms, timeZone) === dayOf(now, timeZone);
  return sameDay ? timeFormat(timeZone, false, true).format(ms) : timeFormat(timeZone, true, false).format(ms);
}

/**
 * A full timestamp for call details: "2026-11-30 13:37:08.938" in
 * `timeZone` (the viewer's when undefined), milliseconds kept because TTFTs
 * are milliseconds. DASH when absent.
 */
export function formatTimestamp(iso, { timeZone } = {}) {
  const ms = parseTime(iso);
  if (ms === null) return DASH;
  const parts = Object.fromEntries(
    new Intl.DateTimeFormat("en-CA", {
      timeZone,
      hourCycle: "h23",
      year: "numeric",
      month: "2-digit",
      day: "2-digit",
      hour: "2-digit",
      minute: "2-digit",
      second: "2-digit",
    })
      .formatToParts(ms)
      .map((p) => [p.type, p.value]),
  );
  const millis = String(((ms % 1000) + 1000) % 1000).padStart(3, "0");
  return `${parts.year}-${parts.month}-${parts.day} ${parts.hour}:${parts.minute}:${parts.second}.${millis}`;
}

/**
 * The model column's text. A call (or a models row) that named no model
 * is shown as such, not as a dash: "named none" is a value here (the
 * History filter can select it), not a missing number.
 */
export const NO_MODEL = "(no model named)";
export function modelLabel(model) {
  return typeof model === "string" && model !== "" ? model : NO_MODEL;
}

/**
 * A fraction (0..1) as a whole percentage, rounded down so a prefill at
 * 99.6% never reads "100%" before it is done; values past the ends are
 * clamped. DASH when absent.
 */
export function formatPercent(fraction) {
  if (!isShowable(fraction)) return DASH;
  // The epsilon keeps 0.29 at "29%" (0.29 * 100 is 28.999... in binary).
  return `${Math.floor(Math.min(fraction, 1) * 100 + 1e-9)}%`;
}

/**
 * Time left, in words: "about 3 s left", "about 2 min left", "under a
 * second left". An estimate, so whole units only. DASH when absent.
 */
export function formatEta(ms) {
  if (!isShowable(ms)) return DASH;
  if (ms < 1000) return "under a second left";
  const s = Math.round(ms / 1000);
  if (s < 90) return `about ${s} s left`;
  return `about ${Math.round(s / 60)} min left`;
}

/** A size in bytes: "5.0 GB", "512 MB" (decimal units, as servers report). DASH when absent. */
export function formatBytes(bytes) {
  if (!isShowable(bytes)) return DASH;
  if (bytes >= 1e9) return `${(bytes / 1e9).toFixed(1)} GB`;
  if (bytes >= 1e6) return `${Math.round(bytes / 1e6)} MB`;
  if (bytes >= 1e3) return `${Math.round(bytes / 1e3)} kB`;
  return `${Math.round(bytes)} B`;
}
