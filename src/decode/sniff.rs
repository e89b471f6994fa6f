//! The framing of a streamed reply, read from its first bytes.
//!
//! A server answering a streaming request may label its stream wrongly: an
//! OpenAI-style SSE stream sent as `application/json` or `text/plain`, an
//! Ollama NDJSON stream as `text/plain`. Decoded by its label, such a
//! stream was buffered as one JSON body: its time to first token was the
//! first byte's, and it had no rate. So on a call that asked for a stream
//! the bytes decide, whatever the `Content-Type` says:
//!
//! - a first line that is an SSE field (`data:`, `event:`, `id:`,
//!   `retry:`) means SSE; comment lines (`: ping`) before it are skipped,
//!   but decide nothing alone (one `:` byte is also how binary may begin);
//! - a first line that is a whole JSON object, followed by another line
//!   starting with `{`, means NDJSON (one object per line); when the label
//!   already says NDJSON, the first whole line is enough;
//! - one JSON object alone (the body ended after it), or a JSON document
//!   spread over several lines (pretty-printed), means one JSON body: the
//!   server answered the streaming request without streaming;
//! - anything else (an HTML error page, plain text) is not decided here:
//!   the label's framing stands, so what can't be parsed passes untouched.
//!
//! Pure: bytes in, a verdict out. The caller keeps the frames (with their
//! arrival times) until the verdict, then meters them in order, so waiting
//! for the verdict changes no number.

use crate::decode::detect::BodyFraming;

/// The most of a body read before deciding: past it the label's framing
/// stands. A first line this long is no stream's.
pub const SNIFF_LIMIT: usize = 64 * 1024;

/// What the first bytes of a body say about its framing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sniffed {
    /// The bytes say this framing.
    Framing(BodyFraming),
    /// Not enough bytes yet to tell.
    NeedMore,
    /// The bytes are none of the framings: keep the label's.
    Undecided,
}

/// The SSE field names a stream may open with.
const SSE_OPENINGS: [&[u8]; 4] = [b"data:", b"event:", b"id:", b"retry:"];

/// Reads the framing from `prefix`, the body's bytes so far. `declared`
/// is the framing the `Content-Type` gave; `ended` says the body is over
/// (no more bytes will come), so the verdict must not be `NeedMore`.
pub fn sniff_framing(prefix: &[u8], declared: BodyFraming, ended: bool) -> Sniffed {
    let verdict = read_opening(skip_blank(prefix), declared, ended);
    match verdict {
        Sniffed::NeedMore if ended || prefix.len() >= SNIFF_LIMIT => Sniffed::Undecided,
        v => v,
    }
}

/// The bytes after any leading whitespace and UTF-8 byte order mark.
fn skip_blank(bytes: &[u8]) -> &[u8] {
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    let start = bytes
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(bytes.len());
    &bytes[start..]
}

fn read_opening(text: &[u8], declared: BodyFraming, ended: bool) -> Sniffed {
    let text = match after_comments(text, ended) {
        Ok(text) => text,
        Err(verdict) => return verdict,
    };
    if text.is_empty() {
        return Sniffed::NeedMore;
    }
    if SSE_OPENINGS.iter().any(|field| text.starts_with(field)) {
        return Sniffed::Framing(BodyFraming::Sse);
    }
    if SSE_OPENINGS.iter().any(|field| field.starts_with(text)) {
        return Sniffed::NeedMore;
    }
    if text[0] == b'{' {
        return read_json_opening(text, declared, ended);
    }
    Sniffed::Undecided
}

/// The bytes after the SSE comment lines a stream may open with (`: ping`),
/// each a whole line of text; `Err` with the verdict when a comment is
/// cut (more may come) or is not text (no stream's).
fn after_comments(mut text: &[u8], ended: bool) -> Result<&[u8], Sniffed> {
    while text.first() == Some(&b':') {
        let Some(newline) = memchr::memchr(b'\n', text) else {
            return Err(if ended {
                Sniffed::Undecided
            } else {
                Sniffed::NeedMore
            });
        };
        if std::str::from_utf8(&text[..newline]).is_err() {
            return Err(Sniffed::Undecided);
        }
        text = skip_blank(&text[newline + 1..]);
    }
    Ok(text)
}

/// A body opening with `{`: NDJSON, one JSON body, or not known yet.
fn read_json_opening(text: &[u8], declared: BodyFraming, ended: bool) -> Sniffed {
    let Some(newline) = memchr::memchr(b'\n', text) else {
        return if ended && is_json(text) {
            Sniffed::Framing(BodyFraming::Json)
        } else {
            Sniffed::NeedMore
        };
    };
    if !is_json(&text[..newline]) {
        // A document spread over lines, or a line that isn't JSON.
        return if is_json_prefix_of_document(text, ended) {
            Sniffed::Framing(BodyFraming::Json)
        } else {
            Sniffed::Undecided
        };
    }
    if declared == BodyFraming::Ndjson {
        return Sniffed::Framing(BodyFraming::Ndjson);
    }
    let rest = skip_blank(&text[newline + 1..]);
    match rest.first() {
        None if ended => Sniffed::Framing(BodyFraming::Json),
        None => Sniffed::NeedMore,
        Some(b'{') => Sniffed::Framing(BodyFraming::Ndjson),
        Some(_) => Sniffed::Undecided,
    }
}

/// Whether `line` is one whole JSON value.
fn is_json(line: &[u8]) -> bool {
    serde_json::from_slice::<serde::de::IgnoredAny>(line).is_ok()
}

/// A first line that is not a whole JSON value but opens a document: a
/// pretty-printed body (`{` alone, or `{"a": 1,`). Checked on the whole
/// body when it ended, else taken as a body when the line does not parse
/// as a finished value (the usual pretty-printed opening).
fn is_json_prefix_of_document(text: &[u8], ended: bool) -> bool {
    if ended {
        return is_json(text);
    }
    let mut de = serde_json::Deserializer::from_slice(text);
    match serde::de::Deserialize::deserialize(&mut de) {
        Ok(serde::de::IgnoredAny) => true,
        Err(e) => e.is_eof(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use BodyFraming::*;

    fn sniff(bytes: &str, declared: BodyFraming, ended: bool) -> Sniffed {
        sniff_framing(bytes.as_bytes(), declared, ended)
    }

    #[test]
    fn data_lines_are_sse_whatever_the_label_says() {
        for declared in [Json, Other, Ndjson, Sse] {
            assert_eq!(
                sniff("data: {\"choices\":[]}\n\n", declared, false),
                Sniffed::Framing(Sse)
            );
        }
        assert_eq!(
            sniff(": keep-alive\n\ndata: {}\n\n", Json, false),
            Sniffed::Framing(Sse)
        );
        assert_eq!(
            sniff("event: message_start\n", Other, false),
            Sniffed::Framing(Sse)
        );
    }

    #[test]
    fn a_comment_alone_decides_nothing_and_binary_opening_with_a_colon_is_no_stream() {
        assert_eq!(sniff(": keep-alive\n\n", Json, false), Sniffed::NeedMore);
        assert_eq!(sniff(": keep-alive\n\n", Json, true), Sniffed::Undecided);
        assert_eq!(sniff(":\x01\x7f", Other, false), Sniffed::NeedMore);
        assert_eq!(
            sniff_framing(b":\xff\xfe\x00\n\x92data: x", Other, false),
            Sniffed::Undecided
        );
    }

    #[test]
    fn a_cut_field_name_waits_for_more() {
        assert_eq!(sniff("da", Json, false), Sniffed::NeedMore);
        assert_eq!(sniff("\r\n  ev", Json, false), Sniffed::NeedMore);
        assert_eq!(sniff("", Json, false), Sniffed::NeedMore);
        assert_eq!(sniff("da", Json, true), Sniffed::Undecided);
    }

    #[test]
    fn two_json_lines_are_ndjson() {
        let first = "{\"model\":\"m\",\"message\":{\"content\":\"a\"},\"done\":false}\n";
        assert_eq!(sniff(first, Other, false), Sniffed::NeedMore);
        let two = format!("{first}{{\"model\"");
        assert_eq!(sniff(&two, Other, false), Sniffed::Framing(Ndjson));
        assert_eq!(sniff(&two, Json, false), Sniffed::Framing(Ndjson));
    }

    #[test]
    fn a_json_line_labelled_ndjson_needs_no_second_line() {
        let first = "{\"done\":false}\n";
        assert_eq!(sniff(first, Ndjson, false), Sniffed::Framing(Ndjson));
    }

    #[test]
    fn one_json_object_alone_is_a_json_body() {
        let body = "{\"choices\":[{\"message\":{\"content\":\"hi\"}}]}";
        assert_eq!(sniff(body, Json, false), Sniffed::NeedMore);
        assert_eq!(sniff(body, Json, true), Sniffed::Framing(Json));
        assert_eq!(
            sniff(&format!("{body}\n"), Other, true),
            Sniffed::Framing(Json)
        );
    }

    #[test]
    fn a_pretty_printed_document_is_a_json_body() {
        assert_eq!(
            sniff("{\n  \"choices\": [", Other, false),
            Sniffed::Framing(Json)
        );
        assert_eq!(
            sniff("{\n \"a\": 1\n}\n", Other, true),
            Sniffed::Framing(Json)
        );
    }

    #[test]
    fn other_bytes_keep_the_label() {
        assert_eq!(sniff("<html><body>502", Sse, false), Sniffed::Undecided);
        assert_eq!(sniff("Internal error\n", Other, false), Sniffed::Undecided);
        assert_eq!(sniff("{not json}\n{", Json, false), Sniffed::Undecided);
    }

    #[test]
    fn a_first_line_past_the_limit_keeps_the_label() {
        let long = format!("{{\"a\":\"{}", "x".repeat(SNIFF_LIMIT));
        assert_eq!(sniff(&long, Json, false), Sniffed::Undecided);
    }
}
