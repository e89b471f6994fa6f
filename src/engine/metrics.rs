//! The engine's metrics: the Prometheus text the control API serves on
//! `GET /metrics`, and the same measurements for the OTLP exporter
//! ([`super::otlp`]) when one is attached.
//!
//! Names follow the OpenTelemetry GenAI semantic conventions
//! (`docs/protocols.md`, "Metric names") the way an OTel
//! Prometheus exporter would write them: dots become underscores and the unit
//! becomes a suffix (`gen_ai.server.time_to_first_token`, unit `s` ->
//! `gen_ai_server_time_to_first_token_seconds`). Annotation units such as
//! `{token}` add no suffix (`gen_ai_client_token_usage`), and counters end in
//! `_total`, as in the OTel exporters. Bucket boundaries are exactly the
//! conventions' recommended ones, so dashboards built for OTel-instrumented
//! servers read ours unchanged. Names, units, help texts and buckets live in
//! one table ([`GenAiHistogram`]) that both the Prometheus registry and the
//! OTLP instruments are built from.
//!
//! | family | kind | recorded |
//! |---|---|---|
//! | `gen_ai_server_time_to_first_token_seconds` | histogram | `ok` calls with a first token |
//! | `gen_ai_server_time_per_output_token_seconds` | histogram | `ok` calls with a settled rate: 1 / rate |
//! | `gen_ai_server_request_duration_seconds` | histogram | every settled metered call: dispatch to end |
//! | `gen_ai_client_operation_duration_seconds` | histogram | the same, as the client saw it |
//! | `gen_ai_client_operation_time_to_first_chunk_seconds` | histogram | calls that got a first output chunk |
//! | `gen_ai_client_token_usage` | histogram | input and output counts, when known |
//! | `speedtap_calls_total` | counter | every settled call, by `route` and `status` |
//! | `speedtap_output_tokens_total` | counter | output tokens of every settled metered call |
//! | `speedtap_active_calls` | gauge | calls in flight, set when the engine publishes stats |
//! | `speedtap_tokens_per_second_hour_high` / `_low` | gauge | the global meter's hourly high / low |
//! | `speedtap_proxy_added_latency_seconds` | histogram | per response frame: tap arrival to hand-off |
//!
//! Labels on the `gen_ai_*` families and the output token counter, in this
//! order: `gen_ai_operation_name` (`chat` for chat-style APIs,
//! `text_completion` otherwise), `gen_ai_provider_name`,
//! `gen_ai_request_model` (when the request named one), `server_address` and
//! `server_port` (the route's upstream, once the host told us with
//! [`Metrics::set_route_upstream`]: the conventions ask that behind a proxy
//! both describe the server behind it), `route` (speedtap's own), then
//! `error_type` on the two duration histograms for failed calls (the call
//! status, `abandoned` or `upstream_error`) and `gen_ai_token_type`
//! (`input` | `output`) on token usage. A label with no value is left out
//! rather than written empty.
//!
//! Choices where the conventions leave room, or where a proxy can't know:
//! - `gen_ai_provider_name`: the conventions have no well-known value for
//!   local servers (Ollama, llama.cpp, vLLM...), and a proxy can't tell which
//!   server sits behind an OpenAI-compatible port anyway, so it carries the
//!   API kind speedtap actually decoded (`openai_chat`, `ollama_generate`...).
//! - `gen_ai_response_model` is not emitted: the call record carries only the
//!   model the request named, and writing the request's name under the
//!   response's key would claim something nobody checked.
//! - speedtap stands between client and server, and both sides' durations
//!   are the same span from where it stands: dispatch upstream to the end of
//!   the response. It records both, so dashboards for either side work.
//! - "time to first chunk" is speedtap's time to first token: the first chunk
//!   that carries output. Role-only and keep-alive chunks come earlier but
//!   say nothing about the model. The conventions want it for streaming calls
//!   only; the call record doesn't say whether a call streamed, so a
//!   non-streamed response (whose first chunk is its whole body) is recorded
//!   too. It is recorded whatever the outcome: the client did get that chunk.
//! - "time per output token" is 1 / settled rate: the settled rate is already
//!   the decode rate after the first token ((n − 1) tokens over the time
//!   from first to last, or the server's own decode timing), which is the
//!   conventions' definition turned upside down.
//! - Model names come from client requests, so a misbehaving client could
//!   mint a new series per request. The first [`MAX_MODELS`] distinct names
//!   are kept; later ones are recorded as [`OTHER_MODEL`].
//!
//! Cost: a settled call costs a few histogram observations (a short lock per
//! family, once per call). The per-frame proxy latency is two relaxed atomic
//! additions into a process-wide histogram ([`record_proxy_latency`]). The
//! struct is `Send + Sync` and lives in an `Arc` shared by the engine (which
//! records), the control API (which renders) and the OTLP exporter. No I/O
//! here.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use prometheus_client::encoding::{
    prometheus_text, EncodeLabel, EncodeLabelSet, EncodeMetric, LabelSetEncoder, MetricEncoder,
    NoLabelSet,
};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

use super::model::{Call, CallStatus};
use super::otlp::OtelInstruments;
use crate::decode::ApiKind;
use crate::meter::global::Stats;

/// OTel recommended buckets for `gen_ai.server.time_to_first_token` (s).
pub const TTFT_BUCKETS: [f64; 16] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
];

/// OTel recommended buckets for `gen_ai.server.time_per_output_token` (s).
pub const TPOT_BUCKETS: [f64; 13] = [
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
];

/// OTel recommended buckets for `gen_ai.server.request.duration`,
/// `gen_ai.client.operation.duration` and
/// `gen_ai.client.operation.time_to_first_chunk` (s).
pub const DURATION_BUCKETS: [f64; 14] = [
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
];

/// OTel recommended buckets for `gen_ai.client.token.usage` ({token}).
pub const TOKEN_BUCKETS: [f64; 14] = [
    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0,
    16777216.0, 67108864.0,
];

/// Buckets of `speedtap_proxy_added_latency_seconds`: 1 µs to 10 ms. The
/// tap's work per frame (a reference-count clone and a queue push) is a few
/// microseconds; anything in the millisecond buckets means the metering
/// threads or the allocator are in trouble.
pub const PROXY_LATENCY_BUCKETS: [f64; 13] = [
    0.000_001,
    0.000_002_5,
    0.000_005,
    0.000_01,
    0.000_025,
    0.000_05,
    0.000_1,
    0.000_25,
    0.000_5,
    0.001,
    0.002_5,
    0.005,
    0.01,
];

/// Help texts shared by the scrape and the OTLP instruments.
pub(crate) const HELP_CALLS: &str = "Settled calls by route and final status";
pub(crate) const HELP_OUTPUT_TOKENS: &str =
    "Output tokens (visible, reasoning and tool-call arguments) of settled metered calls";
pub(crate) const HELP_ACTIVE_CALLS: &str = "Calls in flight at the last stats publication";
pub(crate) const HELP_HOUR_HIGH: &str =
    "Highest global tokens/s reading (at least 1 tok/s) in the last hour";
pub(crate) const HELP_HOUR_LOW: &str =
    "Lowest global tokens/s reading (at least 1 tok/s) in the last hour";
pub(crate) const HELP_PROXY_LATENCY: &str =
    "Per upstream response frame: arrival at the tap to hand-off to the client connection (process-wide)";

/// How many distinct model names get their own series; see the module docs.
pub const MAX_MODELS: usize = 200;

/// The model label value past [`MAX_MODELS`].
pub const OTHER_MODEL: &str = "_other";

/// The GenAI histograms, with everything both exporters need to know about
/// them. One table, so the scrape and OTLP can't drift apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GenAiHistogram {
    ServerTimeToFirstToken,
    ServerTimePerOutputToken,
    ServerRequestDuration,
    ClientOperationDuration,
    ClientTimeToFirstChunk,
    ClientTokenUsage,
}

impl GenAiHistogram {
    pub const ALL: [GenAiHistogram; 6] = [
        GenAiHistogram::ServerTimeToFirstToken,
        GenAiHistogram::ServerTimePerOutputToken,
        GenAiHistogram::ServerRequestDuration,
        GenAiHistogram::ClientOperationDuration,
        GenAiHistogram::ClientTimeToFirstChunk,
        GenAiHistogram::ClientTokenUsage,
    ];

    /// The conventions' instrument name (`gen_ai.server.time_to_first_token`).
    pub fn otel_name(self) -> &'static str {
        match self {
            Self::ServerTimeToFirstToken => "gen_ai.server.time_to_first_token",
            Self::ServerTimePerOutputToken => "gen_ai.server.time_per_output_token",
            Self::ServerRequestDuration => "gen_ai.server.request.duration",
            Self::ClientOperationDuration => "gen_ai.client.operation.duration",
            Self::ClientTimeToFirstChunk => "gen_ai.client.operation.time_to_first_chunk",
            Self::ClientTokenUsage => "gen_ai.client.token.usage",
        }
    }

    /// The conventions' unit: `s`, or `{token}` for token usage.
    pub fn unit(self) -> &'static str {
        match self {
            Self::ClientTokenUsage => "{token}",
            _ => "s",
        }
    }

    /// The Prometheus family name as scraped (`..._seconds`).
    pub fn prometheus_name(self) -> String {
        match self.prometheus_unit() {
            Some(unit) => format!("{}_{}", self.prometheus_base(), unit.as_str()),
            None => self.prometheus_base(),
        }
    }

    fn prometheus_base(self) -> String {
        self.otel_name().replace('.', "_")
    }

    fn prometheus_unit(self) -> Option<Unit> {
        (self.unit() == "s").then_some(Unit::Seconds)
    }

    /// The help text (Prometheus `# HELP`, OTel description).
    pub fn description(self) -> &'static str {
        match self {
            Self::ServerTimeToFirstToken => {
                "Time to generate the first token, successful responses (queueing and prefill included)"
            }
            Self::ServerTimePerOutputToken => {
                "Time per output token after the first, successful responses (1 / settled decode rate)"
            }
            Self::ServerRequestDuration => {
                "Dispatch upstream to the end of the response, every settled metered call"
            }
            Self::ClientOperationDuration => {
                "GenAI operation duration as the client saw it through the proxy, every settled metered call"
            }
            Self::ClientTimeToFirstChunk => {
                "Request to the first response chunk carrying output, every call that got one"
            }
            Self::ClientTokenUsage => "Input and output tokens per call, when known",
        }
    }

    /// The conventions' recommended bucket boundaries.
    pub fn buckets(self) -> &'static [f64] {
        match self {
            Self::ServerTimeToFirstToken => &TTFT_BUCKETS,
            Self::ServerTimePerOutputToken => &TPOT_BUCKETS,
            Self::ServerRequestDuration
            | Self::ClientOperationDuration
            | Self::ClientTimeToFirstChunk => &DURATION_BUCKETS,
            Self::ClientTokenUsage => &TOKEN_BUCKETS,
        }
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// Where a route forwards to: the conventions' `server.address` and
/// `server.port`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ServerAddr {
    pub address: Arc<str>,
    pub port: u16,
}

/// The attributes of one GenAI observation. Absent ones are left out of
/// both exports rather than written empty.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub(crate) struct Labels {
    pub operation: &'static str,
    pub provider: &'static str,
    pub request_model: Option<String>,
    pub server: Option<ServerAddr>,
    pub route: String,
    pub error_type: Option<&'static str>,
    pub token_type: Option<&'static str>,
}

impl Labels {
    /// The labels as (Prometheus name, OTel key, value) in export order.
    pub(crate) fn pairs(&self) -> Vec<(&'static str, &'static str, LabelValue<'_>)> {
        let mut out = vec![
            (
                "gen_ai_operation_name",
                "gen_ai.operation.name",
                LabelValue::Str(self.operation),
            ),
            (
                "gen_ai_provider_name",
                "gen_ai.provider.name",
                LabelValue::Str(self.provider),
            ),
        ];
        if let Some(model) = &self.request_model {
            out.push((
                "gen_ai_request_model",
                "gen_ai.request.model",
                LabelValue::Str(model),
            ));
        }
        if let Some(server) = &self.server {
            out.push((
                "server_address",
                "server.address",
                LabelValue::Str(&server.address),
            ));
            out.push(("server_port", "server.port", LabelValue::Int(server.port)));
        }
        out.push(("route", "route", LabelValue::Str(&self.route)));
        if let Some(e) = self.error_type {
            out.push(("error_type", "error.type", LabelValue::Str(e)));
        }
        if let Some(t) = self.token_type {
            out.push(("gen_ai_token_type", "gen_ai.token.type", LabelValue::Str(t)));
        }
        out
    }
}

/// A label's value: text, or a port (an int attribute in OTel).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LabelValue<'a> {
    Str(&'a str),
    Int(u16),
}

impl EncodeLabelSet for Labels {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        for (name, _, value) in self.pairs() {
            match value {
                LabelValue::Str(s) => EncodeLabel::encode(&(name, s), encoder.encode_label())?,
                LabelValue::Int(p) => EncodeLabel::encode(&(name, p), encoder.encode_label())?,
            }
        }
        Ok(())
    }
}

/// Labels of `speedtap_calls_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct CallLabels {
    route: String,
    status: &'static str,
}

/// What one settled call records. Computed once, fed to both exports.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Observation {
    Histogram {
        kind: GenAiHistogram,
        labels: Labels,
        value: f64,
    },
    Calls {
        route: String,
        status: &'static str,
    },
    OutputTokens {
        labels: Labels,
        n: u64,
    },
}

/// The conventions' `gen_ai.operation.name` for an API kind. Chat-style APIs
/// (messages in, a message out) are `chat`; prompt-in, text-out APIs and
/// anything unknown are `text_completion`.
pub fn operation_name(api: ApiKind) -> &'static str {
    match api {
        ApiKind::OpenaiChat
        | ApiKind::AnthropicMessages
        | ApiKind::OllamaChat
        | ApiKind::OpenaiResponses => "chat",
        ApiKind::OpenaiCompletions
        | ApiKind::OllamaGenerate
        | ApiKind::LlamacppCompletion
        | ApiKind::TgiGenerate
        | ApiKind::Unknown => "text_completion",
    }
}

/// What one settled call records, given its model label (already capped)
/// and its route's upstream. Pure; see [`Metrics::record_settled`] for the
/// rules.
pub(crate) fn observations(
    call: &Call,
    model: Option<String>,
    server: Option<ServerAddr>,
) -> Vec<Observation> {
    let mut out = Vec::new();
    if call.status == CallStatus::InFlight {
        return out;
    }
    let id = &call.identity;
    out.push(Observation::Calls {
        route: id.route.clone(),
        status: call.status.as_str(),
    });
    let Some(speed) = &call.speed else {
        return out;
    };
    let ok = call.status == CallStatus::Ok;
    let base = Labels {
        operation: operation_name(id.api),
        provider: id.api.as_str(),
        request_model: model,
        server,
        route: id.route.clone(),
        error_type: None,
        token_type: None,
    };
    let mut histogram = |kind, labels: Labels, value: f64| {
        out.push(Observation::Histogram {
            kind,
            labels,
            value,
        })
    };

    let elapsed = speed.elapsed_ms as f64 / 1000.0;
    let with_error = Labels {
        error_type: (!ok).then(|| call.status.as_str()),
        ..base.clone()
    };
    histogram(
        GenAiHistogram::ServerRequestDuration,
        with_error.clone(),
        elapsed,
    );
    histogram(GenAiHistogram::ClientOperationDuration, with_error, elapsed);

    if let Some(ttft_ms) = speed.time_to_first_token_ms {
        let ttft = ttft_ms as f64 / 1000.0;
        histogram(GenAiHistogram::ClientTimeToFirstChunk, base.clone(), ttft);
        if ok {
            histogram(GenAiHistogram::ServerTimeToFirstToken, base.clone(), ttft);
        }
    }
    if ok {
        if let Some(rate) = speed.output_tokens_per_second.filter(|r| *r > 0.0) {
            histogram(
                GenAiHistogram::ServerTimePerOutputToken,
                base.clone(),
                1.0 / rate,
            );
        }
    }

    let usage = |token_type| Labels {
        token_type: Some(token_type),
        ..base.clone()
    };
    if let Some(input) = call.input_tokens {
        histogram(
            GenAiHistogram::ClientTokenUsage,
            usage("input"),
            input as f64,
        );
    }
    if ok || speed.output_tokens > 0 {
        histogram(
            GenAiHistogram::ClientTokenUsage,
            usage("output"),
            speed.output_tokens as f64,
        );
    }
    out.push(Observation::OutputTokens {
        labels: base,
        n: speed.output_tokens,
    });
    out
}

type HistogramFamily = Family<Labels, Histogram, fn() -> Histogram>;

/// An f64 gauge that may have no value: absent values are left out of the
/// scrape (and the OTLP export) instead of being shown as 0.
#[derive(Clone, Debug)]
pub(crate) struct OptionalGauge(Arc<AtomicU64>);

impl OptionalGauge {
    fn new() -> Self {
        OptionalGauge(Arc::new(AtomicU64::new(f64::NAN.to_bits())))
    }

    fn set(&self, v: Option<f64>) {
        let v = v.filter(|v| v.is_finite()).unwrap_or(f64::NAN);
        self.0.store(v.to_bits(), Ordering::Relaxed);
    }

    /// The value, when there is one.
    pub(crate) fn get(&self) -> Option<f64> {
        let v = f64::from_bits(self.0.load(Ordering::Relaxed));
        (!v.is_nan()).then_some(v)
    }
}

impl EncodeMetric for OptionalGauge {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_gauge(&self.get().unwrap_or(f64::NAN))
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Gauge
    }

    fn is_empty(&self) -> bool {
        self.get().is_none()
    }
}

/// The gauges, shared with the OTLP exporter's callbacks.
#[derive(Clone, Debug)]
pub(crate) struct Gauges {
    pub active: Gauge,
    pub hour_high: OptionalGauge,
    pub hour_low: OptionalGauge,
}

/// A histogram made of atomics for the per-frame hot path: one relaxed add
/// to the bucket, one to the sum (in nanoseconds). The count is the sum of
/// the buckets, so a scrape never sees a count that disagrees with them.
pub(crate) struct AtomicHistogram {
    /// [`PROXY_LATENCY_BUCKETS`] in nanoseconds.
    bounds_ns: [u64; PROXY_LATENCY_BUCKETS.len()],
    /// One per bound, plus +Inf.
    counts: [AtomicU64; PROXY_LATENCY_BUCKETS.len() + 1],
    sum_ns: AtomicU64,
}

impl AtomicHistogram {
    const fn new() -> Self {
        let mut bounds_ns = [0u64; PROXY_LATENCY_BUCKETS.len()];
        let mut i = 0;
        while i < bounds_ns.len() {
            // Exact for these bounds: each is a whole number of ns.
            bounds_ns[i] = (PROXY_LATENCY_BUCKETS[i] * 1e9 + 0.5) as u64;
            i += 1;
        }
        AtomicHistogram {
            bounds_ns,
            counts: [const { AtomicU64::new(0) }; PROXY_LATENCY_BUCKETS.len() + 1],
            sum_ns: AtomicU64::new(0),
        }
    }

    fn observe(&self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let i = self
            .bounds_ns
            .iter()
            .position(|b| ns <= *b)
            .unwrap_or(self.bounds_ns.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// (sum in seconds, count, per-bucket counts with +Inf last).
    fn read(&self) -> (f64, u64, Vec<(f64, u64)>) {
        let buckets: Vec<(f64, u64)> = PROXY_LATENCY_BUCKETS
            .iter()
            .copied()
            .chain([f64::INFINITY])
            .zip(self.counts.iter().map(|c| c.load(Ordering::Relaxed)))
            .collect();
        let count = buckets.iter().map(|(_, c)| c).sum();
        let sum = self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        (sum, count, buckets)
    }
}

/// The process-wide proxy latency histogram. Process-wide because the taps
/// that feed it are built by the proxy, which has no handle on an engine's
/// [`Metrics`]; a process runs one engine, so this is the engine's.
static PROXY_LATENCY: AtomicHistogram = AtomicHistogram::new();

/// Records the time the proxy spent on one upstream response frame: from
/// the frame's arrival at the tap (the upstream body's poll returning it) to
/// the tap handing it on to hyper (timestamp, copy to the call actor's
/// queue, end check). It is what speedtap adds to each chunk's trip through
/// the proxy on top of hyper's own forwarding. Two relaxed atomic adds;
/// while OTLP exporters are attached it also records into theirs.
pub fn record_proxy_latency(d: Duration) {
    PROXY_LATENCY.observe(d);
    super::otlp::record_frame_latency(d);
}

/// Renders [`PROXY_LATENCY`] into the registry.
#[derive(Debug)]
struct ProxyLatencyMetric;

impl EncodeMetric for ProxyLatencyMetric {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let (sum, count, buckets) = PROXY_LATENCY.read();
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }

    fn is_empty(&self) -> bool {
        PROXY_LATENCY.read().1 == 0
    }
}

impl std::fmt::Debug for AtomicHistogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AtomicHistogram").finish_non_exhaustive()
    }
}

/// The engine's metrics. See the module docs.
pub struct Metrics {
    registry: Registry,
    histograms: Vec<HistogramFamily>,
    calls: Family<CallLabels, Counter>,
    output_tokens: Family<Labels, Counter>,
    gauges: Gauges,
    upstreams: RwLock<HashMap<String, ServerAddr>>,
    models: Mutex<HashSet<String>>,
    otel: RwLock<Option<Arc<OtelInstruments>>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

fn histogram_family(kind: GenAiHistogram) -> HistogramFamily {
    let new: fn() -> Histogram = match kind {
        GenAiHistogram::ServerTimeToFirstToken => || Histogram::new(TTFT_BUCKETS),
        GenAiHistogram::ServerTimePerOutputToken => || Histogram::new(TPOT_BUCKETS),
        GenAiHistogram::ServerRequestDuration
        | GenAiHistogram::ClientOperationDuration
        | GenAiHistogram::ClientTimeToFirstChunk => || Histogram::new(DURATION_BUCKETS),
        GenAiHistogram::ClientTokenUsage => || Histogram::new(TOKEN_BUCKETS),
    };
    Family::new_with_constructor(new)
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|p| p.into_inner())
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|p| p.into_inner())
}

impl Metrics {
    /// Empty metrics with every family registered. A family shows in the
    /// text only once it has a sample (the text format has no way to list
    /// a labelled family without one), so a fresh scrape shows only
    /// `speedtap_active_calls` (and the proxy latency once any process-wide
    /// frame was measured).
    pub fn new() -> Self {
        let histograms: Vec<HistogramFamily> = GenAiHistogram::ALL
            .iter()
            .map(|k| histogram_family(*k))
            .collect();
        let calls = Family::<CallLabels, Counter>::default();
        let output_tokens = Family::<Labels, Counter>::default();
        let gauges = Gauges {
            active: Gauge::default(),
            hour_high: OptionalGauge::new(),
            hour_low: OptionalGauge::new(),
        };

        let mut registry = Registry::default();
        for kind in GenAiHistogram::ALL {
            let family = histograms[kind.index()].clone();
            match kind.prometheus_unit() {
                Some(unit) => registry.register_with_unit(
                    kind.prometheus_base(),
                    kind.description(),
                    unit,
                    family,
                ),
                None => registry.register(kind.prometheus_base(), kind.description(), family),
            }
        }
        registry.register("speedtap_calls", HELP_CALLS, calls.clone());
        registry.register(
            "speedtap_output_tokens",
            HELP_OUTPUT_TOKENS,
            output_tokens.clone(),
        );
        registry.register(
            "speedtap_active_calls",
            HELP_ACTIVE_CALLS,
            gauges.active.clone(),
        );
        registry.register(
            "speedtap_tokens_per_second_hour_high",
            HELP_HOUR_HIGH,
            gauges.hour_high.clone(),
        );
        registry.register(
            "speedtap_tokens_per_second_hour_low",
            HELP_HOUR_LOW,
            gauges.hour_low.clone(),
        );
        registry.register_with_unit(
            "speedtap_proxy_added_latency",
            HELP_PROXY_LATENCY,
            Unit::Seconds,
            ProxyLatencyMetric,
        );

        Metrics {
            registry,
            histograms,
            calls,
            output_tokens,
            gauges,
            upstreams: RwLock::new(HashMap::new()),
            models: Mutex::new(HashSet::new()),
            otel: RwLock::new(None),
        }
    }

    /// Tells the metrics where a route forwards to, so its calls carry
    /// `server_address` / `server_port`. The host calls it when it binds a
    /// route; calls of routes it wasn't told about go without them.
    pub fn set_route_upstream(&self, route: &str, address: &str, port: u16) {
        write(&self.upstreams).insert(
            route.to_owned(),
            ServerAddr {
                address: Arc::from(address),
                port,
            },
        );
    }

    /// Record one settled call. `call.speed` is its final snapshot.
    ///
    /// Choices where the conventions leave room:
    /// - an `in_flight` call is ignored: it has not settled, and recording it
    ///   twice (now and at settlement) would double count;
    /// - every settled call counts in `speedtap_calls_total`, unmetered ones
    ///   included; the other families need a snapshot, so unmetered calls
    ///   (no `speed`) stop there;
    /// - time to first token and time per output token take only `ok` calls
    ///   (the conventions: successful responses); the duration histograms
    ///   take every metered call, failed ones with `error_type`;
    /// - the output count is recorded in the usage histogram for `ok` calls
    ///   and for failed calls that did produce tokens: a failed call's zero
    ///   means "nothing was generated", not a usage of zero tokens, and would
    ///   only drag the distribution down;
    /// - input tokens only when the server reported them.
    pub fn record_settled(&self, call: &Call) {
        if call.status == CallStatus::InFlight {
            return;
        }
        let model = call.identity.model.as_deref().map(|m| self.model_label(m));
        let server = read(&self.upstreams).get(&call.identity.route).cloned();
        let observations = observations(call, model, server);
        for o in &observations {
            match o {
                Observation::Histogram {
                    kind,
                    labels,
                    value,
                } => self.histograms[kind.index()]
                    .get_or_create(labels)
                    .observe(*value),
                Observation::Calls { route, status } => {
                    self.calls
                        .get_or_create(&CallLabels {
                            route: route.clone(),
                            status,
                        })
                        .inc();
                }
                Observation::OutputTokens { labels, n } => {
                    self.output_tokens.get_or_create(labels).inc_by(*n);
                }
            }
        }
        if let Some(otel) = read(&self.otel).as_ref() {
            otel.record(&observations);
        }
    }

    /// The label for a model name: itself, or [`OTHER_MODEL`] once
    /// [`MAX_MODELS`] other names have been seen.
    fn model_label(&self, model: &str) -> String {
        let mut seen = self.models.lock().unwrap_or_else(|p| p.into_inner());
        if seen.contains(model) {
            return model.to_owned();
        }
        if seen.len() < MAX_MODELS {
            seen.insert(model.to_owned());
            return model.to_owned();
        }
        OTHER_MODEL.to_owned()
    }

    /// Set the `speedtap_active_calls` gauge (the engine does it when it
    /// publishes stats).
    pub fn set_active_calls(&self, n: usize) {
        self.gauges.active.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// Take the hourly high and low from a published reading. A reading
    /// without them (no traffic in the last hour) removes the gauges from
    /// the scrape rather than showing 0, which would read as "0 tok/s".
    pub fn set_stats(&self, stats: &Stats) {
        self.gauges.hour_high.set(stats.high);
        self.gauges.hour_low.set(stats.low);
    }

    /// The Prometheus text exposition (format 0.0.4, [`CONTENT_TYPE`]).
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail; an encoder error would be a bug
        // in a label value we control, so degrade to what was written.
        let _ = prometheus_text::encode(&mut out, &self.registry);
        out
    }

    /// The gauges, for the OTLP exporter's callbacks.
    pub(crate) fn gauges(&self) -> Gauges {
        self.gauges.clone()
    }

    /// Attach OTLP instruments: every later settled call is recorded into
    /// them too. Fails if some are attached already.
    pub(crate) fn attach_otel(&self, instruments: Arc<OtelInstruments>) -> Result<(), String> {
        let mut slot = write(&self.otel);
        if slot.is_some() {
            return Err("an OTLP exporter is already attached to these metrics".into());
        }
        *slot = Some(instruments);
        Ok(())
    }

    /// Detach these OTLP instruments (their exporter is shutting down);
    /// others that were attached since are left alone.
    pub(crate) fn detach_otel(&self, instruments: &Arc<OtelInstruments>) {
        let mut slot = write(&self.otel);
        if slot.as_ref().is_some_and(|a| Arc::ptr_eq(a, instruments)) {
            *slot = None;
        }
    }
}

/// The `content-type` of [`Metrics::render`]'s output.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::model::CallIdentity;
    use crate::meter::{Phase, Snapshot, TokenSource};

    fn call(status: CallStatus, api: ApiKind, speed: Option<Snapshot>) -> Call {
        Call {
            identity: CallIdentity {
                id: "c-000001".into(),
                route: "ollama".into(),
                api,
                model: Some("qwen3:8b".into()),
                started_at: "2026-11-30T10:42:07.123Z".into(),
            },
            status,
            http_status: Some(200),
            speed,
            input_tokens: Some(37),
            details: Default::default(),
        }
    }

    fn final_snapshot(ttft_ms: Option<u64>, tokens: u64, rate: Option<f64>) -> Snapshot {
        Snapshot {
            phase: Phase::Complete,
            is_final: true,
            elapsed_ms: 5120,
            time_to_first_token_ms: ttft_ms,
            output_tokens: tokens,
            output_tokens_per_second: rate,
            token_source: TokenSource::Server,
        }
    }

    /// The value of the one sample line starting with `prefix`.
    fn sample(text: &str, prefix: &str) -> f64 {
        let lines: Vec<&str> = text.lines().filter(|l| l.starts_with(prefix)).collect();
        assert_eq!(
            lines.len(),
            1,
            "expected one line starting with {prefix}:\n{text}"
        );
        lines[0].rsplit(' ').next().unwrap().parse().unwrap()
    }

    const LABELS: &str = r#"gen_ai_operation_name="chat",gen_ai_provider_name="openai_chat",gen_ai_request_model="qwen3:8b",route="ollama""#;
    const UPSTREAM_LABELS: &str = r#"gen_ai_operation_name="chat",gen_ai_provider_name="openai_chat",gen_ai_request_model="qwen3:8b",server_address="127.0.0.1",server_port="11434",route="ollama""#;

    fn types(text: &str) -> Vec<&str> {
        text.lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter(|l| !l.starts_with("speedtap_proxy_added_latency"))
            .collect()
    }

    #[test]
    fn empty_metrics_show_only_the_active_gauge() {
        // Families without a label set yet are left out of the text format;
        // the unlabelled gauge always has its one sample, the optional ones
        // none until a reading has them. (The proxy latency histogram is
        // process-wide: other tests may have fed it.)
        let text = Metrics::new().render();
        assert_eq!(types(&text), ["speedtap_active_calls gauge"]);
    }

    #[test]
    fn every_family_appears_once_recorded() {
        let m = Metrics::new();
        m.record_settled(&call(
            CallStatus::Ok,
            ApiKind::OpenaiChat,
            Some(final_snapshot(Some(312), 201, Some(40.0))),
        ));
        m.set_stats(&Stats {
            high: Some(50.0),
            low: Some(10.0),
            ..Stats::default()
        });
        record_proxy_latency(Duration::from_micros(3));
        let text = m.render();
        for kind in GenAiHistogram::ALL {
            let family = format!("{} histogram", kind.prometheus_name());
            assert!(
                text.contains(&format!("# TYPE {family}\n")),
                "{family}:\n{text}"
            );
            assert!(
                text.contains(&format!(
                    // The encoder ends help texts with a full stop.
                    "# HELP {} {}.\n",
                    kind.prometheus_name(),
                    kind.description()
                )),
                "{kind:?}"
            );
        }
        for family in [
            "speedtap_calls_total counter",
            "speedtap_output_tokens_total counter",
            "speedtap_active_calls gauge",
            "speedtap_tokens_per_second_hour_high gauge",
            "speedtap_tokens_per_second_hour_low gauge",
            "speedtap_proxy_added_latency_seconds histogram",
        ] {
            assert!(
                text.contains(&format!("# TYPE {family}\n")),
                "{family}:\n{text}"
            );
        }
    }

    #[test]
    fn prometheus_names_are_the_otel_names_with_unit_suffixes() {
        let names: Vec<String> = GenAiHistogram::ALL
            .iter()
            .map(|k| k.prometheus_name())
            .collect();
        assert_eq!(
            names,
            [
                "gen_ai_server_time_to_first_token_seconds",
                "gen_ai_server_time_per_output_token_seconds",
                "gen_ai_server_request_duration_seconds",
                "gen_ai_client_operation_duration_seconds",
                "gen_ai_client_operation_time_to_first_chunk_seconds",
                "gen_ai_client_token_usage",
            ]
        );
    }

    #[test]
    fn ok_call_fills_every_family_with_otel_buckets() {
        let m = Metrics::new();
        m.record_settled(&call(
            CallStatus::Ok,
            ApiKind::OpenaiChat,
            Some(final_snapshot(Some(312), 201, Some(40.0))),
        ));
        m.set_active_calls(3);
        let text = m.render();

        // Exactly the recommended TTFT boundaries, in order, then +Inf.
        let ttft = format!("gen_ai_server_time_to_first_token_seconds_bucket{{{LABELS},le=\"");
        let les: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix(ttft.as_str()))
            .map(|rest| rest.split('"').next().unwrap())
            .collect();
        assert_eq!(les.last(), Some(&"+Inf"));
        let les: Vec<f64> = les[..les.len() - 1]
            .iter()
            .map(|le| le.parse().unwrap())
            .collect();
        assert_eq!(les, TTFT_BUCKETS.to_vec());
        // 0.312 s falls in (0.25, 0.5].
        assert_eq!(sample(&text, &format!("{ttft}0.25\"}}")), 0.0);
        assert_eq!(sample(&text, &format!("{ttft}0.5\"}}")), 1.0);
        assert_eq!(
            sample(
                &text,
                &format!("gen_ai_server_time_to_first_token_seconds_sum{{{LABELS}}}")
            ),
            0.312
        );
        // The client's first chunk is the same instant.
        assert_eq!(
            sample(
                &text,
                &format!("gen_ai_client_operation_time_to_first_chunk_seconds_sum{{{LABELS}}}")
            ),
            0.312
        );

        // 40 tok/s -> 0.025 s per token, in the le="0.025" bucket.
        let tpot = format!("gen_ai_server_time_per_output_token_seconds_bucket{{{LABELS},le=\"");
        assert_eq!(sample(&text, &format!("{tpot}0.01\"}}")), 0.0);
        assert_eq!(sample(&text, &format!("{tpot}0.025\"}}")), 1.0);

        // An ok call has no error_type label at all.
        for family in [
            "gen_ai_server_request_duration_seconds",
            "gen_ai_client_operation_duration_seconds",
        ] {
            assert_eq!(
                sample(&text, &format!("{family}_sum{{{LABELS}}}")),
                5.12,
                "{family}"
            );
        }
        assert!(!text.contains("error_type"), "{text}");
        assert_eq!(
            sample(
                &text,
                &format!("gen_ai_client_token_usage_sum{{{LABELS},gen_ai_token_type=\"input\"}}")
            ),
            37.0
        );
        assert_eq!(
            sample(
                &text,
                &format!("gen_ai_client_token_usage_sum{{{LABELS},gen_ai_token_type=\"output\"}}")
            ),
            201.0
        );
        assert_eq!(
            sample(&text, r#"speedtap_calls_total{route="ollama",status="ok"}"#),
            1.0
        );
        assert_eq!(
            sample(&text, &format!("speedtap_output_tokens_total{{{LABELS}}}")),
            201.0
        );
        assert_eq!(sample(&text, "speedtap_active_calls "), 3.0);
    }

    #[test]
    fn the_routes_upstream_becomes_server_address_and_port() {
        let m = Metrics::new();
        m.set_route_upstream("ollama", "127.0.0.1", 11434);
        m.set_route_upstream("other", "10.0.0.2", 8080);
        m.record_settled(&call(
            CallStatus::Ok,
            ApiKind::OpenaiChat,
            Some(final_snapshot(Some(312), 201, Some(40.0))),
        ));
        let text = m.render();
        assert_eq!(
            sample(
                &text,
                &format!("gen_ai_server_request_duration_seconds_count{{{UPSTREAM_LABELS}}}")
            ),
            1.0
        );
        assert!(!text.contains("10.0.0.2"));
    }

    #[test]
    fn failed_calls_stay_out_of_ttft_and_tpot_and_carry_error_type() {
        let m = Metrics::new();
        m.record_settled(&call(
            CallStatus::Abandoned,
            ApiKind::OllamaGenerate,
            Some(final_snapshot(Some(100), 5, Some(20.0))),
        ));
        let text = m.render();
        assert!(!text.contains("gen_ai_server_time_to_first_token_seconds_count"));
        assert!(!text.contains("gen_ai_server_time_per_output_token_seconds_count"));
        assert!(text.contains(r#"speedtap_calls_total{route="ollama",status="abandoned"} 1"#));
        let labels = r#"{gen_ai_operation_name="text_completion",gen_ai_provider_name="ollama_generate",gen_ai_request_model="qwen3:8b",route="ollama",error_type="abandoned"} 1"#;
        for family in [
            "gen_ai_server_request_duration_seconds",
            "gen_ai_client_operation_duration_seconds",
        ] {
            assert!(
                text.contains(&format!("{family}_count{labels}")),
                "{family}:\n{text}"
            );
        }
        // The client did get its first chunk.
        assert!(text.contains("gen_ai_client_operation_time_to_first_chunk_seconds_count{"));
        // It did produce tokens: usage counts them.
        assert!(text.contains(r#"gen_ai_token_type="output"} 1"#), "{text}");
    }

    #[test]
    fn failed_call_without_output_records_no_output_usage() {
        let m = Metrics::new();
        let mut c = call(
            CallStatus::UpstreamError,
            ApiKind::OpenaiChat,
            Some(final_snapshot(None, 0, None)),
        );
        c.input_tokens = None;
        m.record_settled(&c);
        let text = m.render();
        assert!(!text.contains("gen_ai_client_token_usage_count"), "{text}");
        assert!(
            !text.contains("time_to_first_chunk_seconds_count"),
            "{text}"
        );
        assert!(text.contains(r#"speedtap_calls_total{route="ollama",status="upstream_error"} 1"#));
        assert!(text.contains(r#"error_type="upstream_error"} 1"#), "{text}");
    }

    #[test]
    fn unmetered_calls_only_count_and_in_flight_is_ignored() {
        let m = Metrics::new();
        m.record_settled(&call(CallStatus::Unmetered, ApiKind::Unknown, None));
        m.record_settled(&call(
            CallStatus::InFlight,
            ApiKind::OpenaiChat,
            Some(final_snapshot(Some(1), 1, None)),
        ));
        let text = m.render();
        assert!(text.contains(r#"speedtap_calls_total{route="ollama",status="unmetered"} 1"#));
        assert!(!text.contains("in_flight"));
        assert!(!text.contains("gen_ai_server_request_duration_seconds_count"));
        assert!(!text.contains("speedtap_output_tokens_total{"));
    }

    #[test]
    fn a_call_without_a_model_has_no_model_label() {
        let m = Metrics::new();
        let mut c = call(
            CallStatus::Ok,
            ApiKind::OpenaiChat,
            Some(final_snapshot(Some(10), 3, None)),
        );
        c.identity.model = None;
        m.record_settled(&c);
        let text = m.render();
        assert!(!text.contains("gen_ai_request_model"), "{text}");
        assert!(text.contains(
            r#"gen_ai_server_request_duration_seconds_count{gen_ai_operation_name="chat",gen_ai_provider_name="openai_chat",route="ollama"} 1"#
        ));
    }

    #[test]
    fn model_names_past_the_cap_fold_into_other() {
        let m = Metrics::new();
        for i in 0..MAX_MODELS + 5 {
            let mut c = call(CallStatus::Unmetered, ApiKind::Unknown, None);
            c.status = CallStatus::Ok;
            c.speed = Some(final_snapshot(None, 1, None));
            c.identity.model = Some(format!("m{i}"));
            m.record_settled(&c);
        }
        // A name seen before the cap keeps its own series.
        let mut again = call(
            CallStatus::Ok,
            ApiKind::Unknown,
            Some(final_snapshot(None, 1, None)),
        );
        again.identity.model = Some("m0".into());
        m.record_settled(&again);
        let text = m.render();
        let other = format!(
            r#"speedtap_output_tokens_total{{gen_ai_operation_name="text_completion",gen_ai_provider_name="unknown",gen_ai_request_model="{OTHER_MODEL}",route="ollama"}}"#
        );
        assert_eq!(sample(&text, &other), 5.0);
        assert_eq!(
            sample(
                &text,
                r#"speedtap_output_tokens_total{gen_ai_operation_name="text_completion",gen_ai_provider_name="unknown",gen_ai_request_model="m0",route="ollama"}"#
            ),
            2.0
        );
    }

    #[test]
    fn hourly_high_and_low_follow_the_published_stats() {
        let m = Metrics::new();
        m.set_stats(&Stats {
            high: Some(61.5),
            low: Some(12.25),
            ..Stats::default()
        });
        let text = m.render();
        assert_eq!(sample(&text, "speedtap_tokens_per_second_hour_high "), 61.5);
        assert_eq!(sample(&text, "speedtap_tokens_per_second_hour_low "), 12.25);
        // An hour without traffic: gone, not zero.
        m.set_stats(&Stats::default());
        let text = m.render();
        assert!(!text.contains("hour_high"), "{text}");
        assert!(!text.contains("hour_low"), "{text}");
    }

    #[test]
    fn the_atomic_histogram_buckets_by_upper_bound() {
        let h = AtomicHistogram::new();
        for us in [1, 2, 3, 10, 20_000] {
            h.observe(Duration::from_micros(us));
        }
        let (sum, count, buckets) = h.read();
        assert_eq!(count, 5);
        assert!((sum - 0.020_016).abs() < 1e-12, "{sum}");
        let counts: Vec<u64> = buckets.iter().map(|(_, c)| *c).collect();
        // 1 µs <= 1 µs; 2 µs <= 2.5 µs; 3 µs <= 5 µs; 10 µs <= 10 µs; 20 ms
        // past the last bound, in +Inf.
        assert_eq!(counts, [1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        assert_eq!(buckets.last().map(|b| b.0), Some(f64::INFINITY));
        assert_eq!(h.bounds_ns[0], 1_000);
        assert_eq!(h.bounds_ns[12], 10_000_000);
    }

    #[test]
    fn operation_names() {
        assert_eq!(operation_name(ApiKind::OpenaiResponses), "chat");
        assert_eq!(operation_name(ApiKind::AnthropicMessages), "chat");
        assert_eq!(
            operation_name(ApiKind::LlamacppCompletion),
            "text_completion"
        );
        assert_eq!(operation_name(ApiKind::TgiGenerate), "text_completion");
    }

    #[test]
    fn metrics_are_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Metrics>();
    }
}
