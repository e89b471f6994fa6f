//! How fast one call's prompt is taken in, as far as the looks at its
//! server slot can tell.
//!
//! A llama-server advances a slot's processed count a batch at a time,
//! and speedtap looks at it only every second or two (spaced to leave the
//! server's keep-alive pings alone, [`super::pace`]). When the looks come
//! slower than the batches their timing aliases: on the real server,
//! looks 1.5 s apart at batches of about 1.03 s each saw exactly one more
//! batch for three looks running, which reads as a rate a third too slow,
//! and the ETA taken from it missed by 2.7 s of a 7.8 s wait.
//!
//! So each look is kept as a bracket. At that instant the prompt taken in
//! lay between the count done and the end of the batch under way: the
//! count taken in, on the servers that show it, else done plus the
//! smallest step seen between two looks (a step is one batch or more).
//! Any two looks bound the rate from both sides, and the intersection of
//! every pair is what the looks can tell. [`PrefillLooks::rate`] picks
//! within it: the route's learned rate when there is one (the nearest
//! bound when the looks rule it out), else the middle once the bounds are
//! within a third of it. Wider than that, there is no rate: an ETA the
//! looks cannot support is absent, not guessed.

use tokio::time::Instant;

/// At most this many looks are kept: the first, and the latest after it.
/// The pace spaces looks out as a call waits, so a long prefill takes
/// few; the cap holds memory and the pairwise bounds to a fixed size.
const KEPT_LOOKS: usize = 32;

/// The rate without a learned one needs the bounds within this fraction
/// of their middle: `hi − lo ≤ 2 × TIGHT × (hi + lo) / 2`.
const TIGHT: f64 = 1.0 / 3.0;

/// One look at the call's slot task.
#[derive(Clone, Copy, Debug)]
struct Look {
    at: Instant,
    /// `n_prompt_tokens_processed`: batches finished.
    done: u64,
    /// `n_prompt_tokens`: the prompt (older servers) or what was taken in
    /// so far, the batch under way included (newer ones).
    taken_in: u64,
}

/// The looks at one call's prefill, and the rate they allow.
#[derive(Clone, Debug, Default)]
pub struct PrefillLooks {
    looks: Vec<Look>,
    /// The smallest rise of the count between two looks: at least one
    /// batch, so no batch is larger.
    min_step: Option<u64>,
}

impl PrefillLooks {
    /// Takes one look: `done` and `taken_in` as the slot showed them.
    pub fn record(&mut self, at: Instant, done: u64, taken_in: u64) {
        if let Some(prev) = self.looks.last() {
            if done > prev.done {
                let step = done - prev.done;
                self.min_step = Some(self.min_step.map_or(step, |s| s.min(step)));
            }
        }
        if self.looks.len() == KEPT_LOOKS {
            self.looks.remove(1);
        }
        self.looks.push(Look { at, done, taken_in });
    }

    /// The ms until the prompt of `total` tokens is all taken in, at
    /// `rate` tokens a ms from `now`. Where the prompt stood at the latest
    /// look is where every look, moved on at `rate`, says it could have
    /// stood: the middle of that, or the count itself while the end of
    /// the batch under way is unknown. None before any look, or at no
    /// pace (looks whose count went back bound the rate at 0).
    pub fn eta_ms(&self, total: u64, rate: f64, now: Instant) -> Option<u64> {
        if rate.is_nan() || rate <= 0.0 {
            return None;
        }
        let latest = self.looks.last()?;
        let ms_since = |at: Instant| latest.at.saturating_duration_since(at).as_millis() as f64;
        let (mut lo, mut hi) = (f64::MIN, f64::MAX);
        for look in &self.looks {
            let moved = rate * ms_since(look.at);
            lo = lo.max(look.done as f64 + moved);
            hi = hi.min(self.batch_end(look, total) as f64 + moved);
        }
        let own = (latest.done as f64, self.batch_end(latest, total) as f64);
        let (lo, hi) = if lo < hi { (lo, hi) } else { own };
        let stood = if hi < total as f64 {
            (lo + hi) / 2.0
        } else {
            lo
        };
        let since = now.saturating_duration_since(latest.at).as_millis() as f64;
        let left = (total as f64 - stood) / rate - since;
        Some(left.max(0.0).round() as u64)
    }

    /// The rate in tokens per ms for a prompt of `total` tokens: within
    /// the looks' bounds, `learned` when given (clamped into them), else
    /// their middle once they are tight; `learned` alone before two
    /// looks.
    pub fn rate(&self, total: u64, learned: Option<f64>) -> Option<f64> {
        let Some((lo, hi)) = self.bounds(total) else {
            return learned;
        };
        match learned {
            Some(rate) => Some(rate.clamp(lo, hi)),
            None => (hi - lo <= TIGHT * (hi + lo) && hi > 0.0).then_some((lo + hi) / 2.0),
        }
    }

    /// The tightest `(lo, hi)` tokens per ms every pair of looks allows,
    /// or the first and latest look's alone when the pairs disagree (the
    /// pace changed: a busy machine). None before two looks apart in time.
    fn bounds(&self, total: u64) -> Option<(f64, f64)> {
        let first = self.looks.first()?;
        let latest = self.looks.last()?;
        let widest = self.pair(first, latest, total)?;
        let mut tightest = widest;
        for (i, a) in self.looks.iter().enumerate() {
            for b in &self.looks[i + 1..] {
                if let Some((lo, hi)) = self.pair(a, b, total) {
                    tightest = (tightest.0.max(lo), tightest.1.min(hi));
                }
            }
        }
        Some(if tightest.0 <= tightest.1 {
            tightest
        } else {
            widest
        })
    }

    /// The rates two looks allow: from the least the prompt could have
    /// gained between them to the most.
    fn pair(&self, a: &Look, b: &Look, total: u64) -> Option<(f64, f64)> {
        let ms = b.at.saturating_duration_since(a.at).as_millis() as f64;
        if ms <= 0.0 {
            return None;
        }
        let least = b.done.saturating_sub(self.batch_end(a, total));
        let most = self.batch_end(b, total).saturating_sub(a.done);
        Some((least as f64 / ms, most as f64 / ms))
    }

    /// The most the prompt could have been taken in at a look: the end of
    /// the batch under way, where the slot shows it, else one step past
    /// the count, else the whole prompt.
    fn batch_end(&self, look: &Look, total: u64) -> u64 {
        let shown = look.taken_in > look.done && look.taken_in < total;
        if shown {
            return look.taken_in;
        }
        self.min_step
            .map_or(total, |step| look.done.saturating_add(step))
            .min(total)
            .max(look.done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn ms(t0: Instant, n: u64) -> Instant {
        t0 + Duration::from_millis(n)
    }

    #[test]
    fn looks_slower_than_the_batches_give_no_rate_until_they_agree() {
        // The real server's case: 256-token batches of about 1.03 s, a
        // 1,888-token prompt, looks 1.5 s apart that each saw one more
        // batch. The first-to-latest rate (512 tokens in 3 s) was a third
        // too slow; the bounds say 85 to 256 tokens a second, too wide.
        let t0 = Instant::now();
        let mut looks = PrefillLooks::default();
        looks.record(ms(t0, 934), 256, 512);
        looks.record(ms(t0, 2_436), 512, 768);
        looks.record(ms(t0, 3_939), 768, 1_024);
        let (lo, hi) = looks.bounds(1_888).expect("bounds");
        assert!((lo * 1e3 - 85.2).abs() < 0.1, "{lo}");
        assert!((hi * 1e3 - 255.6).abs() < 0.1, "{hi}");
        assert_eq!(looks.rate(1_888, None), None);
        // Two batches later they are within a third of their middle: the
        // real pace (about 248 a second) lies inside, the middle 205.
        looks.record(ms(t0, 5_911), 1_280, 1_536);
        let rate = looks.rate(1_888, None).expect("a rate");
        assert!((rate * 1e3 - 204.9).abs() < 0.1, "{rate}");
        // At that rate every look puts the prompt at 1,280 to 1,428 tokens
        // when the latest was taken: from the middle, 534 tokens are left,
        // 2.6 s. (The prompt was done 1.91 s later; counting from the
        // 1,280 the slot showed would say 2.96 s.)
        assert_eq!(looks.eta_ms(1_888, rate, ms(t0, 5_911)), Some(2_605));
        assert_eq!(looks.eta_ms(1_888, rate, ms(t0, 6_911)), Some(1_605));
    }

    #[test]
    fn a_learned_rate_inside_the_bounds_is_taken_and_one_outside_is_clamped() {
        let t0 = Instant::now();
        let mut looks = PrefillLooks::default();
        looks.record(ms(t0, 934), 256, 512);
        looks.record(ms(t0, 2_436), 512, 768);
        looks.record(ms(t0, 3_939), 768, 1_024);
        assert_eq!(looks.rate(1_888, Some(0.25)), Some(0.25));
        let clamped = looks.rate(1_888, Some(0.5)).expect("a rate");
        assert!((clamped - 768.0 / 3_005.0).abs() < 1e-9, "{clamped}");
        // Before two looks the learned rate stands alone.
        let mut one = PrefillLooks::default();
        one.record(t0, 0, 256);
        assert_eq!(one.rate(1_888, Some(0.3)), Some(0.3));
        assert_eq!(one.rate(1_888, None), None);
    }

    #[test]
    fn a_first_look_that_caught_a_batch_under_way_bounds_nothing_from_below() {
        // Two looks 82 ms apart saw 0 then 256 of a batch of about 1.6 s:
        // the least the pair allows is nothing, the most 6 tokens a ms.
        let t0 = Instant::now();
        let mut looks = PrefillLooks::default();
        looks.record(ms(t0, 10), 0, 256);
        looks.record(ms(t0, 92), 256, 512);
        let (lo, hi) = looks.bounds(2_000).expect("bounds");
        assert_eq!(lo, 0.0);
        assert!(hi > 6.0);
        assert_eq!(looks.rate(2_000, None), None);
    }

    #[test]
    fn on_a_server_showing_the_whole_prompt_the_smallest_step_bounds_the_batch() {
        // Older servers put the whole prompt in n_prompt_tokens: the batch
        // under way is unknown until the count moves, and then no batch
        // is larger than its smallest rise.
        let t0 = Instant::now();
        let mut looks = PrefillLooks::default();
        looks.record(ms(t0, 0), 0, 4_000);
        looks.record(ms(t0, 1_000), 500, 4_000);
        assert_eq!(looks.batch_end(&looks.looks[0], 4_000), 500);
        for (i, done) in [1_000, 1_500, 2_000, 2_500].into_iter().enumerate() {
            looks.record(ms(t0, 2_000 + i as u64 * 1_000), done, 4_000);
        }
        // Six looks a second apart, a batch of 500 each: 0.5 a ms.
        let rate = looks.rate(4_000, None).expect("a rate");
        assert!((rate - 0.5).abs() < 0.1, "{rate}");
    }

    #[test]
    fn a_pace_that_changes_midway_falls_back_to_the_first_and_latest_looks() {
        // A machine that got busy: 500 tokens a second, then 100.
        let t0 = Instant::now();
        let mut looks = PrefillLooks::default();
        for i in 0..5 {
            looks.record(ms(t0, i * 1_000), i * 500, i * 500 + 100);
        }
        for i in 1..5 {
            looks.record(ms(t0, 4_000 + i * 1_000), 2_000 + i * 100, 2_100 + i * 100);
        }
        let (lo, hi) = looks.bounds(10_000).expect("bounds");
        assert!(lo <= hi);
        let (first, latest) = (looks.looks[0], *looks.looks.last().unwrap());
        assert_eq!(Some((lo, hi)), looks.pair(&first, &latest, 10_000));
    }

    #[test]
    fn a_count_that_went_back_gives_no_eta_rather_than_an_endless_one() {
        let t0 = Instant::now();
        let mut looks = PrefillLooks::default();
        looks.record(t0, 512, 768);
        looks.record(ms(t0, 1_000), 0, 256);
        let rate = looks.rate(2_000, Some(0.3)).expect("clamped");
        assert_eq!(rate, 0.0);
        assert_eq!(looks.eta_ms(2_000, rate, ms(t0, 1_000)), None);
    }

    #[test]
    fn only_the_first_and_the_latest_looks_are_kept_past_the_cap() {
        let t0 = Instant::now();
        let mut looks = PrefillLooks::default();
        for i in 0..100 {
            looks.record(ms(t0, i * 100), i * 10, i * 10 + 10);
        }
        assert_eq!(looks.looks.len(), KEPT_LOOKS);
        assert_eq!(looks.looks[0].done, 0);
        assert_eq!(looks.looks.last().unwrap().done, 990);
    }
}
