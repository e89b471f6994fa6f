//! `CallActor`: one per metered call. It owns the call's decoder and meter
//! (through [`CallMetering`]), receives the tap's frames, publishes
//! snapshots to the supervisor and reports its final record exactly once,
//! also when it is dropped without a proper end (client gone, engine
//! stopping): the report is sent from `stopping()` if nothing sent it
//! before, following actix/examples' session `Disconnect` pattern.
//!
//! Tokenizing happens here, on the metering arbiter's thread, never on the
//! proxy's threads.

use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use actix::{
    Actor, ActorContext, Addr, AsyncContext, Context, Handler, Recipient, Running, SpawnHandle,
};
use tokio::time::Instant;

use super::capture::sniff::ModelSniffer;
use super::decode_watch::DecodeWatch;
use super::details;
use super::failure;
use super::messages::*;
use super::supervisor::Supervisor;
use super::telemetry::explain::ServerFacts;
use super::telemetry::{
    CallUpdate, FirstTokenSeen, SignInBand, TelemetryPoller, Track, Untrack, WaitExplained,
};
use crate::decode::detect::{detect_framing, request_facts, BodyFraming};
use crate::decode::request_fields::RequestFields;
use crate::decode::ServerTimings;
use crate::meter::calibration::CalibrationTable;
use crate::meter::limits::SNAPSHOT_INTERVAL;
use crate::meter::liveness::{shows_life, Liveness};
use crate::meter::normals::{Normals, Observation, Waited};
use crate::meter::pipeline::{CallMetering, CallReport, Outcome, ResponseHead, StreamEnd};
use crate::meter::prompt_progress;
use crate::meter::slowdown::{draft_acceptance, DecodeCall, Evidence};
use crate::meter::waited::QueueTally;
use crate::model::ApiKind;
use crate::model::SlowFirstToken;
use crate::model::{Call, CallDetails, CallIdentity, CallStatus, PromptTruncation, SeenBy};
use crate::model::{ContextUse, DraftCounts, EngineEvent, Phase, PromptTruncated, StartKind, Wait};
use crate::model::{Snapshot, WaitReason};
use crate::tokens::TokenEstimator;

/// Everything a call actor needs at birth.
pub struct CallSetup {
    pub seq: u64,
    pub identity: CallIdentity,
    pub method: String,
    pub path: String,
    pub dispatched_at: Instant,
    pub slow_ttft: Duration,
    pub estimator: Arc<dyn TokenEstimator>,
    pub calibration: Arc<RwLock<CalibrationTable>>,
    pub supervisor: Addr<Supervisor>,
    pub notifier: Recipient<FirstTokenLate>,
    /// The app that made the call (from its User-Agent).
    pub client: Option<String>,
    /// Which interceptor feeds this actor; only copied into the record.
    pub seen_by: SeenBy,
    /// Every route's normals: the slow rule reads them, the settled call
    /// teaches them.
    pub normals: Arc<RwLock<Normals>>,
    /// Every route's usual decode rates and streaming calls: the settled
    /// call is judged by them and teaches them.
    pub decode_watch: Arc<DecodeWatch>,
    /// The route's telemetry poller, which explains the wait; `None`
    /// (capture, tests): no explanation, the fixed slow rule.
    pub telemetry: Option<Addr<TelemetryPoller>>,
}

pub struct CallActor {
    setup: CallSetup,
    metering: CallMetering,
    /// The request body's `model` and `stream`, as far as it has passed.
    request: RequestFields,
    http_status: Option<u16>,
    /// The head arrived but the body isn't something we understand.
    unmetered: bool,
    /// Set by `UpstreamFailed`: the upstream was unreachable.
    unreachable: bool,
    reported: bool,
    /// Set by `CaptureGap`: bytes of the call were lost in capture.
    capture_gap: bool,
    /// When a snapshot tick first found every address gone (see `started`).
    orphaned_at: Option<Instant>,
    /// The latest explanation of the wait (kept as it was at the first
    /// token).
    wait: Option<Wait>,
    /// The last explanation with a known reason, for the call's details
    /// (an `unknown` after "loading" only means the rest was the server's
    /// own business); `unknown` when no reason was ever known.
    known_wait: Option<Wait>,
    /// The server streamed its own prefill progress: it explains the wait
    /// from then on, over the poller's readings and estimates.
    in_band_progress: bool,
    /// When `wait` was last read (a chunk or a poll): its `eta_ms` counts
    /// from then, so a snapshot published later counts it down.
    wait_read_at: Option<Instant>,
    /// The poller was told the stream carries the server's own progress.
    progress_told: bool,
    /// The time the call was explained queued, for its record.
    queue: QueueTally,
    /// What the server said about the call's model.
    facts: ServerFacts,
    /// The prompt's size from the request body: raw and calibrated tokens.
    prompt: Option<(u64, u64)>,
    /// The poller was told about the first token.
    first_token_told: bool,
    /// The pending slow-first-token check, and whether the alarm fired.
    alarm: Option<SpawnHandle>,
    alarm_fired: bool,
    /// The slow-first-token limit last armed while the call waited, and
    /// the usual it was learned from (none: the fixed threshold). Settled
    /// details show it: the threshold as it was applied to this call.
    limit_applied: Option<(u64, Option<u64>)>,
    /// This call is a relay's leg, made for a client of that relay (its
    /// route): never the subject of a notification (see `engine::relay`).
    relay: Option<String>,
    /// The start of a non-2xx body, read for a recognised cause.
    error_body: Vec<u8>,
    /// Reads the model a 2xx response names (`response_model`).
    response_model: ModelSniffer,
    /// The interceptor's frame queue (the proxy tap's or the capture's),
    /// known from its first `FramesQueued`.
    frames: Option<Arc<FrameQueue>>,
    /// The drained batch, its capacity kept for the next one.
    batch: Vec<Frame>,
    /// The last snapshot sent (with the model it was sent under) and
    /// when: the same snapshot is never sent twice, and a waiting call's
    /// is refreshed every [`WAITING_REFRESH`].
    last_sent: Option<(Option<String>, crate::model::Snapshot, Instant)>,
    /// The call's silences: since its last output (stalled) and since the
    /// server last showed life for it (silent, while it waits).
    liveness: Liveness,
}

/// A server-reported `load_duration` this long or longer is a load, until
/// the model's warm normal is known (Ollama reports a few ms for a model
/// already loaded).
pub const COLD_LOAD_MS: f64 = 100.0;

/// How often a call still waiting for its first token republishes its
/// snapshot with the time waited, with or without telemetry, so its
/// `elapsed_ms` stays current (the tray's "waiting N s" moves each second).
pub const WAITING_REFRESH: Duration = Duration::from_secs(1);

impl CallActor {
    pub fn new(setup: CallSetup) -> Self {
        let metering = CallMetering::new(setup.dispatched_at, setup.estimator.clone());
        let liveness = Liveness::new(setup.dispatched_at);
        CallActor {
            setup,
            metering,
            request: RequestFields::default(),
            http_status: None,
            unmetered: false,
            unreachable: false,
            reported: false,
            capture_gap: false,
            orphaned_at: None,
            wait: None,
            known_wait: None,
            in_band_progress: false,
            wait_read_at: None,
            progress_told: false,
            queue: QueueTally::default(),
            facts: ServerFacts::default(),
            prompt: None,
            first_token_told: false,
            alarm: None,
            alarm_fired: false,
            limit_applied: None,
            relay: None,
            error_body: Vec::new(),
            response_model: ModelSniffer::default(),
            frames: None,
            batch: Vec::new(),
            last_sent: None,
            liveness,
        }
    }

    /// Meters every frame the tap queued, in order. Once the first output
    /// (or a body not metered) was seen, the tap stops waking this actor
    /// per frame and the snapshot tick drains the queue.
    fn drain_frames(&mut self) {
        let Some(queue) = self.frames.clone() else {
            return;
        };
        queue.take(&mut self.batch);
        let mut batch = std::mem::take(&mut self.batch);
        for frame in batch.drain(..) {
            self.on_frame(&frame.bytes, frame.at);
        }
        self.batch = batch;
        if self.metering.first_output_at().is_some() || !self.metering.is_metering() {
            queue.relax();
        }
    }

    /// One body frame, in arrival order, whichever interceptor queued it.
    fn on_frame(&mut self, bytes: &[u8], at: Instant) {
        if !(200..300).contains(&self.http_status.unwrap_or(200)) {
            if self.error_body.len() < details::MAX_ERROR_BODY {
                let room = details::MAX_ERROR_BODY - self.error_body.len();
                self.error_body
                    .extend_from_slice(&bytes[..bytes.len().min(room)]);
            }
        } else if self.response_model.model().is_none() {
            self.response_model.feed(bytes);
        }
        // Any frame is the server at work for this call (a ping, a
        // `prompt_progress` chunk); only an output moves the stall clock.
        self.liveness.on_sign(at);
        let output_before = self.metering.last_output_at();
        let published = self.metering.on_frame(bytes, at);
        if let Some(output_at) = self.metering.last_output_at() {
            if output_before != Some(output_at) {
                self.liveness.on_output(output_at);
            }
        }
        let output = output_before != self.metering.last_output_at();
        if let Some(s) = published {
            self.publish(s);
        }
        self.take_in_band_progress();
        if !output {
            self.tell_poller_sign(at);
        }
        if !self.first_token_told && self.metering.first_output_at().is_some() {
            self.first_token_told = true;
            self.setup
                .decode_watch
                .stream_started(&self.setup.identity.route, self.setup.seq);
            if let Some(poller) = &self.setup.telemetry {
                poller.do_send(FirstTokenSeen {
                    seq: self.setup.seq,
                });
            }
        }
    }

    /// The server's in-band prefill progress wins: a new reading replaces
    /// the wait (`docs/metering.md`, "Why a call waits").
    fn take_in_band_progress(&mut self) {
        let Some(progress) = self.metering.prompt_progress() else {
            return;
        };
        if !self.waiting() {
            return;
        }
        let wait = Some(prompt_progress::in_band_wait(&progress));
        self.in_band_progress = true;
        self.wait_read_at = Some(Instant::now());
        if self.wait != wait {
            self.wait = wait;
            self.known_wait = self.wait.clone();
            self.publish(self.latest_now());
        }
    }

    /// Settles the call at its end marker, without waiting for the body's
    /// end: a server may stall or keep its connection open after the
    /// marker, and the call must leave the live list when the server says
    /// it is done. The transport may linger; the tap keeps forwarding its
    /// bytes to the client, while the queue stops keeping them.
    ///
    /// Proxied calls only: the capture learns that a segment before the
    /// marker was lost only when it gives up on the hole, at the exchange's
    /// end (`CaptureGap` then), so a captured call settles then, still with
    /// the marker's elapsed time ([`CallMetering::finish`]).
    fn settle_at_marker(&mut self, ctx: &mut Context<Self>) {
        let Some(at) = self.metering.marker_at() else {
            return;
        };
        if self.reported || self.setup.seen_by == SeenBy::Capture {
            return;
        }
        self.report(StreamEnd::Complete, at);
        if let Some(queue) = &self.frames {
            queue.close();
        }
        ctx.stop();
    }

    /// The slow rule for this call now: the route's normal for its model,
    /// prompt size and start, or the fixed threshold without history.
    fn slow_limit(&self) -> (u64, Option<u64>) {
        let floor = self.setup.slow_ttft.as_millis() as u64;
        let Ok(normals) = self.setup.normals.read() else {
            return (floor, None);
        };
        let waited = Waited {
            cold: self.facts.cold == Some(true),
            queue_position: self.queue.position(),
        };
        let l = normals.slow_limit(
            &self.setup.identity.route,
            self.setup.identity.model.as_deref(),
            self.prompt.map(|(_, calibrated)| calibrated),
            &waited,
            floor,
        );
        (l.limit_ms, l.usual_ms)
    }

    fn waiting(&self) -> bool {
        !self.reported && self.metering.first_output_at().is_none() && !self.is_unmetered()
    }

    /// The body is nothing the decoders read: its label said so, or (on a
    /// streaming request) its first bytes did.
    fn is_unmetered(&self) -> bool {
        self.unmetered || self.metering.not_understood()
    }

    /// (Re)schedules the slow-first-token check at the current limit,
    /// measured from dispatch. Called whenever the limit may have moved
    /// (model, prompt size or cold start learned).
    fn arm_alarm(&mut self, ctx: &mut Context<Self>) {
        // A demo call is never the subject of a notification.
        // Nor is a relay's leg: its client's call on the relay is.
        if self.alarm_fired || !self.waiting() || self.setup.identity.demo || self.relay.is_some() {
            return;
        }
        if let Some(h) = self.alarm.take() {
            ctx.cancel_future(h);
        }
        let (limit, usual) = self.slow_limit();
        self.limit_applied = Some((limit, usual));
        let deadline = self.setup.dispatched_at + Duration::from_millis(limit);
        let delay = deadline.saturating_duration_since(Instant::now());
        self.alarm = Some(ctx.run_later(delay, |act, ctx| {
            act.alarm = None;
            act.alarm_due(ctx);
        }));
    }

    fn alarm_due(&mut self, ctx: &mut Context<Self>) {
        if self.alarm_fired || !self.waiting() {
            return;
        }
        let (limit, usual) = self.slow_limit();
        let waited = Instant::now().saturating_duration_since(self.setup.dispatched_at);
        if (waited.as_millis() as u64) < limit {
            self.arm_alarm(ctx);
            return;
        }
        self.alarm_fired = true;
        self.setup.notifier.do_send(FirstTokenLate(SlowFirstToken {
            call: self.setup.identity.clone(),
            waited_ms: waited.as_millis() as u64,
            threshold_ms: limit,
            reason: self.wait.clone(),
            usual_ms: usual,
        }));
    }

    /// Tells the poller the server showed life in this waiting call's
    /// stream (a ping, or its own progress, told once), so its looks leave
    /// room for the pings and stop where the stream says more.
    fn tell_poller_sign(&mut self, at: Instant) {
        if !self.waiting() || self.progress_told {
            return;
        }
        self.progress_told = self.in_band_progress;
        if let Some(poller) = &self.setup.telemetry {
            poller.do_send(SignInBand {
                seq: self.setup.seq,
                at,
                progress: self.in_band_progress,
            });
        }
    }

    /// Tells the poller the model and the prompt size, once known.
    fn tell_poller(&self) {
        if let Some(poller) = &self.setup.telemetry {
            poller.do_send(CallUpdate {
                seq: self.setup.seq,
                model: self.setup.identity.model.clone(),
                prompt_tokens: self.prompt.map(|(_, calibrated)| calibrated),
            });
        }
    }

    /// Names the call's model from the request body, as soon as it is
    /// known. Until the response head arrives a later top-level `model`
    /// (a repeated key) replaces an earlier one; from then on the model
    /// the meter was set up for stays.
    fn learn_model(&mut self) -> bool {
        let model = &self.request.model;
        let changed = model.is_some() && self.setup.identity.model != *model;
        if changed && !self.metering.is_metering() {
            self.setup.identity.model = model.clone();
            return true;
        }
        false
    }

    /// A call still waiting republishes its snapshot with the time waited
    /// once [`WAITING_REFRESH`] passed since the last one it sent.
    fn refresh_waiting(&mut self, now: Instant) {
        let due = self
            .last_sent
            .as_ref()
            .is_none_or(|(_, _, at)| now.saturating_duration_since(*at) >= WAITING_REFRESH);
        if self.waiting() && due {
            self.publish(self.latest_now());
        }
    }

    /// The latest snapshot to publish again (its model or its wait
    /// changed). A call still waiting has no newer reading of its own, so
    /// its elapsed time is brought up to now: republished as it was, it
    /// would go back behind a wait already published with the time then.
    fn latest_now(&self) -> crate::model::Snapshot {
        let mut speed = self.metering.latest().clone();
        if speed.phase == Phase::AwaitingFirstToken && !speed.is_final {
            let waited = Instant::now().saturating_duration_since(self.setup.dispatched_at);
            speed.elapsed_ms = speed.elapsed_ms.max(waited.as_millis() as u64);
        }
        speed
    }

    /// A streaming call silent past its stall threshold republishes its
    /// latest snapshot with `stalled_ms`, once per [`WAITING_REFRESH`];
    /// its next output's snapshot carries none.
    fn refresh_stalled(&mut self, now: Instant) {
        let latest = self.metering.latest();
        if latest.is_final || latest.phase == Phase::AwaitingFirstToken {
            return;
        }
        let Some(stalled_ms) = self.liveness.stalled_ms(now) else {
            return;
        };
        let due = self.last_sent.as_ref().is_none_or(|(_, sent, at)| {
            sent.stalled_ms.is_none() || now.saturating_duration_since(*at) >= WAITING_REFRESH
        });
        if due {
            let mut speed = latest.clone();
            let elapsed = now.saturating_duration_since(self.setup.dispatched_at);
            speed.elapsed_ms = speed.elapsed_ms.max(elapsed.as_millis() as u64);
            speed.stalled_ms = Some(stalled_ms);
            self.publish(speed);
        }
    }

    /// A waiting call's snapshot carries its wait, and every waiting call
    /// says how long the server has been silent for it, with or without
    /// an explanation of the wait. The ETA counts down from the reading it
    /// came with: between two chunks (or polls) it is the time left now,
    /// not the time left when the server last spoke.
    fn with_wait(&self, mut speed: Snapshot) -> Snapshot {
        if speed.phase == Phase::AwaitingFirstToken && !speed.is_final {
            let now = Instant::now();
            let mut wait = self
                .wait
                .clone()
                .unwrap_or_else(|| Wait::new(WaitReason::Unknown));
            if let (Some(eta), Some(read_at)) = (wait.eta_ms, self.wait_read_at) {
                let since = now.saturating_duration_since(read_at).as_millis() as u64;
                wait.eta_ms = Some(eta.saturating_sub(since));
            }
            wait.silent_ms = Some(self.liveness.silent_ms(now));
            speed.wait = Some(wait);
        }
        speed
    }

    fn publish(&mut self, speed: Snapshot) {
        let mut speed = self.with_wait(speed);
        // Bytes lost in capture: neither the count nor the span is known,
        // so no live rate either (see `record` for the settled one).
        if self.capture_gap {
            speed.output_tokens_per_second = None;
        }
        let model = self.setup.identity.model.clone();
        if self
            .last_sent
            .as_ref()
            .is_some_and(|(m, sent, _)| *m == model && *sent == speed)
        {
            return;
        }
        self.last_sent = Some((model, speed.clone(), Instant::now()));
        self.setup.supervisor.do_send(CallProgress {
            seq: self.setup.seq,
            identity: self.setup.identity.clone(),
            speed,
            last_output_at: self.metering.last_output_at(),
        });
    }

    /// Settles the call and sends its record. Idempotent.
    fn report(&mut self, end: StreamEnd, now: Instant) {
        if self.reported {
            return;
        }
        self.reported = true;
        if self.setup.identity.model.is_none() {
            self.setup.identity.model = self.request.model.clone();
        }
        let report = self.metering.finish(end, now);
        if let Some(poller) = &self.setup.telemetry {
            poller.do_send(Untrack {
                seq: self.setup.seq,
                unreachable: self.unreachable,
            });
        }
        let ending = self.ending(&report, end);
        let beside = self
            .setup
            .decode_watch
            .stream_ended(&self.setup.identity.route, self.setup.seq);
        let mut details = self.details(&report, &ending);
        details.slowdown = self.judge_decode(&report, &ending, beside);
        self.learn(&report, &ending);
        if let Some(cut) = &ending.truncated {
            self.announce_truncation(cut);
        }
        let status = self.status(report.outcome);
        let call = self.record(status, report.snapshot, report.input_tokens, details);
        // A call with a capture gap teaches no calibration: its receipt
        // counts the whole output but its estimate only the text captured,
        // so their ratio is the loss, not the tokenizer's drift. Learned,
        // it inflated every later estimate of the route and model (a lossy
        // burst made 50,000 tokens count 74,606).
        let calibration_ratio = report.calibration_ratio.filter(|_| !self.capture_gap);
        self.setup.supervisor.do_send(CallClosed {
            seq: self.setup.seq,
            call,
            calibration_ratio,
        });
    }

    /// What the end of the call says about its prompt and its start, from
    /// the server's timings and what it said about the model.
    fn ending(&self, report: &CallReport, end: StreamEnd) -> Ending {
        let timings = report.server_timings.clone().unwrap_or_default();
        // The server's whole prompt count: processed plus cached.
        let server_prompt = timings
            .prompt_tokens
            .map(|n| n + timings.cached_tokens.unwrap_or(0))
            .or(report.input_tokens);
        let estimate = self.prompt.map(|(_, calibrated)| calibrated);
        let truncated = details::truncation(server_prompt, self.facts.context_size, estimate);
        let first_token = report
            .snapshot
            .time_to_first_token_ms
            .map_or_else(Instant::now, |ms| {
                self.setup.dispatched_at + Duration::from_millis(ms)
            });
        let queued = self
            .queue
            .queued_ms(first_token)
            .map(|ms| (ms, self.queue.position().unwrap_or(0)));
        Ending {
            end,
            start: self.start_kind(timings.load_ms),
            timings,
            server_prompt,
            estimate,
            truncated,
            queued,
        }
    }

    /// Cold or warm, only on evidence of a load (`docs/metering.md`, "Cold
    /// only with a load"): the server's `load_duration` against this
    /// model's warm normal when both are known; else a `load_duration` of
    /// at least [`COLD_LOAD_MS`] (the server's own clock is better evidence
    /// than when `/api/ps` happened to be read); else the load seen in
    /// `/api/ps`. A model not listed at dispatch whose load was never seen
    /// (a model that does not exist, a failed call) is neither.
    fn start_kind(&self, load_ms: Option<f64>) -> Option<StartKind> {
        let kind = |cold: bool| {
            if cold {
                StartKind::Cold
            } else {
                StartKind::Warm
            }
        };
        let by_normal = load_ms
            .zip(self.setup.identity.model.as_deref())
            .and_then(|(ms, m)| {
                let normals = self.setup.normals.read().ok()?;
                normals.is_load(&self.setup.identity.route, m, ms)
            });
        let by_ps = match self.facts.cold {
            Some(true) => self.facts.load_seen.then_some(true),
            warm => warm,
        };
        by_normal
            .or(load_ms.map(|ms| ms >= COLD_LOAD_MS))
            .or(by_ps)
            .map(kind)
    }

    /// The settled call's details. Takes the kept error body: read here
    /// for a refusal's cause, then let go.
    fn details(&mut self, report: &CallReport, ending: &Ending) -> CallDetails {
        let error = (!(200..300).contains(&self.http_status.unwrap_or(200)))
            .then(|| details::context_refusal(&self.error_body))
            .flatten();
        let failure = self.failure(report, ending.end);
        self.error_body = Vec::new();
        let context = ending.server_prompt.map(|prompt| ContextUse {
            size: self.facts.context_size,
            used: prompt + report.snapshot.output_tokens,
        });
        let timings = &ending.timings;
        let ttft = report.snapshot.time_to_first_token_ms;
        let queued_ms = ending.queued.map(|(ms, _)| ms);
        CallDetails {
            slow_after_ms: self.limit_applied.map(|(limit, _)| limit),
            slow_after_usual_ms: self.limit_applied.and_then(|(_, usual)| usual),
            client: self.setup.client.clone(),
            ttft_breakdown: report
                .server_timings
                .as_ref()
                .and_then(|t| details::ttft_breakdown(ttft, t))
                .map(|b| details::without_queue(b, queued_ms)),
            one_burst: report.outcome == Outcome::Ok && report.one_burst,
            unstreamed_reasoning: details::unstreamed_reasoning(
                report.exact_output_tokens,
                report.raw_estimate,
            ),
            settled_at: Some(humantime::format_rfc3339_millis(SystemTime::now()).to_string()),
            seen_by: self.setup.seen_by,
            capture_gap: self.capture_gap,
            // Bytes lost in capture may have joined two lines into one
            // that names a model: such a call names none.
            response_model: self
                .response_model
                .model()
                .filter(|_| !self.capture_gap)
                .map(str::to_owned),
            // The settled wait is what the store keeps: its progress
            // label is live only (`docs/api.md`, Wait).
            wait: self
                .known_wait
                .clone()
                .or_else(|| self.wait.clone())
                .map(|w| Wait {
                    progress_source: None,
                    ..w
                }),
            queued_ms,
            queue_position: ending
                .queued
                .and_then(|(_, place)| (place > 0).then_some(place)),
            prompt_truncated: ending.truncated.clone(),
            context,
            draft: match (timings.draft_tokens, timings.draft_accepted) {
                (Some(drafted), Some(accepted)) => Some(DraftCounts { drafted, accepted }),
                _ => None,
            },
            placement: self.facts.placement,
            model_bytes: self.facts.model_bytes,
            vram_bytes: self.facts.vram_bytes,
            start: ending.start,
            error,
            prompt_tokens_estimated: ending.estimate.filter(|n| *n > 0),
            relay: self.relay.clone(),
            server_version: self.facts.server_version.clone(),
            reasoning_tokens: report.reasoning.map(|r| r.tokens),
            reasoning_tokens_estimated: report.reasoning.is_some_and(|r| r.estimated),
            reasoning_ms: report.reasoning.map(|r| r.ms),
            // Judged by `report`, which also lets the call teach the usual.
            slowdown: None,
            failure,
            stalls: None,
            stalled_ms: None,
            longest_stall_ms: None,
            longest_stall_after_token: None,
            output_tokens_per_second_excluding_stalls: None,
        }
    }

    /// How the call went wrong, if it did (`engine::failure`). A body not
    /// metered that the server answered with a 2xx did not fail: it was
    /// only not understood.
    fn failure(&self, report: &CallReport, end: StreamEnd) -> Option<crate::model::Failure> {
        let ok_head = self.http_status.is_none_or(|c| (200..300).contains(&c));
        if self.is_unmetered() && ok_head && !self.unreachable {
            return None;
        }
        failure::failure(&failure::End {
            unreachable: self.unreachable,
            http_status: self.http_status,
            outcome: report.outcome,
            end,
            error_body: &self.error_body,
            stream_error: report.stream_error.as_deref(),
            stream_error_text: report.stream_error_text.as_deref(),
            output_tokens: report.snapshot.output_tokens,
        })
    }

    /// Tells subscribers the route's server cut this model's prompt, the
    /// first time it does (one event per route and model, not per call).
    fn announce_truncation(&self, cut: &PromptTruncation) {
        let Some(model) = &self.setup.identity.model else {
            return;
        };
        if self.setup.identity.demo || self.relay.is_some() {
            return;
        }
        let first = self
            .setup
            .normals
            .write()
            .map(|mut n| n.first_truncation(&self.setup.identity.route, model))
            .unwrap_or(false);
        if first {
            self.setup
                .supervisor
                .do_send(Broadcast(EngineEvent::PromptTruncated(PromptTruncated {
                    call: self.setup.identity.clone(),
                    request_tokens: cut.request_tokens,
                    server_tokens: cut.server_tokens,
                    context_size: cut.context_size,
                })));
        }
    }

    /// The call's status: an unreachable upstream or a body not metered
    /// say more than how the meter saw the stream end.
    fn status(&self, outcome: Outcome) -> CallStatus {
        if self.unreachable {
            CallStatus::UpstreamError
        } else if self.is_unmetered() {
            CallStatus::Unmetered
        } else {
            match outcome {
                Outcome::Ok => CallStatus::Ok,
                Outcome::Abandoned => CallStatus::Abandoned,
                Outcome::UpstreamError => CallStatus::UpstreamError,
            }
        }
    }

    /// The call's record, with its final snapshot (none when unmetered).
    fn record(
        &self,
        status: CallStatus,
        mut snapshot: crate::model::Snapshot,
        input_tokens: Option<u64>,
        details: CallDetails,
    ) -> Call {
        // A capture gap: bytes of the response (or request) never reached
        // the meter, so the token count and the span the rate divides by
        // may both be off, in either direction. A wrong rate is worse than
        // none: the rate is dropped, while what the server reported (its
        // usage receipt, its timings) and the TTFT are kept.
        if self.capture_gap {
            snapshot.output_tokens_per_second = None;
        }
        Call {
            identity: self.setup.identity.clone(),
            status,
            http_status: self.http_status,
            speed: if status == CallStatus::Unmetered {
                None
            } else {
                Some(snapshot)
            },
            input_tokens,
            details,
        }
    }
}

/// What a call's end says beyond its snapshot, read once from its final
/// report and used by its details, the route's normals and the
/// truncation event.
struct Ending {
    /// How the transport ended.
    end: StreamEnd,
    timings: ServerTimings,
    /// The server's whole prompt count: processed plus cached.
    server_prompt: Option<u64>,
    /// Our calibrated estimate of the prompt, from the request body.
    estimate: Option<u64>,
    truncated: Option<PromptTruncation>,
    start: Option<StartKind>,
    /// The time queued (ms) and the most calls ahead.
    queued: Option<(u64, u32)>,
}

impl CallActor {
    /// Teaches the route's normal from a call that ended well. Its prompt
    /// count teaches the prompt factor whenever it is the whole prompt,
    /// flagged or not ([`details::count_is_whole_prompt`]).
    fn learn(&self, report: &CallReport, ending: &Ending) {
        let (server_prompt, start) = (ending.server_prompt, ending.start);
        let (Some(model), Some(ttft_ms)) = (
            self.setup.identity.model.as_deref(),
            report.snapshot.time_to_first_token_ms,
        ) else {
            return;
        };
        if report.outcome != Outcome::Ok || self.is_unmetered() || self.capture_gap {
            return;
        }
        let timings = report.server_timings.clone().unwrap_or_default();
        let observation = Observation {
            ttft_ms,
            prompt_tokens: server_prompt.or(self.prompt.map(|(_, c)| c)),
            cold: start == Some(StartKind::Cold),
            load_ms: timings.load_ms,
            queued: ending.queued,
            prefill: timings.prompt_tokens.zip(timings.prompt_ms),
            prompt_estimate: self.prompt.map(|(raw, _)| raw).zip(server_prompt).filter(
                |(_, server)| details::count_is_whole_prompt(*server, self.facts.context_size),
            ),
        };
        if let Ok(mut normals) = self.setup.normals.write() {
            normals.observe(&self.setup.identity.route, model, &observation);
        }
    }
}

impl CallActor {
    /// Judges a settled ok call's decode rate against its usual and lets
    /// it teach the usual (`docs/metering.md`, "The slowdown explained"),
    /// with the server's placement and version and the calls that
    /// streamed beside it (`beside`). Calls whose rate is not honest
    /// (capture gap, not ok, a relay's leg, the demo's) are left out.
    fn judge_decode(
        &self,
        report: &CallReport,
        ending: &Ending,
        beside: u32,
    ) -> Option<crate::model::Slowdown> {
        let model = self.setup.identity.model.as_deref()?;
        let tps = report.snapshot.output_tokens_per_second?;
        if report.outcome != Outcome::Ok
            || self.is_unmetered()
            || self.capture_gap
            || self.relay.is_some()
            || self.setup.identity.demo
        {
            return None;
        }
        let call = DecodeCall {
            route: &self.setup.identity.route,
            model,
            depth: ending.server_prompt,
            tps,
            version: self.facts.server_version.as_deref(),
            draft_acceptance: ending
                .timings
                .draft_tokens
                .zip(ending.timings.draft_accepted)
                .and_then(|(drafted, accepted)| draft_acceptance(drafted, accepted)),
        };
        let cpu_share = match (self.facts.model_bytes, self.facts.vram_bytes) {
            (Some(size), Some(vram)) if size > 0 => Some(1.0 - vram.min(size) as f64 / size as f64),
            _ => None,
        };
        let evidence = Evidence {
            cpu_share,
            concurrent_calls: beside,
        };
        self.setup.decode_watch.settle(&call, &evidence)
    }
}

impl Actor for CallActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        let first = self.metering.start();
        let first = self.with_wait(first);
        self.last_sent = Some((
            self.setup.identity.model.clone(),
            first.clone(),
            Instant::now(),
        ));
        self.setup.supervisor.do_send(CallOpened {
            seq: self.setup.seq,
            call: Call {
                identity: self.setup.identity.clone(),
                status: CallStatus::InFlight,
                http_status: None,
                speed: Some(first),
                input_tokens: None,
                details: CallDetails {
                    seen_by: self.setup.seen_by,
                    ..CallDetails::default()
                },
            },
        });
        // Pending text is published even when the stream pauses.
        //
        // The same tick notices when every address is gone without a
        // `BodyEnded`: actix keeps an actor alive while it has a running
        // interval, so without this `stopping()` would never run and the
        // call would stay in flight forever. It stops on the second tick
        // that finds no address: once none is left no message can be added,
        // and every poll drains the mailbox before running timers, so a
        // message sent just before the last address dropped (the tap's own
        // `BodyEnded`) is still handled first. The record's end time is the
        // first tick that noticed.
        ctx.run_interval(SNAPSHOT_INTERVAL, |act, ctx| {
            act.drain_frames();
            act.settle_at_marker(ctx);
            if act.reported {
                return;
            }
            let now = Instant::now();
            if !ctx.connected() {
                if act.orphaned_at.is_some() {
                    ctx.stop();
                    return;
                }
                act.orphaned_at = Some(now);
            }
            if let Some(s) = act.metering.tick(now) {
                act.publish(s);
            }
            act.refresh_waiting(now);
            act.refresh_stalled(now);
        });
        // The slow-first-token alarm fires while the call is still waiting,
        // measured from dispatch (not from the actor's start).
        self.arm_alarm(ctx);
        if let Some(poller) = &self.setup.telemetry {
            poller.do_send(Track {
                seq: self.setup.seq,
                model: self.setup.identity.model.clone(),
                dispatched_at: self.setup.dispatched_at,
                actor: ctx.address().recipient(),
            });
        }
    }

    fn stopping(&mut self, _ctx: &mut Self::Context) -> Running {
        // Every way out reports once: the tap dropped without an end, the
        // engine stopping, or a normal end (then this is a no-op).
        self.drain_frames();
        let at = self.orphaned_at.unwrap_or_else(Instant::now);
        self.report(StreamEnd::ClientGone, at);
        Running::Stop
    }
}

impl Handler<RequestFieldsSeen> for CallActor {
    type Result = ();
    fn handle(&mut self, msg: RequestFieldsSeen, ctx: &mut Self::Context) {
        self.request = msg.0;
        let mut news = false;
        // Name the model as soon as the request says it, so a call still
        // waiting for its first token already shows which model is slow.
        if self.learn_model() && !self.reported {
            self.publish(self.latest_now());
            news = true;
        }
        if self.request.complete && self.prompt.is_none() {
            let raw = self.request.raw_prompt_tokens();
            let model = self.setup.identity.model.clone().unwrap_or_default();
            let calibrated = self
                .setup
                .normals
                .read()
                .map(|n| n.calibrated_prompt(&self.setup.identity.route, &model, raw))
                .unwrap_or(raw);
            self.prompt = Some((raw, calibrated));
            news = true;
        }
        if news {
            self.tell_poller();
            self.arm_alarm(ctx);
        }
    }
}

impl Handler<ResponseStarted> for CallActor {
    type Result = ();
    fn handle(&mut self, msg: ResponseStarted, _: &mut Self::Context) {
        self.http_status = Some(msg.status);
        let facts = request_facts(&self.setup.method, &self.setup.path, &self.request);
        if self.setup.identity.model.is_none() {
            self.setup.identity.model = facts.model.clone();
        }
        let api = if facts.api == ApiKind::Unknown {
            self.setup.identity.api
        } else {
            facts.api
        };
        let framing = detect_framing(api, facts.stream, msg.content_type.as_deref());
        let success = (200..300).contains(&msg.status);
        // A reply to a streaming request: its bytes say how it is framed,
        // whatever its label (`decode::sniff`).
        let sniff = success && facts.stream && api != ApiKind::Unknown;
        if success && framing == BodyFraming::Other && !sniff {
            self.unmetered = true;
            return;
        }
        let model = self.setup.identity.model.clone().unwrap_or_default();
        let calibration = self
            .setup
            .calibration
            .read()
            .map(|t| t.factor(&self.setup.identity.route, &model))
            .unwrap_or(1.0);
        self.metering.on_response_head(&ResponseHead {
            status: msg.status,
            api,
            framing,
            model: self.setup.identity.model.clone(),
            calibration,
            sniff,
        });
    }
}

/// One frame on its own: only the unit tests feed frames so; both
/// interceptors queue theirs ([`FramesQueued`]).
#[cfg(test)]
impl Handler<Frame> for CallActor {
    type Result = ();
    fn handle(&mut self, msg: Frame, _: &mut Self::Context) {
        self.on_frame(&msg.bytes, msg.at);
    }
}

impl Handler<FramesQueued> for CallActor {
    type Result = ();
    fn handle(&mut self, msg: FramesQueued, ctx: &mut Self::Context) {
        self.frames.get_or_insert(msg.0);
        self.drain_frames();
        self.settle_at_marker(ctx);
    }
}

impl Handler<WaitExplained> for CallActor {
    type Result = ();
    fn handle(&mut self, msg: WaitExplained, ctx: &mut Self::Context) {
        let mut limit_moved = self.facts.cold != msg.facts.cold;
        self.facts = msg.facts;
        if !self.waiting() {
            return;
        }
        if let Some(wait) = &msg.wait {
            if shows_life(self.wait.as_ref(), wait) {
                self.liveness.on_sign(Instant::now());
            }
            let place = self.queue.position();
            self.queue
                .explained(wait, self.setup.dispatched_at, Instant::now());
            limit_moved |= place != self.queue.position();
        }
        if msg.wait.is_some() && !self.in_band_progress {
            self.wait_read_at = Some(Instant::now());
        }
        if msg.wait.is_some() && self.wait != msg.wait && !self.in_band_progress {
            self.wait = msg.wait;
            if self
                .wait
                .as_ref()
                .is_some_and(|w| w.reason != crate::model::WaitReason::Unknown)
            {
                self.known_wait = self.wait.clone();
            }
            self.publish(self.latest_now());
        }
        if limit_moved {
            self.arm_alarm(ctx);
        }
    }
}

impl Handler<BodyEnded> for CallActor {
    type Result = ();
    fn handle(&mut self, msg: BodyEnded, ctx: &mut Self::Context) {
        self.drain_frames();
        self.report(msg.end, msg.at);
        ctx.stop();
    }
}

impl Handler<RelayLeg> for CallActor {
    type Result = ();
    fn handle(&mut self, msg: RelayLeg, ctx: &mut Self::Context) {
        if self.reported || self.relay.is_some() {
            return;
        }
        if let Some(h) = self.alarm.take() {
            ctx.cancel_future(h);
        }
        self.setup.supervisor.do_send(LegFound {
            seq: self.setup.seq,
            relay: msg.0.clone(),
        });
        self.relay = Some(msg.0);
    }
}

impl Handler<CaptureGap> for CallActor {
    type Result = ();
    fn handle(&mut self, _: CaptureGap, _: &mut Self::Context) {
        self.capture_gap = true;
    }
}

impl Handler<FlowQuiet> for CallActor {
    type Result = ();
    fn handle(&mut self, msg: FlowQuiet, ctx: &mut Self::Context) {
        self.drain_frames();
        if self.metering.saw_end_marker() && !self.reported {
            // Any end after the marker is `ok`, settled at the marker.
            self.report(StreamEnd::UpstreamCut, msg.at);
            ctx.stop();
        }
    }
}

impl Handler<ResponseModel> for CallActor {
    type Result = ();
    fn handle(&mut self, msg: ResponseModel, _: &mut Self::Context) {
        if self.setup.identity.model.is_none() && !self.reported {
            self.setup.identity.model = Some(msg.0);
            self.publish(self.latest_now());
        }
    }
}

impl Handler<Discard> for CallActor {
    type Result = ();
    fn handle(&mut self, _: Discard, ctx: &mut Self::Context) {
        if !self.reported {
            self.reported = true;
            self.setup.supervisor.do_send(CallDiscarded {
                seq: self.setup.seq,
            });
        }
        ctx.stop();
    }
}

impl Handler<UpstreamFailed> for CallActor {
    type Result = ();
    fn handle(&mut self, msg: UpstreamFailed, ctx: &mut Self::Context) {
        self.unreachable = true;
        self.http_status = Some(502);
        self.report(StreamEnd::UpstreamCut, msg.at);
        ctx.stop();
    }
}

#[cfg(test)]
mod tests {
    use actix::{Message, MessageResult};
    use bytes::Bytes;
    use tokio::sync::mpsc;

    use super::*;
    use crate::engine::metrics::Metrics;
    use crate::engine::supervisor::tests::{advance_to, flush, ms_since, run_paused};
    use crate::model::EngineEvent;
    use crate::model::{Phase, Snapshot, TokenSource};
    use crate::tokens::WordCounter;

    const SLOW_TTFT: Duration = Duration::from_secs(5);

    /// Stands in for the notifier: keeps every alarm with the virtual time
    /// (ms since dispatch) it arrived at.
    struct Alarms {
        t0: Instant,
        seen: Vec<(u64, SlowFirstToken)>,
    }

    impl Actor for Alarms {
        type Context = Context<Self>;
    }

    impl Handler<FirstTokenLate> for Alarms {
        type Result = ();
        fn handle(&mut self, msg: FirstTokenLate, _: &mut Self::Context) {
            self.seen.push((ms_since(self.t0), msg.0));
        }
    }

    #[derive(Message)]
    #[rtype(result = "Vec<(u64, SlowFirstToken)>")]
    struct Seen;

    impl Handler<Seen> for Alarms {
        type Result = MessageResult<Seen>;
        fn handle(&mut self, _: Seen, _: &mut Self::Context) -> Self::Result {
            MessageResult(self.seen.clone())
        }
    }

    /// A real supervisor and a stand-in notifier around one call actor.
    struct Harness {
        /// Dispatch time of the call.
        t0: Instant,
        supervisor: Addr<Supervisor>,
        events: mpsc::Receiver<EngineEvent>,
        alarms: Addr<Alarms>,
        calibration: Arc<RwLock<CalibrationTable>>,
        normals: Arc<RwLock<Normals>>,
        settled: Vec<Call>,
    }

    impl Harness {
        async fn new() -> Self {
            let t0 = Instant::now();
            let calibration = Arc::new(RwLock::new(CalibrationTable::new()));
            let supervisor = Supervisor::new(calibration.clone(), Arc::new(Metrics::new())).start();
            let events = supervisor
                .send(Subscribe { capacity: 4_096 })
                .await
                .expect("supervisor");
            let alarms = Alarms {
                t0,
                seen: Vec::new(),
            }
            .start();
            Harness {
                t0,
                supervisor,
                events,
                alarms,
                calibration,
                normals: Arc::new(RwLock::new(Normals::new())),
                settled: Vec::new(),
            }
        }

        /// Starts the call actor (now), for a call dispatched at `t0`.
        fn start_call(&self) -> Addr<CallActor> {
            CallActor::new(CallSetup {
                seq: 1,
                identity: CallIdentity {
                    id: "c-000001".into(),
                    route: "r".into(),
                    api: ApiKind::OpenaiChat,
                    model: None,
                    started_at: String::new(),
                    demo: false,
                },
                method: "POST".into(),
                path: "/v1/chat/completions".into(),
                dispatched_at: self.t0,
                slow_ttft: SLOW_TTFT,
                estimator: Arc::new(WordCounter),
                calibration: self.calibration.clone(),
                supervisor: self.supervisor.clone(),
                notifier: self.alarms.clone().recipient(),
                client: None,
                seen_by: SeenBy::Proxy,
                normals: self.normals.clone(),
                decode_watch: Default::default(),
                telemetry: None,
            })
            .start()
        }

        /// Every call record the supervisor broadcast so far (one per
        /// `CallClosed` it received).
        async fn settled(&mut self) -> &[Call] {
            flush().await;
            while let Ok(event) = self.events.try_recv() {
                if let EngineEvent::Settled(mut call) = event {
                    // The settle time is wall-clock: check it is there,
                    // then leave it out of the exact comparisons.
                    assert!(call.details.settled_at.take().is_some(), "{call:?}");
                    self.settled.push(call);
                }
            }
            &self.settled
        }

        async fn alarms(&self) -> Vec<(u64, SlowFirstToken)> {
            flush().await;
            self.alarms.send(Seen).await.expect("alarms")
        }

        async fn at(&self, ms: u64) {
            advance_to(self.t0, ms).await;
        }
    }

    const REQUEST: &[u8] =
        br#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;

    fn sse(data: serde_json::Value) -> String {
        format!("data: {data}\n\n")
    }

    fn content(text: &str) -> String {
        sse(serde_json::json!({
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": null}]
        }))
    }

    /// The chunk llama.cpp and vLLM send first: a role, no text.
    fn role_only() -> String {
        sse(serde_json::json!({
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]
        }))
    }

    fn frame(actor: &Addr<CallActor>, body: impl Into<Bytes>) {
        actor.do_send(Frame {
            bytes: body.into(),
            at: Instant::now(),
        });
    }

    fn head(actor: &Addr<CallActor>) {
        actor.do_send(ResponseStarted {
            status: 200,
            content_type: Some("text/event-stream".into()),
            at: Instant::now(),
        });
    }

    /// Dispatch at 0, head at 800 ms, a role-only chunk at 900 ms, 25
    /// one-word chunks every 100 ms from 1000 ms to 3400 ms (one of them
    /// split across two frames), the finish chunk (with a usage receipt of
    /// `usage` tokens, if any) and `[DONE]` at 3450 ms, end at 3500 ms.
    /// Returns every record the supervisor got.
    async fn stream_one_call(h: &mut Harness, usage: Option<u64>) -> Vec<Call> {
        let actor = h.start_call();
        actor.do_send(RequestFieldsSeen(RequestFields::scan(REQUEST)));
        h.at(800).await;
        head(&actor);
        h.at(900).await;
        frame(&actor, role_only());
        for i in 0..25u64 {
            h.at(1_000 + i * 100).await;
            let chunk = content(&format!(" w{i}"));
            if i == 10 {
                let (a, b) = chunk.split_at(chunk.len() / 2);
                frame(&actor, a.to_owned());
                frame(&actor, b.to_owned());
            } else {
                frame(&actor, chunk);
            }
        }
        h.at(3_450).await;
        let mut end = sse(serde_json::json!({
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]
        }));
        if let Some(n) = usage {
            end += &sse(serde_json::json!({
                "object": "chat.completion.chunk",
                "choices": [],
                "usage": {"prompt_tokens": 7, "completion_tokens": n, "total_tokens": 7 + n}
            }));
        }
        end += "data: [DONE]\n\n";
        frame(&actor, end);
        h.at(3_500).await;
        actor.do_send(BodyEnded {
            end: StreamEnd::Complete,
            at: Instant::now(),
        });
        drop(actor);
        // Long after: still one record, and no alarm (the first token
        // came at 1 s).
        h.at(20_000).await;
        assert!(h.alarms().await.is_empty());
        h.settled().await.to_vec()
    }

    /// The record of the test call: its request holds 17 bytes of text
    /// (`role`, `user`, `content`, `hi`), a 5-token prompt estimate; the
    /// context used is the server's prompt count plus the output.
    fn record(status: CallStatus, speed: Snapshot, input_tokens: Option<u64>) -> Call {
        let context = input_tokens.map(|n| crate::model::ContextUse {
            size: None,
            used: n + speed.output_tokens,
        });
        Call {
            identity: CallIdentity {
                id: "c-000001".into(),
                route: "r".into(),
                api: ApiKind::OpenaiChat,
                model: Some("m".into()),
                started_at: String::new(),
                demo: false,
            },
            status,
            http_status: Some(200),
            speed: Some(speed),
            input_tokens,
            details: CallDetails {
                context,
                prompt_tokens_estimated: Some(5),
                // The harness's fixed threshold: no history here.
                slow_after_ms: Some(5_000),
                ..CallDetails::default()
            },
        }
    }

    #[test]
    fn a_complete_stream_settles_once_with_the_receipt_and_its_decode_rate() {
        run_paused(async {
            let mut h = Harness::new().await;
            let settled = stream_one_call(&mut h, Some(30)).await;
            // 30 exact tokens for 25 estimated: a plausible drift, so the
            // rate times the exact count over the streamed span:
            // (30 - 1) / (3.4 s - 1.0 s) = 12.08. It settles at the
            // marker (3,450 ms), not at the body's end 50 ms later.
            let expected = record(
                CallStatus::Ok,
                Snapshot {
                    stalled_ms: None,
                    phase: Phase::Complete,
                    is_final: true,
                    elapsed_ms: 3_450,
                    time_to_first_token_ms: Some(1_000),
                    output_tokens: 30,
                    output_tokens_per_second: Some(12.1),
                    token_source: TokenSource::Provider,
                    wait: None,
                },
                Some(7),
            );
            assert_eq!(settled, std::slice::from_ref(&expected));
            let mut listed = h.supervisor.send(GetCall("c-000001".into())).await.unwrap();
            if let Some(call) = listed.as_mut() {
                assert!(call.details.settled_at.take().is_some());
            }
            assert_eq!(listed, Some(expected));
            // The ratio 30 / 25 reached the shared table for (r, m).
            let table = h.supervisor.send(GetCalibration).await.unwrap();
            assert_eq!(table.len(), 1);
            assert_eq!(table.factor("r", "m"), 1.2);
        });
    }

    #[test]
    fn a_queued_stream_settles_at_its_marker_while_the_body_stays_open() {
        run_paused(async {
            let mut h = Harness::new().await;
            let actor = h.start_call();
            actor.do_send(RequestFieldsSeen(RequestFields::scan(REQUEST)));
            h.at(100).await;
            head(&actor);
            let queue = Arc::new(FrameQueue::default());
            let push = |bytes: String| {
                queue.push(Frame {
                    bytes: bytes.into(),
                    at: Instant::now(),
                })
            };
            h.at(200).await;
            push(content(" hello"));
            actor.do_send(FramesQueued(queue.clone()));
            h.at(400).await;
            push("data: [DONE]\n\n".to_owned());
            actor.do_send(FramesQueued(queue.clone()));
            // No end of body: the server stalls after its marker.
            h.at(3_400).await;
            let settled = h.settled().await.to_vec();
            assert_eq!(settled.len(), 1, "not settled at the marker");
            assert_eq!(settled[0].status, CallStatus::Ok);
            let speed = settled[0].speed.as_ref().expect("metered");
            assert_eq!(speed.elapsed_ms, 400);
            // What the server sends after the marker is no longer kept.
            assert!(!push(content(" late")));
            let mut left = Vec::new();
            queue.take(&mut left);
            assert!(left.is_empty(), "{left:?}");
        });
    }

    #[test]
    fn a_complete_stream_without_a_receipt_settles_on_the_estimate() {
        run_paused(async {
            let mut h = Harness::new().await;
            let settled = stream_one_call(&mut h, None).await;
            // (25 - 1) / 2.4 s = 10.0, counted by the estimator; settled
            // at the marker.
            let expected = record(
                CallStatus::Ok,
                Snapshot {
                    stalled_ms: None,
                    phase: Phase::Complete,
                    is_final: true,
                    elapsed_ms: 3_450,
                    time_to_first_token_ms: Some(1_000),
                    output_tokens: 25,
                    output_tokens_per_second: Some(10.0),
                    token_source: TokenSource::Estimated,
                    wait: None,
                },
                None,
            );
            assert_eq!(settled, [expected]);
            let table = h.supervisor.send(GetCalibration).await.unwrap();
            assert!(table.is_empty());
        });
    }

    #[test]
    fn dropping_every_address_without_an_end_settles_once_as_abandoned() {
        run_paused(async {
            let mut h = Harness::new().await;
            let actor = h.start_call();
            actor.do_send(RequestFieldsSeen(RequestFields::scan(REQUEST)));
            h.at(800).await;
            head(&actor);
            for (ms, text) in [(1_000, " a b"), (1_100, " c"), (1_200, " d e f")] {
                h.at(ms).await;
                frame(&actor, content(text));
            }
            drop(actor);
            h.at(1_240).await;
            assert!(h.settled().await.is_empty());
            // Snapshot ticks run at 250 ms from the actor's start: the one
            // at 1250 ms finds no address, the one at 1500 ms stops the
            // actor, and the record ends at the first.
            h.at(1_490).await;
            assert!(h.settled().await.is_empty());
            h.at(1_500).await;
            let mut expected = record(
                CallStatus::Abandoned,
                Snapshot {
                    stalled_ms: None,
                    phase: Phase::Complete,
                    is_final: true,
                    elapsed_ms: 1_250,
                    time_to_first_token_ms: Some(1_000),
                    output_tokens: 6,
                    output_tokens_per_second: None,
                    token_source: TokenSource::Estimated,
                    wait: None,
                },
                None,
            );
            // Gone without an end: the interceptor's client left.
            expected.details.failure = Some(crate::model::Failure::new(
                crate::model::FailureKind::ClientLeft,
                6,
                None,
            ));
            assert_eq!(h.settled().await, std::slice::from_ref(&expected));
            h.at(20_000).await;
            assert_eq!(h.settled().await, [expected]);
            assert!(h.alarms().await.is_empty());
        });
    }

    #[test]
    fn a_waiting_call_republished_with_its_model_shows_the_time_it_has_waited() {
        run_paused(async {
            let mut h = Harness::new().await;
            let actor = h.start_call();
            h.at(400).await;
            actor.do_send(RequestFieldsSeen(RequestFields::scan(REQUEST)));
            flush().await;
            let mut waiting = Vec::new();
            while let Ok(event) = h.events.try_recv() {
                if let EngineEvent::Speed { call, speed, .. } = event {
                    waiting.push((call.model, speed.elapsed_ms));
                }
            }
            // At dispatch with no model, then at 400 ms with it: never
            // back at 0, behind a wait published in between.
            assert_eq!(waiting, vec![(None, 0), (Some("m".to_string()), 400)]);
        });
    }

    #[test]
    fn a_waiting_call_without_telemetry_keeps_its_elapsed_time_current_and_never_repeats_a_snapshot(
    ) {
        run_paused(async {
            let mut h = Harness::new().await;
            let actor = h.start_call();
            h.at(400).await;
            actor.do_send(RequestFieldsSeen(RequestFields::scan(REQUEST)));
            flush().await;
            h.at(11_000).await;
            let mut sent = Vec::new();
            while let Ok(event) = h.events.try_recv() {
                if let EngineEvent::Speed { call, speed, .. } = event {
                    assert_eq!(speed.phase, Phase::AwaitingFirstToken);
                    sent.push((call.model, speed));
                }
            }
            let elapsed: Vec<u64> = sent.iter().map(|(_, s)| s.elapsed_ms).collect();
            // Never the same snapshot twice, and never more than a
            // refresh (plus one tick) apart while it waits 11 s.
            assert!(elapsed.windows(2).all(|w| w[0] < w[1]), "{elapsed:?}");
            assert!(
                elapsed.windows(2).all(|w| w[1] - w[0] <= 1_250),
                "{elapsed:?}"
            );
            assert!(*elapsed.last().unwrap() >= 10_000, "{elapsed:?}");
        });
    }

    #[test]
    fn the_slow_first_token_alarm_fires_once_at_exactly_slow_ttft_after_dispatch() {
        run_paused(async {
            let mut h = Harness::new().await;
            // The actor starts 1 s after dispatch: the alarm still counts
            // from dispatch.
            h.at(1_000).await;
            let actor = h.start_call();
            actor.do_send(RequestFieldsSeen(RequestFields::scan(REQUEST)));
            h.at(1_500).await;
            head(&actor);
            // A role without text is not a first token.
            frame(&actor, role_only());

            h.at(4_990).await;
            assert!(h.alarms().await.is_empty());
            h.at(5_000).await;
            let expected = SlowFirstToken {
                call: CallIdentity {
                    id: "c-000001".into(),
                    route: "r".into(),
                    api: ApiKind::OpenaiChat,
                    model: Some("m".into()),
                    started_at: String::new(),
                    demo: false,
                },
                waited_ms: 5_000,
                threshold_ms: 5_000,
                reason: None,
                usual_ms: None,
            };
            assert_eq!(h.alarms().await, [(5_000, expected.clone())]);

            // Still waiting much longer, then the first token: no repeat.
            h.at(30_000).await;
            frame(&actor, content(" late"));
            h.at(40_000).await;
            assert_eq!(h.alarms().await, [(5_000, expected)]);
            assert!(h.settled().await.is_empty());
        });
    }

    /// On route r, model m usually takes 8 s to its first token (three
    /// warm calls of a 10-token prompt).
    fn usually_8_s_to_the_first_token(h: &Harness) {
        for _ in 0..3 {
            h.normals.write().unwrap().observe(
                "r",
                "m",
                &Observation {
                    ttft_ms: 8_000,
                    prompt_tokens: Some(10),
                    ..Observation::default()
                },
            );
        }
    }

    #[test]
    fn the_slow_alarm_waits_for_twice_the_routes_usual_and_names_it() {
        run_paused(async {
            let h = Harness::new().await;
            usually_8_s_to_the_first_token(&h);
            let actor = h.start_call();
            actor.do_send(RequestFieldsSeen(RequestFields::scan(REQUEST)));
            // The fixed 5 s is normal here: no alarm.
            h.at(15_990).await;
            assert!(h.alarms().await.is_empty());
            h.at(16_000).await;
            let alarms = h.alarms().await;
            assert_eq!(alarms.len(), 1, "{alarms:?}");
            let (at, slow) = &alarms[0];
            assert_eq!(*at, 16_000);
            assert_eq!(slow.threshold_ms, 16_000);
            assert_eq!(slow.usual_ms, Some(8_000));
            assert_eq!(
                slow.message(),
                "m on r: no first token after 16.0 s (usually 8.0 s)"
            );
            h.at(40_000).await;
            assert_eq!(h.alarms().await.len(), 1);
            drop(actor);
        });
    }

    #[test]
    fn without_history_the_fixed_threshold_rules_and_the_alarm_names_the_cause() {
        run_paused(async {
            let h = Harness::new().await;
            let actor = h.start_call();
            actor.do_send(RequestFieldsSeen(RequestFields::scan(REQUEST)));
            h.at(1_000).await;
            actor.do_send(WaitExplained {
                wait: Some(Wait::new(crate::model::WaitReason::LoadingModel)),
                facts: ServerFacts {
                    cold: Some(true),
                    ..ServerFacts::default()
                },
            });
            h.at(5_000).await;
            let alarms = h.alarms().await;
            assert_eq!(alarms.len(), 1, "{alarms:?}");
            assert_eq!(alarms[0].0, 5_000);
            assert_eq!(
                alarms[0].1.message(),
                "m on r: no first token after 5.0 s, loading the model"
            );
            // The snapshot published while waiting carries the wait.
            let mut h = h;
            flush().await;
            let mut waits = Vec::new();
            while let Ok(e) = h.events.try_recv() {
                if let EngineEvent::Speed { speed, .. } = e {
                    waits.push((speed.elapsed_ms, speed.wait.map(|w| w.reason)));
                }
            }
            assert!(
                waits.contains(&(1_000, Some(crate::model::WaitReason::LoadingModel))),
                "{waits:?}"
            );
            drop(actor);
        });
    }

    /// A role-only chunk carrying llama.cpp's `prompt_progress`.
    fn progress_chunk(processed: u64, time_ms: f64) -> String {
        sse(serde_json::json!({
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": null}}],
            "prompt_progress": {"total": 4_000, "cache": 0, "processed": processed, "time_ms": time_ms}
        }))
    }

    #[test]
    fn the_servers_in_band_prompt_progress_wins_over_the_pollers_estimate() {
        use crate::model::{ProgressSource, WaitReason};
        run_paused(async {
            let mut h = Harness::new().await;
            let actor = h.start_call();
            actor.do_send(RequestFieldsSeen(RequestFields::scan(REQUEST)));
            head(&actor);
            h.at(500).await;
            actor.do_send(WaitExplained {
                wait: Some(Wait {
                    progress: Some(0.6),
                    progress_source: Some(ProgressSource::Estimate),
                    ..Wait::new(WaitReason::Prefilling)
                }),
                facts: ServerFacts::default(),
            });
            h.at(2_000).await;
            frame(&actor, progress_chunk(1_000, 2_000.0));
            h.at(2_500).await;
            // The poller's estimate comes again: the server's numbers stay.
            actor.do_send(WaitExplained {
                wait: Some(Wait {
                    progress: Some(0.7),
                    progress_source: Some(ProgressSource::Estimate),
                    ..Wait::new(WaitReason::Prefilling)
                }),
                facts: ServerFacts::default(),
            });
            h.at(8_000).await;
            frame(&actor, progress_chunk(4_000, 8_000.0));
            frame(&actor, content("Hello"));
            flush().await;
            let mut waits = Vec::new();
            while let Ok(e) = h.events.try_recv() {
                if let EngineEvent::Speed { speed, .. } = e {
                    if let Some(w) = speed.wait {
                        waits.push((speed.elapsed_ms, w.progress, w.progress_source, w.eta_ms));
                    }
                }
            }
            let stream = Some(ProgressSource::Stream);
            let estimate = Some(ProgressSource::Estimate);
            // Before any explanation the wait reads `unknown` (no progress,
            // only how long the server has been silent); the first progress
            // is the poller's estimate.
            assert!(waits
                .iter()
                .take_while(|w| w.1.is_none())
                .all(|w| w.0 < 500));
            assert_eq!(
                waits.iter().find(|w| w.1.is_some()),
                Some(&(500, Some(0.6), estimate, None)),
                "{waits:?}"
            );
            assert!(
                waits.contains(&(2_000, Some(0.25), stream, Some(6_000))),
                "{waits:?}"
            );
            assert!(
                waits.iter().all(|w| w.0 < 2_000 || w.2 == stream),
                "no estimate after the server's own progress: {waits:?}"
            );
            assert!(
                waits.contains(&(8_000, Some(1.0), stream, Some(0))),
                "{waits:?}"
            );
            drop(actor);
        });
    }

    #[test]
    fn an_in_band_eta_counts_down_between_the_servers_chunks() {
        use crate::model::ProgressSource;
        run_paused(async {
            let mut h = Harness::new().await;
            let actor = h.start_call();
            actor.do_send(RequestFieldsSeen(RequestFields::scan(REQUEST)));
            head(&actor);
            // 1,000 of 4,000 tokens in 2 s: 6 s left when the chunk came,
            // and no chunk after it for 4 s (a long batch).
            h.at(2_000).await;
            frame(&actor, progress_chunk(1_000, 2_000.0));
            h.at(6_000).await;
            flush().await;
            let mut readings = Vec::new();
            while let Ok(e) = h.events.try_recv() {
                if let EngineEvent::Speed { speed, .. } = e {
                    let Some(w) = speed.wait else { continue };
                    if w.progress_source == Some(ProgressSource::Stream) {
                        readings.push((speed.elapsed_ms, w.eta_ms));
                    }
                }
            }
            assert!(readings.len() >= 3, "{readings:?}");
            assert!(readings.iter().any(|r| r.0 >= 5_000), "{readings:?}");
            for (at, eta) in &readings {
                assert_eq!(*eta, Some(6_000 - (at - 2_000)), "{readings:?}");
            }
            drop(actor);
        });
    }

    #[test]
    fn a_load_within_the_models_usual_load_time_never_alarms_at_the_fixed_threshold() {
        run_paused(async {
            let h = Harness::new().await;
            // Model m usually loads in 7 s; no warm history yet.
            h.normals.write().unwrap().observe(
                "r",
                "m",
                &Observation {
                    ttft_ms: 7_500,
                    prompt_tokens: Some(10),
                    cold: true,
                    load_ms: Some(7_000.0),
                    ..Observation::default()
                },
            );
            let actor = h.start_call();
            actor.do_send(RequestFieldsSeen(RequestFields::scan(REQUEST)));
            h.at(500).await;
            actor.do_send(WaitExplained {
                wait: Some(Wait {
                    usual_ms: Some(7_000),
                    ..Wait::new(crate::model::WaitReason::LoadingModel)
                }),
                facts: ServerFacts {
                    cold: Some(true),
                    ..ServerFacts::default()
                },
            });
            // 5 s (the fixed floor) plus twice the usual load.
            h.at(18_990).await;
            assert!(h.alarms().await.is_empty());
            h.at(19_000).await;
            let alarms = h.alarms().await;
            assert_eq!(alarms.len(), 1, "{alarms:?}");
            assert_eq!(alarms[0].1.threshold_ms, 19_000);
            assert_eq!(
                alarms[0].1.message(),
                "m on r: no first token after 19.0 s, loading the model (usually 7.0 s)"
            );
            drop(actor);
        });
    }

    #[test]
    fn no_alarm_when_the_first_token_came_before_slow_ttft() {
        run_paused(async {
            let h = Harness::new().await;
            let actor = h.start_call();
            actor.do_send(RequestFieldsSeen(RequestFields::scan(REQUEST)));
            h.at(4_000).await;
            head(&actor);
            h.at(4_990).await;
            frame(&actor, content(" hello"));
            h.at(30_000).await;
            assert!(h.alarms().await.is_empty());
        });
    }

    #[test]
    fn a_settled_call_shows_the_slow_limit_it_was_held_to_learned_or_fixed() {
        run_paused(async {
            let mut h = Harness::new().await;
            // No history: the fixed 5 s applies.
            let fixed = h.start_call();
            fixed.do_send(RequestFieldsSeen(RequestFields::scan(REQUEST)));
            h.at(1_000).await;
            fixed.do_send(UpstreamFailed { at: Instant::now() });
            h.at(2_000).await;
            let settled = h.settled().await;
            assert_eq!(settled[0].details.slow_after_ms, Some(5_000));
            assert_eq!(settled[0].details.slow_after_usual_ms, None);
            drop(fixed);
            // Model m usually takes 8 s on r: twice that, learned.
            usually_8_s_to_the_first_token(&h);
            let learned = h.start_call();
            learned.do_send(RequestFieldsSeen(RequestFields::scan(REQUEST)));
            h.at(3_000).await;
            learned.do_send(UpstreamFailed { at: Instant::now() });
            h.at(4_000).await;
            let settled = h.settled().await;
            let last = settled.last().expect("the second call settled");
            assert_eq!(last.details.slow_after_ms, Some(16_000));
            assert_eq!(last.details.slow_after_usual_ms, Some(8_000));
            drop(learned);
        });
    }

    #[test]
    fn no_alarm_for_a_call_that_ended_before_slow_ttft() {
        run_paused(async {
            let mut h = Harness::new().await;
            let actor = h.start_call();
            h.at(2_000).await;
            actor.do_send(UpstreamFailed { at: Instant::now() });
            h.at(30_000).await;
            assert!(h.alarms().await.is_empty());
            let settled = h.settled().await;
            assert_eq!(settled.len(), 1);
            assert_eq!(settled[0].status, CallStatus::UpstreamError);
            assert_eq!(settled[0].http_status, Some(502));
            drop(actor);
        });
    }

    /// One stream whose chunks name `served` as their model, with a
    /// capture gap after its first chunks or not; the settled record.
    async fn stream_naming_its_model(h: &mut Harness, served: &str, gap: bool) -> Call {
        let actor = h.start_call();
        actor.do_send(RequestFieldsSeen(RequestFields::scan(REQUEST)));
        h.at(800).await;
        head(&actor);
        for i in 0..3u64 {
            h.at(1_000 + i * 100).await;
            frame(
                &actor,
                sse(serde_json::json!({
                    "object": "chat.completion.chunk",
                    "model": served,
                    "choices": [{"index": 0, "delta": {"content": format!(" w{i}")}}]
                })),
            );
        }
        if gap {
            actor.do_send(CaptureGap);
        }
        frame(&actor, "data: [DONE]\n\n");
        actor.do_send(BodyEnded {
            end: StreamEnd::Complete,
            at: Instant::now(),
        });
        drop(actor);
        h.at(5_000).await;
        let settled = h.settled().await;
        assert_eq!(settled.len(), 1, "{settled:?}");
        settled[0].clone()
    }

    #[test]
    fn the_model_the_answer_names_is_kept_beside_the_one_requested() {
        run_paused(async {
            let mut h = Harness::new().await;
            let call = stream_naming_its_model(&mut h, "m-q4_K_M", false).await;
            assert_eq!(call.identity.model.as_deref(), Some("m"));
            assert_eq!(call.details.response_model.as_deref(), Some("m-q4_K_M"));
        });
    }

    #[test]
    fn a_captured_answer_with_lost_bytes_names_no_model() {
        run_paused(async {
            let mut h = Harness::new().await;
            let call = stream_naming_its_model(&mut h, "m-q4_K_M", true).await;
            assert!(call.details.capture_gap);
            assert_eq!(call.details.response_model, None);
        });
    }

    #[test]
    fn a_capture_gap_keeps_the_receipt_and_the_ttft_but_shows_no_rate() {
        run_paused(async {
            let mut h = Harness::new().await;
            let actor = h.start_call();
            actor.do_send(RequestFieldsSeen(RequestFields::scan(REQUEST)));
            h.at(800).await;
            head(&actor);
            for i in 0..10u64 {
                h.at(1_000 + i * 100).await;
                frame(&actor, content(&format!(" w{i}")));
            }
            // Bytes went missing in capture, then the receipt arrived.
            actor.do_send(CaptureGap);
            h.at(2_000).await;
            frame(
                &actor,
                sse(serde_json::json!({
                    "object": "chat.completion.chunk",
                    "choices": [],
                    "usage": {"prompt_tokens": 7, "completion_tokens": 12, "total_tokens": 19}
                })) + "data: [DONE]\n\n",
            );
            actor.do_send(BodyEnded {
                end: StreamEnd::Complete,
                at: Instant::now(),
            });
            drop(actor);
            h.at(5_000).await;
            let settled = h.settled().await;
            assert_eq!(settled.len(), 1, "{settled:?}");
            let call = &settled[0];
            assert!(call.details.capture_gap);
            let speed = call.speed.as_ref().expect("a snapshot");
            assert_eq!(speed.output_tokens_per_second, None);
            assert_eq!(speed.output_tokens, 12, "the server's receipt is kept");
            assert_eq!(speed.time_to_first_token_ms, Some(1_000));
            assert_eq!(call.input_tokens, Some(7));
        });
    }

    #[test]
    fn a_discarded_call_leaves_no_record() {
        run_paused(async {
            let mut h = Harness::new().await;
            let actor = h.start_call();
            h.at(100).await;
            actor.do_send(Discard);
            drop(actor);
            h.at(5_000).await;
            assert!(h.settled().await.is_empty());
            let calls = h
                .supervisor
                .send(GetCalls(crate::model::CallsQuery {
                    limit: 10,
                    route: None,
                    unmetered: true,
                }))
                .await
                .expect("supervisor");
            assert!(calls.is_empty(), "{calls:?}");
        });
    }
}
