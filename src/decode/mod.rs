//! Stream decoders: wire bytes in, typed [`StreamEvent`]s out.
//!
//! Layers, each its own module:
//! - [`sse`] and [`ndjson`] frame arbitrary byte slices into messages
//!   (WHATWG SSE rules; one JSON object per line);
//! - [`detect`] decides the [`ApiKind`](crate::model::ApiKind) from the request and the body
//!   framing from the response; [`sniff`] reads a streamed reply's
//!   framing from its first bytes, whatever its label says;
//! - [`protocols`] turn one framed message of one API into events;
//! - [`think`] splits inline `<think>...</think>` text into reasoning;
//! - [`stream`] ties them together: [`StreamDecoder`] is what the proxy feeds.

pub mod detect;
pub mod event;
pub mod ndjson;
pub mod protocols;
pub mod request_fields;
pub mod sniff;
pub mod sse;
pub mod stream;
pub mod think;

pub use event::{OutputChannel, PromptProgress, ServerTimings, StreamEvent, Usage};
pub use stream::StreamDecoder;
