//! How fast the default token estimator (tiktoken `o200k_base`) counts
//! streamed text, so docs/benchmarks.md can say what metering costs.
//!
//! Three figures:
//! - the lazy first-use cost (the BPE tables are built on the first count),
//!   measured before anything else in this process touches the singleton;
//! - criterion throughput, bytes/s, for a ~64 KiB English-like text counted
//!   whole (as the meter does when it flushes a large buffer) and in 4-word
//!   pieces (the worst case: every streamed delta counted on its own);
//! - one line "estimator: N estimated tokens per second per core" from a
//!   plain single-threaded timed loop, easy to quote.
//!
//! The text is generated deterministically (a fixed word list and a fixed
//! LCG), so runs compare; no real prompt or completion text is involved.
//! Under `cargo test --benches` criterion runs each benchmark once and the
//! extra figures are skipped.

// The 80-line limit is for product code; a bench may read as one long script.
#![allow(clippy::too_many_lines)]
#![allow(clippy::unwrap_used)] // a test (or bench) may unwrap: a panic is its failure report

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use speedtap::tokens::{O200kEstimator, TokenEstimator};

/// Target size of the generated text.
const TEXT_BYTES: usize = 64 * 1024;

/// Words per streamed piece: local servers typically send one token, or a
/// few, per delta.
const WORDS_PER_CHUNK: usize = 4;

/// How long the plain timed loop runs for the tokens-per-second line.
const TIMED_LOOP: Duration = Duration::from_secs(3);

const WORDS: &[&str] = &[
    "the",
    "of",
    "and",
    "to",
    "a",
    "in",
    "is",
    "that",
    "for",
    "it",
    "as",
    "was",
    "with",
    "be",
    "by",
    "on",
    "not",
    "he",
    "this",
    "are",
    "or",
    "his",
    "from",
    "at",
    "which",
    "but",
    "have",
    "an",
    "had",
    "they",
    "you",
    "were",
    "their",
    "one",
    "all",
    "we",
    "can",
    "her",
    "has",
    "there",
    "been",
    "if",
    "more",
    "when",
    "will",
    "would",
    "who",
    "so",
    "no",
    "model",
    "server",
    "request",
    "response",
    "token",
    "stream",
    "latency",
    "throughput",
    "memory",
    "function",
    "result",
    "because",
    "however",
    "therefore",
    "example",
    "between",
    "important",
    "different",
    "following",
    "information",
    "available",
    "performance",
    "approximately",
    "configuration",
    "understanding",
    "implementation",
    "particularly",
    "answer",
    "question",
    "reason",
    "simple",
    "number",
    "value",
    "second",
    "first",
    "time",
    "people",
    "world",
    "system",
    "process",
    "should",
    "could",
    "about",
    "other",
    "into",
    "only",
    "also",
    "after",
    "over",
    "then",
    "them",
    "these",
    "some",
    "what",
    "like",
    "than",
    "most",
    "very",
    "through",
    "where",
    "much",
    "before",
    "right",
    "too",
    "means",
    "old",
    "any",
    "same",
    "tell",
    "boy",
    "follow",
    "came",
    "want",
    "show",
    "also",
    "around",
    "form",
    "three",
    "small",
    "set",
    "put",
    "end",
    "does",
    "another",
    "well",
    "large",
    "must",
    "big",
    "even",
    "such",
    "turn",
    "here",
    "why",
    "ask",
    "went",
    "men",
    "read",
    "need",
    "land",
    "home",
    "us",
    "move",
    "try",
    "kind",
    "hand",
    "picture",
    "again",
    "change",
    "off",
    "play",
    "spell",
    "air",
    "away",
    "animal",
    "house",
    "point",
    "page",
    "letter",
    "mother",
    "found",
    "study",
    "still",
    "learn",
    "plant",
    "cover",
    "food",
    "sun",
    "four",
    "thought",
    "let",
    "keep",
    "eye",
    "never",
    "last",
    "door",
    "2048",
    "3.14",
    "42",
    "GPU",
    "CPU",
    "JSON",
];

/// A deterministic English-like text of about [`TEXT_BYTES`]: sentences of
/// 6 to 20 words, capitalised, with commas, full stops, the odd question
/// and paragraph breaks.
fn english_like_text() -> String {
    let mut state: u64 = 0x5eed_1234_abcd_ef01;
    let mut next = move |n: usize| {
        // Knuth's MMIX LCG; the high bits are the good ones.
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((state >> 33) % n as u64) as usize
    };
    let mut text = String::with_capacity(TEXT_BYTES + 256);
    let mut sentences = 0;
    while text.len() < TEXT_BYTES {
        let len = 6 + next(15);
        for i in 0..len {
            let word = WORDS[next(WORDS.len())];
            if i == 0 {
                if !text.is_empty() && !text.ends_with('\n') {
                    text.push(' ');
                }
                let mut chars = word.chars();
                if let Some(c) = chars.next() {
                    text.extend(c.to_uppercase());
                    text.push_str(chars.as_str());
                }
            } else {
                text.push(' ');
                text.push_str(word);
                if i + 1 < len && next(9) == 0 {
                    text.push(',');
                }
            }
        }
        text.push(if next(8) == 0 { '?' } else { '.' });
        sentences += 1;
        if sentences % (3 + next(4)) == 0 {
            text.push_str("\n\n");
        }
    }
    text
}

/// The text cut as a stream delivers it: pieces of [`WORDS_PER_CHUNK`]
/// words, each carrying its leading space, concatenating back to the text.
fn stream_chunks(text: &str) -> Vec<&str> {
    let mut chunks = Vec::new();
    let mut start = 0;
    let mut words = 0;
    let mut in_word = false;
    for (i, c) in text.char_indices() {
        let space = c.is_whitespace();
        if space && in_word {
            words += 1;
            if words == WORDS_PER_CHUNK {
                chunks.push(&text[start..i]);
                start = i;
                words = 0;
            }
        }
        in_word = !space;
    }
    if start < text.len() {
        chunks.push(&text[start..]);
    }
    chunks
}

fn count_chunks(chunks: &[&str]) -> u64 {
    chunks.iter().map(|c| O200kEstimator.count_tokens(c)).sum()
}

/// Counts `work` repeatedly on one thread for [`TIMED_LOOP`] and returns
/// tokens per second.
fn tokens_per_second(mut work: impl FnMut() -> u64) -> f64 {
    let start = Instant::now();
    let mut tokens = 0u64;
    while start.elapsed() < TIMED_LOOP {
        tokens += black_box(work());
    }
    tokens as f64 / start.elapsed().as_secs_f64()
}

fn main() {
    // First: nothing in this process has touched the BPE singleton yet.
    let first = Instant::now();
    let n = O200kEstimator.count_tokens(black_box("hello world"));
    let first_use = first.elapsed();
    assert_eq!(n, 2);

    let args: Vec<String> = std::env::args().collect();
    let has = |flag: &str| args.iter().any(|a| a == flag);
    let benchmarking = has("--bench") && !has("--test") && !has("--list");

    let text = english_like_text();
    let chunks = stream_chunks(&text);
    assert_eq!(chunks.concat(), text, "chunks must rebuild the text");
    let whole_tokens = O200kEstimator.count_tokens(&text);
    let chunk_tokens = count_chunks(&chunks);

    let mut criterion = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5))
        .without_plots()
        .configure_from_args();
    {
        let mut group = criterion.benchmark_group("o200k_count_tokens");
        group.throughput(Throughput::Bytes(text.len() as u64));
        group.bench_function("whole_64KiB", |b| {
            b.iter(|| O200kEstimator.count_tokens(black_box(&text)))
        });
        group.bench_function("4_word_chunks_64KiB", |b| {
            b.iter(|| count_chunks(black_box(&chunks)))
        });
        group.finish();
    }
    criterion.final_summary();

    if !benchmarking {
        return;
    }
    let whole_rate = tokens_per_second(|| O200kEstimator.count_tokens(black_box(&text)));
    let chunk_rate = tokens_per_second(|| count_chunks(black_box(&chunks)));
    println!();
    println!(
        "estimator: text {} bytes, {} tokens whole, {} tokens summed over {} chunks of {} words",
        text.len(),
        whole_tokens,
        chunk_tokens,
        chunks.len(),
        WORDS_PER_CHUNK
    );
    println!(
        "estimator: first use (table build) took {:.1} ms",
        first_use.as_secs_f64() * 1e3
    );
    println!(
        "estimator: {:.0} estimated tokens per second per core",
        whole_rate
    );
    println!(
        "estimator ({}-word chunks): {:.0} estimated tokens per second per core",
        WORDS_PER_CHUNK, chunk_rate
    );
}
