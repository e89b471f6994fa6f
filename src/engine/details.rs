//! Pure derivations of a call's details: which app made it (from its
//! User-Agent), where its time to first token went (from the server's
//! timings), and the flags that explain a missing or odd rate.

use crate::decode::ServerTimings;
use crate::meter::limits::DRIFT_BAND;
use crate::model::TtftBreakdown;

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
    fn unstreamed_reasoning_is_a_ratio_above_the_drift_band() {
        assert!(unstreamed_reasoning(Some(2000), 55));
        assert!(!unstreamed_reasoning(Some(150), 100));
        assert!(!unstreamed_reasoning(None, 100));
        assert!(unstreamed_reasoning(Some(30), 0));
    }
}
