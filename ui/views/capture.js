// The capture's status line (lib/capture.js's `captureStatus`) as DOM: the
// sentence, and the one command to run as a copyable line. Shared by the
// Get started and Settings views.

import { copyable, h } from "./dom.js";

/** Fills `box` with `status`; an unknown status empties it. */
export function renderCaptureStatus(box, status) {
  box.dataset.kind = status.kind;
  if (!status.text) {
    box.replaceChildren();
    return;
  }
  // replaceChildren, unlike h(), would show a null child as the text "null".
  const parts = [h("p", { class: status.kind === "on" ? "" : "small" }, status.text)];
  if (status.command) parts.push(h("p", { class: "command" }, copyable(status.command)));
  box.replaceChildren(...parts);
}
