// How calls made straight to a model server are measured: the passive
// capture's status line (Get started and Settings) from the engine's
// capture document (`GET /api/v1/capture`, the `capture` command), and how
// one call was seen (the calls table). Pure.

/** Display names of the route names discovery gives. */
const LABELS = {
  ollama: "Ollama",
  llamacpp: "llama.cpp",
  lmstudio: "LM Studio",
  vllm: "vLLM",
  koboldcpp: "KoboldCpp",
  jan: "Jan",
  localai: "LocalAI",
  tgi: "TGI",
};

/** The command that turns capture on for the headless engine. */
export const ENABLE_COMMAND = "speedtap run --capture";

/**
 * The product name behind a route name ("ollama" and "ollama-11500" ->
 * "Ollama"); other names are shown as they are.
 */
export function serverLabel(routeName) {
  const name = String(routeName ?? "");
  const base = name.toLowerCase().replace(/-\d+$/, "");
  return LABELS[base] ?? name;
}

/** "a", "a and b", "a, b and c". */
function joinList(items) {
  if (items.length <= 1) return items.join("");
  return `${items.slice(0, -1).join(", ")} and ${items.at(-1)}`;
}

/**
 * The capture's status for people: `{kind, text, command}`. `kind` is the
 * document's state ("on", "off", "unavailable"; "unknown" without a
 * document); `command`, when set, is the one command to run to enable it
 * (the grant command when the permission is what is missing).
 */
export function captureStatus(doc) {
  if (!doc || typeof doc !== "object") return { kind: "unknown", text: "", command: null };
  const state = ["on", "off", "unavailable"].includes(doc.state) ? doc.state : "unknown";
  if (state === "on") {
    // Several routes on one server name collapse to one mention.
    const seen = new Set();
    const parts = [];
    for (const r of doc.routes ?? []) {
      const part = `${serverLabel(r.name)} on ${r.port}`;
      if (!seen.has(part)) parts.push(part);
      seen.add(part);
    }
    const where = parts.length ? ` to ${joinList(parts)}` : "";
    return { kind: "on", text: `Measuring every call${where}, no client changes.`, command: null };
  }
  if (doc.grant_command) {
    return {
      kind: state,
      text:
        state === "unavailable"
          ? "Capture is on but lacks its permission. Run this once, then restart speedtap, to measure every call with no client changes:"
          : "Capture is off. To measure every call with no client changes, run this once, then turn on capture in Settings:",
      command: doc.grant_command,
    };
  }
  if (state === "unavailable") {
    return { kind: state, text: `Capture is off: ${doc.reason ?? "it could not start"}.`.replace(/\.\.$/, "."), command: null };
  }
  if (state === "off" && doc.permitted === true) {
    return {
      kind: state,
      text: "Capture is off. Turn it on in Settings and restart, or run this, to measure every call with no client changes:",
      command: ENABLE_COMMAND,
    };
  }
  if (state === "off") {
    return {
      kind: state,
      text: doc.reason ? `Capture is off, and could not run: ${doc.reason}` : "Capture is off.",
      command: null,
    };
  }
  return { kind: "unknown", text: "", command: null };
}

/**
 * How a call was seen, for the calls table: `{kind, text, title, gap,
 * gapTitle}`. Calls without `seen_by` (older engines, older records) were
 * seen by the proxy, the only interceptor there was.
 */
export function seenBy(call) {
  const capture = call?.seen_by === "capture";
  return {
    kind: capture ? "capture" : "proxy",
    text: capture ? "capture" : "proxy",
    title: capture
      ? "Seen by the passive capture: the client called the model server directly."
      : "Seen by the proxy: the client called a speedtap route.",
    gap: call?.capture_gap === true,
    gapTitle:
      "The capture lost packets of this call: what the server reported is kept, but no rate is shown rather than a wrong one.",
  };
}

/**
 * The servers the capture measures now, as "Ollama on 11434 and llama.cpp
 * on 8080", or "" when it measures none. The followed servers (the
 * `servers` document) name them where the engine follows servers; else the
 * capture document's routes do.
 */
export function capturedServers(captureDoc, serversDoc) {
  const parts = [];
  const add = (part) => {
    if (!parts.includes(part)) parts.push(part);
  };
  const followed = serversDoc?.watching ? serversDoc.servers ?? [] : null;
  if (followed) {
    for (const s of followed) {
      if (s.state !== "measured" || s.seen_by !== "capture") continue;
      const port = /:(\d+)\/?$/.exec(String(s.upstream ?? ""))?.[1];
      add(port ? `${s.name} on ${port}` : String(s.name));
    }
    if (parts.length) return joinList(parts);
  }
  if (captureDoc?.state !== "on") return "";
  for (const r of captureDoc.routes ?? []) add(`${serverLabel(r.name)} on ${r.port}`);
  return joinList(parts);
}

/**
 * The line under Settings › Routes naming the servers the capture measures
 * with no route of their own (so the routes list, empty or not, isn't read
 * as all that is measured), or "" when it measures none.
 */
export function capturedRoutesNote(captureDoc, serversDoc) {
  const where = capturedServers(captureDoc, serversDoc);
  return where ? `Also measured by the capture, with no route needed: ${where}.` : "";
}

/**
 * What an empty calls table says: with the capture measuring servers,
 * that calls to them show here with no client change; else how to get a
 * call in (`{text, link}`: the link's words lead to Get started).
 */
export function emptyCallsText(captureDoc, serversDoc) {
  const where = capturedServers(captureDoc, serversDoc);
  if (where) {
    return { text: `No calls yet. Measuring every call to ${where}: calls show here as they start, no client changes.`, link: "Or start demo traffic." };
  }
  return { text: "No calls yet.", link: "Point a client at speedtap or start demo traffic." };
}
