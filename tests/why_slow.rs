//! Why a call is slow, end to end: a real engine with telemetry on, in
//! front of the simulator. Every call carries the server's version (read
//! when the server is found and again when it comes back from a restart),
//! and a call that reasoned carries what the reasoning cost.
//!
//! Live, a call that stalls mid-stream carries `stalled_ms` while the
//! silence lasts, and a call awaiting its first token says how long the
//! server has been silent for it (`wait.silent_ms`): through the proxy and
//! through the capture.
//!
//! A model's usual decode rate survives a restart on the same store, and
//! `GET /api/v1/servers` lists each loaded model with when it unloads,
//! its share off the GPU and the route's usual load time.
//!
//! Real time, since the engine runs its own actor system: every wait is on
//! a settled call with a deadline, never a sleep.

use std::time::Duration;

use crate::util::proxy::*;
use speedtap::model::{Call, EngineEvent, EngineQueries, Phase, SlowdownCause, Snapshot};
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

/// The live snapshots of the one call `engine` meters, in order, until it
/// settles (deadline 20 s), while `client` runs against `addr`.
async fn live_snapshots_of_one_call(
    engine: &speedtap::host::RunningEngine,
    addr: std::net::SocketAddr,
) -> (Vec<Snapshot>, Call) {
    let mut rx = engine.handle.subscribe().await;
    let client =
        tokio::spawn(async move { send(addr, "POST", "/v1/chat/completions", &chat("hi")).await });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut seen = Vec::new();
    let call = loop {
        let event = tokio::time::timeout_at(deadline, rx.recv())
            .await
            .unwrap_or_else(|_| panic!("no settled call; saw {seen:#?}"))
            .expect("engine events");
        match event {
            EngineEvent::Speed { speed, .. } => seen.push(speed),
            EngineEvent::Settled(call) => break call,
            _ => {}
        }
    };
    assert_eq!(client.await.unwrap().status, 200);
    (seen, call)
}

/// An engine in front of `sim`: its proxy route (`via_capture` false), or
/// capturing the simulator's port, the client going straight to it. The
/// address the client sends to; `None` when the capture can't run here.
async fn measuring(
    sim: &SimServer,
    via_capture: bool,
) -> Option<(speedtap::host::RunningEngine, std::net::SocketAddr)> {
    if via_capture {
        let engine = crate::capture::capture_engine(&sim.base_url(), false).await?;
        Some((engine, sim.local_addr()))
    } else {
        let engine = engine_for(&sim.base_url()).await;
        let addr = engine.routes[0].listen;
        Some((engine, addr))
    }
}

/// 20 tok/s, 20 tokens, silent for 5 s after the 5th.
async fn a_stall_mid_stream_is_stalled_while_it_lasts_and_not_after(via_capture: bool) {
    let sim = SimServer::start(
        "127.0.0.1:0",
        SimConfig {
            ttft: Duration::from_millis(200),
            tokens_per_second: 20.0,
            tokens: 20,
            stall_after_tokens: Some(5),
            stall: Duration::from_secs(5),
            ..SimConfig::default()
        },
    )
    .await
    .unwrap();
    let Some((engine, addr)) = measuring(&sim, via_capture).await else {
        return;
    };
    let (seen, call) = live_snapshots_of_one_call(&engine, addr).await;
    let stalled: Vec<&Snapshot> = seen.iter().filter(|s| s.stalled_ms.is_some()).collect();
    assert!(!stalled.is_empty(), "never stalled: {seen:#?}");
    for s in &stalled {
        let ms = s.stalled_ms.unwrap();
        // Over the 3 s floor, within the 5 s silence (and a tick).
        assert!((3_000..=5_300).contains(&ms), "stalled_ms {ms}");
        assert_eq!(s.output_tokens, 5, "stalled at the 5th token");
    }
    let longest = stalled.iter().filter_map(|s| s.stalled_ms).max().unwrap();
    assert!(
        longest >= 4_000,
        "the stall was seen while it lasted: {longest}"
    );
    // Once output resumed, no snapshot says stalled.
    let last_stalled = seen.iter().rposition(|s| s.stalled_ms.is_some()).unwrap();
    assert!(
        seen[..last_stalled].iter().all(|s| s.output_tokens <= 5),
        "stalled after output resumed: {seen:#?}"
    );
    assert!(
        seen[last_stalled + 1..].iter().any(|s| s.output_tokens > 5),
        "output resumed without a snapshot: {seen:#?}"
    );
    assert_eq!(call.speed.as_ref().unwrap().stalled_ms, None);
    engine.shutdown(Duration::from_secs(1)).await;
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_5_s_stall_mid_stream_through_the_proxy_is_stalled_while_it_lasts_and_not_after() {
    a_stall_mid_stream_is_stalled_while_it_lasts_and_not_after(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_5_s_stall_mid_stream_seen_by_the_capture_is_stalled_while_it_lasts_and_not_after() {
    a_stall_mid_stream_is_stalled_while_it_lasts_and_not_after(true).await;
}

/// A 4 s wait for the first token, with SSE pings every `ping` or none:
/// the waiting snapshots (elapsed, silent) and the call's TTFT.
async fn a_4_s_wait(ping: Option<Duration>, via_capture: bool) -> Option<(Vec<(u64, u64)>, u64)> {
    let sim = SimServer::start(
        "127.0.0.1:0",
        SimConfig {
            ttft: Duration::from_secs(4),
            tokens: 5,
            ping_interval: ping,
            ..SimConfig::default()
        },
    )
    .await
    .unwrap();
    let (engine, addr) = measuring(&sim, via_capture).await?;
    let (seen, call) = live_snapshots_of_one_call(&engine, addr).await;
    let waits: Vec<(u64, u64)> = seen
        .iter()
        .filter(|s| s.phase == Phase::AwaitingFirstToken && !s.is_final)
        .map(|s| {
            let silent = s.wait.as_ref().and_then(|w| w.silent_ms);
            (
                s.elapsed_ms,
                silent.expect("a waiting call carries silent_ms"),
            )
        })
        .collect();
    let ttft = call.speed.as_ref().unwrap().time_to_first_token_ms.unwrap();
    engine.shutdown(Duration::from_secs(1)).await;
    sim.shutdown().await;
    Some((waits, ttft))
}

async fn pings_keep_the_silence_short_and_are_not_the_first_token(via_capture: bool) {
    let Some((waits, ttft)) = a_4_s_wait(Some(Duration::from_millis(500)), via_capture).await
    else {
        return;
    };
    // Pings are no output: the first token is the scheduled one.
    assert!((3_900..=4_400).contains(&ttft), "ttft {ttft}");
    let after_a_ping: Vec<_> = waits.iter().filter(|(e, _)| *e >= 600).collect();
    assert!(after_a_ping.len() >= 3, "{waits:?}");
    for (elapsed, silent) in after_a_ping {
        assert!(
            *silent < 1_000,
            "silent {silent} ms at {elapsed} ms: {waits:?}"
        );
    }
}

async fn without_pings_the_silence_grows(via_capture: bool) {
    let Some((waits, ttft)) = a_4_s_wait(None, via_capture).await else {
        return;
    };
    assert!((3_900..=4_400).contains(&ttft), "ttft {ttft}");
    let silences: Vec<u64> = waits.iter().map(|(_, s)| *s).collect();
    assert!(silences.windows(2).all(|w| w[0] <= w[1]), "{waits:?}");
    assert!(*silences.last().unwrap() >= 3_000, "{waits:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pings_every_half_second_through_the_proxy_keep_silent_under_a_second_and_ttft_at_4_s() {
    pings_keep_the_silence_short_and_are_not_the_first_token(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pings_every_half_second_seen_by_the_capture_keep_silent_under_a_second_and_ttft_at_4_s() {
    pings_keep_the_silence_short_and_are_not_the_first_token(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_pings_the_silence_of_a_waiting_call_through_the_proxy_grows() {
    without_pings_the_silence_grows(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_pings_the_silence_of_a_waiting_call_seen_by_the_capture_grows() {
    without_pings_the_silence_grows(true).await;
}

/// One chat call through the proxy decoding at `tps` (the simulator's
/// `x-sim-tps`); its settled record, the `n`th to settle.
async fn call_at(
    engine: &speedtap::host::RunningEngine,
    addr: std::net::SocketAddr,
    tps: f64,
    n: usize,
) -> Call {
    call_with(engine, addr, &[("x-sim-tps", &tps.to_string())], n).await
}

/// A chat call with the simulator's `headers`, the `n`th to settle.
async fn call_with(
    engine: &speedtap::host::RunningEngine,
    addr: std::net::SocketAddr,
    headers: &[(&str, &str)],
    n: usize,
) -> Call {
    let body = bytes::Bytes::from(chat("hi"));
    let got = send_with(addr, "POST", "/v1/chat/completions", body, headers).await;
    assert_eq!(got.status, 200);
    settled(engine, n).await
}

/// The simulator as an Ollama of `version`: 600 ms to the first token (the
/// poller reads `/api/ps` and the version meanwhile), 40 tokens (a rate
/// needs half a second of decode).
async fn sim_at(at: &str, version: &str) -> SimServer {
    let config = SimConfig {
        ttft: Duration::from_millis(600),
        tokens: 40,
        tokens_per_second: 40.0,
        version: version.into(),
        ..SimConfig::default()
    };
    SimServer::start(at, config).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_usually_at_40_tok_s_then_at_12_with_29_percent_on_the_cpu_is_a_cpu_offload_and_an_upgrade_that_decodes_slower_names_both_versions(
) {
    let sim = sim_at("127.0.0.1:0", "0.32.13").await;
    let at = sim.local_addr();
    let engine = engine_with(&sim.base_url(), |o| o.telemetry = true).await;
    let addr = engine.routes[0].listen;

    // Five calls at 40 tok/s make the usual; none is judged slow.
    for n in 1..=5 {
        let call = call_at(&engine, addr, 40.0, n).await;
        assert_eq!(call.details.slowdown, None, "call {n}: {call:?}");
    }

    // The model is pushed 29% off the GPU and decodes at 12 tok/s.
    sim.set_vram_fraction(0.71);
    let offloaded = call_at(&engine, addr, 12.0, 6).await;
    let slow = offloaded
        .details
        .slowdown
        .clone()
        .unwrap_or_else(|| panic!("no slowdown: {offloaded:#?}"));
    assert!(
        (36.0..=44.0).contains(&slow.usual_tps),
        "usual {}",
        slow.usual_tps
    );
    assert!((0.27..=0.33).contains(&slow.ratio), "ratio {}", slow.ratio);
    assert_eq!(
        slow.causes,
        [SlowdownCause::CpuOffload { cpu_share: 0.29 }],
        "{slow:?}"
    );

    // Back on the GPU at its usual pace: no slowdown, as the offloaded
    // call taught the usual nothing.
    sim.set_vram_fraction(1.0);
    let back = call_at(&engine, addr, 40.0, 7).await;
    assert_eq!(back.details.slowdown, None, "{back:?}");

    // The server comes back upgraded, and decodes at half the pace: the
    // old usual stays the reference and the upgrade is named.
    sim.shutdown().await;
    let failed = send(addr, "POST", "/v1/chat/completions", &chat("hi")).await;
    assert_eq!(failed.status, 502);
    let _ = settled_calls(&engine, 8).await;
    let upgraded = sim_at(&at.to_string(), "0.33.2").await;
    let after = call_at(&engine, addr, 20.0, 9).await;
    assert_eq!(after.details.server_version.as_deref(), Some("0.33.2"));
    let slow = after
        .details
        .slowdown
        .clone()
        .unwrap_or_else(|| panic!("no slowdown: {after:#?}"));
    assert!((0.45..=0.55).contains(&slow.ratio), "ratio {}", slow.ratio);
    assert_eq!(
        slow.causes,
        [SlowdownCause::ServerChanged {
            from: "0.32.13".into(),
            to: "0.33.2".into()
        }],
        "{slow:?}"
    );
    // The slowdown is in the record the API lists, beside the details.
    let json = serde_json::to_value(&after).unwrap();
    assert_eq!(json["slowdown"]["causes"][0]["kind"], "server_changed");
    assert_eq!(json["slowdown"]["causes"][0]["from"], "0.32.13");
    engine.shutdown(Duration::from_secs(1)).await;
    upgraded.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slowdown_right_after_a_restart_is_judged_against_the_usual_learned_before_it() {
    let dir = crate::util::process::scratch("why_slow", "restart_usual");
    let db = dir.join("calls.sqlite3");
    let sim = sim_at("127.0.0.1:0", "0.32.13").await;
    let with_store = |o: &mut speedtap::host::EngineOptions| {
        o.telemetry = true;
        o.store = Some(speedtap::store::Store::open(&db).unwrap());
    };
    let before = engine_with(&sim.base_url(), with_store).await;
    let addr = before.routes[0].listen;
    for n in 1..=5 {
        let call = call_at(&before, addr, 40.0, n).await;
        assert_eq!(call.details.slowdown, None, "call {n}: {call:?}");
    }
    before.shutdown(Duration::from_secs(1)).await;

    // A new engine on the same file: its first call is judged at once.
    let after = engine_with(&sim.base_url(), with_store).await;
    let addr = after.routes[0].listen;
    let first = call_at(&after, addr, 12.0, 1).await;
    let slow = first
        .details
        .slowdown
        .clone()
        .unwrap_or_else(|| panic!("no slowdown after the restart: {first:#?}"));
    assert!(
        (36.0..=44.0).contains(&slow.usual_tps),
        "usual {}",
        slow.usual_tps
    );
    assert!((0.27..=0.33).contains(&slow.ratio), "ratio {}", slow.ratio);
    assert_eq!(slow.causes, [SlowdownCause::Unknown], "{slow:?}");
    after.shutdown(Duration::from_secs(1)).await;
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_calls_streaming_at_once_below_the_usual_each_name_the_other() {
    let sim = sim_at("127.0.0.1:0", "0.32.13").await;
    let engine = engine_with(&sim.base_url(), |o| o.telemetry = true).await;
    let addr = engine.routes[0].listen;
    for n in 1..=5 {
        call_at(&engine, addr, 40.0, n).await;
    }
    // The second call goes out once the first streams, so the two stream
    // together however loaded the machine (sent at once, a late second
    // start could miss the first's 2.7 s of decode).
    let mut rx = engine.handle.subscribe().await;
    let slow: &'static [(&str, &str)] = &[("x-sim-tps", "15")];
    let body = bytes::Bytes::from(chat("hi"));
    let path = "/v1/chat/completions";
    let first = tokio::spawn(send_with(addr, "POST", path, body.clone(), slow));
    events_until(
        &mut rx,
        |e| matches!(e, EngineEvent::Speed { speed, .. } if speed.phase == Phase::Responding),
    )
    .await;
    let second = tokio::spawn(send_with(addr, "POST", path, body, slow));
    assert_eq!(first.await.unwrap().status, 200);
    assert_eq!(second.await.unwrap().status, 200);
    let (a, b) = (settled(&engine, 6).await, settled(&engine, 7).await);
    for call in [a, b] {
        let slow = call
            .details
            .slowdown
            .clone()
            .unwrap_or_else(|| panic!("no slowdown: {call:#?}"));
        assert_eq!(
            slow.causes,
            [SlowdownCause::Concurrent { calls: 1 }],
            "{call:?}"
        );
    }
    engine.shutdown(Duration::from_secs(1)).await;
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drafts_usually_accepted_80_percent_of_the_time_then_30_with_a_slower_decode_name_both_shares(
) {
    // A llama-server with a draft model: its timings carry draft_n and
    // draft_n_accepted (40 tokens, each drafted once).
    let sim = SimServer::start(
        "127.0.0.1:0",
        SimConfig {
            ttft: Duration::from_millis(300),
            tokens: 40,
            tokens_per_second: 40.0,
            server_timings: true,
            draft_acceptance: Some(0.8),
            ..SimConfig::default()
        },
    )
    .await
    .unwrap();
    let engine = engine_with(&sim.base_url(), |o| o.telemetry = true).await;
    let addr = engine.routes[0].listen;
    for n in 1..=5 {
        let call = call_at(&engine, addr, 40.0, n).await;
        assert_eq!(call.details.slowdown, None, "call {n}: {call:?}");
    }
    let headers = [("x-sim-tps", "20"), ("x-sim-draft-acceptance", "0.3")];
    let slow_call = call_with(&engine, addr, &headers, 6).await;
    let draft = slow_call.details.draft.as_ref().expect("draft counts");
    assert_eq!((draft.drafted, draft.accepted), (40, 12));
    let slow = slow_call
        .details
        .slowdown
        .clone()
        .unwrap_or_else(|| panic!("no slowdown: {slow_call:#?}"));
    assert!((0.45..=0.55).contains(&slow.ratio), "ratio {}", slow.ratio);
    assert_eq!(
        slow.causes,
        [SlowdownCause::DraftAcceptance {
            usual: 0.8,
            now: 0.3
        }],
        "{slow:?}"
    );
    let json = serde_json::to_value(&slow_call).unwrap();
    assert_eq!(json["slowdown"]["causes"][0]["kind"], "draft_acceptance");
    // Back at the usual acceptance and pace: no slowdown.
    let back = call_at(&engine, addr, 40.0, 7).await;
    assert_eq!(back.details.slowdown, None, "{back:?}");
    engine.shutdown(Duration::from_secs(1)).await;
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_captured_call_at_12_tok_s_with_29_percent_on_the_cpu_is_a_cpu_offload_against_its_usual_40(
) {
    let sim = sim_at("127.0.0.1:0", "0.32.13").await;
    let Some(engine) =
        crate::capture::capture_engine_with(&sim.base_url(), false, |o| o.telemetry = true).await
    else {
        return;
    };
    // The client talks to the server itself; the capture measures.
    let addr = sim.local_addr();
    for n in 1..=5 {
        let call = call_at(&engine, addr, 40.0, n).await;
        assert_eq!(call.details.slowdown, None, "call {n}: {call:?}");
    }
    sim.set_vram_fraction(0.71);
    let offloaded = call_at(&engine, addr, 12.0, 6).await;
    assert_eq!(offloaded.details.seen_by, speedtap::model::SeenBy::Capture);
    let slow = offloaded
        .details
        .slowdown
        .clone()
        .unwrap_or_else(|| panic!("no slowdown: {offloaded:#?}"));
    assert!((0.27..=0.33).contains(&slow.ratio), "ratio {}", slow.ratio);
    assert_eq!(
        slow.causes,
        [SlowdownCause::CpuOffload { cpu_share: 0.29 }],
        "{slow:?}"
    );
    engine.shutdown(Duration::from_secs(1)).await;
    sim.shutdown().await;
}

/// Wall-clock unix ms now.
fn unix_ms_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_servers_list_each_loaded_model_with_when_it_unloads_its_cpu_share_and_its_usual_load()
{
    let sim = SimServer::start(
        "127.0.0.1:0",
        SimConfig {
            ttft: Duration::from_millis(300),
            tokens: 10,
            load_time: Duration::from_millis(1_500),
            keep_alive: Some(Duration::from_secs(300)),
            vram_fraction: 0.71,
            ..SimConfig::default()
        },
    )
    .await
    .unwrap();
    let engine = engine_with(&sim.base_url(), |o| o.telemetry = true).await;
    let addr = engine.routes[0].listen;
    assert_eq!(
        engine.handle.servers().await.loaded,
        [],
        "nothing loaded yet"
    );

    let chat = r#"{"model":"qwen3:32b","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let got = send(addr, "POST", "/api/chat", chat).await;
    assert_eq!(got.status, 200);
    let ended = unix_ms_now();
    let call = settled(&engine, 1).await;
    assert_eq!(
        call.details.start,
        Some(speedtap::model::StartKind::Cold),
        "{call:?}"
    );

    // The call ended: the model unloads keep_alive later, read anew from
    // /api/ps (Ollama sets expires_at when a model's last call ends).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let model = loop {
        let doc = engine.handle.servers().await;
        let found = doc.loaded.iter().find(|m| m.model == "qwen3:32b").cloned();
        match found {
            Some(m) if m.usual_load_ms.is_some() => break m,
            other => assert!(
                std::time::Instant::now() < deadline,
                "no loaded model with its usual load: {other:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(model.route, "t");
    let unloads = model
        .expires_at
        .as_deref()
        .and_then(speedtap::model::time::rfc3339_to_ms)
        .unwrap_or_else(|| panic!("no expires_at: {model:?}"));
    assert!(
        unloads.abs_diff(ended + 300_000) <= 2_000,
        "unloads {} ms after the call ended",
        unloads as i64 - ended as i64
    );
    assert_eq!(model.cpu_share, Some(0.29));
    let load = model.usual_load_ms.unwrap();
    assert!((1_400..=2_500).contains(&load), "usual load {load} ms");
    let json = serde_json::to_value(engine.handle.servers().await).unwrap();
    assert_eq!(json["loaded"][0]["model"], "qwen3:32b");
    assert_eq!(json["loaded"][0]["cpu_share"], 0.29);
    engine.shutdown(Duration::from_secs(1)).await;
    sim.shutdown().await;
}
