// The model servers speedtap follows on this machine (`GET
// /api/v1/servers`, the `servers` command and event), as Get started lists
// them: each with how it is measured now, in words. Pure.

/** Product names by the kinds the engine reports. */
const KINDS = {
  ollama: "Ollama",
  "llama-server": "llama.cpp",
  "lm-studio": "LM Studio",
  vllm: "vLLM",
  sglang: "SGLang",
  koboldcpp: "KoboldCpp",
  jan: "Jan",
  llamafile: "llamafile",
  "local-ai": "LocalAI",
  tabbyapi: "TabbyAPI",
  "text-generation-webui": "text-generation-webui",
  aphrodite: "Aphrodite",
  "llama-swap": "llama-swap",
  litellm: "LiteLLM",
  "mlx-lm": "mlx_lm",
  simulate: "speedtap simulate",
  tgi: "TGI",
  openai: "OpenAI-compatible server",
};

/** The product name of a server kind (the kind itself when unknown). */
export function kindLabel(kind) {
  return KINDS[kind] ?? String(kind ?? "");
}

/**
 * One followed server for people: `{title, subtitle, chip, chipClass,
 * note, proxyUrl}`. `proxyUrl` is set only where clients must point at
 * speedtap to be measured (a proxied server).
 */
export function describeServer(s) {
  const bits = [kindLabel(s.kind), s.version, `at ${s.upstream}`];
  if (s.process) bits.push(s.pid ? `${s.process} (pid ${s.pid})` : s.process);
  const base = { title: s.name, subtitle: bits.filter(Boolean).join(" · "), proxyUrl: null, note: null };
  switch (s.state) {
    case "measured":
      return s.route && s.route !== s.name
        ? { ...base, chip: `measured by route ${s.route}`, chipClass: "chip-ok" }
        : {
            ...base,
            chip: s.seen_by === "capture" ? "captured" : "measured",
            chipClass: "chip-ok",
            note: s.seen_by === "capture" ? "Every call to it is measured: clients need no change." : null,
          };
    case "proxied":
      return {
        ...base,
        chip: "through speedtap",
        chipClass: "chip-warn",
        proxyUrl: s.proxy_listen ? `http://${s.proxy_listen}` : null,
        note: "Calls sent straight to it aren't measured (the capture is off): point clients at",
      };
    case "down":
      return { ...base, chip: "down", chipClass: "chip-muted", note: "Not running; its history is kept under this name." };
    case "ignored":
      return { ...base, chip: "ignored", chipClass: "chip-muted" };
    default:
      return { ...base, chip: String(s.state ?? ""), chipClass: "chip-muted" };
  }
}

/** What Get started says while nothing is found yet. */
export const WAITING =
  "No model server running yet. speedtap is watching: start Ollama, LM Studio, llama-server or another server and it appears here, measured, with no restart.";
