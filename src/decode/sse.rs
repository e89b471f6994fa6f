//! Server-Sent Events framing: arbitrary byte slices in, dispatched events out.
//!
//! The rules are the WHATWG "event stream interpretation" rules as restated
//! in `docs/protocols.md` "SSE framing", with two deliberate deviations that a
//! *tap* needs and a browser does not (both documented where they happen):
//!
//! 1. the legacy llama.cpp `error: {...}` line, an unknown field that a
//!    conforming parser ignores, is delivered at once as an `error` event
//!    ([`SseFramer::feed`]);
//! 2. at end of body a pending, unterminated event is dispatched instead of
//!    discarded ([`SseFramer::finish`]).
//!
//! Input is split into lines at byte level (CR and LF never occur inside a
//! UTF-8 multibyte sequence), and each line is decoded only once it is
//! complete, so a character split across two reads decodes correctly and
//! invalid UTF-8 becomes U+FFFD instead of a panic.

use memchr::{memchr, memchr2};

/// The longest line either framer buffers, and the most data one SSE event
/// may gather over its `data:` lines. A longer line (or event) is discarded
/// (and counted) rather than held: a tap must never let a misbehaving
/// upstream grow its memory without bound. 16 MiB is far above any real
/// event (the largest llama.cpp final chunk with `generation_settings` is a
/// few KiB).
pub const MAX_LINE_BYTES: usize = 16 * 1024 * 1024;

/// After a line longer than this has been handled, the line buffer gives
/// its memory back, so one large event does not pin megabytes per call.
const SHRINK_ABOVE_BYTES: usize = 64 * 1024;

/// The UTF-8 byte order mark, stripped once at stream start.
const BOM: [u8; 3] = [0xEF, 0xBB, 0xBF];

/// One dispatched SSE event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SseMessage {
    /// The `event:` type, or `None` for the default type (`message`). An
    /// `event:` line with an empty value also means the default type, as in
    /// the spec.
    pub event: Option<String>,
    /// The `data:` lines joined with `\n` (no trailing newline).
    pub data: String,
}

/// A line accumulator with a hard size cap, shared by the SSE and NDJSON
/// framers. Bytes of a line that grows past the cap are thrown away up to
/// the line's terminator; the line is counted as dropped.
#[derive(Debug)]
pub(crate) struct LineBuffer {
    /// Bytes of the current, not yet terminated line.
    buf: Vec<u8>,
    /// The current line went over the cap: ignore bytes until its end.
    discarding: bool,
    /// Lines dropped for exceeding the cap.
    dropped: u64,
    /// The cap (always [`MAX_LINE_BYTES`] outside tests).
    max: usize,
}

impl Default for LineBuffer {
    fn default() -> Self {
        Self::with_max(MAX_LINE_BYTES)
    }
}

impl LineBuffer {
    pub(crate) fn with_max(max: usize) -> Self {
        Self {
            buf: Vec::new(),
            discarding: false,
            dropped: 0,
            max,
        }
    }

    /// Appends a piece of the current line (no terminator bytes in it).
    pub(crate) fn extend(&mut self, piece: &[u8]) {
        if self.discarding || piece.is_empty() {
            return;
        }
        let needed = self.buf.len() + piece.len();
        if needed > self.max {
            self.discarding = true;
            self.dropped += 1;
            self.buf = Vec::new();
            return;
        }
        if needed > self.buf.capacity() {
            // Grow geometrically but never past the cap, so memory stays
            // bounded by `max` even for a line just under it.
            let target = needed.max(self.buf.capacity() * 2).min(self.max);
            self.buf.reserve_exact(target - self.buf.len());
        }
        self.buf.extend_from_slice(piece);
    }

    /// True when nothing of a current line is buffered or being discarded.
    pub(crate) fn is_empty(&self) -> bool {
        self.buf.is_empty() && !self.discarding
    }

    /// Ends the current line: returns it lossily decoded, or `None` when it
    /// was discarded for exceeding the cap.
    pub(crate) fn take_line(&mut self) -> Option<String> {
        if self.discarding {
            self.discarding = false;
            return None;
        }
        let line = String::from_utf8_lossy(&self.buf).into_owned();
        if self.buf.capacity() > SHRINK_ABOVE_BYTES {
            self.buf = Vec::new();
        } else {
            self.buf.clear();
        }
        Some(line)
    }

    pub(crate) fn dropped(&self) -> u64 {
        self.dropped
    }

    #[cfg(test)]
    pub(crate) fn capacity(&self) -> usize {
        self.buf.capacity()
    }
}

/// Incremental SSE parser. Feed it every body slice as it arrives; it keeps
/// the carry-over (partial line, pending event) between calls.
#[derive(Debug, Default)]
pub struct SseFramer {
    /// The partial line carried over between feeds.
    line: LineBuffer,
    /// The last feed ended in a CR that terminated a line; an LF at the
    /// start of the next feed belongs to it (CRLF split across reads) and
    /// must not end a second, empty line.
    after_cr: bool,
    /// The BOM check at stream start is over (stripped or not present).
    bom_done: bool,
    /// How many leading BOM bytes were seen while the check is still open
    /// (the BOM itself may be split across feeds).
    bom_seen: usize,
    /// The spec's data buffer: every `data:` value followed by `\n`.
    data: String,
    /// The spec's event type buffer (`None` = empty = default type).
    event: Option<String>,
    /// A line of the pending event was dropped for exceeding the cap: the
    /// event is incomplete and is discarded at dispatch instead of handing
    /// truncated data to the protocol layer.
    poisoned: bool,
}

impl SseFramer {
    pub fn new() -> Self {
        Self::default()
    }

    /// A framer with another line cap than [`MAX_LINE_BYTES`]. Public only
    /// so the unit tests and the fuzz targets (`fuzz/`) can exercise the
    /// cap with small inputs; production code uses [`SseFramer::new`].
    #[doc(hidden)]
    pub fn with_max_line_bytes(max: usize) -> Self {
        Self {
            line: LineBuffer::with_max(max),
            ..Self::default()
        }
    }

    /// Feed any byte slice (arbitrary split points); dispatched events are
    /// pushed to `out`.
    ///
    /// Deviation from the spec: a line whose field name is `error` (older
    /// llama.cpp wrote mid-stream errors as `error: {...}`, an unknown field
    /// a conforming parser silently drops) is pushed at once as
    /// `SseMessage { event: Some("error"), data: value }`, without waiting
    /// for a blank line and without touching the pending event, because a
    /// tap must not lose a mid-stream error. An `error:` line with an empty
    /// value carries nothing and is ignored.
    pub fn feed(&mut self, bytes: &[u8], out: &mut Vec<SseMessage>) {
        let rest = self.strip_bom(bytes);
        self.scan(rest, out);
    }

    /// End of body. Deviates from the spec on purpose: a conforming parser
    /// discards an event that was not terminated by a blank line, but some
    /// servers end the body right after the last line (KoboldCpp wrote its
    /// final `data: [DONE]` with no blank line), and that last event is the
    /// terminal marker a tap needs. So a partial last line (no terminator)
    /// is first treated as terminated, then a pending event (data seen, no
    /// blank line yet) is dispatched. Whether its data is complete (a JSON
    /// cut mid-object, say) is for the protocol layer to judge: it parses
    /// the data and ignores what does not parse.
    ///
    /// The framer is reset for a new stream afterwards (the dropped-line
    /// count is kept).
    pub fn finish(&mut self, out: &mut Vec<SseMessage>) {
        if !self.bom_done {
            // Fewer than three bytes came, all a BOM prefix: they are data.
            self.bom_done = true;
            let held = BOM;
            let n = self.bom_seen;
            self.scan(&held[..n], out);
        }
        if !self.line.is_empty() {
            self.end_line(out);
        }
        self.dispatch(out);
        let dropped_line = std::mem::take(&mut self.line);
        *self = Self {
            line: dropped_line,
            ..Self::default()
        };
    }

    /// Lines discarded because they exceeded [`MAX_LINE_BYTES`], plus
    /// events discarded because their data did.
    pub fn dropped_lines(&self) -> u64 {
        self.line.dropped()
    }

    /// Consumes a leading BOM (possibly split across feeds) and returns the
    /// bytes that still need scanning.
    fn strip_bom<'a>(&mut self, bytes: &'a [u8]) -> &'a [u8] {
        if self.bom_done {
            return bytes;
        }
        let mut i = 0;
        while self.bom_seen < BOM.len() && i < bytes.len() {
            if bytes[i] != BOM[self.bom_seen] {
                // Not a BOM: the bytes held so far are ordinary line bytes
                // (none of them is CR or LF, so they only extend the line).
                self.bom_done = true;
                self.line.extend(&BOM[..self.bom_seen]);
                return &bytes[i..];
            }
            self.bom_seen += 1;
            i += 1;
        }
        if self.bom_seen == BOM.len() {
            self.bom_done = true;
        }
        &bytes[i..]
    }

    /// Splits bytes into lines at CRLF, LF or lone CR.
    fn scan(&mut self, mut rest: &[u8], out: &mut Vec<SseMessage>) {
        if self.after_cr && !rest.is_empty() {
            self.after_cr = false;
            if rest[0] == b'\n' {
                rest = &rest[1..];
            }
        }
        while let Some(i) = memchr2(b'\r', b'\n', rest) {
            self.line.extend(&rest[..i]);
            self.end_line(out);
            if rest[i] == b'\r' {
                match rest.get(i + 1) {
                    Some(b'\n') => rest = &rest[i + 2..],
                    Some(_) => rest = &rest[i + 1..],
                    None => {
                        self.after_cr = true;
                        return;
                    }
                }
            } else {
                rest = &rest[i + 1..];
            }
        }
        self.line.extend(rest);
    }

    /// Handles one complete line.
    fn end_line(&mut self, out: &mut Vec<SseMessage>) {
        let Some(line) = self.line.take_line() else {
            self.poisoned = true;
            return;
        };
        if line.is_empty() {
            self.dispatch(out);
            return;
        }
        if line.starts_with(':') {
            return; // comment / keep-alive
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line.as_str(), ""),
        };
        match field {
            "data" => {
                // The event's data is capped like a line: without this, an
                // upstream that never sends the blank line would grow it
                // forever, each line under the line cap (found by fuzzing:
                // fuzz/regressions/sse). An event over the cap is poisoned
                // (dropped at dispatch) and counted once; its later lines
                // are not kept.
                if self.poisoned {
                    return;
                }
                if self.data.len() + value.len() > self.line.max {
                    self.poisoned = true;
                    self.line.dropped += 1;
                    self.data = String::new();
                    return;
                }
                self.data.push_str(value);
                self.data.push('\n');
            }
            "event" => {
                self.event = (!value.is_empty()).then(|| value.to_owned());
            }
            // Legacy llama.cpp mid-stream error: see `feed`.
            "error" if !value.is_empty() => out.push(SseMessage {
                event: Some("error".to_owned()),
                data: value.to_owned(),
            }),
            // `id`, `retry` and unknown fields mean nothing to a one-shot
            // POST stream.
            _ => {}
        }
    }

    /// The spec's "dispatch the event": nothing when the data buffer is
    /// empty; both buffers are reset either way.
    fn dispatch(&mut self, out: &mut Vec<SseMessage>) {
        let event = self.event.take();
        let poisoned = std::mem::take(&mut self.poisoned);
        if self.data.is_empty() || poisoned {
            self.data.clear();
            return;
        }
        let mut data = std::mem::take(&mut self.data);
        data.pop(); // the trailing '\n' of the last data line
        out.push(SseMessage { event, data });
    }
}

/// Splits bytes at LF only, for the NDJSON framer (which lives in its own
/// module but shares the capped line buffer). Returns after calling
/// `on_line` for each complete line.
pub(crate) fn split_lf(
    line: &mut LineBuffer,
    mut rest: &[u8],
    mut on_line: impl FnMut(&mut LineBuffer),
) {
    while let Some(i) = memchr(b'\n', rest) {
        line.extend(&rest[..i]);
        on_line(line);
        rest = &rest[i + 1..];
    }
    line.extend(rest);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::path::Path;

    fn msg(event: Option<&str>, data: &str) -> SseMessage {
        SseMessage {
            event: event.map(str::to_owned),
            data: data.to_owned(),
        }
    }

    /// Feeds the pieces in order, then finishes.
    fn run(pieces: &[&[u8]]) -> Vec<SseMessage> {
        let mut f = SseFramer::new();
        let mut out = Vec::new();
        for p in pieces {
            f.feed(p, &mut out);
        }
        f.finish(&mut out);
        out
    }

    fn whole(bytes: &[u8]) -> Vec<SseMessage> {
        run(&[bytes])
    }

    /// Feeds the input cut at the given (sorted, in-range) offsets.
    fn split_at(bytes: &[u8], cuts: &[usize]) -> Vec<SseMessage> {
        let mut pieces = Vec::new();
        let mut start = 0;
        for &c in cuts {
            pieces.push(&bytes[start..c]);
            start = c;
        }
        pieces.push(&bytes[start..]);
        run(&pieces)
    }

    /// Output without `finish`, to check what is dispatched by the stream
    /// itself.
    fn fed_only(bytes: &[u8]) -> Vec<SseMessage> {
        let mut f = SseFramer::new();
        let mut out = Vec::new();
        f.feed(bytes, &mut out);
        out
    }

    #[test]
    fn lf_crlf_cr_and_mixed_terminators() {
        let expected = vec![msg(None, "a"), msg(None, "b")];
        assert_eq!(fed_only(b"data: a\n\ndata: b\n\n"), expected);
        assert_eq!(fed_only(b"data: a\r\n\r\ndata: b\r\n\r\n"), expected);
        assert_eq!(fed_only(b"data: a\r\rdata: b\r\r"), expected);
        assert_eq!(fed_only(b"data: a\r\n\ndata: b\n\r"), expected);
        assert_eq!(fed_only(b"data: a\r\r\ndata: b\n\r\n"), expected);
    }

    #[test]
    fn cr_cr_terminates_an_event() {
        assert_eq!(fed_only(b"data: x\r\r"), vec![msg(None, "x")]);
        // A single CR ends the line but not the event.
        assert_eq!(fed_only(b"data: x\r"), vec![]);
    }

    #[test]
    fn cr_at_end_of_feed_then_lf_is_one_terminator() {
        // If the LF were taken as a second (empty) line, this would
        // dispatch "a" alone and then "b" alone.
        let out = run(&[b"data: a\r", b"\ndata: b\r", b"\n\r", b"\n"]);
        assert_eq!(out, vec![msg(None, "a\nb")]);
        // A lone CR at the end of a feed followed by a CR: an empty line.
        let out = run(&[b"data: a\r", b"\rdata: b\n\n"]);
        assert_eq!(out, vec![msg(None, "a"), msg(None, "b")]);
        // An empty feed in between must not forget the pending CR.
        let out = run(&[b"data: a\r", b"", b"\n", b"data: b\n\n"]);
        assert_eq!(out, vec![msg(None, "a\nb")]);
    }

    #[test]
    fn comments_and_keepalives_produce_nothing() {
        assert_eq!(whole(b": ping\n\n:\n\n:\r\n\r\n"), vec![]);
        assert_eq!(
            whole(b": ping\ndata: x\n:\n\n"),
            vec![msg(None, "x")],
            "a comment inside an event does not disturb it"
        );
    }

    #[test]
    fn data_lines_are_joined_with_newline() {
        assert_eq!(
            fed_only(b"data: {\"a\":\ndata: 1}\n\n"),
            vec![msg(None, "{\"a\":\n1}")]
        );
        // An empty data line is still data: per spec this dispatches "".
        assert_eq!(fed_only(b"data:\n\n"), vec![msg(None, "")]);
        assert_eq!(fed_only(b"data\n\n"), vec![msg(None, "")]);
        assert_eq!(fed_only(b"data:\ndata:\n\n"), vec![msg(None, "\n")]);
    }

    #[test]
    fn event_type_is_set_and_reset() {
        let out = fed_only(
            b"event: message_start\ndata: {}\n\ndata: plain\n\nevent: orphan\n\ndata: after\n\n",
        );
        assert_eq!(
            out,
            vec![
                msg(Some("message_start"), "{}"),
                msg(None, "plain"),
                // `event:` with no data is not dispatched, and its type
                // does not leak into the next event.
                msg(None, "after"),
            ]
        );
        assert_eq!(fed_only(b"event:\ndata: x\n\n"), vec![msg(None, "x")]);
    }

    #[test]
    fn value_loses_exactly_one_leading_space() {
        assert_eq!(fed_only(b"data:x\n\n"), vec![msg(None, "x")]);
        assert_eq!(fed_only(b"data: x\n\n"), vec![msg(None, "x")]);
        assert_eq!(fed_only(b"data:  x\n\n"), vec![msg(None, " x")]);
        assert_eq!(fed_only(b"data:\tx\n\n"), vec![msg(None, "\tx")]);
        // Only the first colon separates field and value.
        assert_eq!(fed_only(b"data: a:b: c\n\n"), vec![msg(None, "a:b: c")]);
    }

    #[test]
    fn field_without_colon_and_unknown_fields_are_ignored() {
        assert_eq!(
            fed_only(b"id: 7\nretry: 10\nfoo: bar\nfoo\nid\ndata: x\n\n"),
            vec![msg(None, "x")]
        );
        // A field name with a trailing space is not `data`.
        assert_eq!(fed_only(b"data : x\n\n"), vec![]);
    }

    #[test]
    fn legacy_error_line_is_delivered_at_once() {
        let out = fed_only(b"data: a\nerror: {\"code\":500}\n");
        assert_eq!(out, vec![msg(Some("error"), "{\"code\":500}")]);
        // ... and does not disturb the pending event.
        let out = whole(b"data: a\nerror: {\"code\":500}\n\n");
        assert_eq!(
            out,
            vec![msg(Some("error"), "{\"code\":500}"), msg(None, "a")]
        );
        assert_eq!(whole(b"error:\n\n"), vec![]);
    }

    #[test]
    fn bom_is_stripped_once_even_when_split() {
        let body = b"\xEF\xBB\xBFdata: x\n\n";
        for cut1 in 0..=body.len() {
            for cut2 in cut1..=body.len() {
                assert_eq!(split_at(body, &[cut1, cut2]), vec![msg(None, "x")]);
            }
        }
        // Only at stream start: a second BOM is part of the line, so the
        // field name is no longer `data`.
        assert_eq!(whole(b"\xEF\xBB\xBF\xEF\xBB\xBFdata: x\n\n"), vec![]);
        // A BOM later in the stream is data.
        assert_eq!(
            whole(b"data: \xEF\xBB\xBFx\n\n"),
            vec![msg(None, "\u{feff}x")]
        );
    }

    #[test]
    fn partial_bom_prefix_is_ordinary_bytes() {
        // EF BB then 'd': not a BOM; the two bytes are kept (and decode as
        // one replacement character), so the field name is not `data`.
        let out = run(&[b"\xEF", b"\xBBdata: x\n\n"]);
        assert_eq!(out, vec![]);
        let out = run(&[b"\xEF\xBB", b"\ndata: x\n\n"]);
        assert_eq!(out, vec![msg(None, "x")]);
        // A body that is only a BOM prefix ends without a panic.
        assert_eq!(run(&[b"\xEF\xBB"]), vec![]);
    }

    #[test]
    fn finish_flushes_an_unterminated_trailing_event() {
        // KoboldCpp-style: last line has a newline but no blank line.
        assert_eq!(fed_only(b"data: a\n\ndata: [DONE]\n"), vec![msg(None, "a")]);
        assert_eq!(
            whole(b"data: a\n\ndata: [DONE]\n"),
            vec![msg(None, "a"), msg(None, "[DONE]")]
        );
        // No newline at all.
        assert_eq!(whole(b"data: [DONE]"), vec![msg(None, "[DONE]")]);
        assert_eq!(whole(b"data: [DONE]\r"), vec![msg(None, "[DONE]")]);
        // Nothing pending: finish adds nothing.
        assert_eq!(whole(b"data: a\n\n"), vec![msg(None, "a")]);
        assert_eq!(whole(b"event: x\n"), vec![]);
        assert_eq!(whole(b": ping"), vec![]);
    }

    #[test]
    fn finish_resets_for_a_new_stream() {
        let mut f = SseFramer::new();
        let mut out = Vec::new();
        f.feed(b"\xEF\xBB\xBFevent: e\ndata: a", &mut out);
        f.finish(&mut out);
        f.feed(b"\xEF\xBB\xBFdata: b\n\n", &mut out);
        assert_eq!(out, vec![msg(Some("e"), "a"), msg(None, "b")]);
    }

    #[test]
    fn invalid_and_split_utf8() {
        let text = "data: héllo 🦀\n\n".as_bytes();
        // A multibyte char split across feeds decodes correctly.
        for cut in 0..=text.len() {
            assert_eq!(split_at(text, &[cut]), vec![msg(None, "héllo 🦀")]);
        }
        // Invalid bytes become U+FFFD, also when split.
        let bad = b"data: a\xFF\xC3b\xF0\x9F\n\n";
        for cut in 0..=bad.len() {
            assert_eq!(
                split_at(bad, &[cut]),
                vec![msg(None, "a\u{fffd}\u{fffd}b\u{fffd}")]
            );
        }
    }

    const SAMPLE: &[u8] = b"\xEF\xBB\xBF: keep-alive\r\n\r\nevent: message_start\r\ndata: {\"type\":\"message_start\"}\r\n\r\ndata:{\"a\":1}\n\ndata: {\"multi\":\ndata:  \"line\"}\r\rid: 3\nretry: 100\n: ping\n\nevent: delta\ndata: {\"t\":\"caf\xC3\xA9 \xF0\x9F\xA6\x80\"}\n\nerror: {\"message\":\"boom\"}\r\ndata: \xFF\r\n\r\ndata: [DONE]";

    #[test]
    fn sample_stream_gives_expected_messages() {
        assert_eq!(
            whole(SAMPLE),
            vec![
                msg(Some("message_start"), "{\"type\":\"message_start\"}"),
                msg(None, "{\"a\":1}"),
                msg(None, "{\"multi\":\n \"line\"}"),
                msg(Some("delta"), "{\"t\":\"café 🦀\"}"),
                msg(Some("error"), "{\"message\":\"boom\"}"),
                msg(None, "\u{fffd}"),
                msg(None, "[DONE]"),
            ]
        );
    }

    #[test]
    fn every_split_offset_of_sample_gives_identical_messages() {
        let expected = whole(SAMPLE);
        for cut in 0..=SAMPLE.len() {
            assert_eq!(split_at(SAMPLE, &[cut]), expected, "cut at {cut}");
        }
        // And one byte per feed: every offset is a split at once.
        let bytes: Vec<&[u8]> = SAMPLE.chunks(1).collect();
        assert_eq!(run(&bytes), expected);
    }

    proptest! {
        #[test]
        fn random_multi_splits_of_sample_are_identical(
            mut cuts in proptest::collection::vec(0..=SAMPLE.len(), 0..12)
        ) {
            cuts.sort_unstable();
            prop_assert_eq!(split_at(SAMPLE, &cuts), whole(SAMPLE));
        }

        #[test]
        fn random_streams_split_anywhere_are_identical(
            parts in proptest::collection::vec(
                prop_oneof![
                    Just(&b"\r"[..]), Just(&b"\n"[..]), Just(&b"\r\n"[..]),
                    Just(&b"data:"[..]), Just(&b"data: "[..]), Just(&b"event: e"[..]),
                    Just(&b":"[..]), Just(&b"error: x"[..]), Just(&b"id"[..]),
                    Just(&b"\xEF\xBB\xBF"[..]), Just(&b"\xEF\xBB"[..]), Just(&b"\xC3\xA9"[..]),
                    Just(&b"\xFF"[..]), Just(&b"x"[..]), Just(&b" "[..]),
                ],
                0..40,
            ),
            mut cuts in proptest::collection::vec(0usize..400, 0..10),
        ) {
            let body: Vec<u8> = parts.concat();
            for c in &mut cuts {
                *c = (*c).min(body.len());
            }
            cuts.sort_unstable();
            prop_assert_eq!(split_at(&body, &cuts), whole(&body));
        }
    }

    #[test]
    fn overlong_line_is_dropped_counted_and_bounded() {
        let mut f = SseFramer::with_max_line_bytes(64);
        let mut out = Vec::new();
        f.feed(b"data: ok\n\n", &mut out);
        f.feed(b"data: ", &mut out);
        for _ in 0..100 {
            f.feed(&[b'a'; 50], &mut out);
            assert!(f.line.capacity() <= 64, "never buffers past the cap");
        }
        f.feed(b"\n\ndata: next\n\n", &mut out);
        assert_eq!(out, vec![msg(None, "ok"), msg(None, "next")]);
        assert_eq!(f.dropped_lines(), 1);
        // Exactly at the cap is kept.
        let line = format!("data: {}\n\n", "b".repeat(58));
        f.feed(line.as_bytes(), &mut out);
        assert_eq!(out.last().unwrap().data.len(), 58);
        assert_eq!(f.dropped_lines(), 1);
    }

    #[test]
    fn event_that_lost_a_line_is_not_dispatched() {
        let mut f = SseFramer::with_max_line_bytes(16);
        let mut out = Vec::new();
        f.feed(
            b"data: {\"a\":\ndata: 0123456789012345\ndata: 1}\n\n",
            &mut out,
        );
        assert_eq!(out, vec![]);
        f.feed(b"data: fine\n\n", &mut out);
        assert_eq!(out, vec![msg(None, "fine")]);
        // A line still over the cap at end of body is dropped too.
        f.feed(b"data: 0123456789012345", &mut out);
        f.finish(&mut out);
        assert_eq!(out, vec![msg(None, "fine")]);
        assert_eq!(f.dropped_lines(), 2);
    }

    /// Found by the `sse` fuzz target (fuzz/regressions/sse): many short
    /// `data:` lines and no blank line grew the event's data past the cap.
    #[test]
    fn event_data_is_capped_like_a_line() {
        let mut f = SseFramer::with_max_line_bytes(16);
        let mut out = Vec::new();
        f.feed(b"data: 0123456789\n", &mut out);
        f.feed(b"data: 01234\n", &mut out); // 10 + 1 + 5 = 16: still fits
        f.feed(b"\ndata: 0123456789\n", &mut out);
        for _ in 0..1000 {
            f.feed(b"data: 0123456789\n", &mut out);
            assert!(f.data.len() <= 16, "pending data bounded by the cap");
        }
        f.feed(b"\ndata: after\n\n", &mut out);
        assert_eq!(
            out,
            vec![msg(None, "0123456789\n01234"), msg(None, "after")]
        );
        assert_eq!(f.dropped_lines(), 1, "the oversized event counts once");
        // The same at end of body, with no blank line at all.
        f.feed(b"data: 0123456789\ndata: 0123456789", &mut out);
        f.finish(&mut out);
        assert_eq!(out.len(), 2);
        assert_eq!(f.dropped_lines(), 2);
    }

    #[test]
    fn overlong_line_at_real_cap_is_dropped() {
        let mut f = SseFramer::new();
        let mut out = Vec::new();
        f.feed(b"data: ", &mut out);
        let chunk = vec![b'z'; 1024 * 1024];
        for _ in 0..17 {
            f.feed(&chunk, &mut out);
            assert!(f.line.capacity() <= MAX_LINE_BYTES);
        }
        f.feed(b"\n\ndata: after\n\n", &mut out);
        assert_eq!(out, vec![msg(None, "after")]);
        assert_eq!(f.dropped_lines(), 1);
        assert!(f.line.capacity() < 1024, "memory given back after the drop");
    }

    // === real captured streams ===

    const FIXTURES: &str = "tests/fixtures/real";

    /// Every captured response body served as SSE.
    fn sse_fixtures() -> Vec<(String, Vec<u8>)> {
        let mut found = Vec::new();
        for server in ["llama-server", "llama-cpp-python"] {
            let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join(FIXTURES)
                .join(server);
            let index = std::fs::read_to_string(dir.join("index.json"))
                .unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
            let index: serde_json::Value = serde_json::from_str(&index).unwrap();
            for entry in index.as_array().unwrap() {
                let ct = entry["content_type"].as_str().unwrap_or("");
                if !ct.starts_with("text/event-stream") {
                    continue;
                }
                let name = entry["name"].as_str().unwrap();
                let body = std::fs::read(dir.join(format!("{name}.response.txt"))).unwrap();
                found.push((format!("{server}/{name}"), body));
            }
        }
        found
    }

    /// Offsets to split a fixture at: all of them for small files; for big
    /// ones every offset in the first 4 KiB plus pseudo-random others.
    fn split_offsets(len: usize) -> Vec<usize> {
        const ALL_BELOW: usize = 8 * 1024;
        if len <= ALL_BELOW {
            return (0..=len).collect();
        }
        let mut offsets: Vec<usize> = (0..=4096).collect();
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15 ^ len as u64;
        for _ in 0..256 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            offsets.push(x as usize % (len + 1));
        }
        offsets
    }

    #[test]
    fn real_sse_fixtures_split_anywhere_are_identical() {
        let fixtures = sse_fixtures();
        assert!(
            fixtures.len() >= 20,
            "found {} SSE fixtures",
            fixtures.len()
        );
        for (name, body) in &fixtures {
            let expected = whole(body);
            if !body.is_empty() {
                assert!(!expected.is_empty(), "{name}: no events");
            }
            for cut in split_offsets(body.len()) {
                assert_eq!(split_at(body, &[cut]), expected, "{name} cut at {cut}");
            }
            // Nothing in a real stream needs the end-of-body flush, and
            // every event of an OpenAI-style stream is JSON or [DONE].
            assert_eq!(fed_only(body), expected, "{name}: relies on finish");
            for m in &expected {
                assert!(
                    m.data == "[DONE]"
                        || serde_json::from_str::<serde_json::Value>(&m.data).is_ok(),
                    "{name}: event data is not JSON: {:?}",
                    m.data
                );
            }
        }
    }

    #[test]
    fn real_sse_fixture_fed_as_captured_reads_is_identical() {
        use base64::Engine as _;
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join(FIXTURES)
            .join("llama-server");
        for name in [
            "chat_stream",
            "anthropic_messages_stream",
            "responses_stream",
        ] {
            let body = std::fs::read(dir.join(format!("{name}.response.txt"))).unwrap();
            let chunks = std::fs::read_to_string(dir.join(format!("{name}.chunks.jsonl"))).unwrap();
            let reads: Vec<Vec<u8>> = chunks
                .lines()
                .filter(|l| !l.trim().is_empty())
                .map(|l| {
                    let v: serde_json::Value = serde_json::from_str(l).unwrap();
                    base64::engine::general_purpose::STANDARD
                        .decode(v["body_b64"].as_str().unwrap())
                        .unwrap()
                })
                .collect();
            assert_eq!(reads.concat(), body, "{name}: reads rebuild the body");
            let pieces: Vec<&[u8]> = reads.iter().map(Vec::as_slice).collect();
            assert_eq!(run(&pieces), whole(&body), "{name}");
        }
    }
}
