//! The SSE framer (`speedtap_fuzz::decode::sse`). Flags bit 0 picks a small line
//! cap (1..=64 bytes, from bits 1-6) instead of the 16 MiB default, so the
//! cap's paths run on small inputs.
//!
//! Checks: never panics; the same bytes framed whole or cut into arbitrary
//! reads give the same messages and the same dropped-line count; a framer
//! reused after `finish` frames the next stream the same as a fresh one;
//! no message holds a CR (lines are split at CR and LF), an event type is
//! never empty; and with a cap, no dispatched event type or data exceeds
//! the cap (memory bounded per event, not only per line).
#![no_main]

use libfuzzer_sys::fuzz_target;
use speedtap_fuzz::decode::sse::{SseFramer, SseMessage};
use speedtap_fuzz::{split, Input};

fn frame(f: &mut SseFramer, reads: &[&[u8]]) -> Vec<SseMessage> {
    let mut out = Vec::new();
    for r in reads {
        f.feed(r, &mut out);
    }
    f.finish(&mut out);
    out
}

fuzz_target!(|data: &[u8]| {
    let input = Input::parse(data);
    let cap = (input.flags & 1 == 1).then(|| 1 + usize::from(input.flags >> 1) % 64);
    let new = || cap.map_or_else(SseFramer::new, SseFramer::with_max_line_bytes);

    let mut f = new();
    let whole = frame(&mut f, &[input.payload]);
    let dropped = f.dropped_lines();
    // Reuse after finish: a new stream, the same result (drops accumulate).
    assert_eq!(frame(&mut f, &[input.payload]), whole, "reused framer");
    assert_eq!(f.dropped_lines(), 2 * dropped);

    let mut g = new();
    let cut = frame(&mut g, &split(input.payload, input.seed));
    assert_eq!(whole, cut, "messages depend on where the stream was cut");
    assert_eq!(dropped, g.dropped_lines());

    for m in &whole {
        assert!(!m.data.contains('\r'), "CR inside data");
        if let Some(e) = &m.event {
            assert!(!e.is_empty(), "empty event type");
            assert!(!e.contains(['\r', '\n']), "line break inside event type");
        }
        if let Some(cap) = cap {
            // Lossy decoding turns each invalid byte into one U+FFFD, so
            // the cap in bytes bounds the length in chars.
            assert!(m.data.chars().count() <= cap, "data over the cap");
            assert!(m.event.as_ref().map_or(0, |e| e.chars().count()) <= cap);
        }
    }
});
