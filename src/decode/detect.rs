//! Which API a call speaks (from the request) and how its response body is
//! framed (from the response).
//!
//! The request decides the [`ApiKind`]: the path says which protocol, the
//! body says `model` and whether a stream was asked for. The response has
//! the last word on framing, because servers answer a streaming request
//! with a plain JSON error (`docs/protocols.md`, "HTTP transport").

use crate::decode::request_fields::RequestFields;
use crate::model::ApiKind;

/// What the request tells us about a call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestFacts {
    pub api: ApiKind,
    /// The body's top-level `model` string, when present before any cut.
    pub model: Option<String>,
    /// Whether the client asked for a stream (with each API's default).
    pub stream: bool,
}

/// Detects the API and the request's stream facts.
///
/// Only `POST` is metered (compared case-insensitively: HTTP says methods
/// are case-sensitive, but a lowercase `post` that reached the upstream
/// was still a generation call); any other method is [`ApiKind::Unknown`]. The
/// path is matched on its last segments, so route prefixes
/// (`/ollama/api/chat`) and LM Studio's `/api/v0/chat/completions` work; a
/// query string, a fragment, empty segments and a trailing `/` are
/// ignored. Routes, first match wins:
///
/// | path tail | API |
/// |---|---|
/// | `chat/completions` | [`ApiKind::OpenaiChat`] |
/// | `api/generate` | [`ApiKind::OllamaGenerate`] |
/// | `api/chat` | [`ApiKind::OllamaChat`] |
/// | `completions` | [`ApiKind::OpenaiCompletions`] |
/// | `responses` | [`ApiKind::OpenaiResponses`] |
/// | `messages` | [`ApiKind::AnthropicMessages`] |
/// | `completion` | [`ApiKind::LlamacppCompletion`] |
/// | `generate_stream`, `generate` | [`ApiKind::TgiGenerate`] |
///
/// Sub-routes (`/v1/chat/completions/input_tokens`,
/// `/v1/messages/count_tokens`), `/tokenize`, embeddings and so on are
/// `Unknown`. So is KoboldCpp's native `/api/v1/generate`: its tail is
/// `generate`, but its reply is KoboldCpp's own `{"results": [...]}`, not
/// TGI's, and mis-decoding it would meter nothing as if it were a call.
///
/// `body` is the request body as far as it is known; it may be cut
/// mid-JSON, and `model` and `stream` are still recovered when they appear
/// before the cut (see [`RequestFields`]). A body that is not a JSON object
/// yields no model, and the defaults apply: `stream` is false, except for
/// Ollama's native routes (true unless the body says `"stream": false`)
/// and TGI's `/generate_stream` (always true). The body is read for every
/// call, metered or not, so an unmetered call still reports its `model`.
pub fn detect_request(method: &str, path: &str, body: &[u8]) -> RequestFacts {
    request_facts(method, path, &RequestFields::scan(body))
}

/// [`detect_request`] with the body's fields already scanned, as the proxy
/// does while the body streams past (the body itself is never kept).
pub fn request_facts(method: &str, path: &str, fields: &RequestFields) -> RequestFacts {
    let segments = path_segments(path);
    let api = if method.eq_ignore_ascii_case("POST") {
        api_for_path(&segments)
    } else {
        ApiKind::Unknown
    };
    let stream = match api {
        ApiKind::TgiGenerate if segments.last() == Some(&"generate_stream") => true,
        ApiKind::OllamaChat | ApiKind::OllamaGenerate => fields.stream.unwrap_or(true),
        _ => fields.stream.unwrap_or(false),
    };
    RequestFacts {
        api,
        model: fields.model.clone(),
        stream,
    }
}

/// How a response body is framed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyFraming {
    /// `text/event-stream`.
    Sse,
    /// One JSON object per line (Ollama native streams).
    Ndjson,
    /// One JSON document (non-streamed replies and errors).
    Json,
    /// Anything else (`text/plain`, HTML error pages, ...): not decoded.
    Other,
}

/// Decides the framing from the response's `Content-Type` (the response
/// is the authority: error replies to streaming requests are plain JSON).
///
/// Parameters (`; charset=utf-8`) and case are ignored. `text/event-stream`
/// is SSE; `application/x-ndjson`, `application/ndjson` (and the JSON-lines
/// spellings `application/jsonl`, `application/x-jsonlines`,
/// `application/jsonlines`) are NDJSON; `application/json` and any `+json`
/// type are JSON; every other type is [`BodyFraming::Other`]. With no (or
/// an empty) content type the request decides: a streaming Ollama native
/// call is NDJSON, any other streaming call SSE, a non-streaming call JSON;
/// an [`ApiKind::Unknown`] call is `Other` since nothing will decode it.
pub fn detect_framing(
    api: ApiKind,
    request_stream: bool,
    content_type: Option<&str>,
) -> BodyFraming {
    let media_type = content_type
        .and_then(|ct| ct.split(';').next())
        .map(|t| t.trim().to_ascii_lowercase())
        .unwrap_or_default();
    match media_type.as_str() {
        "" => framing_without_content_type(api, request_stream),
        "text/event-stream" => BodyFraming::Sse,
        "application/x-ndjson"
        | "application/ndjson"
        | "application/jsonl"
        | "application/x-jsonlines"
        | "application/jsonlines" => BodyFraming::Ndjson,
        "application/json" => BodyFraming::Json,
        t if t.ends_with("+json") => BodyFraming::Json,
        _ => BodyFraming::Other,
    }
}

fn framing_without_content_type(api: ApiKind, request_stream: bool) -> BodyFraming {
    match api {
        ApiKind::Unknown => BodyFraming::Other,
        _ if !request_stream => BodyFraming::Json,
        ApiKind::OllamaChat | ApiKind::OllamaGenerate => BodyFraming::Ndjson,
        _ => BodyFraming::Sse,
    }
}

/// The path's non-empty segments, without query string or fragment.
fn path_segments(path: &str) -> Vec<&str> {
    let path = path.split(['?', '#']).next().unwrap_or_default();
    path.split('/').filter(|s| !s.is_empty()).collect()
}

/// The route table of [`detect_request`], on path segments.
fn api_for_path(segments: &[&str]) -> ApiKind {
    match segments {
        [.., "chat", "completions"] => ApiKind::OpenaiChat,
        [.., "api", "generate"] => ApiKind::OllamaGenerate,
        [.., "api", "chat"] => ApiKind::OllamaChat,
        [.., "completions"] => ApiKind::OpenaiCompletions,
        [.., "responses"] => ApiKind::OpenaiResponses,
        [.., "messages"] => ApiKind::AnthropicMessages,
        [.., "completion"] => ApiKind::LlamacppCompletion,
        [.., "generate_stream"] => ApiKind::TgiGenerate,
        [.., "api", "v1", "generate"] => ApiKind::Unknown, // KoboldCpp native
        [.., "generate"] => ApiKind::TgiGenerate,
        _ => ApiKind::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;
    use std::path::Path;
    use ApiKind::*;

    fn api(method: &str, path: &str) -> ApiKind {
        detect_request(method, path, b"{}").api
    }

    #[test]
    fn every_route() {
        let table = [
            ("/v1/chat/completions", OpenaiChat),
            ("/api/v0/chat/completions", OpenaiChat),
            ("/chat/completions", OpenaiChat),
            ("/v1/completions", OpenaiCompletions),
            ("/api/v0/completions", OpenaiCompletions),
            ("/v1/responses", OpenaiResponses),
            ("/v1/messages", AnthropicMessages),
            ("/api/chat", OllamaChat),
            ("/api/generate", OllamaGenerate),
            ("/completion", LlamacppCompletion),
            ("/generate_stream", TgiGenerate),
            ("/generate", TgiGenerate),
        ];
        for (path, expected) in table {
            assert_eq!(api("POST", path), expected, "{path}");
        }
    }

    #[test]
    fn not_metered_routes() {
        for path in [
            "/v1/chat/completions/input_tokens",
            "/v1/messages/count_tokens",
            "/tokenize",
            "/detokenize",
            "/v1/embeddings",
            "/api/embed",
            "/api/v1/chat",
            "/api/v1/generate",
            "/api/extra/generate/stream",
            "/v1/models",
            "/v1/nope",
            "/v1/chatcompletions",
            "/v1/xcompletions",
            "/",
            "",
        ] {
            assert_eq!(api("POST", path), Unknown, "{path}");
        }
    }

    #[test]
    fn only_post_is_metered() {
        for method in ["GET", "PUT", "DELETE", "OPTIONS", "HEAD"] {
            assert_eq!(api(method, "/v1/chat/completions"), Unknown, "{method}");
        }
        assert_eq!(api("post", "/v1/chat/completions"), OpenaiChat);
    }

    #[test]
    fn query_strings_prefixes_and_slashes() {
        assert_eq!(
            api("POST", "/v1/chat/completions?api-version=2024-01-01"),
            OpenaiChat
        );
        assert_eq!(api("POST", "/v1/messages?beta=true"), AnthropicMessages);
        assert_eq!(api("POST", "/v1/messages/count_tokens?beta=true"), Unknown);
        assert_eq!(api("POST", "/ollama/api/chat"), OllamaChat);
        assert_eq!(
            api("POST", "/proxy/llama/completion?x=/v1/messages"),
            LlamacppCompletion
        );
        assert_eq!(api("POST", "/tgi/generate_stream"), TgiGenerate);
        assert_eq!(
            api("POST", "/openai/deployments/x/chat/completions"),
            OpenaiChat
        );
        assert_eq!(api("POST", "/v1/chat/completions/"), OpenaiChat);
        assert_eq!(api("POST", "//v1//responses#frag"), OpenaiResponses);
        // `/api/generate` is Ollama, not TGI's `/generate`.
        assert_eq!(api("POST", "/x/api/generate"), OllamaGenerate);
    }

    #[test]
    fn stream_defaults_per_api() {
        let f = |path: &str, body: &str| detect_request("POST", path, body.as_bytes()).stream;
        assert!(!f("/v1/chat/completions", "{}"));
        assert!(f("/v1/chat/completions", r#"{"stream":true}"#));
        assert!(f("/api/chat", "{}"));
        assert!(f("/api/generate", r#"{"model":"m"}"#));
        assert!(!f("/api/chat", r#"{"stream":false}"#));
        assert!(f("/api/chat", r#"{"stream":null}"#), "null means default");
        assert!(f("/generate_stream", r#"{"stream":false}"#));
        assert!(!f("/generate", "{}"));
        assert!(!f("/completion", "{}"));
        assert!(f("/completion", r#"{"stream": true}"#));
        assert!(
            !f("/v1/chat/completions", r#"{"stream":"true"}"#),
            "not a bool"
        );
        assert!(f("/api/chat", "not json"));
        assert!(!f("/v1/messages", ""));
    }

    #[test]
    fn model_and_stream_from_the_body() {
        let facts = detect_request(
            "POST",
            "/v1/chat/completions",
            br#"{"model":"qwen3:8b","messages":[{"role":"user","content":"hi \"x\""}],"stream":true,"stream_options":{"include_usage":true}}"#,
        );
        assert_eq!(
            facts,
            RequestFacts {
                api: OpenaiChat,
                model: Some("qwen3:8b".into()),
                stream: true,
            }
        );
        let f = |body: &str| detect_request("POST", "/v1/chat/completions", body.as_bytes());
        assert_eq!(f(r#"{"model":42,"stream":true}"#).model, None);
        assert!(f(r#"{"model":42,"stream":true}"#).stream);
        assert_eq!(
            f(r#"{"model":"a\u00e9\/b"}"#).model.as_deref(),
            Some("aé/b")
        );
        assert_eq!(f(r#"["model","x"]"#).model, None);
        assert_eq!(f("\u{feff}{\"model\":\"m\"}").model.as_deref(), Some("m"));
        // Unknown routes still report what the body says.
        let facts = detect_request("POST", "/tokenize", br#"{"model":"m"}"#);
        assert_eq!((facts.api, facts.model.as_deref()), (Unknown, Some("m")));
    }

    #[test]
    fn truncated_body_keeps_what_came_before_the_cut() {
        let body = br#"{"model":"llama3.2","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"a very long prompt"}]}"#;
        let full = detect_request("POST", "/v1/chat/completions", body);
        assert_eq!(full.model.as_deref(), Some("llama3.2"));
        let after_options = body.windows(2).position(|w| w == b"},").unwrap() + 1;
        for cut in after_options..body.len() {
            let facts = detect_request("POST", "/v1/chat/completions", &body[..cut]);
            assert_eq!(facts, full, "cut at {cut}");
        }
        // Cut inside the model string: no model, defaults apply.
        let facts = detect_request("POST", "/api/chat", &body[..14]);
        assert_eq!((facts.model, facts.stream), (None, true));
        // Cut right after the model: model kept, stream still default.
        let facts = detect_request("POST", "/v1/chat/completions", &body[..21]);
        assert_eq!(
            (facts.model.as_deref(), facts.stream),
            (Some("llama3.2"), false)
        );
        // A big prompt first, `model` and `stream` last: found at any size.
        let mut big = br#"{"messages":[{"role":"user","content":""#.to_vec();
        big.resize(big.len() + 300 * 1024, b'x');
        big.extend(br#""}],"model":"m","stream":true}"#);
        let facts = detect_request("POST", "/v1/chat/completions", &big);
        assert_eq!((facts.model.as_deref(), facts.stream), (Some("m"), true));
    }

    /// A captured request: (method, path, body bytes). The capture files
    /// hold the body as JSON (`body`) or, when it was not valid JSON, as
    /// text (`body_raw`).
    fn captured_request(dir: &Path, name: &str) -> (String, String, Vec<u8>) {
        let file = std::fs::read(dir.join(format!("{name}.request.json"))).unwrap();
        let v: Value = serde_json::from_slice(&file).unwrap();
        let body = match (&v["body"], &v["body_raw"]) {
            (Value::Null, Value::String(raw)) => raw.clone().into_bytes(),
            (Value::Null, _) => Vec::new(),
            (body, _) => serde_json::to_vec(body).unwrap(),
        };
        let method = v["method"].as_str().unwrap().to_owned();
        let path = v["path"].as_str().unwrap().to_owned();
        (method, path, body)
    }

    fn fixture_dir(server: &str) -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/real")
            .join(server)
    }

    #[test]
    fn real_requests() {
        let dir = fixture_dir("llama-server");
        let (method, path, body) = captured_request(&dir, "chat_stream_include_usage");
        let facts = detect_request(&method, &path, &body);
        assert_eq!(
            facts,
            RequestFacts {
                api: OpenaiChat,
                model: Some("SmolLM2-135M-Instruct".into()),
                stream: true,
            }
        );
        // A truncated JSON body (the capture of a 500 reply).
        let (method, path, body) = captured_request(&dir, "error_bad_json_chat");
        let facts = detect_request(&method, &path, &body);
        assert_eq!((facts.api, facts.model.as_deref()), (OpenaiChat, Some("x")));
        let (method, path, body) = captured_request(&dir, "native_completion_stream");
        let facts = detect_request(&method, &path, &body);
        assert_eq!((facts.api, facts.stream), (LlamacppCompletion, true));
    }

    #[test]
    fn framing_table() {
        let f = detect_framing;
        assert_eq!(
            f(OpenaiChat, true, Some("text/event-stream")),
            BodyFraming::Sse
        );
        assert_eq!(
            f(OpenaiChat, true, Some("text/event-stream; charset=utf-8")),
            BodyFraming::Sse
        );
        assert_eq!(
            f(OllamaChat, true, Some("Text/Event-Stream")),
            BodyFraming::Sse
        );
        assert_eq!(
            f(OllamaChat, true, Some("application/x-ndjson")),
            BodyFraming::Ndjson
        );
        assert_eq!(
            f(OllamaChat, true, Some("application/ndjson")),
            BodyFraming::Ndjson
        );
        assert_eq!(
            f(OpenaiChat, true, Some("application/json; charset=utf-8")),
            BodyFraming::Json
        );
        assert_eq!(
            f(OpenaiChat, true, Some("application/problem+json")),
            BodyFraming::Json
        );
        assert_eq!(
            f(OllamaChat, true, Some("application/json")),
            BodyFraming::Json
        );
        assert_eq!(
            f(OpenaiChat, true, Some("text/plain; charset=utf-8")),
            BodyFraming::Other
        );
        assert_eq!(f(OpenaiChat, false, Some("text/html")), BodyFraming::Other);
        // No content type: the request decides.
        assert_eq!(f(OllamaChat, true, None), BodyFraming::Ndjson);
        assert_eq!(f(OllamaGenerate, true, Some("")), BodyFraming::Ndjson);
        assert_eq!(f(OllamaChat, false, None), BodyFraming::Json);
        assert_eq!(f(OpenaiChat, true, None), BodyFraming::Sse);
        assert_eq!(f(TgiGenerate, true, None), BodyFraming::Sse);
        assert_eq!(f(AnthropicMessages, false, None), BodyFraming::Json);
        assert_eq!(f(Unknown, true, None), BodyFraming::Other);
        assert_eq!(
            f(Unknown, false, Some("application/json")),
            BodyFraming::Json
        );
    }

    #[test]
    fn real_fixture_requests_and_content_types() {
        for server in ["llama-server", "llama-cpp-python"] {
            let dir = fixture_dir(server);
            let index: Value =
                serde_json::from_slice(&std::fs::read(dir.join("index.json")).unwrap()).unwrap();
            for e in index.as_array().unwrap() {
                let name = e["name"].as_str().unwrap();
                let (method, path, body) = captured_request(&dir, name);
                let facts = detect_request(&method, &path, &body);
                let ct = e["content_type"].as_str();
                let framing = detect_framing(facts.api, facts.stream, ct);
                let ct = ct.unwrap_or("");
                let expected = if ct.starts_with("text/event-stream") {
                    // Every SSE reply answered a request that asked for it.
                    assert!(facts.stream, "{server}/{name}");
                    assert_ne!(facts.api, Unknown, "{server}/{name}");
                    BodyFraming::Sse
                } else if ct.starts_with("application/json") {
                    BodyFraming::Json
                } else {
                    BodyFraming::Other
                };
                assert_eq!(framing, expected, "{server}/{name}");
            }
        }
    }
}
