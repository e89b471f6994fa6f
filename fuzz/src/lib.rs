//! Shared harness for the speedtap fuzz targets (`fuzz_targets/*.rs`).
//!
//! Every target reads the same input layout, so one seeding script
//! (`fuzz/seed`) serves them all and a crash input is readable by eye:
//!
//! ```text
//! byte 0   flags: target-specific options (framing, model hint, small cap)
//! byte 1   split seed: drives where the payload is cut into "reads"
//! byte 2.. the payload (a response body, a config file, ...)
//! ```
//!
//! Inputs shorter than two bytes are padded with zeros, so every input is
//! valid. The split seed is not a list of offsets (that would let the
//! fuzzer spend most mutations on the cut list); a tiny PRNG expands it to
//! read sizes biased towards 1..4 bytes, where the hard cases are (a CRLF,
//! a BOM or a UTF-8 character split across reads), with some longer reads.
//!
//! Each target checks the invariant the code under test documents: the
//! same bytes framed whole or split at any points give the same result,
//! nothing panics, buffers are bounded by their caps, and a few
//! format-specific ones (see the target files and the helpers here).

//!
//! # What is compiled
//!
//! The code under test is speedtap's own `src/decode/` and `src/config/`
//! (with `src/model/`, the contract types both name),
//! mounted here by `#[path]` rather than through a dependency on the
//! speedtap crate (see Cargo.toml for why: build time). Both modules are
//! self-contained (they name only `crate::decode` and a few crates), so they
//! compile here unchanged; the targets still use only their public API,
//! exactly as the proxy does. If either module starts to use another part
//! of speedtap, this build fails loudly and the module list below grows.

#[path = "../../src/model/mod.rs"]
pub mod model;

#[path = "../../src/decode/mod.rs"]
pub mod decode;

#[path = "../../src/config/mod.rs"]
pub mod config;

use crate::decode::detect::BodyFraming;
use crate::decode::{StreamDecoder, StreamEvent};
use crate::model::ApiKind;

/// Maximum characters of an `Error` event's message (the decoders' own
/// documented promise, `protocols::json::MAX_ERROR_CHARS`).
pub const MAX_ERROR_CHARS: usize = crate::decode::protocols::json::MAX_ERROR_CHARS;

/// The two header bytes and the payload.
pub struct Input<'a> {
    pub flags: u8,
    pub seed: u8,
    pub payload: &'a [u8],
}

impl<'a> Input<'a> {
    pub fn parse(data: &'a [u8]) -> Self {
        Input {
            flags: data.first().copied().unwrap_or(0),
            seed: data.get(1).copied().unwrap_or(0),
            payload: data.get(2..).unwrap_or(&[]),
        }
    }
}

/// Cuts `bytes` into consecutive non-empty reads, deterministically from
/// `seed` (xorshift). Seed 0 still splits (the state is offset), so the
/// "split" run always differs from the "whole" run on inputs longer than
/// a few bytes.
pub fn split(bytes: &[u8], seed: u8) -> Vec<&[u8]> {
    let mut state: u32 = 0x9E37_79B9 ^ (u32::from(seed) << 8 | u32::from(seed));
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        state
    };
    let mut pieces = Vec::new();
    let mut rest = bytes;
    while !rest.is_empty() {
        let r = next();
        let len = match r % 8 {
            0..=4 => 1 + (r >> 3) as usize % 4,
            5 | 6 => 1 + (r >> 3) as usize % 64,
            _ => 1 + (r >> 3) as usize % 1024,
        }
        .min(rest.len());
        let (piece, tail) = rest.split_at(len);
        pieces.push(piece);
        rest = tail;
    }
    pieces
}

/// Everything one decoding run produced.
#[derive(Debug, PartialEq)]
pub struct Decoded {
    pub events: Vec<StreamEvent>,
    pub unparsed: u64,
    pub streamed: bool,
}

/// Feeds the reads to a fresh [`StreamDecoder`], then finishes it, and
/// checks that `finish` is final (later feeds and finishes add nothing).
pub fn decode(api: ApiKind, framing: BodyFraming, model: Option<&str>, reads: &[&[u8]]) -> Decoded {
    let mut d = StreamDecoder::new(api, framing, model);
    let mut events = Vec::new();
    for r in reads {
        d.feed(r, &mut events);
    }
    d.finish(&mut events);
    let n = events.len();
    d.feed(
        b"data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n",
        &mut events,
    );
    d.finish(&mut events);
    assert_eq!(events.len(), n, "events after finish");
    Decoded {
        events,
        unparsed: d.unparsed_messages(),
        streamed: d.is_streamed(),
    }
}

/// Merges adjacent `Output` events of the same channel: the one thing the
/// stream decoder allows to depend on how the body was cut into reads.
pub fn normalize(events: &[StreamEvent]) -> Vec<StreamEvent> {
    let mut out: Vec<StreamEvent> = Vec::with_capacity(events.len());
    for e in events {
        if let (
            Some(StreamEvent::Output {
                channel: c0,
                text: t0,
            }),
            StreamEvent::Output { channel, text },
        ) = (out.last_mut(), e)
        {
            if c0 == channel {
                t0.push_str(text);
                continue;
            }
        }
        out.push(e.clone());
    }
    out
}

/// The event-level promises every protocol decoder makes (`event.rs`,
/// `protocols/mod.rs`): output text is never empty, `Done` comes at most
/// once, error messages are non-empty and short.
pub fn check_events(events: &[StreamEvent]) {
    let mut done = 0;
    for e in events {
        match e {
            StreamEvent::Output { text, .. } => assert!(!text.is_empty(), "empty output text"),
            StreamEvent::Done => done += 1,
            StreamEvent::Error { message, .. } => {
                assert!(!message.trim().is_empty(), "empty error message");
                assert!(
                    message.chars().count() <= MAX_ERROR_CHARS,
                    "error message longer than MAX_ERROR_CHARS"
                );
            }
            StreamEvent::Usage(_) | StreamEvent::ServerTimings(_) | StreamEvent::PromptProgress(_) => {}
        }
    }
    assert!(done <= 1, "Done emitted {done} times");
}

/// The body of every protocol target. Flags: bits 0-1 the framing (SSE,
/// NDJSON, JSON body, SSE again: the streamed case gets the most weight),
/// bits 2-3 the model hint (none, a plain model, a forced-open thinking
/// model, a forced-open one named the Ollama way).
pub fn protocol_target(api: ApiKind, data: &[u8]) {
    let input = Input::parse(data);
    let framing = match input.flags & 3 {
        1 => BodyFraming::Ndjson,
        2 => BodyFraming::Json,
        _ => BodyFraming::Sse,
    };
    let model = match (input.flags >> 2) & 3 {
        0 => None,
        1 => Some("llama-3.2-1b-instruct"),
        2 => Some("DeepSeek-R1-Distill-Qwen-7B"),
        _ => Some("qwq:32b"),
    };
    let whole = decode(api, framing, model, &[input.payload]);
    check_events(&whole.events);
    let split = decode(api, framing, model, &split(input.payload, input.seed));
    assert_eq!(
        whole.unparsed, split.unparsed,
        "unparsed count depends on the reads"
    );
    assert_eq!(whole.streamed, split.streamed);
    assert_eq!(
        normalize(&whole.events),
        normalize(&split.events),
        "events depend on where the body was cut"
    );
}
