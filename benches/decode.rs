//! How fast the proxy's stream decoder turns response bytes into events,
//! per API: SSE and NDJSON framing plus each protocol's JSON decoding,
//! through the same `StreamDecoder` the call actors feed.
//!
//! One benchmark per metered API (all eight), each a whole response body
//! fed read by read as the socket delivered it (see `bodies`: real
//! llama-server / llama-cpp-python captures where one exists, simulator
//! output for Ollama and TGI), then `finish`. Throughput is criterion's
//! `Throughput::Bytes` of the body, so the figures read as MB/s of
//! response stream one core can decode. A fresh decoder per iteration:
//! its set-up is part of every call's cost.
//!
//! Token estimation is not in here (the meter buffers text and counts it
//! per snapshot; `benches/estimator.rs` and `benches/meter.rs` cover it).
//!
//! A second group, `request_scanner`, measures the request side: the
//! streaming scanner that reads a request body's top-level `model` and
//! `stream` as it passes (a 1 MiB chat body whose messages come first, the
//! `openai` SDK's order, in 64 KiB reads).
//!
//! With `--bench`, a Markdown table (MB/s and ns per read from a plain
//! timed loop, easy to quote) follows criterion's output. Under
//! `cargo test --benches` criterion runs each benchmark once and the table
//! is skipped.

// The 80-line limit is for product code; a bench may read as one long script.
#![allow(clippy::too_many_lines)]
#![allow(clippy::unwrap_used)] // a test (or bench) may unwrap: a panic is its failure report

mod bodies;

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use speedtap::decode::request_fields::RequestScanner;
use speedtap::decode::{StreamDecoder, StreamEvent};

use bodies::Body;

/// How long the plain timed loop runs per body for the table.
const TIMED_LOOP: Duration = Duration::from_millis(1500);

/// Decodes `body` read by read with a fresh decoder; returns the number of
/// events (kept alive so nothing is optimised away).
fn decode(body: &Body, events: &mut Vec<StreamEvent>) -> usize {
    events.clear();
    let mut decoder = StreamDecoder::new(body.api, body.framing, Some(body.model));
    for read in &body.reads {
        decoder.feed(read, events);
    }
    decoder.finish(events);
    events.len()
}

/// A chat request of about `size` bytes whose messages come before
/// `model` and `stream`, with escapes and nested objects in the text the
/// scanner must skip.
fn long_request(size: usize) -> Vec<u8> {
    let mut body = br#"{"messages":["#.to_vec();
    let turn = br#"{"role":"user","content":"a "quoted" {not: an object} line
of text "},"#;
    while body.len() + turn.len() < size {
        body.extend_from_slice(turn);
    }
    body.extend_from_slice(
        br#"{"role":"user","content":"last"}],"model":"qwen3:8b","stream":true}"#,
    );
    body
}

/// Scans `body` in reads of `read` bytes; returns whether both fields were
/// found.
fn scan(body: &[u8], read: usize) -> bool {
    let mut scanner = RequestScanner::default();
    for piece in body.chunks(read) {
        scanner.feed(piece);
    }
    let f = scanner.fields();
    f.model.is_some() && f.stream.is_some()
}

/// A body that does not decode to output and a terminal marker would make
/// its figure meaningless: refuse it.
fn check(body: &Body) {
    let mut events = Vec::new();
    decode(body, &mut events);
    let outputs = events
        .iter()
        .filter(|e| matches!(e, StreamEvent::Output { .. }))
        .count();
    assert!(
        outputs >= 20,
        "{} ({}): only {outputs} outputs",
        body.api,
        body.source
    );
    assert_eq!(
        events.last(),
        Some(&StreamEvent::Done),
        "{} ({}) must end with Done",
        body.api,
        body.source
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let has = |flag: &str| args.iter().any(|a| a == flag);
    let benchmarking = has("--bench") && !has("--test") && !has("--list");

    let corpus = bodies::corpus();
    assert_eq!(corpus.len(), 8, "one body per metered API");
    for body in &corpus {
        check(body);
    }

    let mut criterion = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .without_plots()
        .configure_from_args();
    let mut events = Vec::with_capacity(1024);
    {
        let mut group = criterion.benchmark_group("stream_decoder");
        for body in &corpus {
            group.throughput(Throughput::Bytes(body.len() as u64));
            group.bench_function(body.api.as_str(), |b| {
                b.iter(|| decode(black_box(body), &mut events))
            });
        }
        group.finish();
    }
    let request = long_request(1 << 20);
    assert!(
        scan(&request, 64 * 1024),
        "the scanner finds model and stream"
    );
    {
        let mut group = criterion.benchmark_group("request_scanner");
        group.throughput(Throughput::Bytes(request.len() as u64));
        group.bench_function("chat_1mib_messages_first", |b| {
            b.iter(|| scan(black_box(&request), 64 * 1024))
        });
        group.finish();
    }
    criterion.final_summary();

    if !benchmarking {
        return;
    }
    println!();
    println!("| API | body | bytes | reads | MB/s | ns per read |");
    println!("|---|---|---:|---:|---:|---:|");
    let start = Instant::now();
    let mut runs = 0u64;
    while start.elapsed() < TIMED_LOOP {
        black_box(scan(black_box(&request), 64 * 1024));
        runs += 1;
    }
    let request_mb_s = request.len() as f64 * runs as f64 / start.elapsed().as_secs_f64() / 1e6;
    for body in &corpus {
        let start = Instant::now();
        let mut runs = 0u64;
        while start.elapsed() < TIMED_LOOP {
            black_box(decode(black_box(body), &mut events));
            runs += 1;
        }
        let secs = start.elapsed().as_secs_f64();
        let mb_s = (body.len() as f64 * runs as f64) / secs / 1e6;
        let ns_read = secs * 1e9 / (runs as f64 * body.reads.len() as f64);
        println!(
            "| {} | {} | {} | {} | {:.0} | {:.0} |",
            body.api,
            body.source,
            body.len(),
            body.reads.len(),
            mb_s,
            ns_read
        );
    }
    println!();
    println!(
        "request scanner (model and stream after 1 MiB of messages, 64 KiB reads): {request_mb_s:.0} MB/s"
    );
}
