//! Which API a call speaks. The spellings are part of the contract
//! (`Call.api` in `docs/api.md`).

use serde::{Deserialize, Serialize};

/// The API family of one call, decided from the request (and confirmed by
/// the response's content type).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApiKind {
    /// `POST /v1/chat/completions` (OpenAI and every OpenAI-compatible server).
    OpenaiChat,
    /// `POST /v1/completions` (legacy completions).
    OpenaiCompletions,
    /// `POST /v1/responses`.
    OpenaiResponses,
    /// `POST /v1/messages` (Anthropic Messages).
    AnthropicMessages,
    /// `POST /api/chat` (Ollama native, NDJSON).
    OllamaChat,
    /// `POST /api/generate` (Ollama native, NDJSON).
    OllamaGenerate,
    /// `POST /completion` (llama.cpp native).
    LlamacppCompletion,
    /// `POST /generate_stream` and `POST /generate` (TGI native).
    TgiGenerate,
    /// Anything else: passed through, not metered.
    Unknown,
}

impl ApiKind {
    /// Every metered kind (all but `Unknown`).
    pub const METERED: [ApiKind; 8] = [
        ApiKind::OpenaiChat,
        ApiKind::OpenaiCompletions,
        ApiKind::OpenaiResponses,
        ApiKind::AnthropicMessages,
        ApiKind::OllamaChat,
        ApiKind::OllamaGenerate,
        ApiKind::LlamacppCompletion,
        ApiKind::TgiGenerate,
    ];

    /// The contract's spelling, e.g. `openai_chat`.
    pub fn as_str(self) -> &'static str {
        match self {
            ApiKind::OpenaiChat => "openai_chat",
            ApiKind::OpenaiCompletions => "openai_completions",
            ApiKind::OpenaiResponses => "openai_responses",
            ApiKind::AnthropicMessages => "anthropic_messages",
            ApiKind::OllamaChat => "ollama_chat",
            ApiKind::OllamaGenerate => "ollama_generate",
            ApiKind::LlamacppCompletion => "llamacpp_completion",
            ApiKind::TgiGenerate => "tgi_generate",
            ApiKind::Unknown => "unknown",
        }
    }
}

impl std::fmt::Display for ApiKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings_match_serde() {
        for k in ApiKind::METERED.into_iter().chain([ApiKind::Unknown]) {
            assert_eq!(serde_json::to_value(k).unwrap(), k.as_str());
        }
    }
}
