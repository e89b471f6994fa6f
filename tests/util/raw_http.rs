//! A minimal HTTP/1.1 client over raw `TcpStream`s, for the tests that
//! check the bytes on the wire (`cli`, `store_engine`, `security`) rather
//! than a client library's view of them.

use std::io::{self, BufRead};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// How long one read may block: generous, since a debug build on a busy
/// 2-core machine can be slow to answer, yet finite so a hung server fails
/// the test instead of hanging it.
const READ_TIMEOUT: Duration = Duration::from_secs(40);

/// A response's status and headers, in the order they came.
#[derive(Debug)]
pub struct Head {
    pub status: u16,
    pub headers: Vec<(String, String)>,
}

impl Head {
    /// The first header named `name` (case-insensitively).
    pub fn header(&self, name: &str) -> Option<&str> {
        header(&self.headers, name)
    }
}

/// The first of `headers` named `name` (case-insensitively).
pub fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// A connection with the read timeout set; `Err` when the server is not
/// there (e.g. it was killed).
pub fn try_connect(addr: SocketAddr) -> io::Result<TcpStream> {
    let stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(READ_TIMEOUT))?;
    Ok(stream)
}

/// A connection to a server that must be there.
pub fn connect(addr: SocketAddr) -> TcpStream {
    try_connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"))
}

/// The bytes of a one-shot request (`Connection: close`) with a JSON
/// content type, the extra `headers`, and `body`.
pub fn request(
    method: &str,
    addr: SocketAddr,
    path: &str,
    body: &[u8],
    headers: &[(&str, &str)],
) -> Vec<u8> {
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(body);
    bytes
}

/// The status line and headers of a response.
pub fn read_head(r: &mut impl BufRead) -> io::Result<Head> {
    let mut line = String::new();
    r.read_line(&mut line)?;
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| io::Error::other(format!("bad status line {line:?}")))?;
    let mut headers = Vec::new();
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let l = line.trim_end();
        if l.is_empty() {
            return Ok(Head { status, headers });
        }
        if let Some((n, v)) = l.split_once(':') {
            headers.push((n.trim().to_string(), v.trim().to_string()));
        }
    }
}

/// One chunk of a chunked body; `None` after the last (empty) chunk.
pub fn read_chunk(r: &mut impl BufRead) -> io::Result<Option<Vec<u8>>> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    let size = line.trim_end().split(';').next().unwrap_or("");
    let size = usize::from_str_radix(size.trim(), 16)
        .map_err(|_| io::Error::other(format!("bad chunk size {line:?}")))?;
    if size == 0 {
        // Trailers, then the final blank line.
        loop {
            line.clear();
            if r.read_line(&mut line)? == 0 || line.trim_end().is_empty() {
                return Ok(None);
            }
        }
    }
    let mut data = vec![0; size];
    r.read_exact(&mut data)?;
    let mut crlf = [0; 2];
    r.read_exact(&mut crlf)?;
    Ok(Some(data))
}

/// The body as far as it came, and whether it ended properly (a cut
/// stream ends early).
pub fn read_body(r: &mut impl BufRead, head: &Head) -> (Vec<u8>, bool) {
    let mut body = Vec::new();
    let chunked = head
        .header("transfer-encoding")
        .is_some_and(|v| v.eq_ignore_ascii_case("chunked"));
    if chunked {
        loop {
            match read_chunk(r) {
                Ok(Some(data)) => body.extend_from_slice(&data),
                Ok(None) => return (body, true),
                Err(_) => return (body, false),
            }
        }
    }
    if let Some(len) = head.header("content-length") {
        let len: usize = len.parse().unwrap();
        body.resize(len, 0);
        let complete = r.read_exact(&mut body).is_ok();
        return (body, complete);
    }
    let complete = r.read_to_end(&mut body).is_ok();
    (body, complete)
}
