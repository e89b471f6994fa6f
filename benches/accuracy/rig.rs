//! The measuring rig: the scripted upstream, speedtap in the path, and a
//! client with its own stopwatch, all in this process.
//!
//! Why an in-process `Engine` rather than a `speedtap run` child: the
//! client's stopwatch and speedtap's clock are then the same monotonic
//! clock, with no process boundary or SSE parsing between a snapshot and
//! its observation; the engine's subscription hands over every published
//! snapshot (the same events `GET /api/v1/events` serialises), so "the
//! last live estimate" is observed exactly. `Engine::start` is what
//! `speedtap run` itself calls, so the proxy and metering path is the
//! same code; the real binary is exercised end to end by
//! `tests/real_server.rs`.
//!
//! The client opens a fresh TCP connection (TCP_NODELAY) per call and
//! completes the HTTP/1.1 handshake before its stopwatch starts, so the
//! stopwatch covers exactly: request written, through the proxy to the
//! simulator and back, until the first frame holding token 0 arrives.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use memchr::memmem;
use speedtap::host::{Engine, EngineOptions, RunningEngine};
use speedtap::model::ApiKind;
use speedtap::model::RouteSpec;
use speedtap::model::Snapshot;
use speedtap::model::{CallStatus, EngineEvent, EngineQueries};
use speedtap::simulate::{SimConfig, SimServer};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::protocols;

/// The route the measured calls go through.
pub const ROUTE: &str = "accuracy";

/// How long one call may take to settle after its body ended.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(10);

/// One call to make: the API, the model it names (calibration is per
/// route and model) and the `x-sim-*` script.
pub struct CallSpec {
    pub api: ApiKind,
    pub model: String,
    pub sim: Vec<(&'static str, String)>,
}

/// What one call showed: the client's view and speedtap's.
pub struct CallResult {
    /// Request written to the first frame with token 0, ms (client clock).
    pub client_ttft_ms: Option<f64>,
    /// Every live (not final) snapshot speedtap published, in order.
    pub live: Vec<Snapshot>,
    /// The settled snapshot.
    pub settled: Snapshot,
    pub status: CallStatus,
}

pub struct Rig {
    sim: SimServer,
    engine: RunningEngine,
    proxy: SocketAddr,
    events: mpsc::Receiver<EngineEvent>,
    needle: Vec<u8>,
}

impl Rig {
    pub async fn start() -> Rig {
        let sim = SimServer::start("127.0.0.1:0", SimConfig::default())
            .await
            .expect("simulator starts");
        let route = RouteSpec::new(ROUTE, "127.0.0.1:0", &sim.base_url()).expect("route spec");
        let mut options = EngineOptions::new(vec![route]);
        options.metering_threads = 1;
        let engine = Engine::start(options).await.expect("engine starts");
        let proxy = engine.routes[0].listen;
        let events = engine.handle.subscribe().await;
        let mut rig = Rig {
            sim,
            engine,
            proxy,
            events,
            needle: protocols::first_token_needle(),
        };
        rig.warm_up().await;
        rig
    }

    /// One unrecorded call first: the one-time costs of a fresh process
    /// (the estimator's BPE tables, the actor threads' first messages, lazy
    /// statics in the HTTP stack) are not what the measures are about.
    async fn warm_up(&mut self) {
        let spec = CallSpec {
            api: ApiKind::OpenaiChat,
            model: "warm-up".into(),
            sim: vec![
                ("x-sim-ttft-ms", "0".into()),
                ("x-sim-tps", "1000".into()),
                ("x-sim-tokens", "30".into()),
                ("x-sim-usage", "true".into()),
            ],
        };
        let r = self.call(&spec).await;
        assert_eq!(r.status, CallStatus::Ok, "warm-up call");
    }

    /// Makes one call through the proxy and waits for speedtap to settle
    /// it. Calls are sequential, so every speed event in between is this
    /// call's (checked against the settled call's id anyway).
    pub async fn call(&mut self, spec: &CallSpec) -> CallResult {
        while self.events.try_recv().is_ok() {}
        let client_ttft_ms = self.client_call(spec).await;
        let deadline = Instant::now() + SETTLE_TIMEOUT;
        let mut speeds = Vec::new();
        let settled = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, self.events.recv()).await {
                Ok(Some(EngineEvent::Speed { call, speed, .. })) => speeds.push((call.id, speed)),
                Ok(Some(EngineEvent::Settled(call))) => break call,
                Ok(Some(_)) => {}
                Ok(None) => panic!("the engine dropped the subscription"),
                Err(_) => panic!("{:?} call not settled within {SETTLE_TIMEOUT:?}", spec.api),
            }
        };
        let live = speeds
            .into_iter()
            .filter(|(id, s)| *id == settled.identity.id && !s.is_final)
            .map(|(_, s)| s)
            .collect();
        CallResult {
            client_ttft_ms,
            live,
            settled: settled.speed.expect("a metered call has a final snapshot"),
            status: settled.status,
        }
    }

    /// The client side: returns its TTFT, reading the body to its end.
    async fn client_call(&self, spec: &CallSpec) -> Option<f64> {
        let (path, body) = protocols::request(spec.api, &spec.model);
        let stream = TcpStream::connect(self.proxy).await.expect("connect proxy");
        stream.set_nodelay(true).expect("nodelay");
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .expect("handshake");
        tokio::spawn(conn);
        let mut req = http::Request::post(path)
            .header("host", self.proxy.to_string())
            .header("content-type", "application/json");
        for (name, value) in &spec.sim {
            req = req.header(*name, value);
        }
        let req = req.body(Full::new(Bytes::from(body))).expect("request");
        let sent = Instant::now();
        let resp = sender.send_request(req).await.expect("response head");
        assert!(
            resp.status().is_success(),
            "{:?}: {}",
            spec.api,
            resp.status()
        );
        let mut body = resp.into_body();
        let mut seen = Vec::new();
        let mut first = None;
        while let Some(frame) = body.frame().await {
            let frame = frame.expect("body frame");
            let at = Instant::now();
            if let Ok(data) = frame.into_data() {
                if first.is_none() {
                    // Search the tail of what came before too: the needle
                    // may straddle two frames.
                    let from = seen.len().saturating_sub(self.needle.len());
                    seen.extend_from_slice(&data);
                    if memmem::find(&seen[from..], &self.needle).is_some() {
                        first = Some(at);
                    }
                }
            }
        }
        first.map(|at| (at - sent).as_secs_f64() * 1e3)
    }

    /// The route's calibration factor for `model` now.
    pub async fn factor(&self, model: &str) -> f64 {
        self.engine.handle.calibration().await.factor(ROUTE, model)
    }

    pub async fn shutdown(self) {
        self.engine.shutdown(Duration::from_secs(1)).await;
        self.sim.shutdown().await;
    }
}
