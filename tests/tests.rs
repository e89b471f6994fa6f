//! The integration tests, in one binary (one link instead of one per
//! file): each module below is one area, and `util` is the support they
//! share. Tests that must have the process to themselves are their own
//! binaries (see `tests/util/mod.rs`).
//!
//! Run one area with a filter: `cargo test --test tests proxy::`.

// The 80-line limit is for product code; a test may read as one long script.
#![allow(clippy::too_many_lines)]
#![allow(clippy::unwrap_used)] // a test may unwrap: a panic is its failure report

mod util;

mod capture;
mod cli;
mod config;
mod control_api;
mod decode_fixtures;
mod engine_control;
mod export_cli;
mod follow;
mod headless_footprint;
mod honest_rates;
mod metrics_export;
mod proxy;
mod proxy_fixtures;
mod security;
mod simulate;
mod simulate_servers;
mod store;
mod store_engine;
mod wait;
mod why_slow;
