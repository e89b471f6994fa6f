// Number and label formatting for the dashboard. Pure: no DOM, no clock.
//
// The one rule that runs through every function here: an absent number (not
// measured) is shown as DASH, never as 0 or a guess. The engine omits a field
// it could not measure honestly (metering-semantics.md: "An absent field was
// not measured; no consumer may read it as zero"), so `undefined`, `null`,
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

/** The status cell's text; an upstream error names its HTTP code when known. */
export function statusLabel(status, httpStatus) {
  if (typeof status !== "string" || status === "") return DASH;
  const label = STATUSES[status] ?? status.replace(/_/g, " ");
  if (status === "upstream_error" && Number.isInteger(httpStatus)) {
    return `${label} ${httpStatus}`;
  }
  return label;
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
