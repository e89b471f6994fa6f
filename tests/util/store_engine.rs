//! The real `speedtap` binary as a child process (output captured byte
//! for byte), and HTTP helpers over [`super::raw_http`], for the
//! `store_engine`, `security` and real-server tests.
//!
//! Patterns follow `tests/cli.rs` (port 0 everywhere, addresses read from
//! what the process prints, XDG dirs in a scratch dir). The difference is
//! that output is kept as raw bytes, not lines, because one test scans it
//! for secrets and must see every byte, valid UTF-8 or not.

use std::io::{self, BufReader, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::process::{start_run_with, Run};
use super::raw_http::{header, read_body, read_head, request, try_connect};

// ---------------------------------------------------------------------------
// HTTP/1.1 by hand
// ---------------------------------------------------------------------------

/// A response as it came off the wire.
/// A fresh, empty scratch directory for one store-and-engine test.
pub fn scratch(test: &str) -> PathBuf {
    super::process::scratch("store_engine", test)
}

/// `speedtap run --json --db DB --api 127.0.0.1:0 --route
/// sim=127.0.0.1:0=http://UPSTREAM`, with `env` added to its environment.
pub fn start_run(dir: &Path, db: &Path, upstream: SocketAddr, env: &[(&str, &str)]) -> Run {
    let db = db.to_str().expect("a UTF-8 path");
    start_run_with(dir, upstream, &["--db", db], env)
}

#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// The body ended properly (a cut stream ends early).
    pub complete: bool,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        header(&self.headers, name)
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
}

/// One request on its own connection (`Connection: close`), read to the
/// end of the body. `Err` when the connection fails before a response head
/// (e.g. the server was killed).
pub fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &[u8],
    headers: &[(&str, &str)],
) -> io::Result<Reply> {
    let mut stream = try_connect(addr)?;
    stream.write_all(&request(method, addr, path, body, headers))?;
    let mut r = BufReader::new(stream);
    let head = read_head(&mut r)?;
    let (body, complete) = read_body(&mut r, &head);
    Ok(Reply {
        status: head.status,
        headers: head.headers,
        body,
        complete,
    })
}

/// `GET path`, which must answer.
pub fn get(addr: SocketAddr, path: &str) -> Reply {
    http(addr, "GET", path, b"", &[]).unwrap_or_else(|e| panic!("GET {path} on {addr}: {e}"))
}

// ---------------------------------------------------------------------------
// Requests of every protocol
// ---------------------------------------------------------------------------

/// The APIs the simulator serves, as a client would call them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Chat,
    Completions,
    Responses,
    Messages,
    OllamaChat,
    OllamaGenerate,
    LlamaCompletion,
    TgiStream,
}

impl Protocol {
    pub const ALL: [Protocol; 8] = [
        Protocol::Chat,
        Protocol::Completions,
        Protocol::Responses,
        Protocol::Messages,
        Protocol::OllamaChat,
        Protocol::OllamaGenerate,
        Protocol::LlamaCompletion,
        Protocol::TgiStream,
    ];

    /// The path and a streamed request body carrying `prompt`.
    pub fn request(self, model: &str, prompt: &str) -> (&'static str, String) {
        use serde_json::json;
        let messages = json!([{"role": "user", "content": prompt}]);
        let (path, body) = match self {
            Protocol::Chat => (
                "/v1/chat/completions",
                json!({"model": model, "stream": true, "messages": messages}),
            ),
            Protocol::Completions => (
                "/v1/completions",
                json!({"model": model, "stream": true, "prompt": prompt}),
            ),
            Protocol::Responses => (
                "/v1/responses",
                json!({"model": model, "stream": true, "input": prompt}),
            ),
            Protocol::Messages => (
                "/v1/messages",
                json!({"model": model, "stream": true, "max_tokens": 256, "messages": messages}),
            ),
            Protocol::OllamaChat => ("/api/chat", json!({"model": model, "messages": messages})),
            Protocol::OllamaGenerate => {
                ("/api/generate", json!({"model": model, "prompt": prompt}))
            }
            Protocol::LlamaCompletion => (
                "/completion",
                json!({"model": model, "stream": true, "prompt": prompt}),
            ),
            Protocol::TgiStream => (
                "/generate_stream",
                json!({"inputs": prompt, "parameters": {"max_new_tokens": 256}}),
            ),
        };
        (path, body.to_string())
    }
}

/// Every file in `dir` (not recursing), by name.
pub fn files_in(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_file() {
            // A file SQLite removes between listing and reading is skipped.
            if let Ok(bytes) = std::fs::read(entry.path()) {
                out.push((entry.file_name().to_string_lossy().into_owned(), bytes));
            }
        }
    }
    out.sort();
    out
}

/// Where `needle` occurs in `haystack` (the first time).
pub fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}
