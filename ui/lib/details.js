// A call's details panel as plain data: who made the call, how it ended,
// where its time to first token went, how its rate was measured. Pure.
//
// The rule of the whole dashboard holds here more than anywhere: only what
// is present is shown. A row without a value is left out (not shown as 0 or
// a dash), since a details panel full of dashes hides the few facts there.

import {
  apiLabel,
  failureLabel,
  formatBytes,
  formatCompactCount,
  formatCount,
  formatPercent,
  formatMs,
  formatRate,
  formatSpan,
  formatTimestamp,
  isFailed,
  isShowable,
  modelLabel,
  sourceBadge,
  statusLabel,
} from "./format.js";
import { slowdownView, stalledText, waitView } from "./present.js";

/** Settled rates need this many tokens (docs/metering.md). */
export const MIN_FINAL_RATE_TOKENS = 20;

const SEGMENTS = [
  {
    key: "queue",
    field: "queued_ms",
    label: "Queued",
    title: "Waiting in the server's queue for a free slot, as speedtap saw it (the server's own queue, or a server learned to run one call at a time).",
  },
  {
    key: "load",
    field: "load_ms",
    label: "Cold load",
    title: "Loading the model before the prompt (Ollama load_duration). 0 means it was already loaded.",
  },
  {
    key: "prefill",
    field: "prefill_ms",
    label: "Prefill",
    title: "Processing the prompt (the server's prompt timings).",
  },
  {
    key: "other",
    field: "other_ms",
    label: "The rest",
    title: "Everything else before the first token: network, HTTP, the first decode step (a queue wait speedtap saw is its own part).",
  },
];

/**
 * The TTFT breakdown as the stacked bar's segments, or null when the call
 * has none (its server reported nothing about its prompt).
 *
 * Each present part (load, prefill, rest; a reported 0 is present: "the
 * model was already loaded" is a fact) becomes `{key, label, ms, text,
 * fraction, detail, title}`. Fractions are of the call's TTFT, or of the
 * parts' sum when that is larger (server clocks and rounding can put it a
 * little over) or the TTFT is unknown, so the bar never overflows.
 * `cached` names the prompt tokens the server reused, which take no time
 * and so are a note rather than a segment.
 */
export function breakdownSegments(call) {
  const server = call?.ttft_breakdown;
  const hasServer = server && typeof server === "object";
  if (!hasServer && !isShowable(call?.queued_ms)) return null;
  // The queue time is speedtap's own (kept beside the server's parts).
  const b = { ...(hasServer ? server : {}), queued_ms: call.queued_ms };
  const parts = SEGMENTS.filter((s) => isShowable(b[s.field]));
  if (parts.length === 0) return null;
  const sum = parts.reduce((acc, s) => acc + b[s.field], 0);
  const ttft = call.speed?.time_to_first_token_ms;
  const total = Math.max(sum, isShowable(ttft) ? ttft : 0);
  const segments = parts.map((s) => {
    const ms = b[s.field];
    let detail = "";
    if (s.key === "queue" && isShowable(call.queue_position)) {
      detail = `behind ${formatCount(call.queue_position)} ${call.queue_position === 1 ? "call" : "calls"}`;
    }
    if (s.key === "prefill") {
      const bits = [];
      if (isShowable(b.prefill_tokens)) bits.push(`${formatCount(b.prefill_tokens)} ${b.prefill_tokens === 1 ? "token" : "tokens"}`);
      if (isShowable(b.prefill_tokens_per_second)) bits.push(`${formatRate(b.prefill_tokens_per_second)} tok/s`);
      detail = bits.join(" · ");
    }
    return {
      key: s.key,
      label: s.label,
      ms,
      text: formatMs(ms),
      fraction: total > 0 ? ms / total : 0,
      detail,
      title: s.title,
    };
  });
  // Prefill tokens without a prefill time (a server that counts but doesn't
  // time) still say how big the prompt was.
  const prefillTokensOnly =
    !isShowable(b.prefill_ms) && isShowable(b.prefill_tokens) ? `${formatCount(b.prefill_tokens)} prompt tokens processed` : "";
  return {
    ttft: isShowable(ttft) ? formatMs(ttft) : null,
    totalMs: total,
    segments,
    cached: isShowable(b.cached_tokens)
      ? `${formatCount(b.cached_tokens)} prompt ${b.cached_tokens === 1 ? "token" : "tokens"} reused from the server's cache`
      : "",
    note: prefillTokensOnly,
  };
}

/** Why a failed call has no rate, by the failure's kind. */
const FAILURE_RATE_NOTES = {
  http: "No rate: the server answered with an error.",
  unreachable: "No rate: the server could not be reached.",
  stream_error: "No rate: the server reported an error mid-stream.",
  broke_off: "No rate: the stream broke off before it completed.",
  client_left: "No rate: the client left before the stream completed.",
};

/** Milliseconds as seconds with one decimal: "20.1 s". */
function seconds(ms) {
  return `${(ms / 1000).toFixed(1)} s`;
}

/**
 * The line that says a settled call failed: `Failed: HTTP 500 · "model 'x'
 * not found"` (the server's message, as text, when it sent one), or null
 * when it did not fail (a client that left is no failure).
 */
export function failureLine(call) {
  if (!isFailed(call)) return null;
  const message = call.failure?.message;
  const words = typeof message === "string" && message !== "" ? ` · "${message}"` : "";
  return { kind: call.failure?.kind ?? "http", text: `Failed: ${failureLabel(call)}${words}` };
}

/**
 * The line that says a settled call stalled: "Stalled 20.1 s after token
 * 40 · 30.2 tok/s without the stall", or with several stalls "Stalled 3
 * times, 25.0 s in all; the longest 20.1 s after token 40 · 30.2 tok/s
 * without the stalls". Absent parts are left out; null when it never stalled.
 */
export function stallLine(call) {
  const n = call?.stalls;
  if (!isShowable(n) || n < 1) return null;
  const longestMs = isShowable(call.longest_stall_ms) ? call.longest_stall_ms : n === 1 ? call.stalled_ms : undefined;
  const after = isShowable(call.longest_stall_after_token) ? ` after token ${formatCount(call.longest_stall_after_token)}` : "";
  const longest = isShowable(longestMs) ? `${seconds(longestMs)}${after}` : after.trim();
  let text;
  if (n === 1) {
    text = `Stalled ${longest}`.trim();
  } else {
    const total = isShowable(call.stalled_ms) ? `, ${seconds(call.stalled_ms)} in all` : "";
    text = `Stalled ${formatCount(n)} times${total}${longest ? `; the longest ${longest}` : ""}`;
  }
  const rate = call.output_tokens_per_second_excluding_stalls;
  if (isShowable(rate)) text += ` · ${formatRate(rate)} tok/s without the ${n === 1 ? "stall" : "stalls"}`;
  return text;
}

/**
 * Why the rate reads what it reads (or why there is none), in a sentence.
 * "" for a call with no snapshot (unmetered: there is nothing to explain).
 */
export function rateExplanation(call) {
  const speed = call?.speed;
  if (!speed) return "";
  const rate = speed.output_tokens_per_second;
  const inFlight = (call.status ?? "in_flight") === "in_flight" && speed.is_final !== true;
  if (inFlight) {
    return isShowable(rate)
      ? "Live: the rate over the last 2 seconds of the stream. The settled rate replaces it when the call ends."
      : "No live rate yet: it needs a few tokens first.";
  }
  if (isShowable(rate)) {
    if (speed.token_source === "server") {
      return "Settled: the server's own generation timings (tokens generated ÷ generation time).";
    }
    const count =
      speed.token_source === "provider"
        ? "the count is exact, from the API's usage receipt"
        : "the count is speedtap's estimate";
    return `Settled decode rate: (output tokens − 1) ÷ time from the first to the last output token (the first token arrived at TTFT, so it starts the span); ${count}.`;
  }
  if (call.one_burst === true) return "No rate: the output came in one burst, so its arrival says nothing about the model's speed.";
  if (call.status === "abandoned") return "No rate: the call ended before its stream completed.";
  const kind = call.failure?.kind;
  if (kind && FAILURE_RATE_NOTES[kind]) return FAILURE_RATE_NOTES[kind];
  if (call.status === "upstream_error") return "No rate: the server answered with an error.";
  return `No rate: an honest decode rate needs at least ${MIN_FINAL_RATE_TOKENS} output tokens spread over at least 0.5 s (or the server's own timings).`;
}

/**
 * What a settled call spent thinking against answering: "thought 41 s /
 * 1.8k tokens · answered in 3 s" ("~1.8k" when the count is speedtap's
 * estimate), or null when it did not reason or is still in flight. Absent
 * parts are left out.
 *
 * "answered in" runs from the first answer output to the end: the thinking
 * begins at the first output (TTFT) and lasts `reasoning_ms`, so the
 * answer began at TTFT + `reasoning_ms`. It is shown only when an answer
 * came, i.e. the call output more tokens than it reasoned (a call that
 * never answered has its thinking run to its last output).
 */
export function reasoningSplit(call) {
  const speed = call?.speed;
  if (!speed || (call.status ?? "in_flight") === "in_flight") return null;
  const ms = call.reasoning_ms;
  const tokens = call.reasoning_tokens;
  if (!isShowable(ms) && !isShowable(tokens)) return null;
  const thought = [];
  if (isShowable(ms)) thought.push(formatSpan(ms));
  if (isShowable(tokens)) {
    thought.push(`${call.reasoning_tokens_estimated === true ? "~" : ""}${formatCompactCount(tokens)} ${tokens === 1 ? "token" : "tokens"}`);
  }
  const text = `thought ${thought.join(" / ")}`;
  const answered =
    isShowable(ms) && isShowable(tokens) && isShowable(speed.output_tokens) && speed.output_tokens > tokens
      ? speed.elapsed_ms - (speed.time_to_first_token_ms ?? NaN) - ms
      : NaN;
  return isShowable(answered) ? `${text} · answered in ${formatSpan(answered)}` : text;
}

/** The flags, as the sentences the panel shows; only those set. */
export function callFlags(call) {
  const flags = [];
  if (call?.one_burst === true) {
    flags.push({ key: "one_burst", text: "Output came in one burst (no honest rate)" });
  }
  if (call?.unstreamed_reasoning === true) {
    flags.push({ key: "unstreamed_reasoning", text: "The server billed reasoning it never streamed" });
  }
  return flags;
}

/**
 * Everything the details panel shows for `call`, as `{label, value, title?}`
 * rows in groups; rows whose value is absent are left out.
 */
export function callDetails(call, { timeZone } = {}) {
  if (!call || typeof call !== "object") return null;
  const speed = call.speed ?? null;
  const status = call.status ?? "in_flight";
  const rows = (list) => list.filter((r) => r.value !== null && r.value !== undefined && r.value !== "");
  const when = (iso) => (typeof iso === "string" && iso !== "" ? formatTimestamp(iso, { timeZone }) : null);
  const showable = (v, f) => (isShowable(v) ? f(v) : null);
  const source = speed ? sourceBadge(speed.token_source) : null;

  return {
    id: call.id ?? "",
    title: call.model ? call.model : status === "in_flight" ? "Call" : modelLabel(call.model),
    status: { text: statusLabel(status, call.http_status), kind: status },
    identity: rows([
      { label: "ID", value: call.id },
      { label: "Route", value: call.route },
      { label: "Model", value: call.model },
      { label: "API", value: call.api ? apiLabel(call.api) : null, title: call.api },
      { label: "Client", value: call.client, title: "The app that made the call, from its User-Agent" },
      { label: "Server version", value: call.server_version, title: "The model server's version as it publishes it, read when it was found or restarted" },
      { label: "Started", value: when(call.started_at), title: call.started_at },
      { label: "Settled", value: when(call.settled_at), title: call.settled_at },
    ]),
    outcome: rows([
      { label: "Status", value: statusLabel(status, call.http_status) },
      { label: "HTTP status", value: Number.isInteger(call.http_status) ? String(call.http_status) : null },
      { label: "Duration", value: speed ? showable(speed.elapsed_ms, formatMs) : null },
    ]),
    ttft: speed ? showable(speed.time_to_first_token_ms, formatMs) : null,
    breakdown: breakdownSegments(call),
    output: rows([
      { label: "Output tokens", value: speed ? showable(speed.output_tokens, formatCount) : null },
      {
        label: "tok/s",
        value: speed ? showable(speed.output_tokens_per_second, (r) => `${formatRate(r)} tok/s`) : null,
      },
      { label: "Token source", value: source ? source.text : null, title: source?.title },
      { label: "Input tokens", value: showable(call.input_tokens, formatCount) },
      {
        label: "Reasoning",
        value: reasoningSplit(call),
        title: "From the first reasoning output to the first answer output, then from it to the end (docs/metering.md, Reasoning cost)",
      },
    ]),
    source: source ? { ...source } : null,
    rateNote: rateExplanation(call),
    flags: callFlags(call),
    wait: waitPanel(call),
    // A live call that streamed and went silent past its stall threshold.
    stalled: status === "in_flight" ? stalledText(speed) : null,
    // How a settled call failed, and when it stalled on the way.
    failure: status === "in_flight" ? null : failureLine(call),
    stall: status === "in_flight" ? null : stallLine(call),
    truncation: truncationWarning(call.prompt_truncated),
    // Decoded below the usual rate of its route, model and context depth.
    slowdown: slowdownView(call.slowdown, speed?.output_tokens_per_second),
    facts: callFacts(call),
  };
}

/**
 * Why the call waited for its first token: live while it still waits (the
 * snapshot's `wait`), else the last explanation before its first token
 * (the stored `wait`). `{live, heading, ...waitView}` or null.
 */
export function waitPanel(call) {
  const speed = call?.speed;
  const waiting = speed?.phase === "awaiting_first_token" && (call.status ?? "in_flight") === "in_flight" && speed.is_final !== true;
  const view = waitView(waiting ? (speed.wait ?? call.wait) : call?.wait, { past: !waiting });
  if (!view) return null;
  return { live: waiting, heading: waiting ? "Waiting for the first token" : "Before the first token", ...view };
}

/**
 * The warning for a prompt the server cut (`prompt_truncated`): both
 * numbers and the context size when known, or null. Shown at the top of
 * the panel: a model that silently read a fraction of its prompt answers
 * a different question than the one asked.
 */
export function truncationWarning(t) {
  if (!t || typeof t !== "object" || !isShowable(t.request_tokens) || !isShowable(t.server_tokens)) return null;
  const context = isShowable(t.context_size) ? ` (context ${formatCount(t.context_size)})` : "";
  return {
    headline: "The server cut the prompt",
    text: `${formatCount(t.request_tokens)} tokens sent, ${formatCount(t.server_tokens)} read${context}.`,
    hint: isShowable(t.context_size)
      ? "The model answered without the rest. Raise the context size (Ollama: num_ctx) or send a shorter prompt."
      : "The model answered without the rest. Send a shorter prompt or raise the server's context size.",
    request: t.request_tokens,
    server: t.server_tokens,
    context: isShowable(t.context_size) ? t.context_size : null,
  };
}

const PLACEMENTS = {
  gpu: { text: "GPU", title: "The whole model is in GPU memory" },
  split: { text: "split GPU / CPU", title: "Part of the model is in GPU memory, the rest runs on the CPU (slower)" },
  cpu: { text: "CPU", title: "The model runs on the CPU only" },
};

/**
 * The facts about where and how the call ran, as `{key, label, value,
 * title?, fraction?}` rows; only those the server reported:
 * context used against its size (with the fraction for a bar), speculative
 * decoding acceptance, where the model ran, cold or warm start.
 */
export function callFacts(call) {
  if (!call || typeof call !== "object") return [];
  const facts = [];
  const ctx = call.context;
  if (ctx && typeof ctx === "object" && isShowable(ctx.used)) {
    if (isShowable(ctx.size) && ctx.size > 0) {
      const fraction = ctx.used / ctx.size;
      facts.push({
        key: "context",
        label: "Context used",
        value: `${formatCount(ctx.used)} of ${formatCount(ctx.size)} tokens (${formatPercent(fraction)})`,
        title: "Prompt, cached and output tokens against the loaded context size",
        fraction: Math.min(fraction, 1),
        full: fraction >= 0.9,
      });
    } else {
      facts.push({ key: "context", label: "Context used", value: `${formatCount(ctx.used)} tokens` });
    }
  }
  const draft = call.draft;
  if (draft && typeof draft === "object" && isShowable(draft.drafted) && isShowable(draft.accepted)) {
    facts.push({
      key: "draft",
      label: "Draft acceptance",
      value:
        draft.drafted > 0
          ? `${formatPercent(draft.accepted / draft.drafted)} (${formatCount(draft.accepted)} of ${formatCount(draft.drafted)} drafted tokens)`
          : "no tokens drafted",
      title: "Speculative decoding: the share of the draft model's tokens the main model accepted",
    });
  }
  if (typeof call.placement === "string" && call.placement !== "") {
    const p = PLACEMENTS[call.placement] ?? { text: call.placement, title: "" };
    let value = p.text;
    if (isShowable(call.vram_bytes) && isShowable(call.model_bytes) && call.model_bytes > 0) {
      value += ` (${formatBytes(call.vram_bytes)} of ${formatBytes(call.model_bytes)} in VRAM)`;
    }
    facts.push({ key: "placement", label: "Ran on", value, title: p.title || undefined, kind: call.placement });
  }
  if (call.start === "cold" || call.start === "warm") {
    facts.push({
      key: "start",
      label: "Start",
      value: call.start === "cold" ? "cold (the model loaded for this call)" : "warm (the model was already loaded)",
    });
  }
  const slow = slowLimitFact(call);
  if (slow) facts.push(slow);
  return facts;
}

/**
 * The slow-first-token limit as it was applied to the call: learned from
 * its route and model's usual wait, or the route's starting limit until
 * that is learned (`docs/metering.md`); null when none applied.
 */
export function slowLimitFact(call) {
  if (!isShowable(call?.slow_after_ms)) return null;
  const learned = isShowable(call.slow_after_usual_ms);
  return {
    key: "slow_after",
    label: "Slow after",
    value: learned
      ? `${formatMs(call.slow_after_ms)} (learned from the usual ${formatMs(call.slow_after_usual_ms)} for this model and prompt)`
      : `${formatMs(call.slow_after_ms)} (the starting limit, until this model's usual is learned)`,
    title: learned
      ? "The first-token wait this call was held to: twice its usual, and at least 2 s over it; past it, a slow notification"
      : "The first-token wait this call was held to (Settings); past it, a slow notification",
  };
}
