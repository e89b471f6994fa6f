//! `TelemetryPoller`: one actor per route that asks the model server what
//! it publishes about its state and explains each waiting call's wait.
//!
//! - **What it reads.** Ollama's `GET /api/ps`, llama-server's `GET
//!   /slots`, `GET /props` and `GET /metrics` (vLLM's `/metrics` queue
//!   gauges too), parsed by [`server`]. Which server the upstream is does
//!   not matter: every endpoint is tried, and one answered 404 (or 405,
//!   501: switched off), or answered 2xx with a body that is not what the
//!   endpoint publishes, is never asked again, so a server that publishes
//!   nothing costs one request per endpoint for the engine's life.
//! - **When.** Once when the route starts (which is also when a
//!   discovered server becomes a route), on each dispatched call, then
//!   every [`POLL_INTERVAL`] while a call on the route still awaits its
//!   first token; for llama-server, whose looks go through its task queue
//!   and would silence its pings, as [`pace`] spaces them (none for a
//!   call whose stream carries the server's own progress). Streaming-only and idle routes are not polled: no timer
//!   runs, no wake-ups. `/props` changes rarely: it is read at start and
//!   then at most every [`PROPS_MAX_AGE`], on a dispatch. Once the server
//!   is known to publish nothing, a dispatch asks nothing and the rules
//!   run at most once per [`POLL_INTERVAL`] (each pass walks every
//!   tracked call).
//! - **Loaded models, on request.** `GET /api/v1/servers` asks each
//!   poller for the server's loaded models ([`LoadedNow`]): its last
//!   `/api/ps` reading, read anew (one request) only when a call on the
//!   route ended since, as Ollama sets a model's `expires_at` when its
//!   last call ends. That reading is not given to the rules.
//! - **Never on the proxy's path.** The poller runs on a metering arbiter
//!   with its own HTTP client and connections; each request has a
//!   [`REQUEST_TIMEOUT`] and a body cap. Call actors talk to it with
//!   `do_send` only.
//! - **The server's version.** Asked once when the route starts (Ollama
//!   `/api/version`, vLLM `/version`; llama-server's `/props`
//!   `build_info` otherwise), again with `/props` (at most every
//!   [`PROPS_MAX_AGE`], on a dispatch), and again at once when the server
//!   answers after a look could not reach it (a restart). Never per call:
//!   each tracked call gets the last version read with its server facts.
//!   A call dispatched while the last look could not reach the server
//!   is not given the version read before (the server coming back may be
//!   another one): it asks for the version at once and gets it as soon as
//!   the server answers.
//! - **What it tells.** After each look it runs the rules of [`explain`]
//!   and sends each waiting call's actor its [`Wait`] and the server facts
//!   about its model (`WaitExplained`), when they changed. A look whose
//!   `/api/ps` is held past [`explain::PS_HELD`] (Ollama holds it for a
//!   whole model load) is a sign in itself: the calls are explained with
//!   it while the look waits.

pub mod explain;
pub mod pace;
pub mod prefill_rate;
pub mod serial;
pub mod server;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use actix::{
    Actor, ActorFutureExt, AsyncContext, Context, Handler, Message, Recipient, SpawnHandle,
    WeakRecipient, WrapFuture,
};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::time::Instant;

use crate::meter::normals::Normals;
use crate::model::{Upstream, Wait};
use explain::{ServerFacts, ServerView, Tracker, PS_HELD};
use pace::Pace;

/// How often a route with a waiting call is looked at.
pub const POLL_INTERVAL: Duration = Duration::from_millis(500);

/// Each telemetry request gives up after this long: a server too busy to
/// answer is not waited on (the wait explanation keeps its last state).
///
/// Why seconds and not a few hundred milliseconds: llama-server answers
/// `/slots` and `/metrics` from its main loop, between two prompt batches,
/// so during a long prefill an answer comes when the batch under way ends
/// (measured: 1-4 s per 256-token batch of a 135M model on a busy 2-core
/// machine). A shorter timeout would drop every reading taken during the
/// prefill, which is when they matter. Looks never overlap, and nothing on
/// the proxy's path waits for them.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// `/props` is re-read at most this often.
pub const PROPS_MAX_AGE: Duration = Duration::from_secs(60);

/// The largest telemetry body read (a `/slots` of 64 slots is ~60 KB).
const MAX_BODY: usize = 1 << 20;

/// The endpoints, in the order [`Endpoint::ALL`] lists them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// Ollama `GET /api/ps`.
    Ps,
    /// llama-server `GET /slots`.
    Slots,
    /// llama-server `GET /props`.
    Props,
    /// llama-server / vLLM `GET /metrics`.
    Metrics,
}

impl Endpoint {
    /// Every endpoint.
    pub const ALL: [Endpoint; 4] = [
        Endpoint::Ps,
        Endpoint::Slots,
        Endpoint::Props,
        Endpoint::Metrics,
    ];

    /// The path on the server.
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Ps => "/api/ps",
            Endpoint::Slots => "/slots",
            Endpoint::Props => "/props",
            Endpoint::Metrics => "/metrics",
        }
    }
}

/// Where servers publish their version, `{"version": "..."}`: Ollama's,
/// then vLLM's.
const VERSION_PATHS: [&str; 2] = ["/api/version", "/version"];

/// One endpoint's answer.
enum Answer {
    /// 2xx with this body.
    Body(Bytes),
    /// 404, 405 or 501: the server does not publish it; never ask again.
    Absent,
    /// Anything else (refused, 5xx): try again next time.
    Failed,
    /// No answer within [`REQUEST_TIMEOUT`]: try again next time. Ollama
    /// holds `/api/ps` for a whole load, so for it this is "still
    /// loading", not "gone".
    TimedOut,
}

// === CallActor -> TelemetryPoller ===

/// A waiting call's stream showed the server at work before its first
/// token: a ping, or the server's own prompt progress. Looks are spaced so
/// that they never silence such signs ([`pace`]).
#[derive(Message)]
#[rtype(result = "()")]
pub struct SignInBand {
    pub seq: u64,
    pub at: Instant,
    /// The server's own progress (`prompt_progress`), not a ping.
    pub progress: bool,
}

/// A call was dispatched on the route.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Track {
    pub seq: u64,
    pub model: Option<String>,
    pub dispatched_at: Instant,
    pub actor: Recipient<WaitExplained>,
}

/// The request named its model, or its prompt size is known (calibrated
/// tokens).
#[derive(Message)]
#[rtype(result = "()")]
pub struct CallUpdate {
    pub seq: u64,
    pub model: Option<String>,
    pub prompt_tokens: Option<u64>,
}

/// The call's first token arrived.
#[derive(Message)]
#[rtype(result = "()")]
pub struct FirstTokenSeen {
    pub seq: u64,
}

/// The call ended.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Untrack {
    pub seq: u64,
    /// The call could not reach the server (a 502): the server is down,
    /// and the next call that reaches it may be a restarted one.
    pub unreachable: bool,
}

// === Host -> TelemetryPoller ===

/// The models the server has loaded now (Ollama `/api/ps`), for `GET
/// /api/v1/servers`: the last reading when no call ended since it was
/// taken, else a new one (one request, within [`LOADED_ANSWER_WITHIN`]; a
/// server too slow gets the last reading). Empty for a server that does
/// not publish them.
#[derive(Message)]
#[rtype(result = "Vec<server::LoadedModel>")]
pub struct LoadedNow;

/// How long [`LoadedNow`] waits for a new `/api/ps` reading.
pub const LOADED_ANSWER_WITHIN: Duration = Duration::from_secs(2);

// === TelemetryPoller -> CallActor ===

/// The latest explanation of a call's wait (absent once it no longer
/// waits) and what the server says about its model.
#[derive(Message, Clone, Debug, PartialEq)]
#[rtype(result = "()")]
pub struct WaitExplained {
    pub wait: Option<Wait>,
    pub facts: ServerFacts,
}

/// One route's poller.
pub struct TelemetryPoller {
    route: String,
    upstream: Upstream,
    client: Client<HttpConnector, Empty<Bytes>>,
    /// `false` once the endpoint answered that it does not exist.
    available: [bool; 4],
    view: ServerView,
    props_read_at: Option<Instant>,
    /// When the look under way (or the last one) began: what it reads is
    /// as recent as that, however long the server took to answer.
    look_began: Instant,
    tracker: Tracker,
    /// Weak on purpose: a call actor whose proxy side is gone must see
    /// itself orphaned (no strong address left) and settle as abandoned;
    /// a strong one here would keep it waiting forever.
    actors: HashMap<u64, WeakRecipient<WaitExplained>>,
    last_sent: HashMap<u64, WaitExplained>,
    normals: Arc<RwLock<Normals>>,
    /// A look (requests) is under way.
    polling: bool,
    /// The next scheduled look.
    next: Option<SpawnHandle>,
    /// What the waiting calls' streams show, which spaces the looks.
    pace: Pace,
    /// Telemetry requests sent (diagnostics and tests).
    requests: Arc<AtomicU64>,
    /// Passes of the rules over every tracked call (tests).
    passes: Arc<AtomicU64>,
    /// The version read from [`VERSION_PATHS`].
    version: Option<String>,
    /// `false` once that path answered that it does not exist.
    version_available: [bool; 2],
    /// A version request is under way.
    version_asking: bool,
    /// The last answer (to a look, or to a call: a 502) was a failure to
    /// reach the server: the next answer may be a restarted server, whose
    /// version is asked again.
    unreachable: bool,
    /// A call ended since the last `/api/ps` reading: Ollama sets a
    /// model's `expires_at` when its last call ends, so that reading's is
    /// old ([`LoadedNow`] reads again).
    ps_stale: bool,
    /// The latest `/api/ps` reading, from a look or from [`LoadedNow`].
    loaded: Option<Vec<server::LoadedModel>>,
    /// When [`LoadedNow`] last asked the server itself.
    loaded_asked_at: Option<Instant>,
}

impl TelemetryPoller {
    pub fn new(route: String, upstream: Upstream, normals: Arc<RwLock<Normals>>) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(REQUEST_TIMEOUT));
        let client = Client::builder(TokioExecutor::new()).build(connector);
        TelemetryPoller {
            route,
            upstream,
            client,
            available: [true; 4],
            view: ServerView::default(),
            props_read_at: None,
            look_began: Instant::now(),
            tracker: Tracker::default(),
            actors: HashMap::new(),
            last_sent: HashMap::new(),
            normals,
            polling: false,
            next: None,
            pace: Pace::default(),
            requests: Arc::new(AtomicU64::new(0)),
            passes: Arc::new(AtomicU64::new(0)),
            version: None,
            version_available: [true; 2],
            version_asking: false,
            unreachable: false,
            ps_stale: false,
            loaded: None,
            loaded_asked_at: None,
        }
    }

    /// The server's version as last read: its version endpoint's, else
    /// llama-server's `build_info`.
    fn server_version(&self) -> Option<String> {
        self.version
            .clone()
            .or_else(|| self.view.props.as_ref().and_then(|p| p.build_info.clone()))
    }

    /// Asks the version endpoints still thought to exist, in order, until
    /// one answers; tells the tracked calls when the version changed.
    fn ask_version(&mut self, ctx: &mut Context<Self>) {
        if self.version_asking || !self.version_available.contains(&true) {
            return;
        }
        self.version_asking = true;
        let wanted: Vec<usize> = (0..VERSION_PATHS.len())
            .filter(|i| self.version_available[*i])
            .collect();
        let (client, upstream) = (self.client.clone(), self.upstream.clone());
        let fut = async move {
            let mut answers = Vec::new();
            for i in wanted {
                let answer = fetch(&client, &upstream, VERSION_PATHS[i]).await;
                let found =
                    matches!(&answer, Answer::Body(b) if server::parse_version(b).is_some());
                answers.push((i, answer));
                if found {
                    break;
                }
            }
            answers
        };
        ctx.spawn(fut.into_actor(self).map(|answers, act, _ctx| {
            act.version_asking = false;
            for (i, answer) in answers {
                if !matches!(answer, Answer::Failed | Answer::TimedOut) {
                    // It answered: reachable again, whatever the look said.
                    act.unreachable = false;
                }
                match answer {
                    Answer::Body(body) => match server::parse_version(&body) {
                        Some(v) => act.version = Some(v),
                        None => act.version_available[i] = false,
                    },
                    Answer::Absent => act.version_available[i] = false,
                    Answer::Failed | Answer::TimedOut => {}
                }
            }
            // Told even when unchanged (a call dispatched while the server
            // was unreachable has none yet); a call already told is not
            // sent the same facts twice.
            act.tell(Instant::now());
        }));
    }

    /// The count of telemetry requests this poller sent, shared.
    pub fn request_counter(&self) -> Arc<AtomicU64> {
        self.requests.clone()
    }

    /// The count of passes of the rules over the tracked calls, shared.
    pub fn pass_counter(&self) -> Arc<AtomicU64> {
        self.passes.clone()
    }

    /// Looks at the server now (unless a look is under way): the requests
    /// run concurrently, each with its timeout; then every waiting call is
    /// explained.
    fn look(&mut self, ctx: &mut Context<Self>) {
        if self.polling {
            return;
        }
        let now = Instant::now();
        let props_due = self
            .props_read_at
            .is_none_or(|t| now.saturating_duration_since(t) >= PROPS_MAX_AGE);
        let wanted: Vec<Endpoint> = Endpoint::ALL
            .into_iter()
            .enumerate()
            .filter(|(i, e)| self.available[*i] && (*e != Endpoint::Props || props_due))
            .map(|(_, e)| e)
            .collect();
        if wanted.is_empty() {
            // Nothing to ask (the server publishes none of it): a wait can
            // then only come from the learned normals, which a new call
            // does not change for the others. The rules run at once when
            // no pass is due, else with the pass due within POLL_INTERVAL,
            // not on each call's events: each pass walks every tracked
            // call, so per event it was quadratic (2,000 streams: some
            // 8,000 events, each over 2,000 calls).
            if self.next.is_none() {
                self.after_look(ctx);
            }
            return;
        }
        if let Some(h) = self.next.take() {
            ctx.cancel_future(h);
        }
        if props_due && self.props_read_at.is_some() {
            // With `/props`, at most once a minute: a server restarted
            // while no look was under way shows its new version here.
            self.ask_version(ctx);
        }
        self.polling = true;
        self.look_began = now;
        self.requests
            .fetch_add(wanted.len() as u64, Ordering::Relaxed);
        let asks_ps = wanted.contains(&Endpoint::Ps);
        let ps_pending = Arc::new(AtomicBool::new(asks_ps));
        let client = self.client.clone();
        let upstream = self.upstream.clone();
        let pending = ps_pending.clone();
        let fut = async move {
            let asks = wanted.iter().map(|e| {
                let (client, upstream, pending) = (&client, &upstream, &pending);
                async move {
                    let answer = fetch(client, upstream, e.path()).await;
                    if *e == Endpoint::Ps {
                        pending.store(false, Ordering::Relaxed);
                    }
                    answer
                }
            });
            let answers = futures_util::future::join_all(asks).await;
            wanted.into_iter().zip(answers).collect::<Vec<_>>()
        };
        ctx.spawn(fut.into_actor(self).map(|answers, act, ctx| {
            act.polling = false;
            let was_unreachable = act.unreachable;
            for (endpoint, answer) in answers {
                act.take(endpoint, answer);
            }
            if was_unreachable && !act.unreachable {
                // The server answers again: perhaps restarted, perhaps
                // upgraded.
                act.ask_version(ctx);
            }
            act.after_look(ctx);
        }));
        if asks_ps {
            ctx.run_later(PS_HELD, move |act, ctx| {
                act.check_held(now, ps_pending, ctx)
            });
        }
    }

    /// The look begun at `began` still waits for its answers [`PS_HELD`]
    /// on: the server holds `/api/ps` (Ollama does for a whole load). The
    /// waiting calls are explained with that, and again every
    /// [`POLL_INTERVAL`] while the look stays held, so their ETAs count
    /// down as with answered looks.
    fn check_held(&mut self, began: Instant, ps_pending: Arc<AtomicBool>, ctx: &mut Context<Self>) {
        if !self.polling || self.look_began != began || !ps_pending.load(Ordering::Relaxed) {
            return;
        }
        self.view.ps_held_since.get_or_insert(began);
        let now = Instant::now();
        self.tracker.observe(&self.view, now);
        self.tell(now);
        ctx.run_later(POLL_INTERVAL, move |act, ctx| {
            act.check_held(began, ps_pending, ctx)
        });
    }

    /// Takes one endpoint's answer.
    fn take(&mut self, endpoint: Endpoint, answer: Answer) {
        let index = Endpoint::ALL
            .iter()
            .position(|e| *e == endpoint)
            .unwrap_or(0);
        if endpoint == Endpoint::Ps && !matches!(answer, Answer::Body(_) | Answer::TimedOut) {
            // Answered without a reading, or gone: not held any more. (A
            // time-out stays held: the next look asks again.)
            self.view.ps_held_since = None;
        }
        self.unreachable = matches!(answer, Answer::Failed);
        let body = match answer {
            Answer::Body(b) => b,
            Answer::Absent => {
                self.available[index] = false;
                return;
            }
            Answer::Failed | Answer::TimedOut => return,
        };
        // A 2xx whose body is not the endpoint's format is a server that
        // does not publish it either: LM Studio answers every unknown path
        // 200 with an error object, and a bare streaming server may answer
        // any path with a completion stream. Never asked again, like a 404
        // (a server still loading answers 503, which is tried again).
        let published = match endpoint {
            Endpoint::Ps => server::parse_ps(&body).map(|ps| {
                self.loaded = Some(ps.clone());
                self.view.read_ps(ps, self.look_began);
                self.ps_stale = false;
            }),
            Endpoint::Slots => server::parse_slots(&body).map(|slots| {
                self.view.slots = Some(slots);
                self.view.slots_at = Some(self.look_began);
            }),
            Endpoint::Props => server::parse_props(&body).map(|props| {
                self.view.props = Some(props);
                self.props_read_at = Some(Instant::now());
            }),
            Endpoint::Metrics => server::parse_metrics(&body).map(|q| {
                self.view.queue = Some(q);
                self.view.queue_at = Some(self.look_began);
            }),
        };
        if published.is_none() {
            self.available[index] = false;
        }
    }

    /// Explains every waiting call and schedules the next look while one
    /// waits.
    fn after_look(&mut self, ctx: &mut Context<Self>) {
        self.passes.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        self.tracker.observe(&self.view, now);
        self.tell(now);
        if self.next.is_some() {
            return;
        }
        // Looks through llama-server's task queue are spaced so its pings
        // still reach its clients.
        let queued_looks = self.looks_queue();
        let waiting = self.tracker.waiting_since();
        if let Some(delay) = self.pace.next_look(waiting, queued_looks, now) {
            self.next = Some(ctx.run_later(delay, |act, ctx| {
                act.next = None;
                act.look(ctx);
            }));
        }
    }

    /// Whether a look goes through the server's generation queue: a
    /// llama-server (it publishes `/slots`, and no Ollama `/api/ps`), whose
    /// every telemetry answer restarts the wait of each stream before its
    /// keep-alive ping ([`pace`]).
    fn looks_queue(&self) -> bool {
        let publishes_ps = self.available[0];
        self.view.slots.is_some() && !publishes_ps
    }

    /// Sends each call its explanation when it changed.
    fn tell(&mut self, now: Instant) {
        let waits = match self.normals.read() {
            Ok(normals) => self.tracker.explain(&self.route, &self.view, &normals, now),
            Err(_) => return,
        };
        let mut waits: HashMap<u64, Wait> = waits.into_iter().collect();
        let mut gone = Vec::new();
        let server_version = self.server_version();
        for (seq, actor) in &self.actors {
            let Some(facts) = self.tracker.facts(*seq) else {
                continue;
            };
            let Some(actor) = actor.upgrade() else {
                gone.push(*seq);
                continue;
            };
            let msg = WaitExplained {
                wait: waits.remove(seq),
                facts: ServerFacts {
                    server_version: server_version.clone(),
                    ..facts.clone()
                },
            };
            if self.last_sent.get(seq) != Some(&msg) {
                actor.do_send(msg.clone());
                self.last_sent.insert(*seq, msg);
            }
        }
        for seq in gone {
            self.tracker.untrack(seq, now);
            self.actors.remove(&seq);
            self.last_sent.remove(&seq);
        }
    }

    /// No call waits any more: the scheduled look is not needed.
    fn idle_unless_waiting(&mut self, ctx: &mut Context<Self>) {
        if !self.tracker.any_waiting() {
            if let Some(h) = self.next.take() {
                ctx.cancel_future(h);
            }
        }
    }
}

/// `GET path` on the upstream, with the timeout and the body cap.
async fn fetch(
    client: &Client<HttpConnector, Empty<Bytes>>,
    upstream: &Upstream,
    path: &str,
) -> Answer {
    let Ok(uri) = upstream.join(path).parse::<hyper::Uri>() else {
        return Answer::Failed;
    };
    let req = match hyper::Request::get(uri)
        .header(hyper::header::HOST, upstream.authority())
        .header(hyper::header::USER_AGENT, "speedtap-telemetry")
        .body(Empty::<Bytes>::new())
    {
        Ok(r) => r,
        Err(_) => return Answer::Failed,
    };
    let work = async {
        let resp = client.request(req).await.ok()?;
        let status = resp.status().as_u16();
        if matches!(status, 404 | 405 | 501) {
            return Some(Answer::Absent);
        }
        if !(200..300).contains(&status) {
            return Some(Answer::Failed);
        }
        let body = Limited::new(resp.into_body(), MAX_BODY)
            .collect()
            .await
            .ok()?
            .to_bytes();
        Some(Answer::Body(body))
    };
    match tokio::time::timeout(REQUEST_TIMEOUT, work).await {
        Ok(Some(answer)) => answer,
        Ok(None) => Answer::Failed,
        Err(_) => Answer::TimedOut,
    }
}

impl Actor for TelemetryPoller {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        // Once at start: which endpoints exist, what is loaded, which
        // version runs.
        self.look(ctx);
        self.ask_version(ctx);
    }
}

impl Handler<Track> for TelemetryPoller {
    type Result = ();
    fn handle(&mut self, msg: Track, ctx: &mut Self::Context) {
        self.tracker.track(msg.seq, msg.model, msg.dispatched_at);
        let version = self.server_version().filter(|_| !self.unreachable);
        if let (Some(version), Some(facts)) = (version, self.tracker.facts(msg.seq)) {
            // The version at once, so a call that ends before the next
            // look still carries it.
            let told = WaitExplained {
                wait: None,
                facts: ServerFacts {
                    server_version: Some(version),
                    ..facts.clone()
                },
            };
            msg.actor.do_send(told.clone());
            self.last_sent.insert(msg.seq, told);
        }
        self.actors.insert(msg.seq, msg.actor.downgrade());
        if self.unreachable {
            // The server was down at the last look and a call reached it
            // now: perhaps restarted, perhaps upgraded.
            self.ask_version(ctx);
        }
        // Look now: whether the model is loaded is decided on the first
        // look after dispatch.
        self.look(ctx);
    }
}

impl Handler<CallUpdate> for TelemetryPoller {
    type Result = ();
    fn handle(&mut self, msg: CallUpdate, ctx: &mut Self::Context) {
        let named = msg.model.is_some() && self.tracker.model_unknown(msg.seq);
        self.tracker.update(msg.seq, msg.model, msg.prompt_tokens);
        // The model is known only now: look again (unless a look is under
        // way, which will see it), so loaded-or-not is decided at once.
        if named {
            self.look(ctx);
        }
    }
}

impl Handler<SignInBand> for TelemetryPoller {
    type Result = ();
    fn handle(&mut self, msg: SignInBand, _: &mut Self::Context) {
        self.pace.on_sign(msg.seq, msg.at, msg.progress);
    }
}

impl Handler<FirstTokenSeen> for TelemetryPoller {
    type Result = ();
    fn handle(&mut self, msg: FirstTokenSeen, ctx: &mut Self::Context) {
        self.pace.forget(msg.seq);
        self.tracker.first_token(msg.seq, &self.view);
        self.idle_unless_waiting(ctx);
    }
}

impl Handler<Untrack> for TelemetryPoller {
    type Result = ();
    fn handle(&mut self, msg: Untrack, ctx: &mut Self::Context) {
        self.pace.forget(msg.seq);
        self.tracker.untrack(msg.seq, Instant::now());
        self.ps_stale = true;
        if msg.unreachable {
            self.unreachable = true;
        }
        self.actors.remove(&msg.seq);
        self.last_sent.remove(&msg.seq);
        self.idle_unless_waiting(ctx);
    }
}

impl Handler<LoadedNow> for TelemetryPoller {
    type Result = actix::ResponseActFuture<Self, Vec<server::LoadedModel>>;
    fn handle(&mut self, _: LoadedNow, _: &mut Self::Context) -> Self::Result {
        let ps_index = Endpoint::ALL
            .iter()
            .position(|e| *e == Endpoint::Ps)
            .unwrap_or(0);
        let last = self.loaded.clone().unwrap_or_default();
        let fresh = self.loaded.is_some() && !self.ps_stale;
        // Never beside a look (Ollama holds `/api/ps` through a whole
        // load: the look's answer will do), and at most once per
        // [`POLL_INTERVAL`] however often it is asked (a server that is
        // down stays stale).
        let now = Instant::now();
        let asked_lately = self
            .loaded_asked_at
            .is_some_and(|at| now.saturating_duration_since(at) < POLL_INTERVAL);
        if fresh || self.polling || asked_lately || !self.available[ps_index] {
            return Box::pin(actix::fut::ready(last));
        }
        self.loaded_asked_at = Some(now);
        self.requests.fetch_add(1, Ordering::Relaxed);
        let (client, upstream) = (self.client.clone(), self.upstream.clone());
        let read = async move {
            let answer = fetch(&client, &upstream, Endpoint::Ps.path());
            match tokio::time::timeout(LOADED_ANSWER_WITHIN, answer).await {
                Ok(Answer::Body(body)) => server::parse_ps(&body),
                _ => None,
            }
        };
        Box::pin(read.into_actor(self).map(move |read, act, _| match read {
            Some(models) => {
                // Not given to the rules: they read `/api/ps` from their
                // own looks, each with when it began.
                act.ps_stale = false;
                act.loaded = Some(models.clone());
                models
            }
            None => last,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix::Addr;

    /// Stands in for a call actor: counts the explanations it gets.
    struct Call(Arc<AtomicU64>);

    impl Actor for Call {
        type Context = Context<Self>;
    }

    impl Handler<WaitExplained> for Call {
        type Result = ();
        fn handle(&mut self, _: WaitExplained, _: &mut Self::Context) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[actix::test]
    async fn with_nothing_to_ask_a_burst_of_calls_is_explained_once_per_poll_not_once_per_call() {
        tokio::time::pause();
        let upstream = Upstream::parse("http://127.0.0.1:9").expect("upstream");
        let mut poller = TelemetryPoller::new("r".into(), upstream, Default::default());
        // As after the first look at a server that publishes nothing.
        poller.available = [false; 4];
        let passes = poller.pass_counter();
        let poller = poller.start();
        let heard = Arc::new(AtomicU64::new(0));
        let calls: Vec<Addr<Call>> = (0..50).map(|_| Call(heard.clone()).start()).collect();
        // A round trip, so the look at start has run before counting.
        poller
            .send(Untrack {
                seq: 0,
                unreachable: false,
            })
            .await
            .expect("poller");
        let after_start = passes.load(Ordering::Relaxed);
        for (seq, call) in (1..).zip(&calls) {
            poller
                .send(Track {
                    seq,
                    model: Some("m".into()),
                    dispatched_at: Instant::now(),
                    actor: call.clone().recipient(),
                })
                .await
                .expect("poller");
        }
        // The first call is explained at once; the other 49 wait for the
        // pass due within POLL_INTERVAL.
        assert_eq!(passes.load(Ordering::Relaxed) - after_start, 1);
        tokio::time::sleep(POLL_INTERVAL + Duration::from_millis(1)).await;
        // Let the calls' mailboxes drain.
        tokio::task::yield_now().await;
        assert_eq!(passes.load(Ordering::Relaxed) - after_start, 2);
        for call in &calls {
            call.send(Ping).await.expect("call");
        }
        assert_eq!(
            heard.load(Ordering::Relaxed),
            50,
            "every call heard its facts"
        );
        // Once no call waits, no pass is scheduled.
        for seq in 1..=50 {
            poller.send(FirstTokenSeen { seq }).await.expect("poller");
        }
        tokio::time::sleep(POLL_INTERVAL * 4).await;
        assert_eq!(passes.load(Ordering::Relaxed) - after_start, 2);
    }

    /// A message that only returns: once a `Call` answers it, every
    /// message sent to it before has been handled.
    #[derive(Message)]
    #[rtype(result = "()")]
    struct Ping;

    impl Handler<Ping> for Call {
        type Result = ();
        fn handle(&mut self, _: Ping, _: &mut Self::Context) {}
    }
}
