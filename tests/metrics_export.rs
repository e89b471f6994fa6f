//! The two metric exports, end to end: the Prometheus text a scrape gets,
//! and what the OTLP exporter delivers to a collector.
//!
//! The OTLP half runs a real receiver: a hyper server on 127.0.0.1:0 that
//! accepts `POST /v1/metrics`, decodes the body as an
//! `ExportMetricsServiceRequest` with the collector's own protobuf types
//! (opentelemetry-proto), and hands each request to the test. The exporter
//! is the real one (OTel SDK, OTLP/HTTP protobuf over reqwest), flushed by
//! its shutdown; the test waits on the receiver with a deadline.

use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::{metric, number_data_point, Metric};
use prost::Message;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use speedtap::engine::metrics::otlp::start_otlp_exporter;
use speedtap::engine::metrics::schema::{
    GenAiHistogram, DURATION_BUCKETS, PROXY_LATENCY_BUCKETS, TOKEN_BUCKETS, TPOT_BUCKETS,
    TTFT_BUCKETS,
};
use speedtap::engine::metrics::{record_proxy_latency, Metrics};
use speedtap::model::ApiKind;
use speedtap::model::Stats;
use speedtap::model::{Call, CallDetails, CallIdentity, CallStatus};
use speedtap::model::{Phase, Snapshot, TokenSource};

fn call(
    id: u32,
    status: CallStatus,
    model: &str,
    ttft_ms: Option<u64>,
    elapsed_ms: u64,
    tokens: u64,
    rate: Option<f64>,
) -> Call {
    Call {
        identity: CallIdentity {
            id: format!("c-{id:06}"),
            route: "ollama".into(),
            api: ApiKind::OpenaiChat,
            model: Some(model.into()),
            started_at: "2026-11-30T10:42:07.123Z".into(),
            demo: false,
        },
        status,
        http_status: Some(200),
        speed: Some(Snapshot {
            stalled_ms: None,
            phase: Phase::Complete,
            is_final: true,
            elapsed_ms,
            time_to_first_token_ms: ttft_ms,
            output_tokens: tokens,
            output_tokens_per_second: rate,
            token_source: TokenSource::Provider,
            wait: None,
        }),
        input_tokens: Some(37),
        details: CallDetails {
            // What the server's answer named, for the calls it answered.
            response_model: (status == CallStatus::Ok).then(|| format!("{model}-q4_K_M")),
            ..CallDetails::default()
        },
    }
}

/// Three calls: two `ok` on qwen3:8b (TTFT 0.312 s and 0.9 s) whose answers
/// named `qwen3:8b-q4_K_M`, one abandoned on llama3 after 4 tokens, before
/// its answer named a model.
fn record_traffic(m: &Metrics) {
    m.record_settled(&call(
        1,
        CallStatus::Ok,
        "qwen3:8b",
        Some(312),
        5120,
        201,
        Some(40.0),
    ));
    m.record_settled(&call(
        2,
        CallStatus::Ok,
        "qwen3:8b",
        Some(900),
        2000,
        50,
        Some(20.0),
    ));
    m.record_settled(&call(
        3,
        CallStatus::Abandoned,
        "llama3",
        Some(150),
        700,
        4,
        None,
    ));
}

// ---------------------------------------------------------------- Prometheus

/// The `le` values of one family's bucket lines for one label prefix, as
/// numbers (`+Inf` is infinity). Large bounds are written the way the Go
/// client writes them too (`1.048576e+06`); Prometheus reads them as floats.
fn les(text: &str, family: &str, labels: &str) -> Vec<f64> {
    let prefix = format!("{family}_bucket{{{labels},le=\"");
    text.lines()
        .filter_map(|l| l.strip_prefix(prefix.as_str()))
        .map(|rest| match rest.split('"').next().unwrap_or_default() {
            "+Inf" => f64::INFINITY,
            le => le.parse().expect("a float le"),
        })
        .collect()
}

fn expected_les(bounds: &[f64]) -> Vec<f64> {
    bounds.iter().copied().chain([f64::INFINITY]).collect()
}

/// The value of the one sample line that starts with `prefix` and a space.
fn value(text: &str, prefix: &str) -> f64 {
    let hits: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with(prefix) && l[prefix.len()..].starts_with(' '))
        .collect();
    assert_eq!(hits.len(), 1, "one line for {prefix}:\n{text}");
    hits[0].rsplit(' ').next().unwrap().parse().unwrap()
}

const QWEN: &str = r#"gen_ai_operation_name="chat",gen_ai_provider_name="ollama",speedtap_api="openai_chat",gen_ai_request_model="qwen3:8b",gen_ai_response_model="qwen3:8b-q4_K_M",server_address="127.0.0.1",server_port="11434",route="ollama""#;
const LLAMA: &str = r#"gen_ai_operation_name="chat",gen_ai_provider_name="ollama",speedtap_api="openai_chat",gen_ai_request_model="llama3",server_address="127.0.0.1",server_port="11434",route="ollama""#;

#[test]
fn the_scrape_has_every_family_with_the_otel_buckets_and_labels() {
    let m = Metrics::new();
    m.set_route_upstream("ollama", "127.0.0.1", 11434);
    m.set_route_provider("ollama", "ollama");
    record_traffic(&m);
    m.set_active_calls(2);
    m.set_stats(&Stats {
        high: Some(48.5),
        low: Some(3.5),
        ..Stats::default()
    });
    record_proxy_latency(Duration::from_micros(4));
    let text = m.render();

    let types: HashMap<&str, &str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .collect();
    for (family, kind) in [
        ("gen_ai_server_time_to_first_token_seconds", "histogram"),
        ("gen_ai_server_time_per_output_token_seconds", "histogram"),
        ("gen_ai_server_request_duration_seconds", "histogram"),
        ("gen_ai_client_operation_duration_seconds", "histogram"),
        (
            "gen_ai_client_operation_time_to_first_chunk_seconds",
            "histogram",
        ),
        ("gen_ai_client_token_usage", "histogram"),
        ("speedtap_calls_total", "counter"),
        ("speedtap_output_tokens_total", "counter"),
        ("speedtap_active_calls", "gauge"),
        ("speedtap_tokens_per_second_hour_high", "gauge"),
        ("speedtap_tokens_per_second_hour_low", "gauge"),
        ("speedtap_proxy_added_latency_seconds", "histogram"),
    ] {
        assert_eq!(types.get(family), Some(&kind), "{family}:\n{text}");
        assert!(
            text.contains(&format!("# HELP {family} ")),
            "{family} has help"
        );
    }

    // Exactly the conventions' buckets, in order, then +Inf.
    for (family, bounds) in [
        (
            "gen_ai_server_time_to_first_token_seconds",
            &TTFT_BUCKETS[..],
        ),
        (
            "gen_ai_server_time_per_output_token_seconds",
            &TPOT_BUCKETS[..],
        ),
        (
            "gen_ai_server_request_duration_seconds",
            &DURATION_BUCKETS[..],
        ),
        (
            "gen_ai_client_operation_duration_seconds",
            &DURATION_BUCKETS[..],
        ),
        (
            "gen_ai_client_operation_time_to_first_chunk_seconds",
            &DURATION_BUCKETS[..],
        ),
    ] {
        assert_eq!(les(&text, family, QWEN), expected_les(bounds), "{family}");
    }
    assert_eq!(
        les(
            &text,
            "gen_ai_client_token_usage",
            &format!(r#"{QWEN},gen_ai_token_type="output""#)
        ),
        expected_les(&TOKEN_BUCKETS)
    );
    let proxy_les: Vec<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("speedtap_proxy_added_latency_seconds_bucket{le=\""))
        .map(|rest| rest.split('"').next().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(proxy_les.len(), PROXY_LATENCY_BUCKETS.len() + 1);

    // Counts and sums: two ok qwen calls; the abandoned one only where
    // failures belong, with error_type.
    let ttft = "gen_ai_server_time_to_first_token_seconds";
    assert_eq!(value(&text, &format!("{ttft}_count{{{QWEN}}}")), 2.0);
    assert!((value(&text, &format!("{ttft}_sum{{{QWEN}}}")) - 1.212).abs() < 1e-9);
    assert_eq!(
        value(&text, &format!("{ttft}_bucket{{{QWEN},le=\"0.5\"}}")),
        1.0
    );
    assert_eq!(
        value(&text, &format!("{ttft}_bucket{{{QWEN},le=\"1\"}}")),
        2.0
    );
    // Created at zero with llama3's first call, fed nothing by its failure.
    assert_eq!(value(&text, &format!("{ttft}_count{{{LLAMA}}}")), 0.0);
    for family in [
        "gen_ai_server_request_duration_seconds",
        "gen_ai_client_operation_duration_seconds",
    ] {
        assert_eq!(value(&text, &format!("{family}_count{{{QWEN}}}")), 2.0);
        assert_eq!(
            value(
                &text,
                &format!("{family}_count{{{LLAMA},error_type=\"abandoned\"}}")
            ),
            1.0
        );
    }
    assert_eq!(
        value(
            &text,
            &format!("gen_ai_client_operation_time_to_first_chunk_seconds_count{{{LLAMA}}}")
        ),
        1.0
    );
    assert_eq!(
        value(
            &text,
            &format!("gen_ai_client_token_usage_sum{{{QWEN},gen_ai_token_type=\"input\"}}")
        ),
        74.0
    );
    assert_eq!(
        value(&text, r#"speedtap_calls_total{route="ollama",status="ok"}"#),
        2.0
    );
    assert_eq!(
        value(
            &text,
            r#"speedtap_calls_total{route="ollama",status="abandoned"}"#
        ),
        1.0
    );
    assert_eq!(
        value(&text, &format!("speedtap_output_tokens_total{{{QWEN}}}")),
        251.0
    );
    assert_eq!(value(&text, "speedtap_active_calls"), 2.0);
    assert_eq!(value(&text, "speedtap_tokens_per_second_hour_high"), 48.5);
    assert_eq!(value(&text, "speedtap_tokens_per_second_hour_low"), 3.5);
}

// ---------------------------------------------------------------------- OTLP

/// One request as the receiver got it.
struct Received {
    path: String,
    content_type: String,
    body: Bytes,
}

/// A minimal OTLP/HTTP collector: every request goes to the channel and is
/// answered 200 with an empty (valid) `ExportMetricsServiceResponse`.
async fn start_receiver() -> (SocketAddr, mpsc::UnboundedReceiver<Received>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(serve_receiver(listener, tx));
    (addr, rx)
}

/// [`start_receiver`]'s collector on a listener already bound.
async fn serve_receiver(listener: TcpListener, tx: mpsc::UnboundedSender<Received>) {
    {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let tx = tx.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req: Request<Incoming>| {
                    let tx = tx.clone();
                    async move {
                        let path = req.uri().path().to_owned();
                        let content_type = req
                            .headers()
                            .get(http::header::CONTENT_TYPE)
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or_default()
                            .to_owned();
                        let body = req
                            .into_body()
                            .collect()
                            .await
                            .map(|b| b.to_bytes())
                            .unwrap_or_default();
                        let _ = tx.send(Received {
                            path,
                            content_type,
                            body,
                        });
                        Ok::<_, Infallible>(
                            Response::builder()
                                .header("content-type", "application/x-protobuf")
                                .body(Full::new(Bytes::new()))
                                .expect("response"),
                        )
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    }
}

fn attrs(kvs: &[KeyValue]) -> HashMap<String, String> {
    kvs.iter()
        .map(|kv| {
            let v = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(any_value::Value::StringValue(s)) => s.clone(),
                Some(any_value::Value::IntValue(i)) => format!("int:{i}"),
                other => format!("{other:?}"),
            };
            (kv.key.clone(), v)
        })
        .collect()
}

/// The attributes the conventions define for the GenAI metrics, with
/// speedtap's `speedtap.api` and `route`: the provider is the server's kind
/// (as the host identified it), the API speedtap decoded has its own key.
fn expected_attrs(model: &str, extra: &[(&str, &str)]) -> HashMap<String, String> {
    [
        ("gen_ai.operation.name", "chat"),
        ("gen_ai.provider.name", "ollama"),
        ("speedtap.api", "openai_chat"),
        ("gen_ai.request.model", model),
        ("server.address", "127.0.0.1"),
        ("server.port", "int:11434"),
        ("route", "ollama"),
    ]
    .iter()
    .chain(extra)
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// [`expected_attrs`] of a call whose answer named `response_model`
/// (`gen_ai.response.model`, recommended by the conventions).
fn answered_attrs(
    model: &str,
    response_model: &str,
    extra: &[(&str, &str)],
) -> HashMap<String, String> {
    let mut attrs = expected_attrs(model, extra);
    attrs.insert("gen_ai.response.model".into(), response_model.into());
    attrs
}

/// The histogram points of `metric`: (attributes, count, sum, bounds).
type Point = (HashMap<String, String>, u64, f64, Vec<f64>);

fn histogram_points(metric: &Metric) -> Vec<Point> {
    match &metric.data {
        Some(metric::Data::Histogram(h)) => {
            // Cumulative, as Prometheus-style backends expect.
            assert_eq!(h.aggregation_temporality, 2, "{}", metric.name);
            h.data_points
                .iter()
                .map(|p| {
                    // Over a whole life (cumulative), and absent from a
                    // point declared at zero: never sent.
                    assert_eq!((p.min, p.max), (None, None), "{}", metric.name);
                    (
                        attrs(&p.attributes),
                        p.count,
                        p.sum.unwrap_or(f64::NAN),
                        p.explicit_bounds.clone(),
                    )
                })
                .collect()
        }
        other => panic!("{} is not a histogram: {other:?}", metric.name),
    }
}

fn number(p: &opentelemetry_proto::tonic::metrics::v1::NumberDataPoint) -> f64 {
    match p.value {
        Some(number_data_point::Value::AsInt(i)) => i as f64,
        Some(number_data_point::Value::AsDouble(d)) => d,
        None => f64::NAN,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_otlp_exporter_delivers_the_genai_metrics_to_a_collector() {
    let (addr, mut rx) = start_receiver().await;
    let metrics = Arc::new(Metrics::new());
    metrics.set_route_upstream("ollama", "127.0.0.1", 11434);
    metrics.set_route_provider("ollama", "ollama");
    let exporter = start_otlp_exporter(
        &format!("http://{addr}"),
        Duration::from_millis(200),
        metrics.clone(),
    )
    .expect("exporter starts");
    assert_eq!(exporter.url(), format!("http://{addr}/v1/metrics"));
    // A second exporter on the same metrics is refused.
    let second = start_otlp_exporter(
        &format!("http://{addr}"),
        Duration::from_secs(60),
        metrics.clone(),
    );
    assert!(second.is_err());

    record_traffic(&metrics);
    metrics.set_active_calls(2);
    metrics.set_stats(&Stats {
        high: Some(48.5),
        low: Some(3.5),
        ..Stats::default()
    });
    record_proxy_latency(Duration::from_micros(4));

    // Shutdown exports once more and blocks until it is delivered.
    tokio::task::spawn_blocking(move || exporter.shutdown())
        .await
        .expect("shutdown thread")
        .expect("final export delivered");

    // The first request within a deadline, then whatever else arrived.
    let first = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("the collector got a request in time")
        .expect("receiver running");
    let mut requests = vec![first];
    while let Ok(r) = rx.try_recv() {
        requests.push(r);
    }
    for r in &requests {
        assert_eq!(r.path, "/v1/metrics");
        assert_eq!(r.content_type, "application/x-protobuf");
    }
    // Cumulative temporality: the last export holds everything.
    let last = requests.last().expect("a request");
    let req = ExportMetricsServiceRequest::decode(last.body.clone()).expect("valid protobuf");
    assert_eq!(req.resource_metrics.len(), 1);
    let rm = &req.resource_metrics[0];
    let resource = attrs(&rm.resource.as_ref().expect("resource").attributes);
    if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
        assert_eq!(
            resource.get("service.name").map(String::as_str),
            Some("speedtap")
        );
    }
    assert!(resource.contains_key("service.version"));
    // The host's name doubles as the instance id, which keeps a fleet's
    // hosts apart after translation to Prometheus labels.
    if let Some(host) = resource.get("host.name") {
        assert_eq!(resource.get("service.instance.id"), Some(host));
    }
    let by_name: HashMap<&str, &Metric> = rm
        .scope_metrics
        .iter()
        .flat_map(|s| &s.metrics)
        .map(|m| (m.name.as_str(), m))
        .collect();

    // Every GenAI histogram, with the conventions' name, unit and buckets.
    for kind in GenAiHistogram::ALL {
        let m = by_name
            .get(kind.otel_name())
            .unwrap_or_else(|| panic!("{} exported: {:?}", kind.otel_name(), by_name.keys()));
        assert_eq!(m.unit, kind.unit(), "{}", m.name);
        assert_eq!(m.description, kind.description());
        for (_, _, _, bounds) in histogram_points(m) {
            assert_eq!(bounds, kind.buckets(), "{}", m.name);
        }
    }
    assert_eq!(GenAiHistogram::ServerTimeToFirstToken.unit(), "s");
    assert_eq!(GenAiHistogram::ClientTokenUsage.unit(), "{token}");

    let find = |name: &str, want: &HashMap<String, String>| -> (u64, f64) {
        let points = histogram_points(by_name[name]);
        let hits: Vec<&Point> = points.iter().filter(|p| &p.0 == want).collect();
        assert_eq!(hits.len(), 1, "{name} {want:?} in {points:?}");
        (hits[0].1, hits[0].2)
    };
    let qwen = answered_attrs("qwen3:8b", "qwen3:8b-q4_K_M", &[]);
    let (count, sum) = find("gen_ai.server.time_to_first_token", &qwen);
    assert_eq!(count, 2);
    assert!((sum - 1.212).abs() < 1e-9, "{sum}");
    // Failed calls: only in the duration metrics, with error.type. The
    // failed model's TTFT series exists all the same, at zero, and so does
    // the answered model's without a response model.
    assert_eq!(
        histogram_points(by_name["gen_ai.server.time_to_first_token"]).len(),
        3
    );
    assert_eq!(
        find(
            "gen_ai.server.time_to_first_token",
            &expected_attrs("llama3", &[])
        ),
        (0, 0.0)
    );
    let abandoned = expected_attrs("llama3", &[("error.type", "abandoned")]);
    assert_eq!(find("gen_ai.server.request.duration", &abandoned), (1, 0.7));
    assert_eq!(
        find("gen_ai.client.operation.duration", &abandoned),
        (1, 0.7)
    );
    assert_eq!(find("gen_ai.client.operation.duration", &qwen).0, 2);
    let (count, sum) = find("gen_ai.server.time_per_output_token", &qwen);
    assert_eq!(count, 2);
    assert!((sum - 0.075).abs() < 1e-9, "{sum}");
    assert_eq!(
        find(
            "gen_ai.client.token.usage",
            &answered_attrs(
                "qwen3:8b",
                "qwen3:8b-q4_K_M",
                &[("gen_ai.token.type", "input")]
            )
        ),
        (2, 74.0)
    );
    assert_eq!(
        find(
            "gen_ai.client.token.usage",
            &answered_attrs(
                "qwen3:8b",
                "qwen3:8b-q4_K_M",
                &[("gen_ai.token.type", "output")]
            )
        ),
        (2, 251.0)
    );

    // Every series a route and model can feed exists from its first call,
    // at zero until fed, as in the scrape: here each error type of a model
    // that only ever succeeded, with the model its answers named and
    // without (a failure before any answer names none), each token type of
    // one that only failed.
    for (kind, name) in [
        (GenAiHistogram::ServerRequestDuration, "upstream_error"),
        (GenAiHistogram::ClientOperationDuration, "abandoned"),
    ] {
        let error = [("error.type", name)];
        let unanswered = expected_attrs("qwen3:8b", &error);
        assert_eq!(find(kind.otel_name(), &unanswered), (0, 0.0), "{name}");
        let answered = answered_attrs("qwen3:8b", "qwen3:8b-q4_K_M", &error);
        assert_eq!(find(kind.otel_name(), &answered), (0, 0.0), "{name}");
    }
    for kind in GenAiHistogram::ALL {
        let points = histogram_points(by_name[kind.otel_name()]);
        let llama = points
            .iter()
            .filter(|p| p.0["gen_ai.request.model"] == "llama3")
            .count();
        assert!(
            llama >= 1,
            "{} has llama3's series: {points:?}",
            kind.otel_name()
        );
    }
    assert_eq!(
        find(
            "gen_ai.client.token.usage",
            &expected_attrs("llama3", &[("gen_ai.token.type", "input")])
        ),
        (1, 37.0)
    );

    // speedtap's own.
    let calls = match &by_name["speedtap.calls"].data {
        Some(metric::Data::Sum(s)) => {
            assert!(s.is_monotonic);
            s.data_points
                .iter()
                .map(|p| (attrs(&p.attributes)["status"].clone(), number(p)))
                .collect::<HashMap<_, _>>()
        }
        other => panic!("speedtap.calls: {other:?}"),
    };
    assert_eq!(calls.get("ok"), Some(&2.0));
    assert_eq!(calls.get("abandoned"), Some(&1.0));
    // The route's other statuses are there at zero, as in the scrape.
    assert_eq!(calls.get("upstream_error"), Some(&0.0));
    assert_eq!(calls.get("unmetered"), Some(&0.0));
    let gauge = |name: &str| match &by_name[name].data {
        Some(metric::Data::Gauge(g)) => {
            assert_eq!(g.data_points.len(), 1, "{name}");
            number(&g.data_points[0])
        }
        other => panic!("{name}: {other:?}"),
    };
    assert_eq!(gauge("speedtap.active_calls"), 2.0);
    assert_eq!(gauge("speedtap.tokens_per_second.hour_high"), 48.5);
    assert_eq!(gauge("speedtap.tokens_per_second.hour_low"), 3.5);
    let proxy = histogram_points(by_name["speedtap.proxy.added_latency"]);
    assert_eq!(by_name["speedtap.proxy.added_latency"].unit, "s");
    assert_eq!(proxy.len(), 1);
    assert!(proxy[0].1 >= 1);
    assert_eq!(proxy[0].3, PROXY_LATENCY_BUCKETS);

    // Detached at shutdown: recording again is fine and goes nowhere.
    record_traffic(&metrics);
}

/// `speedtap run` pushing to a collector that is down says so once on
/// stderr, however many exports fail, and once when the collector answers
/// again. The collector's port is held from the start: while "down" it
/// closes every connection unanswered (each one a failed export, counted),
/// then it serves. The push interval comes from the OTel SDKs' own
/// variable, so the test takes a second, not a minute.
#[test]
fn speedtap_run_says_once_that_the_collector_is_unreachable_and_once_that_it_is_back() {
    use crate::util::process::{scratch, start_run_with, STARTUP};
    use speedtap::host::settings::OTLP_INTERVAL_ENV;

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let listener = rt.block_on(TcpListener::bind("127.0.0.1:0")).expect("bind");
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let (closed_tx, closed) = std::sync::mpsc::channel();
    let (up_tx, mut up_rx) = tokio::sync::oneshot::channel::<()>();
    let (got_tx, mut got) = mpsc::unbounded_channel();
    rt.spawn(async move {
        loop {
            tokio::select! {
                accepted = listener.accept() => {
                    if let Ok((stream, _)) = accepted {
                        drop(stream);
                        let _ = closed_tx.send(());
                    }
                }
                _ = &mut up_rx => break,
            }
        }
        serve_receiver(listener, got_tx).await;
    });

    let dir = scratch("metrics_export", "otlp_outage");
    let run = start_run_with(
        &dir,
        "127.0.0.1:9".parse().unwrap(),
        &["--no-db", "--otlp-endpoint", &endpoint],
        &[(OTLP_INTERVAL_ENV, "100")],
    );
    let stderr = &run.proc.stderr;
    let unreachable =
        |l: &str| l.starts_with("speedtap: OTLP collector") && l.contains(" unreachable (");
    let back = |l: &str| l.starts_with("speedtap: OTLP collector") && l.contains("reachable again");
    let count =
        |pred: &dyn Fn(&str) -> bool| stderr.lines_so_far().iter().filter(|l| pred(l)).count();

    let line = stderr.wait_for("the collector said unreachable", STARTUP, unreachable);
    assert!(line.contains(&endpoint), "{line}");
    // More exports fail after the line: none of them says it again.
    while closed.try_recv().is_ok() {}
    for _ in 0..4 {
        closed
            .recv_timeout(STARTUP)
            .expect("the exports go on failing");
    }
    assert_eq!(count(&unreachable), 1, "{}", stderr.text());
    assert_eq!(count(&back), 0, "{}", stderr.text());

    up_tx.send(()).unwrap();
    let line = stderr.wait_for("the collector said reachable again", STARTUP, back);
    assert!(line.contains(&endpoint), "{line}");
    // More exports get through after it: none of them says it again.
    for _ in 0..3 {
        let request = rt
            .block_on(async { tokio::time::timeout(STARTUP, got.recv()).await })
            .expect("exports in time")
            .expect("receiver running");
        assert_eq!(request.path, "/v1/metrics");
    }
    assert_eq!(count(&unreachable), 1, "{}", stderr.text());
    assert_eq!(count(&back), 1, "{}", stderr.text());
}

#[test]
fn a_bad_endpoint_is_refused_before_anything_starts() {
    let metrics = Arc::new(Metrics::new());
    let err =
        start_otlp_exporter("collector:4318", Duration::from_secs(1), metrics.clone()).unwrap_err();
    assert!(err.contains("http://"), "{err}");
    // Nothing was attached: a good endpoint still works afterwards.
    let exporter = start_otlp_exporter("http://127.0.0.1:9", Duration::from_secs(60), metrics)
        .expect("starts; the collector is only contacted at export time");
    drop(exporter);
}

// ------------------------------------------------------------------ Grafana

/// Every family a scrape can show: a render after traffic that fills all.
fn exported_series_and_labels() -> (HashSet<String>, HashSet<String>) {
    let m = Metrics::new();
    m.set_route_upstream("ollama", "127.0.0.1", 11434);
    m.set_route_provider("ollama", "ollama");
    record_traffic(&m);
    m.set_stats(&Stats {
        high: Some(48.5),
        low: Some(3.5),
        ..Stats::default()
    });
    record_proxy_latency(Duration::from_micros(4));
    let text = m.render();
    let mut series = HashSet::new();
    let mut labels = HashSet::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        series.insert(line[..name_end].to_owned());
        if let Some(set) = line[name_end..].strip_prefix('{') {
            for pair in set.split("\",") {
                if let Some((label, _)) = pair.split_once('=') {
                    labels.insert(label.trim_start_matches(',').to_owned());
                }
            }
        }
    }
    // Prometheus adds these to every scraped series.
    labels.extend(["instance".to_owned(), "job".to_owned()]);
    (series, labels)
}

/// Identifiers in a PromQL expression that name speedtap's series: the
/// `gen_ai_*` / `speedtap_*` words that are not label names (not in a
/// `by (...)` list, not followed by a matcher).
fn metric_names(expr: &str) -> Vec<&str> {
    let grouping = grouping_labels(expr);
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(start) = rest.find(|c: char| is_ident(c)) {
        let word_len = rest[start..]
            .find(|c: char| !is_ident(c))
            .unwrap_or(rest.len() - start);
        let word = &rest[start..start + word_len];
        let after = rest[start + word_len..].trim_start();
        let matcher = after.starts_with('=') || after.starts_with("!=") || after.starts_with("!~");
        if (word.starts_with("gen_ai_") || word.starts_with("speedtap_"))
            && !matcher
            && !grouping.iter().any(|g| g == word)
        {
            out.push(word);
        }
        rest = &rest[start + word_len..];
    }
    out
}

/// The labels of every `by (...)` clause.
fn grouping_labels(expr: &str) -> Vec<String> {
    expr.split("by (")
        .skip(1)
        .filter_map(|rest| rest.split_once(')'))
        .flat_map(|(list, _)| list.split(',').map(|l| l.trim().to_owned()))
        .collect()
}

#[test]
fn the_grafana_dashboard_queries_only_what_speedtap_exports() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/grafana-dashboard.json");
    let text = std::fs::read_to_string(&path).expect("docs/grafana-dashboard.json");
    let dash: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    let (series, labels) = exported_series_and_labels();

    // A data source variable every panel and query uses.
    let vars = dash["templating"]["list"].as_array().expect("variables");
    assert!(vars.iter().any(|v| v["name"] == "datasource"
        && v["type"] == "datasource"
        && v["query"] == "prometheus"));
    let panels = dash["panels"].as_array().expect("panels");
    assert!(panels.len() >= 6);

    let mut exprs: Vec<String> = Vec::new();
    for p in panels {
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{}", p["title"]);
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{}", p["title"]);
        for t in targets {
            assert_eq!(t["datasource"]["uid"], "${datasource}");
            exprs.push(t["expr"].as_str().expect("expr").to_owned());
        }
    }
    for v in vars.iter().filter(|v| v["type"] == "query") {
        exprs.push(v["definition"].as_str().expect("definition").to_owned());
    }

    let mut used = HashSet::new();
    for expr in &exprs {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "no speedtap series in {expr}");
        for name in names {
            assert!(series.contains(name), "{name} (in {expr}) is not exported");
            used.insert(name.to_owned());
        }
        for label in grouping_labels(expr) {
            assert!(
                labels.contains(&label),
                "label {label} (in {expr}) is not exported"
            );
        }
    }
    // The panels the dashboard promises.
    for family in [
        "gen_ai_server_time_to_first_token_seconds_sum",
        "speedtap_decode_rate_per_second_bucket",
        "speedtap_output_tokens_total",
        "speedtap_active_calls",
        "speedtap_calls_total",
        "speedtap_tokens_per_second_hour_high",
        "speedtap_tokens_per_second_hour_low",
    ] {
        assert!(used.contains(family), "{family} has no panel");
    }
}

/// The host starts the exporter from the engine options, so every front
/// end that resolves its settings with `host::settings` (the `speedtap run`
/// command and the tray app alike) exports, whether the endpoint came from
/// `--otlp-endpoint` or from the config file's `otlp_endpoint`; shutting
/// the engine down delivers a last export.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_host_starts_the_otlp_exporter_from_the_flag_or_the_config_file() {
    use clap::Parser;
    use speedtap::host::args::RunArgs;
    use speedtap::host::settings::{engine_options, resolve_settings};
    use speedtap::host::Engine;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        run: RunArgs,
    }

    let dir = std::env::temp_dir().join(format!("speedtap-otlp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (addr, mut rx) = start_receiver().await;
    let endpoint = format!("http://{addr}");
    let empty = dir.join("empty.toml");
    std::fs::write(&empty, "").unwrap();
    let with_endpoint = dir.join("otlp.toml");
    std::fs::write(&with_endpoint, format!("otlp_endpoint = \"{endpoint}\"\n")).unwrap();
    let empty = empty.to_str().unwrap().to_owned();
    let with_endpoint = with_endpoint.to_str().unwrap().to_owned();
    let from_flag: Vec<&str> = vec![
        "speedtap-desktop",
        "--config",
        &empty,
        "--no-db",
        "--api",
        "127.0.0.1:0",
        "--otlp-endpoint",
        &endpoint,
    ];
    let from_file: Vec<&str> = vec![
        "speedtap-desktop",
        "--config",
        &with_endpoint,
        "--no-db",
        "--api",
        "127.0.0.1:0",
    ];
    for argv in [from_flag, from_file] {
        let flags = Flags::parse_from(argv.clone());
        let settings = resolve_settings(&flags.run).expect("settings");
        let options = engine_options(&flags.run, &settings).expect("options");
        assert_eq!(
            options.otlp_endpoint.as_deref(),
            Some(endpoint.as_str()),
            "{argv:?}"
        );
        let engine = Engine::start(options).await.expect("engine starts");
        assert_eq!(
            engine.otlp_url(),
            Some(format!("{endpoint}/v1/metrics").as_str())
        );
        engine.shutdown(Duration::from_secs(1)).await;
        let first = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("the collector got a request in time")
            .expect("receiver running");
        assert_eq!(first.path, "/v1/metrics");
        while rx.try_recv().is_ok() {}
    }

    // A bad endpoint is a usage error before anything starts, naming the
    // flag.
    let flags = Flags::parse_from([
        "speedtap",
        "--config",
        &empty,
        "--no-db",
        "--otlp-endpoint",
        "https://c:4318",
    ]);
    let Err(err) = resolve_settings(&flags.run) else {
        panic!("an https endpoint is refused");
    };
    assert_eq!(err.exit_code(), 2, "{err}");
    assert!(err.to_string().starts_with("--otlp-endpoint: "), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
