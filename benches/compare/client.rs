//! The workload client: streams chat completions through an arm and
//! times every chunk against the stamp the upstream put in its text.
//!
//! One hyper http1 connection per stream, TCP_NODELAY, as a chat client
//! without a pool would do. The time to first token (TTFT) runs from just
//! before the TCP connect to the arrival of the first chunk that carries a
//! stamp, so it includes what a proxy costs at accept and at its own
//! upstream connect. Per-chunk latency is arrival minus the stamp (the
//! stamp is in whole microseconds, so every arm's figure is up to 1 µs
//! high, the same for all).
//!
//! Every request carries `authorization: Bearer` with LiteLLM's master key:
//! LiteLLM refuses requests without it, and the others ignore it.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use memchr::memmem;
use tokio::net::TcpStream;
use tokio::task::JoinSet;

use crate::stats::{Outcome, Samples};
use crate::upstream::{now_ns, Shape};

/// LiteLLM's master key in the bench config; sent to every arm.
pub const MASTER_KEY: &str = "sk-bench-anything";

/// The stamp in one SSE event's `delta.content`, as nanoseconds since the
/// epoch. Tolerates any JSON spacing a re-serialising proxy may use.
pub fn stamp_of(event: &[u8]) -> Option<u64> {
    const KEY: &[u8] = b"\"content\"";
    let at = memmem::find(event, KEY)? + KEY.len();
    let rest = &event[at..];
    let rest = &rest[rest.iter().position(|&b| b == b':')? + 1..];
    let rest = &rest[rest.iter().position(|&b| b == b'"')? + 1..];
    let rest = &rest[rest.iter().position(|&b| b != b' ')?..];
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 {
        return None;
    }
    let us: u64 = std::str::from_utf8(&rest[..digits]).ok()?.parse().ok()?;
    Some(us * 1_000)
}

/// Streams one chat completion of `shape` from `addr`.
pub async fn stream_once(addr: SocketAddr, shape: &Shape) -> Outcome {
    let failed = |why: &str| Outcome {
        chunk_ns: Vec::new(),
        ttft_ns: None,
        complete: false,
        failure: Some(why.to_owned()),
    };
    let body = format!(
        r#"{{"model":"{}","stream":true,"messages":[{{"role":"user","content":"count"}}]}}"#,
        shape.model()
    );
    let req = Request::post("/v1/chat/completions")
        .header("host", addr.to_string())
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {MASTER_KEY}"))
        .body(Full::new(Bytes::from(body)))
        .expect("request");
    let started = now_ns();
    let stream = match TcpStream::connect(addr).await {
        Ok(s) => s,
        Err(e) => return failed(&format!("connect: {}", e.kind())),
    };
    let _ = stream.set_nodelay(true);
    let Ok((mut sender, conn)) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await
    else {
        return failed("handshake");
    };
    tokio::spawn(conn);
    let resp = match sender.send_request(req).await {
        Ok(r) => r,
        Err(e) => return failed(&format!("request: {e}")),
    };
    let status = resp.status();
    let ok_status = resp.status() == http::StatusCode::OK;
    let mut body = resp.into_body();
    let mut buf: Vec<u8> = Vec::new();
    let mut chunk_ns = Vec::with_capacity(shape.chunks);
    let mut ttft_ns = None;
    let mut done = false;
    let mut body_error = None;
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(f) => f,
            Err(e) => {
                body_error = Some(format!("body: {e}"));
                break;
            }
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let arrived = now_ns();
        buf.extend_from_slice(&data);
        // A read may hold several events, or end inside one.
        let mut start = 0;
        while let Some(end) = memmem::find(&buf[start..], b"\n\n") {
            let event = &buf[start..start + end];
            if let Some(stamp) = stamp_of(event) {
                ttft_ns.get_or_insert(arrived.saturating_sub(started));
                chunk_ns.push(arrived.saturating_sub(stamp));
            } else if memmem::find(event, b"[DONE]").is_some() {
                done = true;
            }
            start += end + 2;
        }
        buf.drain(..start);
    }
    let complete = ok_status && done && chunk_ns.len() == shape.chunks;
    let failure = (!complete).then(|| {
        if !ok_status {
            format!("status {}", status.as_u16())
        } else {
            body_error.unwrap_or_else(|| {
                format!(
                    "{} of {} chunks, [DONE] {}",
                    chunk_ns.len(),
                    shape.chunks,
                    done
                )
            })
        }
    });
    Outcome {
        chunk_ns,
        ttft_ns,
        complete,
        failure,
    }
}

/// `streams` concurrent streams of `shape`, their starts spread evenly
/// over `stagger` (so their ticks interleave instead of landing together),
/// collected into `into`.
pub async fn run_batch(
    addr: SocketAddr,
    streams: usize,
    shape: &Shape,
    stagger: Duration,
    into: &mut Samples,
) {
    let mut set = JoinSet::new();
    let start = tokio::time::Instant::now();
    for i in 0..streams {
        let shape = shape.clone();
        let at = start + stagger.mul_f64(i as f64 / streams.max(1) as f64);
        set.spawn(async move {
            tokio::time::sleep_until(at).await;
            stream_once(addr, &shape).await
        });
    }
    while let Some(joined) = set.join_next().await {
        match joined {
            Ok(o) => into.add(o),
            Err(_) => into.bad += 1,
        }
    }
}

/// A plain `GET path` on a fresh connection: the status and whole body,
/// `None` when the connection or the exchange failed. For readiness probes
/// and speedtap's control API, never on a timed path.
pub async fn get(addr: SocketAddr, path: &str) -> Option<(u16, Bytes)> {
    let stream = TcpStream::connect(addr).await.ok()?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .ok()?;
    tokio::spawn(conn);
    let req = Request::get(path)
        .header("host", addr.to_string())
        .header("authorization", format!("Bearer {MASTER_KEY}"))
        .body(Full::new(Bytes::new()))
        .ok()?;
    let resp = sender.send_request(req).await.ok()?;
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.ok()?.to_bytes();
    Some((status, body))
}

/// `count` streams of `shape`, one after another (for clean TTFTs).
pub async fn run_sequential(addr: SocketAddr, count: usize, shape: &Shape, into: &mut Samples) {
    for _ in 0..count {
        into.add(stream_once(addr, shape).await);
    }
}
