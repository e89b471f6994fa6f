// The settings form's values to the `save_settings` payload, and the
// messages around saving. Pure. The engine validates again and is the
// authority (a 400 names the bad field); checking here only saves a round
// trip for the obvious mistakes and points at the field.

/**
 * `form` = {routes: [{name, listen, upstream}], slow_ttft_ms: string|number,
 * notifications: bool, notify_settled: bool, capture?: bool, watch_ports?:
 * string}. Returns
 * `{settings, errors}`: `errors` is a list of `{field, message}` (empty when
 * the payload can be sent). Route rows left entirely blank are dropped, so
 * an "add route" click that was not filled in does not block saving.
 */
export function settingsPayload(form) {
  const errors = [];
  const routes = [];
  const names = new Set();
  (form.routes ?? []).forEach((row, i) => {
    const name = String(row.name ?? "").trim();
    const listen = String(row.listen ?? "").trim();
    const upstream = String(row.upstream ?? "").trim();
    if (!name && !listen && !upstream) return;
    const where = `routes.${i}`;
    if (!name) errors.push({ field: `${where}.name`, message: `Route ${i + 1}: a name is required.` });
    if (!listen) errors.push({ field: `${where}.listen`, message: `Route ${i + 1}: a listen address (host:port) is required.` });
    if (!upstream) errors.push({ field: `${where}.upstream`, message: `Route ${i + 1}: an upstream URL is required.` });
    if (name && names.has(name)) {
      errors.push({ field: `${where}.name`, message: `Route ${i + 1}: the name "${name}" is used twice.` });
    }
    names.add(name);
    routes.push({ name, listen, upstream });
  });
  const rawThreshold = String(form.slow_ttft_ms ?? "").trim();
  let slow = null;
  if (!/^\d+$/.test(rawThreshold)) {
    errors.push({ field: "slow_ttft_ms", message: "Slow first token: a whole number of milliseconds." });
  } else {
    slow = Number(rawThreshold);
    // The engine refuses 0 (it would flag every call) and checks the rest.
    if (slow < 1) errors.push({ field: "slow_ttft_ms", message: "Slow first token: at least 1 ms." });
    else if (!Number.isSafeInteger(slow)) errors.push({ field: "slow_ttft_ms", message: "Slow first token: too large." });
  }
  const settings = {
    routes,
    slow_ttft_ms: slow,
    notifications: form.notifications === true,
    notify_settled: form.notify_settled === true,
  };
  // Only sent when the form has the switch (an engine without capture
  // never gets the key).
  if (typeof form.capture === "boolean") settings.capture = form.capture;
  // Likewise the watched ports, only where the engine follows the machine.
  if (typeof form.watch_ports === "string") {
    const ports = parsePorts(form.watch_ports);
    if (ports.error) errors.push({ field: "watch_ports", message: ports.error });
    else settings.watch_ports = ports.list;
  }
  return { settings, errors };
}

/**
 * "7000, 8123" (commas or spaces) to `{list: [7000, 8123]}`, each port once
 * and in order; `{error}` naming the first entry that is not a port.
 */
export function parsePorts(text) {
  const list = [];
  for (const part of String(text).split(/[\s,]+/).filter(Boolean)) {
    const port = /^\d+$/.test(part) ? Number(part) : NaN;
    if (!(port >= 1 && port <= 65535)) return { error: `Watched ports: "${part}" is not a port (1 to 65535).` };
    if (!list.includes(port)) list.push(port);
  }
  return { list };
}

/** The watched ports as the field shows them. */
export function portsText(ports) {
  return (ports ?? []).join(", ");
}

/**
 * The line shown after a successful save. `captureTurned` is "on" or "off"
 * when the save changed the capture switch (it applies at the next start,
 * like route changes).
 */
export function savedMessage(result, { captureTurned = null } = {}) {
  const where = result?.config_path ? ` to ${result.config_path}` : "";
  if (!result?.restart_required) return `Saved${where}.`;
  return captureTurned
    ? `Saved${where} — restart to turn capture ${captureTurned} (and apply any route changes).`
    : `Saved${where} — restart to apply route changes.`;
}

/**
 * The form field an engine error names, in this module's `field` spelling
 * ("routes.1.upstream", "slow_ttft_ms"), or "" when it names none the form
 * has. The engine's messages start with the field, e.g.
 * `routes[1] (extra): upstream "x" is not an http:// URL` or
 * `slow_ttft_ms: must be at most 600000`.
 */
export function errorField(message) {
  const text = String(message ?? "");
  const route = /^routes\[(\d+)\][^:]*:.*?\b(name|listen|upstream)\b/.exec(text);
  if (route) return `routes.${route[1]}.${route[2]}`;
  const top = /^(slow_ttft_ms|notifications|notify_settled|capture|watch_ports)\b/.exec(text);
  return top ? top[1] : "";
}
