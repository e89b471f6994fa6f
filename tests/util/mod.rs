//! The one support module every test binary shares: `tests/tests.rs`
//! (the in-process and process-level integration tests) and the few
//! binaries that must run alone (`faults`, `faults_flood`, `byte_exact`,
//! `real_server`, `soak`: they count the process's file descriptors, change
//! its limits, or run for minutes).
//!
//! - [`proxy`]: a scripted upstream over a real socket, a recording
//!   client, an in-process engine.
//! - [`wire`]: raw HTTP/1.x over tokio sockets for both ends of a fault.
//! - [`raw_http`]: a blocking HTTP/1.1 client over `TcpStream`s.
//! - [`process`]: the `speedtap` binary as a child process.
//! - [`store_engine`]: HTTP helpers and request bodies for the store and
//!   engine tests.
//! - [`security`]: an upstream that answers with a marker text and
//!   records the credentials it was sent.
//! - [`decode_capture`]: the real captures under `tests/fixtures/real`.
//!
//! Each binary uses part of it, so unused helpers are not warnings here.
#![allow(dead_code)]

pub mod decode_capture;
pub mod process;
pub mod proxy;
pub mod raw_http;
pub mod security;
pub mod store_engine;
pub mod wire;
