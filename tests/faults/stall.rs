//! A stalled upstream. The whole engine, the upstream and the client run on
//! one paused-time runtime, so "a minute of silence" costs no real minute:
//! tokio advances its clock whenever every task waits on a timer. The
//! actors run on their own threads with real time; waits on them are
//! bounded by a real-time watchdog, not by a (paused) tokio timer, which
//! the auto-advance would fire at once.

use std::time::Duration;

use speedtap::config::Settings;
use speedtap::host::{Engine, EngineOptions, RunningEngine};
use speedtap::model::{Call, CallStatus, CallsQuery, EngineEvent, EngineQueries};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::proxy_support::engine_with;
use crate::wire::{chat_events, post, Conn, RawUpstream, CHAT, SSE_HEAD};

const STALL: Duration = Duration::from_secs(60);

/// Fires after `d` of real (wall-clock) time.
fn real_deadline(d: Duration) -> oneshot::Receiver<()> {
    let (tx, rx) = oneshot::channel();
    std::thread::spawn(move || {
        std::thread::sleep(d);
        let _ = tx.send(());
    });
    rx
}

/// [`crate::quiescent`] for paused time: `n` calls, none in flight,
/// bounded by 20 s of real time.
async fn settled(engine: &RunningEngine, n: usize) -> Vec<Call> {
    let mut deadline = real_deadline(crate::SETTLE);
    loop {
        let mut events = engine.handle.subscribe().await;
        let calls = engine
            .handle
            .calls(CallsQuery {
                limit: usize::MAX,
                route: None,
                unmetered: true,
            })
            .await;
        if calls.len() >= n && calls.iter().all(|c| c.status.is_settled()) {
            return calls;
        }
        loop {
            tokio::select! {
                e = events.recv() => match e {
                    Some(EngineEvent::Settled(_)) | None => break,
                    Some(_) => {}
                },
                _ = &mut deadline => panic!("calls did not settle: {calls:#?}"),
            }
        }
    }
}

/// An upstream that sends 5 tokens, goes silent for [`STALL`], then sends
/// the rest. Reports `true` when it finished writing, `false` when the
/// proxy hung up on it.
async fn stalling_upstream() -> (RawUpstream, mpsc::UnboundedReceiver<bool>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let up = RawUpstream::start(move |mut c| {
        let tx = tx.clone();
        async move {
            let Some(req) = c.head().await else { return };
            let _ = c.body(&req).await;
            let events = chat_events(10);
            let _ = c.write(SSE_HEAD).await;
            for e in &events[..5] {
                let _ = c.chunk(e).await;
            }
            tokio::select! {
                _ = tokio::time::sleep(STALL) => {}
                _ = c.closed() => {
                    let _ = tx.send(false);
                    return;
                }
            }
            for e in &events[5..] {
                if c.chunk(e).await.is_err() {
                    let _ = tx.send(false);
                    return;
                }
            }
            let _ = c.write(b"0\r\n\r\n").await;
            let _ = tx.send(true);
            c.closed().await;
        }
    })
    .await;
    (up, rx)
}

/// Reads a response; returns its body and the (tokio) time from the
/// request to the end of the body.
async fn read(engine: &RunningEngine) -> (crate::wire::Body, Duration) {
    let addr = engine.routes[0].listen;
    let mut c = Conn::connect(addr).await;
    let t0 = Instant::now();
    c.write(&post(addr, "/v1/chat/completions", CHAT, &[]))
        .await
        .unwrap();
    let head = c.head().await.expect("head");
    assert_eq!(head.status(), 200);
    let body = c.body(&head).await;
    (body, t0.elapsed())
}

async fn paused_engine(up: &RawUpstream, idle: Option<Duration>) -> RunningEngine {
    engine_with(&up.url(), |o| {
        o.estimator = std::sync::Arc::new(speedtap::tokens::WordCounter);
        o.proxy_limits.idle_timeout = idle;
    })
    .await
}

#[tokio::test(start_paused = true)]
async fn a_minute_long_stall_is_not_cut_by_default() {
    let (up, mut done) = stalling_upstream().await;
    let engine = paused_engine(&up, None).await;
    let (body, took) = read(&engine).await;
    assert!(took >= STALL, "the stall happened: {took:?}");
    assert!(body.complete, "the slow stream was cut");
    assert_eq!(body.bytes, chat_events(10).concat());
    assert_eq!(done.recv().await, Some(true));
    let calls = settled(&engine, 1).await;
    assert_eq!(calls[0].status, CallStatus::Ok);
    assert_eq!(calls[0].speed.as_ref().unwrap().output_tokens, 10);
    engine.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(start_paused = true)]
async fn a_configured_idle_timeout_cuts_a_silent_upstream() {
    let idle = Duration::from_secs(30);
    let (up, mut done) = stalling_upstream().await;
    let engine = paused_engine(&up, Some(idle)).await;
    let (body, took) = read(&engine).await;
    assert!(!body.complete, "the client sees the cut");
    assert_eq!(body.bytes, chat_events(10)[..5].concat());
    assert!(
        took >= idle && took < STALL,
        "cut after the idle timeout, before the stall ended: {took:?}"
    );
    // The upstream connection was dropped with the cut.
    assert_eq!(done.recv().await, Some(false));
    let calls = settled(&engine, 1).await;
    assert_eq!(calls[0].status, CallStatus::Abandoned);
    assert_eq!(calls[0].speed.as_ref().unwrap().output_tokens, 5);
    engine.shutdown(Duration::from_secs(1)).await;
}

/// The same on real time with a short timeout, configured the way
/// `speedtap run` does it (settings → engine options).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_timeout_from_settings_cuts_on_real_time() {
    let up = RawUpstream::start(|mut c| async move {
        let Some(req) = c.head().await else { return };
        let _ = c.body(&req).await;
        let _ = c.write(SSE_HEAD).await;
        let _ = c.chunk(&chat_events(1)[0]).await;
        c.closed().await;
    })
    .await;
    let settings = Settings {
        routes: vec![speedtap::model::RouteSpec::new("t", "127.0.0.1:0", &up.url()).unwrap()],
        idle_timeout: Some(Duration::from_millis(300)),
        ..Settings::default()
    };
    let mut options = EngineOptions::from_settings(&settings);
    options.api = None;
    options.estimator = std::sync::Arc::new(speedtap::tokens::WordCounter);
    let engine = Engine::start(options).await.unwrap();
    let real = std::time::Instant::now();
    let (body, _) = read(&engine).await;
    let took = real.elapsed();
    assert!(!body.complete);
    assert_eq!(body.bytes, chat_events(1)[0]);
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(10),
        "{took:?}"
    );
    let calls = crate::quiescent(&engine, 1).await;
    assert_eq!(calls[0].status, CallStatus::Abandoned);
    engine.shutdown(Duration::from_secs(1)).await;
}

/// The option's two spellings: `idle_timeout = "..."` in the config file
/// and `--idle-timeout` (the flag wins), both humantime, both refusing 0.
#[test]
fn idle_timeout_is_configurable_by_file_and_flag() {
    use clap::Parser;
    use speedtap::cli::args::{Cli, Command};
    use speedtap::config::{parse_config, resolve, CliOverrides};

    let file = parse_config("idle_timeout = \"5m\"\n", "t.toml").unwrap();
    assert_eq!(file.idle_timeout, Some(Duration::from_secs(300)));
    let s = resolve(Some(file.clone()), CliOverrides::default()).unwrap();
    assert_eq!(s.idle_timeout, Some(Duration::from_secs(300)));
    let flags = CliOverrides {
        idle_timeout: Some(Duration::from_secs(90)),
        ..Default::default()
    };
    assert_eq!(
        resolve(Some(file.clone()), flags).unwrap().idle_timeout,
        Some(Duration::from_secs(90))
    );
    // Saved and read back unchanged (the tray rewrites the file).
    let again = parse_config(&file.to_toml(), "t.toml").unwrap();
    assert_eq!(again.idle_timeout, file.idle_timeout);
    // Off unless set.
    assert_eq!(
        resolve(None, CliOverrides::default()).unwrap().idle_timeout,
        None
    );

    let e = parse_config("slow_ttft_ms = 10\nidle_timeout = \"0s\"\n", "t.toml").unwrap_err();
    assert_eq!(e.line(), Some(2), "{e}");
    assert!(e.to_string().contains("idle_timeout"), "{e}");
    assert!(parse_config("idle_timeout = \"soon\"\n", "t.toml").is_err());

    let Command::Run(args) = Cli::try_parse_from(["speedtap", "run", "--idle-timeout", "2m"])
        .unwrap()
        .command
    else {
        panic!("not run");
    };
    assert_eq!(args.idle_timeout, Some(Duration::from_secs(120)));
    assert!(Cli::try_parse_from(["speedtap", "run", "--idle-timeout", "0"]).is_err());
}
