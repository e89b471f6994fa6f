//! Token estimation for streamed text.
//!
//! The default estimator is tiktoken's `o200k_base`. Its BPE tables take a
//! noticeable moment to build and hold about 30 MB, more than the rest of an
//! idle `speedtap run`, so they are built once, when the first metered call
//! is dispatched ([`TokenEstimator::prepare`], on a thread of their own), and
//! shared by every thread: `CoreBPE` is `Sync` and tiktoken-rs keeps one
//! process-wide instance. A speedtap that never sees a call never pays for
//! them. The first call loses nothing: the tables build while it waits for
//! its first token, a count asked for before they are ready waits for them
//! on the metering thread (never the proxy's), and every time the meter
//! uses was stamped on the frame's arrival, so a wait can delay the first
//! snapshot but never change a figure.
//!
//! The meters take an `Arc<dyn TokenEstimator>` so tests can count with a
//! rule they can compute by hand ([`WordCounter`]) and stay exact.

use std::sync::{Arc, Once};

/// Counts the tokens in a piece of text.
///
/// Implementations must be cheap to share across threads and must not
/// retain the text: callers pass prompt and completion text that speedtap
/// never stores.
pub trait TokenEstimator: Send + Sync {
    /// The number of tokens `text` encodes to.
    fn count_tokens(&self, text: &str) -> u64;

    /// A call that will be counted has started: load whatever the
    /// estimator builds lazily, off the caller's thread, so the first count
    /// finds it ready. Cheap after the first time; never blocks.
    fn prepare(&self) {}
}

/// tiktoken `o200k_base`, the tokenizer of current OpenAI models and a fair
/// proxy for local ones until route calibration corrects the drift.
#[derive(Clone, Copy, Debug, Default)]
pub struct O200kEstimator;

impl O200kEstimator {
    /// Builds the BPE tables now, on this thread, instead of on first use.
    pub fn warm_up() {
        let _ = tiktoken_rs::o200k_base_singleton();
    }

    /// Builds the BPE tables on a thread of their own, once per process.
    pub fn warm_up_in_background() {
        static STARTED: Once = Once::new();
        STARTED.call_once(|| {
            let spawned = std::thread::Builder::new()
                .name("speedtap-tokenizer".into())
                .spawn(Self::warm_up);
            // No thread to spare: the first count builds the tables itself.
            if let Err(e) = spawned {
                tracing::warn!("tokenizer: could not start its loader thread: {e}");
            }
        });
    }
}

impl TokenEstimator for O200kEstimator {
    fn count_tokens(&self, text: &str) -> u64 {
        if text.is_empty() {
            return 0;
        }
        // `encode_ordinary`: streamed output is plain text; special-token
        // spellings in it are counted as text, which is what they cost.
        tiktoken_rs::o200k_base_singleton()
            .encode_ordinary(text)
            .len() as u64
    }

    fn prepare(&self) {
        Self::warm_up_in_background();
    }
}

/// Counts whitespace-separated words: a deterministic estimator for tests
/// and for the scripted upstream, whose "tokens" are words.
#[derive(Clone, Copy, Debug, Default)]
pub struct WordCounter;

impl TokenEstimator for WordCounter {
    fn count_tokens(&self, text: &str) -> u64 {
        text.split_whitespace().count() as u64
    }
}

/// The estimator speedtap uses unless told otherwise.
pub fn default_estimator() -> Arc<dyn TokenEstimator> {
    Arc::new(O200kEstimator)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn o200k_counts_known_text() {
        let e = O200kEstimator;
        assert_eq!(e.count_tokens(""), 0);
        assert_eq!(e.count_tokens("hello"), 1);
        assert_eq!(e.count_tokens("hello world"), 2);
        // A longer sentence tokenizes to fewer tokens than characters.
        let n = e.count_tokens("The quick brown fox jumps over the lazy dog.");
        assert!((8..=12).contains(&n), "{n}");
    }

    #[test]
    fn o200k_is_usable_from_many_threads() {
        let handles: Vec<_> = (0..4)
            .map(|_| std::thread::spawn(|| O200kEstimator.count_tokens("hello world")))
            .collect();
        for h in handles {
            assert_eq!(h.join().unwrap(), 2);
        }
    }

    #[test]
    fn word_counter_counts_words() {
        assert_eq!(WordCounter.count_tokens(" a b  c\n"), 3);
        assert_eq!(WordCounter.count_tokens(""), 0);
    }
}
