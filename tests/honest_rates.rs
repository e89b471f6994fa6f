//! One honest rule for every rate shown, end to end: a real engine with
//! its control API in front of a scripted upstream and the simulator. The
//! per-call rates, the global reading (`/api/v1/stats` and the `stats`
//! event) and the hour's high are read from outside while real streams
//! pass through the proxy.
//!
//! Real time, since the engine runs its own actor system: every wait is on
//! an engine event with a deadline, never a sleep.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use speedtap::model::{EngineEvent, EngineQueries, Stats};
use speedtap::simulate::{SimConfig, SimServer};

use crate::util::proxy::*;

const CHAT: &str = "/v1/chat/completions";
const BODY: &str = r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;

fn chunk(text: &str) -> String {
    format!(
        "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{text}\"}},\"finish_reason\":null}}]}}\n\n"
    )
}

/// 300 one-token words in one 30 ms burst at 100 ms, then the stream held
/// open until its end at 3.1 s.
fn burst_held_open() -> Script {
    let start = Duration::from_millis(100);
    let mut frames = vec![(
        start,
        Bytes::from(format!(
            "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"role\":\"assistant\",\"content\":null}}}}]}}\n\n{}",
            chunk(" the")
        )),
    )];
    for i in 1..300u32 {
        frames.push((
            start + Duration::from_micros(100) * i,
            Bytes::from(chunk(" the")),
        ));
    }
    frames.push((
        Duration::from_millis(3_100),
        Bytes::from(
            "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n",
        ),
    ));
    Script::sse(frames)
}

async fn stats_doc(api: SocketAddr) -> Stats {
    let got = send(api, "GET", "/api/v1/stats", "").await;
    assert_eq!(got.status, 200);
    serde_json::from_slice(&got.body()).unwrap()
}

/// Every event until call `id` settled and one `stats` reading after it.
async fn events_of(
    rx: &mut tokio::sync::mpsc::Receiver<EngineEvent>,
    id: &str,
) -> Vec<EngineEvent> {
    let mut settled = false;
    events_until(rx, |e| match e {
        EngineEvent::Settled(call) if call.identity.id == id => {
            settled = true;
            false
        }
        EngineEvent::Stats(_) => settled,
        _ => false,
    })
    .await
}

/// Every global reading's `tps` and `high`.
type Readings = Vec<(Option<f64>, Option<f64>)>;

/// The live rates call `id` published, and every global `tps` and `high`.
fn rates(events: &[EngineEvent], id: &str) -> (Vec<Option<f64>>, Readings) {
    let mut live = Vec::new();
    let mut global = Vec::new();
    for e in events {
        match e {
            EngineEvent::Speed { call, speed, .. } if call.id == id && !speed.is_final => {
                live.push(speed.output_tokens_per_second);
            }
            EngineEvent::Stats(s) => global.push((s.tps, s.high)),
            _ => {}
        }
    }
    (live, global)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_held_open_shows_no_rate_anywhere_and_leaves_the_global_reading_unmoved() {
    let up = ScriptedUpstream::start(HashMap::from([(CHAT.to_owned(), burst_held_open())])).await;
    let engine = engine_with(&up.url(), |o| o.api = Some("127.0.0.1:0".parse().unwrap())).await;
    let api = engine.api.unwrap();
    let before = stats_doc(api).await;
    assert_eq!((before.tps, before.high), (None, None));
    let mut rx = engine.handle.subscribe().await;
    let got = send(engine.routes[0].listen, "POST", CHAT, BODY).await;
    assert_eq!(got.status, 200);
    let events = events_of(&mut rx, "c-000001").await;
    let (live, global) = rates(&events, "c-000001");
    assert!(live.len() >= 2, "{live:?}");
    assert!(live.iter().all(Option::is_none), "a live rate: {live:?}");
    assert!(
        global.len() >= 2,
        "the reading was published while it streamed"
    );
    assert!(
        global.iter().all(|g| *g == (None, None)),
        "the global reading moved: {global:?}"
    );
    let call = settled_calls(&engine, 1).await.remove(0);
    let speed = call.speed.unwrap();
    assert_eq!(speed.output_tokens, 300);
    assert_eq!(speed.output_tokens_per_second, None);
    let after = stats_doc(api).await;
    assert_eq!((after.tps, after.high, after.low), (None, None, None));
    engine.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steady_forty_tokens_a_second_reads_within_two_percent_everywhere() {
    let sim = SimServer::start("127.0.0.1:0", SimConfig::default())
        .await
        .unwrap();
    let engine = engine_with(&sim.base_url(), |o| {
        o.api = Some("127.0.0.1:0".parse().unwrap());
    })
    .await;
    let api = engine.api.unwrap();
    let mut rx = engine.handle.subscribe().await;
    let got = send_with(
        engine.routes[0].listen,
        "POST",
        CHAT,
        Bytes::from(BODY),
        &[
            ("x-sim-ttft-ms", "100"),
            ("x-sim-tps", "40"),
            ("x-sim-tokens", "160"),
        ],
    )
    .await;
    assert_eq!(got.status, 200);
    let events = events_of(&mut rx, "c-000001").await;
    let (live, global) = rates(&events, "c-000001");
    let live: Vec<f64> = live.into_iter().flatten().collect();
    let tps: Vec<f64> = global.iter().filter_map(|(tps, _)| *tps).collect();
    println!("live readings {live:?}; global readings {tps:?}");
    assert!(live.len() >= 5, "{live:?}");
    assert!(tps.len() >= 2, "{global:?}");
    for r in live.iter().chain(&tps) {
        assert!(
            (39.2..=40.8).contains(r),
            "a reading off by more than 2%: {r}"
        );
    }
    let settled = stats_doc(api).await;
    let high = settled.high.expect("the settled call sets the hour's high");
    println!("hour's high {high}");
    assert!(high <= 40.4, "{high}");
    assert!(high >= 39.6, "{high}");
    // Nothing else is in the hour: the high never was above it.
    assert!(
        global.iter().all(|(_, h)| h.is_none_or(|h| h <= 40.4)),
        "{global:?}"
    );
    engine.shutdown(Duration::from_secs(1)).await;
    sim.shutdown().await;
}
