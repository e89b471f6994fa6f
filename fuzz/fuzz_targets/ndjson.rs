//! The NDJSON framer (`speedtap_fuzz::decode::ndjson`). Flags bit 0 picks a
//! small line cap (1..=64 bytes, from bits 1-6) instead of the 16 MiB
//! default.
//!
//! Checks: never panics; whole and arbitrarily cut input give the same
//! lines and dropped-line count; every line is non-blank and holds no LF;
//! with a cap, no line is longer than the cap. (A line may end in CR: only
//! the one CR before the LF is a terminator, a lone CR is content.)
#![no_main]

use libfuzzer_sys::fuzz_target;
use speedtap_fuzz::decode::ndjson::NdjsonFramer;
use speedtap_fuzz::{split, Input};

fn frame(f: &mut NdjsonFramer, reads: &[&[u8]]) -> Vec<String> {
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
    let new = || cap.map_or_else(NdjsonFramer::new, NdjsonFramer::with_max_line_bytes);

    let mut f = new();
    let whole = frame(&mut f, &[input.payload]);
    let mut g = new();
    let cut = frame(&mut g, &split(input.payload, input.seed));
    assert_eq!(whole, cut, "lines depend on where the stream was cut");
    assert_eq!(f.dropped_lines(), g.dropped_lines());

    for line in &whole {
        assert!(!line.trim().is_empty(), "blank line pushed");
        assert!(!line.contains('\n'), "LF inside a line");
        if let Some(cap) = cap {
            assert!(line.chars().count() <= cap, "line over the cap");
        }
    }
});
