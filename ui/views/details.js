// The call details panel: a drawer on the right, opened by clicking a row of
// the live or the history table. What it shows (and leaves out) is decided
// by lib/details.js; this only draws it, the TTFT breakdown as a stacked bar.

import { callDetails } from "../lib/details.js";
import { h } from "./dom.js";

export function mountDetails({ onClose } = {}, doc = document) {
  const el = (id) => doc.getElementById(id);
  const aside = el("details");
  const body = el("details-body");
  const title = el("details-title");
  const sub = el("details-sub");
  /** The id shown, and the JSON drawn last (to skip identical redraws). */
  let current = null;
  let drawn = "";

  function list(rows) {
    return h(
      "dl",
      { class: "kv" },
      rows.map((r) => [h("dt", {}, r.label), h("dd", { title: r.title || undefined, "data-field": r.label }, r.value)]),
    );
  }

  function section(name, key, ...children) {
    return h("section", { class: "detail-section", "data-section": key }, h("h3", {}, name), ...children);
  }

  function breakdown(b) {
    const bar = h(
      "div",
      { class: "stack", role: "img", "aria-label": b.segments.map((s) => `${s.label} ${s.text}`).join(", ") },
      b.segments
        .filter((s) => s.fraction > 0)
        .map((s) =>
          h("span", {
            class: `seg seg-${s.key}`,
            "data-seg": s.key,
            style: `width: ${(s.fraction * 100).toFixed(2)}%`,
            title: `${s.label}: ${s.text}`,
          }),
        ),
    );
    const legend = h(
      "ul",
      { class: "legend" },
      b.segments.map((s) =>
        h(
          "li",
          { "data-seg": s.key, title: s.title },
          h("span", { class: `swatch seg-${s.key}` }),
          h("span", { class: "legend-label" }, s.label),
          h("span", { class: "legend-value" }, s.text),
          s.detail ? h("span", { class: "legend-detail muted" }, s.detail) : null,
        ),
      ),
    );
    return h(
      "div",
      { class: "breakdown", id: "details-breakdown" },
      bar,
      legend,
      b.cached ? h("p", { class: "small muted", "data-note": "cached" }, b.cached) : null,
      b.note ? h("p", { class: "small muted" }, b.note) : null,
    );
  }

  function bar(fraction, cls, label) {
    const pct = Math.max(0, Math.min(1, fraction)) * 100;
    return h(
      "div",
      { class: `meter ${cls}`, role: "progressbar", "aria-valuemin": "0", "aria-valuemax": "100", "aria-valuenow": String(Math.floor(pct + 1e-9)), "aria-label": label },
      h("span", { class: "meter-fill", style: `width: ${pct.toFixed(1)}%` }),
    );
  }

  function waitSection(w) {
    return section(
      w.heading,
      "wait",
      h(
        "p",
        { class: `wait-sentence${w.live ? " live" : ""}`, id: "details-wait", "data-wait": w.reason },
        w.sentence,
      ),
      w.progress !== null ? bar(w.progress, "wait-meter", "Prompt processed") : null,
      w.facts.length ? list(w.facts) : null,
    );
  }

  function truncationWarning(t) {
    return h(
      "div",
      { class: "warning", role: "alert", id: "details-truncated" },
      h("strong", {}, t.headline),
      h("p", { class: "warning-numbers" }, t.text),
      h("p", { class: "small" }, t.hint),
    );
  }

  function factsSection(facts) {
    return section(
      "Model and context",
      "facts",
      h(
        "dl",
        { class: "kv" },
        facts.map((f) => [
          h("dt", {}, f.label),
          h(
            "dd",
            { title: f.title || undefined, "data-field": f.label, "data-fact": f.key, "data-kind": f.kind || undefined },
            f.value,
            f.fraction !== undefined ? bar(f.fraction, `context-meter${f.full ? " full" : ""}`, "Context used") : null,
          ),
        ]),
      ),
    );
  }

  function draw(call) {
    const d = callDetails(call);
    const key = JSON.stringify(d);
    if (key === drawn) return;
    drawn = key;
    title.textContent = d.title;
    sub.replaceChildren(
      h("code", {}, d.id),
      " ",
      h("span", { class: "status", "data-status": d.status.kind }, d.status.text),
    );
    const parts = [];
    if (d.truncation) parts.push(truncationWarning(d.truncation));
    if (d.stalled) {
      parts.push(
        h("p", { class: "stalled-line", id: "details-stalled", title: "No output for longer than max(3 s, 10× this call's median gap between outputs)" }, `Stalled: ${d.stalled.replace(/^stalled /, "")} without output`),
      );
    }
    if (d.failure) {
      parts.push(h("p", { class: "failed-line", id: "details-failed", "data-kind": d.failure.kind, role: "status" }, d.failure.text));
    }
    if (d.stall) {
      parts.push(h("p", { class: "stall-line", id: "details-stall", title: "Output stopped mid-stream for longer than this call's stall threshold, then went on" }, d.stall));
    }
    if (d.wait?.live) parts.push(waitSection(d.wait));
    parts.push(section("Call", "identity", list(d.identity)));
    if (d.outcome.length) parts.push(section("Outcome", "outcome", list(d.outcome)));
    if (d.ttft || d.breakdown) {
      parts.push(
        section(
          "Time to first token",
          "ttft",
          d.ttft ? h("p", { class: "big", id: "details-ttft" }, d.ttft) : null,
          d.breakdown ? breakdown(d.breakdown) : null,
        ),
      );
    }
    if (d.wait && !d.wait.live) parts.push(waitSection(d.wait));
    if (d.output.length || d.rateNote) {
      parts.push(
        section(
          "Output",
          "output",
          d.output.length ? list(d.output) : null,
          d.rateNote ? h("p", { class: "small muted note", id: "details-rate-note" }, d.rateNote) : null,
        ),
      );
    }
    if (d.slowdown) {
      parts.push(
        section(
          "Slower than usual",
          "slowdown",
          h("p", { class: "slowdown-sentence", id: "details-slowdown" }, d.slowdown.sentence),
          h("ul", { class: "slowdown-causes" }, d.slowdown.causes.map((c) => h("li", {}, c))),
        ),
      );
    }
    if (d.facts.length) parts.push(factsSection(d.facts));
    if (d.flags.length) {
      parts.push(
        section(
          "Flags",
          "flags",
          h("ul", { class: "flags" }, d.flags.map((f) => h("li", { "data-flag": f.key }, f.text))),
        ),
      );
    }
    body.replaceChildren(...parts);
  }

  function close() {
    if (aside.hidden) return;
    aside.hidden = true;
    current = null;
    drawn = "";
    onClose?.();
  }

  el("details-close").addEventListener("click", close);
  doc.addEventListener("keydown", (e) => {
    if (e.key === "Escape" && !aside.hidden) close();
  });

  return {
    /** Opens the panel on `call` (a Call as the API sends it). */
    open(call) {
      current = call.id;
      drawn = "";
      draw(call);
      aside.hidden = false;
      aside.scrollTop = 0;
    },
    /** Redraws with a newer record of the open call (live updates). */
    update(call) {
      if (call && call.id === current && !aside.hidden) draw(call);
    },
    close,
    get openId() {
      return aside.hidden ? null : current;
    },
  };
}
