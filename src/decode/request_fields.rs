//! A streaming scanner for the two request fields metering needs: the
//! top-level `model` and `stream` of a JSON request body.
//!
//! Clients put them anywhere: the `openai` Python SDK writes `messages`
//! first, so a long context (or one attached image) pushes `model` and
//! `stream` megabytes into the body. Buffering the body to parse it would
//! cost its whole size per call, and a capped prefix loses both fields.
//! [`RequestScanner`] instead reads the bytes as they pass, in pieces of
//! any size, keeping only its position in the JSON grammar (depth, inside
//! a string or not) and the two values. String contents, the bulk of any
//! request, are skipped with `memchr`, so a 30 MB body costs a few
//! milliseconds and no memory.
//!
//! What it accepts is deliberately forgiving, like a reader that stops at
//! the first thing it doesn't understand: a body that is not a JSON object
//! yields nothing, and a body cut or broken mid-way keeps what came before.
//! A key repeated at the top level takes its last well-typed value, as a
//! JSON parser building a map would.

use memchr::memchr2;

/// Longest top-level key worth comparing (`"stream"` and `"model"` are
/// shorter; a longer key is simply some other key).
const MAX_KEY_BYTES: usize = 16;

/// Longest `model` value kept, raw. Real model names are far shorter (the
/// longest Hugging Face repo-plus-file names are about 200 bytes); a longer
/// string is not a model name worth showing and is ignored.
pub const MAX_MODEL_BYTES: usize = 1024;

/// The top-level fields of a request body that metering reads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestFields {
    /// The top-level `model`, when it is a string.
    pub model: Option<String>,
    /// The top-level `stream`, when it is `true` or `false` (`null` and
    /// other types leave each API's default in force).
    pub stream: Option<bool>,
    /// Bytes of string content in the body outside `model` (the messages,
    /// prompt, system text...), counted as they pass and never kept: the
    /// prompt's size, for the wait explanations (about 4 bytes a token
    /// before calibration, see `docs/metering.md`).
    pub text_bytes: u64,
    /// The top-level object closed: `text_bytes` is final.
    pub complete: bool,
}

impl RequestFields {
    /// The prompt's size in tokens before calibration: the string bytes
    /// over 4 (o200k's average for English is close to 4.2 bytes a token;
    /// the per-route calibration absorbs the rest).
    pub fn raw_prompt_tokens(&self) -> u64 {
        self.text_bytes.div_ceil(4)
    }
}

impl RequestFields {
    /// Scans a whole body at once (tests, captures, the fuzzer).
    pub fn scan(body: &[u8]) -> RequestFields {
        let mut scanner = RequestScanner::default();
        scanner.feed(body);
        scanner.into_fields()
    }
}

/// Which top-level member the scanner is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Key {
    Model,
    Stream,
    Other,
}

/// Where in the JSON grammar the scanner stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Before the opening brace (whitespace and a UTF-8 BOM allowed).
    Start,
    /// Inside the top-level object, expecting a key or `}`.
    ExpectKey,
    /// Inside a top-level key string.
    InKey { escaped: bool },
    /// After a top-level key, expecting `:`.
    ExpectColon,
    /// Expecting a top-level member's value.
    ExpectValue,
    /// Inside the string value of `model`, which is being kept.
    InModel { escaped: bool },
    /// Inside a bare top-level value (`true`, `false`, `null`, a number).
    InLiteral,
    /// Inside a nested object or array, outside any string.
    Nested,
    /// Inside a string that is skipped (a nested one, or a top-level
    /// value nobody reads).
    InSkippedString { escaped: bool },
    /// After a top-level value, expecting `,` or `}`.
    AfterValue,
    /// The top-level object closed, or the body is not one: nothing more
    /// is read.
    Finished,
}

/// Reads `model` and `stream` from a request body fed in pieces.
#[derive(Debug)]
pub struct RequestScanner {
    state: State,
    /// Open objects and arrays, the top-level object included.
    depth: usize,
    key: Key,
    /// The key being read, the `model` value being read, or the literal
    /// being read for `stream`; cleared at each member.
    buf: Vec<u8>,
    /// The current key or model value outgrew its limit.
    overflow: bool,
    fields: RequestFields,
    /// A field changed during the current [`RequestScanner::feed`].
    changed: bool,
}

impl Default for RequestScanner {
    fn default() -> Self {
        RequestScanner {
            state: State::Start,
            depth: 0,
            key: Key::Other,
            buf: Vec::new(),
            overflow: false,
            fields: RequestFields::default(),
            changed: false,
        }
    }
}

impl RequestScanner {
    /// The fields found so far.
    pub fn fields(&self) -> &RequestFields {
        &self.fields
    }

    /// The fields found, taking them.
    pub fn into_fields(self) -> RequestFields {
        self.fields
    }

    /// Whether the scanner has stopped reading: the top-level object
    /// closed, or the body was not a JSON object.
    pub fn is_finished(&self) -> bool {
        self.state == State::Finished
    }

    /// Reads the next piece of the body. Returns true when a field changed
    /// (a `model` or `stream` value was found), so the caller can pass the
    /// news on at once.
    pub fn feed(&mut self, bytes: &[u8]) -> bool {
        self.changed = false;
        let mut i = 0;
        while i < bytes.len() {
            i = match self.state {
                State::Finished => break,
                State::InSkippedString { escaped } => self.skip_string(bytes, i, escaped),
                State::Nested => self.skip_nested(bytes, i),
                _ => {
                    self.step(bytes[i]);
                    i + 1
                }
            };
        }
        self.changed
    }

    /// Skips string contents with `memchr`: only a quote or a backslash
    /// can end or escape the string.
    fn skip_string(&mut self, bytes: &[u8], i: usize, escaped: bool) -> usize {
        let start = i;
        let end = self.skip_string_inner(bytes, i, escaped);
        // String content only: the closing quote is not text.
        let content = if matches!(self.state, State::InSkippedString { .. }) {
            end - start
        } else {
            (end - start).saturating_sub(1)
        };
        self.fields.text_bytes += content as u64;
        end
    }

    fn skip_string_inner(&mut self, bytes: &[u8], mut i: usize, mut escaped: bool) -> usize {
        if escaped {
            i += 1;
            escaped = false;
        }
        while i < bytes.len() {
            match memchr2(b'"', b'\\', &bytes[i..]) {
                None => {
                    self.state = State::InSkippedString { escaped };
                    return bytes.len();
                }
                Some(at) if bytes[i + at] == b'\\' => {
                    if i + at + 1 >= bytes.len() {
                        self.state = State::InSkippedString { escaped: true };
                        return bytes.len();
                    }
                    i += at + 2;
                }
                Some(at) => {
                    self.state = if self.depth > 1 {
                        State::Nested
                    } else {
                        State::AfterValue
                    };
                    return i + at + 1;
                }
            }
        }
        self.state = State::InSkippedString { escaped };
        i
    }

    /// Skips a nested value's structure up to its next string or bracket.
    fn skip_nested(&mut self, bytes: &[u8], i: usize) -> usize {
        let structural = |b: &u8| matches!(b, b'"' | b'{' | b'[' | b'}' | b']');
        let Some(at) = bytes[i..].iter().position(structural) else {
            return bytes.len();
        };
        match bytes[i + at] {
            b'"' => self.state = State::InSkippedString { escaped: false },
            b'{' | b'[' => self.depth += 1,
            _ => {
                self.depth -= 1;
                if self.depth == 1 {
                    self.state = State::AfterValue;
                }
            }
        }
        i + at + 1
    }

    /// One byte in any state that is read byte by byte.
    fn step(&mut self, b: u8) {
        match self.state {
            State::Start => match b {
                b'{' => {
                    self.depth = 1;
                    self.state = State::ExpectKey;
                }
                // A UTF-8 byte order mark, possibly split across pieces.
                0xEF | 0xBB | 0xBF => {}
                _ if b.is_ascii_whitespace() => {}
                _ => self.state = State::Finished,
            },
            State::ExpectKey => match b {
                b'"' => {
                    self.begin_member();
                    self.state = State::InKey { escaped: false };
                }
                b'}' => self.close(),
                _ if b.is_ascii_whitespace() => {}
                _ => self.state = State::Finished,
            },
            State::InKey { escaped } => self.key_byte(b, escaped),
            State::ExpectColon => match b {
                b':' => {
                    self.buf.clear();
                    self.overflow = false;
                    self.state = State::ExpectValue;
                }
                _ if b.is_ascii_whitespace() => {}
                _ => self.state = State::Finished,
            },
            State::ExpectValue => self.value_start(b),
            State::InModel { escaped } => self.model_byte(b, escaped),
            State::InLiteral => self.literal_byte(b),
            State::AfterValue => match b {
                b',' => self.state = State::ExpectKey,
                b'}' => self.close(),
                _ if b.is_ascii_whitespace() => {}
                _ => self.state = State::Finished,
            },
            State::Nested | State::InSkippedString { .. } | State::Finished => {}
        }
    }

    /// A byte of a top-level key; the closing quote says which member
    /// this is.
    fn key_byte(&mut self, b: u8, escaped: bool) {
        if escaped {
            // An escaped key is never `model` or `stream` as
            // clients write them.
            self.overflow = true;
            self.state = State::InKey { escaped: false };
        } else if b == b'\\' {
            self.state = State::InKey { escaped: true };
        } else if b == b'"' {
            self.key = match (&self.buf[..], self.overflow) {
                (b"model", false) => Key::Model,
                (b"stream", false) => Key::Stream,
                _ => Key::Other,
            };
            self.state = State::ExpectColon;
        } else {
            self.keep(b, MAX_KEY_BYTES);
        }
    }

    /// The first byte of a top-level value says what kind it is: the
    /// `model` string is kept, any other string or structure skipped, and
    /// a literal read.
    fn value_start(&mut self, b: u8) {
        match b {
            b'"' if self.key == Key::Model => self.state = State::InModel { escaped: false },
            b'"' => self.state = State::InSkippedString { escaped: false },
            b'{' | b'[' => {
                self.depth += 1;
                self.state = State::Nested;
            }
            _ if b.is_ascii_whitespace() => {}
            _ => {
                self.keep(b, MAX_KEY_BYTES);
                self.state = State::InLiteral;
            }
        }
    }

    /// A byte of the `model` string, kept up to its closing quote.
    fn model_byte(&mut self, b: u8, escaped: bool) {
        if !escaped && b == b'"' {
            self.finish_model();
            self.state = State::AfterValue;
        } else {
            self.keep(b, MAX_MODEL_BYTES);
            self.state = State::InModel {
                escaped: !escaped && b == b'\\',
            };
        }
    }

    /// A byte of a bare literal, which ends at a separator or whitespace.
    fn literal_byte(&mut self, b: u8) {
        match b {
            b',' | b'}' => {
                self.finish_literal();
                self.state = State::AfterValue;
                self.step(b);
            }
            _ if b.is_ascii_whitespace() => {
                self.finish_literal();
                self.state = State::AfterValue;
            }
            _ => self.keep(b, MAX_KEY_BYTES),
        }
    }

    /// The top-level object closed: the text count is final, which is
    /// news worth passing on.
    fn close(&mut self) {
        self.state = State::Finished;
        self.fields.complete = true;
        self.changed = true;
    }

    fn begin_member(&mut self) {
        self.buf.clear();
        self.overflow = false;
        self.key = Key::Other;
    }

    fn keep(&mut self, b: u8, limit: usize) {
        if self.buf.len() < limit {
            self.buf.push(b);
        } else {
            self.overflow = true;
        }
    }

    /// The `model` string closed: unescape it the way JSON says.
    fn finish_model(&mut self) {
        if self.overflow {
            return;
        }
        let mut quoted = Vec::with_capacity(self.buf.len() + 2);
        quoted.push(b'"');
        quoted.extend_from_slice(&self.buf);
        quoted.push(b'"');
        if let Ok(model) = serde_json::from_slice::<String>(&quoted) {
            self.changed |= self.fields.model.as_deref() != Some(model.as_str());
            self.fields.model = Some(model);
        }
    }

    /// A bare value ended: `true` or `false` under `stream` is the flag.
    fn finish_literal(&mut self) {
        if self.key == Key::Stream && !self.overflow {
            let stream = match &self.buf[..] {
                b"true" => true,
                b"false" => false,
                _ => return,
            };
            self.changed |= self.fields.stream != Some(stream);
            self.fields.stream = Some(stream);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The model and stream found (the text count has its own tests).
    fn scan(body: &str) -> RequestFields {
        RequestFields {
            text_bytes: 0,
            complete: false,
            ..RequestFields::scan(body.as_bytes())
        }
    }

    fn fields(model: Option<&str>, stream: Option<bool>) -> RequestFields {
        RequestFields {
            model: model.map(str::to_owned),
            stream,
            ..RequestFields::default()
        }
    }

    #[test]
    fn the_text_of_every_string_but_the_model_is_counted_in_any_pieces() {
        let body = br#"{"model":"qwen3:8b","messages":[{"role":"user","content":"hello \"you\""}],"prompt":"abcd","stream":true}"#;
        // role(4) + user(4) + content(7) + `hello \"you\"`(13) + abcd(4).
        let whole = RequestFields::scan(body);
        assert_eq!(whole.text_bytes, 32);
        assert!(whole.complete);
        assert_eq!(whole.raw_prompt_tokens(), 8);
        for size in [1, 2, 3, 7, 50] {
            assert_eq!(scan_in_pieces(body, size), whole, "pieces of {size}");
        }
        let mut s = RequestScanner::default();
        assert!(!s.feed(br#"{"messages":[{"content":"ab"#));
        assert!(!s.fields().complete);
        assert!(s.feed(br#"cd"}]}"#), "the close is news");
        assert_eq!(s.fields().text_bytes, 11);
    }

    /// Feeds `body` in pieces of `size` bytes.
    fn scan_in_pieces(body: &[u8], size: usize) -> RequestFields {
        let mut s = RequestScanner::default();
        for piece in body.chunks(size) {
            s.feed(piece);
        }
        s.into_fields()
    }

    #[test]
    fn model_and_stream_are_read_wherever_they_stand_at_the_top_level() {
        let want = fields(Some("qwen3:8b"), Some(true));
        for body in [
            r#"{"model":"qwen3:8b","stream":true,"messages":[]}"#,
            r#"{"messages":[{"role":"user","content":"hi"}],"model":"qwen3:8b","stream":true}"#,
            r#"{"stream":true,"messages":[],"model":"qwen3:8b"}"#,
            "{ \"model\" : \"qwen3:8b\" ,\n \"stream\"\t:\ttrue }",
        ] {
            assert_eq!(scan(body), want, "{body}");
        }
    }

    #[test]
    fn nested_model_and_stream_keys_are_not_the_request_fields() {
        let body = r#"{"messages":[{"model":"inner","stream":false}],"options":{"stream":true,"model":"x"},"model":"outer"}"#;
        assert_eq!(scan(body), fields(Some("outer"), None));
    }

    #[test]
    fn strings_that_look_like_keys_or_brackets_are_skipped() {
        let body = r#"{"prompt":"say \"model\": \"no\", {[}] \\","stream":false,"model":"yes"}"#;
        assert_eq!(scan(body), fields(Some("yes"), Some(false)));
    }

    #[test]
    fn values_of_the_wrong_type_are_ignored() {
        assert_eq!(scan(r#"{"model":42,"stream":"true"}"#), fields(None, None));
        assert_eq!(scan(r#"{"stream":null}"#), fields(None, None));
        assert_eq!(scan(r#"{"stream":1}"#), fields(None, None));
        assert_eq!(
            scan(r#"{"model":["a"],"stream":{"x":1}}"#),
            fields(None, None)
        );
    }

    #[test]
    fn a_repeated_key_takes_its_last_well_typed_value() {
        assert_eq!(
            scan(r#"{"model":"a","stream":true,"model":"b","stream":false,"stream":null}"#),
            fields(Some("b"), Some(false))
        );
    }

    #[test]
    fn the_model_is_unescaped_as_json_says() {
        assert_eq!(
            scan(r#"{"model":"a\u00e9\/b\"c"}"#).model.as_deref(),
            Some("aé/b\"c")
        );
    }

    #[test]
    fn a_body_that_is_not_an_object_yields_nothing() {
        for body in [r#"["model","x"]"#, "not json", "", r#""model""#, "42"] {
            assert_eq!(scan(body), RequestFields::default(), "{body}");
        }
    }

    #[test]
    fn a_byte_order_mark_is_skipped() {
        assert_eq!(
            scan("\u{feff}{\"model\":\"m\"}").model.as_deref(),
            Some("m")
        );
    }

    #[test]
    fn a_cut_body_keeps_what_came_before_the_cut() {
        let body =
            r#"{"model":"llama3.2","stream":true,"messages":[{"role":"user","content":"long"}]}"#;
        let cut_in_model = &body[..14];
        assert_eq!(scan(cut_in_model), fields(None, None));
        let after_model = &body[..21];
        assert_eq!(scan(after_model), fields(Some("llama3.2"), None));
        // `true` is only a value once something ends it.
        assert_eq!(scan(&body[..33]), fields(Some("llama3.2"), None));
        assert_eq!(scan(&body[..34]), fields(Some("llama3.2"), Some(true)));
    }

    #[test]
    fn broken_json_stops_the_scan_but_keeps_what_was_seen() {
        assert_eq!(
            scan(r#"{"model":"m" "stream":true}"#),
            fields(Some("m"), None)
        );
        assert_eq!(
            scan(r#"{"model":"m",,"stream":true}"#),
            fields(Some("m"), None)
        );
    }

    #[test]
    fn nothing_after_the_top_level_object_counts() {
        assert_eq!(
            scan(r#"{"model":"a"} {"model":"b","stream":true}"#),
            fields(Some("a"), None)
        );
    }

    #[test]
    fn an_overlong_model_string_is_ignored() {
        let long = "x".repeat(MAX_MODEL_BYTES + 1);
        let body = format!(r#"{{"model":"{long}","stream":true}}"#);
        assert_eq!(scan(&body), fields(None, Some(true)));
        let exact = "x".repeat(MAX_MODEL_BYTES);
        let body = format!(r#"{{"model":"{exact}"}}"#);
        assert_eq!(scan(&body).model.map(|m| m.len()), Some(MAX_MODEL_BYTES));
    }

    #[test]
    fn long_or_escaped_keys_are_other_keys() {
        assert_eq!(
            scan(r#"{"mod\u0065l":"a","modelmodelmodelmodel":"b"}"#),
            fields(None, None)
        );
    }

    #[test]
    fn every_split_of_the_body_gives_the_same_fields() {
        let body = br#"{"messages":[{"role":"user","content":"a \"quoted\" \\ {[ text"}],"options":{"a":[1,{"b":"c"}]},"stream":true,"model":"qwen3:8b\u00e9"}"#;
        let whole = RequestFields::scan(body);
        assert_eq!(
            (whole.model.as_deref(), whole.stream, whole.complete),
            (Some("qwen3:8bé"), Some(true), true)
        );
        for size in 1..body.len() {
            assert_eq!(scan_in_pieces(body, size), whole, "pieces of {size}");
        }
        for cut in 0..body.len() {
            let mut s = RequestScanner::default();
            s.feed(&body[..cut]);
            s.feed(&body[cut..]);
            assert_eq!(s.into_fields(), whole, "cut at {cut}");
        }
    }

    #[test]
    fn a_body_of_many_megabytes_is_scanned_without_keeping_it() {
        let mut body = br#"{"messages":[{"role":"user","content":""#.to_vec();
        body.resize(body.len() + 30 * 1024 * 1024, b'x');
        body.extend_from_slice(br#""}],"model":"m","stream":true}"#);
        let mut s = RequestScanner::default();
        for piece in body.chunks(16 * 1024) {
            s.feed(piece);
        }
        assert!(
            s.buf.capacity() <= MAX_MODEL_BYTES,
            "kept {}",
            s.buf.capacity()
        );
        assert!(s.is_finished());
        let f = s.into_fields();
        assert_eq!((f.model.as_deref(), f.stream), (Some("m"), Some(true)));
        assert!(f.complete && f.text_bytes > 30_000_000, "{f:?}");
    }

    #[test]
    fn feed_says_when_a_field_changed() {
        let mut s = RequestScanner::default();
        assert!(!s.feed(br#"{"messages":[],"#));
        assert!(s.feed(br#""model":"m","#));
        assert!(!s.feed(br#""stream":tr"#));
        assert!(s.feed(br#"ue}"#));
        assert!(!s.feed(br#"   "#));
    }
}
