//! NDJSON framing (Ollama's native `/api/chat` and `/api/generate`): one
//! JSON object per line, lines split anywhere across reads.
//!
//! Only LF ends a line (a CR before it is dropped, so CRLF works too); a
//! lone CR is ordinary content, because JSON text may not contain a raw CR
//! outside whitespace anyway and NDJSON defines no CR terminator. Lines are
//! decoded only once complete, lossily, so a character split across reads
//! decodes correctly and invalid UTF-8 never panics. The line cap is the
//! SSE framer's [`MAX_LINE_BYTES`](crate::decode::sse::MAX_LINE_BYTES).

use crate::decode::sse::{split_lf, LineBuffer};

/// Incremental NDJSON line splitter.
#[derive(Debug, Default)]
pub struct NdjsonFramer {
    /// The partial line carried over between feeds.
    line: LineBuffer,
}

impl NdjsonFramer {
    pub fn new() -> Self {
        Self::default()
    }

    /// A framer with another line cap than
    /// [`MAX_LINE_BYTES`](crate::decode::sse::MAX_LINE_BYTES). Public only
    /// so the unit tests and the fuzz targets (`fuzz/`) can exercise the
    /// cap with small inputs; production code uses [`NdjsonFramer::new`].
    #[doc(hidden)]
    pub fn with_max_line_bytes(max: usize) -> Self {
        Self {
            line: LineBuffer::with_max(max),
        }
    }

    /// Pushes each complete non-blank line (without its `\n` / `\r\n`),
    /// lossily decoded. Lines of only whitespace are skipped: they carry no
    /// object and some servers pad with them.
    pub fn feed(&mut self, bytes: &[u8], out: &mut Vec<String>) {
        split_lf(&mut self.line, bytes, |line| push_line(line, out));
    }

    /// Flushes a trailing line that had no newline (the body ended without
    /// one). Whether it is a whole object is for the protocol layer to
    /// judge when it parses it.
    pub fn finish(&mut self, out: &mut Vec<String>) {
        if !self.line.is_empty() {
            push_line(&mut self.line, out);
        }
    }

    /// Lines discarded because they exceeded
    /// [`MAX_LINE_BYTES`](crate::decode::sse::MAX_LINE_BYTES).
    pub fn dropped_lines(&self) -> u64 {
        self.line.dropped()
    }
}

/// Ends the buffered line and pushes it unless it was dropped or blank.
fn push_line(line: &mut LineBuffer, out: &mut Vec<String>) {
    let Some(mut text) = line.take_line() else {
        return;
    };
    if text.ends_with('\r') {
        text.pop();
    }
    if !text.trim().is_empty() {
        out.push(text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn run(pieces: &[&[u8]]) -> Vec<String> {
        let mut f = NdjsonFramer::new();
        let mut out = Vec::new();
        for p in pieces {
            f.feed(p, &mut out);
        }
        f.finish(&mut out);
        out
    }

    const SAMPLE: &[u8] =
        b"{\"a\":1}\n{\"b\":\"caf\xC3\xA9\"}\r\n\n  \r\n{\"c\":3}\n{\"done\":true}";

    #[test]
    fn lines_crlf_blank_lines_and_trailing_line() {
        let expected = vec![
            "{\"a\":1}".to_owned(),
            "{\"b\":\"café\"}".to_owned(),
            "{\"c\":3}".to_owned(),
            "{\"done\":true}".to_owned(),
        ];
        assert_eq!(run(&[SAMPLE]), expected);
    }

    #[test]
    fn trailing_line_waits_for_finish() {
        let mut f = NdjsonFramer::new();
        let mut out = Vec::new();
        f.feed(b"{\"a\":1}\n{\"done\":", &mut out);
        f.feed(b"true}", &mut out);
        assert_eq!(out, vec!["{\"a\":1}"]);
        f.finish(&mut out);
        assert_eq!(out, vec!["{\"a\":1}", "{\"done\":true}"]);
        // Nothing left: a second finish adds nothing.
        f.finish(&mut out);
        assert_eq!(out.len(), 2);
    }

    #[test]
    fn lone_cr_is_content_and_invalid_utf8_is_replaced() {
        assert_eq!(run(&[b"a\rb\n"]), vec!["a\rb"]);
        assert_eq!(run(&[b"x\xFFy\n"]), vec!["x\u{fffd}y"]);
        assert_eq!(run(&[b"\r\n\n\r"]), Vec::<String>::new());
    }

    #[test]
    fn every_split_offset_gives_identical_lines() {
        let expected = run(&[SAMPLE]);
        for cut in 0..=SAMPLE.len() {
            assert_eq!(
                run(&[&SAMPLE[..cut], &SAMPLE[cut..]]),
                expected,
                "cut {cut}"
            );
        }
        let bytes: Vec<&[u8]> = SAMPLE.chunks(1).collect();
        assert_eq!(run(&bytes), expected);
    }

    proptest! {
        #[test]
        fn random_splits_are_identical(
            body in proptest::collection::vec(
                prop_oneof![Just(b'\n'), Just(b'\r'), Just(b' '), Just(b'{'), Just(0xC3u8), Just(0xA9u8)],
                0..200,
            ),
            mut cuts in proptest::collection::vec(0usize..200, 0..8),
        ) {
            for c in &mut cuts {
                *c = (*c).min(body.len());
            }
            cuts.sort_unstable();
            let mut pieces = Vec::new();
            let mut start = 0;
            for &c in &cuts {
                pieces.push(&body[start..c]);
                start = c;
            }
            pieces.push(&body[start..]);
            prop_assert_eq!(run(&pieces), run(&[&body]));
        }
    }

    #[test]
    fn overlong_line_is_dropped_and_counted() {
        let mut f = NdjsonFramer::with_max_line_bytes(8);
        let mut out = Vec::new();
        f.feed(b"{\"a\":1}\n{\"long", &mut out);
        f.feed(b"_value\":1}\n{}\n", &mut out);
        assert_eq!(out, vec!["{\"a\":1}", "{}"]);
        assert_eq!(f.dropped_lines(), 1);
        f.feed(b"0123456789", &mut out);
        f.finish(&mut out);
        assert_eq!(out, vec!["{\"a\":1}", "{}"]);
        assert_eq!(f.dropped_lines(), 2);
    }
}
