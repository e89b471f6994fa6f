//! What a client sends for each metered API, and how it recognises the
//! first content token on the wire without speedtap's decoder.

use speedtap::model::ApiKind;
use speedtap::simulate::WORDS;

/// The request path and a minimal streaming request body for `api`, naming
/// `model` (every body names one, TGI's included: the simulator ignores
/// it, and speedtap keys route calibration on it).
pub fn request(api: ApiKind, model: &str) -> (&'static str, String) {
    let m = serde_json::to_string(model).expect("model serialises");
    let chat = r#"[{"role":"user","content":"hi"}]"#;
    match api {
        ApiKind::OpenaiChat => (
            "/v1/chat/completions",
            format!(r#"{{"model":{m},"stream":true,"messages":{chat}}}"#),
        ),
        ApiKind::OpenaiCompletions => (
            "/v1/completions",
            format!(r#"{{"model":{m},"stream":true,"prompt":"hi"}}"#),
        ),
        ApiKind::OpenaiResponses => (
            "/v1/responses",
            format!(r#"{{"model":{m},"stream":true,"input":"hi"}}"#),
        ),
        ApiKind::AnthropicMessages => (
            "/v1/messages",
            format!(r#"{{"model":{m},"stream":true,"max_tokens":4096,"messages":{chat}}}"#),
        ),
        ApiKind::OllamaChat => ("/api/chat", format!(r#"{{"model":{m},"messages":{chat}}}"#)),
        ApiKind::OllamaGenerate => ("/api/generate", format!(r#"{{"model":{m},"prompt":"hi"}}"#)),
        ApiKind::LlamacppCompletion => (
            "/completion",
            format!(r#"{{"model":{m},"stream":true,"prompt":"hi"}}"#),
        ),
        ApiKind::TgiGenerate => (
            "/generate_stream",
            format!(r#"{{"model":{m},"inputs":"hi","parameters":{{}}}}"#),
        ),
        ApiKind::Unknown => unreachable!("only metered APIs are measured"),
    }
}

/// The bytes that mark the first output token in every API's stream: the
/// simulator's token 0 is `WORDS[0]`, and every API carries it as a whole
/// JSON string (`"content":" the"`, `"text":" the"`, `"delta":" the"`, ...).
/// A deliberately naive check, independent of the decoder under test.
pub fn first_token_needle() -> Vec<u8> {
    format!("\"{}\"", WORDS[0]).into_bytes()
}
