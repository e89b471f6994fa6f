// What to tell a client so it talks through speedtap: the exact setting per
// client, from a proxy URL. Pure.

/**
 * `host:port` of a proxy URL ("http://127.0.0.1:11435" -> "127.0.0.1:11435"),
 * or null when it isn't an http(s) URL.
 */
export function hostPort(proxyUrl) {
  try {
    const u = new URL(proxyUrl);
    if (u.protocol !== "http:" && u.protocol !== "https:") return null;
    return u.host;
  } catch {
    return null;
  }
}

/** The URL without a trailing slash, so "/v1" can be appended. */
export function baseUrl(proxyUrl) {
  return String(proxyUrl).replace(/\/+$/, "");
}

/**
 * True when a server kind (discovery's `kind` or `label`) is Ollama. Matched
 * loosely on purpose: the spelling of `kind` is the engine's, and "ollama"
 * in any case is unambiguous.
 */
export function isOllama(kindOrLabel) {
  return /ollama/i.test(String(kindOrLabel ?? ""));
}

/**
 * The routes whose proxy URL may be given to clients: every route from
 * `/api/v1/routes` but the demo's (`demo: true`), which feeds its own
 * simulator.
 */
export function routesForClients(routes) {
  return (Array.isArray(routes) ? routes : []).filter((r) => r && typeof r === "object" && r.demo !== true);
}

/**
 * A route from `routes` (which has no kind): Ollama when it is named so or
 * forwards to Ollama's default port.
 */
export function routeLooksLikeOllama(route) {
  if (isOllama(route?.name)) return true;
  try {
    return new URL(route?.upstream).port === "11434";
  } catch {
    return false;
  }
}

/**
 * The settings that point clients at `proxyUrl`: a list of
 * `{label, value}`, the value being exactly what to paste. Every local
 * server speaks the OpenAI API under `/v1`, so that comes first for all;
 * Ollama also gets `OLLAMA_HOST` (its CLI and official libraries read it,
 * as host:port without a scheme).
 */
export function clientHints(proxyUrl, { ollama = false } = {}) {
  const base = baseUrl(proxyUrl);
  const hints = [
    { label: "OpenAI SDK", value: `base_url=${base}/v1` },
    { label: "Environment (OpenAI clients)", value: `OPENAI_BASE_URL=${base}/v1` },
  ];
  const hp = hostPort(base);
  if (ollama && hp) {
    hints.unshift({ label: "Ollama CLI and libraries", value: `OLLAMA_HOST=${hp}` });
  }
  return hints;
}
