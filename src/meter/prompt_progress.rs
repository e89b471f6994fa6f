//! The wait of a call whose server streams its own prefill progress
//! (llama.cpp `prompt_progress`, when the request set `return_progress`):
//! the server's exact counts, which win over any poll of `/slots` and
//! over speedtap's estimate (`docs/metering.md`, "Why a call waits").
//!
//! Pure: the figures come from the chunk alone. The server's own prefill
//! clock (`time_ms`) gives the rate, so the ETA needs no clock of ours.

use crate::decode::PromptProgress;
use crate::model::{ProgressSource, Wait, WaitReason};

/// The wait a `prompt_progress` reading explains: prefilling, processed
/// over total, the prompt's size, and the time left at the rate the
/// server has processed the uncached part so far (absent before it has
/// processed any).
pub fn in_band_wait(p: &PromptProgress) -> Wait {
    let processed = p.processed.min(p.total);
    let timed = processed.saturating_sub(p.cache);
    let rate = (p.time_ms > 0.0 && timed > 0).then(|| timed as f64 / p.time_ms);
    let left = (p.total - processed) as f64;
    Wait {
        progress: (p.total > 0).then(|| round3(processed as f64 / p.total as f64)),
        eta_ms: rate.map(|r| (left / r).round() as u64),
        prompt_tokens: Some(p.total),
        progress_source: Some(ProgressSource::Stream),
        ..Wait::new(WaitReason::Prefilling)
    }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(total: u64, cache: u64, processed: u64, time_ms: f64) -> PromptProgress {
        PromptProgress {
            total,
            cache,
            processed,
            time_ms,
        }
    }

    #[test]
    fn a_reading_gives_the_servers_progress_and_the_time_left_at_its_own_rate() {
        // 1,000 of 4,000 tokens in 2 s: 0.5 tokens a ms, 3,000 left.
        let w = in_band_wait(&reading(4_000, 0, 1_000, 2_000.0));
        assert_eq!(w.reason, WaitReason::Prefilling);
        assert_eq!(w.progress, Some(0.25));
        assert_eq!(w.eta_ms, Some(6_000));
        assert_eq!(w.prompt_tokens, Some(4_000));
        assert_eq!(w.progress_source, Some(ProgressSource::Stream));
    }

    #[test]
    fn cached_tokens_count_as_done_but_not_in_the_rate() {
        // 2,000 cached, 500 more processed in 1 s: 1,500 left at 0.5/ms.
        let w = in_band_wait(&reading(4_000, 2_000, 2_500, 1_000.0));
        assert_eq!(w.progress, Some(0.625));
        assert_eq!(w.eta_ms, Some(3_000));
    }

    #[test]
    fn a_finished_prefill_reads_done_and_a_first_reading_has_no_eta() {
        let done = in_band_wait(&reading(1_553, 0, 1_553, 10_300.0));
        assert_eq!((done.progress, done.eta_ms), (Some(1.0), Some(0)));
        let first = in_band_wait(&reading(1_553, 0, 0, 0.0));
        assert_eq!((first.progress, first.eta_ms), (Some(0.0), None));
    }
}
