//! Why a call is slow, end to end: a real engine with telemetry on, in
//! front of the simulator. Every call carries the server's version (read
//! when the server is found and again when it comes back from a restart),
//! and a call that reasoned carries what the reasoning cost.
//!
//! Real time, since the engine runs its own actor system: every wait is on
//! a settled call with a deadline, never a sleep.

use std::time::Duration;

use crate::util::proxy::*;
use speedtap::model::Call;
use speedtap::simulate::{SimConfig, SimServer};

fn chat(text: &str) -> String {
    serde_json::json!({
        "model": "sim", "stream": true,
        "messages": [{"role": "user", "content": text}]
    })
    .to_string()
}

/// The `n`th settled call (in settle order, 1-based), once there are `n`.
async fn settled(engine: &speedtap::host::RunningEngine, n: usize) -> Call {
    let mut calls = settled_calls(engine, n).await;
    calls.sort_by(|a, b| a.identity.id.cmp(&b.identity.id));
    calls.swap_remove(n - 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_carries_the_servers_version_and_a_restart_with_an_upgrade_is_seen() {
    let config = SimConfig {
        ttft: Duration::from_millis(600),
        tokens: 5,
        version: "0.32.13".into(),
        ..SimConfig::default()
    };
    let sim = SimServer::start("127.0.0.1:0", config.clone())
        .await
        .unwrap();
    let at = sim.local_addr();
    let engine = engine_with(&sim.base_url(), |o| o.telemetry = true).await;
    let addr = engine.routes[0].listen;

    assert_eq!(
        send(addr, "POST", "/v1/chat/completions", &chat("hi"))
            .await
            .status,
        200
    );
    let first = settled(&engine, 1).await;
    assert_eq!(first.details.server_version.as_deref(), Some("0.32.13"));

    // The server goes down (a call fails meanwhile), and comes back
    // upgraded on the same port.
    sim.shutdown().await;
    assert_eq!(
        send(addr, "POST", "/v1/chat/completions", &chat("hi"))
            .await
            .status,
        502
    );
    let _ = settled_calls(&engine, 2).await;
    let upgraded = SimServer::start(
        &at.to_string(),
        SimConfig {
            version: "0.33.2".into(),
            ..config
        },
    )
    .await
    .unwrap();
    assert_eq!(
        send(addr, "POST", "/v1/chat/completions", &chat("hi"))
            .await
            .status,
        200
    );
    let third = settled(&engine, 3).await;
    assert_eq!(third.details.server_version.as_deref(), Some("0.33.2"));
    engine.shutdown(Duration::from_secs(1)).await;
    upgraded.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reasoning_call_splits_its_thinking_from_its_answer_within_a_frame_of_the_schedule() {
    // 40 reasoning tokens then 10 answer tokens at 20 tok/s: two seconds
    // of thinking, by the schedule.
    let sim = SimServer::start(
        "127.0.0.1:0",
        SimConfig {
            ttft: Duration::from_millis(200),
            tokens_per_second: 20.0,
            reasoning_tokens: 40,
            tokens: 10,
            ..SimConfig::default()
        },
    )
    .await
    .unwrap();
    let engine = engine_with(&sim.base_url(), |_| {}).await;
    let addr = engine.routes[0].listen;
    assert_eq!(
        send(addr, "POST", "/v1/chat/completions", &chat("think"))
            .await
            .status,
        200
    );
    let call = settled(&engine, 1).await;
    let d = &call.details;
    let ms = d.reasoning_ms.expect("reasoning_ms");
    // The first answer token comes one frame (50 ms at 20 tok/s) after
    // the last reasoning token: 40 frames after the first.
    assert!((1_900..=2_100).contains(&ms), "reasoning_ms {ms}");
    let tokens = d.reasoning_tokens.expect("reasoning_tokens");
    if d.reasoning_tokens_estimated {
        assert!((30..=50).contains(&tokens), "estimated {tokens}");
    } else {
        assert_eq!(tokens, 40);
    }
    let text = d.reasoning_text(None).unwrap();
    assert!(text.starts_with("thought 2"), "{text}");
    engine.shutdown(Duration::from_secs(1)).await;
    sim.shutdown().await;
}
