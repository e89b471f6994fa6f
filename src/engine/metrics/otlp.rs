//! OTLP metrics export: the same measurements as `GET /metrics`, pushed to
//! an OpenTelemetry collector over HTTP (protobuf), for fleets that have
//! outgrown scraping one machine.
//!
//! [`start_otlp_exporter`] builds an OpenTelemetry SDK meter provider with a
//! periodic reader (its own thread) and the OTLP/HTTP exporter, creates the
//! instruments and attaches them to the engine's [`Metrics`](super::Metrics): from then on
//! every settled call is recorded into both the Prometheus registry and the
//! OTel instruments, from the one list of observations
//! [`Metrics::record_settled`](super::Metrics::record_settled) computes, so the two exports can't disagree
//! on names, units, buckets or attributes. The instruments use the
//! conventions' dotted names (`gen_ai.server.time_to_first_token`, unit `s`,
//! the recommended bucket boundaries) and attributes (`gen_ai.operation.name`,
//! `gen_ai.provider.name`, `gen_ai.request.model`, `gen_ai.response.model`,
//! `server.address`, `server.port`, `error.type`, `gen_ai.token.type`) plus
//! speedtap's `speedtap.api` and `route`.
//!
//! speedtap's own instruments: `speedtap.calls` and `speedtap.output_tokens`
//! (counters), `speedtap.active_calls` and
//! `speedtap.tokens_per_second.hour_high` / `.hour_low` (observable gauges
//! read from the same values the scrape shows) and
//! `speedtap.proxy.added_latency` (histogram, recorded per frame while an
//! exporter is attached).
//!
//! Choices:
//! - Cumulative temporality (the SDK default): what Prometheus-style
//!   backends expect, and a lost export loses nothing but resolution.
//! - Series at zero, as in the scrape: each route's `speedtap.calls` for
//!   every status, and at a route and model's first call every histogram
//!   series the pair can feed. The SDK has no "create at zero" for a
//!   histogram; binding one to a set of attributes (its bound-instrument
//!   feature) makes the series, exported with count 0 until fed.
//! - Histograms without min and max ([`without_min_max`]).
//! - The resource says `service.name = speedtap` (unless `OTEL_SERVICE_NAME`
//!   says otherwise), `service.version`, and `host.name` and
//!   `service.instance.id` (both the machine's name), so a fleet's hosts
//!   stay apart. `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES` add to
//!   them or take precedence.
//! - Only `http://` endpoints: speedtap is built without a TLS stack. Send
//!   to a collector on the host or the private network; let it do TLS.
//! - An unreachable collector is retried at every interval, and stderr says
//!   so once when exports start failing and once when they succeed again
//!   ([`Reachability`]), not at every attempt: a service's log should show
//!   the outage, not fill with it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry::metrics::{
    BoundHistogram, Counter, Histogram, Meter, MeterProvider, ObservableGauge,
};
use opentelemetry::{Key, KeyValue};
use opentelemetry_otlp::{MetricExporter, Protocol, WithExportConfig};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::metrics::data::ResourceMetrics;
use opentelemetry_sdk::metrics::exporter::PushMetricExporter;
use opentelemetry_sdk::metrics::{
    Aggregation, Instrument, InstrumentKind, PeriodicReader, SdkMeterProvider, Stream, Temporality,
};
use opentelemetry_sdk::Resource;

use super::schema::{
    install_frame_sink, remove_frame_sink, series_of, GenAiHistogram, LabelValue, Labels,
    MetricsSource, Observation, ObservationSink, HELP_ACTIVE_CALLS, HELP_CALLS, HELP_HOUR_HIGH,
    HELP_HOUR_LOW, HELP_OUTPUT_TOKENS, HELP_PROXY_LATENCY, PROXY_LATENCY_BUCKETS, SETTLED_STATUSES,
};

/// How long one export may take before it is abandoned.
pub const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// A running OTLP exporter. [`OtlpExporter::shutdown`] flushes; dropping it
/// without that still shuts the SDK down (which also flushes).
pub struct OtlpExporter {
    provider: Option<SdkMeterProvider>,
    metrics: Arc<dyn MetricsSource>,
    instruments: Arc<OtelInstruments>,
    frame_sink_id: u64,
    url: String,
}

impl std::fmt::Debug for OtlpExporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OtlpExporter")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

pub use crate::model::otlp_endpoint::otlp_metrics_url as metrics_url;

/// Starts exporting `metrics` to the OTLP/HTTP collector at `endpoint`
/// (e.g. `http://collector:4318`; metrics go to `/v1/metrics`) every
/// `interval`. Returns an error for a bad endpoint, a zero interval, or if
/// an exporter is already attached to `metrics`. Nothing is sent until the
/// first interval (or [`OtlpExporter::shutdown`]); an unreachable collector
/// is retried at the next interval, never fatal, and said on stderr once
/// per outage ([`Reachability`]).
pub fn start_otlp_exporter<M: MetricsSource + 'static>(
    endpoint: &str,
    interval: Duration,
    metrics: Arc<M>,
) -> Result<OtlpExporter, String> {
    let metrics: Arc<dyn MetricsSource> = metrics;
    let url = metrics_url(endpoint)?;
    if interval.is_zero() {
        return Err("OTLP export interval must be above zero".into());
    }
    let exporter = MetricExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(url.clone())
        .with_timeout(EXPORT_TIMEOUT)
        .build()
        .map_err(|e| format!("cannot build the OTLP exporter for {url}: {e}"))?;
    let exporter = ReportingExporter {
        inner: exporter,
        url: url.clone(),
        reach: Reachability::default(),
    };
    let reader = PeriodicReader::builder(exporter)
        .with_interval(interval)
        .build();
    let provider = SdkMeterProvider::builder()
        .with_reader(reader)
        .with_resource(resource())
        .with_view(without_min_max)
        .build();
    let meter = provider.meter("speedtap");
    let instruments = Arc::new(OtelInstruments::new(&meter, metrics.as_ref()));
    if let Err(e) = metrics.attach_sink(instruments.clone()) {
        let _ = provider.shutdown();
        return Err(e);
    }
    let latency = instruments.proxy_latency.clone();
    let frame_sink_id = install_frame_sink(Arc::new(move |d: Duration| {
        latency.record(d.as_secs_f64(), &[]);
    }));
    Ok(OtlpExporter {
        provider: Some(provider),
        metrics,
        instruments,
        frame_sink_id,
        url,
    })
}

impl OtlpExporter {
    /// Where metrics are POSTed (`.../v1/metrics`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Detaches from the metrics, exports what was recorded one last time
    /// and stops the export thread. Blocks until that export ends (at most
    /// [`EXPORT_TIMEOUT`]); from async code, call it in `spawn_blocking`.
    pub fn shutdown(mut self) -> Result<(), String> {
        self.detach();
        match self.provider.take() {
            Some(provider) => provider
                .shutdown()
                .map_err(|e| format!("OTLP export to {} at shutdown: {e}", self.url)),
            None => Ok(()),
        }
    }

    fn detach(&self) {
        let sink: Arc<dyn ObservationSink> = self.instruments.clone();
        self.metrics.detach_sink(&sink);
        remove_frame_sink(self.frame_sink_id);
    }
}

impl Drop for OtlpExporter {
    fn drop(&mut self) {
        // The provider's own Drop shuts the SDK down; stop feeding it first.
        self.detach();
    }
}

/// Whether the collector took the last export. Only a change is worth a
/// line on stderr: the first failure, and the first success after failures.
#[derive(Debug, Default)]
pub(crate) struct Reachability {
    failing: AtomicBool,
}

impl Reachability {
    /// The line to print for one export's outcome, when it changes the state.
    pub(crate) fn note(&self, url: &str, outcome: Result<(), String>) -> Option<String> {
        match outcome {
            Err(e) => (!self.failing.swap(true, Ordering::Relaxed)).then(|| {
                format!(
                    "speedtap: OTLP collector {url} unreachable ({e}); retrying at every interval, silently until it answers"
                )
            }),
            Ok(()) => self
                .failing
                .swap(false, Ordering::Relaxed)
                .then(|| format!("speedtap: OTLP collector {url} reachable again; exports resumed")),
        }
    }
}

/// The OTLP/HTTP exporter, saying on stderr when the collector stops and
/// starts taking exports ([`Reachability`]).
struct ReportingExporter {
    inner: MetricExporter,
    url: String,
    reach: Reachability,
}

impl std::fmt::Debug for ReportingExporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReportingExporter")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl PushMetricExporter for ReportingExporter {
    async fn export(&self, metrics: &ResourceMetrics) -> OTelSdkResult {
        let result = self.inner.export(metrics).await;
        let outcome = result.as_ref().map(|_| ()).map_err(|e| e.to_string());
        if let Some(line) = self.reach.note(&self.url, outcome) {
            eprintln!("{line}");
        }
        result
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn temporality(&self) -> Temporality {
        self.inner.temporality()
    }
}

/// Every histogram keeps its buckets and drops min and max. Over a
/// cumulative export they would span the engine's whole life, and a series
/// declared at zero ([`ObservationSink::declare_series`]) has none: the SDK
/// would send its empty accumulator's sentinels (±1.8e308) as if measured.
fn without_min_max(instrument: &Instrument) -> Option<Stream> {
    if instrument.kind() != InstrumentKind::Histogram {
        return None;
    }
    let boundaries = GenAiHistogram::ALL
        .into_iter()
        .find(|k| k.otel_name() == instrument.name())
        .map_or(&PROXY_LATENCY_BUCKETS[..], GenAiHistogram::buckets)
        .to_vec();
    Stream::builder()
        .with_aggregation(Aggregation::ExplicitBucketHistogram {
            boundaries,
            record_min_max: false,
        })
        .build()
        .ok()
}

/// `service.name`, `service.version`, `host.name`, `service.instance.id`,
/// each unless the environment (`OTEL_SERVICE_NAME`,
/// `OTEL_RESOURCE_ATTRIBUTES`) already says.
fn resource() -> Resource {
    let detected = Resource::builder().build();
    let has = |key: &'static str| detected.get(&Key::from_static_str(key)).is_some();
    let mut extra = Vec::new();
    let named = detected
        .get(&Key::from_static_str("service.name"))
        .is_some_and(|v| !v.as_str().starts_with("unknown_service"));
    if !named {
        extra.push(KeyValue::new("service.name", "speedtap"));
    }
    if !has("service.version") {
        extra.push(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")));
    }
    if let Some(host) = host_name() {
        // The instance id too: OTel-to-Prometheus translations turn it into
        // the `instance` label that tells a fleet's hosts apart.
        if !has("host.name") {
            extra.push(KeyValue::new("host.name", host.clone()));
        }
        if !has("service.instance.id") {
            extra.push(KeyValue::new("service.instance.id", host));
        }
    }
    Resource::builder().with_attributes(extra).build()
}

/// The machine's name, from the kernel or the environment; `None` when
/// neither says.
fn host_name() -> Option<String> {
    ["/proc/sys/kernel/hostname", "/etc/hostname"]
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .chain(
            ["HOSTNAME", "COMPUTERNAME"]
                .iter()
                .filter_map(|v| std::env::var(v).ok()),
        )
        .map(|s| s.trim().to_owned())
        .find(|s| !s.is_empty())
}

/// The OTel instruments, fed by [`Metrics::record_settled`](super::Metrics::record_settled).
pub(crate) struct OtelInstruments {
    histograms: Vec<Histogram<f64>>,
    /// The series declared at zero, held so the SDK keeps them (bound
    /// handles are the SDK's one way to make a series with no measurement).
    declared: Mutex<Vec<BoundHistogram<f64>>>,
    calls: Counter<u64>,
    output_tokens: Counter<u64>,
    proxy_latency: Histogram<f64>,
    _gauges: (
        ObservableGauge<i64>,
        ObservableGauge<f64>,
        ObservableGauge<f64>,
    ),
}

impl OtelInstruments {
    fn new(meter: &Meter, metrics: &dyn MetricsSource) -> Self {
        let histograms = GenAiHistogram::ALL
            .iter()
            .map(|kind| {
                meter
                    .f64_histogram(kind.otel_name())
                    .with_unit(kind.unit())
                    .with_description(kind.description())
                    .with_boundaries(kind.buckets().to_vec())
                    .build()
            })
            .collect();
        let gauges = metrics.gauges();
        let active = gauges.active.clone();
        let high = gauges.hour_high.clone();
        let low = gauges.hour_low.clone();
        OtelInstruments {
            histograms,
            declared: Mutex::new(Vec::new()),
            calls: meter
                .u64_counter("speedtap.calls")
                .with_unit("{call}")
                .with_description(HELP_CALLS)
                .build(),
            output_tokens: meter
                .u64_counter("speedtap.output_tokens")
                .with_unit("{token}")
                .with_description(HELP_OUTPUT_TOKENS)
                .build(),
            proxy_latency: meter
                .f64_histogram("speedtap.proxy.added_latency")
                .with_unit("s")
                .with_description(HELP_PROXY_LATENCY)
                .with_boundaries(PROXY_LATENCY_BUCKETS.to_vec())
                .build(),
            _gauges: (
                meter
                    .i64_observable_gauge("speedtap.active_calls")
                    .with_unit("{call}")
                    .with_description(HELP_ACTIVE_CALLS)
                    .with_callback(move |o| o.observe(active.get(), &[]))
                    .build(),
                meter
                    .f64_observable_gauge("speedtap.tokens_per_second.hour_high")
                    .with_unit("{token}/s")
                    .with_description(HELP_HOUR_HIGH)
                    .with_callback(move |o| {
                        if let Some(v) = high.get() {
                            o.observe(v, &[]);
                        }
                    })
                    .build(),
                meter
                    .f64_observable_gauge("speedtap.tokens_per_second.hour_low")
                    .with_unit("{token}/s")
                    .with_description(HELP_HOUR_LOW)
                    .with_callback(move |o| {
                        if let Some(v) = low.get() {
                            o.observe(v, &[]);
                        }
                    })
                    .build(),
            ),
        }
    }
}

impl ObservationSink for OtelInstruments {
    fn record(&self, observations: &[Observation]) {
        for o in observations {
            match o {
                Observation::Histogram {
                    kind,
                    labels,
                    value,
                } => self.histograms[kind.index()].record(*value, &attributes(labels)),
                Observation::Calls { route, status } => self.calls.add(
                    1,
                    &[
                        KeyValue::new("route", route.clone()),
                        KeyValue::new("status", *status),
                    ],
                ),
                Observation::OutputTokens { labels, n } => {
                    self.output_tokens.add(*n, &attributes(labels))
                }
            }
        }
    }

    fn declare_route(&self, route: &str) {
        for status in SETTLED_STATUSES {
            self.calls.add(
                0,
                &[
                    KeyValue::new("route", route.to_owned()),
                    KeyValue::new("status", status),
                ],
            );
        }
    }

    fn declare_series(&self, base: &Labels) {
        let bound: Vec<BoundHistogram<f64>> = series_of(base)
            .into_iter()
            .map(|(kind, labels)| self.histograms[kind.index()].bind(&attributes(&labels)))
            .collect();
        self.output_tokens.add(0, &attributes(base));
        self.declared
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(bound);
    }
}

/// The labels as OTel attributes: the conventions' dotted keys, the port
/// as an integer.
fn attributes(labels: &Labels) -> Vec<KeyValue> {
    labels
        .pairs()
        .into_iter()
        .map(|(_, key, value)| match value {
            LabelValue::Str(s) => KeyValue::new(key, s.to_owned()),
            LabelValue::Int(p) => KeyValue::new(key, i64::from(p)),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_get_the_metrics_path_once() {
        assert_eq!(
            metrics_url("http://collector:4318").unwrap(),
            "http://collector:4318/v1/metrics"
        );
        assert_eq!(
            metrics_url(" http://collector:4318/ ").unwrap(),
            "http://collector:4318/v1/metrics"
        );
        assert_eq!(
            metrics_url("http://collector:4318/v1/metrics").unwrap(),
            "http://collector:4318/v1/metrics"
        );
        assert_eq!(
            metrics_url("http://10.0.0.5:4318/otlp").unwrap(),
            "http://10.0.0.5:4318/otlp/v1/metrics"
        );
    }

    #[test]
    fn bad_endpoints_are_refused_with_a_reason() {
        let https = metrics_url("https://collector:4318").unwrap_err();
        assert!(https.contains("https is not supported"), "{https}");
        let bare = metrics_url("collector:4318").unwrap_err();
        assert!(bare.contains("not an http:// URL"), "{bare}");
        assert!(metrics_url("http://").is_err());
        assert!(metrics_url("http://c:4318/?x=1").is_err());
    }

    #[test]
    fn an_unreachable_collector_is_reported_once_and_its_recovery_once() {
        let reach = Reachability::default();
        let url = "http://collector:4318/v1/metrics";
        assert_eq!(reach.note(url, Ok(())), None);
        let down = reach.note(url, Err("connection refused".into())).unwrap();
        assert!(down.contains("unreachable (connection refused)"), "{down}");
        assert!(down.contains(url), "{down}");
        assert_eq!(reach.note(url, Err("connection refused".into())), None);
        assert_eq!(reach.note(url, Err("timed out".into())), None);
        let up = reach.note(url, Ok(())).unwrap();
        assert!(up.contains("reachable again"), "{up}");
        assert_eq!(reach.note(url, Ok(())), None);
        assert!(reach.note(url, Err("refused".into())).is_some());
    }

    #[test]
    fn a_zero_interval_is_refused() {
        let err = start_otlp_exporter(
            "http://127.0.0.1:4318",
            Duration::ZERO,
            Arc::new(crate::engine::metrics::Metrics::new()),
        )
        .unwrap_err();
        assert!(err.contains("interval"), "{err}");
    }

    #[test]
    fn attributes_use_the_conventions_keys_and_an_integer_port() {
        let labels = Labels {
            operation: "chat",
            provider: "ollama",
            api: "openai_chat",
            request_model: Some("m".into()),
            response_model: Some("m-q4".into()),
            server: Some(super::super::schema::ServerAddr {
                address: Arc::from("127.0.0.1"),
                port: 11434,
            }),
            route: "r".into(),
            error_type: Some("abandoned"),
            token_type: None,
        };
        let kv = attributes(&labels);
        let keys: Vec<&str> = kv.iter().map(|k| k.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "gen_ai.operation.name",
                "gen_ai.provider.name",
                "speedtap.api",
                "gen_ai.request.model",
                "gen_ai.response.model",
                "server.address",
                "server.port",
                "route",
                "error.type"
            ]
        );
        assert_eq!(kv[6].value, opentelemetry::Value::I64(11434));
    }
}
