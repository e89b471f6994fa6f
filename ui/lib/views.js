// Which view the window opens on, and what each view remembers while
// another is shown (its own scroll position). Pure: app.js reads the page
// and calls these.

/** The views, in the tabs' order. */
export const VIEWS = Object.freeze(["live", "history", "start", "settings"]);

/**
 * The view to open: the one the URL names, else Live once there is
 * anything to show (calls in the live list or stored calls), else Get
 * started. `hasCalls` is null while not known yet: Live until it is.
 */
export function initialView(hash, { hasCalls = null } = {}) {
  const wanted = String(hash ?? "").replace(/^#/, "");
  if (VIEWS.includes(wanted)) return wanted;
  return hasCalls === false ? "start" : "live";
}

/**
 * Each view's own scroll position: `leave(view, y)` keeps where the view
 * was, `enter(view)` says where to put it back (the top for a view never
 * shown). A view never inherits another's position.
 */
export function createScrollMemory() {
  const positions = new Map();
  return {
    leave(view, y) {
      if (VIEWS.includes(view) && Number.isFinite(y)) positions.set(view, Math.max(0, y));
    },
    enter(view) {
      return positions.get(view) ?? 0;
    },
  };
}
