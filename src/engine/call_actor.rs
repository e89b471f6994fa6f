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
use std::time::Duration;

use actix::prelude::*;
use bytes::Bytes;
use tokio::time::Instant;

use super::messages::*;
use super::model::{Call, CallIdentity, CallStatus, SlowFirstToken};
use super::supervisor::Supervisor;
use crate::decode::detect::{detect_framing, detect_request, BodyFraming};
use crate::decode::ApiKind;
use crate::meter::calibration::CalibrationTable;
use crate::meter::limits::SNAPSHOT_INTERVAL;
use crate::metering::{CallMetering, Outcome, ResponseHead, StreamEnd};
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
}

pub struct CallActor {
    setup: CallSetup,
    metering: CallMetering,
    request_body: Option<Bytes>,
    http_status: Option<u16>,
    /// The head arrived but the body isn't something we understand.
    unmetered: bool,
    /// Set by `UpstreamFailed`: the upstream was unreachable.
    unreachable: bool,
    reported: bool,
}

impl CallActor {
    pub fn new(setup: CallSetup) -> Self {
        let metering = CallMetering::new(setup.dispatched_at, setup.estimator.clone());
        CallActor {
            setup,
            metering,
            request_body: None,
            http_status: None,
            unmetered: false,
            unreachable: false,
            reported: false,
        }
    }

    /// Reads `model` (and the rest) from the captured request body, once.
    fn learn_model(&mut self) {
        if self.setup.identity.model.is_some() {
            return;
        }
        if let Some(body) = &self.request_body {
            let facts = detect_request(&self.setup.method, &self.setup.path, body);
            self.setup.identity.model = facts.model;
        }
    }

    fn publish(&self, speed: crate::meter::Snapshot) {
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
        self.learn_model();
        let report = self.metering.finish(end, now);
        let status = if self.unreachable {
            CallStatus::UpstreamError
        } else if self.unmetered {
            CallStatus::Unmetered
        } else {
            match report.outcome {
                Outcome::Ok => CallStatus::Ok,
                Outcome::Abandoned => CallStatus::Abandoned,
                Outcome::UpstreamError => CallStatus::UpstreamError,
            }
        };
        let call = Call {
            identity: self.setup.identity.clone(),
            status,
            http_status: self.http_status,
            speed: if status == CallStatus::Unmetered {
                None
            } else {
                Some(report.snapshot)
            },
            input_tokens: report.input_tokens,
        };
        self.setup.supervisor.do_send(CallClosed {
            seq: self.setup.seq,
            call,
            calibration_ratio: report.calibration_ratio,
        });
    }
}

impl Actor for CallActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        let first = self.metering.start();
        self.setup.supervisor.do_send(CallOpened {
            seq: self.setup.seq,
            call: Call {
                identity: self.setup.identity.clone(),
                status: CallStatus::InFlight,
                http_status: None,
                speed: Some(first),
                input_tokens: None,
            },
        });
        // Pending text is published even when the stream pauses.
        ctx.run_interval(SNAPSHOT_INTERVAL, |act, _| {
            if let Some(s) = act.metering.tick(Instant::now()) {
                act.publish(s);
            }
        });
        // The slow-first-token alarm fires while the call is still waiting,
        // measured from dispatch (not from the actor's start).
        let deadline = self.setup.dispatched_at + self.setup.slow_ttft;
        let delay = deadline.saturating_duration_since(Instant::now());
        ctx.run_later(delay, |act, _| {
            if act.reported || act.metering.first_output_at().is_some() || act.unmetered {
                return;
            }
            act.learn_model();
            let waited = Instant::now().saturating_duration_since(act.setup.dispatched_at);
            act.setup.notifier.do_send(FirstTokenLate(SlowFirstToken {
                call: act.setup.identity.clone(),
                waited_ms: waited.as_millis() as u64,
                threshold_ms: act.setup.slow_ttft.as_millis() as u64,
            }));
        });
    }

    fn stopping(&mut self, _ctx: &mut Self::Context) -> Running {
        // Every way out reports once: the tap dropped without an end, the
        // engine stopping, or a normal end (then this is a no-op).
        self.report(StreamEnd::ClientGone, Instant::now());
        Running::Stop
    }
}

impl Handler<RequestCaptured> for CallActor {
    type Result = ();
    fn handle(&mut self, msg: RequestCaptured, _: &mut Self::Context) {
        self.request_body = Some(msg.0);
    }
}

impl Handler<ResponseStarted> for CallActor {
    type Result = ();
    fn handle(&mut self, msg: ResponseStarted, _: &mut Self::Context) {
        self.http_status = Some(msg.status);
        let body = self.request_body.as_deref().unwrap_or_default();
        let facts = detect_request(&self.setup.method, &self.setup.path, body);
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
        if success && framing == BodyFraming::Other {
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
        });
    }
}

impl Handler<Frame> for CallActor {
    type Result = ();
    fn handle(&mut self, msg: Frame, _: &mut Self::Context) {
        if let Some(s) = self.metering.on_frame(&msg.bytes, msg.at) {
            self.publish(s);
        }
    }
}

impl Handler<BodyEnded> for CallActor {
    type Result = ();
    fn handle(&mut self, msg: BodyEnded, ctx: &mut Self::Context) {
        self.report(msg.end, msg.at);
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
