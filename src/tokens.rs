//! Token estimation for streamed text.
//!
//! The default estimator is tiktoken's `o200k_base`. Its BPE tables take a
//! noticeable moment to build and hold about 30 MB, more than the rest of an
//! idle `speedtap run`, so they are built when the first metered call is
//! dispatched ([`TokenEstimator::prepare`], on a thread of their own), and
//! shared by every thread (`CoreBPE` is `Sync`). A speedtap that never
//! sees a call never pays for them. The first call loses nothing: the
//! tables build while it waits for its first token, a count asked for
//! before they are ready waits for them on the metering thread (never the
//! proxy's), and every time the meter uses was stamped on the frame's
//! arrival, so a wait can delay the first snapshot but never change a
//! figure.
//!
//! They are also let go: [`IDLE_RELEASE`] (10 minutes) after the last
//! count or dispatch, a thread of theirs drops them, so a tray app idle
//! for days doesn't hold them. The next call builds them again exactly as
//! the first did, its live estimate included. While they are loaded that
//! thread wakes once per idle period at most; once they are gone it is gone
//! too. With them go the freed heap and the pages of speedtap's program
//! the calls read, the vocabulary embedded in it among them
//! ([`give_back`]). The rule is pure ([`Tables::release_if_idle`] takes `now`), so it
//! is tested with instants the test makes, never a 10-minute wait.
//!
//! The meters take an `Arc<dyn TokenEstimator>` so tests can count with a
//! rule they can compute by hand ([`WordCounter`]) and stay exact.

mod give_back;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tiktoken_rs::CoreBPE;

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

/// How long the tokenizer's tables stay loaded after their last use.
pub const IDLE_RELEASE: Duration = Duration::from_secs(10 * 60);

/// Something built on first use and dropped after [`IDLE_RELEASE`] unused:
/// the state behind [`O200kEstimator`], generic so its rule is tested with
/// a cheap stand-in. Every method takes `now`.
#[derive(Debug)]
pub struct Tables<T> {
    loaded: Option<Arc<T>>,
    last_used: Option<Instant>,
    /// A release thread is watching the loaded tables.
    watched: bool,
}

impl<T> Default for Tables<T> {
    fn default() -> Self {
        Tables {
            loaded: None,
            last_used: None,
            watched: false,
        }
    }
}

impl<T> Tables<T> {
    /// The tables, built with `build` if they are not loaded; `None` when
    /// building failed. Counts as a use at `now`.
    pub fn get(&mut self, now: Instant, build: impl FnOnce() -> Option<T>) -> Option<Arc<T>> {
        self.last_used = Some(now);
        if self.loaded.is_none() {
            self.loaded = build().map(Arc::new);
        }
        self.loaded.clone()
    }

    /// A call was dispatched at `now`: a use, whether or not it counts.
    pub fn touch(&mut self, now: Instant) {
        self.last_used = Some(now);
    }

    /// Whether the tables are loaded.
    pub fn is_loaded(&self) -> bool {
        self.loaded.is_some()
    }

    /// Drops the tables when they have been unused for [`IDLE_RELEASE`]
    /// at `now`. `Some(wait)`: still in use, look again in `wait`; `None`:
    /// released (or never loaded), nothing left to watch.
    pub fn release_if_idle(&mut self, now: Instant) -> Option<Duration> {
        self.loaded.as_ref()?;
        let idle_until = self.last_used.map_or(now, |t| t + IDLE_RELEASE);
        if now >= idle_until {
            self.loaded = None;
            return None;
        }
        Some(idle_until - now)
    }
}

/// The process's `o200k_base` tables.
static O200K: Mutex<Tables<CoreBPE>> = Mutex::new(Tables {
    loaded: None,
    last_used: None,
    watched: false,
});

fn o200k() -> MutexGuard<'static, Tables<CoreBPE>> {
    O200K.lock().unwrap_or_else(|p| p.into_inner())
}

/// Builds the tables; `None` (logged) if the embedded data won't parse.
fn build_o200k() -> Option<CoreBPE> {
    tiktoken_rs::o200k_base()
        .map_err(|e| tracing::error!("tokenizer: cannot build o200k_base: {e}"))
        .ok()
}

/// tiktoken `o200k_base`, the tokenizer of current OpenAI models and a fair
/// proxy for local ones until route calibration corrects the drift.
#[derive(Clone, Copy, Debug, Default)]
pub struct O200kEstimator;

impl O200kEstimator {
    /// The tables, built now on this thread if they are not loaded.
    fn tables() -> Option<Arc<CoreBPE>> {
        let mut tables = o200k();
        let loaded = tables.get(Instant::now(), build_o200k);
        if loaded.is_some() && !tables.watched {
            tables.watched = spawn_release_watch();
        }
        loaded
    }

    /// Builds the BPE tables now, on this thread, instead of on first use.
    pub fn warm_up() {
        let _ = Self::tables();
    }

    /// Builds the BPE tables on a thread of their own, unless they are
    /// loaded; a use either way.
    pub fn warm_up_in_background() {
        {
            let mut tables = o200k();
            tables.touch(Instant::now());
            if tables.is_loaded() {
                return;
            }
        }
        let spawned = std::thread::Builder::new()
            .name("speedtap-tokenizer".into())
            .spawn(Self::warm_up);
        // No thread to spare: the first count builds the tables itself.
        if let Err(e) = spawned {
            tracing::warn!("tokenizer: could not start its loader thread: {e}");
        }
    }

    /// Whether the tables are loaded now (for footprint checks).
    pub fn is_loaded() -> bool {
        o200k().is_loaded()
    }
}

/// Starts the thread that lets the tables go once idle; whether it runs.
fn spawn_release_watch() -> bool {
    let spawned = std::thread::Builder::new()
        // Distinct within the kernel's 15 bytes of a thread name.
        .name("tokenizer-idle".into())
        .spawn(release_watch);
    if let Err(e) = &spawned {
        tracing::warn!("tokenizer: could not start its release thread: {e}");
    }
    spawned.is_ok()
}

/// Sleeps until the tables have been idle for [`IDLE_RELEASE`], drops
/// them, gives what the calls used back to the system
/// ([`give_back`](give_back::give_back)), and ends.
fn release_watch() {
    loop {
        let wait = {
            let mut tables = o200k();
            let wait = tables.release_if_idle(Instant::now());
            if wait.is_none() {
                tables.watched = false;
            }
            wait
        };
        match wait {
            Some(wait) => std::thread::sleep(wait),
            None => break,
        }
    }
    tracing::info!(
        "tokenizer: released after {} s idle",
        IDLE_RELEASE.as_secs()
    );
    give_back::give_back();
}

impl TokenEstimator for O200kEstimator {
    fn count_tokens(&self, text: &str) -> u64 {
        if text.is_empty() {
            return 0;
        }
        // `encode_ordinary`: streamed output is plain text; special-token
        // spellings in it are counted as text, which is what they cost.
        Self::tables().map_or(0, |bpe| bpe.encode_ordinary(text).len() as u64)
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
    fn the_tables_are_released_after_ten_idle_minutes_and_built_again_on_the_next_use() {
        let builds = std::cell::Cell::new(0);
        let build = || {
            builds.set(builds.get() + 1);
            Some("tables")
        };
        let t0 = Instant::now();
        let min = |m: u64| t0 + Duration::from_secs(60 * m);
        let mut tables = Tables::default();
        assert_eq!(tables.release_if_idle(t0), None, "nothing to release");
        assert_eq!(tables.get(t0, build).as_deref(), Some(&"tables"));
        assert_eq!(builds.get(), 1);
        // Used at 8 minutes: still loaded at 15, released at 18.
        assert_eq!(
            tables.release_if_idle(min(5)),
            Some(Duration::from_secs(300))
        );
        assert!(tables.get(min(8), build).is_some());
        assert_eq!(builds.get(), 1, "loaded once while in use");
        assert_eq!(
            tables.release_if_idle(min(15)),
            Some(Duration::from_secs(180))
        );
        assert!(tables.is_loaded());
        // A dispatch is a use too.
        tables.touch(min(17));
        assert!(tables.release_if_idle(min(18)).is_some());
        assert_eq!(tables.release_if_idle(min(27)), None);
        assert!(!tables.is_loaded());
        // The next call builds them again.
        assert!(tables.get(min(40), build).is_some());
        assert_eq!(builds.get(), 2);
    }

    #[test]
    fn a_release_while_a_count_holds_the_tables_leaves_that_count_whole() {
        let t0 = Instant::now();
        let mut tables = Tables::default();
        let held = tables.get(t0, || Some(vec![1u8; 4])).unwrap();
        assert_eq!(tables.release_if_idle(t0 + IDLE_RELEASE), None);
        assert_eq!(held.len(), 4, "the count in progress keeps its copy");
    }

    #[test]
    fn o200k_counts_the_same_after_its_tables_are_released() {
        let e = O200kEstimator;
        let before = e.count_tokens("The quick brown fox jumps over the lazy dog.");
        assert!(O200kEstimator::is_loaded());
        // An hour past any use: other tests of this process count too, and
        // may load the tables again at once, so "released" is read from
        // the rule's answer, not from a later look.
        let later = Instant::now() + IDLE_RELEASE + Duration::from_secs(3600);
        assert_eq!(o200k().release_if_idle(later), None);
        let after = e.count_tokens("The quick brown fox jumps over the lazy dog.");
        assert_eq!(before, after);
        assert!(O200kEstimator::is_loaded());
    }

    #[test]
    fn word_counter_counts_words() {
        assert_eq!(WordCounter.count_tokens(" a b  c\n"), 3);
        assert_eq!(WordCounter.count_tokens(""), 0);
    }
}
