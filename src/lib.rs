//! speedtap: measure every local LLM call's phase, time to first token and
//! tokens per second, by tapping its response stream.
//!
//! # Overview
//! - [`capture`] reads model servers' loopback packets (through the
//!   `speedtap-capture` helper) and turns them into HTTP exchanges;
//! - [`decode`] turns response bytes of any supported API into typed events;
//! - [`tokens`] estimates token counts with tiktoken (o200k_base by default);
//! - [`meter`] holds the pure metric maths: the per-call meter, route
//!   calibration and the global meter;
//! - [`metering`] is the glue: bytes and a clock in, snapshots out;
//! - [`simulate`] is a scripted local model server for demos, tests and
//!   benchmarks.

pub mod api;
pub mod capture;
pub mod cli;
pub mod config;
pub mod decode;
pub mod discover;
pub mod engine;
pub mod meter;
pub mod metering;
pub mod simulate;
pub mod store;
pub mod tokens;
