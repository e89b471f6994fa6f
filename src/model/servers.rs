//! The model servers speedtap follows on this machine (`GET
//! /api/v1/servers`): each one found, under the name its calls are filed
//! under, with how it is measured now.

use serde::{Deserialize, Serialize};

/// The product a server `kind` slug names, for people (`ollama` →
/// `Ollama`, `llama-server` → `llama.cpp`); `None` for a slug that names
/// no one product (`openai`: any OpenAI-compatible server) or an unknown
/// one.
pub fn product_name(kind: &str) -> Option<&'static str> {
    Some(match kind {
        "ollama" => "Ollama",
        "llama-server" => "llama.cpp",
        "lm-studio" => "LM Studio",
        "vllm" => "vLLM",
        "sglang" => "SGLang",
        "koboldcpp" => "KoboldCpp",
        "jan" => "Jan",
        "llamafile" => "llamafile",
        "local-ai" => "LocalAI",
        "tabbyapi" => "TabbyAPI",
        "text-generation-webui" => "text-generation-webui",
        "aphrodite" => "Aphrodite",
        "llama-swap" => "llama-swap",
        "litellm" => "LiteLLM",
        "mlx-lm" => "mlx-lm",
        "tgi" => "TGI",
        _ => return None,
    })
}

/// How a followed server is measured now.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FollowedState {
    /// Its calls are measured as clients make them (by capture, or by a
    /// configured route in front of it).
    Measured,
    /// Only calls sent through a proxy route speedtap opened for it are
    /// measured (the capture may not run).
    Proxied,
    /// Not listening now; kept with its name and history.
    Down,
    /// The user asked never to measure it.
    Ignored,
}

/// One followed server.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FollowedServer {
    /// Its route name: stable across restarts (`ollama`,
    /// `llama-server-9931`).
    pub name: String,
    /// What it is, as a slug (`ollama`, `llama-server`, `lm-studio`...).
    pub kind: String,
    /// Its base URL (`http://127.0.0.1:9931`).
    pub upstream: String,
    /// How it is measured now.
    pub state: FollowedState,
    /// How its calls are seen: `capture`, `proxy`, or absent (down,
    /// ignored).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seen_by: Option<String>,
    /// The route its calls are recorded under: its own name, or the
    /// configured route already in front of it.
    pub route: String,
    /// For a proxied server: the address clients point at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_listen: Option<String>,
    /// The owning process, where it can be read (another user's process,
    /// such as Ollama's system service, can't be).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<i32>,
    /// The owning process's name (`comm`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<String>,
    /// What the server said of itself when probed (a version), if
    /// anything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// When it was first found: Unix ms.
    pub found_at: u64,
    /// When it was last seen come or go: Unix ms.
    pub last_seen: u64,
}

/// One model a server has loaded now, and what its next call would cost:
/// warm until `expires_at`, then a cold start of about `usual_load_ms`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LoadedModelDoc {
    /// The route whose server loaded it.
    pub route: String,
    /// The model's name as the server lists it (`qwen3:32b`).
    pub model: String,
    /// When the server unloads it unless a call uses it, RFC 3339 UTC with
    /// milliseconds (Ollama `/api/ps` `expires_at`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    /// The share of the model off the GPU, 0..1, two decimals (Ollama
    /// `1 - size_vram / size`), where the server reports placement.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_share: Option<f64>,
    /// This route's usual load time for the model, once a load was seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usual_load_ms: Option<u64>,
}

/// `GET /api/v1/servers`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ServersDoc {
    /// Whether the machine is being followed at all (off in embedded
    /// engines and tests that don't ask for it).
    pub watching: bool,
    /// The ports the user named to watch (`watch_ports`).
    #[serde(default)]
    pub watch_ports: Vec<u16>,
    /// Every server found, in the order found.
    pub servers: Vec<FollowedServer>,
    /// The models loaded now on the servers the routes and the capture
    /// measure (only in `GET /api/v1/servers`, never in the `servers`
    /// event).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub loaded: Vec<LoadedModelDoc>,
}
