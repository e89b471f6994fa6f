// The global panel: whose rate "Now" is, aggregate tok/s, the calls in
// flight and streaming, hour high/low.

import { DASH } from "../lib/format.js";
import { globalPanel } from "../lib/present.js";
import { setText } from "./dom.js";

export function mountGlobal(doc = document) {
  const el = (id) => doc.getElementById(id);
  const fields = {
    now: el("g-now"),
    aggregate: el("g-aggregate"),
    active: el("g-active"),
    high: el("g-high"),
    low: el("g-low"),
  };
  const est = el("g-now-est");
  const who = el("g-now-who");
  const streaming = el("g-streaming");
  return {
    render(stats, calls) {
      const v = globalPanel(stats, calls);
      for (const [key, node] of Object.entries(fields)) {
        setText(node, v[key]);
        // Styled apart (muted) so an absent number never reads as a value.
        node.parentElement.classList.toggle("absent", v[key] === DASH);
      }
      est.hidden = !v.estimated;
      // Several models' figures are text, not one big number: smaller, wrapping.
      fields.now.parentElement.classList.toggle("per-model", v.perModel);
      setText(who, v.who);
      setText(streaming, v.streaming);
    },
  };
}
