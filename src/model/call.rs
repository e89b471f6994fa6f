//! The records the engine publishes: calls, their identity and status, and
//! the events subscribers receive. Field names and spellings are the
//! external contract (`docs/api.md`, `Call`): extend, don't rename.

use serde::{Deserialize, Serialize};

use super::api_kind::ApiKind;
use super::snapshot::Snapshot;
use super::stats::Stats;

/// Who a call is: fixed for its whole life.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallIdentity {
    /// `c-000042`: unique within one engine run, in dispatch order.
    pub id: String,
    /// The route's name (`ollama`).
    pub route: String,
    /// The API the request spoke (`unknown` when passed through unmetered).
    pub api: ApiKind,
    /// The model the request named, when it named one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Wall-clock dispatch time, RFC 3339 UTC with milliseconds.
    pub started_at: String,
}

/// Where a call stands. Spellings are the contract's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallStatus {
    /// Still streaming.
    InFlight,
    /// Ended with the protocol's terminal marker or a complete body.
    Ok,
    /// The client hung up, or the stream was cut before its end.
    Abandoned,
    /// The upstream answered non-2xx, or could not be reached.
    UpstreamError,
    /// Passed through, not understood, not metered.
    Unmetered,
}

impl CallStatus {
    /// The contract's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            CallStatus::InFlight => "in_flight",
            CallStatus::Ok => "ok",
            CallStatus::Abandoned => "abandoned",
            CallStatus::UpstreamError => "upstream_error",
            CallStatus::Unmetered => "unmetered",
        }
    }

    /// True once the call has ended, whatever the outcome.
    pub fn is_settled(self) -> bool {
        self != CallStatus::InFlight
    }
}

/// One call as the control API returns it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Call {
    /// Who the call is (flattened into the JSON object).
    #[serde(flatten)]
    pub identity: CallIdentity,
    /// Where the call stands.
    pub status: CallStatus,
    /// The upstream's status code, once the response head arrived (or 502
    /// when the upstream could not be reached).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_status: Option<u16>,
    /// Latest snapshot for in-flight calls, final otherwise. Absent for
    /// unmetered calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speed: Option<Snapshot>,
    /// Prompt tokens, when the server reported them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_tokens: Option<u64>,
    /// speedtap's extensions: client app, TTFT breakdown, flags.
    #[serde(flatten, default)]
    pub details: CallDetails,
}

/// A first token later than the route's threshold, while still waiting.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SlowFirstToken {
    /// The late call.
    pub call: CallIdentity,
    /// How long the call had waited when the alarm fired.
    pub waited_ms: u64,
    /// The threshold that was crossed.
    pub threshold_ms: u64,
}

impl SlowFirstToken {
    /// The one-line human message, e.g.
    /// `qwen3:32b on ollama: no first token after 5.0 s`.
    pub fn message(&self) -> String {
        format!(
            "{} on {}: no first token after {:.1} s",
            self.call.model.as_deref().unwrap_or("a model"),
            self.call.route,
            self.waited_ms as f64 / 1000.0
        )
    }
}

/// What subscribers (control API SSE, terminal view, tray) receive.
#[derive(Clone, Debug, PartialEq)]
pub enum EngineEvent {
    /// A published snapshot of one call (`event: speed`).
    Speed {
        /// The call the snapshot belongs to.
        call: CallIdentity,
        /// The snapshot.
        speed: Snapshot,
    },
    /// A call ended; the full record with its final status.
    Settled(Call),
    /// A global reading at the publishing cadence (`event: stats`).
    Stats(Stats),
    /// A first token is late (the Notifier's alarm).
    SlowFirstToken(SlowFirstToken),
}

/// The `data` of an SSE `event: speed`: `{"call": CallIdentity, "speed": Snapshot}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SpeedEvent {
    /// The call the snapshot belongs to.
    pub call: CallIdentity,
    /// The snapshot.
    pub speed: Snapshot,
}

/// One `--json` line (without the newline) for a published snapshot: the
/// same `{"call": CallIdentity, "speed": Snapshot}` as the SSE `speed`
/// event's data, so scripts can consume either.
pub fn json_line(call: &CallIdentity, speed: &Snapshot) -> String {
    let event = SpeedEvent {
        call: call.clone(),
        speed: speed.clone(),
    };
    // Plain strings, integers, booleans and finite-or-null floats: this
    // serialisation has no failure mode.
    serde_json::to_string(&event).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Phase, TokenSource};

    #[test]
    fn call_serialises_like_the_contract_example() {
        let call = Call {
            identity: CallIdentity {
                id: "c-000042".into(),
                route: "ollama".into(),
                api: ApiKind::OpenaiChat,
                model: Some("qwen3:8b".into()),
                started_at: "2026-11-30T10:42:07.123Z".into(),
            },
            status: CallStatus::Ok,
            http_status: Some(200),
            speed: Some(Snapshot {
                phase: Phase::Complete,
                is_final: true,
                elapsed_ms: 5120,
                time_to_first_token_ms: Some(312),
                output_tokens: 201,
                output_tokens_per_second: Some(41.7),
                token_source: TokenSource::Server,
            }),
            input_tokens: Some(37),
            details: Default::default(),
        };
        let expected = serde_json::json!({
          "id": "c-000042", "route": "ollama", "api": "openai_chat", "model": "qwen3:8b",
          "started_at": "2026-11-30T10:42:07.123Z", "status": "ok", "http_status": 200,
          "speed": { "phase": "complete", "is_final": true, "elapsed_ms": 5120,
                     "time_to_first_token_ms": 312, "output_tokens": 201,
                     "output_tokens_per_second": 41.7, "token_source": "server" },
          "input_tokens": 37, "seen_by": "proxy"
        });
        assert_eq!(serde_json::to_value(&call).unwrap(), expected);
        let back: Call = serde_json::from_value(expected).unwrap();
        assert_eq!(back, call);
    }

    #[test]
    fn slow_first_token_message_reads_naturally() {
        let s = SlowFirstToken {
            call: CallIdentity {
                id: "c-000001".into(),
                route: "ollama".into(),
                api: ApiKind::OllamaChat,
                model: Some("qwen3:32b".into()),
                started_at: String::new(),
            },
            waited_ms: 5000,
            threshold_ms: 5000,
        };
        assert_eq!(
            s.message(),
            "qwen3:32b on ollama: no first token after 5.0 s"
        );
    }
}

/// Where a call's time to first token went, from what the server reported
/// (Ollama `load_duration` / `prompt_eval_*`, llama.cpp `prompt_n` /
/// `prompt_ms` / `cache_n`). Absent parts were not reported.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TtftBreakdown {
    /// Model load before the prompt (Ollama `load_duration`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_ms: Option<f64>,
    /// Prompt processing (prefill) time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill_ms: Option<f64>,
    /// Prompt tokens actually processed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill_tokens: Option<u64>,
    /// Prompt tokens reused from the server's cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_tokens: Option<u64>,
    /// Prefill speed: prefill tokens / prefill time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill_tokens_per_second: Option<f64>,
    /// The rest of the TTFT: network, queueing, HTTP, first decode step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub other_ms: Option<f64>,
}

/// What speedtap knows about a call beyond the contract's `Call`: kept in
/// the store and shown in call details.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CallDetails {
    /// The app that made the call, from its User-Agent (`openai-python`,
    /// `ollama-python`, `curl`...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<String>,
    /// Where the time to first token went, when the server reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttft_breakdown: Option<TtftBreakdown>,
    /// The output arrived in one burst (no honest rate).
    #[serde(default, skip_serializing_if = "is_false")]
    pub one_burst: bool,
    /// The server billed reasoning it never streamed.
    #[serde(default, skip_serializing_if = "is_false")]
    pub unstreamed_reasoning: bool,
    /// Wall-clock settle time, RFC 3339 UTC with milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settled_at: Option<String>,
    /// Which interceptor saw the call. Records stored before capture
    /// existed read back as `proxy`, the only interceptor there was.
    #[serde(default)]
    pub seen_by: SeenBy,
    /// Packets of the call were lost in capture (the kernel dropped them or
    /// a hole was never filled): what the server reported is kept, but no
    /// rate is shown, since the timings it would rest on are incomplete.
    #[serde(default, skip_serializing_if = "is_false")]
    pub capture_gap: bool,
}

/// How a call was seen: through a proxy route, or by the passive capture
/// of the loopback traffic to the model server's own port.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SeenBy {
    /// The client called a speedtap proxy port.
    #[default]
    Proxy,
    /// The client called the model server directly; the capture saw it.
    Capture,
}

impl SeenBy {
    /// The contract's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            SeenBy::Proxy => "proxy",
            SeenBy::Capture => "capture",
        }
    }
}

/// Flags are only written when set, so a plain call serialises exactly like
/// the contract's example.
fn is_false(b: &bool) -> bool {
    !*b
}
