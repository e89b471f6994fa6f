//! Raw HTTP/1.x over tokio sockets, for both ends of a fault: an upstream
//! whose every byte (and every way of ending a connection) the test writes
//! by hand, and a client that reads a response head and body itself.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// A request or response head: the first line and the headers in order.
#[derive(Clone, Debug, Default)]
pub struct Head {
    pub line: String,
    pub headers: Vec<(String, String)>,
}

impl Head {
    /// The first header named `name` (case-insensitively).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The status code of a response head.
    pub fn status(&self) -> u16 {
        self.line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    }
}

/// One side of a raw connection.
pub struct Conn {
    pub io: BufReader<TcpStream>,
}

impl Conn {
    pub fn new(stream: TcpStream) -> Conn {
        let _ = stream.set_nodelay(true);
        Conn {
            io: BufReader::new(stream),
        }
    }

    pub async fn connect(addr: SocketAddr) -> Conn {
        Conn::new(TcpStream::connect(addr).await.expect("connect"))
    }

    /// Reads a head; `None` on EOF or error before it was complete.
    pub async fn head(&mut self) -> Option<Head> {
        let mut line = String::new();
        if self.io.read_line(&mut line).await.ok()? == 0 {
            return None;
        }
        let mut head = Head {
            line: line.trim_end().to_owned(),
            headers: Vec::new(),
        };
        loop {
            line.clear();
            if self.io.read_line(&mut line).await.ok()? == 0 {
                return None;
            }
            let l = line.trim_end();
            if l.is_empty() {
                return Some(head);
            }
            if let Some((n, v)) = l.split_once(':') {
                head.headers
                    .push((n.trim().to_owned(), v.trim().to_owned()));
            }
        }
    }

    /// Reads a body framed as `head` says (Content-Length, chunked, or to
    /// EOF). Returns the bytes, the trailer fields, and whether the body
    /// ended properly (a cut one ends early).
    pub async fn body(&mut self, head: &Head) -> Body {
        let mut out = Body::default();
        let chunked = head
            .header("transfer-encoding")
            .is_some_and(|v| v.eq_ignore_ascii_case("chunked"));
        if chunked {
            loop {
                let mut line = String::new();
                match self.io.read_line(&mut line).await {
                    Ok(0) | Err(_) => return out,
                    Ok(_) => {}
                }
                let size = line.trim_end().split(';').next().unwrap_or("").trim();
                let Ok(size) = usize::from_str_radix(size, 16) else {
                    return out;
                };
                if size == 0 {
                    loop {
                        line.clear();
                        match self.io.read_line(&mut line).await {
                            Ok(0) | Err(_) => return out,
                            Ok(_) => {}
                        }
                        let l = line.trim_end();
                        if l.is_empty() {
                            out.complete = true;
                            return out;
                        }
                        if let Some((n, v)) = l.split_once(':') {
                            out.trailers
                                .push((n.trim().to_owned(), v.trim().to_owned()));
                        }
                    }
                }
                let start = out.bytes.len();
                out.bytes.resize(start + size, 0);
                if self.io.read_exact(&mut out.bytes[start..]).await.is_err() {
                    out.bytes.truncate(start);
                    return out;
                }
                let mut crlf = [0; 2];
                if self.io.read_exact(&mut crlf).await.is_err() {
                    return out;
                }
            }
        }
        if let Some(len) = head.header("content-length") {
            let len: usize = len.parse().expect("content-length");
            out.bytes.resize(len, 0);
            out.complete = self.io.read_exact(&mut out.bytes).await.is_ok();
            return out;
        }
        out.complete = self.io.read_to_end(&mut out.bytes).await.is_ok();
        out
    }

    pub async fn write(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.io.get_mut().write_all(bytes).await?;
        self.io.get_mut().flush().await
    }

    /// Writes one chunk of a chunked body.
    pub async fn chunk(&mut self, data: &[u8]) -> std::io::Result<()> {
        let mut frame = format!("{:x}\r\n", data.len()).into_bytes();
        frame.extend_from_slice(data);
        frame.extend_from_slice(b"\r\n");
        self.write(&frame).await
    }

    /// Waits until the peer closes (EOF or error), discarding what it
    /// sends meanwhile.
    pub async fn closed(&mut self) {
        let mut buf = [0u8; 4096];
        while let Ok(n) = self.io.read(&mut buf).await {
            if n == 0 {
                return;
            }
        }
    }

    /// Resets the connection (RST, not FIN): SO_LINGER 0, then close.
    pub fn reset(self) {
        let stream = self.io.into_inner();
        // Deprecated because a nonzero linger blocks the thread on drop;
        // a zero linger never waits (the kernel sends RST at once).
        #[allow(deprecated)]
        let _ = stream.set_linger(Some(std::time::Duration::ZERO));
        drop(stream);
    }
}

/// A body as a raw client read it.
#[derive(Debug, Default)]
pub struct Body {
    pub bytes: Vec<u8>,
    pub trailers: Vec<(String, String)>,
    pub complete: bool,
}

type Handler = Arc<dyn Fn(Conn) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// An upstream that hands each accepted connection to a test's handler.
pub struct RawUpstream {
    pub addr: SocketAddr,
    /// Connections accepted so far.
    pub accepted: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for RawUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl RawUpstream {
    pub async fn start<F, Fut>(handler: F) -> RawUpstream
    where
        F: Fn(Conn) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let handler: Handler = Arc::new(move |c| Box::pin(handler(c)));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(handler(Conn::new(stream)));
            }
        });
        RawUpstream {
            addr,
            accepted,
            task,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

/// A metered streaming request's bytes: POST `path` with a JSON body,
/// keep-alive unless `close`.
pub fn post(addr: SocketAddr, path: &str, body: &str, extra: &[(&str, &str)]) -> Vec<u8> {
    let mut head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n",
        body.len()
    );
    for (n, v) in extra {
        head.push_str(&format!("{n}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(body.as_bytes());
    bytes
}

/// The request body every streaming chat test sends.
pub const CHAT: &str = r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;

/// An SSE chat stream of `n` one-word tokens and its terminal marker.
pub fn chat_events(n: usize) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(
            b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\" the\"}}]}\n\n".to_vec(),
        );
    }
    out.push(
        b"data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n".to_vec(),
    );
    out.push(b"data: [DONE]\n\n".to_vec());
    out
}

/// The head of a chunked SSE response.
pub const SSE_HEAD: &[u8] =
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n";

/// One streamed chat call to `addr` (a proxy route in front of an upstream
/// that streams [`chat_events`]`(tokens)`); panics unless the response
/// arrives whole and byte for byte.
pub async fn whole_chat_call(addr: SocketAddr, tokens: usize) {
    let mut c = Conn::connect(addr).await;
    c.write(&post(addr, "/v1/chat/completions", CHAT, &[]))
        .await
        .unwrap();
    let head = c.head().await.expect("head");
    assert_eq!(head.status(), 200);
    let body = c.body(&head).await;
    assert!(body.complete);
    assert_eq!(body.bytes, chat_events(tokens).concat());
}

/// How many file descriptors this process has open (Linux: the entries
/// of `/proc/self/fd`; 0 where that can't be read).
pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
}
