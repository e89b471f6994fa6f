//! Why a call waits for its first token, and the facts the server tells
//! about a call beside its speed: where the prompt was cut, how full the
//! context is, how well speculative decoding did, where the model ran and
//! whether it had to load.
//!
//! Field names and spellings are the external contract (`docs/api.md`,
//! "The wait" and "Call details"; the rules behind each value are in
//! `docs/metering.md`, "Why a call waits"). Every field is optional and
//! skipped when absent: absent means "not known", never zero.

use serde::{Deserialize, Serialize};

/// What a waiting call is waiting for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WaitReason {
    /// The model was not loaded when the call was dispatched: the server
    /// is loading it.
    LoadingModel,
    /// Every slot of the server is busy with calls dispatched before this
    /// one: the call waits its turn.
    Queued,
    /// The server is processing the prompt (prefill).
    Prefilling,
    /// The server publishes nothing that explains the wait.
    Unknown,
}

impl WaitReason {
    /// The contract's spelling, e.g. `loading_model`.
    pub fn as_str(self) -> &'static str {
        match self {
            WaitReason::LoadingModel => "loading_model",
            WaitReason::Queued => "queued",
            WaitReason::Prefilling => "prefilling",
            WaitReason::Unknown => "unknown",
        }
    }
}

/// Where a prefill's `progress` and `prompt_tokens` come from, so a
/// figure built on speedtap's guess is labelled as one wherever it is
/// shown (`docs/metering.md`, "Why a call waits").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProgressSource {
    /// The server's own counts: its slot's processed tokens over its own
    /// prompt total.
    Server,
    /// The server's own counts streamed in-band to the client (llama.cpp
    /// `prompt_progress`): they win over any poll or estimate.
    Stream,
    /// speedtap's estimate: the request body's calibrated prompt size,
    /// and for a server that publishes no progress, the learned prefill
    /// rate.
    Estimate,
}

/// The explanation of one call's wait for its first token, live in its
/// snapshot while it waits and kept in its details afterwards.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Wait {
    /// What the call waits for.
    pub reason: WaitReason,
    /// Queued only: calls ahead of this one on the same upstream (1: one
    /// call ahead).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position: Option<u32>,
    /// Prefilling only: prompt tokens processed over the call's prompt
    /// tokens, 0.0..=1.0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<f64>,
    /// Estimated milliseconds until the first token, from now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eta_ms: Option<u64>,
    /// Loading: this model's usual load time on this route. Prefilling:
    /// the usual time to first token for this prompt size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usual_ms: Option<u64>,
    /// The call's prompt size in tokens: the server's own count where it
    /// publishes one, else estimated from the request body and calibrated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens: Option<u64>,
    /// Live only: milliseconds since the server last showed life for this
    /// call (a ping frame or any other body frame, a change of its
    /// telemetry: `/slots` progress, a load in `/api/ps`), or since
    /// dispatch when it showed none. Never stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub silent_ms: Option<u64>,
    /// Prefilling with `progress` only: whose numbers the progress and
    /// the prompt size are. Live only: a settled call's `details.wait`
    /// leaves it out, as its stored record does (no settled view shows a
    /// wait's progress).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress_source: Option<ProgressSource>,
}

impl Wait {
    /// A wait with only its reason known.
    pub fn new(reason: WaitReason) -> Wait {
        Wait {
            reason,
            position: None,
            progress: None,
            eta_ms: None,
            usual_ms: None,
            prompt_tokens: None,
            silent_ms: None,
            progress_source: None,
        }
    }

    /// Whether the prefill figures rest on speedtap's estimate.
    pub fn is_estimate(&self) -> bool {
        self.progress_source == Some(ProgressSource::Estimate)
    }

    /// The cause as the end of a notification sentence, e.g. `loading the
    /// model (usually 4.0 s)`, `queued behind 1 call`, `prefill of 12,000
    /// tokens 60% done, about 3 s left`. `None` when the reason is unknown.
    pub fn cause(&self) -> Option<String> {
        match self.reason {
            WaitReason::LoadingModel => Some(match self.usual_ms {
                Some(ms) => format!("loading the model (usually {})", seconds(ms)),
                None => "loading the model".to_owned(),
            }),
            WaitReason::Queued => Some(match self.position {
                Some(1) => "queued behind 1 call".to_owned(),
                Some(n) => format!("queued behind {n} calls"),
                None => "queued".to_owned(),
            }),
            WaitReason::Prefilling => {
                let about = if self.is_estimate() { "about " } else { "" };
                let mut s = match self.prompt_tokens {
                    Some(n) => format!("prefill of {about}{} tokens", thousands(n)),
                    None => "prefill".to_owned(),
                };
                match self.progress {
                    Some(p) => s.push_str(&format!(" {}% done", (p * 100.0).floor() as u64)),
                    None => s.push_str(" in progress"),
                }
                if self.is_estimate() && self.progress.is_some() {
                    s.push_str(" (estimated)");
                }
                if let Some(eta) = self.eta_ms {
                    s.push_str(&format!(", about {} s left", eta.div_ceil(1000)));
                }
                Some(s)
            }
            WaitReason::Unknown => None,
        }
    }
}

/// The server cut the prompt: its own prompt count reached its own
/// context size (Ollama cuts to `num_ctx` without saying so). Flagged from
/// the server's numbers only, never from speedtap's estimate.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromptTruncation {
    /// The request's prompt size as speedtap estimated it from its body
    /// (calibrated), never below `server_tokens`: an estimate, labelled
    /// so wherever it is shown, that plays no part in the flag.
    pub request_tokens: u64,
    /// The prompt tokens the server reports it read (processed plus
    /// cached).
    pub server_tokens: u64,
    /// The loaded context size, when the server publishes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_size: Option<u64>,
}

/// How full the call left the context.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContextUse {
    /// The loaded context size in tokens, when the server publishes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// Prompt plus cached plus output tokens.
    pub used: u64,
}

/// Speculative decoding, as the server reports it (llama.cpp `draft_n`,
/// `draft_n_accepted`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DraftCounts {
    /// Tokens the draft model proposed.
    pub drafted: u64,
    /// Of those, the tokens the target model accepted.
    pub accepted: u64,
}

/// Where the model ran, from Ollama's `size_vram` against `size`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Placement {
    /// All of the model in GPU memory.
    Gpu,
    /// Part in GPU memory, part in system memory (slower).
    Split,
    /// None of it in GPU memory.
    Cpu,
}

impl Placement {
    /// From the loaded size and the part of it in VRAM.
    pub fn from_sizes(size: u64, size_vram: u64) -> Placement {
        if size_vram == 0 {
            Placement::Cpu
        } else if size_vram >= size {
            Placement::Gpu
        } else {
            Placement::Split
        }
    }

    /// The contract's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Placement::Gpu => "gpu",
            Placement::Split => "split",
            Placement::Cpu => "cpu",
        }
    }
}

/// Whether the model had to load for the call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StartKind {
    /// The model was not loaded when the call was dispatched.
    Cold,
    /// The model was already loaded.
    Warm,
}

impl StartKind {
    /// The contract's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            StartKind::Cold => "cold",
            StartKind::Warm => "warm",
        }
    }
}

/// `4000` ms as `4.0 s`.
pub fn seconds(ms: u64) -> String {
    format!("{:.1} s", ms as f64 / 1000.0)
}

/// `12000` as `12,000`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_serialises_with_contract_names_and_skips_what_is_unknown() {
        let w = Wait {
            reason: WaitReason::Prefilling,
            position: None,
            progress: Some(0.6),
            eta_ms: Some(3000),
            usual_ms: Some(4000),
            prompt_tokens: Some(12000),
            silent_ms: Some(400),
            progress_source: None,
        };
        let json = serde_json::to_value(&w).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"reason": "prefilling", "progress": 0.6, "eta_ms": 3000,
                               "usual_ms": 4000, "prompt_tokens": 12000, "silent_ms": 400})
        );
        assert_eq!(serde_json::from_value::<Wait>(json).unwrap(), w);
        let queued = Wait {
            position: Some(1),
            ..Wait::new(WaitReason::Queued)
        };
        assert_eq!(
            serde_json::to_string(&queued).unwrap(),
            r#"{"reason":"queued","position":1}"#
        );
        for r in [
            WaitReason::LoadingModel,
            WaitReason::Queued,
            WaitReason::Prefilling,
            WaitReason::Unknown,
        ] {
            assert_eq!(serde_json::to_value(r).unwrap(), r.as_str());
        }
    }

    #[test]
    fn a_prefill_built_on_the_estimate_says_so_in_its_field_and_its_words() {
        let server = Wait {
            progress: Some(0.6),
            eta_ms: Some(3000),
            prompt_tokens: Some(12000),
            progress_source: Some(ProgressSource::Server),
            ..Wait::new(WaitReason::Prefilling)
        };
        assert_eq!(
            server.cause().unwrap(),
            "prefill of 12,000 tokens 60% done, about 3 s left"
        );
        let guess = Wait {
            progress_source: Some(ProgressSource::Estimate),
            ..server.clone()
        };
        assert_eq!(
            guess.cause().unwrap(),
            "prefill of about 12,000 tokens 60% done (estimated), about 3 s left"
        );
        let json = serde_json::to_value(&guess).unwrap();
        assert_eq!(json["progress_source"], "estimate");
        assert_eq!(
            serde_json::to_value(&server).unwrap()["progress_source"],
            "server"
        );
    }

    #[test]
    fn the_facts_serialise_with_contract_spellings() {
        assert_eq!(
            serde_json::to_value(PromptTruncation {
                request_tokens: 9000,
                server_tokens: 2048,
                context_size: Some(2048)
            })
            .unwrap(),
            serde_json::json!({"request_tokens": 9000, "server_tokens": 2048, "context_size": 2048})
        );
        assert_eq!(
            serde_json::to_value(ContextUse {
                size: Some(8192),
                used: 3100
            })
            .unwrap(),
            serde_json::json!({"size": 8192, "used": 3100})
        );
        assert_eq!(
            serde_json::to_value(DraftCounts {
                drafted: 120,
                accepted: 96
            })
            .unwrap(),
            serde_json::json!({"drafted": 120, "accepted": 96})
        );
        for p in [Placement::Gpu, Placement::Split, Placement::Cpu] {
            assert_eq!(serde_json::to_value(p).unwrap(), p.as_str());
        }
        for s in [StartKind::Cold, StartKind::Warm] {
            assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
        }
    }

    #[test]
    fn placement_compares_vram_with_the_loaded_size() {
        assert_eq!(Placement::from_sizes(100, 100), Placement::Gpu);
        assert_eq!(Placement::from_sizes(100, 60), Placement::Split);
        assert_eq!(Placement::from_sizes(100, 0), Placement::Cpu);
    }

    #[test]
    fn thousands_groups_digits_in_threes() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1234567), "1,234,567");
    }
}
