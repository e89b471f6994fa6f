//! A route's normal: what this route and model usually take to the first
//! token, learned from its own settled calls, so "slow" means slow for
//! here, not slower than a fixed number.
//!
//! Per (route, model) it keeps:
//! - the warm time to first token against prompt size: a least-squares
//!   line `ttft = base + ms_per_token * prompt_tokens` over exponentially
//!   decayed sums (recent calls weigh more, old hardware or settings fade
//!   out), load time excluded;
//! - the load time of cold starts (a decayed mean);
//! - the prefill rate the server reported (a decayed mean), which gives
//!   the slope when every call so far had the same prompt size;
//! - the prompt calibration factor: the server's prompt count over the
//!   request-body estimate, as the output calibration does for output.
//!
//! Pure and clock-free: the caller passes observations in.

use std::collections::{HashMap, HashSet};

/// Weight kept by the older observations at each new one.
const DECAY: f64 = 0.8;

/// Observations needed before the route's normal replaces the fixed
/// threshold.
pub const MIN_OBSERVATIONS: u64 = 3;

/// A prompt factor outside this band is a cut prompt or an odd body
/// (images), not a tokenizer difference: not learned.
const PROMPT_FACTOR_BAND: std::ops::RangeInclusive<f64> = 0.25..=4.0;

/// How the slow rule scales the normal: late is twice the usual, and at
/// least this much over it.
pub const SLOW_FACTOR: f64 = 2.0;
/// See [`SLOW_FACTOR`].
pub const SLOW_MARGIN_MS: u64 = 2_000;

/// A decayed mean.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Mean {
    weight: f64,
    sum: f64,
}

impl Mean {
    fn add(&mut self, x: f64) {
        self.weight = self.weight * DECAY + 1.0;
        self.sum = self.sum * DECAY + x;
    }

    fn get(&self) -> Option<f64> {
        (self.weight > 0.0).then(|| self.sum / self.weight)
    }
}

/// Decayed sums for a least-squares line.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Line {
    w: f64,
    x: f64,
    y: f64,
    xx: f64,
    xy: f64,
}

impl Line {
    fn add(&mut self, x: f64, y: f64) {
        self.w = self.w * DECAY + 1.0;
        self.x = self.x * DECAY + x;
        self.y = self.y * DECAY + y;
        self.xx = self.xx * DECAY + x * x;
        self.xy = self.xy * DECAY + x * y;
    }

    /// `(base, slope)`, or `None` without spread in x.
    fn fit(&self) -> Option<(f64, f64)> {
        if self.w <= 0.0 {
            return None;
        }
        let mx = self.x / self.w;
        let my = self.y / self.w;
        let sxx = self.xx / self.w - mx * mx;
        // Spread under 10% of the mean prompt: no honest slope.
        if sxx <= (0.1 * mx.max(1.0)).powi(2) {
            return None;
        }
        let slope = ((self.xy / self.w - mx * my) / sxx).max(0.0);
        Some((my - slope * mx, slope))
    }

    fn means(&self) -> Option<(f64, f64)> {
        (self.w > 0.0).then(|| (self.x / self.w, self.y / self.w))
    }
}

/// What one route and model usually do.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Normal {
    warm: Line,
    load: Mean,
    /// Server-reported prefill tokens per ms.
    prefill_per_ms: Mean,
    prompt_factor: Mean,
    /// Calls learned from.
    pub observations: u64,
}

/// One settled call, as the normal learns from it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Observation {
    /// Dispatch to first token.
    pub ttft_ms: u64,
    /// The prompt's size (the server's count where it gave one).
    pub prompt_tokens: Option<u64>,
    /// The model had to load for this call.
    pub cold: bool,
    /// How long the load took (the server's `load_duration`, or the time
    /// the model was seen loading).
    pub load_ms: Option<f64>,
    /// The server's prefill tokens and time.
    pub prefill: Option<(u64, f64)>,
    /// The uncalibrated request estimate and the server's prompt count,
    /// for the prompt factor.
    pub prompt_estimate: Option<(u64, u64)>,
}

impl Normal {
    fn observe(&mut self, o: &Observation) {
        let load = if o.cold {
            o.load_ms.unwrap_or(0.0)
        } else {
            0.0
        };
        if o.cold {
            if let Some(ms) = o.load_ms.filter(|ms| *ms > 0.0) {
                self.load.add(ms);
            }
        }
        let warm = (o.ttft_ms as f64 - load).max(0.0);
        self.warm.add(o.prompt_tokens.unwrap_or(0) as f64, warm);
        if let Some((n, ms)) = o.prefill.filter(|(n, ms)| *n >= 16 && *ms > 0.0) {
            self.prefill_per_ms.add(n as f64 / ms);
        }
        if let Some((raw, server)) = o.prompt_estimate.filter(|(raw, _)| *raw > 0) {
            let factor = server as f64 / raw as f64;
            if PROMPT_FACTOR_BAND.contains(&factor) {
                self.prompt_factor.add(factor);
            }
        }
        self.observations += 1;
    }

    /// The usual warm time to first token for `prompt_tokens`.
    pub fn warm_ttft_ms(&self, prompt_tokens: Option<u64>) -> Option<f64> {
        let x = prompt_tokens.map(|n| n as f64);
        if let (Some(x), Some((base, slope))) = (x, self.warm.fit()) {
            return Some((base + slope * x).max(0.0));
        }
        let (mx, my) = self.warm.means()?;
        match (x, self.prefill_per_ms.get()) {
            (Some(x), Some(rate)) if rate > 0.0 => Some((my + (x - mx) / rate).max(0.0)),
            (Some(x), _) if mx > 0.0 && x > mx => Some(my * x / mx),
            _ => Some(my),
        }
    }

    /// The usual load time of a cold start.
    pub fn load_ms(&self) -> Option<f64> {
        self.load.get()
    }

    /// Prefill speed in tokens per ms: the server's own figure, else the
    /// learned line's slope.
    pub fn prefill_tokens_per_ms(&self) -> Option<f64> {
        self.prefill_per_ms.get().filter(|r| *r > 0.0).or_else(|| {
            self.warm
                .fit()
                .and_then(|(_, slope)| (slope > 0.0).then(|| 1.0 / slope))
        })
    }
}

/// Every route's normals, by (route, model), and which of them already
/// raised the cut-prompt alarm.
#[derive(Clone, Debug, Default)]
pub struct Normals {
    map: HashMap<(String, String), Normal>,
    truncation_alarmed: HashSet<(String, String)>,
}

impl Normals {
    /// An empty table.
    pub fn new() -> Normals {
        Normals::default()
    }

    /// Learns from one settled call.
    pub fn observe(&mut self, route: &str, model: &str, o: &Observation) {
        self.map
            .entry((route.to_owned(), model.to_owned()))
            .or_default()
            .observe(o);
    }

    /// The normal of (route, model), if it has seen a call.
    pub fn get(&self, route: &str, model: &str) -> Option<&Normal> {
        self.map.get(&(route.to_owned(), model.to_owned()))
    }

    /// A request-body estimate (raw tokens) calibrated against the server's
    /// own prompt counts on this route and model.
    pub fn calibrated_prompt(&self, route: &str, model: &str, raw: u64) -> u64 {
        let factor = self
            .get(route, model)
            .and_then(|n| n.prompt_factor.get())
            .unwrap_or(1.0);
        (raw as f64 * factor).round() as u64
    }

    /// The usual time to first token for a call, with its load when it is
    /// a cold start: `None` until [`MIN_OBSERVATIONS`] calls were seen.
    pub fn usual_ttft_ms(
        &self,
        route: &str,
        model: &str,
        prompt_tokens: Option<u64>,
        cold: bool,
    ) -> Option<u64> {
        let n = self
            .get(route, model)
            .filter(|n| n.observations >= MIN_OBSERVATIONS)?;
        let warm = n.warm_ttft_ms(prompt_tokens)?;
        let load = if cold { n.load_ms()? } else { 0.0 };
        Some((warm + load).round() as u64)
    }

    /// The usual load time of (route, model), once one was seen.
    pub fn usual_load_ms(&self, route: &str, model: &str) -> Option<u64> {
        self.get(route, model)
            .and_then(Normal::load_ms)
            .map(|ms| ms.round() as u64)
    }

    /// The slow rule: a first token is late after twice the usual (and at
    /// least [`SLOW_MARGIN_MS`] over it, or `floor` over it when the fixed
    /// threshold is set lower than that margin: whoever asks for early
    /// warnings gets them); without history, after `floor`.
    /// Returns the limit and the usual it came from.
    pub fn slow_limit_ms(
        &self,
        route: &str,
        model: Option<&str>,
        prompt_tokens: Option<u64>,
        cold: bool,
        floor_ms: u64,
    ) -> (u64, Option<u64>) {
        let usual = model.and_then(|m| self.usual_ttft_ms(route, m, prompt_tokens, cold));
        match usual {
            Some(u) => {
                let margin = SLOW_MARGIN_MS.min(floor_ms);
                let limit = ((u as f64 * SLOW_FACTOR).round() as u64).max(u + margin);
                (limit, Some(u))
            }
            None => (floor_ms, None),
        }
    }

    /// True the first time (route, model) reports a cut prompt.
    pub fn first_truncation(&mut self, route: &str, model: &str) -> bool {
        self.truncation_alarmed
            .insert((route.to_owned(), model.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn warm(ttft_ms: u64, prompt: u64) -> Observation {
        Observation {
            ttft_ms,
            prompt_tokens: Some(prompt),
            ..Observation::default()
        }
    }

    #[test]
    fn the_normal_is_a_line_through_prompt_size_once_prompts_differ() {
        let mut n = Normals::new();
        // 200 ms + 1 ms per token.
        for p in [1_000, 2_000, 4_000, 8_000] {
            n.observe("r", "m", &warm(200 + p, p));
        }
        assert_eq!(n.usual_ttft_ms("r", "m", Some(12_000), false), Some(12_200));
        assert_eq!(n.usual_ttft_ms("r", "m", Some(0), false), Some(200));
        let rate = n.get("r", "m").unwrap().prefill_tokens_per_ms().unwrap();
        assert!((rate - 1.0).abs() < 1e-6, "{rate}");
        assert_eq!(n.usual_ttft_ms("r", "other", Some(10), false), None);
    }

    #[test]
    fn without_enough_history_the_fixed_floor_rules() {
        let mut n = Normals::new();
        n.observe("r", "m", &warm(1_000, 10));
        n.observe("r", "m", &warm(1_000, 10));
        assert_eq!(
            n.slow_limit_ms("r", Some("m"), Some(10), false, 5_000),
            (5_000, None)
        );
        n.observe("r", "m", &warm(1_000, 10));
        // Twice the usual, at least 2 s over it.
        assert_eq!(
            n.slow_limit_ms("r", Some("m"), Some(10), false, 5_000),
            (3_000, Some(1_000))
        );
        for _ in 0..3 {
            n.observe("r", "big", &warm(8_000, 10));
        }
        assert_eq!(
            n.slow_limit_ms("r", Some("big"), Some(10), false, 5_000),
            (16_000, Some(8_000))
        );
        // A threshold set below the margin narrows it.
        assert_eq!(
            n.slow_limit_ms("r", Some("m"), Some(10), false, 150),
            (2_000, Some(1_000))
        );
    }

    #[test]
    fn a_cold_start_adds_the_usual_load_time() {
        let mut n = Normals::new();
        for _ in 0..3 {
            n.observe("r", "m", &warm(500, 100));
        }
        n.observe(
            "r",
            "m",
            &Observation {
                ttft_ms: 4_500,
                prompt_tokens: Some(100),
                cold: true,
                load_ms: Some(4_000.0),
                ..Observation::default()
            },
        );
        assert_eq!(n.usual_load_ms("r", "m"), Some(4_000));
        assert_eq!(n.usual_ttft_ms("r", "m", Some(100), true), Some(4_500));
        assert_eq!(n.usual_ttft_ms("r", "m", Some(100), false), Some(500));
    }

    #[test]
    fn the_prompt_factor_learns_plausible_ratios_only() {
        let mut n = Normals::new();
        let with = |raw: u64, server: u64| Observation {
            ttft_ms: 100,
            prompt_estimate: Some((raw, server)),
            ..Observation::default()
        };
        n.observe("r", "m", &with(1_000, 1_200));
        // A cut prompt (ratio 0.1) teaches nothing.
        n.observe("r", "m", &with(10_000, 1_000));
        assert_eq!(n.calibrated_prompt("r", "m", 5_000), 6_000);
        assert_eq!(n.calibrated_prompt("r", "x", 5_000), 5_000);
    }

    #[test]
    fn the_truncation_alarm_is_once_per_route_and_model() {
        let mut n = Normals::new();
        assert!(n.first_truncation("r", "m"));
        assert!(!n.first_truncation("r", "m"));
        assert!(n.first_truncation("r", "n"));
        assert!(n.first_truncation("s", "m"));
    }
}
