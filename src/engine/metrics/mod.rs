//! The engine's metrics: the Prometheus text the control API serves on
//! `GET /metrics`, and the same measurements for the OTLP exporter
//! ([`otlp`]) when one is attached.
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
//! one table ([`GenAiHistogram`](schema::GenAiHistogram)) that both the Prometheus registry and the
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
//! | `speedtap_decode_rate_per_second` | histogram | `ok` calls with a settled rate: the rate, 1 to 1,000 tok/s buckets |
//! | `speedtap_calls_total` | counter | every settled call, by `route` and `status` |
//! | `speedtap_output_tokens_total` | counter | output tokens of every settled metered call |
//! | `speedtap_active_calls` | gauge | calls in flight, set when the engine publishes stats |
//! | `speedtap_tokens_per_second_hour_high` / `_low` | gauge | the global meter's hourly high / low |
//! | `speedtap_proxy_added_latency_seconds` | histogram | per response frame: tap arrival to hand-off |
//!
//! Labels on the `gen_ai_*` families and the output token counter, in this
//! order: `gen_ai_operation_name` (`chat` for chat-style APIs,
//! `text_completion` otherwise), `gen_ai_provider_name`, `speedtap_api`,
//! `gen_ai_request_model`, `gen_ai_response_model` (when the answer named
//! a model) (when the request named one), `server_address` and
//! `server_port` (the route's upstream, once the host told us with
//! [`Metrics::set_route_upstream`]: the conventions ask that behind a proxy
//! both describe the server behind it), `route` (speedtap's own), then
//! `error_type` on the two duration histograms for failed calls (the call
//! status, `abandoned` or `upstream_error`) and `gen_ai_token_type`
//! (`input` | `output`) on token usage. A label with no value is left out
//! rather than written empty.
//!
//! Choices where the conventions leave room, or where a proxy can't know:
//! - `gen_ai_provider_name`: the server's kind (`ollama`, `llama.cpp`,
//!   `vllm`...) as the host identified it ([`Metrics::set_route_provider`]):
//!   the conventions' well-known values name hosted services only and allow
//!   a custom value. A proxy can't tell which server sits behind an
//!   OpenAI-compatible port it was merely told about, so a route nobody
//!   identified says [`UNKNOWN_PROVIDER`](schema::UNKNOWN_PROVIDER)
//!   (`_OTHER`). The API kind speedtap decoded (`openai_chat`...) is
//!   `speedtap_api`.
//! - `gen_ai_response_model` is the model the server's answer named (the
//!   call record's `response_model`), never the request's name copied: a
//!   call that got no answer naming one goes without it. So the first call
//!   of a route and model creates its series with and without it
//!   ([`bases_of`](schema::bases_of)).
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
//!   mint a new series per request. The first [`MAX_MODELS`](schema::MAX_MODELS) distinct names
//!   are kept; later ones are recorded as [`OTHER_MODEL`](schema::OTHER_MODEL).
//!
//! - Series exist at zero before their first event: each bound route has
//!   `speedtap_calls_total` for every settled status, and the first call of
//!   a route and model creates every series that pair can feed (each
//!   `error_type`, each token type). A series that appears already at 1
//!   is invisible to `rate()` and `increase()`, so without this a restart's
//!   first failures would not be counted.
//!
//! Cost: a settled call costs a few histogram observations (a short lock per
//! family, once per call). The per-frame proxy latency is two relaxed atomic
//! additions into a process-wide histogram ([`record_proxy_latency`]). The
//! struct is `Send + Sync` and lives in an `Arc` shared by the engine (which
//! records), the control API (which renders) and the OTLP exporter. No I/O
//! here.

pub mod otlp;
pub mod prometheus;
pub mod schema;

pub use prometheus::{record_proxy_latency, Metrics, CONTENT_TYPE};
