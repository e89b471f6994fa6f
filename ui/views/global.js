// The global panel: current and aggregate tok/s, active calls, hour high/low.

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
  return {
    render(stats) {
      const v = globalPanel(stats);
      for (const [key, node] of Object.entries(fields)) {
        setText(node, v[key]);
        // Styled apart (muted) so an absent number never reads as a value.
        node.parentElement.classList.toggle("absent", v[key] === DASH);
      }
      est.hidden = !v.estimated;
    },
  };
}
