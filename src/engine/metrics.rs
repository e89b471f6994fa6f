//! The Prometheus metrics the control API serves on `GET /metrics`.
//!
//! Names follow the OpenTelemetry GenAI semantic conventions
//! (`shared/reference/streaming-protocols.md`, Part E1) the way an OTel
//! Prometheus exporter would write them: dots become underscores and the unit
//! becomes a suffix (`gen_ai.server.time_to_first_token`, unit `s` ->
//! `gen_ai_server_time_to_first_token_seconds`). Annotation units such as
//! `{token}` add no suffix (`gen_ai_client_token_usage`), as in the OTel
//! exporters. Bucket boundaries are the conventions' recommended ones, so
//! dashboards built for OTel-instrumented servers read ours unchanged.
//!
//! | family | kind | recorded |
//! |---|---|---|
//! | `gen_ai_server_time_to_first_token_seconds` | histogram | `ok` calls with a first token |
//! | `gen_ai_server_time_per_output_token_seconds` | histogram | `ok` calls with a settled rate: 1 / rate |
//! | `gen_ai_server_request_duration_seconds` | histogram | every settled metered call: `elapsed_ms` |
//! | `gen_ai_client_token_usage` | histogram | input and output counts, when known |
//! | `speedtap_calls_total` | counter | every settled call, by `route` and `status` |
//! | `speedtap_output_tokens_total` | counter | output tokens of every settled metered call |
//! | `speedtap_active_calls` | gauge | set by the engine when it publishes stats |
//!
//! Labels on the `gen_ai_*` families and the output token counter: `route`
//! (speedtap's own), `gen_ai_request_model` (empty when the request named no
//! model, which Prometheus treats as absent), `gen_ai_operation_name` (`chat`
//! for chat-style APIs, `text_completion` otherwise) and
//! `gen_ai_provider_name`. The conventions have no well-known provider value
//! for local servers (Ollama, llama.cpp, vLLM...), and a proxy can't tell which
//! server sits behind an OpenAI-compatible port anyway, so the provider label
//! carries the API kind (`openai_chat`, `ollama_generate`, ...) that speedtap
//! actually decoded. `gen_ai_token_type` (`input` | `output`) is added on the
//! token usage histogram. The request duration histogram also carries
//! `error_type`: empty for `ok` calls and the call status (`abandoned`,
//! `upstream_error`) otherwise, following the conventions' "error.type on
//! error" rule.
//!
//! Why "time per output token" is 1 / settled rate: the settled rate is
//! already the decode rate after the first token ((n − 1) tokens over the
//! time from first to last, or the server's own decode timing), which is
//! exactly the conventions' definition turned upside down.
//!
//! The metrics are cheap atomics behind `prometheus-client`'s families; the
//! struct is `Send + Sync` and meant to live in an `Arc` shared by the engine
//! (which records) and the control API (which renders). No I/O here.

use prometheus_client::encoding::{prometheus_text, EncodeLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use super::model::{Call, CallStatus};
use crate::decode::ApiKind;

/// OTel recommended buckets for `gen_ai.server.time_to_first_token` (s).
pub const TTFT_BUCKETS: [f64; 16] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
];

/// OTel recommended buckets for `gen_ai.server.time_per_output_token` (s).
pub const TPOT_BUCKETS: [f64; 13] = [
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
];

/// OTel recommended buckets for `gen_ai.server.request.duration` (s).
pub const DURATION_BUCKETS: [f64; 14] = [
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
];

/// OTel recommended buckets for `gen_ai.client.token.usage` ({token}).
pub const TOKEN_BUCKETS: [f64; 14] = [
    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0,
    16777216.0, 67108864.0,
];

/// The labels shared by the GenAI families.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GenAiLabels {
    route: String,
    gen_ai_request_model: String,
    gen_ai_operation_name: &'static str,
    gen_ai_provider_name: &'static str,
}

/// [`GenAiLabels`] plus the outcome, for the request duration.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DurationLabels {
    route: String,
    gen_ai_request_model: String,
    gen_ai_operation_name: &'static str,
    gen_ai_provider_name: &'static str,
    error_type: &'static str,
}

/// [`GenAiLabels`] plus `gen_ai_token_type`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UsageLabels {
    route: String,
    gen_ai_request_model: String,
    gen_ai_operation_name: &'static str,
    gen_ai_provider_name: &'static str,
    gen_ai_token_type: &'static str,
}

/// Labels of `speedtap_calls_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    route: String,
    status: &'static str,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// The engine's Prometheus metrics. See the module docs.
pub struct Metrics {
    registry: Registry,
    ttft: HistogramFamily<GenAiLabels>,
    tpot: HistogramFamily<GenAiLabels>,
    duration: HistogramFamily<DurationLabels>,
    usage: HistogramFamily<UsageLabels>,
    calls: Family<CallLabels, Counter>,
    output_tokens: Family<GenAiLabels, Counter>,
    active: Gauge,
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

impl Metrics {
    /// Empty metrics with every family registered. A family shows in the
    /// text only once it has a sample (the text format has no way to list
    /// a labelled family without one), so a fresh scrape shows only
    /// `speedtap_active_calls`.
    pub fn new() -> Self {
        let ttft: HistogramFamily<GenAiLabels> =
            Family::new_with_constructor(|| Histogram::new(TTFT_BUCKETS));
        let tpot: HistogramFamily<GenAiLabels> =
            Family::new_with_constructor(|| Histogram::new(TPOT_BUCKETS));
        let duration: HistogramFamily<DurationLabels> =
            Family::new_with_constructor(|| Histogram::new(DURATION_BUCKETS));
        let usage: HistogramFamily<UsageLabels> =
            Family::new_with_constructor(|| Histogram::new(TOKEN_BUCKETS));
        let calls = Family::<CallLabels, Counter>::default();
        let output_tokens = Family::<GenAiLabels, Counter>::default();
        let active = Gauge::default();

        let mut registry = Registry::default();
        registry.register_with_unit(
            "gen_ai_server_time_to_first_token",
            "Time to generate the first token, successful responses (queueing and prefill included)",
            Unit::Seconds,
            ttft.clone(),
        );
        registry.register_with_unit(
            "gen_ai_server_time_per_output_token",
            "Time per output token after the first, successful responses (1 / settled decode rate)",
            Unit::Seconds,
            tpot.clone(),
        );
        registry.register_with_unit(
            "gen_ai_server_request_duration",
            "Dispatch to the end of the response, every settled metered call",
            Unit::Seconds,
            duration.clone(),
        );
        registry.register(
            "gen_ai_client_token_usage",
            "Input and output tokens per call ({token}), when known",
            usage.clone(),
        );
        registry.register(
            "speedtap_calls",
            "Settled calls by route and final status",
            calls.clone(),
        );
        registry.register(
            "speedtap_output_tokens",
            "Output tokens (visible, reasoning and tool-call arguments) of settled metered calls",
            output_tokens.clone(),
        );
        registry.register(
            "speedtap_active_calls",
            "Calls in the global meter's active set at the last stats publication",
            active.clone(),
        );

        Metrics {
            registry,
            ttft,
            tpot,
            duration,
            usage,
            calls,
            output_tokens,
            active,
        }
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
    ///   (the conventions: successful responses);
    /// - the output count is recorded in the usage histogram for `ok` calls
    ///   and for failed calls that did produce tokens: a failed call's zero
    ///   means "nothing was generated", not a usage of zero tokens, and would
    ///   only drag the distribution down;
    /// - input tokens only when the server reported them.
    pub fn record_settled(&self, call: &Call) {
        if call.status == CallStatus::InFlight {
            return;
        }
        let id = &call.identity;
        self.calls
            .get_or_create(&CallLabels {
                route: id.route.clone(),
                status: call.status.as_str(),
            })
            .inc();
        let Some(speed) = &call.speed else {
            return;
        };

        let labels = GenAiLabels {
            route: id.route.clone(),
            gen_ai_request_model: id.model.clone().unwrap_or_default(),
            gen_ai_operation_name: operation_name(id.api),
            gen_ai_provider_name: id.api.as_str(),
        };
        let ok = call.status == CallStatus::Ok;

        self.duration
            .get_or_create(&DurationLabels {
                route: labels.route.clone(),
                gen_ai_request_model: labels.gen_ai_request_model.clone(),
                gen_ai_operation_name: labels.gen_ai_operation_name,
                gen_ai_provider_name: labels.gen_ai_provider_name,
                error_type: if ok { "" } else { call.status.as_str() },
            })
            .observe(speed.elapsed_ms as f64 / 1000.0);

        if ok {
            if let Some(ttft_ms) = speed.time_to_first_token_ms {
                self.ttft
                    .get_or_create(&labels)
                    .observe(ttft_ms as f64 / 1000.0);
            }
            if let Some(rate) = speed.output_tokens_per_second.filter(|r| *r > 0.0) {
                self.tpot.get_or_create(&labels).observe(1.0 / rate);
            }
        }

        let usage = |token_type: &'static str, n: u64| {
            self.usage
                .get_or_create(&UsageLabels {
                    route: labels.route.clone(),
                    gen_ai_request_model: labels.gen_ai_request_model.clone(),
                    gen_ai_operation_name: labels.gen_ai_operation_name,
                    gen_ai_provider_name: labels.gen_ai_provider_name,
                    gen_ai_token_type: token_type,
                })
                .observe(n as f64);
        };
        if let Some(input) = call.input_tokens {
            usage("input", input);
        }
        if ok || speed.output_tokens > 0 {
            usage("output", speed.output_tokens);
        }

        self.output_tokens
            .get_or_create(&labels)
            .inc_by(speed.output_tokens);
    }

    /// Set the `speedtap_active_calls` gauge (the engine does it when it
    /// publishes stats).
    pub fn set_active_calls(&self, n: usize) {
        self.active.set(i64::try_from(n).unwrap_or(i64::MAX));
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

    const LABELS: &str = r#"route="ollama",gen_ai_request_model="qwen3:8b",gen_ai_operation_name="chat",gen_ai_provider_name="openai_chat""#;

    #[test]
    fn empty_metrics_show_only_the_gauge() {
        // Families without a label set yet are left out of the text format;
        // the unlabelled gauge always has its one sample.
        let text = Metrics::new().render();
        let types: Vec<&str> = text.lines().filter(|l| l.starts_with("# TYPE")).collect();
        assert_eq!(types, ["# TYPE speedtap_active_calls gauge"]);
    }

    #[test]
    fn every_family_appears_once_recorded() {
        let m = Metrics::new();
        m.record_settled(&call(
            CallStatus::Ok,
            ApiKind::OpenaiChat,
            Some(final_snapshot(Some(312), 201, Some(40.0))),
        ));
        let text = m.render();
        for family in [
            "gen_ai_server_time_to_first_token_seconds histogram",
            "gen_ai_server_time_per_output_token_seconds histogram",
            "gen_ai_server_request_duration_seconds histogram",
            "gen_ai_client_token_usage histogram",
            "speedtap_calls_total counter",
            "speedtap_output_tokens_total counter",
            "speedtap_active_calls gauge",
        ] {
            assert!(
                text.contains(&format!("# TYPE {family}\n")),
                "{family}:\n{text}"
            );
        }
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
        let les: Vec<f64> = text
            .lines()
            .filter_map(|l| l.strip_prefix(ttft.as_str()))
            .map(|rest| rest.split('"').next().unwrap())
            .filter(|le| *le != "+Inf")
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

        // 40 tok/s -> 0.025 s per token, in the le="0.025" bucket.
        let tpot = format!("gen_ai_server_time_per_output_token_seconds_bucket{{{LABELS},le=\"");
        assert_eq!(sample(&text, &format!("{tpot}0.01\"}}")), 0.0);
        assert_eq!(sample(&text, &format!("{tpot}0.025\"}}")), 1.0);

        assert_eq!(
            sample(
                &text,
                &format!("gen_ai_server_request_duration_seconds_sum{{{LABELS},error_type=\"\"}}")
            ),
            5.12
        );
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
    fn failed_calls_stay_out_of_ttft_and_tpot() {
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
        assert!(text.contains(
            r#"gen_ai_server_request_duration_seconds_count{route="ollama",gen_ai_request_model="qwen3:8b",gen_ai_operation_name="text_completion",gen_ai_provider_name="ollama_generate",error_type="abandoned"} 1"#
        ));
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
        assert!(text.contains(r#"speedtap_calls_total{route="ollama",status="upstream_error"} 1"#));
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
