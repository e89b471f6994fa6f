//! Why a call waits, end to end: a real engine with telemetry on, in front
//! of the simulator behaving like Ollama (models that load, then expire)
//! and llama-server (one slot, `/slots` prefill progress, a context size
//! that cuts or refuses). Each test reads the live snapshots the engine
//! publishes (`EngineEvent::Speed`) and the settled call's details; the
//! slow rule's test reads the alarms (`EngineEvent::SlowFirstToken`),
//! each cause of a wait judged against its own normal.
//!
//! Real time, since the engine runs its own actor system: every wait is on
//! an engine event with a deadline, never a sleep, except where the test
//! is about nothing happening for a while (idle polling).

use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use crate::util::proxy as proxy_support;
use proxy_support::*;
use speedtap::model::{Call, EngineEvent, EngineQueries, Phase, StartKind, Wait, WaitReason};
use speedtap::simulate::{Overflow, PsWhileLoading, SimConfig, SimServer};

/// A waiting snapshot: when it was published (ms since dispatch) and why.
#[derive(Clone, Debug)]
pub(crate) struct Seen {
    pub(crate) elapsed_ms: u64,
    pub(crate) wait: Wait,
}

async fn telemetry_engine(upstream: &str) -> speedtap::host::RunningEngine {
    engine_with(upstream, |o| o.telemetry = true).await
}

/// A simulator with `config`, an engine with telemetry in front of it, the
/// engine's route address and its events.
async fn sim_and_engine(
    config: SimConfig,
) -> (
    SimServer,
    speedtap::host::RunningEngine,
    std::net::SocketAddr,
    tokio::sync::mpsc::Receiver<EngineEvent>,
) {
    let sim = SimServer::start("127.0.0.1:0", config).await.unwrap();
    let engine = telemetry_engine(&sim.base_url()).await;
    let addr = engine.routes[0].listen;
    let rx = engine.handle.subscribe().await;
    (sim, engine, addr, rx)
}

/// Every explained wait of call `id` until it settles; returns them and
/// the settled call.
pub(crate) async fn waits_of(
    rx: &mut tokio::sync::mpsc::Receiver<EngineEvent>,
    id: &str,
) -> (Vec<Seen>, Call) {
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let event = tokio::time::timeout_at(deadline, rx.recv())
            .await
            .unwrap_or_else(|_| panic!("{id} did not settle; saw {seen:?}"))
            .expect("engine events");
        match event {
            EngineEvent::Speed { call, speed, .. } if call.id == id => {
                if let (Phase::AwaitingFirstToken, Some(wait)) = (speed.phase, speed.wait) {
                    seen.push(Seen {
                        elapsed_ms: speed.elapsed_ms,
                        wait,
                    });
                }
            }
            EngineEvent::Settled(call) if call.identity.id == id => return (seen, call),
            _ => {}
        }
    }
}

/// The known reasons in the order they came (`unknown` between polls or
/// before the server shows the call is left out).
pub(crate) fn reasons(seen: &[Seen]) -> Vec<WaitReason> {
    let mut out: Vec<WaitReason> = Vec::new();
    for s in seen {
        if s.wait.reason != WaitReason::Unknown && out.last() != Some(&s.wait.reason) {
            out.push(s.wait.reason);
        }
    }
    out
}

/// Waits (deadline 5 s) until the simulator lists no loaded model: the
/// previous call's `keep_alive: 0` unloads it as that call's handler ends,
/// which may be a moment after the client read the last byte.
async fn until_unloaded(sim: &SimServer) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let got = send(sim.local_addr(), "GET", "/api/ps", "").await;
        if String::from_utf8_lossy(&got.body()).contains(r#""models":[]"#) {
            return;
        }
        assert!(Instant::now() < deadline, "the model never unloaded");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn ollama_chat(model: &str, text: &str) -> String {
    serde_json::json!({
        "model": model, "stream": true, "keep_alive": 0,
        "messages": [{"role": "user", "content": text}]
    })
    .to_string()
}

fn openai_chat(text: &str) -> String {
    serde_json::json!({
        "model": "sim", "stream": true,
        "messages": [{"role": "user", "content": text}]
    })
    .to_string()
}

/// How far each ETA was from the first token that followed it: |(when it
/// was said + eta) - ttft|, in ms.
fn eta_errors(seen: &[Seen], ttft_ms: u64) -> Vec<i64> {
    seen.iter()
        .filter_map(|s| {
            let eta = s.wait.eta_ms?;
            Some((s.elapsed_ms + eta) as i64 - ttft_ms as i64)
        })
        .collect()
}

/// The simulator behaving like Ollama: a model not loaded takes 1.5 s to
/// load, and is not listed by `/api/ps` until it has.
pub(crate) async fn loading_simulator() -> SimServer {
    SimServer::start(
        "127.0.0.1:0",
        SimConfig {
            load_time: Duration::from_millis(1_500),
            server_timings: true,
            ..SimConfig::default()
        },
    )
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_for_an_unloaded_model_says_loading_then_a_later_load_has_an_eta() {
    let sim = loading_simulator().await;
    let engine = telemetry_engine(&sim.base_url()).await;
    let addr = engine.routes[0].listen;
    let mut rx = engine.handle.subscribe().await;
    let mut last = None;
    // keep_alive 0: the model unloads when each call ends, so every call
    // loads it again.
    for n in 1..=4u64 {
        until_unloaded(&sim).await;
        let id = format!("c-{n:06}");
        let got = send(addr, "POST", "/api/chat", &ollama_chat("m", "hello there")).await;
        assert_eq!(got.status, 200);
        let (seen, call) = waits_of(&mut rx, &id).await;
        assert_eq!(
            reasons(&seen)[0],
            WaitReason::LoadingModel,
            "{id}: {seen:?}"
        );
        assert_eq!(call.details.start, Some(StartKind::Cold), "{id}");
        // The details keep the last known reason: loading, or (once the
        // route knows its prefill rate) the estimated prefill after it.
        assert!(call.details.wait.is_some(), "{id}");
        let ttft = call.speed.unwrap().time_to_first_token_ms.unwrap();
        assert!(ttft >= 1_500, "{ttft}");
        last = Some((seen, ttft));
    }
    // By the fourth load the route knows this model's load time: the wait
    // says it and predicts the first token.
    let (seen, ttft) = last.unwrap();
    let loading: Vec<&Seen> = seen
        .iter()
        .filter(|s| s.wait.reason == WaitReason::LoadingModel)
        .collect();
    let usual = loading[0].wait.usual_ms.expect("usual load time");
    assert!((1_400..=1_700).contains(&usual), "{usual}");
    let errors = eta_errors(&seen, ttft);
    assert!(!errors.is_empty(), "{seen:?}");
    println!("loading: ttft {ttft} ms, eta errors (ms) {errors:?}");
    assert!(errors.iter().all(|e| e.abs() <= 500), "{errors:?}");
    engine.shutdown(Duration::from_secs(1)).await;
    sim.shutdown().await;
}

/// One cold call and one warm call against an Ollama-like simulator whose
/// `/api/ps` behaves as `mode` while a model loads (2 s).
async fn cold_then_warm(mode: PsWhileLoading) {
    let (sim, engine, addr, mut rx) = sim_and_engine(SimConfig {
        load_time: Duration::from_millis(2_000),
        ps_while_loading: mode,
        ..SimConfig::default()
    })
    .await;
    // The engine's first look (at start) has its answer: nothing loaded.
    let _ = send(sim.local_addr(), "GET", "/api/ps", "").await;
    let chat = |keep_alive: &str| {
        format!(
            r#"{{"model":"m","stream":true,"keep_alive":"{keep_alive}","messages":[{{"role":"user","content":"hi"}}]}}"#
        )
    };
    let got = send(addr, "POST", "/api/chat", &chat("5m")).await;
    assert_eq!(got.status, 200);
    let (seen, cold) = waits_of(&mut rx, "c-000001").await;
    assert_eq!(
        reasons(&seen),
        [WaitReason::LoadingModel],
        "{mode:?}: {seen:?}"
    );
    assert_eq!(cold.details.start, Some(StartKind::Cold), "{mode:?}");
    // Said through the load: once loading, no explanation published
    // before the load's end says otherwise (a model listed while it still
    // loads must not read as loaded). After it, a server that shows the
    // load over may say so (the base TTFT is left).
    let first_loading = seen
        .iter()
        .position(|s| s.wait.reason == WaitReason::LoadingModel)
        .unwrap();
    assert!(
        seen[first_loading..]
            .iter()
            .filter(|s| s.elapsed_ms < 1_950)
            .all(|s| s.wait.reason == WaitReason::LoadingModel),
        "{mode:?}: {seen:?}"
    );
    let ttft = cold.speed.and_then(|s| s.time_to_first_token_ms).unwrap();
    assert!(ttft >= 2_000, "{mode:?}: {ttft}");
    // The model is now kept loaded: the next call is a warm start.
    let got = send(addr, "POST", "/api/chat", &chat("5m")).await;
    assert_eq!(got.status, 200);
    let (seen, warm) = waits_of(&mut rx, "c-000002").await;
    assert!(
        !reasons(&seen).contains(&WaitReason::LoadingModel),
        "{mode:?}: {seen:?}"
    );
    assert_eq!(warm.details.start, Some(StartKind::Warm), "{mode:?}");
    engine.shutdown(Duration::from_secs(1)).await;
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_load_is_explained_whether_api_ps_hides_the_model_or_holds_its_answer() {
    // `Listed` (Ollama before mid 2026) is left out: a listing there says
    // nothing about the load's end, which speedtap does not yet tell.
    for mode in [PsWhileLoading::Hidden, PsWhileLoading::Blocks] {
        cold_then_warm(mode).await;
    }
}

/// One Ollama chat through `addr` whose model, when it finds it unloaded,
/// loads in `load_ms`; `keep_alive` 0 unloads it after the call, else it
/// stays. Returns the slow-first-token alarms raised while call `id`
/// waited, and the settled call.
async fn chat_with_load(
    addr: std::net::SocketAddr,
    rx: &mut tokio::sync::mpsc::Receiver<EngineEvent>,
    id: &str,
    load_ms: &str,
    keep_alive: u64,
) -> (Vec<speedtap::model::SlowFirstToken>, Call) {
    let body = serde_json::json!({
        "model": "m", "stream": true, "keep_alive": keep_alive,
        "messages": [{"role": "user", "content": "hi"}]
    });
    let got = send_with(
        addr,
        "POST",
        "/api/chat",
        Bytes::from(body.to_string()),
        &[("x-sim-load-ms", load_ms), ("x-sim-ttft-ms", "50")],
    )
    .await;
    assert_eq!(got.status, 200);
    let mut alarms = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match tokio::time::timeout_at(deadline, rx.recv())
            .await
            .unwrap_or_else(|_| panic!("{id} did not settle"))
            .expect("engine events")
        {
            EngineEvent::SlowFirstToken(slow) => alarms.push(slow),
            EngineEvent::Settled(call) if call.identity.id == id => return (alarms, call),
            _ => {}
        }
    }
}

/// Rule "slow means slow for this route and model", through the proxy: a
/// model that usually loads in 1 s. With a 300 ms threshold, a cold call
/// whose load takes its usual time raises nothing (judged as one, the
/// wait would be 3x the threshold); one whose load takes 3 s (three times
/// its usual: a load is late after twice its usual, on top of the warm
/// part's own allowance) raises the alarm, and the alarm names the load.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_that_takes_its_usual_time_raises_nothing_and_one_three_times_as_long_names_the_load(
) {
    let dir = crate::util::process::scratch("wait", "load_normal");
    let sim = SimServer::start(
        "127.0.0.1:0",
        SimConfig {
            tokens: 8,
            tokens_per_second: 400.0,
            ..SimConfig::default()
        },
    )
    .await
    .unwrap();
    // Taught with alarms out of reach, so the notifier's one alarm a
    // minute per route is still free for the calls judged below.
    let engine = engine_with(&sim.base_url(), |o| {
        o.telemetry = true;
        o.slow_ttft = Duration::from_secs(60);
        o.config_path = Some(dir.join("speedtap.toml"));
    })
    .await;
    let addr = engine.routes[0].listen;
    let mut rx = engine.handle.subscribe().await;
    // The route learns: one load of 1 s, then three warm calls (50 ms).
    let (_, first) = chat_with_load(addr, &mut rx, "c-000001", "1000", 300_000).await;
    assert_eq!(first.details.start, Some(StartKind::Cold), "{first:#?}");
    for n in 2..=4 {
        let keep = if n == 4 { 0 } else { 300_000 };
        let (_, warm) = chat_with_load(addr, &mut rx, &format!("c-{n:06}"), "1000", keep).await;
        assert_eq!(warm.details.start, Some(StartKind::Warm), "{warm:#?}");
    }
    until_unloaded(&sim).await;
    let mut settings = engine.handle.get_settings().await.unwrap();
    settings.slow_ttft_ms = 300;
    engine.handle.save_settings(settings).await.unwrap();

    // A load of its usual second: no alarm, though past the threshold.
    let (alarms, usual) = chat_with_load(addr, &mut rx, "c-000005", "1000", 0).await;
    assert_eq!(usual.details.start, Some(StartKind::Cold), "{usual:#?}");
    let ttft = usual.speed.and_then(|s| s.time_to_first_token_ms).unwrap();
    assert!(ttft >= 1_000, "{ttft}");
    assert!(alarms.is_empty(), "a usual load alarmed: {alarms:?}");
    until_unloaded(&sim).await;

    // A load of 3 s: late for a load of this model, and said so.
    let (alarms, late) = chat_with_load(addr, &mut rx, "c-000006", "3000", 0).await;
    assert_eq!(late.details.start, Some(StartKind::Cold), "{late:#?}");
    assert_eq!(alarms.len(), 1, "{alarms:?}");
    let alarm = &alarms[0];
    let reason = alarm.reason.as_ref().map(|w| w.reason);
    assert_eq!(reason, Some(WaitReason::LoadingModel), "{alarm:?}");
    // The limit: the warm part's (its usual plus 300 ms) and twice the
    // usual load.
    assert!((2_000..3_000).contains(&alarm.threshold_ms), "{alarm:?}");
    assert!(alarm.waited_ms >= alarm.threshold_ms, "{alarm:?}");
    let message = alarm.message();
    assert!(
        message.starts_with("m on t: no first token after ")
            && message.contains(", loading the model (usually 1.0 s)"),
        "{message}"
    );
    engine.shutdown(Duration::from_secs(1)).await;
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_one_slot_a_second_call_is_queued_behind_one_then_prefills_with_rising_progress() {
    let sim = SimServer::start(
        "127.0.0.1:0",
        SimConfig {
            slots: Some(1),
            prefill_tokens_per_second: Some(2_000.0),
            tokens: 8,
            // Prompt counts in the receipts: the route learns its prefill
            // rate from the server's numbers, as from a real server.
            usage: true,
            ..SimConfig::default()
        },
    )
    .await
    .unwrap();
    let engine = telemetry_engine(&sim.base_url()).await;
    let addr = engine.routes[0].listen;
    // A first call loads the model, so the two measured ones find it
    // loaded (the simulator lists it in /api/ps while it is kept).
    let warm = send(addr, "POST", "/v1/chat/completions", &openai_chat("hi")).await;
    assert_eq!(warm.status, 200);
    let _ = settled_calls(&engine, 1).await;
    let mut rx = engine.handle.subscribe().await;
    // 4,000 prompt tokens at 2,000/s: a 2 s prefill each.
    const HEADERS: &[(&str, &str)] = &[("x-sim-prompt-tokens", "4000")];
    let body = Bytes::from(openai_chat("a long document"));
    let first = tokio::spawn(send_with(
        addr,
        "POST",
        "/v1/chat/completions",
        body.clone(),
        HEADERS,
    ));
    // The second is sent once the server shows the first's prefill: sent
    // as soon as the first is dispatched, its upstream connection can win
    // and the server run it first (that order is `explain`'s unit test
    // `a_later_call_served_first_takes_the_task_matched_to_the_earlier_one`).
    let first_prefilling = events_until(&mut rx, |e| {
        matches!(e, EngineEvent::Speed { call, speed, .. }
            if call.id == "c-000002"
                && speed.wait.as_ref().is_some_and(|w| w.reason == WaitReason::Prefilling))
    })
    .await;
    let second = tokio::spawn(send_with(
        addr,
        "POST",
        "/v1/chat/completions",
        body,
        HEADERS,
    ));
    let mut a: Vec<Seen> = first_prefilling
        .iter()
        .filter_map(|e| match e {
            EngineEvent::Speed { call, speed, .. } if call.id == "c-000002" => {
                speed.wait.clone().map(|wait| Seen {
                    elapsed_ms: speed.elapsed_ms,
                    wait,
                })
            }
            _ => None,
        })
        .collect();
    let mut b = Vec::new();
    let mut settled = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while settled.len() < 2 {
        let event = tokio::time::timeout_at(deadline, rx.recv())
            .await
            .expect("both calls settle")
            .unwrap();
        match event {
            EngineEvent::Speed { call, speed, .. } if speed.phase == Phase::AwaitingFirstToken => {
                if let Some(wait) = speed.wait {
                    let s = Seen {
                        elapsed_ms: speed.elapsed_ms,
                        wait,
                    };
                    if call.id == "c-000002" {
                        a.push(s)
                    } else {
                        b.push(s)
                    }
                }
            }
            EngineEvent::Settled(call) => settled.push(call),
            _ => {}
        }
    }
    assert_eq!(first.await.unwrap().status, 200);
    assert_eq!(second.await.unwrap().status, 200);
    assert_eq!(reasons(&a), [WaitReason::Prefilling], "{a:?}");
    assert_eq!(
        reasons(&b),
        [WaitReason::Queued, WaitReason::Prefilling],
        "{b:?}"
    );
    assert!(b
        .iter()
        .filter(|s| s.wait.reason == WaitReason::Queued)
        .all(|s| s.wait.position == Some(1)));
    // Progress rises, from the server's own prompt count.
    for seen in [&a, &b] {
        let progress: Vec<f64> = seen.iter().filter_map(|s| s.wait.progress).collect();
        assert!(progress.len() >= 2, "{seen:?}");
        assert!(progress.windows(2).all(|w| w[0] <= w[1]), "{progress:?}");
        assert!(progress.first() < progress.last(), "{progress:?}");
        // The server's own prompt count, from its slot.
        assert!(
            seen.iter().any(|s| s.wait.prompt_tokens == Some(4_000)),
            "{seen:?}"
        );
    }
    let b_call = settled
        .iter()
        .find(|c| c.identity.id == "c-000003")
        .unwrap();
    // The settled record keeps the queue it waited in, apart from "the
    // rest" of its time to first token.
    let queued = b_call.details.queued_ms.expect("the queue time is stored");
    let shown_queued = b
        .iter()
        .filter(|s| s.wait.reason == WaitReason::Queued)
        .map(|s| s.elapsed_ms)
        .max()
        .unwrap();
    assert!(queued >= shown_queued, "{queued} < {shown_queued}");
    assert_eq!(b_call.details.queue_position, Some(1));
    let a_call = settled
        .iter()
        .find(|c| c.identity.id == "c-000002")
        .unwrap();
    assert_eq!(
        a_call.details.queued_ms, None,
        "the first call never queued"
    );
    let ttft = b_call
        .speed
        .as_ref()
        .unwrap()
        .time_to_first_token_ms
        .unwrap();
    let errors = eta_errors(
        &b.iter()
            .filter(|s| s.wait.reason == WaitReason::Prefilling)
            .cloned()
            .collect::<Vec<_>>(),
        ttft,
    );
    println!("prefill: ttft {ttft} ms, eta errors (ms) {errors:?}");
    assert!(!errors.is_empty());
    assert!(errors.iter().all(|e| e.abs() <= 700), "{errors:?}");
    engine.shutdown(Duration::from_secs(1)).await;
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_cut_to_the_context_is_flagged_and_alarmed_once_per_route_and_model() {
    let (sim, engine, addr, mut rx) = sim_and_engine(SimConfig {
        n_ctx: 512,
        overflow: Overflow::Truncate,
        server_timings: true,
        ..SimConfig::default()
    })
    .await;
    let long = "word ".repeat(2_000);
    let kept = |text: &str| {
        serde_json::json!({"model": "m", "stream": true,
                           "messages": [{"role": "user", "content": text}]})
        .to_string()
    };
    // A first short call loads the model; it stays listed in /api/ps
    // (keep-alive 5 min), where the poller reads its context length.
    let warm = send(addr, "POST", "/api/chat", &kept("hi")).await;
    assert_eq!(warm.status, 200);
    let _ = settled_calls(&engine, 1).await;
    let mut alarms = Vec::new();
    for n in 2..=3u64 {
        let got = send(addr, "POST", "/api/chat", &kept(&long)).await;
        assert_eq!(got.status, 200);
        let id = format!("c-{n:06}");
        let deadline = Instant::now() + Duration::from_secs(10);
        let call = loop {
            match tokio::time::timeout_at(deadline, rx.recv())
                .await
                .unwrap()
                .unwrap()
            {
                EngineEvent::PromptTruncated(cut) => alarms.push(cut),
                EngineEvent::Settled(call) if call.identity.id == id => break call,
                _ => {}
            }
        };
        let cut = call.details.prompt_truncated.expect("flagged");
        assert_eq!(cut.server_tokens, 512, "{cut:?}");
        assert_eq!(cut.context_size, Some(512));
        assert!(cut.request_tokens > 2_000, "{cut:?}");
        assert_eq!(call.details.context.unwrap().size, Some(512));
    }
    assert_eq!(alarms.len(), 1, "{alarms:?}");
    assert!(
        alarms[0].message().starts_with("m on t cut the prompt: "),
        "{}",
        alarms[0].message()
    );
    engine.shutdown(Duration::from_secs(1)).await;
    sim.shutdown().await;
}

/// The issue's false alarm: a 12,000-word prompt that speedtap's byte
/// estimate puts far above what the server read, to a server that read
/// all of it (its count far under its context). The flag and the alarm
/// come from the server's numbers only, so neither appears.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_prompt_the_server_read_whole_is_never_flagged_nor_alarmed() {
    let (sim, engine, addr, mut rx) = sim_and_engine(SimConfig {
        server_timings: true,
        ..SimConfig::default()
    })
    .await;
    let body = |text: &str| {
        serde_json::json!({"model": "m", "stream": true,
                           "messages": [{"role": "user", "content": text}]})
        .to_string()
    };
    // A first short call, so the poller has read the context size.
    let warm = send(addr, "POST", "/v1/chat/completions", &body("hi")).await;
    assert_eq!(warm.status, 200);
    let _ = settled_calls(&engine, 1).await;
    // 12,000 long words: about 63,000 tokens by the byte estimate; the
    // server reads 18,631.
    let long = "internationalization ".repeat(12_000);
    let got = send_with(
        addr,
        "POST",
        "/v1/chat/completions",
        Bytes::from(body(&long)),
        &[("x-sim-prompt-tokens", "18631")],
    )
    .await;
    assert_eq!(got.status, 200);
    let mut alarms = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    let call = loop {
        match tokio::time::timeout_at(deadline, rx.recv())
            .await
            .unwrap()
            .unwrap()
        {
            EngineEvent::PromptTruncated(cut) => alarms.push(cut),
            EngineEvent::Settled(call) if call.identity.id == "c-000002" => break call,
            _ => {}
        }
    };
    let estimate = call.details.prompt_tokens_estimated.expect("estimated");
    assert!(estimate > 2 * 18_631, "the estimate is far off: {estimate}");
    assert_eq!(call.input_tokens, Some(18_631));
    assert_eq!(call.details.context.as_ref().unwrap().size, Some(131_072));
    assert_eq!(call.details.prompt_truncated, None);
    assert!(alarms.is_empty(), "{alarms:?}");
    engine.shutdown(Duration::from_secs(1)).await;
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_over_the_context_refused_by_the_server_gives_a_clear_cause() {
    let sim = SimServer::start(
        "127.0.0.1:0",
        SimConfig {
            n_ctx: 512,
            overflow: Overflow::Refuse,
            ..SimConfig::default()
        },
    )
    .await
    .unwrap();
    let engine = telemetry_engine(&sim.base_url()).await;
    let addr = engine.routes[0].listen;
    let got = send(
        addr,
        "POST",
        "/v1/chat/completions",
        &openai_chat(&"word ".repeat(2_000)),
    )
    .await;
    assert_eq!(got.status, 400);
    let calls = settled_calls(&engine, 1).await;
    let error = calls[0].details.error.clone().expect("a cause");
    assert!(
        error.contains("is over the server's context size (512 tokens)"),
        "{error}"
    );
    engine.shutdown(Duration::from_secs(1)).await;
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_is_polled_only_while_a_call_waits_and_never_when_idle() {
    let sim = SimServer::start(
        "127.0.0.1:0",
        SimConfig {
            ttft: Duration::from_millis(2_000),
            tokens: 4,
            ..SimConfig::default()
        },
    )
    .await
    .unwrap();
    let engine = telemetry_engine(&sim.base_url()).await;
    let addr = engine.routes[0].listen;
    // The look at start: the four endpoints once.
    let deadline = Instant::now() + Duration::from_secs(5);
    while sim.telemetry_requests() < 4 {
        assert!(Instant::now() < deadline, "no start look");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let at_start = sim.telemetry_requests();
    // Idle: no call, so nothing is asked (this test is about absence over
    // a span, hence the sleep: 4 poll intervals).
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    assert_eq!(sim.telemetry_requests(), at_start, "polled while idle");

    // One call waiting 2 s for its first token.
    let t0 = std::time::Instant::now();
    let got = send(addr, "POST", "/v1/chat/completions", &openai_chat("hi")).await;
    assert_eq!(got.status, 200);
    let active = t0.elapsed();
    let _ = settled_calls(&engine, 1).await;
    let during = sim.telemetry_requests() - at_start;
    let per_minute = during as f64 / active.as_secs_f64() * 60.0;
    println!(
        "polling cost: {during} requests over {:.1} s active ({per_minute:.0}/min), 0 while idle",
        active.as_secs_f64()
    );
    // A look every 500 ms while the call waits, plus one at dispatch and
    // one when the request names its model; each asks /api/ps, /slots and
    // /metrics (/props at most once a minute).
    let looks = active.as_millis() as u64 / 500 + 3;
    assert!(during >= 3, "{during}");
    assert!(
        during <= 3 * looks,
        "{during} requests for at most {looks} looks"
    );
    let after = sim.telemetry_requests();
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    assert_eq!(
        sim.telemetry_requests(),
        after,
        "polled after the call ended"
    );
    engine.shutdown(Duration::from_secs(1)).await;
    sim.shutdown().await;
}

/// llama-server answers its telemetry from its task queue, and each answer
/// restarts the wait before every stream's keep-alive ping: looked at every
/// 500 ms, a waiting stream got no ping at all. A llama-server alone (no
/// `/api/ps`) is looked at with room for a ping each second between looks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_llama_server_is_looked_at_with_room_for_its_pings_between_looks() {
    let (sim, engine, addr, _rx) = sim_and_engine(SimConfig {
        ttft: Duration::from_millis(4_000),
        tokens: 4,
        publishes_ps: false,
        ..SimConfig::default()
    })
    .await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while sim.telemetry_requests() < 4 {
        assert!(Instant::now() < deadline, "no start look");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let at_start = sim.telemetry_requests();
    let t0 = std::time::Instant::now();
    let got = send(addr, "POST", "/v1/chat/completions", &openai_chat("hi")).await;
    assert_eq!(got.status, 200);
    let active = t0.elapsed();
    let _ = settled_calls(&engine, 1).await;
    let during = sim.telemetry_requests() - at_start;
    // Each look asks /slots and /metrics: at dispatch, when the request
    // names its model, then at most one per pace::QUIET_LOOK (every 500 ms
    // would be 8 more looks in the 4 s wait).
    let quiet = speedtap::engine::telemetry::pace::QUIET_LOOK;
    let looks = 2 + (active.as_millis() / quiet.as_millis()) as u64;
    println!("llama-server looks: {during} requests over {active:?}");
    assert!(
        during <= 2 * looks + 1,
        "{during} requests for at most {looks} looks"
    );
    engine.shutdown(Duration::from_secs(1)).await;
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_answered_404_is_never_asked_again() {
    // A server with the model routes only: every telemetry GET is a 404.
    each_endpoint_is_asked_once(ScriptedUpstream::start(model_route_only()).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_answered_200_with_something_else_is_never_asked_again() {
    // LM Studio's way: every unknown path is a 200 with an error object.
    let mut scripts = model_route_only();
    for path in ["/api/ps", "/slots", "/props", "/metrics"] {
        let error = format!("{{\"error\":\"Unexpected endpoint or method. (GET {path})\"}}");
        let script = Script::sse(vec![(Duration::ZERO, Bytes::from(error))])
            .with_content_type("application/json");
        scripts.insert(path.to_owned(), script);
    }
    each_endpoint_is_asked_once(ScriptedUpstream::start(scripts).await).await;
}

fn model_route_only() -> std::collections::HashMap<String, Script> {
    std::collections::HashMap::from([(
        "/v1/chat/completions".to_owned(),
        openai_chat_script(
            3,
            Duration::from_millis(300),
            Duration::from_millis(20),
            None,
        ),
    )])
}

/// Three calls through a telemetry route to `upstream`: each telemetry
/// endpoint, and each place a version is published, was asked once, at
/// the start look, and never again.
async fn each_endpoint_is_asked_once(upstream: ScriptedUpstream) {
    let engine = telemetry_engine(&upstream.url()).await;
    let addr = engine.routes[0].listen;
    for _ in 0..3 {
        let got = send(addr, "POST", "/v1/chat/completions", &openai_chat("hi")).await;
        assert_eq!(got.status, 200);
    }
    let _ = settled_calls(&engine, 3).await;
    let paths: Vec<String> = upstream
        .seen
        .lock()
        .unwrap()
        .requests
        .iter()
        .map(|(_, path, _)| path.clone())
        .collect();
    let telemetry: Vec<&str> = paths
        .iter()
        .map(String::as_str)
        .filter(|p| !p.starts_with("/v1/"))
        .collect();
    let mut sorted = telemetry.clone();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        [
            "/api/ps",
            "/api/version",
            "/metrics",
            "/props",
            "/slots",
            "/version"
        ],
        "each endpoint once: {telemetry:?}"
    );
    engine.shutdown(Duration::from_secs(1)).await;
}

/// Every explained wait of each call, by call id, until `n` calls settle;
/// and the settled calls.
async fn waits_until_settled(
    rx: &mut tokio::sync::mpsc::Receiver<EngineEvent>,
    n: usize,
) -> (std::collections::HashMap<String, Vec<Seen>>, Vec<Call>) {
    let mut seen: std::collections::HashMap<String, Vec<Seen>> = Default::default();
    let mut settled = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while settled.len() < n {
        let event = tokio::time::timeout_at(deadline, rx.recv())
            .await
            .unwrap_or_else(|_| panic!("{n} calls did not settle; saw {seen:?}"))
            .expect("engine events");
        match event {
            EngineEvent::Speed { call, speed, .. } => {
                if let (Phase::AwaitingFirstToken, Some(wait)) = (speed.phase, speed.wait) {
                    seen.entry(call.id).or_default().push(Seen {
                        elapsed_ms: speed.elapsed_ms,
                        wait,
                    });
                }
            }
            EngineEvent::Settled(call) => settled.push(call),
            _ => {}
        }
    }
    (seen, settled)
}

/// An Ollama chat that keeps its model loaded.
fn ollama_chat_kept(model: &str) -> Bytes {
    Bytes::from(
        serde_json::json!({
            "model": model, "stream": true,
            "messages": [{"role": "user", "content": "hi"}]
        })
        .to_string(),
    )
}

/// Sends `n` calls at once and waits for all of them to settle.
async fn burst(
    addr: std::net::SocketAddr,
    rx: &mut tokio::sync::mpsc::Receiver<EngineEvent>,
    path: &'static str,
    body: Bytes,
    n: usize,
) -> (std::collections::HashMap<String, Vec<Seen>>, Vec<Call>) {
    let sends: Vec<_> = (0..n)
        .map(|_| tokio::spawn(send_with(addr, "POST", path, body.clone(), &[])))
        .collect();
    let out = waits_until_settled(rx, n).await;
    for s in sends {
        assert_eq!(s.await.unwrap().status, 200);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_with_no_parallel_limit_never_queues_concurrent_calls() {
    let (sim, engine, addr, mut rx) = sim_and_engine(SimConfig {
        ttft: Duration::from_millis(400),
        tokens: 4,
        ..SimConfig::default()
    })
    .await;
    let body = Bytes::from(openai_chat("hi"));
    // A first call loads the model; then bursts of two and of five.
    let _ = burst(addr, &mut rx, "/v1/chat/completions", body.clone(), 1).await;
    for n in [2, 5] {
        let (seen, settled) = burst(addr, &mut rx, "/v1/chat/completions", body.clone(), n).await;
        for (id, waits) in &seen {
            assert!(
                waits.iter().all(|s| s.wait.reason != WaitReason::Queued),
                "{id} was called queued: {waits:?}"
            );
        }
        for call in &settled {
            let d = &call.details;
            assert_eq!(d.queued_ms, None, "{} stored a queue", call.identity.id);
            assert_ne!(d.wait.as_ref().map(|w| w.reason), Some(WaitReason::Queued));
        }
    }
    engine.shutdown(Duration::from_secs(1)).await;
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ollama_like_serial_server_queues_the_second_call_behind_the_first() {
    let (sim, engine, addr, mut rx) = sim_and_engine(SimConfig {
        slots: Some(1),
        publishes_slots: false,
        ttft: Duration::from_millis(300),
        tokens: 4,
        ..SimConfig::default()
    })
    .await;
    let body = ollama_chat_kept("llama3");
    // Two bursts of three calls served in turn: six pairs in flight
    // together, none streaming at the same time.
    for _ in 0..2 {
        let _ = burst(addr, &mut rx, "/api/chat", body.clone(), 3).await;
    }
    // A long call streams; a second one sent meanwhile waits behind it.
    let long: &[(&str, &str)] = &[("x-sim-tokens", "60"), ("x-sim-tps", "30")];
    let first = tokio::spawn(send_with(addr, "POST", "/api/chat", body.clone(), long));
    let first_id = "c-000007";
    events_until(&mut rx, |e| {
        matches!(e, EngineEvent::Speed { call, speed, .. }
            if call.id == first_id && speed.phase == Phase::Responding)
    })
    .await;
    let second = tokio::spawn(send_with(addr, "POST", "/api/chat", body, &[]));
    let (seen, _) = waits_until_settled(&mut rx, 2).await;
    assert_eq!(first.await.unwrap().status, 200);
    assert_eq!(second.await.unwrap().status, 200);
    let b = &seen["c-000008"];
    assert_eq!(reasons(b), [WaitReason::Queued], "{b:?}");
    assert!(b
        .iter()
        .filter(|s| s.wait.reason == WaitReason::Queued)
        .all(|s| s.wait.position == Some(1)));
    engine.shutdown(Duration::from_secs(1)).await;
    sim.shutdown().await;
}
