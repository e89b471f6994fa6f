//! Demo traffic, so a new user sees speedtap work before pointing a client
//! at it: the built-in simulator behind a `demo` route, and a minute of
//! mixed calls through that route (every protocol, reasoning, tool-less
//! answers, fast and slow models, a slow first token now and then).
//!
//! Its calls are demo calls (`demo: true`, see `EngineLink::mark_demo_route`)
//! and every one names a model under `demo/`, so nothing of the demo can be
//! mistaken for, or merged with, a real model's calls.

use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// How many calls one demo run makes, and how far apart they start.
pub const DEMO_CALLS: usize = 24;
pub const DEMO_SPACING: Duration = Duration::from_millis(2_500);

/// One scripted demo call.
#[derive(Clone, Debug, PartialEq)]
pub struct DemoCall {
    pub path: &'static str,
    pub body: String,
    pub ttft_ms: u64,
    pub tps: u64,
    pub tokens: u64,
    pub reasoning: u64,
    pub server_timings: bool,
}

/// The demo schedule: deterministic, so a demo looks the same every time.
pub fn schedule() -> Vec<DemoCall> {
    const MODELS: [&str; 4] = [
        "demo/qwen3:8b",
        "demo/llama3.2:3b",
        "demo/gemma3:4b",
        "demo/deepseek-r1:7b",
    ];
    const TTFT: [u64; 6] = [180, 420, 900, 260, 2_600, 350];
    const TPS: [u64; 5] = [42, 28, 75, 110, 18];
    const TOKENS: [u64; 3] = [90, 160, 240];
    (0..DEMO_CALLS)
        .map(|i| {
            let model = MODELS[i % MODELS.len()];
            let (path, body) = match i % 8 {
                0 => ("/v1/chat/completions", format!(r#"{{"model":"{model}","stream":true,"stream_options":{{"include_usage":true}},"messages":[{{"role":"user","content":"demo"}}]}}"#)),
                1 => ("/api/chat", format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":"demo"}}]}}"#)),
                2 => ("/v1/messages", format!(r#"{{"model":"{model}","stream":true,"max_tokens":512,"messages":[{{"role":"user","content":"demo"}}]}}"#)),
                3 => ("/v1/completions", format!(r#"{{"model":"{model}","stream":true,"prompt":"demo"}}"#)),
                4 => ("/v1/responses", format!(r#"{{"model":"{model}","stream":true,"input":"demo"}}"#)),
                5 => ("/completion", format!(r#"{{"model":"{model}","prompt":"demo","stream":true}}"#)),
                6 => ("/api/generate", format!(r#"{{"model":"{model}","prompt":"demo"}}"#)),
                _ => ("/generate_stream", format!(r#"{{"model":"{model}","inputs":"demo"}}"#)),
            };
            DemoCall {
                path,
                body,
                ttft_ms: TTFT[i % TTFT.len()],
                tps: TPS[i % TPS.len()],
                tokens: TOKENS[i % TOKENS.len()],
                reasoning: if model.starts_with("demo/deepseek") || i % 5 == 4 { 60 } else { 0 },
                server_timings: i % 3 == 1,
            }
        })
        .collect()
}

/// Sends the demo schedule through `proxy` (e.g. `http://127.0.0.1:PORT`),
/// one call every [`DEMO_SPACING`], each read to its end.
pub async fn run_traffic(proxy: String) {
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    let mut calls = tokio::task::JoinSet::new();
    for call in schedule() {
        let client = client.clone();
        let url = format!("{proxy}{}", call.path);
        calls.spawn(async move {
            let req = Request::post(url)
                .header("content-type", "application/json")
                .header("x-sim-ttft-ms", call.ttft_ms.to_string())
                .header("x-sim-tps", call.tps.to_string())
                .header("x-sim-tokens", call.tokens.to_string())
                .header("x-sim-reasoning", call.reasoning.to_string())
                .header("x-sim-server-timings", call.server_timings.to_string())
                .body(Full::new(Bytes::from(call.body)));
            let Ok(req) = req else { return };
            if let Ok(resp) = client.request(req).await {
                let _ = resp.into_body().collect().await;
            }
        });
        tokio::time::sleep(DEMO_SPACING).await;
    }
    while calls.join_next().await.is_some() {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::detect::detect_request;
    use crate::model::ApiKind;

    #[test]
    fn the_schedule_covers_every_protocol_and_a_slow_first_token() {
        let calls = schedule();
        assert_eq!(calls.len(), DEMO_CALLS);
        let mut apis: Vec<ApiKind> = calls
            .iter()
            .map(|c| detect_request("POST", c.path, c.body.as_bytes()).api)
            .collect();
        apis.sort_by_key(|a| a.as_str());
        apis.dedup();
        assert_eq!(apis.len(), 8, "{apis:?}");
        assert!(calls.iter().any(|c| c.ttft_ms > 2_000));
        assert!(calls.iter().any(|c| c.reasoning > 0));
        for c in &calls {
            assert!(
                serde_json::from_str::<serde_json::Value>(&c.body).is_ok(),
                "{}",
                c.body
            );
        }
    }

    #[test]
    fn every_demo_call_names_a_model_under_demo() {
        for c in schedule() {
            let model = detect_request("POST", c.path, c.body.as_bytes()).model;
            assert!(
                model.as_deref().is_some_and(|m| m.starts_with("demo/")),
                "{} {}: {model:?}",
                c.path,
                c.body
            );
        }
    }
}
