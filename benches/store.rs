//! Store figures (docs/benchmarks.md): write throughput (settled calls
//! per second through `StoreWriter` at its default batching), the commit
//! latency of a lone call (what a settle waits for at low load, fsync
//! included), and the file size per 10,000 calls.
//!
//! `cargo bench --bench store` runs the full sizes; without `--bench` (as
//! `cargo test --benches` runs it) a small smoke run checks it works. The
//! database lives under the target dir (a real disk, so fsync costs what it
//! costs), not in a tmpfs.

// The 80-line limit is for product code; a bench may read as one long script.
#![allow(clippy::too_many_lines)]
#![allow(clippy::unwrap_used)] // a test (or bench) may unwrap: a panic is its failure report

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use speedtap::model::time::ms_to_rfc3339;
use speedtap::model::ApiKind;
use speedtap::model::{Call, CallDetails, CallIdentity, CallStatus, TtftBreakdown};
use speedtap::model::{Phase, Snapshot, TokenSource};
use speedtap::store::{Store, StoreWriter};

/// A typical settled call: ok, server-reported numbers, a TTFT breakdown.
fn call(i: u64) -> Call {
    let started = 1_796_035_327_123 + i * 1000;
    Call {
        identity: CallIdentity {
            id: format!("c-{:06}", i % 1_000_000),
            route: "ollama".into(),
            api: ApiKind::OllamaChat,
            model: Some(["qwen3:8b", "gemma3:12b", "llama3.2:3b"][(i % 3) as usize].into()),
            started_at: ms_to_rfc3339(started),
            demo: false,
        },
        status: CallStatus::Ok,
        http_status: Some(200),
        speed: Some(Snapshot {
            stalled_ms: None,
            phase: Phase::Complete,
            is_final: true,
            elapsed_ms: 4000 + i % 3000,
            time_to_first_token_ms: Some(200 + i % 500),
            output_tokens: 150 + i % 400,
            output_tokens_per_second: Some(35.0 + (i % 200) as f64 / 10.0),
            token_source: TokenSource::Server,
            wait: None,
        }),
        input_tokens: Some(40 + i % 2000),
        details: CallDetails {
            client: Some("openai-python".into()),
            ttft_breakdown: Some(TtftBreakdown {
                load_ms: None,
                prefill_ms: Some(120.5),
                prefill_tokens: Some(40 + i % 2000),
                cached_tokens: Some(0),
                prefill_tokens_per_second: Some(812.3),
                other_ms: Some(42.0),
            }),
            one_burst: false,
            unstreamed_reasoning: false,
            settled_at: Some(ms_to_rfc3339(started + 4000 + i % 3000)),
            ..CallDetails::default()
        },
    }
}

fn fresh_db(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("store-bench");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    path
}

fn counting_writer(path: &Path) -> (StoreWriter, Arc<AtomicU64>) {
    let persisted = Arc::new(AtomicU64::new(0));
    let count = Arc::clone(&persisted);
    let writer = StoreWriter::spawn(
        Store::open(path).unwrap(),
        Box::new(move |ids, ok| {
            assert!(ok);
            count.fetch_add(ids.len() as u64, Ordering::Relaxed);
        }),
    );
    (writer, persisted)
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let (n, lone) = if full { (200_000, 200) } else { (5_000, 10) };

    // Throughput: record as fast as the engine could, flush, time it.
    let path = fresh_db("throughput.sqlite3");
    let (writer, persisted) = counting_writer(&path);
    let t = Instant::now();
    for i in 0..n {
        writer.record(call(i));
    }
    writer.flush();
    let secs = t.elapsed().as_secs_f64();
    assert_eq!(persisted.load(Ordering::Relaxed), n);
    let stats = writer.stats();
    println!(
        "store write throughput: {n} calls in {secs:.2} s = {:.0} calls/s ({} transactions, {:.0} calls each)",
        n as f64 / secs,
        stats.transactions,
        n as f64 / stats.transactions as f64
    );
    writer.shutdown();

    // A lone call: record, flush, repeat (one transaction and fsync each).
    let path = fresh_db("latency.sqlite3");
    let (writer, _) = counting_writer(&path);
    let t = Instant::now();
    for i in 0..lone {
        writer.record(call(i));
        writer.flush();
    }
    println!(
        "lone-call commit latency: {:.2} ms (mean of {lone})",
        t.elapsed().as_secs_f64() * 1000.0 / lone as f64
    );
    writer.shutdown();

    // Size per 10,000 calls, after a checkpoint folds the WAL in.
    let path = fresh_db("size.sqlite3");
    let (writer, _) = counting_writer(&path);
    for i in 0..10_000 {
        writer.record(call(i));
    }
    writer.flush();
    let checkpointed = writer.with_store(|s| s.checkpoint().unwrap()).unwrap();
    writer.shutdown();
    let bytes = std::fs::metadata(&path).unwrap().len();
    println!(
        "file size per 10,000 calls: {:.2} MB ({} bytes, {:.0} bytes/call; checkpoint complete: {checkpointed})",
        bytes as f64 / 1e6,
        bytes,
        bytes as f64 / 10_000.0
    );
}
