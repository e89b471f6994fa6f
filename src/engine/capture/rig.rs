//! The capture task fed with hand-built packets (no socket): the same
//! actors and supervisor as in the engine, and one scripted call to play.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use actix::Actor;
use bytes::Bytes;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{CaptureControl, CaptureRoute, CaptureTask, RouteChanges};
use crate::capture::feed::CapturedPacket;
use crate::capture::flows::script::Talk;
use crate::capture::packet::{build, LinkType, Segment};
use crate::capture::sockets::{Pair, SocketTable};
use crate::capture::source::SourcePacket;
use crate::capture::Nanos;
use crate::engine::link::EngineLink;
use crate::engine::messages::Subscribe;
use crate::engine::metrics::Metrics;
use crate::engine::notifier::Notifier;
use crate::engine::supervisor::Supervisor;
use crate::meter::calibration::CalibrationTable;
use crate::model::{Call, EngineEvent, Upstream};

pub(super) const SERVER: &str = "127.0.0.1:11434";

/// The kernel's socket table in the rig: it can't be read (no connection
/// is taken for gone) until the test says every connection is gone.
struct FakeSockets(Arc<AtomicBool>);

impl SocketTable for FakeSockets {
    fn open_pairs(&mut self) -> Option<HashSet<Pair>> {
        self.0.load(Ordering::Relaxed).then(HashSet::new)
    }
}

pub(super) struct Rig {
    pub(super) task: CaptureTask,
    /// Route changes, applied by [`Rig::apply`] (the run loop's part).
    pub(super) control: CaptureControl,
    changes: RouteChanges,
    pub(super) events: mpsc::Receiver<EngineEvent>,
    pub(super) base: Instant,
    pub(super) ts: Nanos,
    /// Set: the kernel no longer lists any of the rig's connections.
    pub(super) sockets_gone: Arc<AtomicBool>,
    /// What the settled calls taught the estimator.
    pub(super) calibration: Arc<RwLock<CalibrationTable>>,
}

impl Rig {
    pub(super) async fn new() -> Self {
        let calibration = Arc::new(RwLock::new(CalibrationTable::new()));
        let supervisor = Supervisor::new(calibration.clone(), Arc::new(Metrics::new())).start();
        let events = supervisor
            .send(Subscribe { capacity: 4_096 })
            .await
            .expect("supervisor");
        let notifier = Notifier::new(supervisor.clone().recipient(), Vec::new()).start();
        let link = Arc::new(EngineLink::on_current_arbiter(
            supervisor,
            notifier.recipient(),
            calibration.clone(),
        ));
        let routes = [CaptureRoute {
            name: "ollama".into(),
            port: 11434,
            upstream: Upstream::parse("http://127.0.0.1:11434").expect("upstream"),
        }];
        let (control, changes) = CaptureControl::channel();
        let sockets_gone = Arc::new(AtomicBool::new(false));
        Rig {
            task: CaptureTask::new(link, &routes, [11435], LinkType::Ethernet)
                .with_socket_table(Box::new(FakeSockets(sockets_gone.clone()))),
            sockets_gone,
            calibration,
            control,
            changes,
            events,
            base: Instant::now(),
            ts: 1_000_000_000,
        }
    }

    /// Applies the route changes sent so far, as the run loop does between
    /// packets; the helper's last new port set, if it changed.
    pub(super) fn apply(&mut self) -> Option<Vec<u16>> {
        let mut ports = None;
        while let Ok((change, done)) = self.changes.rx.try_recv() {
            ports = self.task.change_routes(change).or(ports);
            if let Some(done) = done {
                // No helper here: nothing to wait for.
                let _ = done.send(None);
            }
        }
        ports
    }

    /// Feeds one segment captured `after_ms` after the previous one.
    pub(super) fn feed(&mut self, seg: Segment, after_ms: u64) {
        self.ts += after_ms * 1_000_000;
        let data: Bytes = build::ethernet(&seg);
        self.task.packet(SourcePacket {
            at: self.base + Duration::from_nanos(self.ts),
            packet: CapturedPacket {
                ts_ns: self.ts,
                orig_len: data.len() as u32,
                data,
            },
        });
    }

    /// The packet clock's instant now (the last packet's time).
    pub(super) fn now(&self) -> Instant {
        self.base + Duration::from_nanos(self.ts)
    }

    /// The next settled call, within a few seconds.
    pub(super) async fn settled(&mut self) -> Call {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, self.events.recv()).await {
                Ok(Some(EngineEvent::Settled(call))) => return call,
                Ok(Some(_)) => {}
                _ => panic!("no call settled"),
            }
        }
    }
}

const REQUEST_BODY: &str = r#"{"model":"m","prompt":"hi","stream":true}"#;

pub(super) fn request() -> Vec<u8> {
    format!(
        "POST /api/generate HTTP/1.1\r\nHost: 127.0.0.1:11434\r\nUser-Agent: curl/8.5\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{REQUEST_BODY}",
        REQUEST_BODY.len()
    )
    .into_bytes()
}

/// Thirty NDJSON lines of one word each (enough for a settled rate), then the final line with the
/// server's counts.
pub(super) fn lines() -> Vec<String> {
    let mut lines: Vec<String> = (0..30)
        .map(|i| format!("{{\"model\":\"m\",\"response\":\" w{i}\",\"done\":false}}\n"))
        .collect();
    lines.push(
        "{\"model\":\"m\",\"response\":\"\",\"done\":true,\"prompt_eval_count\":7,\"eval_count\":30}\n"
            .into(),
    );
    lines
}

pub(super) fn head(body_len: usize) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nContent-Length: {body_len}\r\n\r\n"
    )
    .into_bytes()
}

/// Plays one call to [`SERVER`]; the response line at `lose` (if any) is
/// never captured.
pub(super) async fn play(rig: &mut Rig, client: &str, lose: Option<usize>) {
    play_to(rig, client, SERVER, lose).await;
}

/// Plays one call to `server`, as [`play`].
pub(super) async fn play_to(rig: &mut Rig, client: &str, server: &str, lose: Option<usize>) {
    let mut talk = Talk::new(client, server, 7_000, 90_000);
    for seg in talk.handshake() {
        rig.feed(seg, 0);
    }
    let seg = talk.client(&request());
    rig.feed(seg, 1);
    let lines = lines();
    let len = lines.iter().map(String::len).sum();
    let seg = talk.server(&head(len));
    rig.feed(seg, 100);
    for (i, line) in lines.iter().enumerate() {
        let seg = talk.server(line.as_bytes());
        if lose != Some(i) {
            rig.feed(seg, 50);
        }
    }
    let seg = talk.fin(false);
    rig.feed(seg, 1);
    let seg = talk.fin(true);
    rig.feed(seg, 1);
}
