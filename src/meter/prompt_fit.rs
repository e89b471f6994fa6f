//! The prompt-size calibration of one route and model: how many tokens
//! the server counts for a request whose body held `raw` estimated
//! tokens (string bytes ÷ 4), as `overhead + per_token × raw`.
//!
//! Why two parts: a chat template adds a fixed few dozen tokens (roles,
//! special tokens) to every request, whatever its length. A single
//! factor learned from short questions (15 raw tokens read as 38) is 2.5,
//! and applied to a long prompt it triples it; a fixed overhead plus a
//! per-token factor fits both. The fit is a two-point line through two
//! decayed means, one of short requests (under [`LONG_FROM_RAW`] raw
//! tokens) and one of long ones: short requests teach the overhead and
//! can't move the long point, so they can't skew long estimates, and a
//! run of long ones can't move the short point either. Until both points
//! exist, short requests alone give the overhead at a per-token factor
//! of 1 (the raw estimate's own scale), long ones alone a plain factor.
//!
//! Every plausible count teaches: nothing a single call is flagged with
//! stops the learning (the caller leaves out only a count that reached
//! the context size, which is the context's size, not the prompt's).
//!
//! Pure and clock-free; `docs/metering.md` ("The request body") has the
//! rule and the estimator's measured error on real request bodies.

/// Raw estimated tokens from which a request counts as long: at this
/// size a chat template's overhead (a few dozen tokens) is under a tenth.
pub const LONG_FROM_RAW: u64 = 256;

/// Weight kept by the older observations of a point at each new one.
const DECAY: f64 = 0.8;

/// The most a template may add to a request, in tokens: a count further
/// above 4 × raw is not this body's text (a tool schema expanded by an
/// unusual template, a server counting something else) and teaches
/// nothing.
const MAX_OVERHEAD: f64 = 512.0;

/// The per-token factor stays within this band: outside it the body is
/// not text the tokenizer reads (images, base64) or the prompt was cut.
const PER_TOKEN_BAND: std::ops::RangeInclusive<f64> = 0.25..=4.0;

/// A decayed mean of (raw, server) pairs.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Point {
    weight: f64,
    raw: f64,
    server: f64,
}

impl Point {
    fn add(&mut self, raw: f64, server: f64) {
        self.weight = self.weight * DECAY + 1.0;
        self.raw = self.raw * DECAY + raw;
        self.server = self.server * DECAY + server;
    }

    /// The mean (raw, server), once observed.
    fn mean(&self) -> Option<(f64, f64)> {
        (self.weight > 0.0).then(|| (self.raw / self.weight, self.server / self.weight))
    }
}

/// The calibration's two parts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PromptParts {
    /// Tokens the server adds to every request (template, roles).
    pub overhead: f64,
    /// Server tokens per raw estimated token of the body's text.
    pub per_token: f64,
}

/// The prompt calibration of one route and model.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PromptFit {
    short: Point,
    long: Point,
}

impl PromptFit {
    /// Learns from one settled call: the body's raw estimate and the
    /// server's count of the whole prompt (processed plus cached). An
    /// implausible pair (see [`MAX_OVERHEAD`], [`PER_TOKEN_BAND`])
    /// teaches nothing.
    pub fn observe(&mut self, raw: u64, server: u64) {
        let (x, y) = (raw as f64, server as f64);
        let plausible = raw > 0
            && y >= x * PER_TOKEN_BAND.start()
            && y <= x * PER_TOKEN_BAND.end() + MAX_OVERHEAD;
        if !plausible {
            return;
        }
        if raw < LONG_FROM_RAW {
            self.short.add(x, y);
        } else {
            self.long.add(x, y);
        }
    }

    /// The overhead and per-token factor learned so far (none learned:
    /// no overhead, factor 1).
    pub fn parts(&self) -> PromptParts {
        let parts = |overhead: f64, per_token: f64| PromptParts {
            overhead,
            per_token,
        };
        match (self.short.mean(), self.long.mean()) {
            (None, None) => parts(0.0, 1.0),
            (Some((xs, ys)), None) => parts((ys - xs).max(0.0), 1.0),
            (None, Some((xl, yl))) => parts(0.0, band(yl / xl)),
            (Some((xs, ys)), Some((xl, yl))) => {
                let slope = band((yl - ys) / (xl - xs));
                let overhead = ys - slope * xs;
                if overhead >= 0.0 {
                    parts(overhead, slope)
                } else {
                    parts(0.0, band(yl / xl))
                }
            }
        }
    }

    /// The calibrated prompt size for a body of `raw` estimated tokens
    /// (0 for a body with no text: nothing to estimate from).
    pub fn estimate(&self, raw: u64) -> u64 {
        if raw == 0 {
            return 0;
        }
        let p = self.parts();
        (p.overhead + p.per_token * raw as f64).round() as u64
    }
}

fn band(factor: f64) -> f64 {
    factor.clamp(*PER_TOKEN_BAND.start(), *PER_TOKEN_BAND.end())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_questions_teach_an_overhead_not_a_factor_that_triples_long_prompts() {
        let mut fit = PromptFit::default();
        // Six short questions: ~15 raw tokens read as ~38 (template +23).
        for (raw, server) in [(15, 38), (18, 38), (13, 36), (19, 40), (15, 38), (18, 37)] {
            fit.observe(raw, server);
        }
        // The long prompt: the server read 1,553 tokens of a body
        // whose text was about 1,530 raw tokens. A single factor of 2.4
        // made it 3,700+.
        let long = fit.estimate(1_530);
        assert!((1_540..=1_565).contains(&long), "{long}");
        assert!(fit.estimate(15).abs_diff(38) <= 2, "{}", fit.estimate(15));
    }

    #[test]
    fn long_prompts_teach_the_factor_and_short_ones_keep_the_overhead() {
        let mut fit = PromptFit::default();
        // Overhead 20, 0.8 tokens per raw token.
        for raw in [20, 30, 40] {
            fit.observe(raw, 20 + raw * 8 / 10);
        }
        for raw in [1_000, 2_000, 3_000] {
            fit.observe(raw, 20 + raw * 8 / 10);
        }
        let p = fit.parts();
        assert!((p.per_token - 0.8).abs() < 1e-9, "{p:?}");
        assert!((p.overhead - 20.0).abs() < 1e-6, "{p:?}");
        assert_eq!(fit.estimate(10_000), 8_020);
        // A flood of short questions afterwards moves only the short
        // point: the long estimate stays.
        for _ in 0..50 {
            fit.observe(25, 40);
        }
        assert_eq!(fit.estimate(10_000), 8_020);
    }

    #[test]
    fn a_cut_prompt_or_an_image_body_teaches_nothing_and_no_call_freezes_the_fit() {
        let mut fit = PromptFit::default();
        fit.observe(1_000, 1_200);
        // Cut to a tenth (the count is not the prompt's): ignored.
        fit.observe(10_000, 1_000);
        // A body of base64 image bytes: 200,000 raw tokens read as 900.
        fit.observe(200_000, 900);
        assert_eq!(fit.estimate(5_000), 6_000);
        // The next plausible call teaches again.
        fit.observe(1_000, 1_000);
        assert!(fit.estimate(5_000) < 6_000);
    }

    #[test]
    fn without_history_the_raw_estimate_stands() {
        let fit = PromptFit::default();
        assert_eq!(fit.estimate(1_234), 1_234);
        let mut only_long = PromptFit::default();
        only_long.observe(1_000, 1_100);
        assert_eq!(only_long.estimate(2_000), 2_200);
    }

    #[test]
    fn a_negative_overhead_falls_back_to_a_plain_factor() {
        let mut fit = PromptFit::default();
        // Short bodies read as fewer tokens than the long line predicts
        // (a template-free endpoint on the same route).
        fit.observe(100, 40);
        fit.observe(1_000, 1_000);
        let p = fit.parts();
        assert_eq!(p.overhead, 0.0);
        assert!((p.per_token - 1.0).abs() < 1e-9, "{p:?}");
    }
}

/// The estimator against the server's own counts on the real request
/// bodies in `tests/fixtures/real/llama-server` (llama-server and
/// SmolLM2's chat template): each body is estimated with what the fit
/// learned from the bodies before it, shortest first, as a route sees
/// short questions before long prompts, then learned.
#[cfg(test)]
mod real_bodies {
    use super::*;
    use crate::decode::request_fields::RequestFields;
    use serde_json::Value;
    use std::path::{Path, PathBuf};

    fn dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/real/llama-server")
    }

    fn read_json(name: &str) -> Value {
        let text = std::fs::read_to_string(dir().join(name)).unwrap();
        serde_json::from_str(&text).unwrap()
    }

    /// The server's count of the whole prompt: timings' processed plus
    /// cached, or the count in its context-overflow error.
    fn server_count(row: &Value) -> Option<u64> {
        let name = row["name"].as_str()?;
        if let Some(t) = row["timings"].as_object() {
            return Some(t.get("prompt_n")?.as_u64()? + t.get("cache_n")?.as_u64()?);
        }
        let body = std::fs::read_to_string(dir().join(format!("{name}.response.txt"))).ok()?;
        serde_json::from_str::<Value>(&body).ok()?["error"]["n_prompt_tokens"].as_u64()
    }

    /// (name, raw estimate, server count) of every text body (no tool
    /// schemas: a template expands those) the server counted.
    fn bodies() -> Vec<(String, u64, u64)> {
        let index = read_json("index.json");
        let mut out: Vec<(String, u64, u64)> = index
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|row| {
                let name = row["name"].as_str()?.to_owned();
                let server = server_count(row)?;
                let request = read_json(&format!("{name}.request.json"));
                let body = request["body"].as_object()?;
                if body.contains_key("tools") {
                    return None;
                }
                let bytes = serde_json::to_vec(body).unwrap();
                Some((
                    name,
                    RequestFields::scan(&bytes).raw_prompt_tokens(),
                    server,
                ))
            })
            .collect();
        out.sort_by_key(|(name, raw, _)| (*raw, name.clone()));
        out
    }

    /// The one long body that is not prose: `"word "` repeated, a token
    /// per 5 bytes where prose averages about 4.
    const REPEATED_WORD: &str = "error_context_overflow_stream";

    #[test]
    fn the_prompt_estimate_is_within_a_tenth_on_long_prose_and_32_tokens_on_short_bodies() {
        let all = bodies();
        assert!(all.len() >= 15, "{} bodies", all.len());
        let mut fit = PromptFit::default();
        for (seen, (name, raw, server)) in all.iter().enumerate() {
            let estimate = fit.estimate(*raw);
            let error = estimate as f64 / *server as f64 - 1.0;
            println!(
                "{name}: raw {raw}, estimate {estimate}, server {server}, error {:+.1}%",
                error * 100.0
            );
            let bound = if name == REPEATED_WORD { 0.25 } else { 0.10 };
            if seen > 0 && *server >= LONG_FROM_RAW {
                assert!(error.abs() <= bound, "{name}: {estimate} for {server}");
            } else if seen > 0 {
                assert!(
                    estimate.abs_diff(*server) <= 32,
                    "{name}: {estimate} for {server}"
                );
            }
            fit.observe(*raw, *server);
        }
    }
}
