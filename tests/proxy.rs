//! The interceptor end to end over real sockets: a scripted upstream, the
//! engine in-process, a client that records every frame.

use crate::util::proxy as proxy_support;

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use proxy_support::*;
use speedtap::model::ApiKind;
use speedtap::model::{CallStatus, EngineEvent, EngineQueries, FailureKind};
use speedtap::model::{Phase, TokenSource};
use speedtap::simulate::{SimConfig, SimServer};

const MS: Duration = Duration::from_millis(1);

fn scripts(pairs: Vec<(&str, Script)>) -> HashMap<String, Script> {
    pairs.into_iter().map(|(p, s)| (p.to_owned(), s)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_chat_is_byte_exact_and_measured() {
    // 50 one-token words, first at 300 ms, then every 20 ms: TTFT 300 ms,
    // decode rate (50 - 1) / 0.98 s = 50 tok/s.
    let script = openai_chat_script(50, 300 * MS, 20 * MS, Some(50));
    let expected = script.body();
    let up = ScriptedUpstream::start(scripts(vec![("/v1/chat/completions", script)])).await;
    let engine = engine_for(&up.url()).await;
    let got = send(
        engine.routes[0].listen,
        "POST",
        "/v1/chat/completions",
        r#"{"model":"m1","stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
    )
    .await;
    assert_eq!(got.status, 200);
    assert_eq!(got.body(), expected, "bytes changed on the way");
    assert_eq!(got.frames.len(), 50, "frames were merged or split");
    let calls = settled_calls(&engine, 1).await;
    let call = &calls[0];
    assert_eq!(call.identity.api, ApiKind::OpenaiChat);
    assert_eq!(call.identity.model.as_deref(), Some("m1"));
    assert_eq!(call.status, CallStatus::Ok);
    assert_eq!(call.http_status, Some(200));
    assert_eq!(call.input_tokens, Some(5));
    let speed = call.speed.as_ref().unwrap();
    assert_eq!(speed.phase, Phase::Complete);
    assert!(speed.is_final);
    assert_eq!(speed.output_tokens, 50);
    assert_eq!(speed.token_source, TokenSource::Provider);
    let ttft = speed.time_to_first_token_ms.unwrap();
    assert!((300..340).contains(&ttft), "ttft {ttft}");
    let rate = speed.output_tokens_per_second.unwrap();
    assert!((rate - 50.0).abs() < 2.5, "rate {rate}");
    // What the upstream saw: identity encoding, its own Host, auth passed.
    let headers = up.seen.lock().unwrap().requests[0].2.clone();
    assert_eq!(
        headers.get("accept-encoding").map(String::as_str),
        Some("identity")
    );
    assert_eq!(headers.get("host"), Some(&up.addr.to_string()));
    assert_eq!(
        headers.get("authorization").map(String::as_str),
        Some("Bearer sk-secret-token")
    );
    engine.shutdown(Duration::from_secs(1)).await;
}

/// Every protocol the simulator speaks: record its real output once, then
/// replay those exact bytes through the proxy at a steady pace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_protocol_is_byte_exact_and_metered() {
    let sim = SimServer::start(
        "127.0.0.1:0",
        SimConfig {
            ttft: 5 * MS,
            tokens_per_second: 1000.0,
            tokens: 30,
            usage: true,
            ..SimConfig::default()
        },
    )
    .await
    .unwrap();
    let cases: [(&str, &str, ApiKind); 8] = [
        (
            "/v1/chat/completions",
            r#"{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[]}"#,
            ApiKind::OpenaiChat,
        ),
        (
            "/v1/completions",
            r#"{"model":"m","stream":true,"prompt":"x"}"#,
            ApiKind::OpenaiCompletions,
        ),
        (
            "/v1/responses",
            r#"{"model":"m","stream":true,"input":"x"}"#,
            ApiKind::OpenaiResponses,
        ),
        (
            "/v1/messages",
            r#"{"model":"m","stream":true,"max_tokens":64,"messages":[]}"#,
            ApiKind::AnthropicMessages,
        ),
        (
            "/api/chat",
            r#"{"model":"m","messages":[]}"#,
            ApiKind::OllamaChat,
        ),
        (
            "/api/generate",
            r#"{"model":"m","prompt":"x"}"#,
            ApiKind::OllamaGenerate,
        ),
        (
            "/completion",
            r#"{"prompt":"x","stream":true}"#,
            ApiKind::LlamacppCompletion,
        ),
        (
            "/generate_stream",
            r#"{"inputs":"x"}"#,
            ApiKind::TgiGenerate,
        ),
    ];
    let mut table = HashMap::new();
    let mut expected = HashMap::new();
    for (path, body, _) in &cases {
        let direct = send(sim.local_addr(), "POST", path, body).await;
        assert_eq!(direct.status, 200, "{path}");
        let ct = direct.headers["content-type"].to_str().unwrap().to_owned();
        // Replay the recorded frames: first at 200 ms, then every 25 ms.
        let frames: Vec<(Duration, Bytes)> = direct
            .frames
            .iter()
            .enumerate()
            .map(|(i, (_, b))| (200 * MS + 25 * MS * i as u32, b.clone()))
            .collect();
        assert!(frames.len() >= 25, "{path}: {} frames", frames.len());
        let script = Script::sse(frames).with_content_type(&ct);
        expected.insert(path.to_string(), script.body());
        table.insert(path.to_string(), script);
    }
    let up = ScriptedUpstream::start(table).await;
    let engine = engine_for(&up.url()).await;
    for (i, (path, body, api)) in cases.iter().enumerate() {
        let got = send(engine.routes[0].listen, "POST", path, body).await;
        assert_eq!(&got.body(), &expected[*path], "{path}: bytes changed");
        let calls = settled_calls(&engine, i + 1).await;
        let call = calls
            .iter()
            .find(|c| c.identity.api == *api)
            .unwrap_or_else(|| panic!("{path}: no {api} call in {calls:#?}"));
        assert_eq!(call.status, CallStatus::Ok, "{path}: {call:#?}");
        let speed = call.speed.as_ref().unwrap();
        assert_eq!(speed.output_tokens, 30, "{path}: {speed:?}");
        let ttft = speed.time_to_first_token_ms.unwrap();
        assert!((200..260).contains(&ttft), "{path}: ttft {ttft}");
        // 30 tokens over about 29 frames 25 ms apart: about 40 tok/s.
        let rate = speed.output_tokens_per_second.unwrap();
        assert!((30.0..50.0).contains(&rate), "{path}: rate {rate}");
    }
    engine.shutdown(Duration::from_secs(1)).await;
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_upstream_gets_a_502_naming_it() {
    // A port nothing listens on.
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = free.local_addr().unwrap().port();
    drop(free);
    let upstream = format!("http://127.0.0.1:{port}");
    let engine = engine_for(&upstream).await;
    let got = send(
        engine.routes[0].listen,
        "POST",
        "/v1/chat/completions",
        "{}",
    )
    .await;
    assert_eq!(got.status, 502);
    assert_eq!(got.headers["content-type"], "application/json");
    let body: serde_json::Value = serde_json::from_slice(&got.body()).unwrap();
    assert_eq!(body["upstream"], upstream);
    assert_eq!(body["route"], "t");
    assert!(
        body["cause"]
            .as_str()
            .unwrap()
            .to_lowercase()
            .contains("connect"),
        "{body}"
    );
    let calls = settled_calls(&engine, 1).await;
    assert_eq!(calls[0].status, CallStatus::UpstreamError);
    assert_eq!(calls[0].http_status, Some(502));
    let failure = calls[0].details.failure.as_ref().expect("a failure");
    assert_eq!(failure.kind, FailureKind::Unreachable);
    assert_eq!(failure.label(calls[0].http_status), "unreachable");
    engine.shutdown(Duration::from_secs(1)).await;
}

/// The upstream is down, so hyper never reads the request body; the proxy
/// reads it after the failure, and the failed call still names the model
/// asked for, even one named after 256 KiB of messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_502_names_the_model_its_request_asked_for() {
    let engine = engine_for(&format!("http://127.0.0.1:{}", free_port())).await;
    let long = "x".repeat(256 * 1024);
    let body = format!(
        r#"{{"messages":[{{"role":"user","content":"{long}"}}],"model":"m-late","stream":true}}"#
    );
    for (i, body) in [r#"{"model":"m-early"}"#.to_owned(), body]
        .iter()
        .enumerate()
    {
        let got = send(
            engine.routes[0].listen,
            "POST",
            "/v1/chat/completions",
            body,
        )
        .await;
        assert_eq!(got.status, 502);
        settled_calls(&engine, i + 1).await;
    }
    let calls = settled_calls(&engine, 2).await;
    let models: Vec<Option<&str>> = calls.iter().map(|c| c.identity.model.as_deref()).collect();
    assert_eq!(models, [Some("m-late"), Some("m-early")], "{calls:#?}");
    assert!(calls
        .iter()
        .all(|c| c.status == CallStatus::UpstreamError && c.http_status == Some(502)));
    engine.shutdown(Duration::from_secs(1)).await;
}

/// A port nothing listens on now.
fn free_port() -> u16 {
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    free.local_addr().unwrap().port()
}

/// Every call the engine lists, settled or not.
async fn all_calls(engine: &speedtap::host::RunningEngine) -> Vec<speedtap::model::Call> {
    engine
        .handle
        .calls(speedtap::model::CallsQuery {
            limit: 10_000,
            route: None,
            unmetered: true,
        })
        .await
}

/// A route whose upstream is its own listener (no start-time check stands
/// between the engine and it here): the request comes back over the
/// proxy's own connection and is answered 508, once, not forwarded again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_looping_into_its_own_route_is_answered_508_and_forwarded_once() {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let route =
        speedtap::model::RouteSpec::new("self", &listen, &format!("http://{listen}")).unwrap();
    let options = speedtap::host::EngineOptions::new(vec![route]);
    let engine = speedtap::host::Engine::start(options).await.unwrap();
    let body = r#"{"model":"m1","stream":true}"#;
    let got = send(
        engine.routes[0].listen,
        "POST",
        "/v1/chat/completions",
        body,
    )
    .await;
    assert_eq!(got.status, 508);
    let answer: serde_json::Value = serde_json::from_slice(&got.body()).unwrap();
    assert!(
        answer["error"].as_str().unwrap().contains("loop detected"),
        "{answer}"
    );
    let calls = settled_calls(&engine, 1).await;
    assert_eq!(calls.len(), 1, "forwarded more than once: {calls:#?}");
    assert_eq!(calls[0].http_status, Some(508));
    engine.shutdown(Duration::from_secs(1)).await;
}

/// Route `a` forwards to route `b`'s listener and `b` to `a`'s: each
/// request is forwarded by the route it was sent to, then refused by the
/// other with 508. Two requests, two calls, however long the test waits.
/// (The start's and a runtime add's checks refuse such routes; the engine
/// is handed them directly here, as a loop the checks can't see, through a
/// name that resolves here, reaches the same listeners.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loop_through_two_routes_is_answered_508_without_forwarding_more_than_once() {
    let a_port = free_port();
    let b_port = std::iter::repeat_with(free_port)
        .find(|p| *p != a_port)
        .unwrap();
    let (a_listen, b_listen) = (format!("127.0.0.1:{a_port}"), format!("127.0.0.1:{b_port}"));
    let a = speedtap::model::RouteSpec::new("a", &a_listen, &format!("http://{b_listen}")).unwrap();
    let b = speedtap::model::RouteSpec::new("b", &b_listen, &format!("http://{a_listen}")).unwrap();
    let options = speedtap::host::EngineOptions::new(vec![a, b]);
    let engine = speedtap::host::Engine::start(options).await.unwrap();
    let (a_listen, b_listen) = (engine.routes[0].listen, engine.routes[1].listen);
    let body = r#"{"model":"m1","stream":true}"#;
    for (to, route) in [(a_listen, "a"), (b_listen, "b")] {
        let got = send(to, "POST", "/v1/chat/completions", body).await;
        assert_eq!(got.status, 508, "sent to {route}");
    }
    let calls = settled_calls(&engine, 2).await;
    let mut routes: Vec<&str> = calls.iter().map(|c| c.identity.route.as_str()).collect();
    routes.sort_unstable();
    assert_eq!(routes, ["a", "b"], "{calls:#?}");
    assert!(
        calls.iter().all(|c| c.http_status == Some(508)),
        "{calls:#?}"
    );
    // Nothing went round behind the answers: no call besides these two.
    assert_eq!(all_calls(&engine).await.len(), 2);
    engine.shutdown(Duration::from_secs(1)).await;
}

/// A real streamed call, then 2,100 polls of `/api/tags` (as Open WebUI
/// makes all day): more than the 2,000 calls the list holds, yet the real
/// call is still listed, and the polls are listed only when asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unmetered_polls_never_push_a_real_call_out_of_the_list() {
    let tags = Script::sse(vec![(
        Duration::ZERO,
        Bytes::from_static(b"{\"models\":[]}"),
    )])
    .with_content_type("application/json");
    let up = ScriptedUpstream::start(scripts(vec![
        (
            "/v1/chat/completions",
            openai_chat_script(5, MS, MS, Some(5)),
        ),
        ("/api/tags", tags),
    ]))
    .await;
    let engine = engine_for(&up.url()).await;
    let addr = engine.routes[0].listen;
    let body = r#"{"model":"m1","stream":true}"#;
    assert_eq!(
        send(addr, "POST", "/v1/chat/completions", body)
            .await
            .status,
        200
    );
    let real = settled_calls(&engine, 1).await[0].identity.id.clone();
    for _ in 0..2_100 / 50 {
        let mut batch = tokio::task::JoinSet::new();
        for _ in 0..50 {
            batch.spawn(async move { send(addr, "GET", "/api/tags", "").await.status });
        }
        while let Some(status) = batch.join_next().await {
            assert_eq!(status.unwrap(), 200);
        }
    }
    // Each poll was reported before its answer left the proxy, so this
    // query is handled after every one of them.
    let query = |unmetered| speedtap::model::CallsQuery {
        limit: 10_000,
        route: None,
        unmetered,
    };
    let listed = engine.handle.calls(query(false)).await;
    let ids: Vec<&str> = listed.iter().map(|c| c.identity.id.as_str()).collect();
    assert_eq!(ids, [real.as_str()], "the real call was pushed out");
    let with_polls = engine.handle.calls(query(true)).await;
    assert!(with_polls.len() > 100, "{}", with_polls.len());
    assert!(with_polls.iter().any(|c| c.identity.id == real));
    assert!(with_polls
        .iter()
        .filter(|c| c.identity.id != real)
        .all(|c| c.status == CallStatus::Unmetered));
    engine.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_2xx_passes_through_unchanged_as_upstream_error() {
    let body = Bytes::from_static(
        br#"{"error":{"code":400,"message":"bad","type":"invalid_request_error"}}"#,
    );
    let mut script =
        Script::sse(vec![(10 * MS, body.clone())]).with_content_type("application/json");
    script.status = 400;
    let up = ScriptedUpstream::start(scripts(vec![("/v1/chat/completions", script)])).await;
    let engine = engine_for(&up.url()).await;
    let got = send(
        engine.routes[0].listen,
        "POST",
        "/v1/chat/completions",
        r#"{"stream":true}"#,
    )
    .await;
    assert_eq!(got.status, 400);
    assert_eq!(got.body(), body.to_vec());
    let calls = settled_calls(&engine, 1).await;
    assert_eq!(calls[0].status, CallStatus::UpstreamError);
    assert_eq!(calls[0].http_status, Some(400));
    // Failed, with the server's own message from its error body.
    let failure = calls[0].details.failure.as_ref().expect("a failure");
    assert_eq!(failure.kind, FailureKind::Http);
    assert_eq!(failure.label(calls[0].http_status), "HTTP 400");
    // Its name for the error, never its prose (which may quote the request).
    assert_eq!(failure.message.as_deref(), Some("invalid_request_error"));
    assert_eq!(calls[0].details.start, None, "no load, so not cold");
    engine.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_cut_mid_stream_is_abandoned_and_the_client_sees_it() {
    let mut script = openai_chat_script(40, 50 * MS, 5 * MS, Some(40));
    script.frames.truncate(10);
    script.ending = Ending::Cut;
    let up = ScriptedUpstream::start(scripts(vec![("/v1/chat/completions", script)])).await;
    let engine = engine_for(&up.url()).await;
    let got = send(
        engine.routes[0].listen,
        "POST",
        "/v1/chat/completions",
        r#"{"stream":true}"#,
    )
    .await;
    assert!(got.error.is_some(), "the client must see the cut");
    let calls = settled_calls(&engine, 1).await;
    assert_eq!(calls[0].status, CallStatus::Abandoned);
    let speed = calls[0].speed.as_ref().unwrap();
    assert!(speed.is_final);
    // Every token the client received was counted (the upstream may not
    // flush its last frame before the reset).
    let received = String::from_utf8_lossy(&got.body()).matches(" the").count() as u64;
    assert!(received >= 5, "{received}");
    assert_eq!(speed.output_tokens, received);
    assert_eq!(speed.output_tokens_per_second, None);
    // It broke off after the tokens it sent: the server's failure.
    let failure = calls[0].details.failure.as_ref().expect("a failure");
    assert_eq!(failure.kind, FailureKind::BrokeOff);
    assert_eq!(failure.after_tokens, received);
    assert_eq!(
        failure.label(calls[0].http_status),
        format!("broke after {received} tokens")
    );
    engine.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_hang_up_abandons_and_closes_upstream() {
    // A long stream; the client reads three frames and leaves.
    let script = openai_chat_script(200, 20 * MS, 20 * MS, None);
    let up = ScriptedUpstream::start(scripts(vec![("/v1/chat/completions", script)])).await;
    let engine = engine_for(&up.url()).await;
    let addr = engine.routes[0].listen;
    {
        use http_body_util::{BodyExt, Full};
        let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .unwrap();
        let conn = tokio::spawn(conn);
        let req = http::Request::post("/v1/chat/completions")
            .header("host", addr.to_string())
            .body(Full::new(Bytes::from_static(br#"{"stream":true}"#)))
            .unwrap();
        let mut body = sender.send_request(req).await.unwrap().into_body();
        for _ in 0..3 {
            body.frame().await.unwrap().unwrap();
        }
        conn.abort();
    }
    let calls = settled_calls(&engine, 1).await;
    assert_eq!(calls[0].status, CallStatus::Abandoned);
    assert!(calls[0].speed.as_ref().unwrap().output_tokens >= 3);
    // The client's doing, not the server's.
    let failure = calls[0].details.failure.as_ref().expect("a failure");
    assert_eq!(failure.kind, FailureKind::ClientLeft);
    assert!(!failure.is_error());
    // The upstream noticed: its stream was cancelled long before its end.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    while up.seen.lock().unwrap().cancelled == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "upstream kept streaming"
        );
        tokio::time::sleep(10 * MS).await;
    }
    engine.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_paths_pass_through_unmetered() {
    let mut script = Script::sse(vec![(MS, Bytes::from_static(b"{\"status\":\"ok\"}"))])
        .with_content_type("application/json");
    script.status = 200;
    let up = ScriptedUpstream::start(scripts(vec![("/health", script)])).await;
    let engine = engine_for(&up.url()).await;
    let got = send(engine.routes[0].listen, "GET", "/health", "").await;
    assert_eq!(got.body(), b"{\"status\":\"ok\"}");
    let calls = settled_calls(&engine, 1).await;
    assert_eq!(calls[0].status, CallStatus::Unmetered);
    assert_eq!(calls[0].identity.api, ApiKind::Unknown);
    assert_eq!(calls[0].speed, None);
    engine.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_first_token_alarm_fires_while_still_waiting() {
    // First token at 600 ms; threshold 200 ms.
    let script = openai_chat_script(5, 600 * MS, 10 * MS, None);
    let up = ScriptedUpstream::start(scripts(vec![("/v1/chat/completions", script)])).await;
    let engine = engine_with(&up.url(), |o| o.slow_ttft = 200 * MS).await;
    let mut events = engine.handle.subscribe().await;
    let addr = engine.routes[0].listen;
    let client = tokio::spawn(async move {
        send(
            addr,
            "POST",
            "/v1/chat/completions",
            r#"{"model":"qwen3:32b","stream":true}"#,
        )
        .await
    });
    let seen = events_until(&mut events, |e| matches!(e, EngineEvent::SlowFirstToken(_))).await;
    let Some(EngineEvent::SlowFirstToken(slow)) = seen.last() else {
        panic!("no alarm: {seen:#?}");
    };
    assert!(slow.waited_ms >= 200 && slow.waited_ms < 600, "{slow:?}");
    assert_eq!(slow.call.model.as_deref(), Some("qwen3:32b"));
    assert_eq!(
        slow.message(),
        format!(
            "qwen3:32b on t: no first token after {:.1} s",
            slow.waited_ms as f64 / 1000.0
        )
    );
    // It fired before any output was published.
    assert!(!seen.iter().any(
        |e| matches!(e, EngineEvent::Speed { speed, .. } if speed.time_to_first_token_ms.is_some())
    ));
    client.await.unwrap();
    engine.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_concurrent_streams_are_all_measured() {
    // 40 tokens 20 ms apart: a 780 ms span, above the 500 ms minimum.
    let script = openai_chat_script(40, 100 * MS, 20 * MS, Some(40));
    let expected = script.body();
    let up = ScriptedUpstream::start(scripts(vec![("/v1/chat/completions", script)])).await;
    let engine = engine_for(&up.url()).await;
    let addr = engine.routes[0].listen;
    let clients: Vec<_> = (0..64)
        .map(|i| {
            tokio::spawn(async move {
                send(
                    addr,
                    "POST",
                    "/v1/chat/completions",
                    &format!(r#"{{"model":"m{i}","stream":true}}"#),
                )
                .await
            })
        })
        .collect();
    for c in clients {
        assert_eq!(c.await.unwrap().body(), expected);
    }
    let calls = settled_calls(&engine, 64).await;
    assert_eq!(calls.len(), 64);
    for call in &calls {
        assert_eq!(call.status, CallStatus::Ok, "{call:?}");
        let speed = call.speed.as_ref().unwrap();
        assert_eq!(speed.output_tokens, 40);
        let ttft = speed.time_to_first_token_ms.unwrap();
        assert!((100..400).contains(&ttft), "{call:?}");
        let rate = speed.output_tokens_per_second.unwrap();
        // 39 gaps of 20 ms: 50 tok/s; generous for a loaded 2-core box.
        assert!((40.0..62.5).contains(&rate), "{call:?}");
    }
    engine.shutdown(Duration::from_secs(1)).await;
}

/// A client that sends its request and then shuts down its write
/// side (`nc -N`) is answered in full, and its call is recorded `ok`: the
/// kernel says the client still holds its socket, so the end of its input
/// is a half-close, not a hang-up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_half_closes_after_its_request_is_answered_and_metered() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let script = openai_chat_script(5, 20 * MS, 5 * MS, Some(5));
    let expected = script.body();
    let up = ScriptedUpstream::start(scripts(vec![("/v1/chat/completions", script)])).await;
    let engine = engine_for(&up.url()).await;
    let addr = engine.routes[0].listen;
    let body = r#"{"model":"m1","stream":true,"messages":[]}"#;
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    stream.shutdown().await.unwrap();
    let mut reply = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut reply))
        .await
        .expect("the proxy never closed the connection")
        .unwrap();
    let reply = String::from_utf8_lossy(&reply);
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    let sent = String::from_utf8_lossy(&expected);
    for event in sent.split("\n\n").filter(|e| !e.is_empty()) {
        assert!(reply.contains(event), "missing {event:?} in {reply}");
    }
    let calls = settled_calls(&engine, 1).await;
    assert_eq!(calls[0].status, CallStatus::Ok, "{:#?}", calls[0]);
    assert_eq!(calls[0].speed.as_ref().unwrap().output_tokens, 5);
    engine.shutdown(Duration::from_secs(1)).await;
}

/// A client that sends a non-streamed request and closes its socket for
/// good while the answer is still being generated: nothing has been
/// written to it yet, so only its input's end tells. That is a hang-up,
/// not a half-close: the call ends `abandoned` and the server stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_closes_before_the_head_of_a_whole_answer_is_abandoned() {
    use tokio::io::AsyncWriteExt;
    let mut script = openai_chat_script(5, 20 * MS, 5 * MS, Some(5));
    // The whole body comes at once, 10 s later.
    script.frames = vec![(10_000 * MS, Bytes::from(script.body()))];
    let up = ScriptedUpstream::start(scripts(vec![("/v1/chat/completions", script)])).await;
    let engine = engine_for(&up.url()).await;
    let addr = engine.routes[0].listen;
    let body = r#"{"model":"m1","stream":false,"messages":[]}"#;
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    // Once the request has reached the server, the client leaves.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while up.seen.lock().unwrap().requests.is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "never forwarded");
        tokio::task::yield_now().await;
    }
    drop(stream);
    let calls = settled_calls(&engine, 1).await;
    assert_eq!(calls[0].status, CallStatus::Abandoned, "{:#?}", calls[0]);
    engine.shutdown(Duration::from_secs(1)).await;
}

/// A client that half-closes after its request and then closes its
/// socket for good while the answer is still being generated (a client
/// library hanging up in two steps): the kernel's later look sees it
/// gone, so the call ends `abandoned` long before the answer, not `ok`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_half_closes_then_leaves_during_the_wait_is_abandoned() {
    use tokio::io::AsyncWriteExt;
    let mut script = openai_chat_script(5, 20 * MS, 5 * MS, Some(5));
    // The whole body comes at once, 10 s later.
    script.frames = vec![(10_000 * MS, Bytes::from(script.body()))];
    let up = ScriptedUpstream::start(scripts(vec![("/v1/chat/completions", script)])).await;
    let engine = engine_for(&up.url()).await;
    let addr = engine.routes[0].listen;
    let body = r#"{"model":"m1","stream":false,"messages":[]}"#;
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    stream.shutdown().await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while up.seen.lock().unwrap().requests.is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "never forwarded");
        tokio::task::yield_now().await;
    }
    drop(stream);
    let left = tokio::time::Instant::now();
    let calls = settled_calls(&engine, 1).await;
    assert_eq!(calls[0].status, CallStatus::Abandoned, "{:#?}", calls[0]);
    // The answer is 10 s away: the hang-up was seen, not the answer's end.
    assert!(
        left.elapsed() < Duration::from_secs(5),
        "{:?}",
        left.elapsed()
    );
    engine.shutdown(Duration::from_secs(1)).await;
}

/// A server that stalls 2 s after its end marker before ending
/// its body. The call settles at the marker (it leaves the live list while
/// the body is still open, with the marker's elapsed time); the client
/// still gets every byte, the late ones included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_settles_at_its_end_marker_while_the_server_stalls_before_closing() {
    let mut script = openai_chat_script(5, 50 * MS, 10 * MS, Some(5));
    script
        .frames
        .push((2_000 * MS, Bytes::from_static(b": closing\n\n")));
    let expected = script.body();
    let up = ScriptedUpstream::start(scripts(vec![("/v1/chat/completions", script)])).await;
    let engine = engine_for(&up.url()).await;
    let addr = engine.routes[0].listen;
    let client = tokio::spawn(async move {
        send(
            addr,
            "POST",
            "/v1/chat/completions",
            r#"{"model":"m1","stream":true,"messages":[]}"#,
        )
        .await
    });
    let calls = settled_calls(&engine, 1).await;
    assert!(
        !client.is_finished(),
        "the body had already ended: the test proves nothing"
    );
    let call = &calls[0];
    assert_eq!(call.status, CallStatus::Ok, "{call:#?}");
    let elapsed = call.speed.as_ref().unwrap().elapsed_ms;
    assert!(elapsed < 1_000, "elapsed {elapsed} ms counts the stall");
    let got = client.await.unwrap();
    assert_eq!(got.body(), expected, "bytes after the marker were lost");
    engine.shutdown(Duration::from_secs(1)).await;
}

/// An Ollama chat stream: `n` one-word lines, the first at `ttft`, then
/// one every `gap`, the last one `done` with its counts.
fn ollama_chat_lines(n: usize, ttft: Duration, gap: Duration) -> Vec<(Duration, Bytes)> {
    (0..n)
        .map(|i| {
            let line = if i + 1 < n {
                r#"{"model":"m1","message":{"role":"assistant","content":" the"},"done":false}"#
                    .to_owned()
            } else {
                format!(
                    r#"{{"model":"m1","message":{{"role":"assistant","content":""}},"done":true,"eval_count":{n},"eval_duration":{}}}"#,
                    gap.as_nanos() * (n as u128 - 1)
                )
            };
            (ttft + gap * i as u32, Bytes::from(format!("{line}\n")))
        })
        .collect()
}

/// Streams labelled with the wrong content type are framed by
/// their bytes. An SSE chat stream sent as `application/json` and an
/// Ollama NDJSON stream sent as `text/plain` both get the first token's
/// TTFT and a decode rate, not one burst; their bytes pass unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_with_the_wrong_content_type_are_framed_by_their_bytes() {
    let sse =
        openai_chat_script(30, 200 * MS, 20 * MS, Some(30)).with_content_type("application/json");
    let mut ndjson = Script::sse(ollama_chat_lines(30, 200 * MS, 20 * MS));
    ndjson = ndjson.with_content_type("text/plain; charset=utf-8");
    let expected = [sse.body(), ndjson.body()];
    let up = ScriptedUpstream::start(scripts(vec![
        ("/v1/chat/completions", sse),
        ("/api/chat", ndjson),
    ]))
    .await;
    let engine = engine_for(&up.url()).await;
    let addr = engine.routes[0].listen;
    let requests = [
        (
            "/v1/chat/completions",
            r#"{"model":"m1","stream":true,"messages":[]}"#,
        ),
        ("/api/chat", r#"{"model":"m1","messages":[]}"#),
    ];
    for (i, (path, body)) in requests.iter().enumerate() {
        let got = send(addr, "POST", path, body).await;
        assert_eq!(got.body(), expected[i], "{path}: bytes changed");
        let calls = settled_calls(&engine, i + 1).await;
        let call = &calls[0];
        assert_eq!(call.status, CallStatus::Ok, "{path}: {call:#?}");
        assert!(!call.details.one_burst, "{path}: metered as one burst");
        let speed = call.speed.as_ref().unwrap();
        let ttft = speed.time_to_first_token_ms.unwrap();
        assert!((200..400).contains(&ttft), "{path}: ttft {ttft}");
        let rate = speed.output_tokens_per_second;
        assert!(rate.is_some_and(|r| r > 20.0), "{path}: rate {rate:?}");
    }
    engine.shutdown(Duration::from_secs(1)).await;
}

/// A request head over the cap (408 KiB by default) is answered
/// 431 and not forwarded, also when it arrives in one piece, which hyper's
/// own buffer check let through up to about twice the cap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_head_over_the_cap_is_a_431_even_when_sent_in_one_piece() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let script = openai_chat_script(2, MS, MS, None);
    let up = ScriptedUpstream::start(scripts(vec![("/v1/chat/completions", script)])).await;
    let engine = engine_for(&up.url()).await;
    let addr = engine.routes[0].listen;
    let sizes = [
        (400, "HTTP/1.1 200"),
        (420, "HTTP/1.1 431"),
        (520, "HTTP/1.1 431"),
    ];
    let sizes = sizes
        .into_iter()
        .chain([640, 760].map(|k| (k, "HTTP/1.1 431")));
    for (kib, expected) in sizes {
        let body = r#"{"model":"m1","stream":true,"messages":[]}"#;
        let request = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nX-Big: {}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            "a".repeat(kib * 1024),
            body.len()
        );
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut reply = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut reply))
            .await
            .expect("no answer")
            .unwrap();
        let reply = String::from_utf8_lossy(&reply);
        assert!(reply.starts_with(expected), "{kib} KiB: {reply}");
    }
    assert_eq!(
        up.seen.lock().unwrap().requests.len(),
        1,
        "the head over the cap went upstream"
    );
    engine.shutdown(Duration::from_secs(1)).await;
}

/// A 200 stream whose server sends an error event after 5 tokens: failed
/// as a server error mid-stream, with the simulator's own message and the
/// tokens before it, never "error 200".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_event_mid_stream_is_a_failure_with_the_servers_message() {
    let sim = SimServer::start("127.0.0.1:0", SimConfig::default())
        .await
        .unwrap();
    let engine = engine_for(&format!("http://{}", sim.local_addr())).await;
    let got = send_with(
        engine.routes[0].listen,
        "POST",
        "/v1/chat/completions",
        Bytes::from_static(br#"{"model":"m","stream":true,"messages":[]}"#),
        &[("x-sim-error-after", "5")],
    )
    .await;
    assert_eq!(got.status, 200);
    let calls = settled_calls(&engine, 1).await;
    assert_eq!(calls[0].status, CallStatus::UpstreamError);
    let failure = calls[0].details.failure.as_ref().expect("a failure");
    assert_eq!(failure.kind, FailureKind::StreamError);
    assert_eq!(failure.after_tokens, 5);
    let label = failure.label(calls[0].http_status);
    assert_eq!(label, "server error mid-stream");
    // The simulator's OpenAI error event names no type: no prose is kept.
    assert!(
        failure
            .message
            .as_deref()
            .is_none_or(|m| !m.contains("simulated")),
        "{failure:?}"
    );
    engine.shutdown(Duration::from_secs(1)).await;
}
