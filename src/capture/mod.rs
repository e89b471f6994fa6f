//! Passive capture of the loopback traffic to model servers.
//!
//! Two halves. The packet source: [`source`] starts the privileged helper
//! `speedtap-capture` and reads the record stream ([`feed`]) it writes.
//! The pure core, with no socket, no clock and no engine: frames go in with
//! their capture timestamps; HTTP events come out with the timestamp of
//! the packet that completed them.
//!
//! - [`packet`] parses one captured frame (Ethernet, Linux cooked v1 and
//!   v2, raw IP; IPv4 and IPv6) into a TCP [`packet::Segment`];
//! - [`reassembly`] puts one direction of a flow back in order, with gaps
//!   where bytes were lost;
//! - [`http1`] parses both directions of one connection into requests and
//!   responses, matched in order;
//! - [`flows`] is the connection table that routes segments to the above
//!   for the configured server ports.
//!
//! How the engine drives it, per capture source:
//!
//! ```text
//! let mut flows = Flows::new(ports);          // one ServerPort per route
//! flows.ignore(proxy_upstream_local_addr);    // before the proxy connects
//! for (frame, link, ts) in packets {
//!     if let Some(seg) = packet::parse(link, &frame) {
//!         for ev in flows.feed(seg, ts) { /* route by ev.conn.server */ }
//!     }
//! }
//! every 100 ms: flows.give_up_holes(now_ts, hole_wait); flows.sweep(now_ts, idle)
//! ```
//!
//! `now_ts` is on the packet clock (the latest packet timestamp, or the
//! capture clock read by the engine): the core never reads a clock.

pub mod feed;
pub mod flows;
pub mod http1;
pub mod packet;
pub mod reassembly;
pub mod sockets;
pub mod source;

/// A packet timestamp in nanoseconds, as the capture source gives it
/// (kernel `SO_TIMESTAMPNS` / pcap nanosecond precision). The core only
/// compares and subtracts them; the engine maps them onto its monotonic
/// clock.
pub type Nanos = u64;

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use bytes::Bytes;

    use super::flows::{CaptureEvent, Flows, ServerPort};
    use super::http1::Event;
    use super::packet::{self, LinkType, Segment, TcpFlags};

    const CLIENT: &str = "127.0.0.1:53124";
    const SERVER: &str = "127.0.0.1:11434";
    const CLIENT_ISN: u32 = u32::MAX - 40; // the request crosses 2^32
    const SERVER_ISN: u32 = 123_456;

    /// A streamed OpenAI chat call: the request, and the response as the
    /// server writes it, one SSE frame per chunk.
    fn openai_call() -> (Vec<u8>, Vec<Vec<u8>>) {
        let body = br#"{"model":"llama3.2","stream":true,"messages":[{"role":"user","content":"Say hi"}]}"#;
        let mut request = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:11434\r\nAuthorization: Bearer sk-x\r\n\
Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        request.extend_from_slice(body);
        let mut writes = vec![b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec()];
        let mut frames: Vec<String> = ["Hi", " there", "!"]
            .iter()
            .map(|t| {
                format!(
                    "data: {{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"model\":\"llama3.2\",\
\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{t}\"}},\"finish_reason\":null}}]}}\n\n"
                )
            })
            .collect();
        frames.push(
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":3}}\n\n"
                .into(),
        );
        frames.push("data: [DONE]\n\n".into());
        for f in frames {
            writes.push(format!("{:x}\r\n{f}\r\n", f.len()).into_bytes());
        }
        writes.push(b"0\r\n\r\n".to_vec());
        (request, writes)
    }

    /// A tiny deterministic generator (xorshift64).
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: usize) -> usize {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 % n as u64) as usize
        }
    }

    fn flags(syn: bool, fin: bool, ack: bool) -> TcpFlags {
        TcpFlags {
            syn,
            fin,
            ack,
            psh: !syn && !fin,
            rst: false,
        }
    }

    /// One direction's data cut at `cuts` (stream offsets) into segments.
    fn cut(from_client: bool, stream: &[u8], cuts: &[usize]) -> Vec<Segment> {
        let (src, dst, isn): (SocketAddr, SocketAddr, u32) = if from_client {
            (addr(CLIENT), addr(SERVER), CLIENT_ISN)
        } else {
            (addr(SERVER), addr(CLIENT), SERVER_ISN)
        };
        let mut bounds = vec![0];
        bounds.extend(cuts.iter().copied().filter(|&c| c > 0 && c < stream.len()));
        bounds.push(stream.len());
        bounds.dedup();
        bounds
            .windows(2)
            .map(|w| Segment {
                src,
                dst,
                seq: isn.wrapping_add(1).wrapping_add(w[0] as u32),
                ack: 0,
                flags: flags(false, false, true),
                payload: Bytes::copy_from_slice(&stream[w[0]..w[1]]),
            })
            .collect()
    }

    fn control(from_client: bool, syn: bool, fin_at: Option<usize>) -> Segment {
        let (src, dst, isn) = if from_client {
            (addr(CLIENT), addr(SERVER), CLIENT_ISN)
        } else {
            (addr(SERVER), addr(CLIENT), SERVER_ISN)
        };
        let seq = match fin_at {
            Some(len) => isn.wrapping_add(1).wrapping_add(len as u32),
            None => isn,
        };
        Segment {
            src,
            dst,
            seq,
            ack: 0,
            flags: flags(syn, fin_at.is_some(), !(syn && from_client)),
            payload: Bytes::new(),
        }
    }

    fn addr(s: &str) -> SocketAddr {
        s.parse().expect("address")
    }

    /// Runs segments through frames, the parser and the flow table.
    fn capture(segments: &[Segment]) -> Vec<CaptureEvent> {
        let mut flows = Flows::new([ServerPort::any(11434)]);
        let mut events = Vec::new();
        for (i, seg) in segments.iter().enumerate() {
            let frame = packet::build::ethernet(seg);
            let parsed = packet::parse(LinkType::Ethernet, &frame).expect("a TCP frame");
            events.extend(flows.feed(parsed, 1_000 * i as u64));
        }
        assert!(flows.is_empty(), "the connection ended");
        events
    }

    /// The events without timestamps, adjacent body pieces joined (how a
    /// body is cut into events follows the packets).
    fn normalized(events: &[CaptureEvent]) -> Vec<Event> {
        let mut out: Vec<Event> = Vec::new();
        for e in events {
            if let (
                Some(Event::ResponseBody {
                    exchange: a,
                    bytes: prev,
                }),
                Event::ResponseBody { exchange: b, bytes },
            )
            | (
                Some(Event::RequestBody {
                    exchange: a,
                    bytes: prev,
                }),
                Event::RequestBody { exchange: b, bytes },
            ) = (out.last_mut(), &e.event)
            {
                if a == b {
                    *prev = [prev.as_ref(), bytes.as_ref()].concat().into();
                    continue;
                }
            }
            out.push(e.event.clone());
        }
        out
    }

    /// The segments of one direction cut at random, with duplicates and
    /// overlapping retransmissions added and the order shuffled within a
    /// window of four.
    fn messy(from_client: bool, stream: &[u8], rng: &mut Rng) -> Vec<Segment> {
        let mut cuts = Vec::new();
        let mut at = 0;
        while at < stream.len() {
            at += 1 + rng.below(60);
            cuts.push(at);
        }
        let clean = cut(from_client, stream, &cuts);
        let mut segs = Vec::new();
        for (i, seg) in clean.iter().enumerate() {
            segs.push(seg.clone());
            match rng.below(6) {
                0 => segs.push(seg.clone()),
                // A retransmission coalescing this segment and the next.
                1 if i + 1 < clean.len() => {
                    let mut both = seg.clone();
                    both.payload = [seg.payload.as_ref(), clean[i + 1].payload.as_ref()]
                        .concat()
                        .into();
                    segs.push(both);
                }
                _ => {}
            }
        }
        for i in 0..segs.len() {
            let j = (i + rng.below(4)).min(segs.len() - 1);
            segs.swap(i, j);
        }
        segs
    }

    fn clean_run() -> (Vec<CaptureEvent>, Vec<u8>, Vec<u8>) {
        let (request, writes) = openai_call();
        let response = writes.concat();
        let mut segs = vec![control(true, true, None), control(false, true, None)];
        segs.extend(cut(true, &request, &[]));
        let mut offsets = Vec::new();
        let mut end = 0;
        for w in &writes {
            end += w.len();
            offsets.push(end);
        }
        segs.extend(cut(false, &response, &offsets));
        segs.push(control(true, false, Some(request.len())));
        segs.push(control(false, false, Some(response.len())));
        (capture(&segs), request, response)
    }

    #[test]
    fn a_clean_openai_stream_gives_one_complete_exchange_with_one_event_per_sse_frame() {
        let (events, _, _) = clean_run();
        let kinds: Vec<_> = events
            .iter()
            .map(|e| match &e.event {
                Event::RequestHead { .. } => "req-head",
                Event::RequestBody { .. } => "req-body",
                Event::RequestEnd { complete: true, .. } => "req-end",
                Event::ResponseHead { status: 200, .. } => "resp-head",
                Event::ResponseBody { .. } => "frame",
                Event::ResponseEnd {
                    complete: true,
                    gap: false,
                    ..
                } => "resp-end",
                _ => "unexpected",
            })
            .collect();
        assert_eq!(
            kinds,
            [
                "req-head",
                "req-body",
                "req-end",
                "resp-head",
                "frame",
                "frame",
                "frame",
                "frame",
                "frame",
                "resp-end"
            ]
        );
        assert!(
            !format!("{events:?}").contains("sk-x"),
            "no auth header comes out"
        );
    }

    #[test]
    fn a_stream_cut_oddly_shuffled_and_duplicated_gives_the_clean_events() {
        let (clean, request, response) = clean_run();
        let expected = normalized(&clean);
        for seed in 1..=200u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
            let mut segs = vec![control(true, true, None), control(false, true, None)];
            segs.extend(messy(true, &request, &mut rng));
            segs.extend(messy(false, &response, &mut rng));
            segs.push(control(true, false, Some(request.len())));
            segs.push(control(false, false, Some(response.len())));
            let events = capture(&segs);
            assert_eq!(normalized(&events), expected, "seed {seed}");
            assert!(
                events.windows(2).all(|w| w[0].at <= w[1].at),
                "seed {seed}: time order"
            );
        }
    }
}
