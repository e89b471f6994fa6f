//! What the engine's metrics are, for every exporter: the families' names,
//! units, help texts and bucket boundaries, the labels, the observations
//! one settled call makes, and the live gauge values. The Prometheus
//! registry ([`super::prometheus`]) and the OTLP exporter
//! ([`super::otlp`]) are both built from this module and know nothing of
//! each other: an exporter attaches to the metrics through
//! [`MetricsSource`] and receives observations as an [`ObservationSink`].

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;

use crate::model::{ApiKind, Call, CallStatus, Snapshot};

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

/// Buckets of speedtap's own decode-rate histogram (`speedtap.decode.rate`,
/// tokens per second): 1 to 1,000 tok/s, 16 per decade (10^(k/16) to three
/// significant digits). The conventions' time-per-token buckets start at
/// 0.01 s (100 tok/s), so every faster model lands in their first bucket;
/// here each bucket is at most 15.5 % wider than the last, so a quantile
/// read by linear interpolation stays within about 12 % of the rate it
/// estimates, fast models included.
pub const DECODE_RATE_BUCKETS: [f64; 49] = [
    1.0, 1.15, 1.33, 1.54, 1.78, 2.05, 2.37, 2.74, 3.16, 3.65, 4.22, 4.87, 5.62, 6.49, 7.5, 8.66,
    10.0, 11.5, 13.3, 15.4, 17.8, 20.5, 23.7, 27.4, 31.6, 36.5, 42.2, 48.7, 56.2, 64.9, 75.0, 86.6,
    100.0, 115.0, 133.0, 154.0, 178.0, 205.0, 237.0, 274.0, 316.0, 365.0, 422.0, 487.0, 562.0,
    649.0, 750.0, 866.0, 1000.0,
];

/// Every status a settled call can have: `speedtap_calls_total` has one
/// series per route and status from the moment the route is bound.
pub const SETTLED_STATUSES: [&str; 4] = ["ok", "abandoned", "upstream_error", "unmetered"];

/// The `error_type` values of the duration histograms (`None`: an `ok` call).
pub const ERROR_TYPES: [Option<&str>; 3] = [None, Some("abandoned"), Some("upstream_error")];

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
pub const HELP_CALLS: &str = "Settled calls by route and final status";
pub const HELP_OUTPUT_TOKENS: &str =
    "Output tokens (visible, reasoning and tool-call arguments) of settled metered calls";
pub const HELP_ACTIVE_CALLS: &str = "Calls in flight at the last stats publication";
pub const HELP_HOUR_HIGH: &str =
    "Highest global tokens/s reading (at least 1 tok/s) in the last hour";
pub const HELP_HOUR_LOW: &str =
    "Lowest global tokens/s reading (at least 1 tok/s) in the last hour";
/// Help of `speedtap_subscribers_dropped_total`.
pub const HELP_DROPPED_SUBSCRIBERS: &str =
    "Event subscribers dropped for falling behind (the engine never waits for a reader)";
pub const HELP_CAPTURE_DROPPED: &str =
    "Packets the capture lost: dropped by the kernel or the interface, or by speedtap when its packet queue was full";
pub const HELP_PROXY_LATENCY: &str =
    "Per upstream response frame: arrival at the tap to hand-off to the client connection (process-wide)";

/// How many distinct model names get their own series; see the module docs.
pub const MAX_MODELS: usize = 200;

/// The model label value past [`MAX_MODELS`].
pub const OTHER_MODEL: &str = "_other";

/// `gen_ai.provider.name` of a route whose server speedtap has not
/// identified (a configured route: speedtap doesn't probe an upstream it
/// was told about). The conventions' fallback for a value outside the
/// known ones; a guess from the API would claim a server nobody checked.
pub const UNKNOWN_PROVIDER: &str = "_OTHER";

/// The per-call histograms, with everything both exporters need to know
/// about them: the conventions' GenAI histograms and speedtap's own decode
/// rate beside them. One table, so the scrape and OTLP can't drift apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GenAiHistogram {
    ServerTimeToFirstToken,
    ServerTimePerOutputToken,
    ServerRequestDuration,
    ClientOperationDuration,
    ClientTimeToFirstChunk,
    ClientTokenUsage,
    /// speedtap's own: the settled decode rate in tokens per second, with
    /// buckets that hold for fast models ([`DECODE_RATE_BUCKETS`]).
    DecodeRate,
}

impl GenAiHistogram {
    pub const ALL: [GenAiHistogram; 7] = [
        GenAiHistogram::ServerTimeToFirstToken,
        GenAiHistogram::ServerTimePerOutputToken,
        GenAiHistogram::ServerRequestDuration,
        GenAiHistogram::ClientOperationDuration,
        GenAiHistogram::ClientTimeToFirstChunk,
        GenAiHistogram::ClientTokenUsage,
        GenAiHistogram::DecodeRate,
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
            Self::DecodeRate => "speedtap.decode.rate",
        }
    }

    /// The conventions' unit: `s`, `{token}` for token usage, `{token}/s`
    /// for the decode rate.
    pub fn unit(self) -> &'static str {
        match self {
            Self::ClientTokenUsage => "{token}",
            Self::DecodeRate => "{token}/s",
            _ => "s",
        }
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
            Self::DecodeRate => {
                "Settled decode rate in tokens per second after the first token, successful responses"
            }
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
            Self::DecodeRate => &DECODE_RATE_BUCKETS,
        }
    }

    pub fn index(self) -> usize {
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
pub struct Labels {
    pub operation: &'static str,
    /// The server's kind (`ollama`, `llama.cpp`...), or [`UNKNOWN_PROVIDER`].
    pub provider: &'static str,
    /// The API speedtap decoded (`openai_chat`...): `speedtap.api`.
    pub api: &'static str,
    pub request_model: Option<String>,
    /// The model the server's answer named, when it named one.
    pub response_model: Option<String>,
    pub server: Option<ServerAddr>,
    pub route: String,
    pub error_type: Option<&'static str>,
    pub token_type: Option<&'static str>,
}

impl Labels {
    /// The labels as (Prometheus name, OTel key, value) in export order.
    pub fn pairs(&self) -> Vec<(&'static str, &'static str, LabelValue<'_>)> {
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
            ("speedtap_api", "speedtap.api", LabelValue::Str(self.api)),
        ];
        if let Some(model) = &self.request_model {
            out.push((
                "gen_ai_request_model",
                "gen_ai.request.model",
                LabelValue::Str(model),
            ));
        }
        if let Some(model) = &self.response_model {
            out.push((
                "gen_ai_response_model",
                "gen_ai.response.model",
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
pub enum LabelValue<'a> {
    Str(&'a str),
    Int(u16),
}

/// What one settled call records. Computed once, fed to both exports.
#[derive(Clone, Debug, PartialEq)]
pub enum Observation {
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

/// What the metrics know of a route's server: where it is and what it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteServer {
    /// `server.address` / `server.port`, once the host said.
    pub addr: Option<ServerAddr>,
    /// `gen_ai.provider.name`: the server's kind, or [`UNKNOWN_PROVIDER`].
    pub provider: &'static str,
}

impl Default for RouteServer {
    fn default() -> Self {
        RouteServer {
            addr: None,
            provider: UNKNOWN_PROVIDER,
        }
    }
}

/// The model labels of one call, already capped ([`MAX_MODELS`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ModelLabels {
    /// `gen_ai.request.model`: what the request named.
    pub request: Option<String>,
    /// `gen_ai.response.model`: what the answer named.
    pub response: Option<String>,
}

/// What one settled call records, given its model labels and its route's
/// server. Pure; see [`Metrics::record_settled`](super::Metrics::record_settled) for the
/// rules.
pub fn observations(call: &Call, model: ModelLabels, server: RouteServer) -> Vec<Observation> {
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
        provider: server.provider,
        api: id.api.as_str(),
        request_model: model.request,
        response_model: model.response,
        server: server.addr,
        route: id.route.clone(),
        error_type: None,
        token_type: None,
    };
    push_timings(&mut out, call, speed, &base, ok);
    push_token_usage(&mut out, call, speed, &base, ok);
    out.push(Observation::OutputTokens {
        labels: base,
        n: speed.output_tokens,
    });
    out
}

/// The time histograms of a settled call: its duration (labelled with the
/// error, if any), its time to first chunk and, for a call that ended
/// well, its TTFT and time per output token.
fn push_timings(
    out: &mut Vec<Observation>,
    call: &Call,
    speed: &Snapshot,
    base: &Labels,
    ok: bool,
) {
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
            histogram(GenAiHistogram::DecodeRate, base.clone(), rate);
        }
    }
}

/// The base labels a call of this route and model can have: these, and,
/// when the answer named a model, the same without it (a call that failed
/// before any answer names none).
pub fn bases_of(base: &Labels) -> Vec<Labels> {
    let mut out = vec![base.clone()];
    if base.response_model.is_some() {
        out.push(Labels {
            response_model: None,
            ..base.clone()
        });
    }
    out
}

/// Every histogram series a call with these base labels (no error, no
/// token type) can ever feed: each family, each error type on the two
/// duration histograms, each token type on usage. The registry creates
/// them at zero when it first sees the base, so a first failure or a first
/// input count is an increase from 0, not a series that appears already
/// counted (which `rate()` and `increase()` can't see).
pub fn series_of(base: &Labels) -> Vec<(GenAiHistogram, Labels)> {
    let mut out = Vec::new();
    for kind in GenAiHistogram::ALL {
        match kind {
            GenAiHistogram::ServerRequestDuration | GenAiHistogram::ClientOperationDuration => {
                for error_type in ERROR_TYPES {
                    let labels = Labels {
                        error_type,
                        ..base.clone()
                    };
                    out.push((kind, labels));
                }
            }
            GenAiHistogram::ClientTokenUsage => {
                for token_type in ["input", "output"] {
                    let labels = Labels {
                        token_type: Some(token_type),
                        ..base.clone()
                    };
                    out.push((kind, labels));
                }
            }
            _ => out.push((kind, base.clone())),
        }
    }
    out
}

/// The token usage histograms: input when known, output when the call
/// ended well or produced any.
fn push_token_usage(
    out: &mut Vec<Observation>,
    call: &Call,
    speed: &Snapshot,
    base: &Labels,
    ok: bool,
) {
    let usage = |token_type| Labels {
        token_type: Some(token_type),
        ..base.clone()
    };
    if let Some(input) = call.input_tokens {
        out.push(Observation::Histogram {
            kind: GenAiHistogram::ClientTokenUsage,
            labels: usage("input"),
            value: input as f64,
        });
    }
    if ok || speed.output_tokens > 0 {
        out.push(Observation::Histogram {
            kind: GenAiHistogram::ClientTokenUsage,
            labels: usage("output"),
            value: speed.output_tokens as f64,
        });
    }
}

/// An f64 gauge that may have no value: absent values are left out of the
/// scrape (and the OTLP export) instead of being shown as 0.
#[derive(Clone, Debug)]
pub struct OptionalGauge(Arc<AtomicU64>);

impl Default for OptionalGauge {
    fn default() -> Self {
        Self::new()
    }
}

impl OptionalGauge {
    /// A gauge with no value yet.
    pub fn new() -> Self {
        OptionalGauge(Arc::new(AtomicU64::new(f64::NAN.to_bits())))
    }

    /// Sets the value; `None` (or a non-finite one) removes it.
    pub fn set(&self, v: Option<f64>) {
        let v = v.filter(|v| v.is_finite()).unwrap_or(f64::NAN);
        self.0.store(v.to_bits(), Ordering::Relaxed);
    }

    /// The value, when there is one.
    pub fn get(&self) -> Option<f64> {
        let v = f64::from_bits(self.0.load(Ordering::Relaxed));
        (!v.is_nan()).then_some(v)
    }
}

/// The gauges, shared with the OTLP exporter's callbacks.
#[derive(Clone, Debug)]
pub struct Gauges {
    pub active: Gauge,
    pub hour_high: OptionalGauge,
    pub hour_low: OptionalGauge,
}

/// Where a settled call's observations go besides the Prometheus registry
/// (an exporter attaches one to the metrics).
pub trait ObservationSink: Send + Sync {
    /// Records one settled call's observations.
    fn record(&self, observations: &[Observation]);
    /// A route exists: its call counters start at zero for every status,
    /// as in the scrape.
    fn declare_route(&self, route: &str);
    /// A route and model's first call: every series with these base
    /// labels ([`series_of`]) starts at zero, as in the scrape.
    fn declare_series(&self, base: &Labels);
}

/// The engine's metrics as an exporter sees them: the live gauges, and a
/// slot for one [`ObservationSink`].
pub trait MetricsSource: Send + Sync {
    /// The gauges, for an exporter's callbacks.
    fn gauges(&self) -> Gauges;
    /// Attach a sink: every later settled call is recorded into it too.
    /// Fails if one is attached already.
    fn attach_sink(&self, sink: Arc<dyn ObservationSink>) -> Result<(), String>;
    /// Detach this sink (its exporter is shutting down); another attached
    /// since is left alone.
    fn detach_sink(&self, sink: &Arc<dyn ObservationSink>);
}

/// Something that records one frame's proxy latency.
pub type FrameSink = Arc<dyn Fn(Duration) + Send + Sync>;

/// Where per-frame proxy latencies go while exporters are attached: every
/// attached exporter's instrument. The taps are process-wide (see
/// [`super::prometheus::record_proxy_latency`]), so is this. The flag keeps the
/// hot path at one relaxed load when no exporter runs; the lock is only
/// taken when one does.
static FRAME_SINK_ON: AtomicBool = AtomicBool::new(false);
static FRAME_SINKS: RwLock<Vec<(u64, FrameSink)>> = RwLock::new(Vec::new());
static FRAME_SINK_IDS: AtomicU64 = AtomicU64::new(1);

pub fn install_frame_sink(h: FrameSink) -> u64 {
    let id = FRAME_SINK_IDS.fetch_add(1, Ordering::Relaxed);
    let mut sinks = FRAME_SINKS.write().unwrap_or_else(|p| p.into_inner());
    sinks.push((id, h));
    FRAME_SINK_ON.store(true, Ordering::Release);
    id
}

pub fn remove_frame_sink(id: u64) {
    let mut sinks = FRAME_SINKS.write().unwrap_or_else(|p| p.into_inner());
    sinks.retain(|(current, _)| *current != id);
    FRAME_SINK_ON.store(!sinks.is_empty(), Ordering::Release);
}

/// Records one frame's proxy latency into the attached exporters, if any.
pub fn frame_sinks_record(d: Duration) {
    if !FRAME_SINK_ON.load(Ordering::Relaxed) {
        return;
    }
    if let Ok(sinks) = FRAME_SINKS.read() {
        for (_, h) in sinks.iter() {
            h(d);
        }
    }
}
