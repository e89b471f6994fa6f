import { test } from "node:test";
import assert from "node:assert/strict";
import { ENABLE_COMMAND, captureStatus, seenBy, serverLabel } from "../lib/capture.js";
import { savedMessage, settingsPayload } from "../lib/settings.js";

const GRANT = "sudo setcap cap_net_raw=eip /opt/speedtap/speedtap-capture";

test("capture on names each server and port, no client changes", () => {
  const s = captureStatus({ state: "on", routes: [{ name: "ollama", port: 11434 }], permitted: true });
  assert.equal(s.kind, "on");
  assert.equal(s.text, "Measuring every call to Ollama on 11434, no client changes.");
  assert.equal(s.command, null);
  const two = captureStatus({
    state: "on",
    routes: [
      { name: "ollama", port: 11434 },
      { name: "llamacpp", port: 8080 },
      { name: "mine", port: 9000 },
    ],
  });
  assert.equal(two.text, "Measuring every call to Ollama on 11434, llama.cpp on 8080 and mine on 9000, no client changes.");
});

test("capture without its permission shows the one grant command", () => {
  const asked = captureStatus({ state: "unavailable", reason: `needs a permission: ${GRANT}`, grant_command: GRANT });
  assert.equal(asked.kind, "unavailable");
  assert.equal(asked.command, GRANT);
  assert.match(asked.text, /restart/);
  const off = captureStatus({ state: "off", permitted: false, grant_command: GRANT });
  assert.equal(off.command, GRANT);
  assert.match(off.text, /turn on capture in Settings/);
});

test("capture off but permitted shows the command that enables it", () => {
  const s = captureStatus({ state: "off", routes: [], permitted: true });
  assert.equal(s.kind, "off");
  assert.equal(s.command, ENABLE_COMMAND);
});

test("capture that can't start for another reason says why, with no command", () => {
  const s = captureStatus({ state: "unavailable", reason: "the packet capture helper speedtap-capture was not found" });
  assert.equal(s.command, null);
  assert.equal(s.text, "Capture is off: the packet capture helper speedtap-capture was not found.");
  assert.equal(captureStatus(null).kind, "unknown");
  assert.equal(captureStatus({ state: "weird" }).text, "");
});

test("server labels come from discovery's route names", () => {
  assert.equal(serverLabel("ollama"), "Ollama");
  assert.equal(serverLabel("ollama-11500"), "Ollama");
  assert.equal(serverLabel("lmstudio"), "LM Studio");
  assert.equal(serverLabel("work-box"), "work-box");
});

test("a call says how it was seen, proxy when the field is missing", () => {
  assert.equal(seenBy({ seen_by: "capture" }).text, "capture");
  assert.equal(seenBy({ seen_by: "proxy" }).kind, "proxy");
  assert.equal(seenBy({}).kind, "proxy", "older records were all proxied");
  assert.equal(seenBy({ seen_by: "capture" }).gap, false);
  const gap = seenBy({ seen_by: "capture", capture_gap: true });
  assert.equal(gap.gap, true);
  assert.match(gap.gapTitle, /no rate/);
});

test("the settings payload carries the capture switch only when the form has it", () => {
  const base = { routes: [], slow_ttft_ms: "2000", notifications: true, notify_settled: false };
  assert.equal("capture" in settingsPayload(base).settings, false);
  assert.equal(settingsPayload({ ...base, capture: true }).settings.capture, true);
  assert.equal(settingsPayload({ ...base, capture: false }).settings.capture, false);
});

test("a save that turned capture on asks for a restart to do it", () => {
  assert.equal(
    savedMessage({ restart_required: true, config_path: "/c.toml" }, { captureTurned: "on" }),
    "Saved to /c.toml — restart to turn capture on (and apply any route changes).",
  );
  assert.equal(savedMessage({ restart_required: false }, { captureTurned: "on" }), "Saved.");
});

test("with capture on, the empty table names the captured servers instead of asking to point a client at speedtap", async () => {
  const { emptyCallsText } = await import("../lib/capture.js");
  const doc = { state: "on", routes: [{ name: "ollama", port: 11434 }, { name: "llamacpp-8080", port: 8080 }] };
  const empty = emptyCallsText(doc, null);
  assert.match(empty.text, /Measuring every call to Ollama on 11434 and llama\.cpp on 8080/);
  assert.doesNotMatch(`${empty.text} ${empty.link}`, /Point a client/);
});

test("the followed servers name the captured ones where the engine follows servers", async () => {
  const { capturedServers } = await import("../lib/capture.js");
  const servers = {
    watching: true,
    servers: [
      { name: "ollama", state: "measured", seen_by: "capture", upstream: "http://127.0.0.1:11434" },
      { name: "vllm", state: "proxied", upstream: "http://127.0.0.1:8000" },
      { name: "lmstudio", state: "down", upstream: "http://127.0.0.1:1234" },
    ],
  };
  assert.equal(capturedServers({ state: "on", routes: [] }, servers), "ollama on 11434");
});

test("with capture off or unknown the empty table asks for a client or demo traffic", async () => {
  const { emptyCallsText } = await import("../lib/capture.js");
  for (const doc of [null, { state: "off", routes: [{ name: "ollama", port: 11434 }] }, { state: "on", routes: [] }]) {
    assert.match(emptyCallsText(doc, null).link, /Point a client at speedtap/);
  }
});

test("Settings › Routes names the servers the capture measures, and says nothing when it measures none", async () => {
  const { capturedRoutesNote } = await import("../lib/capture.js");
  const capture = { state: "on", routes: [{ name: "ollama", port: 11434 }, { name: "llama-server", port: 8080 }] };
  const note = capturedRoutesNote(capture, null);
  assert.match(note, /^Also measured by the capture, with no route needed: /);
  assert.match(note, /on 11434/);
  assert.match(note, /on 8080/);
  assert.equal(capturedRoutesNote({ state: "off", routes: [] }, null), "");
  assert.equal(capturedRoutesNote(null, null), "");
});
