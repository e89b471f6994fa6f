//! speedtap: measure every local LLM call's phase, time to first token and
//! tokens per second, by tapping its response stream.
//!
//! # Overview
//! The modules form layers; each imports only from the layers below it
//! (`scripts/check-layers` checks it, `docs/architecture.md` explains it):
//! - [`model`] holds the contract types: calls, snapshots, stats, history
//!   filters, control documents and the engine-handle query trait;
//! - [`tokens`] estimates token counts with tiktoken (o200k_base by default);
//!   [`decode`] turns response bytes of any supported API into typed events;
//!   [`capture`] reads model servers' loopback packets (through the
//!   `speedtap-capture` helper) and turns them into HTTP exchanges, for the
//!   engine's capture interceptor;
//! - [`meter`] holds the pure metric maths (the per-call meter, the live
//!   rate, route calibration and normals, the global meter) and its
//!   pipeline, the glue: bytes and a clock in, snapshots out;
//! - the running parts, side by side: [`engine`] runs the call actors and
//!   the two interceptors that feed them, the forwarding proxy and the
//!   passive capture, both starting calls through one link to the engine;
//!   [`store`] keeps settled calls in SQLite; [`simulate`] is a scripted
//!   local model server for demos, tests and benchmarks; [`discover`]
//!   finds the model servers listening on their usual local ports;
//!   [`config`] reads the config file and the flags and resolves them into
//!   settings;
//! - [`api`] serves the control API and the dashboard over the
//!   engine-handle trait;
//! - [`host`] is the composition root: it turns settings into a running
//!   engine with its store, API and exporters, the same way for every front
//!   end;
//! - [`cli`] is the `speedtap` command line (the tray app is the other
//!   front end, in `src-tauri`).

pub mod api;
pub mod capture;
pub mod cli;
pub mod config;
pub mod decode;
pub mod discover;
pub mod engine;
pub mod host;
pub mod meter;
#[deny(missing_docs)]
pub mod model;
pub mod simulate;
pub mod store;
pub mod tokens;
