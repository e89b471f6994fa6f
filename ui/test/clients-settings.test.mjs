import { test } from "node:test";
import assert from "node:assert/strict";
import { baseUrl, clientHints, hostPort, isOllama, routeLooksLikeOllama, routesForClients } from "../lib/clients.js";
import { errorField, parsePorts, portsText, savedMessage, settingsPayload } from "../lib/settings.js";

test("client hints: the exact setting for OpenAI clients", () => {
  assert.deepEqual(clientHints("http://127.0.0.1:8081"), [
    { label: "OpenAI SDK", value: "base_url=http://127.0.0.1:8081/v1" },
    { label: "Environment (OpenAI clients)", value: "OPENAI_BASE_URL=http://127.0.0.1:8081/v1" },
  ]);
  assert.equal(clientHints("http://127.0.0.1:8081/")[0].value, "base_url=http://127.0.0.1:8081/v1", "no double slash");
});

test("client hints: Ollama also gets OLLAMA_HOST as host:port", () => {
  const hints = clientHints("http://127.0.0.1:11435", { ollama: true });
  assert.deepEqual(hints[0], { label: "Ollama CLI and libraries", value: "OLLAMA_HOST=127.0.0.1:11435" });
  assert.ok(hints.some((h) => h.value === "base_url=http://127.0.0.1:11435/v1"));
});

test("host:port and base URL helpers", () => {
  assert.equal(hostPort("http://127.0.0.1:11435"), "127.0.0.1:11435");
  assert.equal(hostPort("http://[::1]:11435/"), "[::1]:11435");
  assert.equal(hostPort("not a url"), null);
  assert.equal(hostPort("ftp://x:1"), null);
  assert.equal(baseUrl("http://a:1///"), "http://a:1");
});

test("which servers and routes are Ollama", () => {
  assert.equal(isOllama("ollama"), true);
  assert.equal(isOllama("Ollama"), true);
  assert.equal(isOllama("llama_cpp"), false);
  assert.equal(routeLooksLikeOllama({ name: "ollama", upstream: "http://127.0.0.1:9" }), true);
  assert.equal(routeLooksLikeOllama({ name: "local", upstream: "http://127.0.0.1:11434" }), true);
  assert.equal(routeLooksLikeOllama({ name: "llamacpp", upstream: "http://127.0.0.1:8080" }), false);
  assert.equal(routeLooksLikeOllama({ name: "x", upstream: "garbage" }), false);
});

const form = (extra = {}) => ({
  routes: [{ name: " ollama ", listen: "127.0.0.1:11435", upstream: "http://127.0.0.1:11434 " }],
  slow_ttft_ms: "5000",
  notifications: true,
  notify_settled: false,
  ...extra,
});

test("settings payload: trimmed, typed, in the contract's shape", () => {
  const { settings, errors } = settingsPayload(form());
  assert.deepEqual(errors, []);
  assert.deepEqual(settings, {
    routes: [{ name: "ollama", listen: "127.0.0.1:11435", upstream: "http://127.0.0.1:11434" }],
    slow_ttft_ms: 5000,
    notifications: true,
    notify_settled: false,
  });
});

test("settings payload: blank route rows are dropped, half-filled ones named", () => {
  const { settings, errors } = settingsPayload(
    form({ routes: [{ name: "", listen: " ", upstream: "" }, { name: "a", listen: "", upstream: "http://x" }] }),
  );
  assert.equal(settings.routes.length, 1);
  assert.deepEqual(errors.map((e) => e.field), ["routes.1.listen"]);
  assert.match(errors[0].message, /Route 2/);
});

test("settings payload: duplicate names and a bad threshold are errors", () => {
  const dup = settingsPayload(form({ routes: [{ name: "a", listen: "1:1", upstream: "u" }, { name: "a", listen: "1:2", upstream: "u" }] }));
  assert.deepEqual(dup.errors.map((e) => e.field), ["routes.1.name"]);
  for (const bad of ["", "soon", "-5", "1.5", "5e3", "0", "99999999999999999999"]) {
    const r = settingsPayload(form({ slow_ttft_ms: bad }));
    assert.deepEqual(r.errors.map((e) => e.field), ["slow_ttft_ms"], JSON.stringify(bad));
  }
  assert.equal(settingsPayload(form({ slow_ttft_ms: 1 })).settings.slow_ttft_ms, 1);
  assert.equal(settingsPayload(form({ notifications: "yes" })).settings.notifications, false, "only true is true");
});

test("saved message says when a restart is needed", () => {
  assert.equal(savedMessage({ saved: true, restart_required: false, config_path: "/c.toml" }), "Saved to /c.toml.");
  assert.equal(
    savedMessage({ saved: true, restart_required: true, config_path: "/c.toml" }),
    "Saved to /c.toml — restart to apply route changes.",
  );
  assert.equal(savedMessage({ saved: true, restart_required: true }), "Saved — restart to apply route changes.");
});

test("engine errors are tied to the field they name", () => {
  assert.equal(errorField('routes[1] (extra): upstream "not a url" is not an http:// URL'), "routes.1.upstream");
  assert.equal(errorField("routes[0]: listen \"x\" is not host:port"), "routes.0.listen");
  assert.equal(errorField('routes[2]: the name "a" is used twice'), "routes.2.name");
  assert.equal(errorField("slow_ttft_ms: must be at least 1"), "slow_ttft_ms");
  assert.equal(errorField("could not write /etc/speedtap.toml: permission denied"), "");
  assert.equal(errorField(undefined), "");
});

test("watched ports: read from commas or spaces, each once; a non-port names itself", () => {
  assert.deepEqual(parsePorts("7000, 8123 7000"), { list: [7000, 8123] });
  assert.deepEqual(parsePorts("  "), { list: [] });
  assert.match(parsePorts("7000, 70000").error, /"70000" is not a port/);
  assert.match(parsePorts("80a").error, /"80a"/);
  assert.equal(portsText([7000, 8123]), "7000, 8123");
});

test("settings payload: watched ports only where the engine follows the machine", () => {
  assert.equal("watch_ports" in settingsPayload(form()).settings, false);
  const { settings, errors } = settingsPayload({ ...form(), watch_ports: "7000,8123" });
  assert.deepEqual(errors, []);
  assert.deepEqual(settings.watch_ports, [7000, 8123]);
  const bad = settingsPayload({ ...form(), watch_ports: "0" });
  assert.deepEqual(bad.errors.map((e) => e.field), ["watch_ports"]);
  assert.equal(errorField("watch_ports: 0 is not a port (1 to 65535)"), "watch_ports");
});

test("the demo's route is never offered to clients; real routes are", () => {
  const real = { name: "ollama", listen: "127.0.0.1:11435", upstream: "http://127.0.0.1:11434", proxy_url: "http://127.0.0.1:11435" };
  const demo = { name: "demo", listen: "127.0.0.1:40000", upstream: "http://127.0.0.1:39999", proxy_url: "http://127.0.0.1:40000", demo: true };
  assert.deepEqual(routesForClients([real, demo]), [real]);
  // A route named demo by the user is a real route: only the flag counts.
  const named = { ...real, name: "demo" };
  assert.deepEqual(routesForClients([named]), [named]);
  assert.deepEqual(routesForClients(null), []);
  assert.deepEqual(routesForClients([null, 3, demo]), []);
});
