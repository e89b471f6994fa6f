//! The slowdown explained: a settled call whose decode rate is below
//! [`SLOW_RATIO`] x the usual for its route, model and context depth gets
//! a [`Slowdown`] with the causes its evidence names (`docs/metering.md`,
//! "The slowdown explained").
//!
//! - The usual is a decayed mean (as the other normals), per route, model
//!   and depth bucket ([`depth_bucket`]), from at least [`MIN_CALLS`]
//!   earlier ok calls with a rate. A long context is judged against long
//!   contexts, so depth is never a cause.
//! - Each usual remembers the server version it was learned on. Calls on
//!   another version learn a candidate beside it; the old usual stays the
//!   reference until [`MIN_CALLS`] calls on the new version establish the
//!   candidate, which then replaces it.
//! - Where the server reports speculative decoding, each usual also learns
//!   the share of drafted tokens accepted, from the same calls and on the
//!   same [`MIN_CALLS`] rule; a call accepting [`MIN_ACCEPTANCE_DROP`] or
//!   more below it names `draft_acceptance`.
//! - A call slowed by a named passing cause (the model partly on the CPU,
//!   other calls streaming beside it, drafts accepted less) is not learned, as queued and cold
//!   calls never teach the usual time to first token: one bad hour can't
//!   make slow the usual.
//!
//! Pure and clock-free: the caller judges each settled call with its
//! evidence, then lets it teach.

use std::collections::HashMap;

use crate::model::{Slowdown, SlowdownCause};

/// A call below this share of its usual rate is slow.
pub const SLOW_RATIO: f64 = 0.75;

/// Earlier ok calls with a rate needed before a usual judges anything,
/// and calls on a new server version needed before they replace it.
pub const MIN_CALLS: u64 = 5;

/// Weight kept by the older rates at each new one.
const DECAY: f64 = 0.8;

/// Context depth bucket edges, in tokens: below 2k, 2k-8k, 8k-32k, 32k
/// and more. A call of unknown depth has a bucket of its own.
const DEPTH_EDGES: [u64; 3] = [2_048, 8_192, 32_768];

/// A CPU share below this is rounding, not an offload.
const MIN_CPU_SHARE: f64 = 0.01;

/// A draft acceptance this far (a share, 0..=1) or more below the usual
/// one names `draft_acceptance`: ten points, well past the call-to-call
/// spread of one workload.
pub const MIN_ACCEPTANCE_DROP: f64 = 0.1;

/// The bucket of a context depth (prompt and cached tokens); `None` for
/// an unknown depth.
pub fn depth_bucket(depth: Option<u64>) -> Option<u8> {
    depth.map(|d| DEPTH_EDGES.iter().take_while(|edge| d >= **edge).count() as u8)
}

/// What is known about one settled ok call with a decode rate.
#[derive(Clone, Debug, PartialEq)]
pub struct DecodeCall<'a> {
    pub route: &'a str,
    pub model: &'a str,
    /// Prompt plus cached tokens, when known.
    pub depth: Option<u64>,
    /// The settled decode rate.
    pub tps: f64,
    /// The server's version, when known.
    pub version: Option<&'a str>,
    /// The share of drafted tokens accepted, 0..=1, when the server
    /// reports speculative decoding with tokens drafted.
    pub draft_acceptance: Option<f64>,
}

/// The accepted share of `drafted` tokens, `None` when none were drafted
/// (llama.cpp `draft_n_accepted / draft_n`).
pub fn draft_acceptance(drafted: u64, accepted: u64) -> Option<f64> {
    (drafted > 0).then(|| accepted.min(drafted) as f64 / drafted as f64)
}

/// What the server and the engine said while the call ran.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Evidence {
    /// The share of the model off the GPU, when the server reports
    /// placement (Ollama `1 - size_vram / size`).
    pub cpu_share: Option<f64>,
    /// Other calls that streamed on the same server during it, at most at
    /// once.
    pub concurrent_calls: u32,
}

/// A decayed mean of values, usual once it holds [`MIN_CALLS`] of them.
#[derive(Clone, Debug, Default, PartialEq)]
struct Mean {
    calls: u64,
    weight: f64,
    sum: f64,
}

impl Mean {
    fn add(&mut self, x: f64) {
        self.calls += 1;
        self.weight = self.weight * DECAY + 1.0;
        self.sum = self.sum * DECAY + x;
    }

    fn usual(&self) -> Option<f64> {
        (self.calls >= MIN_CALLS && self.weight > 0.0).then(|| self.sum / self.weight)
    }
}

/// The usual rate and draft acceptance, with the version they were
/// learned on.
#[derive(Clone, Debug, Default, PartialEq)]
struct Learned {
    version: Option<String>,
    rate: Mean,
    acceptance: Mean,
}

impl Learned {
    fn on(version: Option<&str>) -> Learned {
        Learned {
            version: version.map(str::to_owned),
            ..Learned::default()
        }
    }

    fn add(&mut self, call: &DecodeCall<'_>) {
        self.rate.add(call.tps);
        if let Some(a) = call.draft_acceptance.filter(|a| (0.0..=1.0).contains(a)) {
            self.acceptance.add(a);
        }
    }

    /// Calls on `version` teach this usual: the same version, or either
    /// unknown.
    fn accepts(&self, version: Option<&str>) -> bool {
        match (self.version.as_deref(), version) {
            (Some(learned), Some(now)) => learned == now,
            _ => true,
        }
    }
}

/// One (route, model, bucket)'s reference usual and the candidate learned
/// on a newer version.
#[derive(Clone, Debug, Default, PartialEq)]
struct Usual {
    reference: Learned,
    candidate: Option<Learned>,
}

/// Every route's usual decode rates.
#[derive(Clone, Debug, Default)]
pub struct DecodeUsuals {
    usuals: HashMap<(String, String, Option<u8>), Usual>,
}

impl DecodeUsuals {
    pub fn new() -> DecodeUsuals {
        DecodeUsuals::default()
    }

    fn key(call: &DecodeCall<'_>) -> (String, String, Option<u8>) {
        (
            call.route.to_owned(),
            call.model.to_owned(),
            depth_bucket(call.depth),
        )
    }

    /// The usual rate `call` is judged against, and the version it was
    /// learned on; `None` before [`MIN_CALLS`] calls.
    pub fn usual(&self, call: &DecodeCall<'_>) -> Option<(f64, Option<&str>)> {
        let reference = &self.usuals.get(&Self::key(call))?.reference;
        Some((reference.rate.usual()?, reference.version.as_deref()))
    }

    /// The usual draft acceptance `call` is judged against; `None` before
    /// [`MIN_CALLS`] calls that reported drafts.
    pub fn usual_acceptance(&self, call: &DecodeCall<'_>) -> Option<f64> {
        self.usuals
            .get(&Self::key(call))?
            .reference
            .acceptance
            .usual()
    }

    /// The call's slowdown, when it is below [`SLOW_RATIO`] x its usual,
    /// with the causes `evidence` names (`unknown` alone without any).
    pub fn judge(&self, call: &DecodeCall<'_>, evidence: &Evidence) -> Option<Slowdown> {
        let (usual, learned_on) = self.usual(call)?;
        if !(call.tps.is_finite() && call.tps >= 0.0) || call.tps >= SLOW_RATIO * usual {
            return None;
        }
        let mut causes = Vec::new();
        if let Some(share) = evidence.cpu_share.filter(|s| *s >= MIN_CPU_SHARE) {
            causes.push(SlowdownCause::CpuOffload {
                cpu_share: round(share.min(1.0), 100.0),
            });
        }
        if let (Some(from), Some(to)) = (learned_on, call.version) {
            if from != to {
                causes.push(SlowdownCause::ServerChanged {
                    from: from.to_owned(),
                    to: to.to_owned(),
                });
            }
        }
        if evidence.concurrent_calls > 0 {
            causes.push(SlowdownCause::Concurrent {
                calls: evidence.concurrent_calls,
            });
        }
        causes.extend(self.draft_cause(call));
        if causes.is_empty() {
            causes.push(SlowdownCause::Unknown);
        }
        Some(Slowdown {
            usual_tps: round(usual, 10.0),
            ratio: round(call.tps / usual, 100.0),
            causes,
        })
    }

    /// `draft_acceptance` when the call accepted [`MIN_ACCEPTANCE_DROP`] or
    /// more below its usual acceptance.
    fn draft_cause(&self, call: &DecodeCall<'_>) -> Option<SlowdownCause> {
        let now = call.draft_acceptance?;
        let usual = self.usual_acceptance(call)?;
        (now <= usual - MIN_ACCEPTANCE_DROP).then(|| SlowdownCause::DraftAcceptance {
            usual: round(usual, 100.0),
            now: round(now, 100.0),
        })
    }

    /// Teaches the usual from a settled ok call with a rate, after it was
    /// judged (`judged`: its slowdown, if any).
    pub fn learn(&mut self, call: &DecodeCall<'_>, judged: Option<&Slowdown>) {
        if !(call.tps.is_finite() && call.tps > 0.0) {
            return;
        }
        let passing = judged.is_some_and(|s| {
            s.causes.iter().any(|c| {
                matches!(
                    c,
                    SlowdownCause::CpuOffload { .. }
                        | SlowdownCause::Concurrent { .. }
                        | SlowdownCause::DraftAcceptance { .. }
                )
            })
        });
        if passing {
            return;
        }
        let usual = self.usuals.entry(Self::key(call)).or_default();
        if usual.reference.rate.calls == 0 {
            usual.reference = Learned::on(call.version);
        }
        if usual.reference.accepts(call.version) {
            if usual.reference.version.is_none() {
                usual.reference.version = call.version.map(str::to_owned);
            }
            usual.reference.add(call);
            return;
        }
        let candidate = usual
            .candidate
            .get_or_insert_with(|| Learned::on(call.version));
        if !candidate.accepts(call.version) {
            *candidate = Learned::on(call.version);
        }
        candidate.add(call);
        if candidate.rate.calls >= MIN_CALLS {
            usual.reference = usual.candidate.take().unwrap_or_default();
        }
    }
}

fn round(x: f64, scale: f64) -> f64 {
    (x * scale).round() / scale
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(tps: f64, depth: u64, version: &str) -> DecodeCall<'_> {
        DecodeCall {
            route: "ollama",
            model: "qwen3:32b",
            depth: Some(depth),
            tps,
            version: Some(version),
            draft_acceptance: None,
        }
    }

    /// Judges then learns, as the engine does for each settled call.
    fn settle(u: &mut DecodeUsuals, c: &DecodeCall<'_>, e: &Evidence) -> Option<Slowdown> {
        let s = u.judge(c, e);
        u.learn(c, s.as_ref());
        s
    }

    fn steady(u: &mut DecodeUsuals, tps: f64, n: u64, version: &str) {
        for _ in 0..n {
            assert_eq!(
                settle(u, &call(tps, 500, version), &Evidence::default()),
                None
            );
        }
    }

    #[test]
    fn a_model_at_40_then_12_tok_s_with_29_percent_on_the_cpu_is_a_cpu_offload_at_0_3() {
        let mut u = DecodeUsuals::new();
        steady(&mut u, 40.0, 5, "0.32.13");
        let slow = settle(
            &mut u,
            &call(12.0, 500, "0.32.13"),
            &Evidence {
                cpu_share: Some(0.29),
                concurrent_calls: 0,
            },
        )
        .expect("slowdown");
        assert_eq!(slow.usual_tps, 40.0);
        assert_eq!(slow.ratio, 0.3);
        assert_eq!(slow.causes, [SlowdownCause::CpuOffload { cpu_share: 0.29 }]);
        // The offloaded call taught nothing: the usual is still 40.
        let (usual, _) = u.usual(&call(0.0, 500, "0.32.13")).unwrap();
        assert!((usual - 40.0).abs() < 1e-9, "{usual}");
        // Back to normal: no slowdown.
        assert_eq!(
            settle(&mut u, &call(39.0, 500, "0.32.13"), &Evidence::default()),
            None
        );
    }

    #[test]
    fn fewer_than_five_earlier_calls_judge_nothing() {
        let mut u = DecodeUsuals::new();
        steady(&mut u, 40.0, 4, "1");
        assert_eq!(u.judge(&call(5.0, 500, "1"), &Evidence::default()), None);
    }

    #[test]
    fn a_slower_decode_after_an_upgrade_names_both_versions_until_five_calls_establish_the_new_usual(
    ) {
        let mut u = DecodeUsuals::new();
        steady(&mut u, 128.5, 5, "0.32.13");
        for i in 0..5 {
            let slow = settle(&mut u, &call(26.4, 500, "0.33.2"), &Evidence::default());
            let slow = slow.unwrap_or_else(|| panic!("call {i} on the new version"));
            assert_eq!(slow.usual_tps, 128.5, "the old usual stays the reference");
            assert_eq!(
                slow.causes,
                [SlowdownCause::ServerChanged {
                    from: "0.32.13".into(),
                    to: "0.33.2".into()
                }]
            );
        }
        // Five calls on 0.33.2 made its usual: the same rate is no longer slow.
        let (usual, on) = u.usual(&call(0.0, 500, "0.33.2")).unwrap();
        assert!(
            (usual - 26.4).abs() < 1e-9 && on == Some("0.33.2"),
            "{usual} {on:?}"
        );
        assert_eq!(
            settle(&mut u, &call(26.0, 500, "0.33.2"), &Evidence::default()),
            None
        );
    }

    #[test]
    fn a_long_context_is_judged_against_long_contexts_only() {
        let mut u = DecodeUsuals::new();
        steady(&mut u, 40.0, 5, "1");
        // 20 tok/s at 40k tokens deep: no usual there yet, so no verdict.
        assert_eq!(
            u.judge(&call(20.0, 40_000, "1"), &Evidence::default()),
            None
        );
        for _ in 0..5 {
            settle(&mut u, &call(20.0, 40_000, "1"), &Evidence::default());
        }
        assert_eq!(
            u.judge(&call(19.0, 40_000, "1"), &Evidence::default()),
            None
        );
        assert_eq!(
            depth_bucket(Some(0)),
            Some(0),
            "buckets: <2k, 2k-8k, 8k-32k, 32k+"
        );
        assert_eq!(depth_bucket(Some(2_048)), Some(1));
        assert_eq!(depth_bucket(Some(32_768)), Some(3));
        assert_eq!(depth_bucket(None), None);
    }

    #[test]
    fn other_calls_streaming_beside_it_are_named_and_no_evidence_is_unknown() {
        let mut u = DecodeUsuals::new();
        steady(&mut u, 40.0, 5, "1");
        let busy = Evidence {
            cpu_share: Some(0.0),
            concurrent_calls: 3,
        };
        let slow = u.judge(&call(20.0, 500, "1"), &busy).unwrap();
        assert_eq!(slow.causes, [SlowdownCause::Concurrent { calls: 3 }]);
        let slow = u
            .judge(&call(20.0, 500, "1"), &Evidence::default())
            .unwrap();
        assert_eq!(slow.causes, [SlowdownCause::Unknown]);
        assert_eq!(slow.ratio, 0.5);
    }

    fn drafting(tps: f64, acceptance: f64, version: &str) -> DecodeCall<'_> {
        DecodeCall {
            draft_acceptance: Some(acceptance),
            ..call(tps, 500, version)
        }
    }

    #[test]
    fn drafts_accepted_less_than_usual_name_both_shares_and_teach_nothing() {
        let mut u = DecodeUsuals::new();
        for _ in 0..5 {
            assert_eq!(
                settle(&mut u, &drafting(60.0, 0.8, "b5902"), &Evidence::default()),
                None
            );
        }
        let slow =
            settle(&mut u, &drafting(30.0, 0.3, "b5902"), &Evidence::default()).expect("slowdown");
        assert_eq!(slow.ratio, 0.5);
        assert_eq!(
            slow.causes,
            [SlowdownCause::DraftAcceptance {
                usual: 0.8,
                now: 0.3
            }]
        );
        // The call with few drafts accepted taught neither usual.
        let probe = drafting(0.0, 0.0, "b5902");
        assert!((u.usual_acceptance(&probe).unwrap() - 0.8).abs() < 1e-9);
        assert!((u.usual(&probe).unwrap().0 - 60.0).abs() < 1e-9);
    }

    #[test]
    fn a_small_dip_in_acceptance_or_too_few_drafting_calls_name_no_draft_cause() {
        let mut u = DecodeUsuals::new();
        // Five calls with a rate, only four with drafts: no usual acceptance.
        steady(&mut u, 60.0, 1, "b5902");
        for _ in 0..4 {
            settle(&mut u, &drafting(60.0, 0.8, "b5902"), &Evidence::default());
        }
        assert_eq!(u.usual_acceptance(&drafting(0.0, 0.0, "b5902")), None);
        let slow = u
            .judge(&drafting(30.0, 0.3, "b5902"), &Evidence::default())
            .unwrap();
        assert_eq!(slow.causes, [SlowdownCause::Unknown]);
        settle(&mut u, &drafting(60.0, 0.8, "b5902"), &Evidence::default());
        // Less than ten points below the usual 0.8 is no cause.
        let slow = u
            .judge(&drafting(30.0, 0.75, "b5902"), &Evidence::default())
            .unwrap();
        assert_eq!(slow.causes, [SlowdownCause::Unknown]);
        // A call that drafted nothing says nothing about acceptance.
        let slow = u
            .judge(&call(30.0, 500, "b5902"), &Evidence::default())
            .unwrap();
        assert_eq!(slow.causes, [SlowdownCause::Unknown]);
        assert_eq!(draft_acceptance(0, 0), None);
        assert_eq!(draft_acceptance(120, 96), Some(0.8));
    }

    /// A day of steady traffic: one call a minute for 24 h on each of four
    /// depths, each decoding at its depth's pace with +-15% of noise (a
    /// fixed-seed generator, so the run is the same every time). The rule
    /// must name no slowdown at all.
    #[test]
    fn a_day_of_steady_simulated_calls_has_no_slowdown() {
        let mut u = DecodeUsuals::new();
        let mut seed: u64 = 0x5eed_28b0;
        let mut noise = || {
            seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((seed >> 33) as f64 / (1u64 << 31) as f64) * 0.3 - 0.15
        };
        let depths = [(500, 42.0), (4_000, 38.0), (16_000, 31.0), (60_000, 22.0)];
        let mut judged = 0;
        for minute in 0..24 * 60 {
            let (depth, pace) = depths[minute % depths.len()];
            let tps = pace * (1.0 + noise());
            let c = call(tps, depth, "0.33.2");
            let slow = settle(&mut u, &c, &Evidence::default());
            assert_eq!(slow, None, "minute {minute}: {tps:.1} tok/s at {depth}");
            judged += u.usual(&c).is_some() as u32;
        }
        assert!(judged > 1_400, "the rule had a usual for almost every call");
    }
}
