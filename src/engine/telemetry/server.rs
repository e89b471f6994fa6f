//! What a model server publishes about itself, parsed from the endpoints
//! the poller reads: Ollama's `GET /api/ps` (loaded models, their size and
//! VRAM share, context length), llama-server's `GET /slots` (each slot's
//! state and prompt progress), `GET /props` (context size, slot count,
//! model) and `GET /metrics` (deferred and processing requests; vLLM's
//! `num_requests_waiting` / `num_requests_running` read the same way).
//!
//! Parsers are forgiving: a field missing or of the wrong type is left
//! unknown, never an error; a body that is not the expected shape yields
//! `None` and the poller keeps what it knew.

use serde_json::Value;

/// One model Ollama has loaded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadedModel {
    /// `name` (`qwen3:8b`).
    pub name: String,
    /// Bytes the loaded model takes.
    pub size: Option<u64>,
    /// Of those, bytes in GPU memory.
    pub size_vram: Option<u64>,
    /// The context length it was loaded with.
    pub context_length: Option<u64>,
    /// `expires_at`: when it unloads unless a call uses it, unix ms (Ollama
    /// writes its local time with its offset; a model kept forever shows
    /// a date centuries away).
    pub expires_at_ms: Option<u64>,
}

/// One llama-server slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotState {
    /// `id`.
    pub id: u64,
    /// `is_processing`.
    pub busy: bool,
    /// `id_task`: the task on the slot (or the previous one when idle).
    pub task: Option<u64>,
    /// `n_ctx` of the slot.
    pub n_ctx: Option<u64>,
    /// `n_prompt_tokens`: the task's prompt size, as the server counts it.
    pub prompt_tokens: Option<u64>,
    /// `n_prompt_tokens_processed`: how far its prefill is.
    pub prompt_processed: Option<u64>,
    /// `next_token[0].n_decoded`: output tokens so far (0: still
    /// prefilling).
    pub decoded: Option<u64>,
}

/// `/props`, the fields the poller uses.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Props {
    /// `default_generation_settings.n_ctx`.
    pub n_ctx: Option<u64>,
    /// `total_slots`.
    pub total_slots: Option<u64>,
    /// `build_info` (`b5902-bf9087f5`): the build, llama-server's version.
    pub build_info: Option<String>,
}

/// `/metrics`, the gauges the poller uses.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Queue {
    /// Requests waiting for a slot (`llamacpp:requests_deferred`,
    /// `vllm:num_requests_waiting`).
    pub deferred: Option<u64>,
    /// Requests being processed (`llamacpp:requests_processing`,
    /// `vllm:num_requests_running`).
    pub processing: Option<u64>,
}

fn count(v: Option<&Value>) -> Option<u64> {
    let v = v?;
    v.as_u64()
        .or_else(|| v.as_f64().filter(|f| *f >= 0.0).map(|f| f as u64))
}

/// `GET /api/ps`.
pub fn parse_ps(body: &[u8]) -> Option<Vec<LoadedModel>> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let models = v.get("models")?.as_array()?;
    Some(
        models
            .iter()
            .filter_map(|m| {
                let name = m
                    .get("name")
                    .or_else(|| m.get("model"))?
                    .as_str()?
                    .to_owned();
                Some(LoadedModel {
                    name,
                    size: count(m.get("size")),
                    size_vram: count(m.get("size_vram")),
                    context_length: count(m.get("context_length")),
                    expires_at_ms: m
                        .get("expires_at")
                        .and_then(Value::as_str)
                        .and_then(crate::model::time::rfc3339_offset_to_ms),
                })
            })
            .collect(),
    )
}

/// `GET /slots`.
pub fn parse_slots(body: &[u8]) -> Option<Vec<SlotState>> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let slots = v.as_array()?;
    Some(
        slots
            .iter()
            .filter_map(|s| {
                let next = s
                    .get("next_token")
                    .and_then(|n| n.as_array().and_then(|a| a.first()).or(Some(n)));
                Some(SlotState {
                    id: count(s.get("id"))?,
                    busy: s
                        .get("is_processing")
                        .and_then(Value::as_bool)
                        .unwrap_or(false),
                    task: count(s.get("id_task")),
                    n_ctx: count(s.get("n_ctx")),
                    prompt_tokens: count(s.get("n_prompt_tokens")),
                    prompt_processed: count(s.get("n_prompt_tokens_processed")),
                    decoded: next.and_then(|n| count(n.get("n_decoded"))),
                })
            })
            .collect(),
    )
}

/// `GET /props`.
pub fn parse_props(body: &[u8]) -> Option<Props> {
    let v: Value = serde_json::from_slice(body).ok()?;
    v.as_object()?;
    let props = Props {
        n_ctx: count(
            v.get("default_generation_settings")
                .and_then(|d| d.get("n_ctx")),
        ),
        total_slots: count(v.get("total_slots")),
        build_info: version_text(v.get("build_info")),
    };
    // An object with neither (another server's error object) is not
    // llama-server's properties.
    (props.n_ctx.is_some() || props.total_slots.is_some()).then_some(props)
}

/// A version string as published: trimmed, non-empty, at most 64
/// characters (it is stored with every call).
fn version_text(v: Option<&Value>) -> Option<String> {
    let text = v?.as_str()?.trim();
    (!text.is_empty()).then(|| text.chars().take(64).collect())
}

/// Ollama's `GET /api/version` and vLLM's `GET /version`: both answer
/// `{"version": "0.6.3"}`.
pub fn parse_version(body: &[u8]) -> Option<String> {
    let v: Value = serde_json::from_slice(body).ok()?;
    version_text(v.get("version"))
}

/// `GET /metrics` (Prometheus text): the queue gauges of llama-server or
/// vLLM. Labels are ignored; several series of one name are summed.
pub fn parse_metrics(body: &[u8]) -> Option<Queue> {
    let text = std::str::from_utf8(body).ok()?;
    let mut q = Queue::default();
    let mut seen = false;
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let Some((name, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let name = name.split('{').next().unwrap_or(name).trim();
        let Ok(value) = value.trim().parse::<f64>() else {
            continue;
        };
        if !value.is_finite() || value < 0.0 {
            continue;
        }
        let slot = match name {
            "llamacpp:requests_deferred" | "vllm:num_requests_waiting" => &mut q.deferred,
            "llamacpp:requests_processing" | "vllm:num_requests_running" => &mut q.processing,
            _ => continue,
        };
        *slot = Some(slot.unwrap_or(0) + value as u64);
        seen = true;
    }
    seen.then_some(q)
}

/// Ollama's names: a request for `qwen3` runs `qwen3:latest`.
pub fn same_model(requested: &str, loaded: &str) -> bool {
    fn norm(s: &str) -> String {
        let s = s.trim().to_ascii_lowercase();
        if s.contains(':') {
            s
        } else {
            format!("{s}:latest")
        }
    }
    norm(requested) == norm(loaded)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_ps_lists_loaded_models_with_their_sizes() {
        let body = br#"{"models":[{"name":"qwen3:8b","model":"qwen3:8b","size":6000,"digest":"x","details":{},"expires_at":"2026-01-01T00:00:00Z","size_vram":3000,"context_length":4096}]}"#;
        let models = parse_ps(body).unwrap();
        assert_eq!(
            models,
            vec![LoadedModel {
                name: "qwen3:8b".into(),
                size: Some(6000),
                size_vram: Some(3000),
                context_length: Some(4096),
                expires_at_ms: crate::model::time::rfc3339_to_ms("2026-01-01T00:00:00Z"),
            }]
        );
        assert_eq!(parse_ps(br#"{"models":[]}"#), Some(vec![]));
        assert_eq!(parse_ps(b"404 page not found"), None);
    }

    #[test]
    fn slots_give_state_and_prompt_progress() {
        let body = br#"[{"id":0,"n_ctx":4096,"speculative":false,"is_processing":true,"id_task":7,"n_prompt_tokens":9000,"n_prompt_tokens_processed":4500,"n_prompt_tokens_cache":0,"params":{},"next_token":[{"has_next_token":true,"n_decoded":0}]},{"id":1,"n_ctx":4096,"is_processing":false}]"#;
        let slots = parse_slots(body).unwrap();
        assert_eq!(slots.len(), 2);
        assert_eq!(slots[0].task, Some(7));
        assert_eq!(slots[0].prompt_processed, Some(4500));
        assert_eq!(slots[0].decoded, Some(0));
        assert!(slots[0].busy && !slots[1].busy);
        assert_eq!(slots[1].task, None);
    }

    #[test]
    fn props_and_metrics_give_context_slots_and_the_queue() {
        let props = parse_props(
            br#"{"default_generation_settings":{"params":{},"n_ctx":8192},"total_slots":2}"#,
        )
        .unwrap();
        assert_eq!(props.n_ctx, Some(8192));
        assert_eq!(props.total_slots, Some(2));
        let text = b"# HELP llamacpp:requests_deferred x\n# TYPE llamacpp:requests_deferred gauge\nllamacpp:requests_deferred 1\nllamacpp:requests_processing 2\n";
        assert_eq!(
            parse_metrics(text),
            Some(Queue {
                deferred: Some(1),
                processing: Some(2)
            })
        );
        let vllm = b"vllm:num_requests_waiting{model_name=\"m\"} 3.0\nvllm:num_requests_running{model_name=\"m\"} 1.0\n";
        assert_eq!(parse_metrics(vllm).unwrap().deferred, Some(3));
        assert_eq!(parse_metrics(b"other_metric 1\n"), None);
    }

    #[test]
    fn another_servers_error_object_or_a_stream_is_no_telemetry() {
        // LM Studio answers unknown paths 200 with an error object.
        let lm_studio = br#"{"error":"Unexpected endpoint or method. (GET /slots)"}"#;
        assert_eq!(parse_ps(lm_studio), None);
        assert_eq!(parse_slots(lm_studio), None);
        assert_eq!(parse_props(lm_studio), None);
        assert_eq!(parse_metrics(lm_studio), None);
        let stream = b"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n";
        assert_eq!(parse_ps(stream), None);
        assert_eq!(parse_slots(stream), None);
        assert_eq!(parse_props(stream), None);
        assert_eq!(parse_metrics(stream), None);
    }

    #[test]
    fn the_servers_version_is_read_where_each_kind_publishes_it() {
        assert_eq!(
            parse_version(br#"{"version":"0.33.2"}"#).as_deref(),
            Some("0.33.2")
        );
        assert_eq!(parse_version(br#"{"version":""}"#), None);
        assert_eq!(parse_version(b"404 page not found"), None);
        let props = parse_props(
            br#"{"default_generation_settings":{"n_ctx":4096},"total_slots":1,"build_info":"b5902-bf9087f5"}"#,
        )
        .unwrap();
        assert_eq!(props.build_info.as_deref(), Some("b5902-bf9087f5"));
    }

    #[test]
    fn a_bare_model_name_means_its_latest_tag() {
        assert!(same_model("qwen3", "qwen3:latest"));
        assert!(same_model("qwen3:8b", "qwen3:8b"));
        assert!(!same_model("qwen3:8b", "qwen3:32b"));
    }
}
