// The settings form: routes, slow-first-token threshold, notifications,
// the ports to watch for model servers (where the machine is followed),
// capture. Loads with `get_settings`, saves with `save_settings`; the
// engine's answer (saved, restart required, or the bad field) is shown next
// to the form. Beside the capture switch: the capture's status, with the
// command that grants its permission when that is missing (`capture`).

import { capturedRoutesNote, captureStatus } from "../lib/capture.js";
import { describeServer } from "../lib/servers.js";
import { errorField, portsText, savedMessage, settingsPayload } from "../lib/settings.js";
import { renderCaptureStatus } from "./capture.js";
import { h } from "./dom.js";

export function mountSettings(source, doc = document) {
  const el = (id) => doc.getElementById(id);
  const form = el("settings-form");
  const rows = el("route-rows");
  const unavailable = el("settings-unavailable");
  const result = el("settings-result");
  const errors = el("settings-errors");
  const slowError = el("slow-ttft-error");
  const path = el("settings-path");
  const save = el("settings-save");
  const capture = el("capture");
  const captureBox = el("settings-capture-status");
  let loaded = false;
  /** The capture switch as loaded (null: this engine has none). */
  let loadedCapture = null;
  /** The watched ports as loaded (null: this engine doesn't follow the machine). */
  let watchPorts = null;
  /** The latest capture and servers documents, for the captured-routes line. */
  const seen = { capture: null, servers: null };

  function renderCapturedRoutes() {
    const note = capturedRoutesNote(seen.capture, seen.servers);
    el("captured-routes").textContent = note;
    el("captured-routes").hidden = !note;
  }

  function routeRow(route = { name: "", listen: "", upstream: "" }) {
    const input = (field, placeholder, value) =>
      h("input", {
        name: field,
        "data-field": field,
        placeholder,
        value,
        autocomplete: "off",
        spellcheck: "false",
        "aria-label": field,
      });
    const row = h(
      "div",
      { class: "route-row" },
      input("name", "ollama", route.name),
      input("listen", "127.0.0.1:11435", route.listen),
      input("upstream", "http://127.0.0.1:11434", route.upstream),
      h("button", { type: "button", class: "icon remove", title: "Remove this route", "aria-label": "Remove route", onclick: () => row.remove() }, "×"),
    );
    return row;
  }

  // Start at login: the tray app's, applied at once (it is a login entry,
  // not part of the config file); hidden where the source has none.
  const autostart = el("start-at-login");
  async function loadAutostart() {
    if (!source.getAutostart) return;
    try {
      const state = await source.getAutostart();
      autostart.checked = state.enabled === true;
      el("autostart-set").hidden = state.available !== true;
    } catch {
      el("autostart-set").hidden = true;
    }
  }
  autostart.addEventListener("change", async () => {
    try {
      const state = await source.setAutostart(autostart.checked);
      autostart.checked = state.enabled === true;
      el("autostart-result").textContent = state.enabled ? "speedtap starts at login." : "speedtap does not start at login.";
    } catch (err) {
      autostart.checked = !autostart.checked;
      el("autostart-result").textContent = `Not changed: ${err.message}`;
    }
  });

  function fill(settings) {
    rows.replaceChildren(...(settings.routes ?? []).map((r) => routeRow(r)));
    el("slow-ttft").value = settings.slow_ttft_ms ?? "";
    el("notifications").checked = settings.notifications === true;
    el("notify-settled").checked = settings.notify_settled === true;
    loadedCapture = typeof settings.capture === "boolean" ? settings.capture : null;
    capture.checked = loadedCapture === true;
    capture.closest("fieldset").hidden = loadedCapture === null;
    watchPorts = Array.isArray(settings.watch_ports) ? settings.watch_ports : null;
    el("watch-ports").value = portsText(watchPorts);
    el("watch-set").hidden = watchPorts === null;
    path.textContent = settings.config_path ? `saved to ${settings.config_path}` : "";
  }

  function read() {
    return {
      routes: [...rows.querySelectorAll(".route-row")].map((row) => ({
        name: row.querySelector('[data-field="name"]').value,
        listen: row.querySelector('[data-field="listen"]').value,
        upstream: row.querySelector('[data-field="upstream"]').value,
      })),
      slow_ttft_ms: el("slow-ttft").value,
      notifications: el("notifications").checked,
      notify_settled: el("notify-settled").checked,
      ...(loadedCapture === null ? {} : { capture: capture.checked }),
      ...(watchPorts === null ? {} : { watch_ports: el("watch-ports").value }),
    };
  }

  /** The servers found so far, one line each (Get started has the details). */
  function renderServers(doc) {
    seen.servers = doc;
    renderCapturedRoutes();
    const items = (doc?.servers ?? []).map((s) => {
      const d = describeServer(s);
      return h(
        "li",
        { "data-state": s.state },
        h("span", { class: "item-title" }, d.title),
        " ",
        h("span", { class: `chip ${d.chipClass}` }, d.chip),
        " ",
        h("span", { class: "muted small" }, d.subtitle),
      );
    });
    el("settings-servers").replaceChildren(...items);
  }

  async function loadServers() {
    try {
      renderServers(await source.servers());
    } catch {
      el("settings-servers").replaceChildren();
    }
  }

  async function loadCapture() {
    try {
      seen.capture = await source.capture();
      renderCapturedRoutes();
      renderCaptureStatus(captureBox, captureStatus(seen.capture));
    } catch {
      // An engine without the capture document: the switch alone.
      captureBox.replaceChildren();
    }
  }

  function showErrors(list) {
    errors.replaceChildren(...list.map((e) => h("li", { "data-field": e.field }, e.message)));
    slowError.textContent = list.find((e) => e.field === "slow_ttft_ms")?.message ?? "";
    el("watch-ports-error").textContent = list.find((e) => e.field === "watch_ports")?.message ?? "";
    form.querySelectorAll("[aria-invalid]").forEach((n) => n.removeAttribute("aria-invalid"));
    for (const e of list) {
      const m = /^routes\.(\d+)\.(\w+)$/.exec(e.field);
      const target = m
        ? rows.querySelectorAll(".route-row")[Number(m[1])]?.querySelector(`[data-field="${m[2]}"]`)
        : e.field === "slow_ttft_ms"
          ? el("slow-ttft")
          : null;
      target?.setAttribute("aria-invalid", "true");
    }
  }

  function setResult(text, kind) {
    result.textContent = text;
    result.dataset.kind = kind;
  }

  el("route-add").addEventListener("click", () => {
    const row = routeRow();
    rows.append(row);
    row.querySelector("input").focus();
  });

  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    setResult("", "");
    const { settings, errors: problems } = settingsPayload(read());
    // Blank route rows were dropped from the payload; drop them on screen
    // too, so error indexes match the rows.
    rows.querySelectorAll(".route-row").forEach((row) => {
      if ([...row.querySelectorAll("input")].every((i) => i.value.trim() === "")) row.remove();
    });
    if (problems.length) {
      showErrors(problems);
      setResult("Not saved: fix the fields marked.", "error");
      return;
    }
    showErrors([]);
    save.disabled = true;
    try {
      const answer = await source.saveSettings(settings);
      const turned =
        loadedCapture !== null && settings.capture !== loadedCapture ? (settings.capture ? "on" : "off") : null;
      setResult(savedMessage(answer, { captureTurned: turned }), answer.restart_required ? "warn" : "ok");
      if (answer.config_path) path.textContent = `saved to ${answer.config_path}`;
    } catch (err) {
      // The engine names the bad field in its message; show it as is.
      showErrors([{ field: errorField(err.message), message: err.message }]);
      setResult("Not saved.", "error");
    } finally {
      save.disabled = false;
    }
  });

  /** Loads the current settings (once; `force` reloads). */
  async function load(force = false) {
      if (loaded && !force) return;
      loaded = true;
      try {
        fill(await source.getSettings());
        await loadAutostart();
        form.hidden = false;
        unavailable.hidden = true;
        if (loadedCapture !== null) loadCapture();
        if (watchPorts !== null) loadServers();
      } catch (err) {
        form.hidden = true;
        unavailable.hidden = false;
        unavailable.textContent = err.unavailable
          ? "Settings can't be changed from this engine version. Edit the config file and restart speedtap."
          : `Could not load settings: ${err.message}`;
        if (!err.unavailable) loaded = false;
      }
  }

  return {
    load,
    /** A `servers` event: the followed list changed. */
    onServers(doc) {
      if (watchPorts !== null) renderServers(doc);
    },
    /** Adds a prefilled route row (e.g. a discovered server's suggestion). */
    async addRoute(route) {
      await load();
      if (form.hidden) return false;
      rows.append(routeRow(route));
      setResult("Route added: save to keep it.", "warn");
      return true;
    },
  };
}
