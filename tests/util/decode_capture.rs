//! Loading the real captures under `tests/fixtures/real` and decoding
//! them with the public decode API, for `tests/decode_fixtures.rs`.
//!
//! Also holds an independent, deliberately naive reading of each body
//! (split SSE on blank lines, pick the one field each API streams text in)
//! that the decoder's output is compared against.

use std::fs;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use serde_json::Value;

use speedtap::decode::detect::{detect_framing, detect_request, BodyFraming, RequestFacts};
use speedtap::decode::stream::StreamDecoder;
use speedtap::decode::{OutputChannel, ServerTimings, StreamEvent, Usage};
use speedtap::model::ApiKind;

/// The capture sets, relative to the crate root.
pub const SETS: [&str; 2] = ["llama-server", "llama-cpp-python"];

pub fn fixtures_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/real")
}

/// One recorded exchange.
pub struct Capture {
    /// `set/name`, for messages.
    pub id: String,
    pub name: String,
    /// This capture's row of the set's `index.json`.
    pub index: Value,
    pub method: String,
    pub path: String,
    pub request_body: Vec<u8>,
    pub status: u16,
    pub content_type: Option<String>,
    pub body: Vec<u8>,
    /// The body as the socket reads delivered it (`body_b64` per line).
    pub reads: Vec<Vec<u8>>,
}

/// Every capture of every set, in index order.
pub fn load_all() -> Vec<Capture> {
    let mut all = Vec::new();
    for set in SETS {
        let dir = fixtures_root().join(set);
        let index: Value = serde_json::from_slice(
            &fs::read(dir.join("index.json")).unwrap_or_else(|e| panic!("{set}/index.json: {e}")),
        )
        .expect("index.json parses");
        for row in index.as_array().expect("index.json is an array") {
            all.push(load(&dir, set, row.clone()));
        }
    }
    all
}

fn load(dir: &Path, set: &str, index: Value) -> Capture {
    let name = index["name"].as_str().expect("name").to_owned();
    let read = |suffix: &str| {
        fs::read(dir.join(format!("{name}.{suffix}")))
            .unwrap_or_else(|e| panic!("{set}/{name}.{suffix}: {e}"))
    };
    let request: Value = serde_json::from_slice(&read("request.json")).expect("request parses");
    let request_body = match (&request.get("body"), &request.get("body_raw")) {
        (Some(b), _) if !b.is_null() => serde_json::to_vec(b).expect("body serialises"),
        (_, Some(Value::String(raw))) => raw.as_bytes().to_vec(),
        _ => Vec::new(),
    };
    let head = String::from_utf8(read("head.txt")).expect("head is text");
    let mut lines = head.split("\r\n");
    let status_line = lines.next().expect("status line");
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status code");
    let content_type = lines
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-type"))
        .map(|(_, v)| v.trim().to_owned());
    let b64 = base64::engine::general_purpose::STANDARD;
    let reads = String::from_utf8(read("chunks.jsonl"))
        .expect("chunks are text")
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let row: Value = serde_json::from_str(l).expect("chunk line parses");
            b64.decode(row["body_b64"].as_str().expect("body_b64"))
                .expect("body_b64 decodes")
        })
        .collect();
    let body = read("response.txt");
    Capture {
        id: format!("{set}/{name}"),
        name,
        index,
        method: request["method"].as_str().expect("method").to_owned(),
        path: request["path"].as_str().expect("path").to_owned(),
        request_body,
        status,
        content_type,
        body,
        reads,
    }
}

impl Capture {
    pub fn facts(&self) -> RequestFacts {
        detect_request(&self.method, &self.path, &self.request_body)
    }

    pub fn framing(&self) -> BodyFraming {
        let facts = self.facts();
        detect_framing(facts.api, facts.stream, self.content_type.as_deref())
    }

    pub fn decoder(&self) -> StreamDecoder {
        let facts = self.facts();
        StreamDecoder::new(facts.api, self.framing(), facts.model.as_deref())
    }

    /// Decodes the body fed as the given pieces.
    pub fn decode_pieces<'a>(&self, pieces: impl IntoIterator<Item = &'a [u8]>) -> Decoded {
        let mut d = self.decoder();
        let mut events = Vec::new();
        for p in pieces {
            d.feed(p, &mut events);
        }
        d.finish(&mut events);
        Decoded {
            events,
            unparsed: d.unparsed_messages(),
            streamed: d.is_streamed(),
        }
    }

    pub fn decode_whole(&self) -> Decoded {
        self.decode_pieces([self.body.as_slice()])
    }
}

/// What decoding one body gave.
#[derive(Debug, PartialEq)]
pub struct Decoded {
    pub events: Vec<StreamEvent>,
    pub unparsed: u64,
    pub streamed: bool,
}

impl Decoded {
    pub fn text(&self, channel: OutputChannel) -> String {
        self.events
            .iter()
            .filter_map(|e| match e {
                StreamEvent::Output { channel: c, text } if *c == channel => Some(text.as_str()),
                _ => None,
            })
            .collect()
    }

    pub fn outputs(&self) -> usize {
        self.events
            .iter()
            .filter(|e| matches!(e, StreamEvent::Output { .. }))
            .count()
    }

    /// Usage receipts merged field by field, later ones winning (the
    /// documented meaning of repeated `Usage` events).
    pub fn usage(&self) -> Option<Usage> {
        let mut merged: Option<Usage> = None;
        for e in &self.events {
            if let StreamEvent::Usage(u) = e {
                let m = merged.get_or_insert_with(Usage::default);
                m.output_tokens = u.output_tokens.or(m.output_tokens);
                m.input_tokens = u.input_tokens.or(m.input_tokens);
                m.reasoning_tokens = u.reasoning_tokens.or(m.reasoning_tokens);
                m.cached_input_tokens = u.cached_input_tokens.or(m.cached_input_tokens);
            }
        }
        merged
    }

    /// Server timings merged field by field, later ones winning.
    pub fn timings(&self) -> Option<ServerTimings> {
        let mut merged: Option<ServerTimings> = None;
        for e in &self.events {
            if let StreamEvent::ServerTimings(t) = e {
                merged
                    .get_or_insert_with(ServerTimings::default)
                    .merge_from(t);
            }
        }
        merged
    }

    pub fn timings_events(&self) -> Vec<&ServerTimings> {
        self.events
            .iter()
            .filter_map(|e| match e {
                StreamEvent::ServerTimings(t) => Some(t),
                _ => None,
            })
            .collect()
    }

    pub fn dones(&self) -> usize {
        self.events
            .iter()
            .filter(|e| **e == StreamEvent::Done)
            .count()
    }

    pub fn errors(&self) -> Vec<&str> {
        self.events
            .iter()
            .filter_map(|e| match e {
                StreamEvent::Error { message, .. } => Some(message.as_str()),
                _ => None,
            })
            .collect()
    }

    /// Events with adjacent outputs of one channel merged: how text is cut
    /// into pieces may depend on read boundaries, nothing else may.
    pub fn normalised(&self) -> (Vec<StreamEvent>, u64) {
        let mut out: Vec<StreamEvent> = Vec::with_capacity(self.events.len());
        for e in &self.events {
            if let (
                Some(StreamEvent::Output {
                    channel: last,
                    text: acc,
                }),
                StreamEvent::Output { channel, text },
            ) = (out.last_mut(), e)
            {
                if last == channel {
                    acc.push_str(text);
                    continue;
                }
            }
            out.push(e.clone());
        }
        (out, self.unparsed)
    }
}

/// Output text per channel and the number of non-empty pieces, read from
/// a body independently of the decoder.
#[derive(Debug, Default, PartialEq)]
pub struct Reference {
    pub text: String,
    pub reasoning: String,
    pub tool: String,
    pub pieces: usize,
}

impl Reference {
    fn add(&mut self, channel: OutputChannel, s: Option<&str>) {
        let Some(s) = s.filter(|s| !s.is_empty()) else {
            return;
        };
        self.pieces += 1;
        match channel {
            OutputChannel::Text => self.text.push_str(s),
            OutputChannel::Reasoning => self.reasoning.push_str(s),
            OutputChannel::ToolArguments => self.tool.push_str(s),
        }
    }

    /// A tool call fragment: name and arguments are one piece.
    fn add_call(&mut self, name: Option<&str>, args: Option<&str>) {
        let joined = format!("{}{}", name.unwrap_or(""), args.unwrap_or(""));
        self.add(OutputChannel::ToolArguments, Some(&joined));
    }
}

/// The data payloads of an SSE body, split the simple way (these captures
/// use `\n` line ends and `data: ` with a space).
pub fn sse_payloads(body: &str) -> Vec<Value> {
    body.split("\n\n")
        .filter_map(|block| {
            let data: Vec<&str> = block
                .lines()
                .filter_map(|l| l.strip_prefix("data: "))
                .collect();
            let data = data.join("\n");
            (!data.is_empty() && data != "[DONE]")
                .then(|| serde_json::from_str(&data).expect("capture data is JSON"))
        })
        .collect()
}

/// The independent reading of one body.
pub fn reference(api: ApiKind, streamed: bool, body: &str) -> Reference {
    use OutputChannel::*;
    let mut r = Reference::default();
    let s = |v: &Value| v.as_str().map(str::to_owned);
    if streamed {
        for v in sse_payloads(body) {
            match api {
                ApiKind::OpenaiChat => {
                    for c in v["choices"].as_array().into_iter().flatten() {
                        let d = &c["delta"];
                        r.add(Reasoning, s(&d["reasoning_content"]).as_deref());
                        r.add(Text, s(&d["content"]).as_deref());
                        for call in d["tool_calls"].as_array().into_iter().flatten() {
                            let f = &call["function"];
                            r.add_call(f["name"].as_str(), f["arguments"].as_str());
                        }
                    }
                }
                ApiKind::OpenaiCompletions => {
                    for c in v["choices"].as_array().into_iter().flatten() {
                        r.add(Text, c["text"].as_str());
                    }
                }
                ApiKind::OpenaiResponses => match v["type"].as_str() {
                    Some("response.output_text.delta") => r.add(Text, v["delta"].as_str()),
                    Some("response.function_call_arguments.delta") => {
                        r.add(ToolArguments, v["delta"].as_str())
                    }
                    Some("response.output_item.added") if v["item"]["type"] == "function_call" => {
                        r.add_call(v["item"]["name"].as_str(), None)
                    }
                    _ => {}
                },
                ApiKind::AnthropicMessages => match v["type"].as_str() {
                    Some("content_block_delta") => {
                        let d = &v["delta"];
                        r.add(Text, d["text"].as_str());
                        r.add(Reasoning, d["thinking"].as_str());
                        r.add(ToolArguments, d["partial_json"].as_str());
                    }
                    Some("content_block_start") => {
                        r.add_call(v["content_block"]["name"].as_str(), None)
                    }
                    _ => {}
                },
                ApiKind::LlamacppCompletion => r.add(Text, v["content"].as_str()),
                other => panic!("no reference reading for streamed {other}"),
            }
        }
    } else {
        let v: Value = serde_json::from_str(body).expect("capture body is JSON");
        match api {
            ApiKind::OpenaiChat => {
                for c in v["choices"].as_array().into_iter().flatten() {
                    let m = &c["message"];
                    r.add(Reasoning, m["reasoning_content"].as_str());
                    r.add(Text, m["content"].as_str());
                    for call in m["tool_calls"].as_array().into_iter().flatten() {
                        let f = &call["function"];
                        r.add_call(f["name"].as_str(), f["arguments"].as_str());
                    }
                }
            }
            ApiKind::OpenaiCompletions => {
                for c in v["choices"].as_array().into_iter().flatten() {
                    r.add(Text, c["text"].as_str());
                }
            }
            ApiKind::OpenaiResponses => {
                for item in v["output"].as_array().into_iter().flatten() {
                    for part in item["content"].as_array().into_iter().flatten() {
                        r.add(Text, part["text"].as_str());
                    }
                }
            }
            ApiKind::AnthropicMessages => {
                for block in v["content"].as_array().into_iter().flatten() {
                    r.add(Text, block["text"].as_str());
                }
            }
            ApiKind::LlamacppCompletion => r.add(Text, v["content"].as_str()),
            other => panic!("no reference reading for {other}"),
        }
    }
    r
}

/// The usage a capture's `index.json` row reports, in [`Usage`] terms:
/// OpenAI (`completion_tokens`, `prompt_tokens`,
/// `prompt_tokens_details.cached_tokens`), Responses (`output_tokens`,
/// `input_tokens`, `input_tokens_details.cached_tokens`), Anthropic
/// (`output_tokens`; input = `input_tokens + cache_read_input_tokens`),
/// native llama.cpp (`tokens_predicted`, `tokens_evaluated`).
pub fn index_usage(api: ApiKind, u: &Value) -> Option<Usage> {
    if u.is_null() {
        return None;
    }
    let n = |v: &Value| v.as_u64();
    Some(match api {
        ApiKind::OpenaiChat | ApiKind::OpenaiCompletions => Usage {
            output_tokens: n(&u["completion_tokens"]),
            input_tokens: n(&u["prompt_tokens"]),
            reasoning_tokens: None,
            cached_input_tokens: n(&u["prompt_tokens_details"]["cached_tokens"]),
        },
        ApiKind::OpenaiResponses => Usage {
            output_tokens: n(&u["output_tokens"]),
            input_tokens: n(&u["input_tokens"]),
            reasoning_tokens: None,
            cached_input_tokens: n(&u["input_tokens_details"]["cached_tokens"]),
        },
        ApiKind::AnthropicMessages => {
            let cached = n(&u["cache_read_input_tokens"]);
            Usage {
                output_tokens: n(&u["output_tokens"]),
                input_tokens: n(&u["input_tokens"]).map(|i| i + cached.unwrap_or(0)),
                reasoning_tokens: None,
                cached_input_tokens: cached,
            }
        }
        ApiKind::LlamacppCompletion => Usage {
            output_tokens: n(&u["tokens_predicted"]),
            input_tokens: n(&u["tokens_evaluated"]),
            reasoning_tokens: None,
            cached_input_tokens: None,
        },
        other => panic!("no usage mapping for {other}"),
    })
}

/// The timings a capture's `index.json` row reports, in [`ServerTimings`]
/// terms.
pub fn index_timings(t: &Value) -> Option<ServerTimings> {
    if t.is_null() {
        return None;
    }
    Some(ServerTimings {
        generated_tokens: t["predicted_n"].as_u64(),
        generation_ms: t["predicted_ms"].as_f64(),
        // The server's own figure, taken as stated.
        generation_rate: t["predicted_per_second"].as_f64().filter(|r| *r > 0.0),
        prompt_tokens: t["prompt_n"].as_u64(),
        prompt_ms: t["prompt_ms"].as_f64(),
        load_ms: None,
        cached_tokens: t["cache_n"].as_u64(),
        draft_tokens: None,
        draft_accepted: None,
    })
}

/// A small deterministic generator (64-bit LCG, Knuth's constants) for
/// reproducible random read boundaries.
pub struct Lcg(pub u64);

impl Lcg {
    pub fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }

    /// Cuts `len` bytes into random pieces of 1..=max_piece bytes.
    pub fn cuts(&mut self, len: usize, max_piece: usize) -> Vec<usize> {
        let mut cuts = Vec::new();
        let mut at = 0;
        while at < len {
            at += 1 + (self.next() as usize % max_piece.max(1));
            cuts.push(at.min(len));
        }
        cuts
    }
}

/// Splits `body` at the cut offsets (ascending, last = len).
pub fn pieces<'a>(body: &'a [u8], cuts: &[usize]) -> Vec<&'a [u8]> {
    let mut out = Vec::with_capacity(cuts.len());
    let mut start = 0;
    for &c in cuts {
        out.push(&body[start..c]);
        start = c;
    }
    if start < body.len() {
        out.push(&body[start..]);
    }
    out
}
