//! Pure derivations of a call's details: which app made it (from its
//! User-Agent), where its time to first token went (from the server's
//! timings), the flags that explain a missing or odd rate, a cut prompt,
//! and a refusal about the context size.

use crate::decode::ServerTimings;
use crate::meter::limits::DRIFT_BAND;
use crate::model::wait::thousands;
use crate::model::{PromptTruncation, TtftBreakdown};

/// The most of an error body read for its cause (a refusal is a short
/// JSON object).
pub const MAX_ERROR_BODY: usize = 4_096;

/// The clear cause of a refusal about the prompt's size, from the
/// server's error body: llama-server's `exceed_context_size_error` (with
/// `n_prompt_tokens` and `n_ctx`), Ollama's "the prompt is longer than the
/// context length", vLLM's "maximum context length". `None` for any other
/// error. Only numbers are taken from the body; the sentence is ours.
pub fn context_refusal(body: &[u8]) -> Option<String> {
    let body = &body[..body.len().min(MAX_ERROR_BODY)];
    let text = String::from_utf8_lossy(body).to_ascii_lowercase();
    const SIGNS: [&str; 7] = [
        "exceed_context_size",
        "exceeds the available context",
        "longer than the context",
        "maximum context length",
        "context length exceeded",
        "context_length_exceeded",
        "too many tokens",
    ];
    if !SIGNS.iter().any(|s| text.contains(s)) {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    let err = v.get("error").unwrap_or(&v);
    let n = |k: &str| err.get(k).and_then(serde_json::Value::as_u64);
    Some(match (n("n_prompt_tokens"), n("n_ctx")) {
        (Some(p), Some(c)) => format!(
            "the prompt ({} tokens) is over the server's context size ({} tokens)",
            thousands(p),
            thousands(c)
        ),
        (None, Some(c)) => format!(
            "the prompt is over the server's context size ({} tokens)",
            thousands(c)
        ),
        _ => "the prompt is over the server's context size".to_owned(),
    })
}

/// Whether the server cut the prompt, from the server's own numbers only
/// (`docs/metering.md`, "Truncation"): its prompt count (processed plus
/// cached) reached its own context size, so the prompt filled the whole
/// context and was cut to fit it (Ollama cuts to `num_ctx` silently).
/// speedtap's estimate of the request never decides: an estimate from
/// the body's bytes can be off by a factor of two or three, and an alarm
/// must not rest on a guess. It is only carried along, labelled, as what
/// the request held, and never below what the server read (a request
/// holds at least the tokens the server took from it).
pub fn truncation(
    server: Option<u64>,
    context_size: Option<u64>,
    estimate: Option<u64>,
) -> Option<PromptTruncation> {
    let (server, context) = (server?, context_size?);
    (context > 0 && server >= context).then(|| PromptTruncation {
        request_tokens: estimate.unwrap_or(0).max(server),
        server_tokens: server,
        context_size: Some(context),
    })
}

/// Whether the server's prompt count is the whole prompt, so it may teach
/// the prompt calibration: a count that reached the context size is the
/// context's size, not the prompt's. Nothing else keeps a call from
/// teaching, so no flag can freeze the calibration.
pub fn count_is_whole_prompt(server: u64, context_size: Option<u64>) -> bool {
    context_size.is_none_or(|c| server < c)
}

/// The app behind a User-Agent, as a short stable name: `openai-python`,
/// `openai-node`, `anthropic-python`, `ollama-python`, `ollama-js`,
/// `curl`, `browser`... Unknown agents give their first product token
/// (`MyApp/1.2 (x)` → `MyApp`), so a filter still groups them. Version
/// numbers are dropped: they split one app into many rows.
pub fn client_app(user_agent: &str) -> Option<String> {
    let ua = user_agent.trim();
    if ua.is_empty() {
        return None;
    }
    let lower = ua.to_ascii_lowercase();
    const KNOWN: &[(&str, &str)] = &[
        ("openai/python", "openai-python"),
        ("openai/js", "openai-node"),
        ("anthropic/python", "anthropic-python"),
        ("anthropic/js", "anthropic-node"),
        ("ollama-python", "ollama-python"),
        ("ollama-js", "ollama-js"),
        ("ollama/", "ollama-cli"),
        ("litellm", "litellm"),
        ("langchain", "langchain"),
        ("llama-index", "llama-index"),
        ("open-webui", "open-webui"),
        ("librechat", "librechat"),
        ("continue", "continue"),
        ("aider", "aider"),
        ("curl/", "curl"),
        ("wget/", "wget"),
        ("python-requests", "python-requests"),
        ("python-httpx", "python-httpx"),
        ("aiohttp", "aiohttp"),
        ("go-http-client", "go-http-client"),
        ("node-fetch", "node-fetch"),
        ("undici", "node"),
        ("mozilla/", "browser"),
    ];
    if let Some((_, name)) = KNOWN.iter().find(|(needle, _)| lower.contains(needle)) {
        return Some((*name).to_owned());
    }
    let product = ua
        .split(|c: char| c == '/' || c.is_whitespace())
        .next()
        .unwrap_or(ua);
    let product: String = product
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        .take(40)
        .collect();
    (!product.is_empty()).then_some(product)
}

/// Splits a TTFT into load, prefill and the rest, from what the server
/// reported. `None` when the server reported nothing about its prompt.
/// The rest is clamped at zero: server clocks start after the request
/// arrived, so load + prefill can't honestly exceed the client-side TTFT,
/// and when they do (rounding, clock granularity) the rest is 0, not
/// negative.
pub fn ttft_breakdown(ttft_ms: Option<u64>, timings: &ServerTimings) -> Option<TtftBreakdown> {
    if timings.prompt_ms.is_none() && timings.load_ms.is_none() && timings.prompt_tokens.is_none() {
        return None;
    }
    let prefill_tokens_per_second = match (timings.prompt_tokens, timings.prompt_ms) {
        (Some(n), Some(ms)) if n > 0 && ms > 0.0 => Some(round1(n as f64 / ms * 1000.0)),
        _ => None,
    };
    let server_part = timings.load_ms.unwrap_or(0.0) + timings.prompt_ms.unwrap_or(0.0);
    let other_ms = ttft_ms.map(|t| round1((t as f64 - server_part).max(0.0)));
    Some(TtftBreakdown {
        load_ms: timings.load_ms.map(round1),
        prefill_ms: timings.prompt_ms.map(round1),
        prefill_tokens: timings.prompt_tokens,
        cached_tokens: timings.cached_tokens,
        prefill_tokens_per_second,
        other_ms,
    })
}

/// The breakdown with the call's queue time taken out of "the rest": the
/// server's clocks start when it takes the call in, so a queue wait is
/// part of `other_ms` until it is counted on its own.
pub fn without_queue(mut b: TtftBreakdown, queued_ms: Option<u64>) -> TtftBreakdown {
    if let (Some(other), Some(queued)) = (b.other_ms, queued_ms) {
        b.other_ms = Some(round1((other - queued as f64).max(0.0)));
    }
    b
}

/// True when the billed output is far above what the stream showed: the
/// server reasoned without streaming it (ratio above the drift band).
pub fn unstreamed_reasoning(exact: Option<u64>, raw_estimate: u64) -> bool {
    match exact {
        Some(exact) if raw_estimate > 0 => exact as f64 / raw_estimate as f64 > *DRIFT_BAND.end(),
        Some(exact) => exact > 0 && raw_estimate == 0,
        None => false,
    }
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_clients_get_stable_names() {
        let cases = [
            ("OpenAI/Python 1.54.0", Some("openai-python")),
            ("AsyncOpenAI/Python 1.54.0", Some("openai-python")),
            ("OpenAI/JS 4.67.3", Some("openai-node")),
            (
                "ollama-python/0.4.4 (x86_64 linux) Python/3.11.7",
                Some("ollama-python"),
            ),
            ("curl/7.88.1", Some("curl")),
            ("Mozilla/5.0 (X11; Linux x86_64)", Some("browser")),
            ("MyApp/1.2 (compatible)", Some("MyApp")),
            ("  ", None),
        ];
        for (ua, want) in cases {
            assert_eq!(client_app(ua).as_deref(), want, "{ua}");
        }
    }

    #[test]
    fn breakdown_from_ollama_and_llamacpp_numbers() {
        // Ollama: load 534.99 ms, prompt 26 tokens in 107.35 ms; TTFT 700.
        let ollama = ServerTimings {
            load_ms: Some(534.986708),
            prompt_ms: Some(107.345),
            prompt_tokens: Some(26),
            ..ServerTimings::default()
        };
        let b = ttft_breakdown(Some(700), &ollama).unwrap();
        assert_eq!(b.load_ms, Some(535.0));
        assert_eq!(b.prefill_ms, Some(107.3));
        assert_eq!(b.prefill_tokens_per_second, Some(242.2));
        assert_eq!(b.other_ms, Some(57.7));
        // llama.cpp: 1 prompt token in 19.517 ms, 37 cached; TTFT 23 ms.
        let llama = ServerTimings {
            prompt_ms: Some(19.517),
            prompt_tokens: Some(1),
            cached_tokens: Some(37),
            ..ServerTimings::default()
        };
        let b = ttft_breakdown(Some(23), &llama).unwrap();
        assert_eq!(b.cached_tokens, Some(37));
        assert_eq!(b.prefill_tokens_per_second, Some(51.2));
        assert_eq!(b.other_ms, Some(3.5));
        // Server time above the client's TTFT: the rest is 0, not negative.
        assert_eq!(
            ttft_breakdown(Some(10), &llama).unwrap().other_ms,
            Some(0.0)
        );
        assert_eq!(ttft_breakdown(Some(10), &ServerTimings::default()), None);
    }

    #[test]
    fn a_refusal_about_the_context_names_both_numbers() {
        let llama = br#"{"error":{"code":400,"message":"request (5031 tokens) exceeds the available context size (2048 tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":5031,"n_ctx":2048}}"#;
        assert_eq!(
            context_refusal(llama).as_deref(),
            Some("the prompt (5,031 tokens) is over the server's context size (2,048 tokens)")
        );
        let ollama = br#"{"error":"the prompt is longer than the context length currently available to the model"}"#;
        assert_eq!(
            context_refusal(ollama).as_deref(),
            Some("the prompt is over the server's context size")
        );
        assert_eq!(context_refusal(br#"{"error":"model not found"}"#), None);
    }

    #[test]
    fn a_cut_prompt_is_a_server_count_that_reached_its_context() {
        // Ollama: 2,048 read, context 2,048: cut, whatever the estimate.
        let t = truncation(Some(2_048), Some(2_048), Some(9_000)).unwrap();
        assert_eq!(t.server_tokens, 2_048);
        assert_eq!(t.context_size, Some(2_048));
        assert_eq!(t.request_tokens, 9_000);
        // An estimate below the count is not shown as what was sent: the
        // request held at least what the server read.
        let low = truncation(Some(2_048), Some(2_048), Some(1_000)).unwrap();
        assert_eq!(low.request_tokens, 2_048);
        assert_eq!(
            truncation(Some(2_048), Some(2_048), None)
                .unwrap()
                .request_tokens,
            2_048
        );
    }

    #[test]
    fn an_estimate_far_above_the_servers_count_raises_no_flag() {
        // The issue's case: 46,533 estimated, 18,631 read, context 131,072.
        assert_eq!(truncation(Some(18_631), Some(131_072), Some(46_533)), None);
        // 5,109 estimated, 1,553 read, context 4,096.
        assert_eq!(truncation(Some(1_553), Some(4_096), Some(5_109)), None);
        // An estimate over the context, the server's count under it.
        assert_eq!(truncation(Some(3_000), Some(4_096), Some(90_000)), None);
        // Without the server's context size there is no evidence at all.
        assert_eq!(truncation(Some(9_000), None, Some(90_000)), None);
        assert_eq!(truncation(None, Some(2_048), Some(90_000)), None);
    }

    #[test]
    fn only_a_count_at_the_context_size_keeps_a_call_from_teaching_the_prompt_factor() {
        assert!(count_is_whole_prompt(1_553, Some(4_096)));
        assert!(count_is_whole_prompt(1_553, None));
        assert!(!count_is_whole_prompt(4_096, Some(4_096)));
    }

    #[test]
    fn unstreamed_reasoning_is_a_ratio_above_the_drift_band() {
        assert!(unstreamed_reasoning(Some(2000), 55));
        assert!(!unstreamed_reasoning(Some(150), 100));
        assert!(!unstreamed_reasoning(None, 100));
        assert!(unstreamed_reasoning(Some(30), 0));
    }
}
