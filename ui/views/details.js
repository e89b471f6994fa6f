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
    const parts = [section("Call", "identity", list(d.identity))];
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
