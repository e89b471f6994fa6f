//! HTTP/1.1 on one captured connection: both directions in, exchanges out.
//!
//! The proxy gets requests and responses from hyper; the capture has only
//! the two byte streams, so this module does hyper's framing work
//! incrementally: heads with `httparse`, bodies by Content-Length, chunked
//! coding or connection close, keep-alive and pipelining (responses are
//! matched to requests in order), interim `100 Continue` responses, and no
//! body for `HEAD`, 1xx, 204 and 304. Response bodies come out de-chunked,
//! the payload bytes hyper would give the proxy's tap, so the same decoders
//! read them; a body event never spans two chunks, so an SSE frame sent as
//! one chunk arrives as one event when its packets allow.
//!
//! Lost bytes ([`Delivery::Gap`]) are handled so the result is never wrong:
//! a gap that fits the body's framing (inside a Content-Length body, inside
//! one chunk's data, or in a close-delimited body) keeps the exchange going
//! flagged `gap`; any other gap loses the framing, ends the exchanges in
//! flight incomplete and resynchronizes at the next request line or status
//! line. Responses that can no longer be matched to their request with
//! certainty are parsed and dropped, never attributed to another request.
//!
//! A response whose framing is broken (not a gap: the server sent
//! something unparseable) is handled like a gap that loses the framing,
//! and its exchange ends with `gap: true` too: either way its numbers are
//! not to be trusted.
//!
//! Known limit: a request with `Expect: 100-continue` answered by a final
//! status without `100 Continue`, whose client then sends no body, leaves
//! the request side waiting for that body; the next request on the
//! connection is read as body bytes and lost (clients close the connection
//! in that case, so it rarely matters).
//!
//! Bytes are copied once, into each direction's parse buffer; body events
//! are zero-copy slices of that buffer.
//!
//! Privacy: of the headers only Host, Content-Type, Content-Encoding and
//! User-Agent are kept (see [`Headers`]); the path is kept without its
//! query string. Authorization, cookies and every other header value are
//! never copied out of the capture buffer. Bodies are passed on as events
//! and not kept.
//!
//! A connection whose first bytes are not HTTP/1.x (TLS, HTTP/2 prior
//! knowledge, another protocol on the port) is marked not-HTTP and ignored.

use std::collections::VecDeque;

use bytes::{Buf, Bytes, BytesMut};
use httparse::Status;

use super::reassembly::Delivery;
use super::Nanos;

/// The most bytes a response head (status line plus headers), a chunk
/// size line or a trailer may take before the stream is taken for
/// something other than HTTP.
const MAX_HEAD: usize = 64 << 10;
/// The most bytes a request head may take by default: the proxy's own
/// default cap (`--max-head-kib`, 408 KiB), so a request the proxy would
/// take is taken by the capture too. A long header (a big cookie, a
/// tracing baggage) makes heads of hundreds of KiB that servers accept.
pub const DEFAULT_MAX_REQUEST_HEAD: usize = 408 << 10;
/// The most headers one head may have (httparse needs a fixed array).
const MAX_HEADERS: usize = 128;
/// Methods a request line is looked for with when resynchronizing.
const METHODS: [&[u8]; 8] = [
    b"GET ",
    b"POST ",
    b"PUT ",
    b"DELETE ",
    b"HEAD ",
    b"OPTIONS ",
    b"PATCH ",
    b"CONNECT ",
];
/// Bytes kept while resynchronizing and nothing matched yet: enough for
/// the start of the longest method or `HTTP/1.` cut by a packet boundary.
const RESYNC_TAIL: usize = 8;

/// The header values the engine needs to detect and decode a call; every
/// other header is dropped at parse time.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Headers {
    pub host: Option<String>,
    pub content_type: Option<String>,
    pub content_encoding: Option<String>,
    /// Names the client app, as the proxy does.
    pub user_agent: Option<String>,
}

/// What one connection's HTTP says, in order. `exchange` numbers the
/// request/response pairs of the connection from 0.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A request head; `path` has no query string.
    RequestHead {
        exchange: u64,
        method: String,
        path: String,
        headers: Headers,
    },
    /// Request body bytes (de-chunked when the request was chunked).
    RequestBody { exchange: u64, bytes: Bytes },
    /// The request ended; `complete` is false when bytes of it were lost or
    /// it was cut short (client half-close, reset, response ended first).
    RequestEnd { exchange: u64, complete: bool },
    /// The final response head (interim 1xx heads are not reported).
    ResponseHead {
        exchange: u64,
        status: u16,
        headers: Headers,
    },
    /// Response payload bytes, de-chunked; never more than one chunk.
    ResponseBody { exchange: u64, bytes: Bytes },
    /// The response ended. `complete`: the body reached its framed end
    /// with nothing lost. `gap`: bytes of the exchange were lost in
    /// capture, so its timings and counts are not to be trusted.
    ResponseEnd {
        exchange: u64,
        complete: bool,
        gap: bool,
    },
    /// Bytes lost in capture, in the client's direction or the server's,
    /// and the exchange they hit, if one was in flight.
    Gap {
        exchange: Option<u64>,
        from_client: bool,
        missing_bytes: u64,
    },
}

/// An [`Event`] with the capture timestamp of the packet that completed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Timed {
    pub at: Nanos,
    pub event: Event,
}

/// How a body ends, with what is left of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Body {
    /// Content-Length: the bytes still to come.
    Length(u64),
    Chunked(Chunk),
    /// Until the server closes the connection.
    Close,
}

/// Where the chunked decoder is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Chunk {
    Size,
    Data(u64),
    /// The CRLF after a chunk's data.
    DataEnd,
    Trailers,
}

/// One step of reading a body from a buffer.
enum Step {
    Data(Bytes),
    Done,
    More,
    Bad,
}

impl Body {
    fn step(&mut self, buf: &mut BytesMut) -> Step {
        match self {
            Body::Length(0) => Step::Done,
            Body::Length(left) => take(buf, left),
            Body::Close if buf.is_empty() => Step::More,
            Body::Close => Step::Data(buf.split().freeze()),
            Body::Chunked(chunk) => loop {
                match chunk {
                    Chunk::Size => match httparse::parse_chunk_size(buf) {
                        Ok(Status::Complete((used, size))) => {
                            buf.advance(used);
                            *chunk = if size == 0 {
                                Chunk::Trailers
                            } else {
                                Chunk::Data(size)
                            };
                        }
                        Ok(Status::Partial) if buf.len() <= MAX_HEAD => return Step::More,
                        _ => return Step::Bad,
                    },
                    Chunk::Data(left) => {
                        let step = take(buf, left);
                        if *left == 0 {
                            *chunk = Chunk::DataEnd;
                        }
                        return step;
                    }
                    Chunk::DataEnd if buf.len() < 2 => return Step::More,
                    Chunk::DataEnd if buf.starts_with(b"\r\n") => {
                        buf.advance(2);
                        *chunk = Chunk::Size;
                    }
                    Chunk::DataEnd => return Step::Bad,
                    Chunk::Trailers if buf.starts_with(b"\r\n") => {
                        buf.advance(2);
                        *self = Body::Length(0);
                        return Step::Done;
                    }
                    Chunk::Trailers => match memchr::memmem::find(buf, b"\r\n") {
                        // One trailer field, dropped unread.
                        Some(end) => buf.advance(end + 2),
                        None if buf.len() <= MAX_HEAD => return Step::More,
                        None => return Step::Bad,
                    },
                }
            },
        }
    }

    /// Accounts for `missing` lost bytes if the framing survives them
    /// (they fall inside the current length or chunk); false otherwise.
    fn skip(&mut self, missing: u64) -> bool {
        match self {
            Body::Length(left) | Body::Chunked(Chunk::Data(left)) if missing <= *left => {
                *left -= missing;
                if let Body::Chunked(chunk @ Chunk::Data(0)) = self {
                    *chunk = Chunk::DataEnd;
                }
                true
            }
            Body::Close => true,
            _ => false,
        }
    }
}

fn take(buf: &mut BytesMut, left: &mut u64) -> Step {
    if buf.is_empty() {
        return Step::More;
    }
    let n = buf.len().min(usize::try_from(*left).unwrap_or(usize::MAX));
    *left -= n as u64;
    Step::Data(buf.split_to(n).freeze())
}

/// What the body framing headers say, before the method and status apply.
#[derive(Default)]
struct Framing {
    /// Transfer-Encoding was present; `Some(true)` when chunked is last.
    chunked: Option<bool>,
    content_length: Option<u64>,
}

/// Picks the kept headers and the framing out of a parsed head; `None`
/// when the framing headers contradict themselves.
fn read_headers(raw: &[httparse::Header]) -> Option<(Headers, Framing)> {
    let mut headers = Headers::default();
    let mut framing = Framing::default();
    let text = |value: &[u8]| String::from_utf8_lossy(value).trim().to_owned();
    for h in raw {
        let name = h.name;
        if name.eq_ignore_ascii_case("host") {
            headers.host = Some(text(h.value));
        } else if name.eq_ignore_ascii_case("content-type") {
            headers.content_type = Some(text(h.value));
        } else if name.eq_ignore_ascii_case("content-encoding") {
            headers.content_encoding = Some(text(h.value));
        } else if name.eq_ignore_ascii_case("user-agent") {
            headers.user_agent = Some(text(h.value));
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            let value = std::str::from_utf8(h.value).ok()?;
            if let Some(last) = value.split(',').map(str::trim).rfind(|c| !c.is_empty()) {
                framing.chunked = Some(last.eq_ignore_ascii_case("chunked"));
            }
        } else if name.eq_ignore_ascii_case("content-length") {
            let value = std::str::from_utf8(h.value).ok()?;
            for part in value.split(',') {
                let n: u64 = part.trim().parse().ok()?;
                if framing.content_length.is_some_and(|seen| seen != n) {
                    return None;
                }
                framing.content_length = Some(n);
            }
        }
    }
    Some((headers, framing))
}

struct RequestHead {
    method: String,
    path: String,
    headers: Headers,
    body: Body,
}

/// A request head at the start of `buf`: `Ok(None)` while incomplete,
/// `Err` when it is not one.
fn parse_request(buf: &[u8], max_head: usize) -> Result<Option<(RequestHead, usize)>, ()> {
    let mut storage = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut storage);
    let used = match req.parse(buf) {
        Ok(Status::Complete(used)) => used,
        Ok(Status::Partial) if buf.len() <= max_head => return Ok(None),
        _ => return Err(()),
    };
    let (Some(method), Some(target)) = (req.method, req.path) else {
        return Err(());
    };
    let (headers, framing) = read_headers(req.headers).ok_or(())?;
    // Requests are never close-delimited: a coding other than chunked
    // last cannot be framed (RFC 9112 section 6.3, rule 4).
    let body = match (framing.chunked, framing.content_length) {
        (Some(true), _) => Body::Chunked(Chunk::Size),
        (Some(false), _) => return Err(()),
        (None, Some(n)) => Body::Length(n),
        (None, None) => Body::Length(0),
    };
    let path = target
        .split(['?', '#'])
        .next()
        .unwrap_or_default()
        .to_owned();
    let head = RequestHead {
        method: method.to_owned(),
        path,
        headers,
        body,
    };
    Ok(Some((head, used)))
}

struct ResponseHead {
    status: u16,
    headers: Headers,
    framing: Framing,
}

/// A response head at the start of `buf`, as [`parse_request`].
fn parse_response(buf: &[u8]) -> Result<Option<(ResponseHead, usize)>, ()> {
    let mut storage = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut storage);
    let used = match resp.parse(buf) {
        Ok(Status::Complete(used)) => used,
        Ok(Status::Partial) if buf.len() <= MAX_HEAD => return Ok(None),
        _ => return Err(()),
    };
    let status = resp.code.ok_or(())?;
    let (headers, framing) = read_headers(resp.headers).ok_or(())?;
    Ok(Some((
        ResponseHead {
            status,
            headers,
            framing,
        },
        used,
    )))
}

/// Where a resynchronizing parser found a head to restart from.
enum Found {
    /// A complete head starts here.
    At(usize),
    /// A head may start here; wait for more bytes.
    Maybe(usize),
    None,
}

/// Finds the first plausible request or status line in `buf`; a request
/// head may take up to `max_request_head` bytes.
fn find_head(buf: &[u8], request: bool, max_request_head: usize) -> Found {
    for i in 0..buf.len() {
        let rest = &buf[i..];
        let looks = if request {
            METHODS.iter().any(|m| rest.starts_with(m))
        } else {
            rest.starts_with(b"HTTP/1.")
        };
        if !looks {
            continue;
        }
        let parsed = if request {
            parse_request(rest, max_request_head).map(|h| h.is_some())
        } else {
            parse_response(rest).map(|h| h.is_some())
        };
        match parsed {
            Ok(true) => return Found::At(i),
            Ok(false) => return Found::Maybe(i),
            Err(()) => {}
        }
    }
    Found::None
}

/// A request whose response has not started.
#[derive(Debug)]
enum Waiting {
    Exchange {
        id: u64,
        head: bool,
        connect: bool,
        gap: bool,
    },
    /// Requests were lost here: how many responses belong to them is
    /// unknown.
    Barrier,
}

/// The exchange a response is being read for.
#[derive(Clone, Copy, Debug)]
struct Target {
    id: u64,
    gap: bool,
}

#[derive(Debug)]
enum ReqState {
    Head,
    Body {
        id: u64,
        body: Body,
        /// Whether its `RequestEnd` is still to come.
        open: bool,
        gap: bool,
    },
    /// Looking for the next request line after lost bytes.
    Resync,
    Stopped,
}

#[derive(Debug)]
enum RespState {
    Head,
    /// `target` is `None` for a response read only to stay in step.
    Body {
        target: Option<Target>,
        body: Body,
    },
    /// Looking for the next status line after lost bytes.
    Resync,
    Stopped,
}

/// The HTTP/1.1 state of one connection.
#[derive(Debug)]
pub struct Http1Conn {
    /// Whether the first bytes must be a request (the SYN was seen).
    strict: bool,
    /// The most bytes a request head may take.
    max_request_head: usize,
    not_http: bool,
    next_exchange: u64,
    queue: VecDeque<Waiting>,
    req: ReqState,
    req_buf: BytesMut,
    resp: RespState,
    resp_buf: BytesMut,
}

impl Http1Conn {
    /// A connection's parser. `mid_stream`: the capture joined an
    /// established connection, so both directions start by looking for a
    /// head rather than taking their first bytes for one.
    pub fn new(mid_stream: bool) -> Self {
        let (req, resp) = if mid_stream {
            (ReqState::Resync, RespState::Resync)
        } else {
            (ReqState::Head, RespState::Head)
        };
        Http1Conn {
            strict: !mid_stream,
            max_request_head: DEFAULT_MAX_REQUEST_HEAD,
            not_http: false,
            next_exchange: 0,
            queue: VecDeque::new(),
            req,
            req_buf: BytesMut::new(),
            resp,
            resp_buf: BytesMut::new(),
        }
    }

    /// Takes request heads of up to `bytes` (the proxy's configured cap).
    pub fn with_max_request_head(mut self, bytes: usize) -> Self {
        self.max_request_head = bytes;
        self
    }

    /// Whether the connection turned out not to speak HTTP/1.x; it is
    /// ignored from then on.
    pub fn is_not_http(&self) -> bool {
        self.not_http
    }

    /// Whether nothing more can come out of this connection (both
    /// directions ended, an upgrade, or not HTTP).
    pub fn is_done(&self) -> bool {
        self.not_http
            || (matches!(self.req, ReqState::Stopped) && matches!(self.resp, RespState::Stopped))
    }

    /// Takes one reassembled delivery of one direction.
    pub fn on_delivery(&mut self, from_client: bool, delivery: Delivery, out: &mut Vec<Timed>) {
        match delivery {
            Delivery::Data { bytes, at } => self.on_data(from_client, &bytes, at, out),
            Delivery::Gap { missing_bytes, at } => self.on_gap(from_client, missing_bytes, at, out),
            Delivery::End { reset, at } => self.on_end(from_client, reset, at, out),
        }
    }

    /// Bytes of one direction, in stream order.
    pub fn on_data(&mut self, from_client: bool, bytes: &[u8], at: Nanos, out: &mut Vec<Timed>) {
        if self.not_http {
            return;
        }
        if from_client {
            if !matches!(self.req, ReqState::Stopped) {
                self.req_buf.extend_from_slice(bytes);
                self.pump_requests(at, out);
            }
        } else if !matches!(self.resp, RespState::Stopped) {
            self.resp_buf.extend_from_slice(bytes);
            self.pump_responses(at, out);
        }
    }

    /// `missing` bytes of one direction were lost.
    pub fn on_gap(&mut self, from_client: bool, missing: u64, at: Nanos, out: &mut Vec<Timed>) {
        if self.not_http {
            return;
        }
        if from_client {
            self.request_gap(missing, at, out);
        } else {
            self.response_gap(missing, at, out);
        }
    }

    /// One direction ended: a FIN, or a reset (which ends both).
    pub fn on_end(&mut self, from_client: bool, reset: bool, at: Nanos, out: &mut Vec<Timed>) {
        if self.not_http {
            return;
        }
        if reset {
            self.close(at, out);
        } else if from_client {
            if let ReqState::Body { id, open: true, .. } = self.req {
                push(
                    out,
                    at,
                    Event::RequestEnd {
                        exchange: id,
                        complete: false,
                    },
                );
            }
            self.req = ReqState::Stopped;
            self.req_buf.clear();
        } else {
            // The close ends a close-delimited body; any other body, and
            // every request still waiting, is cut short.
            if let RespState::Body {
                target: Some(t),
                body,
            } = self.resp
            {
                let complete = body == Body::Close && !t.gap;
                self.end_exchange(t.id, complete, t.gap, at, out);
            }
            self.resp = RespState::Stopped;
            self.resp_buf.clear();
            self.end_waiting(false, at, out);
        }
    }

    /// Ends everything in flight, incomplete (a reset, or the flow table
    /// evicting an idle connection).
    pub fn close(&mut self, at: Nanos, out: &mut Vec<Timed>) {
        if self.not_http {
            return;
        }
        if let RespState::Body {
            target: Some(t), ..
        } = self.resp
        {
            self.end_exchange(t.id, false, t.gap, at, out);
        }
        self.end_waiting(false, at, out);
        if let ReqState::Body { id, open: true, .. } = self.req {
            push(
                out,
                at,
                Event::RequestEnd {
                    exchange: id,
                    complete: false,
                },
            );
        }
        self.req = ReqState::Stopped;
        self.resp = RespState::Stopped;
        self.req_buf.clear();
        self.resp_buf.clear();
    }

    fn pump_requests(&mut self, at: Nanos, out: &mut Vec<Timed>) {
        loop {
            match &mut self.req {
                ReqState::Stopped => {
                    self.req_buf.clear();
                    return;
                }
                ReqState::Head => {
                    if self.req_buf.is_empty() {
                        return;
                    }
                    match parse_request(&self.req_buf, self.max_request_head) {
                        Ok(Some((head, used))) => {
                            self.req_buf.advance(used);
                            self.start_request(head, at, out);
                        }
                        Ok(None) => return,
                        Err(()) if self.strict && self.next_exchange == 0 => {
                            self.mark_not_http();
                            return;
                        }
                        Err(()) => self.lose_request_framing(at, out),
                    }
                }
                ReqState::Body {
                    id,
                    body,
                    open,
                    gap,
                } => match body.step(&mut self.req_buf) {
                    Step::Data(bytes) => {
                        if *open {
                            push(
                                out,
                                at,
                                Event::RequestBody {
                                    exchange: *id,
                                    bytes,
                                },
                            );
                        }
                    }
                    Step::Done => {
                        if *open {
                            push(
                                out,
                                at,
                                Event::RequestEnd {
                                    exchange: *id,
                                    complete: !*gap,
                                },
                            );
                        }
                        self.req = ReqState::Head;
                    }
                    Step::More => return,
                    Step::Bad => self.lose_request_framing(at, out),
                },
                ReqState::Resync => match find_head(&self.req_buf, true, self.max_request_head) {
                    Found::At(i) => {
                        self.req_buf.advance(i);
                        self.req = ReqState::Head;
                    }
                    Found::Maybe(i) => {
                        self.req_buf.advance(i);
                        return;
                    }
                    Found::None => {
                        let keep = self.req_buf.len().min(RESYNC_TAIL);
                        self.req_buf.advance(self.req_buf.len() - keep);
                        return;
                    }
                },
            }
        }
    }

    fn start_request(&mut self, head: RequestHead, at: Nanos, out: &mut Vec<Timed>) {
        let id = self.next_exchange;
        self.next_exchange += 1;
        self.queue.push_back(Waiting::Exchange {
            id,
            head: head.method.eq_ignore_ascii_case("HEAD"),
            connect: head.method.eq_ignore_ascii_case("CONNECT"),
            gap: false,
        });
        push(
            out,
            at,
            Event::RequestHead {
                exchange: id,
                method: head.method,
                path: head.path,
                headers: head.headers,
            },
        );
        self.req = ReqState::Body {
            id,
            body: head.body,
            open: true,
            gap: false,
        };
    }

    fn pump_responses(&mut self, at: Nanos, out: &mut Vec<Timed>) {
        loop {
            match &mut self.resp {
                RespState::Stopped => {
                    self.resp_buf.clear();
                    return;
                }
                RespState::Head => {
                    if self.resp_buf.is_empty() {
                        return;
                    }
                    match parse_response(&self.resp_buf) {
                        Ok(Some((head, used))) => {
                            self.resp_buf.advance(used);
                            self.start_response(head, at, out);
                        }
                        Ok(None) => return,
                        Err(()) if self.strict && self.next_exchange == 0 => {
                            self.mark_not_http();
                            return;
                        }
                        Err(()) => self.lose_response_framing(at, out),
                    }
                }
                RespState::Body { target, body } => match body.step(&mut self.resp_buf) {
                    Step::Data(bytes) => {
                        if let Some(t) = target {
                            push(
                                out,
                                at,
                                Event::ResponseBody {
                                    exchange: t.id,
                                    bytes,
                                },
                            );
                        }
                    }
                    Step::Done => {
                        let target = *target;
                        self.resp = RespState::Head;
                        if let Some(t) = target {
                            self.end_exchange(t.id, !t.gap, t.gap, at, out);
                        }
                    }
                    Step::More => return,
                    Step::Bad => self.lose_response_framing(at, out),
                },
                RespState::Resync => match find_head(&self.resp_buf, false, 0) {
                    Found::At(i) => {
                        self.resp_buf.advance(i);
                        self.resp = RespState::Head;
                    }
                    Found::Maybe(i) => {
                        self.resp_buf.advance(i);
                        return;
                    }
                    Found::None => {
                        let keep = self.resp_buf.len().min(RESYNC_TAIL);
                        self.resp_buf.advance(self.resp_buf.len() - keep);
                        return;
                    }
                },
            }
        }
    }

    fn start_response(&mut self, head: ResponseHead, at: Nanos, out: &mut Vec<Timed>) {
        // Interim responses (100 Continue, 103 Early Hints) precede the
        // real one; 101 switches protocols and ends the HTTP.
        if (100..200).contains(&head.status) && head.status != 101 {
            return;
        }
        let waiting = self.take_waiting();
        let (target, head_method, connect) = match waiting {
            Some(Waiting::Exchange {
                id,
                head,
                connect,
                gap,
            }) => (Some(Target { id, gap }), head, connect),
            _ => (None, false, false),
        };
        if let Some(t) = target {
            push(
                out,
                at,
                Event::ResponseHead {
                    exchange: t.id,
                    status: head.status,
                    headers: head.headers,
                },
            );
        }
        let tunnel = head.status == 101 || (connect && (200..300).contains(&head.status));
        let body = if tunnel || head_method || matches!(head.status, 204 | 304) {
            Body::Length(0)
        } else {
            match (head.framing.chunked, head.framing.content_length) {
                (Some(true), _) => Body::Chunked(Chunk::Size),
                (Some(false), _) => Body::Close,
                (None, Some(n)) => Body::Length(n),
                (None, None) => Body::Close,
            }
        };
        if tunnel {
            self.resp = RespState::Stopped;
            if let Some(t) = target {
                self.end_exchange(t.id, !t.gap, t.gap, at, out);
            }
            self.close(at, out);
        } else {
            self.resp = RespState::Body { target, body };
        }
    }

    /// The request a response head answers: the first waiting one, past a
    /// barrier only when a request came after it (the response then
    /// belongs to that request, as a client that lost nothing would not
    /// send it before the answers to the lost ones). `None`: the response
    /// is read and dropped.
    fn take_waiting(&mut self) -> Option<Waiting> {
        match self.queue.front() {
            Some(Waiting::Barrier) if self.queue.len() > 1 => {
                self.queue.pop_front();
                self.queue.pop_front()
            }
            Some(Waiting::Barrier) | None => None,
            Some(Waiting::Exchange { .. }) => self.queue.pop_front(),
        }
    }

    fn request_gap(&mut self, missing: u64, at: Nanos, out: &mut Vec<Timed>) {
        let in_flight = match &mut self.req {
            ReqState::Stopped => return,
            ReqState::Body { id, body, gap, .. } => {
                if self.req_buf.is_empty() && body.skip(missing) {
                    *gap = true;
                    let id = *id;
                    push(out, at, gap_event(Some(id), true, missing));
                    self.mark_gap(id);
                    self.pump_requests(at, out);
                    return;
                }
                Some(*id)
            }
            ReqState::Head | ReqState::Resync => None,
        };
        push(out, at, gap_event(in_flight, true, missing));
        if let Some(id) = in_flight {
            self.mark_gap(id);
        }
        // Bytes before a gap never join bytes after it.
        self.req_buf.clear();
        self.lose_request_framing(at, out);
    }

    /// The request stream lost its framing: the request being read ends
    /// incomplete (its response, if intact, is still read, flagged `gap`),
    /// and a barrier stands for the requests that may have been lost.
    fn lose_request_framing(&mut self, at: Nanos, out: &mut Vec<Timed>) {
        if let ReqState::Body { id, open: true, .. } = self.req {
            push(
                out,
                at,
                Event::RequestEnd {
                    exchange: id,
                    complete: false,
                },
            );
            self.mark_gap(id);
        }
        if !matches!(self.queue.back(), Some(Waiting::Barrier)) {
            self.queue.push_back(Waiting::Barrier);
        }
        self.req = ReqState::Resync;
        self.pump_requests(at, out);
    }

    fn response_gap(&mut self, missing: u64, at: Nanos, out: &mut Vec<Timed>) {
        let hit = match &mut self.resp {
            RespState::Stopped => return,
            RespState::Body { target, body } => {
                if self.resp_buf.is_empty() && body.skip(missing) {
                    if let Some(t) = target {
                        t.gap = true;
                    }
                    let id = target.map(|t| t.id);
                    push(out, at, gap_event(id, false, missing));
                    self.pump_responses(at, out);
                    return;
                }
                target.map(|t| t.id)
            }
            RespState::Head | RespState::Resync => None,
        };
        let hit = hit.or_else(|| {
            self.queue.iter().find_map(|w| match w {
                Waiting::Exchange { id, .. } => Some(*id),
                Waiting::Barrier => None,
            })
        });
        push(out, at, gap_event(hit, false, missing));
        self.resp_buf.clear();
        self.lose_response_framing(at, out);
    }

    /// The response stream lost its framing: the response being read and
    /// every request waiting (their responses may be in the lost bytes)
    /// end incomplete; only requests made from now on get responses.
    fn lose_response_framing(&mut self, at: Nanos, out: &mut Vec<Timed>) {
        if let RespState::Body {
            target: Some(t), ..
        } = self.resp
        {
            self.end_exchange(t.id, false, true, at, out);
        }
        self.end_waiting(true, at, out);
        self.resp = RespState::Resync;
        self.pump_responses(at, out);
    }

    /// Ends every waiting exchange incomplete.
    fn end_waiting(&mut self, gap: bool, at: Nanos, out: &mut Vec<Timed>) {
        while let Some(waiting) = self.queue.pop_front() {
            if let Waiting::Exchange { id, gap: lost, .. } = waiting {
                self.end_exchange(id, false, gap || lost, at, out);
            }
        }
    }

    /// Emits an exchange's `ResponseEnd`, after its `RequestEnd` if the
    /// request was still being read (its remaining bytes are then read
    /// silently).
    fn end_exchange(
        &mut self,
        id: u64,
        complete: bool,
        gap: bool,
        at: Nanos,
        out: &mut Vec<Timed>,
    ) {
        if let ReqState::Body {
            id: req_id, open, ..
        } = &mut self.req
        {
            if *req_id == id && *open {
                *open = false;
                push(
                    out,
                    at,
                    Event::RequestEnd {
                        exchange: id,
                        complete: false,
                    },
                );
            }
        }
        push(
            out,
            at,
            Event::ResponseEnd {
                exchange: id,
                complete,
                gap,
            },
        );
    }

    /// Flags an exchange whose request lost bytes, wherever it is.
    fn mark_gap(&mut self, id: u64) {
        for waiting in &mut self.queue {
            if let Waiting::Exchange { id: w, gap, .. } = waiting {
                if *w == id {
                    *gap = true;
                }
            }
        }
        if let RespState::Body {
            target: Some(t), ..
        } = &mut self.resp
        {
            if t.id == id {
                t.gap = true;
            }
        }
    }

    fn mark_not_http(&mut self) {
        self.not_http = true;
        self.queue.clear();
        self.req = ReqState::Stopped;
        self.resp = RespState::Stopped;
        self.req_buf = BytesMut::new();
        self.resp_buf = BytesMut::new();
    }
}

fn gap_event(exchange: Option<u64>, from_client: bool, missing_bytes: u64) -> Event {
    Event::Gap {
        exchange,
        from_client,
        missing_bytes,
    }
}

fn push(out: &mut Vec<Timed>, at: Nanos, event: Event) {
    out.push(Timed { at, event });
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLIENT: bool = true;
    const SERVER: bool = false;

    /// One event as a short line, for readable assertions.
    fn line(event: &Event) -> String {
        let text = |b: &Bytes| String::from_utf8_lossy(b).into_owned();
        match event {
            Event::RequestHead {
                exchange,
                method,
                path,
                ..
            } => format!("req-head {exchange} {method} {path}"),
            Event::RequestBody { exchange, bytes } => {
                format!("req-body {exchange} {}", text(bytes))
            }
            Event::RequestEnd { exchange, complete } => {
                format!(
                    "req-end {exchange}{}",
                    if *complete { "" } else { " incomplete" }
                )
            }
            Event::ResponseHead {
                exchange, status, ..
            } => format!("resp-head {exchange} {status}"),
            Event::ResponseBody { exchange, bytes } => {
                format!("resp-body {exchange} {}", text(bytes))
            }
            Event::ResponseEnd {
                exchange,
                complete,
                gap,
            } => format!(
                "resp-end {exchange}{}{}",
                if *complete { "" } else { " incomplete" },
                if *gap { " gap" } else { "" }
            ),
            Event::Gap {
                exchange,
                from_client,
                missing_bytes,
            } => format!(
                "gap {} {exchange:?} {missing_bytes}",
                if *from_client { "client" } else { "server" }
            ),
        }
    }

    /// Feeds (direction, bytes) steps, at time = step index; a step of
    /// `None` bytes is that direction's FIN.
    fn run(conn: &mut Http1Conn, steps: &[(bool, Option<&[u8]>)]) -> Vec<Timed> {
        let mut out = Vec::new();
        for (i, (from_client, bytes)) in steps.iter().enumerate() {
            match bytes {
                Some(bytes) => conn.on_data(*from_client, bytes, i as Nanos, &mut out),
                None => conn.on_end(*from_client, false, i as Nanos, &mut out),
            }
        }
        out
    }

    fn lines(events: &[Timed]) -> Vec<String> {
        events.iter().map(|t| line(&t.event)).collect()
    }

    /// Lines with adjacent body pieces of one exchange joined: how a body
    /// is cut into events depends on the packets.
    fn joined(events: &[Timed]) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for l in lines(events) {
            if let Some(last) = out.last_mut() {
                let prefix = |s: &str| s.split(' ').take(2).collect::<Vec<_>>().join(" ");
                if (l.starts_with("req-body") || l.starts_with("resp-body"))
                    && prefix(last) == prefix(&l)
                {
                    let tail = l.splitn(3, ' ').nth(2).unwrap_or_default().to_owned();
                    last.push_str(&tail);
                    continue;
                }
            }
            out.push(l);
        }
        out
    }

    fn fresh() -> Http1Conn {
        Http1Conn::new(false)
    }

    const POST: &[u8] =
        b"POST /v1/chat/completions?key=secret HTTP/1.1\r\nHost: localhost:11434\r\n\
Authorization: Bearer sk-secret\r\nCookie: session=secret\r\nContent-Type: application/json\r\n\
User-Agent: openai-python/1.0\r\nContent-Length: 13\r\n\r\n{\"stream\":1}\n";

    const CHUNKED_REQUEST: &[u8] = b"POST /api/chat HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n\
5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\n\r\n";

    const SSE: &[u8] =
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n\
f\r\ndata: {\"a\":1}\n\n\r\n19;name=value\r\ndata: {\"b\":22222222222}\n\n\r\n\
e\r\ndata: [DONE]\n\n\r\n0\r\nX-Trailer: t\r\nX-Other: u\r\n\r\n";

    #[test]
    fn a_content_length_request_and_response_make_one_exchange() {
        let mut c = fresh();
        let out = run(
            &mut c,
            &[
                (CLIENT, Some(POST)),
                (
                    SERVER,
                    Some(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"),
                ),
            ],
        );
        assert_eq!(
            lines(&out),
            [
                "req-head 0 POST /v1/chat/completions",
                "req-body 0 {\"stream\":1}\n",
                "req-end 0",
                "resp-head 0 200",
                "resp-body 0 hello",
                "resp-end 0",
            ]
        );
        assert_eq!(out[3].at, 1);
    }

    #[test]
    fn only_the_kept_headers_and_the_path_without_query_come_out() {
        let mut c = fresh();
        let out = run(&mut c, &[(CLIENT, Some(POST))]);
        let Event::RequestHead { path, headers, .. } = &out[0].event else {
            panic!("not a head: {:?}", out[0]);
        };
        assert_eq!(path, "/v1/chat/completions");
        assert_eq!(
            headers,
            &Headers {
                host: Some("localhost:11434".into()),
                content_type: Some("application/json".into()),
                content_encoding: None,
                user_agent: Some("openai-python/1.0".into()),
            }
        );
        assert!(!format!("{out:?}").contains("secret"));
    }

    #[test]
    fn a_chunked_response_comes_out_de_chunked_one_event_per_chunk() {
        let mut c = fresh();
        let out = run(
            &mut c,
            &[(CLIENT, Some(CHUNKED_REQUEST)), (SERVER, Some(SSE))],
        );
        assert_eq!(
            lines(&out),
            [
                "req-head 0 POST /api/chat",
                "req-body 0 hello",
                "req-body 0  world",
                "req-end 0",
                "resp-head 0 200",
                "resp-body 0 data: {\"a\":1}\n\n",
                "resp-body 0 data: {\"b\":22222222222}\n\n",
                "resp-body 0 data: [DONE]\n\n",
                "resp-end 0",
            ]
        );
    }

    #[test]
    fn heads_and_chunk_lines_split_at_every_byte_give_the_same_exchange() {
        let whole = joined(&run(
            &mut fresh(),
            &[(CLIENT, Some(CHUNKED_REQUEST)), (SERVER, Some(SSE))],
        ));
        for split in 0..=CHUNKED_REQUEST.len() {
            let (a, b) = CHUNKED_REQUEST.split_at(split);
            let out = run(
                &mut fresh(),
                &[(CLIENT, Some(a)), (CLIENT, Some(b)), (SERVER, Some(SSE))],
            );
            assert_eq!(joined(&out), whole, "request split at {split}");
        }
        for split in 0..=SSE.len() {
            let (a, b) = SSE.split_at(split);
            let out = run(
                &mut fresh(),
                &[
                    (CLIENT, Some(CHUNKED_REQUEST)),
                    (SERVER, Some(a)),
                    (SERVER, Some(b)),
                ],
            );
            assert_eq!(joined(&out), whole, "response split at {split}");
        }
    }

    #[test]
    fn a_stream_fed_one_byte_at_a_time_gives_the_same_exchange() {
        let whole = joined(&run(
            &mut fresh(),
            &[(CLIENT, Some(CHUNKED_REQUEST)), (SERVER, Some(SSE))],
        ));
        let mut steps: Vec<(bool, Option<&[u8]>)> = Vec::new();
        steps.extend(CHUNKED_REQUEST.chunks(1).map(|b| (CLIENT, Some(b))));
        steps.extend(SSE.chunks(1).map(|b| (SERVER, Some(b))));
        assert_eq!(joined(&run(&mut fresh(), &steps)), whole);
    }

    #[test]
    fn a_close_delimited_response_ends_complete_at_the_servers_fin() {
        let mut c = fresh();
        let out = run(
            &mut c,
            &[
                (CLIENT, Some(b"GET /api/tags HTTP/1.1\r\n\r\n")),
                (SERVER, Some(b"HTTP/1.0 200 OK\r\n\r\nsome")),
                (SERVER, Some(b" more")),
                (SERVER, None),
            ],
        );
        assert_eq!(
            lines(&out),
            [
                "req-head 0 GET /api/tags",
                "req-end 0",
                "resp-head 0 200",
                "resp-body 0 some",
                "resp-body 0  more",
                "resp-end 0",
            ]
        );
        assert_eq!(out[5].at, 3);
        assert!(c.is_done() || !c.is_not_http());
    }

    #[test]
    fn a_length_delimited_response_cut_by_fin_ends_incomplete_and_so_do_waiting_requests() {
        let mut c = fresh();
        let out = run(
            &mut c,
            &[
                (
                    CLIENT,
                    Some(b"GET /a HTTP/1.1\r\n\r\nGET /b HTTP/1.1\r\n\r\n"),
                ),
                (
                    SERVER,
                    Some(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"),
                ),
                (SERVER, None),
            ],
        );
        assert_eq!(
            lines(&out)[4..],
            [
                "resp-head 0 200",
                "resp-body 0 abc",
                "resp-end 0 incomplete",
                "resp-end 1 incomplete"
            ]
        );
    }

    #[test]
    fn several_exchanges_share_one_keep_alive_connection() {
        let mut c = fresh();
        let out = run(
            &mut c,
            &[
                (CLIENT, Some(POST)),
                (
                    SERVER,
                    Some(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"),
                ),
                (CLIENT, Some(CHUNKED_REQUEST)),
                (SERVER, Some(SSE)),
                (CLIENT, Some(b"GET /api/ps HTTP/1.1\r\n\r\n")),
                (
                    SERVER,
                    Some(b"HTTP/1.1 500 Oops\r\nContent-Length: 0\r\n\r\n"),
                ),
            ],
        );
        let ends: Vec<_> = lines(&out)
            .into_iter()
            .filter(|l| l.starts_with("resp-"))
            .collect();
        assert_eq!(ends.first().map(String::as_str), Some("resp-head 0 200"));
        assert!(ends.contains(&"resp-end 0".to_owned()));
        assert!(ends.contains(&"resp-head 1 200".to_owned()));
        assert!(ends.contains(&"resp-end 1".to_owned()));
        assert_eq!(ends[ends.len() - 2..], ["resp-head 2 500", "resp-end 2"]);
    }

    #[test]
    fn pipelined_requests_get_their_responses_in_order() {
        let mut c = fresh();
        let out = run(
            &mut c,
            &[
                (
                    CLIENT,
                    Some(b"GET /one HTTP/1.1\r\n\r\nPOST /two HTTP/1.1\r\nContent-Length: 2\r\n\r\nhiGET /three HTTP/1.1\r\n\r\n"),
                ),
                (
                    SERVER,
                    Some(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n1HTTP/1.1 201 OK\r\nContent-Length: 1\r\n\r\n2"),
                ),
                (SERVER, Some(b"HTTP/1.1 202 OK\r\nContent-Length: 1\r\n\r\n3")),
            ],
        );
        assert_eq!(
            lines(&out),
            [
                "req-head 0 GET /one",
                "req-end 0",
                "req-head 1 POST /two",
                "req-body 1 hi",
                "req-end 1",
                "req-head 2 GET /three",
                "req-end 2",
                "resp-head 0 200",
                "resp-body 0 1",
                "resp-end 0",
                "resp-head 1 201",
                "resp-body 1 2",
                "resp-end 1",
                "resp-head 2 202",
                "resp-body 2 3",
                "resp-end 2",
            ]
        );
    }

    #[test]
    fn a_100_continue_precedes_the_real_response() {
        let mut c = fresh();
        let out = run(
            &mut c,
            &[
                (CLIENT, Some(b"POST /v1/completions HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n")),
                (SERVER, Some(b"HTTP/1.1 100 Continue\r\n\r\n")),
                (CLIENT, Some(b"body")),
                (SERVER, Some(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")),
            ],
        );
        assert_eq!(
            lines(&out),
            [
                "req-head 0 POST /v1/completions",
                "req-body 0 body",
                "req-end 0",
                "resp-head 0 200",
                "resp-body 0 ok",
                "resp-end 0",
            ]
        );
    }

    #[test]
    fn a_head_response_has_no_body_despite_its_content_length() {
        let mut c = fresh();
        let out = run(
            &mut c,
            &[
                (
                    CLIENT,
                    Some(b"HEAD / HTTP/1.1\r\n\r\nGET / HTTP/1.1\r\n\r\n"),
                ),
                (
                    SERVER,
                    Some(b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n"),
                ),
                (
                    SERVER,
                    Some(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"),
                ),
            ],
        );
        assert_eq!(
            lines(&out)[4..],
            [
                "resp-head 0 200",
                "resp-end 0",
                "resp-head 1 200",
                "resp-body 1 ok",
                "resp-end 1"
            ]
        );
    }

    #[test]
    fn responses_204_and_304_have_no_body() {
        let mut c = fresh();
        let out = run(
            &mut c,
            &[
                (CLIENT, Some(b"DELETE /x HTTP/1.1\r\n\r\nGET /y HTTP/1.1\r\n\r\nGET /z HTTP/1.1\r\n\r\n")),
                (
                    SERVER,
                    Some(b"HTTP/1.1 204 No Content\r\n\r\nHTTP/1.1 304 Not Modified\r\nContent-Length: 7\r\n\r\n"),
                ),
                (SERVER, Some(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nz")),
            ],
        );
        assert_eq!(
            lines(&out)[6..],
            [
                "resp-head 0 204",
                "resp-end 0",
                "resp-head 1 304",
                "resp-end 1",
                "resp-head 2 200",
                "resp-body 2 z",
                "resp-end 2",
            ]
        );
    }

    #[test]
    fn garbage_marks_the_connection_not_http_and_it_is_ignored() {
        for first in [
            &b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"[..],
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
            b"hello there\r\n",
        ] {
            let mut c = fresh();
            let out = run(
                &mut c,
                &[
                    (CLIENT, Some(first)),
                    (CLIENT, Some(POST)),
                    (SERVER, Some(SSE)),
                ],
            );
            assert!(out.is_empty(), "{first:?}: {out:?}");
            assert!(c.is_not_http() && c.is_done());
        }
        let mut c = fresh();
        let out = run(&mut c, &[(SERVER, Some(b"220 smtp.example ESMTP\r\n"))]);
        assert!(out.is_empty() && c.is_not_http());
    }

    #[test]
    fn a_gap_inside_a_length_body_keeps_the_exchange_flagged() {
        let mut c = fresh();
        let mut out = run(
            &mut c,
            &[
                (CLIENT, Some(b"GET / HTTP/1.1\r\n\r\n")),
                (
                    SERVER,
                    Some(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nab"),
                ),
            ],
        );
        c.on_gap(SERVER, 5, 7, &mut out);
        c.on_data(SERVER, b"hijGET", 8, &mut out);
        assert_eq!(
            lines(&out)[2..],
            [
                "resp-head 0 200",
                "resp-body 0 ab",
                "gap server Some(0) 5",
                "resp-body 0 hij",
                "resp-end 0 incomplete gap"
            ]
        );
    }

    #[test]
    fn a_gap_inside_one_chunk_keeps_the_exchange_and_the_next_chunk_parses() {
        let mut c = fresh();
        let mut out = run(
            &mut c,
            &[
                (CLIENT, Some(b"GET / HTTP/1.1\r\n\r\n")),
                (
                    SERVER,
                    Some(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\na\r\nab"),
                ),
            ],
        );
        c.on_gap(SERVER, 8, 7, &mut out);
        c.on_data(SERVER, b"\r\n2\r\nxy\r\n0\r\n\r\n", 8, &mut out);
        assert_eq!(
            lines(&out)[2..],
            [
                "resp-head 0 200",
                "resp-body 0 ab",
                "gap server Some(0) 8",
                "resp-body 0 xy",
                "resp-end 0 incomplete gap"
            ]
        );
    }

    #[test]
    fn a_gap_across_chunk_framing_ends_the_exchange_and_the_next_one_resyncs() {
        let mut c = fresh();
        let mut out = run(
            &mut c,
            &[
                (CLIENT, Some(b"GET /a HTTP/1.1\r\n\r\n")),
                (
                    SERVER,
                    Some(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nab"),
                ),
            ],
        );
        c.on_gap(SERVER, 20, 7, &mut out);
        // The rest of the lost response, then the next exchange.
        c.on_data(SERVER, b"more\r\n0\r\n\r\n", 8, &mut out);
        c.on_data(CLIENT, b"GET /b HTTP/1.1\r\n\r\n", 9, &mut out);
        c.on_data(
            SERVER,
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nb",
            10,
            &mut out,
        );
        assert_eq!(
            lines(&out)[2..],
            [
                "resp-head 0 200",
                "resp-body 0 ab",
                "gap server Some(0) 20",
                "resp-end 0 incomplete gap",
                "req-head 1 GET /b",
                "req-end 1",
                "resp-head 1 200",
                "resp-body 1 b",
                "resp-end 1",
            ]
        );
    }

    #[test]
    fn a_lost_request_does_not_take_the_next_requests_response() {
        let mut c = fresh();
        let mut out = run(
            &mut c,
            &[
                (CLIENT, Some(b"GET /a HTTP/1.1\r\n\r\n")),
                (
                    SERVER,
                    Some(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\na"),
                ),
            ],
        );
        // Request /lost vanished; its response is seen, then /c's.
        c.on_gap(CLIENT, 20, 3, &mut out);
        c.on_data(
            SERVER,
            b"HTTP/1.1 404 Nope\r\nContent-Length: 4\r\n\r\nlost",
            4,
            &mut out,
        );
        c.on_data(CLIENT, b"GET /c HTTP/1.1\r\n\r\n", 5, &mut out);
        c.on_data(
            SERVER,
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nc",
            6,
            &mut out,
        );
        assert_eq!(
            lines(&out)[5..],
            [
                "gap client None 20",
                "req-head 1 GET /c",
                "req-end 1",
                "resp-head 1 200",
                "resp-body 1 c",
                "resp-end 1"
            ]
        );
    }

    #[test]
    fn a_gap_inside_a_request_body_keeps_reading_it_and_flags_the_exchange() {
        let mut c = fresh();
        let mut out = run(
            &mut c,
            &[(
                CLIENT,
                Some(b"POST /x HTTP/1.1\r\nContent-Length: 10\r\n\r\nab"),
            )],
        );
        c.on_gap(CLIENT, 3, 1, &mut out);
        c.on_data(CLIENT, b"fghijGET /y HTTP/1.1\r\n\r\n", 2, &mut out);
        c.on_data(
            SERVER,
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx",
            3,
            &mut out,
        );
        assert_eq!(
            lines(&out),
            [
                "req-head 0 POST /x",
                "req-body 0 ab",
                "gap client Some(0) 3",
                "req-body 0 fghij",
                "req-end 0 incomplete",
                "req-head 1 GET /y",
                "req-end 1",
                "resp-head 0 200",
                "resp-body 0 x",
                "resp-end 0 incomplete gap",
            ]
        );
    }

    #[test]
    fn a_request_head_cut_by_a_gap_is_not_stitched_across_it() {
        let mut c = fresh();
        let mut out = run(&mut c, &[(CLIENT, Some(b"GET /a HTTP/1.1\r\n"))]);
        c.on_gap(CLIENT, 9, 1, &mut out);
        c.on_data(CLIENT, b"\r\n", 2, &mut out);
        c.on_data(
            SERVER,
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\na",
            3,
            &mut out,
        );
        c.on_data(CLIENT, b"GET /b HTTP/1.1\r\n\r\n", 4, &mut out);
        c.on_data(
            SERVER,
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nb",
            5,
            &mut out,
        );
        assert_eq!(
            lines(&out),
            [
                "gap client None 9",
                "req-head 0 GET /b",
                "req-end 0",
                "resp-head 0 200",
                "resp-body 0 b",
                "resp-end 0"
            ]
        );
    }

    #[test]
    fn a_gap_in_a_request_body_still_delivers_its_response_flagged() {
        let mut c = fresh();
        let mut out = run(
            &mut c,
            &[(
                CLIENT,
                Some(b"POST /x HTTP/1.1\r\nContent-Length: 10\r\n\r\nab"),
            )],
        );
        c.on_gap(CLIENT, 20, 1, &mut out);
        c.on_data(CLIENT, b"zzGET /y HTTP/1.1\r\n\r\n", 2, &mut out);
        c.on_data(
            SERVER,
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx",
            3,
            &mut out,
        );
        c.on_data(
            SERVER,
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\ny",
            4,
            &mut out,
        );
        assert_eq!(
            lines(&out),
            [
                "req-head 0 POST /x",
                "req-body 0 ab",
                "gap client Some(0) 20",
                "req-end 0 incomplete",
                "req-head 1 GET /y",
                "req-end 1",
                "resp-head 0 200",
                "resp-body 0 x",
                "resp-end 0 incomplete gap",
                "resp-head 1 200",
                "resp-body 1 y",
                "resp-end 1",
            ]
        );
    }

    #[test]
    fn a_reset_mid_body_ends_the_exchange_incomplete() {
        let mut c = fresh();
        let mut out = run(
            &mut c,
            &[
                (CLIENT, Some(POST)),
                (
                    SERVER,
                    Some(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n"),
                ),
            ],
        );
        c.on_end(SERVER, true, 9, &mut out);
        assert_eq!(lines(&out)[5..], ["resp-end 0 incomplete"]);
        assert!(c.is_done());
        c.on_data(SERVER, b"2\r\ncd\r\n", 10, &mut out);
        assert_eq!(out.len(), 6);
    }

    #[test]
    fn a_connection_joined_mid_stream_starts_at_the_next_request() {
        let mut c = Http1Conn::new(true);
        let out = run(
            &mut c,
            &[
                (CLIENT, Some(b"of an earlier body\"}")),
                (
                    SERVER,
                    Some(b"data: tail of an earlier stream\n\n\r\n0\r\n\r\n"),
                ),
                (
                    CLIENT,
                    Some(b"POST /api/generate HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}"),
                ),
                (
                    SERVER,
                    Some(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"),
                ),
            ],
        );
        assert_eq!(
            lines(&out),
            [
                "req-head 0 POST /api/generate",
                "req-body 0 {}",
                "req-end 0",
                "resp-head 0 200",
                "resp-body 0 ok",
                "resp-end 0"
            ]
        );
    }

    #[test]
    fn a_protocol_upgrade_ends_the_exchange_and_the_http() {
        let mut c = fresh();
        let out = run(
            &mut c,
            &[
                (CLIENT, Some(b"GET /ws HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")),
                (SERVER, Some(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n\x81\x05hello")),
                (CLIENT, Some(b"\x81\x85garbage")),
            ],
        );
        assert_eq!(lines(&out)[2..], ["resp-head 0 101", "resp-end 0"]);
        assert!(c.is_done() && !c.is_not_http());
    }

    #[test]
    fn a_client_half_close_mid_body_ends_the_request_incomplete() {
        let mut c = fresh();
        let out = run(
            &mut c,
            &[
                (
                    CLIENT,
                    Some(b"POST / HTTP/1.1\r\nContent-Length: 9\r\n\r\nab"),
                ),
                (CLIENT, None),
                (
                    SERVER,
                    Some(b"HTTP/1.1 400 Bad\r\nContent-Length: 0\r\n\r\n"),
                ),
            ],
        );
        assert_eq!(
            lines(&out)[2..],
            ["req-end 0 incomplete", "resp-head 0 400", "resp-end 0"]
        );
    }

    #[test]
    fn contradictory_content_lengths_are_not_http() {
        let mut c = fresh();
        let out = run(
            &mut c,
            &[(
                CLIENT,
                Some(b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n"),
            )],
        );
        assert!(out.is_empty() && c.is_not_http());
    }
}
