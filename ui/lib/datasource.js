// Where the dashboard's data comes from, chosen once at startup. The page
// is always served by the control API, and reads it over HTTP on the same
// origin with `EventSource('/api/v1/events')`:
// - browser: that alone;
// - window (the tray app's window, a process of its own showing the same
//   page, `window.__TAURI__` present): that, plus the tray app's own
//   questions (port conflicts, start at login) through its one command,
//   `app`, which the window process forwards to the tray process.
// Names and payloads are the UI contract's; everything else in the UI is
// shared. No DOM access: the globals are passed in, so both run under node.
//
// Interface:
//   kind                               "window" | "browser"
//   calls({limit, route}) ->           {calls: [Call]}
//   stats() ->                         Stats
//   statsHistory() ->                  {points: [{t, tps}]}
//   routes() ->                        {routes: [...]}
//   discover() ->                      {servers: [...]}
//   servers() ->                       {watching, servers: [FollowedServer]}
//   ignoreServer(name) ->              {watching, servers: [FollowedServer]}
//   capture() ->                       {state, routes, reason?, grant_command?, permitted?}
//   getSettings() ->                   Settings
//   saveSettings(settings) ->          {saved, restart_required, config_path}
//   startDemo() ->                     {running, route}
//   history(filter) ->                 {calls: [Call]}        (stored calls)
//   models(filter) ->                  {models: [ModelSummary]}
//   historyDepth({model, route?, since?, until?}) ->
//                                      {model, points: [{context_tokens,
//                                      tokens_per_second}], fit: {a, b, kind} | null}
//   exportFile(filter, format) ->      {url}: a download link (the engine
//                                      answers with an attachment)
//   portConflicts(), useFreePort(route), getAutostart(), setAutostart(on)
//                                      the window only (absent in a browser)
//   subscribe({speed, stats, settled, slow_first_token, prompt_truncated, servers, open, error}) -> unsubscribe()
// Every request rejects with a SourceError. `filter` is lib/history.js's:
// `{since?, until?, model?, route?, client?, limit?}`, set keys only.

import { depthFilter, exportUrl, filterQuery } from "./history.js";

/** The live event names, the same in SSE and Tauri. */
export const EVENTS = ["speed", "stats", "settled", "slow_first_token", "prompt_truncated", "servers"];

export class SourceError extends Error {
  /**
   * `unavailable`: the engine doesn't have this endpoint or command (an
   * older engine); the UI hides the feature instead of showing an error.
   */
  constructor(message, { status = null, unavailable = false } = {}) {
    super(message);
    this.name = "SourceError";
    this.status = status;
    this.unavailable = unavailable;
  }
}

export function createDataSource(globals) {
  return globals.__TAURI__ ? windowSource(globals, globals.__TAURI__) : browserSource(globals);
}

// ---- browser -------------------------------------------------------------

export function browserSource({ fetch, EventSource }, base = "") {
  async function request(method, path, body) {
    const init = { method, headers: { Accept: "application/json" } };
    if (body !== undefined) {
      // Content-Type application/json is required by the API for writes:
      // it makes a cross-origin write need a preflight, which is refused.
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    let res;
    try {
      res = await fetch(base + path, init);
    } catch (e) {
      throw new SourceError(`speedtap is not reachable (${e?.message ?? e})`);
    }
    let data = null;
    try {
      data = await res.json();
    } catch {
      data = null;
    }
    if (!res.ok) {
      const message = data && typeof data.error === "string" ? data.error : `HTTP ${res.status}`;
      // 404 on a path this UI knows means an engine without the endpoint;
      // 405 one that has the path but not the method yet.
      throw new SourceError(message, {
        status: res.status,
        unavailable: res.status === 404 || res.status === 405,
      });
    }
    if (data === null) throw new SourceError(`invalid JSON from ${path}`, { status: res.status });
    return data;
  }

  return {
    kind: "browser",
    calls({ limit, route } = {}) {
      const q = new URLSearchParams();
      if (limit !== undefined) q.set("limit", String(limit));
      if (route) q.set("route", route);
      const qs = q.toString();
      return request("GET", `/api/v1/calls${qs ? `?${qs}` : ""}`);
    },
    stats: () => request("GET", "/api/v1/stats"),
    statsHistory: () => request("GET", "/api/v1/stats/history"),
    routes: () => request("GET", "/api/v1/routes"),
    discover: () => request("GET", "/api/v1/discover"),
    servers: () => request("GET", "/api/v1/servers"),
    ignoreServer: (name) => request("POST", `/api/v1/servers/${encodeURIComponent(name)}/ignore`, {}),
    capture: () => request("GET", "/api/v1/capture"),
    getSettings: () => request("GET", "/api/v1/settings"),
    saveSettings: (settings) => request("PUT", "/api/v1/settings", settings),
    startDemo: () => request("POST", "/api/v1/demo", {}),
    history(filter = {}) {
      const qs = filterQuery(filter);
      return request("GET", `/api/v1/history${qs ? `?${qs}` : ""}`);
    },
    models(filter = {}) {
      const { limit: _ignored, ...rest } = filter;
      const qs = filterQuery(rest);
      return request("GET", `/api/v1/models${qs ? `?${qs}` : ""}`);
    },
    historyDepth(filter = {}) {
      return request("GET", `/api/v1/history/depth?${filterQuery(depthFilter(filter, filter.model))}`);
    },
    // The browser downloads the file itself (the engine answers with
    // content-disposition: attachment), so nothing is buffered in the page.
    exportFile: async (filter = {}, format = "csv") => ({ url: base + exportUrl(filter, format) }),
    subscribe(handlers) {
      const es = new EventSource(base + "/api/v1/events");
      for (const name of EVENTS) {
        es.addEventListener(name, (e) => {
          let data;
          try {
            data = JSON.parse(e.data);
          } catch {
            return; // a broken frame is dropped, not fatal
          }
          handlers[name]?.(data);
        });
      }
      // EventSource reconnects by itself; `open` after an `error` tells the
      // app to reload what it may have missed.
      es.onopen = () => handlers.open?.();
      es.onerror = () => handlers.error?.();
      return () => es.close();
    },
  };
}

// ---- the tray app's window ----------------------------------------------------

/** How Tauri says a command is missing or not granted: an older app. */
const UNKNOWN_COMMAND = /command\s+\S+\s+not\s+found|unknown command|not allowed/i;

export function windowSource(globals, tauri) {
  async function app(command, args = {}) {
    try {
      return await tauri.core.invoke("app", { command, args });
    } catch (e) {
      const message = typeof e === "string" ? e : (e?.message ?? String(e));
      throw new SourceError(message, { unavailable: UNKNOWN_COMMAND.test(message) });
    }
  }

  return {
    ...browserSource(globals),
    kind: "window",
    portConflicts: () => app("port_conflicts"),
    useFreePort: (route) => app("use_free_port", { route }),
    getAutostart: () => app("get_autostart"),
    setAutostart: (enabled) => app("set_autostart", { enabled }),
  };
}
