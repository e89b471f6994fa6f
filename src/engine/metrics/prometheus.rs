//! The Prometheus side of the engine's metrics: the registry behind
//! `GET /metrics`, built from the names, units, buckets and observations of
//! [`super::schema`].

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

use super::schema::{
    bases_of, frame_sinks_record, observations, series_of, Gauges, GenAiHistogram, LabelValue,
    Labels, MetricsSource, ModelLabels, Observation, ObservationSink, OptionalGauge, RouteServer,
    ServerAddr, DECODE_RATE_BUCKETS, DURATION_BUCKETS, HELP_ACTIVE_CALLS, HELP_CALLS,
    HELP_CAPTURE_DROPPED, HELP_DROPPED_SUBSCRIBERS, HELP_HOUR_HIGH, HELP_HOUR_LOW,
    HELP_OUTPUT_TOKENS, HELP_PROXY_LATENCY, MAX_MODELS, OTHER_MODEL, PROXY_LATENCY_BUCKETS,
    SETTLED_STATUSES, TOKEN_BUCKETS, TPOT_BUCKETS, TTFT_BUCKETS,
};
use crate::model::{Call, CallStatus, Stats};

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

impl GenAiHistogram {
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

    /// The suffix an OTel Prometheus exporter writes for the unit: `s` is
    /// `seconds`, `{token}/s` is `per_second` (annotations drop out),
    /// `{token}` none.
    fn prometheus_unit(self) -> Option<Unit> {
        match self.unit() {
            "s" => Some(Unit::Seconds),
            "{token}/s" => Some(Unit::Other("per_second".into())),
            _ => None,
        }
    }
}

type HistogramFamily = Family<Labels, Histogram, fn() -> Histogram>;

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
    frame_sinks_record(d);
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
    subscribers_dropped: Counter,
    capture_dropped: Counter,
    /// Each bound route's server: address and kind.
    routes: RwLock<HashMap<String, RouteServer>>,
    models: Mutex<HashSet<String>>,
    /// Base labels whose every series exists already (see [`series_of`]).
    bases: Mutex<HashSet<Labels>>,
    otel: RwLock<Option<Arc<dyn ObservationSink>>>,
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
        GenAiHistogram::DecodeRate => || Histogram::new(DECODE_RATE_BUCKETS),
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
    /// `speedtap_active_calls` and `speedtap_subscribers_dropped_total`
    /// (and the proxy latency once any process-wide frame was measured).
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
        let subscribers_dropped = Counter::default();
        registry.register(
            "speedtap_subscribers_dropped",
            HELP_DROPPED_SUBSCRIBERS,
            subscribers_dropped.clone(),
        );
        let capture_dropped = Counter::default();
        registry.register(
            "speedtap_capture_dropped_packets",
            HELP_CAPTURE_DROPPED,
            capture_dropped.clone(),
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
            subscribers_dropped,
            capture_dropped,
            routes: RwLock::new(HashMap::new()),
            models: Mutex::new(HashSet::new()),
            bases: Mutex::new(HashSet::new()),
            otel: RwLock::new(None),
        }
    }

    /// Tells the metrics where a route forwards to, so its calls carry
    /// `server_address` / `server_port`, and creates the route's
    /// `speedtap_calls_total` series at zero, one per settled status, so
    /// the first failure after a start is an increase Prometheus sees. The
    /// host calls it when it binds a route; calls of routes it wasn't told
    /// about go without the upstream labels.
    pub fn set_route_upstream(&self, route: &str, address: &str, port: u16) {
        for status in SETTLED_STATUSES {
            drop(self.calls.get_or_create(&CallLabels {
                route: route.to_owned(),
                status,
            }));
        }
        if let Some(otel) = read(&self.otel).as_ref() {
            otel.declare_route(route);
        }
        write(&self.routes)
            .entry(route.to_owned())
            .or_default()
            .addr = Some(ServerAddr {
            address: Arc::from(address),
            port,
        });
    }

    /// Tells the metrics what kind of server a route reaches, as the host
    /// identified it: its calls carry it as `gen_ai_provider_name`. Calls
    /// of a route whose server nobody identified carry
    /// [`UNKNOWN_PROVIDER`](super::schema::UNKNOWN_PROVIDER).
    pub fn set_route_provider(&self, route: &str, provider: &'static str) {
        write(&self.routes)
            .entry(route.to_owned())
            .or_default()
            .provider = provider;
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
        let model = ModelLabels {
            request: call.identity.model.as_deref().map(|m| self.model_label(m)),
            response: (call.details.response_model.as_deref()).map(|m| self.model_label(m)),
        };
        let server = read(&self.routes)
            .get(&call.identity.route)
            .cloned()
            .unwrap_or_default();
        let observations = observations(call, model, server);
        self.create_series_of(&observations);
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

    /// Creates at zero every series a call with these observations' base
    /// labels can feed ([`bases_of`], [`series_of`]), the first time each
    /// base is seen.
    fn create_series_of(&self, observations: &[Observation]) {
        let Some(observed) = observations.iter().find_map(|o| match o {
            Observation::OutputTokens { labels, .. } => Some(labels),
            _ => None,
        }) else {
            return;
        };
        let mut bases = self.bases.lock().unwrap_or_else(|p| p.into_inner());
        let new: Vec<Labels> = bases_of(observed)
            .into_iter()
            .filter(|base| bases.insert(base.clone()))
            .collect();
        for base in &new {
            for (kind, labels) in series_of(base) {
                drop(self.histograms[kind.index()].get_or_create(&labels));
            }
            drop(self.output_tokens.get_or_create(base));
        }
        // Not under `bases`: attaching a sink takes the two the other way.
        drop(bases);
        if let Some(otel) = read(&self.otel).as_ref() {
            for base in &new {
                otel.declare_series(base);
            }
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

    /// Count event subscribers the engine dropped for falling behind
    /// (`speedtap_subscribers_dropped_total`).
    pub fn add_dropped_subscribers(&self, n: u64) {
        self.subscribers_dropped.inc_by(n);
    }

    /// Count packets the capture lost (`speedtap_capture_dropped_packets_total`).
    pub fn add_capture_dropped(&self, n: u64) {
        self.capture_dropped.inc_by(n);
    }

    /// Packets the capture lost since the engine started.
    pub fn capture_dropped(&self) -> u64 {
        self.capture_dropped.get()
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
}

impl MetricsSource for Metrics {
    fn gauges(&self) -> Gauges {
        self.gauges.clone()
    }

    fn attach_sink(&self, sink: Arc<dyn ObservationSink>) -> Result<(), String> {
        let mut slot = write(&self.otel);
        if slot.is_some() {
            return Err("an OTLP exporter is already attached to these metrics".into());
        }
        for route in read(&self.routes).keys() {
            sink.declare_route(route);
        }
        for base in self.bases.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            sink.declare_series(base);
        }
        *slot = Some(sink);
        Ok(())
    }

    fn detach_sink(&self, sink: &Arc<dyn ObservationSink>) {
        let mut slot = write(&self.otel);
        if slot.as_ref().is_some_and(|a| Arc::ptr_eq(a, sink)) {
            *slot = None;
        }
    }
}

/// The `content-type` of [`Metrics::render`]'s output.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::metrics::schema::operation_name;
    use crate::model::{ApiKind, CallIdentity, Phase, Snapshot, TokenSource};

    fn call(status: CallStatus, api: ApiKind, speed: Option<Snapshot>) -> Call {
        Call {
            identity: CallIdentity {
                id: "c-000001".into(),
                route: "ollama".into(),
                api,
                model: Some("qwen3:8b".into()),
                started_at: "2026-11-30T10:42:07.123Z".into(),
                demo: false,
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
            stalled_ms: None,
            phase: Phase::Complete,
            is_final: true,
            elapsed_ms: 5120,
            time_to_first_token_ms: ttft_ms,
            output_tokens: tokens,
            output_tokens_per_second: rate,
            token_source: TokenSource::Server,
            wait: None,
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

    const LABELS: &str = r#"gen_ai_operation_name="chat",gen_ai_provider_name="_OTHER",speedtap_api="openai_chat",gen_ai_request_model="qwen3:8b",route="ollama""#;
    const UPSTREAM_LABELS: &str = r#"gen_ai_operation_name="chat",gen_ai_provider_name="_OTHER",speedtap_api="openai_chat",gen_ai_request_model="qwen3:8b",server_address="127.0.0.1",server_port="11434",route="ollama""#;

    fn types(text: &str) -> Vec<&str> {
        text.lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter(|l| !l.starts_with("speedtap_proxy_added_latency"))
            .collect()
    }

    #[test]
    fn dropped_subscribers_are_a_counter() {
        let m = Metrics::new();
        assert!(m
            .render()
            .contains("speedtap_subscribers_dropped_total 0\n"));
        m.add_dropped_subscribers(2);
        m.add_dropped_subscribers(1);
        let text = m.render();
        assert!(
            text.contains("# TYPE speedtap_subscribers_dropped_total counter"),
            "{text}"
        );
        assert!(
            text.contains("speedtap_subscribers_dropped_total 3\n"),
            "{text}"
        );
    }

    #[test]
    fn empty_metrics_show_only_the_active_gauge_and_the_drop_counters() {
        // Families without a label set yet are left out of the text format;
        // the unlabelled gauge and counter always have their one sample, the
        // optional gauges none until a reading has them. (The proxy latency
        // histogram is process-wide: other tests may have fed it.)
        let text = Metrics::new().render();
        assert_eq!(
            types(&text),
            [
                "speedtap_active_calls gauge",
                "speedtap_subscribers_dropped_total counter",
                "speedtap_capture_dropped_packets_total counter"
            ]
        );
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
                "speedtap_decode_rate_per_second",
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
    fn an_ok_calls_rate_lands_in_speedtaps_own_buckets_and_its_error_series_stay_zero() {
        let m = Metrics::new();
        m.record_settled(&call(
            CallStatus::Ok,
            ApiKind::OpenaiChat,
            Some(final_snapshot(Some(312), 201, Some(40.0))),
        ));
        let text = m.render();
        // An ok call feeds no error_type series; those exist at zero.
        for error_type in ["abandoned", "upstream_error"] {
            assert_eq!(
                sample(
                    &text,
                    &format!(
                        "gen_ai_server_request_duration_seconds_count{{{LABELS},error_type=\"{error_type}\"}}"
                    )
                ),
                0.0
            );
        }
        // 40 tok/s in speedtap's own rate histogram: (36.5, 42.2].
        let rate = format!("speedtap_decode_rate_per_second_bucket{{{LABELS},le=\"");
        assert_eq!(sample(&text, &format!("{rate}36.5\"}}")), 0.0);
        assert_eq!(sample(&text, &format!("{rate}42.2\"}}")), 1.0);
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
    fn a_routes_identified_server_is_the_provider_and_the_api_has_a_label_of_its_own() {
        let m = Metrics::new();
        m.set_route_provider("ollama", "ollama");
        m.record_settled(&call(
            CallStatus::Ok,
            ApiKind::OpenaiChat,
            Some(final_snapshot(Some(312), 201, Some(40.0))),
        ));
        let text = m.render();
        let labels = r#"gen_ai_operation_name="chat",gen_ai_provider_name="ollama",speedtap_api="openai_chat",gen_ai_request_model="qwen3:8b",route="ollama""#;
        assert_eq!(
            sample(
                &text,
                &format!("gen_ai_server_request_duration_seconds_count{{{labels}}}")
            ),
            1.0
        );
        assert!(!text.contains("_OTHER"), "{text}");
    }

    #[test]
    fn the_model_the_answer_named_is_a_label_and_its_absence_is_ready_at_zero() {
        let m = Metrics::new();
        let mut answered = call(
            CallStatus::Ok,
            ApiKind::OpenaiChat,
            Some(final_snapshot(Some(312), 201, Some(40.0))),
        );
        answered.details.response_model = Some("qwen3:8b-q4_K_M".into());
        m.record_settled(&answered);
        let text = m.render();
        let named = LABELS.replace(
            r#"route="ollama""#,
            r#"gen_ai_response_model="qwen3:8b-q4_K_M",route="ollama""#,
        );
        let duration = "gen_ai_server_request_duration_seconds_count";
        assert_eq!(sample(&text, &format!("{duration}{{{named}}}")), 1.0);
        // A call of the same route and model that fails before any answer
        // names no model: its series already exist, at zero.
        let unanswered = format!(r#"{LABELS},error_type="upstream_error""#);
        assert_eq!(sample(&text, &format!("{duration}{{{unanswered}}}")), 0.0);
        let mut failed = call(
            CallStatus::UpstreamError,
            ApiKind::OpenaiChat,
            Some(final_snapshot(None, 0, None)),
        );
        failed.details.response_model = None;
        m.record_settled(&failed);
        assert_eq!(
            sample(&m.render(), &format!("{duration}{{{unanswered}}}")),
            1.0
        );
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
        // The series exist (at zero, created with the call's labels) but
        // took nothing.
        let base = r#"{gen_ai_operation_name="text_completion",gen_ai_provider_name="_OTHER",speedtap_api="ollama_generate",gen_ai_request_model="qwen3:8b",route="ollama"}"#;
        for family in [
            "gen_ai_server_time_to_first_token_seconds",
            "gen_ai_server_time_per_output_token_seconds",
            "speedtap_decode_rate_per_second",
        ] {
            assert_eq!(sample(&text, &format!("{family}_count{base}")), 0.0);
        }
        assert!(text.contains(r#"speedtap_calls_total{route="ollama",status="abandoned"} 1"#));
        let labels = r#"{gen_ai_operation_name="text_completion",gen_ai_provider_name="_OTHER",speedtap_api="ollama_generate",gen_ai_request_model="qwen3:8b",route="ollama",error_type="abandoned"} 1"#;
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
        // Their series exist at zero and took nothing.
        for family in [
            "gen_ai_client_token_usage_count{",
            "gen_ai_client_operation_time_to_first_chunk_seconds_count{",
        ] {
            let lines: Vec<&str> = text.lines().filter(|l| l.starts_with(family)).collect();
            assert!(!lines.is_empty(), "{family}");
            assert!(lines.iter().all(|l| l.ends_with(" 0")), "{lines:?}");
        }
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
            r#"gen_ai_server_request_duration_seconds_count{gen_ai_operation_name="chat",gen_ai_provider_name="_OTHER",speedtap_api="openai_chat",route="ollama"} 1"#
        ));
    }

    #[test]
    fn a_bound_route_has_a_zero_call_counter_for_every_status_from_the_start() {
        let m = Metrics::new();
        m.set_route_upstream("ollama", "127.0.0.1", 11434);
        let text = m.render();
        for status in ["ok", "abandoned", "upstream_error", "unmetered"] {
            assert_eq!(
                sample(
                    &text,
                    &format!("speedtap_calls_total{{route=\"ollama\",status=\"{status}\"}}")
                ),
                0.0
            );
        }
    }

    #[test]
    fn a_models_first_call_creates_every_series_it_can_ever_feed_at_zero() {
        let m = Metrics::new();
        m.record_settled(&call(
            CallStatus::Ok,
            ApiKind::OpenaiChat,
            Some(final_snapshot(Some(312), 201, Some(40.0))),
        ));
        let text = m.render();
        let base = Labels {
            operation: "chat",
            provider: "_OTHER",
            api: "openai_chat",
            request_model: Some("qwen3:8b".into()),
            response_model: None,
            server: None,
            route: "ollama".into(),
            error_type: None,
            token_type: None,
        };
        for (kind, labels) in series_of(&base) {
            let mut rendered = String::new();
            for (name, _, value) in labels.pairs() {
                let value = match value {
                    LabelValue::Str(s) => s.to_owned(),
                    LabelValue::Int(p) => p.to_string(),
                };
                rendered.push_str(&format!("{name}=\"{value}\","));
            }
            let line = format!(
                "{}_count{{{}}}",
                kind.prometheus_name(),
                rendered.trim_end_matches(',')
            );
            assert!(text.contains(&line), "{line}:\n{text}");
        }
        // 3 error types on two durations, 2 token types, 5 other families.
        assert_eq!(series_of(&base).len(), 3 * 2 + 2 + 4);
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
            r#"speedtap_output_tokens_total{{gen_ai_operation_name="text_completion",gen_ai_provider_name="_OTHER",speedtap_api="unknown",gen_ai_request_model="{OTHER_MODEL}",route="ollama"}}"#
        );
        assert_eq!(sample(&text, &other), 5.0);
        assert_eq!(
            sample(
                &text,
                r#"speedtap_output_tokens_total{gen_ai_operation_name="text_completion",gen_ai_provider_name="_OTHER",speedtap_api="unknown",gen_ai_request_model="m0",route="ollama"}"#
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
