//! The records the engine publishes: calls, their identity and status, and
//! the events subscribers receive. Field names and spellings are the
//! external contract (`docs/api.md`, `Call`): extend, don't rename.

use serde::{Deserialize, Serialize};

use super::api_kind::ApiKind;
use super::snapshot::Snapshot;
use super::stats::Stats;
use super::wait::{
    seconds, thousands, ContextUse, DraftCounts, Placement, PromptTruncation, StartKind, Wait,
};

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
    /// A call of the demo's traffic (`POST /api/v1/demo`): shown live, its
    /// model named `demo/…`, never stored in History and never the subject
    /// of a notification. Absent (false) for every real call.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub demo: bool,
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

/// A first token later than the route's own normal (or, without history,
/// the fixed threshold), while still waiting.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SlowFirstToken {
    /// The late call.
    pub call: CallIdentity,
    /// How long the call had waited when the alarm fired.
    pub waited_ms: u64,
    /// The threshold that was crossed: the fixed one, or the one learned
    /// from this route's history for this model and prompt size.
    pub threshold_ms: u64,
    /// Why the call was waiting when the alarm fired, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<Wait>,
    /// The route's usual time to first token for this model and prompt
    /// size (with the load, when the model had to load); absent without
    /// history.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usual_ms: Option<u64>,
}

impl SlowFirstToken {
    /// The one-line human message, e.g.
    /// `qwen3:32b on ollama: no first token after 9.1 s, loading the model
    /// (usually 4.0 s)`, or without a known cause `... after 9.1 s
    /// (usually 2.0 s)`, or without history `... after 5.0 s`.
    pub fn message(&self) -> String {
        let mut s = format!(
            "{} on {}: no first token after {:.1} s",
            self.call.model.as_deref().unwrap_or("a model"),
            self.call.route,
            self.waited_ms as f64 / 1000.0
        );
        match self.reason.as_ref().and_then(Wait::cause) {
            Some(cause) => {
                s.push_str(", ");
                s.push_str(&cause);
                // A queue is judged against its place: say what that
                // place usually takes (a load names its usual load).
                let queued = self
                    .reason
                    .as_ref()
                    .is_some_and(|w| w.reason == crate::model::WaitReason::Queued);
                if let (true, Some(usual)) = (queued, self.usual_ms) {
                    s.push_str(&format!(" (usually {} to the first token)", seconds(usual)));
                }
            }
            None => {
                if let Some(usual) = self.usual_ms {
                    s.push_str(&format!(" (usually {})", seconds(usual)));
                }
            }
        }
        s
    }
}

/// The engine's alarm for a cut prompt (event `prompt_truncated`), raised
/// once per route and model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PromptTruncated {
    /// The call whose prompt was cut.
    pub call: CallIdentity,
    /// The request's prompt size as speedtap estimated it from its body
    /// (calibrated), never below what the server read: an estimate, shown
    /// as one, that never raised the alarm.
    pub request_tokens: u64,
    /// The prompt tokens the server reports it read.
    pub server_tokens: u64,
    /// The loaded context size, when the server publishes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_size: Option<u64>,
}

impl PromptTruncated {
    /// The one-line human message, e.g. `qwen3:32b on ollama cut the
    /// prompt: it read 2,048 tokens, its whole context of 2,048 (the
    /// request held about 9,000, estimated)`. The server's numbers are
    /// stated as facts, speedtap's estimate as an estimate.
    pub fn message(&self) -> String {
        let mut s = format!(
            "{} on {} cut the prompt: it read {} tokens",
            self.call.model.as_deref().unwrap_or("a model"),
            self.call.route,
            thousands(self.server_tokens)
        );
        if let Some(n) = self.context_size {
            s.push_str(&format!(", its whole context of {}", thousands(n)));
        }
        if self.request_tokens > self.server_tokens {
            s.push_str(&format!(
                " (the request held about {}, estimated)",
                thousands(self.request_tokens)
            ));
        }
        s
    }
}

/// What subscribers (control API SSE, terminal view, tray) receive.
// `Settled(Call)` is the large variant since calls carry their facts;
// boxing it would change the type every front end matches on, for a
// channel of at most a few thousand events.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq)]
pub enum EngineEvent {
    /// A published snapshot of one call (`event: speed`).
    Speed {
        /// The call the snapshot belongs to.
        call: CallIdentity,
        /// The snapshot.
        speed: Snapshot,
        /// Which interceptor sees the call: fixed from its first snapshot,
        /// so a live view never has to guess.
        seen_by: SeenBy,
    },
    /// A call ended; the full record with its final status.
    Settled(Call),
    /// A global reading at the publishing cadence (`event: stats`).
    Stats(Stats),
    /// A first token is late (the Notifier's alarm).
    SlowFirstToken(SlowFirstToken),
    /// The server cut a prompt (once per route and model).
    PromptTruncated(PromptTruncated),
    /// A followed model server was found, went down, came back or was
    /// ignored: the whole new list (`event: servers`).
    Servers(super::servers::ServersDoc),
}

/// The `data` of an SSE `event: speed`: `{"call": CallIdentity, "speed":
/// Snapshot, "seen_by": "proxy" | "capture"}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SpeedEvent {
    /// The call the snapshot belongs to.
    pub call: CallIdentity,
    /// The snapshot.
    pub speed: Snapshot,
    /// Which interceptor sees the call, from its first snapshot on (events
    /// of older engines, without it, were the proxy's).
    #[serde(default)]
    pub seen_by: SeenBy,
}

/// One `--json` line (without the newline) for a published snapshot: the
/// same `{"call": CallIdentity, "speed": Snapshot, "seen_by": ...}` as the
/// SSE `speed` event's data, so scripts can consume either.
pub fn json_line(call: &CallIdentity, speed: &Snapshot, seen_by: SeenBy) -> String {
    let event = SpeedEvent {
        call: call.clone(),
        speed: speed.clone(),
        seen_by,
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
                demo: false,
            },
            status: CallStatus::Ok,
            http_status: Some(200),
            speed: Some(Snapshot {
                stalled_ms: None,
                phase: Phase::Complete,
                is_final: true,
                elapsed_ms: 5120,
                time_to_first_token_ms: Some(312),
                output_tokens: 201,
                output_tokens_per_second: Some(41.7),
                token_source: TokenSource::Server,
                wait: None,
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
                demo: false,
            },
            waited_ms: 5000,
            threshold_ms: 5000,
            reason: None,
            usual_ms: None,
        };
        assert_eq!(
            s.message(),
            "qwen3:32b on ollama: no first token after 5.0 s"
        );
    }

    #[test]
    fn the_truncation_message_states_the_servers_numbers_and_labels_the_estimate() {
        let t = PromptTruncated {
            call: CallIdentity {
                id: "c-000001".into(),
                route: "ollama".into(),
                api: ApiKind::OllamaChat,
                model: Some("qwen3:32b".into()),
                started_at: String::new(),
                demo: false,
            },
            request_tokens: 9000,
            server_tokens: 2048,
            context_size: Some(2048),
        };
        assert_eq!(
            t.message(),
            "qwen3:32b on ollama cut the prompt: it read 2,048 tokens, its whole context of 2,048 (the request held about 9,000, estimated)"
        );
    }

    #[test]
    fn the_slow_message_names_the_cause_and_the_normal() {
        use crate::model::{Wait, WaitReason};
        let slow = |reason: Option<Wait>, usual_ms: Option<u64>| SlowFirstToken {
            call: CallIdentity {
                id: "c-000001".into(),
                route: "ollama".into(),
                api: ApiKind::OllamaChat,
                model: Some("qwen3:32b".into()),
                started_at: String::new(),
                demo: false,
            },
            waited_ms: 9100,
            threshold_ms: 8000,
            reason,
            usual_ms,
        };
        let loading = Wait {
            usual_ms: Some(4000),
            ..Wait::new(WaitReason::LoadingModel)
        };
        assert_eq!(
            slow(Some(loading), Some(4500)).message(),
            "qwen3:32b on ollama: no first token after 9.1 s, loading the model (usually 4.0 s)"
        );
        let queued = Wait {
            position: Some(1),
            ..Wait::new(WaitReason::Queued)
        };
        assert_eq!(
            slow(Some(queued.clone()), None).message(),
            "qwen3:32b on ollama: no first token after 9.1 s, queued behind 1 call"
        );
        assert_eq!(
            slow(Some(queued), Some(4_900)).message(),
            "qwen3:32b on ollama: no first token after 9.1 s, queued behind 1 call \
             (usually 4.9 s to the first token)"
        );
        let prefill = Wait {
            progress: Some(0.6),
            eta_ms: Some(3000),
            prompt_tokens: Some(12000),
            ..Wait::new(WaitReason::Prefilling)
        };
        assert_eq!(
            slow(Some(prefill), Some(5000)).message(),
            "qwen3:32b on ollama: no first token after 9.1 s, prefill of 12,000 tokens 60% done, about 3 s left"
        );
        assert_eq!(
            slow(Some(Wait::new(WaitReason::Unknown)), Some(2000)).message(),
            "qwen3:32b on ollama: no first token after 9.1 s (usually 2.0 s)"
        );
        let json = serde_json::to_value(slow(None, Some(2000))).unwrap();
        assert_eq!(json["usual_ms"], 2000);
        assert!(json.get("reason").is_none());
    }

    #[test]
    fn the_reasoning_text_says_how_long_it_thought_and_how_much() {
        let d = CallDetails {
            reasoning_ms: Some(41_200),
            reasoning_tokens: Some(1_800),
            ..CallDetails::default()
        };
        assert_eq!(
            d.reasoning_text(Some(3_000)).as_deref(),
            Some("thought 41 s / 1.8k tokens · answered in 3 s")
        );
        let estimated = CallDetails {
            reasoning_ms: Some(2_450),
            reasoning_tokens: Some(64),
            reasoning_tokens_estimated: true,
            ..CallDetails::default()
        };
        assert_eq!(
            estimated.reasoning_text(None).as_deref(),
            Some("thought 2.5 s / ~64 tokens")
        );
        assert_eq!(CallDetails::default().reasoning_text(Some(1)), None);
        let json = serde_json::to_value(&estimated).unwrap();
        assert_eq!(json["reasoning_ms"], 2450);
        assert_eq!(json["reasoning_tokens_estimated"], true);
    }

    #[test]
    fn details_carry_the_new_facts_and_skip_them_when_unknown() {
        use crate::model::{Wait, WaitReason};
        let plain = serde_json::to_value(CallDetails::default()).unwrap();
        assert_eq!(plain, serde_json::json!({"seen_by": "proxy"}));
        let d = CallDetails {
            wait: Some(Wait::new(WaitReason::LoadingModel)),
            prompt_truncated: Some(PromptTruncation {
                request_tokens: 9000,
                server_tokens: 2048,
                context_size: Some(2048),
            }),
            context: Some(ContextUse {
                size: Some(8192),
                used: 3100,
            }),
            draft: Some(DraftCounts {
                drafted: 120,
                accepted: 96,
            }),
            placement: Some(Placement::Split),
            model_bytes: Some(5_000_000_000),
            vram_bytes: Some(3_000_000_000),
            start: Some(StartKind::Cold),
            error: Some("the prompt is over the context size".into()),
            prompt_tokens_estimated: Some(9000),
            ..CallDetails::default()
        };
        let json = serde_json::to_value(&d).unwrap();
        assert_eq!(json["wait"]["reason"], "loading_model");
        assert_eq!(json["prompt_truncated"]["server_tokens"], 2048);
        assert_eq!(json["context"]["used"], 3100);
        assert_eq!(json["draft"]["accepted"], 96);
        assert_eq!(json["placement"], "split");
        assert_eq!(json["model_bytes"], 5_000_000_000u64);
        assert_eq!(json["vram_bytes"], 3_000_000_000u64);
        assert_eq!(json["start"], "cold");
        assert_eq!(json["prompt_tokens_estimated"], 9000);
        assert_eq!(serde_json::from_value::<CallDetails>(json).unwrap(), d);
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
    /// The last explanation of the wait before the first token (see
    /// [`Wait`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait: Option<Wait>,
    /// How long the call waited in the server's queue, in ms: speedtap's
    /// own observation, from the explanations of its wait (absent: it was
    /// never explained `queued`). Counted apart from `ttft_breakdown`'s
    /// `other_ms`, which no longer holds it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queued_ms: Option<u64>,
    /// The most calls ahead of it while it queued.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_position: Option<u32>,
    /// The server read far fewer prompt tokens than the request held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_truncated: Option<PromptTruncation>,
    /// How full the call left the context.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<ContextUse>,
    /// Speculative decoding counts, where the server reports them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft: Option<DraftCounts>,
    /// Where the model ran (Ollama's `size_vram` against `size`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<Placement>,
    /// The loaded model's size in bytes, as the server reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_bytes: Option<u64>,
    /// Of that, the bytes in GPU memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vram_bytes: Option<u64>,
    /// Whether the model had to load for this call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<StartKind>,
    /// A clear cause when the call failed for a reason speedtap
    /// recognises (a prompt over the context size).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The prompt's size estimated from the request body (calibrated per
    /// route and model against the server's own prompt counts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_estimated: Option<u64>,
    /// Set on a relay's own leg: the call a relay (a followed server that
    /// is itself the client of another measured server, such as LiteLLM in
    /// front of Ollama) made to this server on behalf of its client. The
    /// value is the relay's route, where the client's call is recorded;
    /// the leg is listed live but never stored nor counted, so each client
    /// call is recorded once (`docs/metering.md`, "each client call once").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relay: Option<String>,
    /// The model the server's answer named (the top-level `model` of an
    /// OpenAI chat or completions chunk, an Ollama line, a whole JSON
    /// body), which may differ from the one requested (an alias, a
    /// default). Absent: the answer named none where speedtap reads it
    /// (Anthropic and the Responses API nest it), there was no answer, or
    /// captured bytes were lost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_model: Option<String>,
    /// The model server's version as it publishes it (Ollama
    /// `/api/version`, llama-server `/props` `build_info`, vLLM
    /// `/version`), asked when the server is found and again after it
    /// restarts. Absent: the server publishes none, or it was not known
    /// yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_version: Option<String>,
    /// Reasoning tokens, for a call that reasoned: the server's own
    /// count when its usage receipt has one, else speedtap's count of
    /// the streamed reasoning (`reasoning_tokens_estimated`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_tokens: Option<u64>,
    /// `reasoning_tokens` is speedtap's estimate, not the server's count.
    #[serde(default, skip_serializing_if = "is_false")]
    pub reasoning_tokens_estimated: bool,
    /// From the first reasoning output to the first answer output (or,
    /// when no answer came, the last output), in ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_ms: Option<u64>,
    /// A settled ok call that decoded below 0.75x the usual rate of its
    /// route, model and context depth: the usual, the ratio and the
    /// causes the evidence names (`docs/metering.md`, "The slowdown
    /// explained"). Absent: not slow, or no usual yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slowdown: Option<super::slowdown::Slowdown>,
    /// The slow-first-token limit applied to this call while it waited,
    /// in ms: learned from its route and model (twice the usual, see
    /// `slow_after_usual_ms`), or the route's fixed threshold until that is
    /// learned. Absent: no limit applied (a demo call, a relay's leg, a
    /// call that never waited), or a call stored before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slow_after_ms: Option<u64>,
    /// The usual wait `slow_after_ms` was learned from, in ms; absent when
    /// the fixed threshold applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slow_after_usual_ms: Option<u64>,
    /// How the call went wrong, with the server's own message; absent for
    /// a call that ended well (`docs/metering.md`, "A failed call").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<super::failure::Failure>,
    /// The stalls the call had while it streamed: how many, their total
    /// and the longest (`docs/metering.md`, "A stall kept"); absent when
    /// it never stalled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stalls: Option<u32>,
    /// The stalls' total, in ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stalled_ms: Option<u64>,
    /// The longest stall, in ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub longest_stall_ms: Option<u64>,
    /// The output tokens streamed before the longest stall began.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub longest_stall_after_token: Option<u64>,
    /// The output rate with the stalls' time taken out, tokens/s, for a
    /// call that stalled: speedtap's own figure from the arrival times,
    /// labelled as such, beside the server's rate in `speed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_tokens_per_second_excluding_stalls: Option<f64>,
}

impl CallDetails {
    /// The reasoning cost as call details show it, e.g. `thought 41 s /
    /// 1.8k tokens · answered in 3 s` (`~1.8k` when the count is an
    /// estimate). `answer_ms`: from the first answer output to the end,
    /// when the call answered. `None` for a call that did not reason.
    pub fn reasoning_text(&self, answer_ms: Option<u64>) -> Option<String> {
        let ms = self.reasoning_ms?;
        let mut s = format!("thought {}", whole_seconds(ms));
        if let Some(n) = self.reasoning_tokens {
            let approx = if self.reasoning_tokens_estimated {
                "~"
            } else {
                ""
            };
            s.push_str(&format!(" / {approx}{} tokens", short_count(n)));
        }
        if let Some(answer) = answer_ms {
            s.push_str(&format!(" · answered in {}", whole_seconds(answer)));
        }
        Some(s)
    }
}

/// `41 s` from ten seconds up, `2.5 s` (to the tenth) below.
fn whole_seconds(ms: u64) -> String {
    if ms < 10_000 {
        let tenths = (ms + 50) / 100;
        if tenths % 10 == 0 {
            format!("{} s", tenths / 10)
        } else {
            format!("{}.{} s", tenths / 10, tenths % 10)
        }
    } else {
        format!("{} s", (ms + 500) / 1000)
    }
}

/// `950`, `1.8k`, `12k`.
fn short_count(n: u64) -> String {
    match n {
        0..=999 => n.to_string(),
        1_000..=9_949 => format!("{:.1}k", n as f64 / 1000.0),
        _ => format!("{}k", (n + 500) / 1000),
    }
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
