//! A route's normal: what this route and model usually take to the first
//! token, learned from its own settled calls, so "slow" means slow for
//! here, not slower than a fixed number.
//!
//! Per (route, model) it keeps:
//! - the warm time to first token against prompt size: a least-squares
//!   line `ttft = base + ms_per_token * prompt_tokens` over exponentially
//!   decayed sums (recent calls weigh more, old hardware or settings fade
//!   out), from calls that were neither queued nor cold only, so one busy
//!   hour or a run of loads can't raise it;
//! - the load time of cold starts (a decayed mean), and the server's
//!   `load_duration` on warm starts (what "no load" looks like);
//! - the queue wait per call ahead, from queued calls;
//! - the prefill rate the server reported (a decayed mean) for prompts of
//!   at least [`MIN_PREFILL_TOKENS`], which gives the slope when every
//!   call so far had the same prompt size, and the prefill ETAs;
//! - the prompt calibration: the server's prompt count against the
//!   request-body estimate, a fixed overhead plus a per-token factor
//!   ([`super::prompt_fit`]).
//!
//! Pure and clock-free: the caller passes observations in.

use std::collections::{HashMap, HashSet};

use super::prompt_fit::PromptFit;

/// Weight kept by the older observations at each new one.
const DECAY: f64 = 0.8;

/// Observations needed before the route's normal replaces the fixed
/// threshold.
pub const MIN_OBSERVATIONS: u64 = 3;

/// How the slow rule scales the normal: late is twice the usual, and at
/// least this much over it.
pub const SLOW_FACTOR: f64 = 2.0;
/// See [`SLOW_FACTOR`].
pub const SLOW_MARGIN_MS: u64 = 2_000;

/// A warm start's `load_duration` may exceed its normal by this much
/// before it counts as a load (Ollama reports a few ms when warm).
pub const LOAD_MARGIN_MS: f64 = 250.0;

/// The shortest prompt whose server-reported prefill rate is learned (and
/// enters History's prefill figure): a short prompt's rate is mostly the
/// server's fixed overhead (33 tok/s on 30 tokens where 4,000 ran at
/// 3,352), which would stretch a long prompt's usual and its ETA a
/// hundredfold.
pub const MIN_PREFILL_TOKENS: u64 = 512;

/// What a waiting call is known to wait for, for the slow rule.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Waited {
    /// The model loads for it.
    pub cold: bool,
    /// It queued, with this many calls ahead at most.
    pub queue_position: Option<u32>,
}

/// The slow rule's answer: the limit, and the usual it came from (absent
/// without history).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlowLimit {
    pub limit_ms: u64,
    pub usual_ms: Option<u64>,
}

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
    /// The server's `load_duration` on warm starts.
    warm_load: Mean,
    /// Queue wait per call ahead, in ms.
    queue_per_place: Mean,
    /// Calls that taught the warm line (neither queued nor cold).
    pub warm_observations: u64,
    /// Server-reported prefill tokens per ms.
    prefill_per_ms: Mean,
    prompt: PromptFit,
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
    /// The call waited in the server's queue: for how long (ms) and the
    /// most calls ahead of it.
    pub queued: Option<(u64, u32)>,
    /// The uncalibrated request estimate and the server's prompt count,
    /// for the prompt calibration.
    pub prompt_estimate: Option<(u64, u64)>,
}

impl Normal {
    /// Learns each part of the call against its own normal: a load
    /// teaches the load time, a queue wait the wait per call ahead, and
    /// only a call that was neither queued nor cold the warm line.
    fn observe(&mut self, o: &Observation) {
        let load = o.load_ms.filter(|ms| *ms >= 0.0);
        match (o.cold, load) {
            (true, Some(ms)) if ms > 0.0 => self.load.add(ms),
            (false, Some(ms)) => self.warm_load.add(ms),
            _ => {}
        }
        if let Some((ms, place)) = o.queued.filter(|(_, place)| *place > 0) {
            self.queue_per_place.add(ms as f64 / place as f64);
        }
        if !o.cold && o.queued.is_none() {
            self.warm
                .add(o.prompt_tokens.unwrap_or(0) as f64, o.ttft_ms as f64);
            self.warm_observations += 1;
        }
        if let Some((n, ms)) = o
            .prefill
            .filter(|(n, ms)| *n >= MIN_PREFILL_TOKENS && *ms > 0.0)
        {
            self.prefill_per_ms.add(n as f64 / ms);
        }
        if let Some((raw, server)) = o.prompt_estimate {
            self.prompt.observe(raw, server);
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

    /// The usual `load_duration` of a warm start.
    pub fn warm_load_ms(&self) -> Option<f64> {
        self.warm_load.get()
    }

    /// The usual queue wait per call ahead.
    pub fn queue_ms_per_place(&self) -> Option<f64> {
        self.queue_per_place.get()
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
    /// own prompt counts on this route and model: its overhead plus its
    /// per-token factor times `raw` (uncalibrated: `raw`).
    pub fn calibrated_prompt(&self, route: &str, model: &str, raw: u64) -> u64 {
        self.get(route, model)
            .map_or(raw, |n| n.prompt.estimate(raw))
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
            .filter(|n| n.warm_observations >= MIN_OBSERVATIONS)?;
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

    /// Whether a server-reported `load_duration` is a load: above the
    /// model's warm normal (twice it, and at least [`LOAD_MARGIN_MS`]
    /// over it). `None` until warm starts of the model were seen.
    pub fn is_load(&self, route: &str, model: &str, load_ms: f64) -> Option<bool> {
        let warm = self.get(route, model)?.warm_load_ms()?;
        Some(load_ms > (warm * SLOW_FACTOR).max(warm + LOAD_MARGIN_MS))
    }

    /// The slow rule, each cause against its own normal: the warm part
    /// against the route's usual for the prompt size (without
    /// [`MIN_OBSERVATIONS`] warm calls, `floor_ms`), a load against this
    /// model's past loads, a queue wait against the calls ahead (the
    /// learned wait per call ahead; without one, each call ahead allows
    /// the warm part again). Each part is late after twice its usual, and
    /// at least [`SLOW_MARGIN_MS`] over it (or `floor_ms` over it when the
    /// fixed threshold is set lower: whoever asks for early warnings gets
    /// them).
    pub fn slow_limit(
        &self,
        route: &str,
        model: Option<&str>,
        prompt_tokens: Option<u64>,
        waited: &Waited,
        floor_ms: u64,
    ) -> SlowLimit {
        let margin = SLOW_MARGIN_MS.min(floor_ms);
        let late = |u: u64| ((u as f64 * SLOW_FACTOR).round() as u64).max(u + margin);
        let normal = model.and_then(|m| self.get(route, m));
        let warm = model.and_then(|m| self.usual_ttft_ms(route, m, prompt_tokens, false));
        let mut limit = warm.map_or(floor_ms, late);
        let mut usual = warm;
        let load = normal.and_then(Normal::load_ms).map(|ms| ms.round() as u64);
        if let (true, Some(load)) = (waited.cold, load) {
            limit += late(load);
            usual = usual.map(|u| u + load);
        }
        if let Some(place) = waited.queue_position.filter(|p| *p > 0) {
            let per = normal.and_then(Normal::queue_ms_per_place);
            match per {
                Some(per) => {
                    let queue = (per * place as f64).round() as u64;
                    limit += late(queue);
                    usual = usual.map(|u| u + queue);
                }
                None => limit += warm.map_or(floor_ms, late) * place as u64,
            }
        }
        SlowLimit {
            limit_ms: limit,
            usual_ms: usual,
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

    /// The warm slow rule for a 10-token prompt, as `(limit, usual)`.
    fn limit(n: &Normals, model: &str, floor: u64) -> (u64, Option<u64>) {
        let l = n.slow_limit("r", Some(model), Some(10), &Waited::default(), floor);
        (l.limit_ms, l.usual_ms)
    }

    fn cold(ttft_ms: u64, load_ms: f64) -> Observation {
        Observation {
            ttft_ms,
            prompt_tokens: Some(10),
            cold: true,
            load_ms: Some(load_ms),
            ..Observation::default()
        }
    }

    #[test]
    fn calls_that_queued_or_loaded_never_raise_the_usual_time_to_first_token() {
        let mut n = Normals::new();
        for _ in 0..3 {
            n.observe("r", "m", &warm(900, 10));
        }
        // A busy hour: queue waits of 8 s and two loads.
        for _ in 0..10 {
            n.observe(
                "r",
                "m",
                &Observation {
                    queued: Some((8_000, 2)),
                    ..warm(8_900, 10)
                },
            );
        }
        n.observe("r", "m", &cold(7_900, 7_000.0));
        n.observe("r", "m", &cold(7_900, 7_000.0));
        assert_eq!(n.usual_ttft_ms("r", "m", Some(10), false), Some(900));
        assert_eq!(limit(&n, "m", 5_000), (2_900, Some(900)));
        let normal = n.get("r", "m").unwrap();
        assert_eq!(normal.warm_observations, 3);
        let per_place = normal.queue_ms_per_place().unwrap();
        assert!((per_place - 4_000.0).abs() < 1e-6, "{per_place}");
        assert_eq!(n.usual_load_ms("r", "m"), Some(7_000));
    }

    #[test]
    fn a_load_is_judged_against_past_loads_of_the_model_and_a_queue_against_its_place() {
        let mut n = Normals::new();
        // Loads of 7 s, and no warm history yet: the fixed 5 s floor
        // stands for the warm part only.
        n.observe("r", "m", &cold(7_500, 7_000.0));
        let loading = Waited {
            cold: true,
            queue_position: None,
        };
        let l = n.slow_limit("r", Some("m"), Some(10), &loading, 5_000);
        assert_eq!(
            l.limit_ms,
            5_000 + 14_000,
            "a load of 7 s is not slow at 5 s"
        );
        // With a warm normal of 900 ms, the usual is the load plus it.
        for _ in 0..3 {
            n.observe("r", "m", &warm(900, 10));
        }
        let l = n.slow_limit("r", Some("m"), Some(10), &loading, 5_000);
        assert_eq!((l.limit_ms, l.usual_ms), (2_900 + 14_000, Some(7_900)));
        // Third in a queue, without a learned queue normal: each call
        // ahead allows the warm limit again.
        let third = Waited {
            cold: false,
            queue_position: Some(3),
        };
        let l = n.slow_limit("r", Some("m"), Some(10), &third, 5_000);
        assert_eq!(l.limit_ms, 2_900 * 4);
        // Learned: 4 s per call ahead; 12 s ahead of the third is usual.
        n.observe(
            "r",
            "m",
            &Observation {
                queued: Some((8_000, 2)),
                ..warm(8_900, 10)
            },
        );
        let l = n.slow_limit("r", Some("m"), Some(10), &third, 5_000);
        assert_eq!((l.limit_ms, l.usual_ms), (2_900 + 24_000, Some(12_900)));
    }

    #[test]
    fn a_load_duration_is_a_load_only_above_the_warm_normal() {
        let mut n = Normals::new();
        assert_eq!(
            n.is_load("r", "m", 3_000.0),
            None,
            "no warm normal: no verdict"
        );
        for _ in 0..3 {
            n.observe(
                "r",
                "m",
                &Observation {
                    load_ms: Some(20.0),
                    ..warm(900, 10)
                },
            );
        }
        assert_eq!(n.is_load("r", "m", 200.0), Some(false));
        assert_eq!(n.is_load("r", "m", 401.0), Some(true));
    }

    #[test]
    fn without_enough_history_the_fixed_floor_rules() {
        let mut n = Normals::new();
        n.observe("r", "m", &warm(1_000, 10));
        n.observe("r", "m", &warm(1_000, 10));
        assert_eq!(limit(&n, "m", 5_000), (5_000, None));
        n.observe("r", "m", &warm(1_000, 10));
        // Twice the usual, at least 2 s over it.
        assert_eq!(limit(&n, "m", 5_000), (3_000, Some(1_000)));
        for _ in 0..3 {
            n.observe("r", "big", &warm(8_000, 10));
        }
        assert_eq!(limit(&n, "big", 5_000), (16_000, Some(8_000)));
        // A threshold set below the margin narrows it.
        assert_eq!(limit(&n, "m", 150), (2_000, Some(1_000)));
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
    fn the_prompt_calibration_learns_plausible_counts_only() {
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
    fn short_prompts_teach_no_prefill_rate_and_a_long_prefill_is_judged_against_its_size() {
        let mut n = Normals::new();
        // Three 30-token questions: 33 tok/s by the server's timings, all
        // fixed overhead.
        for _ in 0..3 {
            n.observe(
                "r",
                "m",
                &Observation {
                    prefill: Some((30, 909.0)),
                    ..warm(900, 30)
                },
            );
        }
        let normal = n.get("r", "m").unwrap();
        assert_eq!(normal.prefill_tokens_per_ms(), None);
        // A 4,000-token document at 3,352 tok/s.
        n.observe(
            "r",
            "m",
            &Observation {
                prefill: Some((4_000, 4_000.0 / 3.352)),
                ..warm(1_300, 4_000)
            },
        );
        let rate = n.get("r", "m").unwrap().prefill_tokens_per_ms().unwrap();
        assert!((rate - 3.352).abs() < 1e-9, "{rate}");

        // Same-size prompts: the slope is the server's rate, so a prompt
        // three times as long is allowed its longer prefill.
        let mut n = Normals::new();
        for _ in 0..3 {
            n.observe(
                "r",
                "m",
                &Observation {
                    prefill: Some((4_000, 4_000.0 / 3.352)),
                    ..warm(1_300, 4_000)
                },
            );
        }
        let judged = |tokens: u64| {
            let l = n.slow_limit("r", Some("m"), Some(tokens), &Waited::default(), 5_000);
            (l.limit_ms, l.usual_ms)
        };
        // 1,300 ms + 8,000 tokens at 3.352 per ms = 3,687 ms.
        assert_eq!(judged(12_000), (7_374, Some(3_687)));
        assert_eq!(judged(4_000), (3_300, Some(1_300)));
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
