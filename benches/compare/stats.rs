//! Samples and the figures drawn from them.
//!
//! "Added" figures are differences of percentiles (an arm's p99 minus the
//! direct connection's p99 in the same run), as `benches/proxy_latency.rs`
//! does, not percentiles of paired differences: the chunks of two arms are
//! different chunks. Percentiles are nearest-rank, so every reported value
//! is one that was measured.

/// What one stream measured.
pub struct Outcome {
    pub chunk_ns: Vec<u64>,
    pub ttft_ns: Option<u64>,
    /// 200, `[DONE]` seen, and every chunk arrived.
    pub complete: bool,
    /// Why not, when not complete.
    pub failure: Option<String>,
}

/// What one arm collected on one workload, over all rounds.
#[derive(Default, Clone)]
pub struct Samples {
    /// Per chunk, arrival minus send, ns.
    pub chunk_ns: Vec<u64>,
    /// Per stream, connect to first stamped chunk, ns.
    pub ttft_ns: Vec<u64>,
    /// Streams that did not return 200 with every chunk and `[DONE]`.
    pub bad: usize,
    /// Streams run.
    pub streams: usize,
    /// Failure reasons of the incomplete streams, with counts.
    pub failures: std::collections::BTreeMap<String, usize>,
}

impl Samples {
    pub fn add(&mut self, o: Outcome) {
        self.streams += 1;
        if !o.complete {
            self.bad += 1;
            let why = o.failure.unwrap_or_else(|| "unknown".into());
            *self.failures.entry(why).or_default() += 1;
        }
        self.chunk_ns.extend(o.chunk_ns);
        self.ttft_ns.extend(o.ttft_ns);
    }

    pub fn extend(&mut self, other: Samples) {
        self.chunk_ns.extend(other.chunk_ns);
        self.ttft_ns.extend(other.ttft_ns);
        self.bad += other.bad;
        self.streams += other.streams;
        for (why, n) in other.failures {
            *self.failures.entry(why).or_default() += n;
        }
    }

    /// Sorted copies, for percentiles.
    pub fn summary(&self) -> Summary {
        let mut chunk = self.chunk_ns.clone();
        let mut ttft = self.ttft_ns.clone();
        chunk.sort_unstable();
        ttft.sort_unstable();
        Summary { chunk, ttft }
    }

    /// The failure reasons, for messages (`"status 500" x3; ...`).
    pub fn failure_text(&self) -> String {
        self.failures
            .iter()
            .map(|(why, n)| format!("{why} x{n}"))
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// Sorted samples.
#[derive(Default, Clone)]
pub struct Summary {
    pub chunk: Vec<u64>,
    pub ttft: Vec<u64>,
}

impl Summary {
    /// Per-chunk latency percentile, µs (NaN without samples).
    pub fn chunk_us(&self, p: f64) -> f64 {
        pct_us(&self.chunk, p)
    }

    /// TTFT percentile, µs (NaN without samples).
    pub fn ttft_us(&self, p: f64) -> f64 {
        pct_us(&self.ttft, p)
    }
}

/// Nearest-rank percentile of sorted nanosecond values, in µs.
pub fn pct_us(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1] as f64 / 1_000.0
}
