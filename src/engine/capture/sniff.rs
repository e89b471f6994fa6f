//! The model a response names: every call's `response_model` (read by
//! the call actor from the frames it meters), and, for a captured call
//! whose request lost the bytes that held its `model`, the call's name.
//!
//! A long context or an attached image makes a request of many packets,
//! and a burst can drop some of them; the `openai` SDK writes `model` after
//! the messages, so it is often in the lost part. The response names the
//! model too: every OpenAI chat and completions chunk and every Ollama
//! line has a top-level `model`. [`ModelSniffer`] reads the first complete
//! lines of the response body (an SSE `data:` line, an NDJSON line or a
//! whole JSON body) with the request's own scanner
//! ([`RequestFields::scan`]), keeping at most [`SNIFF_CAP`] bytes. APIs
//! whose model is nested (Anthropic's `message.model`, the Responses API's
//! `response.model`) give none: the call then keeps no model rather than a
//! guessed one.

use crate::decode::request_fields::RequestFields;

/// The most response bytes held while looking for the model: the first
/// chunk of every API we know is far smaller.
pub(crate) const SNIFF_CAP: usize = 16 << 10;

/// The most response bytes read in all before giving up (a stream whose
/// lines never name a top-level model is not read to its end).
const READ_CAP: usize = 4 * SNIFF_CAP;

/// Reads the first lines of a response body for a top-level `model`.
#[derive(Debug, Default)]
pub(crate) struct ModelSniffer {
    /// The line being read.
    line: Vec<u8>,
    /// Skipping to the next line start (after lost bytes).
    resync: bool,
    /// Found, or given up: nothing more is read.
    done: bool,
    /// Bytes read so far.
    read: usize,
    model: Option<String>,
}

impl ModelSniffer {
    /// The model found so far.
    pub(crate) fn model(&self) -> Option<&str> {
        self.model.as_deref()
    }

    /// Reads the next bytes of the response body.
    pub(crate) fn feed(&mut self, mut bytes: &[u8]) {
        self.read = self.read.saturating_add(bytes.len());
        while !self.done && !bytes.is_empty() {
            let newline = memchr::memchr(b'\n', bytes);
            let (piece, rest) = match newline {
                Some(i) => (&bytes[..i], &bytes[i + 1..]),
                None => (bytes, &[][..]),
            };
            bytes = rest;
            if self.resync {
                self.resync = newline.is_none();
                continue;
            }
            let room = SNIFF_CAP.saturating_sub(self.line.len());
            self.line.extend_from_slice(&piece[..piece.len().min(room)]);
            if newline.is_some() || self.line.len() >= SNIFF_CAP {
                self.model = line_model(&self.line);
                self.line.clear();
                self.done = self.model.is_some() || newline.is_none();
            }
        }
        if self.read > READ_CAP {
            self.done = true;
        }
    }

    /// Bytes of the body were lost: the line being read is not to be
    /// trusted, reading resumes at the next line.
    pub(crate) fn gap(&mut self) {
        self.line.clear();
        self.resync = true;
    }
}

/// The top-level `model` of one line: `data: {...}` (SSE) or `{...}`.
fn line_model(line: &[u8]) -> Option<String> {
    let line = line.trim_ascii();
    let json = line
        .strip_prefix(b"data:")
        .map_or(line, <[u8]>::trim_ascii_start);
    if !json.starts_with(b"{") {
        return None;
    }
    RequestFields::scan(json).model
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sniff(pieces: &[&str]) -> Option<String> {
        let mut s = ModelSniffer::default();
        for p in pieces {
            s.feed(p.as_bytes());
        }
        s.model().map(str::to_owned)
    }

    #[test]
    fn an_openai_chunk_names_its_model_even_cut_across_packets() {
        let chunk = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"qwen3:8b\",\"choices\":[]}\n\n";
        assert_eq!(sniff(&[chunk]).as_deref(), Some("qwen3:8b"));
        let (a, b) = chunk.split_at(40);
        assert_eq!(sniff(&[a, b]).as_deref(), Some("qwen3:8b"));
    }

    #[test]
    fn an_ollama_line_names_its_model() {
        let line = "{\"model\":\"llama3.2\",\"response\":\"hi\",\"done\":false}\n";
        assert_eq!(sniff(&[line]).as_deref(), Some("llama3.2"));
    }

    #[test]
    fn a_nested_model_or_event_lines_name_nothing() {
        let anthropic = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"m\"}}\n\n";
        assert_eq!(sniff(&[anthropic]), None);
    }

    #[test]
    fn a_line_cut_by_lost_bytes_names_nothing_and_the_next_line_is_read() {
        let mut s = ModelSniffer::default();
        s.feed(b"{\"response\":\"a\",");
        s.gap();
        s.feed(b"\"model\":\"wrong\"}\n{\"model\":\"right\",\"done\":false}\n");
        assert_eq!(s.model(), Some("right"));
    }

    #[test]
    fn at_most_the_cap_is_held_while_looking() {
        let mut s = ModelSniffer::default();
        s.feed(&vec![b'x'; SNIFF_CAP * 4]);
        assert!(s.line.capacity() <= SNIFF_CAP * 2, "bounded");
        s.feed(b"\n{\"model\":\"late\"}\n");
        assert_eq!(s.model(), None, "gave up after the cap");
    }
}
