// Where the dashboard's data comes from. Two implementations of one
// interface, chosen once at startup:
// - Tauri (the tray app's window, `window.__TAURI__` present): commands via
//   `core.invoke`, events via `event.listen`;
// - browser (served by the control API): HTTP on the same origin and
//   `EventSource('/api/v1/events')`.
// Names and payloads are the UI contract's; everything else in the UI is
// shared. No DOM access: the globals are passed in, so both run under node.
//
// Interface:
//   kind                               "tauri" | "browser"
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
//   exportFile(filter, format) ->      {url} in a browser (a download link
//                                      the page follows), {text} in Tauri
//                                      (saved by the page as a Blob)
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
  return globals.__TAURI__ ? tauriSource(globals.__TAURI__) : browserSource(globals);
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

// ---- Tauri ---------------------------------------------------------------

/** How Tauri says "no such command": the app predates the command. */
const UNKNOWN_COMMAND = /command\s+\S+\s+not\s+found|unknown command/i;

export function tauriSource(tauri) {
  async function invoke(command, args) {
    try {
      return await tauri.core.invoke(command, args);
    } catch (e) {
      const message = typeof e === "string" ? e : (e?.message ?? String(e));
      throw new SourceError(message, { unavailable: UNKNOWN_COMMAND.test(message) });
    }
  }

  return {
    kind: "tauri",
    calls({ limit, route } = {}) {
      const args = {};
      if (limit !== undefined) args.limit = limit;
      if (route) args.route = route;
      return invoke("calls", args);
    },
    stats: () => invoke("stats"),
    statsHistory: () => invoke("stats_history"),
    routes: () => invoke("routes"),
    discover: () => invoke("discover"),
    servers: () => invoke("servers"),
    ignoreServer: (name) => invoke("ignore_server", { name }),
    capture: () => invoke("capture"),
    getSettings: () => invoke("get_settings"),
    saveSettings: (settings) => invoke("save_settings", { settings }),
    startDemo: () => invoke("start_demo"),
    // The tray app's own, with no control API counterpart (a browser
    // source has none, and the page shows neither).
    portConflicts: () => invoke("port_conflicts"),
    useFreePort: (route) => invoke("use_free_port", { route }),
    getAutostart: () => invoke("get_autostart"),
    setAutostart: (enabled) => invoke("set_autostart", { enabled }),
    history: (filter = {}) => invoke("history", { filter: { ...filter } }),
    models(filter = {}) {
      const { limit: _ignored, ...rest } = filter;
      return invoke("models", { filter: rest });
    },
    historyDepth: (filter = {}) => invoke("history_depth", depthFilter(filter, filter.model)),
    async exportFile(filter = {}, format = "csv") {
      const { limit: _ignored, ...rest } = filter;
      const text = await invoke("export", { format, filter: rest });
      if (typeof text !== "string") throw new SourceError("the export command returned no text");
      return { text };
    },
    subscribe(handlers) {
      let closed = false;
      const unlisteners = [];
      const ready = Promise.all(
        EVENTS.map((name) =>
          tauri.event.listen(name, (e) => handlers[name]?.(e.payload)).then((unlisten) => {
            if (closed) unlisten();
            else unlisteners.push(unlisten);
          }),
        ),
      );
      // In-process events have no connection to open; "open" once every
      // listener is registered, so the app loads its lists after that (and
      // misses nothing in between).
      ready.then(
        () => !closed && handlers.open?.(),
        () => !closed && handlers.error?.(),
      );
      return () => {
        closed = true;
        for (const unlisten of unlisteners.splice(0)) unlisten();
      };
    },
  };
}
