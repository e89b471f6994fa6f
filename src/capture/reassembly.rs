//! One direction of a TCP flow, put back in order.
//!
//! The capture sees what the kernel sent, in the order it was handed to
//! the packet socket: on loopback that is almost always in order, but a
//! packet socket can drop under load, a retransmission repeats bytes and
//! `any` shows each loopback packet twice. The [`Reassembler`] turns the
//! segments of one direction back into the byte stream the receiving
//! socket read, or says exactly how many bytes it could not recover
//! ([`Delivery::Gap`]), so the HTTP layer never parses a stream with bytes
//! silently missing.
//!
//! Lost bytes at the *end* of a direction leave nothing behind them to
//! hold, so they are found another way: the peer's acknowledgement
//! ([`Reassembler::peer_acked`]) and the FIN's sequence number both say
//! how far the stream went. Bytes up to there that never came are a hole
//! like any other (a "tail hole"), given up after the same wait, so a
//! response whose last segments were dropped ends with a gap instead of
//! waiting forever for bytes the capture will never see.
//!
//! Positions are kept as 64-bit stream offsets (bytes since the first
//! sequence number), and an incoming sequence number is placed by its
//! wrapping distance from the next expected one, so a stream that crosses
//! 2^32 needs no special case. Time is an input ([`Nanos`], the packet's
//! capture timestamp): the reassembler never reads a clock.

use std::collections::BTreeMap;

use bytes::Bytes;

use super::packet::TcpFlags;
use super::Nanos;

/// The default bound on out-of-order bytes held per direction.
pub const DEFAULT_HELD_CAP: usize = 4 << 20;

/// What one direction hands on, in stream order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// The next bytes of the stream. `at` is the timestamp of the packet
    /// that made them readable: their own packet, or the one that filled
    /// the hole in front of them.
    Data { bytes: Bytes, at: Nanos },
    /// Bytes that will never be seen: skipped so later data can flow.
    Gap { missing_bytes: u64, at: Nanos },
    /// The direction ended: a FIN (after every byte before it), or a RST.
    End { reset: bool, at: Nanos },
}

/// One direction of one TCP connection.
#[derive(Debug)]
pub struct Reassembler {
    /// The sequence number of stream offset 0, once known.
    base: Option<u32>,
    /// The stream offset of the next byte to deliver.
    next: u64,
    /// Out-of-order pieces by stream offset; they never overlap each other
    /// nor what was delivered.
    held: BTreeMap<u64, Bytes>,
    held_bytes: usize,
    cap: usize,
    /// Since when the first held piece has waited behind a hole.
    hole_since: Option<Nanos>,
    /// The stream offset of the FIN, once seen (possibly ahead of `next`).
    fin_at: Option<u64>,
    /// How far the stream is known to go: the furthest byte the peer
    /// acknowledged, a held piece's end, or the FIN. Beyond `next` with
    /// nothing held, the bytes in between are a tail hole.
    known_end: u64,
    ended: bool,
}

/// The farthest ahead of the next expected byte a segment may start and
/// still be held. Beyond it the sequence number is nonsense for this flow
/// (a stale segment from an earlier connection on the same ports).
const MAX_AHEAD: i64 = 1 << 30;

impl Reassembler {
    /// A direction with nothing seen yet, holding at most `cap`
    /// out-of-order bytes before it gives up the oldest hole.
    pub fn new(cap: usize) -> Self {
        Reassembler {
            base: None,
            next: 0,
            held: BTreeMap::new(),
            held_bytes: 0,
            cap,
            hole_since: None,
            fin_at: None,
            known_end: 0,
            ended: false,
        }
    }

    /// Whether a FIN or RST ended this direction.
    pub fn is_ended(&self) -> bool {
        self.ended
    }

    /// Whether the initial sequence number is known (a SYN or a first
    /// segment was seen).
    pub fn is_started(&self) -> bool {
        self.base.is_some()
    }

    /// Out-of-order bytes held behind a hole.
    pub fn held_bytes(&self) -> usize {
        self.held_bytes
    }

    /// Since when data has waited behind a hole, if it does: the caller
    /// compares it with its patience and calls [`give_up_hole`].
    ///
    /// [`give_up_hole`]: Reassembler::give_up_hole
    pub fn hole_since(&self) -> Option<Nanos> {
        self.hole_since
    }

    /// Takes one segment of this direction, captured at `at`, and appends
    /// what it makes deliverable to `out` (one buffer, reused by the
    /// caller across packets).
    ///
    /// A SYN sets the stream start at ISN + 1; without one the first
    /// segment seen starts the stream (a flow seen mid-stream: bytes that
    /// arrive later with an earlier sequence number are taken for
    /// retransmissions). Duplicates and already-delivered bytes are
    /// dropped; an overlap keeps the bytes that arrived first.
    pub fn push(
        &mut self,
        seq: u32,
        flags: TcpFlags,
        payload: Bytes,
        at: Nanos,
        out: &mut Vec<Delivery>,
    ) {
        if self.ended {
            return;
        }
        let data_seq = if flags.syn {
            if self.base.is_none() {
                self.base = Some(seq.wrapping_add(1));
            }
            seq.wrapping_add(1)
        } else {
            seq
        };
        let base = *self.base.get_or_insert(data_seq);
        let expected = base.wrapping_add(self.next as u32);
        let ahead = i64::from(data_seq.wrapping_sub(expected) as i32);
        if ahead > MAX_AHEAD {
            return;
        }
        let start = self.next as i64 + ahead;
        let end = start + payload.len() as i64;
        if flags.rst {
            self.reset(end.max(start), at, out);
            return;
        }
        if end > self.next as i64 && !payload.is_empty() {
            // Clip what was already delivered; the next bytes with nothing
            // held (the usual case) go straight out, the rest is held.
            let skip = (self.next as i64 - start).max(0);
            let bytes = payload.slice(skip as usize..);
            if start + skip == self.next as i64 && self.held.is_empty() {
                self.next += bytes.len() as u64;
                out.push(Delivery::Data { bytes, at });
            } else {
                self.hold((start + skip) as u64, bytes, at);
            }
        }
        if flags.fin && end >= 0 && self.fin_at.is_none() {
            self.fin_at = Some(end as u64);
            self.known_end = self.known_end.max(end as u64);
        }
        self.drain(at, out);
        while self.held_bytes > self.cap {
            self.skip_first_hole(at, out);
        }
    }

    /// The peer acknowledged this direction's bytes up to sequence number
    /// `ack` (a segment of the other direction with the ACK flag), seen at
    /// `at`. Bytes acknowledged but never captured were sent and received:
    /// no retransmission will bring them, so they are a tail hole, given
    /// up like any other ([`Reassembler::give_up_hole`]). Once the FIN is
    /// seen, an ACK of it (one past the data) is not taken for a lost byte;
    /// when the FIN itself was lost, its ACK reads as one lost byte, which
    /// is what it is: a lost packet.
    pub fn peer_acked(&mut self, ack: u32, at: Nanos) {
        let Some(base) = self.base else {
            return;
        };
        if self.ended {
            return;
        }
        let expected = base.wrapping_add(self.next as u32);
        let ahead = i64::from(ack.wrapping_sub(expected) as i32);
        if ahead <= 0 || ahead > MAX_AHEAD {
            return;
        }
        let mut acked = self.next + ahead as u64;
        if let Some(fin) = self.fin_at {
            acked = acked.min(fin);
        }
        if acked > self.known_end {
            self.known_end = acked;
        }
        self.mark_tail(at);
    }

    /// Starts the wait for a tail hole, if there is one and no wait runs.
    fn mark_tail(&mut self, at: Nanos) {
        if self.hole_since.is_none() && self.known_end > self.next {
            self.hole_since = Some(at);
        }
    }

    /// Gives up the first hole: reports its bytes as a gap and delivers
    /// what was held behind it (with timestamp `now`). A tail hole (bytes
    /// known sent, nothing held behind them) is given up the same way.
    /// Nothing happens if no hole waits.
    pub fn give_up_hole(&mut self, now: Nanos, out: &mut Vec<Delivery>) {
        if self.hole_since.is_some() && !self.ended {
            self.skip_first_hole(now, out);
        }
    }

    /// Inserts `bytes` at stream offset `start`, keeping only the parts
    /// no held piece already covers (first copy wins).
    fn hold(&mut self, start: u64, bytes: Bytes, at: Nanos) {
        let end = start + bytes.len() as u64;
        let mut cursor = start;
        let mut pieces = Vec::new();
        let before = self.held.range(..start).next_back();
        let overlapping = before
            .into_iter()
            .chain(self.held.range(start..end))
            .map(|(&s, held)| (s, s + held.len() as u64));
        for (held_start, held_end) in overlapping {
            if held_end <= cursor {
                continue;
            }
            if held_start > cursor {
                pieces.push((cursor, held_start));
            }
            cursor = cursor.max(held_end);
        }
        if cursor < end {
            pieces.push((cursor, end));
        }
        for (s, e) in pieces {
            let piece = bytes.slice((s - start) as usize..(e - start) as usize);
            self.held_bytes += piece.len();
            self.held.insert(s, piece);
        }
        self.known_end = self.known_end.max(end);
        if self.hole_since.is_none() && !self.held.is_empty() {
            self.hole_since = Some(at);
        }
    }

    /// Delivers the held pieces that now continue the stream, and the end
    /// once the FIN's position is reached.
    ///
    /// When a hole closes and another remains, the data behind the next
    /// hole counts as waiting since `at`; bytes that only shrink a hole
    /// leave its waiting time alone.
    fn drain(&mut self, at: Nanos, out: &mut Vec<Delivery>) {
        let first_held = self.held.keys().next().copied();
        while let Some(entry) = self.held.first_entry() {
            if *entry.key() != self.next {
                break;
            }
            let piece = entry.remove();
            self.next += piece.len() as u64;
            self.held_bytes -= piece.len();
            out.push(Delivery::Data { bytes: piece, at });
        }
        if self.held.is_empty() {
            self.known_end = self.known_end.max(self.next);
            // A tail hole left keeps the wait already running, or starts
            // one now.
            self.hole_since = if self.known_end > self.next {
                self.hole_since.or(Some(at))
            } else {
                None
            };
        } else if self.held.keys().next().copied() != first_held {
            self.hole_since = Some(at);
        }
        if let Some(fin) = self.fin_at {
            if self.next >= fin {
                self.ended = true;
                self.held.clear();
                self.held_bytes = 0;
                self.hole_since = None;
                out.push(Delivery::End { reset: false, at });
            }
        }
    }

    fn skip_first_hole(&mut self, at: Nanos, out: &mut Vec<Delivery>) {
        let first = match self.held.first_key_value() {
            Some((&first, _)) => first,
            None if self.known_end > self.next => self.known_end,
            None => return,
        };
        if first > self.next {
            out.push(Delivery::Gap {
                missing_bytes: first - self.next,
                at,
            });
            self.next = first;
        }
        self.drain(at, out);
    }

    /// A RST ends the direction. Data held behind holes is delivered with
    /// the holes as gaps, and bytes between the last seen and the RST's
    /// sequence number are a gap too.
    fn reset(&mut self, rst_end: i64, at: Nanos, out: &mut Vec<Delivery>) {
        while !self.held.is_empty() {
            self.skip_first_hole(at, out);
            if self.ended {
                return;
            }
        }
        let upto = match self.fin_at {
            Some(fin) => fin.min(rst_end.max(0) as u64),
            None => rst_end.max(0) as u64,
        };
        if upto > self.next {
            out.push(Delivery::Gap {
                missing_bytes: upto - self.next,
                at,
            });
            self.next = upto;
        }
        self.ended = true;
        out.push(Delivery::End { reset: true, at });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ISN: u32 = 1000;

    fn flags(syn: bool, fin: bool, rst: bool) -> TcpFlags {
        TcpFlags {
            syn,
            fin,
            rst,
            ack: !syn,
            psh: false,
        }
    }

    fn data_flags() -> TcpFlags {
        flags(false, false, false)
    }

    /// A direction that saw its SYN (ISN 1000, so data starts at 1001).
    fn opened(isn: u32) -> Reassembler {
        let mut r = Reassembler::new(DEFAULT_HELD_CAP);
        let mut out = Vec::new();
        r.push(isn, flags(true, false, false), Bytes::new(), 0, &mut out);
        assert!(out.is_empty());
        r
    }

    fn push(r: &mut Reassembler, seq: u32, payload: &str, at: Nanos) -> Vec<Delivery> {
        let mut out = Vec::new();
        r.push(
            seq,
            data_flags(),
            Bytes::copy_from_slice(payload.as_bytes()),
            at,
            &mut out,
        );
        out
    }

    /// The deliveries as text: data as itself, gaps as `<gap N>`, ends as
    /// `<fin>` or `<rst>`.
    fn text(out: &[Delivery]) -> String {
        out.iter()
            .map(|d| match d {
                Delivery::Data { bytes, .. } => String::from_utf8_lossy(bytes).into_owned(),
                Delivery::Gap { missing_bytes, .. } => format!("<gap {missing_bytes}>"),
                Delivery::End { reset: false, .. } => "<fin>".to_owned(),
                Delivery::End { reset: true, .. } => "<rst>".to_owned(),
            })
            .collect()
    }

    #[test]
    fn in_order_segments_are_delivered_as_they_come() {
        let mut r = opened(ISN);
        assert_eq!(
            push(&mut r, 1001, "hello ", 5),
            vec![Delivery::Data {
                bytes: Bytes::from_static(b"hello "),
                at: 5
            }]
        );
        assert_eq!(text(&push(&mut r, 1007, "world", 6)), "world");
        let mut out = Vec::new();
        r.push(1012, flags(false, true, false), Bytes::new(), 7, &mut out);
        assert_eq!(
            out,
            vec![Delivery::End {
                reset: false,
                at: 7
            }]
        );
        assert!(r.is_ended());
    }

    #[test]
    fn out_of_order_segments_wait_and_take_the_filling_packets_time() {
        let mut r = opened(ISN);
        assert!(push(&mut r, 1007, "world", 5).is_empty());
        assert_eq!(r.hole_since(), Some(5));
        let out = push(&mut r, 1001, "hello ", 9);
        assert_eq!(text(&out), "hello world");
        assert!(out
            .iter()
            .all(|d| matches!(d, Delivery::Data { at: 9, .. })));
        assert_eq!(r.hole_since(), None);
        assert_eq!(r.held_bytes(), 0);
    }

    #[test]
    fn duplicates_and_retransmits_are_dropped() {
        let mut r = opened(ISN);
        assert_eq!(text(&push(&mut r, 1001, "abc", 1)), "abc");
        assert!(push(&mut r, 1001, "abc", 2).is_empty());
        assert!(push(&mut r, 1002, "b", 3).is_empty());
        assert!(push(&mut r, 1010, "later", 4).is_empty());
        assert!(push(&mut r, 1010, "later", 5).is_empty());
        assert_eq!(r.held_bytes(), 5);
        assert_eq!(text(&push(&mut r, 1004, "defghi", 6)), "defghilater");
    }

    #[test]
    fn a_partial_overlap_with_delivered_bytes_keeps_only_the_new_tail() {
        let mut r = opened(ISN);
        assert_eq!(text(&push(&mut r, 1001, "abcd", 1)), "abcd");
        assert_eq!(text(&push(&mut r, 1003, "CDef", 2)), "ef");
    }

    #[test]
    fn overlaps_with_held_bytes_keep_the_first_copy_on_either_side() {
        let mut r = opened(ISN);
        // Held: "efgh" at 1005. New segments overlap its start and its end.
        assert!(push(&mut r, 1005, "efgh", 1).is_empty());
        assert!(push(&mut r, 1003, "CDEF", 2).is_empty());
        assert!(push(&mut r, 1007, "GHij", 3).is_empty());
        assert_eq!(text(&push(&mut r, 1001, "ab", 4)), "abCDefghij");
    }

    #[test]
    fn a_segment_spanning_several_held_pieces_fills_only_between_them() {
        let mut r = opened(ISN);
        assert!(push(&mut r, 1003, "c", 1).is_empty());
        assert!(push(&mut r, 1006, "f", 1).is_empty());
        assert_eq!(text(&push(&mut r, 1001, "ABCDEFGH", 2)), "ABcDEfGH");
    }

    #[test]
    fn a_hole_filled_later_delivers_everything_in_order() {
        let mut r = opened(ISN);
        assert!(push(&mut r, 1004, "def", 1).is_empty());
        assert!(push(&mut r, 1010, "jkl", 2).is_empty());
        assert_eq!(text(&push(&mut r, 1001, "abc", 3)), "abcdef");
        assert_eq!(r.hole_since(), Some(3));
        assert_eq!(text(&push(&mut r, 1007, "ghi", 4)), "ghijkl");
    }

    #[test]
    fn bytes_the_peer_acknowledged_but_never_seen_are_a_tail_hole_given_up_as_a_gap() {
        let mut r = opened(ISN);
        assert_eq!(text(&push(&mut r, 1001, "abc", 1)), "abc");
        // The peer ACKs 5 bytes more than were captured.
        r.peer_acked(1009, 2);
        assert_eq!(r.hole_since(), Some(2));
        let mut out = Vec::new();
        r.give_up_hole(40, &mut out);
        assert_eq!(text(&out), "<gap 5>");
        assert_eq!(r.hole_since(), None);
        // A late copy of the lost bytes is not delivered twice.
        assert!(push(&mut r, 1004, "defgh", 41).is_empty());
        assert_eq!(text(&push(&mut r, 1009, "ij", 42)), "ij");
    }

    #[test]
    fn an_ack_of_what_was_seen_or_of_the_fin_alone_is_no_hole() {
        let mut r = opened(ISN);
        assert_eq!(text(&push(&mut r, 1001, "abc", 1)), "abc");
        r.peer_acked(1004, 2);
        r.peer_acked(1002, 3);
        assert_eq!(r.hole_since(), None);
        let mut out = Vec::new();
        r.push(1004, flags(false, true, false), Bytes::new(), 4, &mut out);
        assert_eq!(text(&out), "<fin>");
        r.peer_acked(1005, 5);
        assert_eq!(r.hole_since(), None);
    }

    #[test]
    fn a_tail_hole_filled_in_time_delivers_the_bytes_and_no_gap() {
        let mut r = opened(ISN);
        r.peer_acked(1004, 1);
        assert_eq!(r.hole_since(), Some(1));
        assert_eq!(text(&push(&mut r, 1001, "abc", 2)), "abc");
        assert_eq!(r.hole_since(), None);
    }

    #[test]
    fn a_fin_past_bytes_never_seen_ends_the_direction_after_their_gap() {
        let mut r = opened(ISN);
        assert_eq!(text(&push(&mut r, 1001, "ab", 1)), "ab");
        let mut out = Vec::new();
        r.push(1010, flags(false, true, false), Bytes::new(), 2, &mut out);
        assert!(out.is_empty());
        assert_eq!(r.hole_since(), Some(2), "the FIN says 7 bytes are missing");
        r.give_up_hole(30, &mut out);
        assert_eq!(text(&out), "<gap 7><fin>");
        assert!(r.is_ended());
    }

    #[test]
    fn a_hole_given_up_becomes_a_gap_and_the_held_data_flows() {
        let mut r = opened(ISN);
        assert_eq!(text(&push(&mut r, 1001, "ab", 1)), "ab");
        assert!(push(&mut r, 1010, "jk", 2).is_empty());
        assert!(push(&mut r, 1020, "tu", 3).is_empty());
        let mut out = Vec::new();
        r.give_up_hole(50, &mut out);
        assert_eq!(text(&out), "<gap 7>jk");
        assert!(matches!(out[0], Delivery::Gap { at: 50, .. }));
        assert_eq!(r.hole_since(), Some(50));
        out.clear();
        r.give_up_hole(60, &mut out);
        assert_eq!(text(&out), "<gap 8>tu");
        assert_eq!(r.hole_since(), None);
        out.clear();
        r.give_up_hole(70, &mut out);
        assert!(out.is_empty());
        assert_eq!(text(&push(&mut r, 1021, "uvw", 80)), "vw");
    }

    #[test]
    fn a_fin_behind_a_hole_ends_the_direction_once_the_hole_is_filled() {
        let mut r = opened(ISN);
        let mut out = Vec::new();
        r.push(
            1004,
            flags(false, true, false),
            Bytes::from_static(b"def"),
            1,
            &mut out,
        );
        assert!(out.is_empty());
        assert_eq!(text(&push(&mut r, 1001, "abc", 2)), "abcdef<fin>");
        assert!(push(&mut r, 1007, "late", 3).is_empty());
    }

    #[test]
    fn a_fin_behind_a_hole_given_up_ends_after_the_gap() {
        let mut r = opened(ISN);
        let mut out = Vec::new();
        r.push(
            1004,
            flags(false, true, false),
            Bytes::from_static(b"def"),
            1,
            &mut out,
        );
        r.give_up_hole(9, &mut out);
        assert_eq!(text(&out), "<gap 3>def<fin>");
    }

    #[test]
    fn a_rst_mid_body_ends_the_direction_with_a_gap_for_the_missing_bytes() {
        let mut r = opened(ISN);
        assert_eq!(text(&push(&mut r, 1001, "abc", 1)), "abc");
        assert!(push(&mut r, 1008, "hi", 2).is_empty());
        let mut out = Vec::new();
        r.push(1015, flags(false, false, true), Bytes::new(), 3, &mut out);
        assert_eq!(text(&out), "<gap 4>hi<gap 5><rst>");
        assert!(r.is_ended());
        assert!(push(&mut r, 1004, "defg", 4).is_empty());
    }

    #[test]
    fn a_rst_at_the_next_byte_just_ends() {
        let mut r = opened(ISN);
        push(&mut r, 1001, "abc", 1);
        let mut out = Vec::new();
        r.push(1004, flags(false, false, true), Bytes::new(), 3, &mut out);
        assert_eq!(text(&out), "<rst>");
    }

    #[test]
    fn sequence_numbers_wrap_around_2_to_the_32() {
        let isn = u32::MAX - 3;
        let mut r = opened(isn);
        // Data starts at MAX-2: "abc" ends at MAX, "def" starts at 0.
        assert!(push(&mut r, 1, "efg", 2).is_empty());
        assert_eq!(text(&push(&mut r, u32::MAX - 2, "abcd", 3)), "abcdefg");
        assert!(push(&mut r, u32::MAX, "cde", 4).is_empty());
        assert_eq!(text(&push(&mut r, 4, "h", 5)), "h");
    }

    #[test]
    fn a_flow_seen_mid_stream_starts_at_its_first_segment() {
        let mut r = Reassembler::new(DEFAULT_HELD_CAP);
        assert!(!r.is_started());
        assert_eq!(text(&push(&mut r, 777, "mid", 1)), "mid");
        assert!(r.is_started());
        assert!(push(&mut r, 770, "earlier", 2).is_empty());
        assert_eq!(text(&push(&mut r, 780, "dle", 3)), "dle");
    }

    #[test]
    fn a_retransmitted_syn_changes_nothing() {
        let mut r = opened(ISN);
        let mut out = Vec::new();
        r.push(ISN, flags(true, false, false), Bytes::new(), 1, &mut out);
        assert!(out.is_empty());
        assert_eq!(text(&push(&mut r, 1001, "a", 2)), "a");
    }

    #[test]
    fn going_over_the_buffer_cap_gives_up_the_first_hole() {
        let mut r = Reassembler::new(8);
        let mut out = Vec::new();
        r.push(ISN, flags(true, false, false), Bytes::new(), 0, &mut out);
        assert!(push(&mut r, 1003, "cdef", 1).is_empty());
        assert!(push(&mut r, 1010, "jklm", 2).is_empty());
        assert_eq!(r.held_bytes(), 8);
        assert_eq!(text(&push(&mut r, 1020, "t", 3)), "<gap 2>cdef");
        assert_eq!(r.held_bytes(), 5);
        assert!(r.held_bytes() <= 8);
    }

    /// A recognizable stream: each byte says where it is.
    fn stream(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 % 251) as u8).collect()
    }

    /// Segments covering `data` cut at `cuts`, from sequence `first`.
    fn cover(data: &[u8], first: u32, cuts: &[usize]) -> Vec<(u32, Bytes)> {
        let mut bounds: Vec<usize> = cuts.iter().map(|&c| c.min(data.len())).collect();
        bounds.extend([0, data.len()]);
        bounds.sort_unstable();
        bounds.dedup();
        bounds
            .windows(2)
            .map(|w| {
                (
                    first.wrapping_add(w[0] as u32),
                    Bytes::copy_from_slice(&data[w[0]..w[1]]),
                )
            })
            .collect()
    }

    proptest::proptest! {
        #[test]
        fn any_arrival_order_of_overlapping_segments_gives_the_stream_back(
            isn: u32,
            len in 1usize..300,
            cuts in proptest::collection::vec(0usize..300, 0..20),
            extra in proptest::collection::vec((0usize..300, 1usize..60), 0..10),
            keys in proptest::collection::vec(proptest::prelude::any::<u16>(), 40),
        ) {
            let data = stream(len);
            let first = isn.wrapping_add(1);
            let mut segs = cover(&data, first, &cuts);
            for (start, n) in extra {
                let start = start % len;
                let end = (start + n).min(len);
                segs.push((first.wrapping_add(start as u32), Bytes::copy_from_slice(&data[start..end])));
            }
            let mut order: Vec<usize> = (0..segs.len()).collect();
            order.sort_by_key(|&i| keys[i % keys.len()] ^ (i as u16).wrapping_mul(40503));
            let mut r = opened(isn);
            let mut out = Vec::new();
            for (t, &i) in order.iter().enumerate() {
                let (seq, bytes) = segs[i].clone();
                r.push(seq, data_flags(), bytes, t as Nanos, &mut out);
            }
            r.push(first.wrapping_add(len as u32), flags(false, true, false), Bytes::new(), 999, &mut out);
            let mut got = Vec::new();
            for d in &out[..out.len() - 1] {
                match d {
                    Delivery::Data { bytes, .. } => got.extend_from_slice(bytes),
                    other => proptest::prop_assert!(false, "unexpected {:?}", other),
                }
            }
            proptest::prop_assert_eq!(got, data);
            proptest::prop_assert_eq!(out.last(), Some(&Delivery::End { reset: false, at: 999 }));
        }

        #[test]
        fn lost_segments_become_gaps_of_exactly_their_size(
            isn: u32,
            len in 1usize..300,
            cuts in proptest::collection::vec(0usize..300, 0..20),
            lost in proptest::collection::vec(proptest::prelude::any::<bool>(), 21),
        ) {
            let data = stream(len);
            let segs = cover(&data, isn.wrapping_add(1), &cuts);
            let mut r = opened(isn);
            let mut out = Vec::new();
            for (i, (seq, bytes)) in segs.iter().enumerate() {
                if !lost[i] {
                    r.push(*seq, data_flags(), bytes.clone(), i as Nanos, &mut out);
                }
            }
            while r.held_bytes() > 0 {
                r.give_up_hole(1_000, &mut out);
            }
            let mut offset = 0usize;
            for d in &out {
                match d {
                    Delivery::Data { bytes, .. } => {
                        proptest::prop_assert_eq!(&bytes[..], &data[offset..offset + bytes.len()]);
                        offset += bytes.len();
                    }
                    Delivery::Gap { missing_bytes, .. } => offset += *missing_bytes as usize,
                    Delivery::End { .. } => proptest::prop_assert!(false, "no FIN was sent"),
                }
            }
            let last_kept = segs.iter().enumerate().rev().find(|(i, _)| !lost[*i]);
            let expected_end = last_kept.map_or(0, |(_, (seq, b))| seq.wrapping_sub(isn.wrapping_add(1)) as usize + b.len());
            proptest::prop_assert_eq!(offset, expected_end);
        }
    }

    #[test]
    fn a_segment_absurdly_far_ahead_is_ignored() {
        let mut r = opened(ISN);
        assert!(push(&mut r, ISN.wrapping_add(1 << 31), "x", 1).is_empty());
        assert_eq!(r.held_bytes(), 0);
    }
}
