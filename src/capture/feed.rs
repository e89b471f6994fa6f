//! The record stream that the `speedtap-capture` helper writes to its standard
//! output, and a streaming decoder for it.
//!
//! All integers little-endian:
//! - once, first: the magic `STCAP1\n`, then the link type (`u32`, a pcap
//!   DLT: 1 Ethernet on `lo`, 113 or 276 Linux cooked on `any`);
//! - a packet: kind `0u8`, timestamp (`u64`, nanoseconds since the Unix
//!   epoch, CLOCK_REALTIME as the kernel stamped it), captured length (`u32`),
//!   original length (`u32`), then the captured bytes;
//! - statistics, at the start and about every second while packets come:
//!   kind `1u8`, then `u64` received, `u64` dropped by the kernel and `u64`
//!   dropped by the interface, each counted from the helper's start;
//! - a control line dealt with: kind `2u8`, then `u64` the number of lines
//!   dealt with so far (the filter it asked for is attached once read).

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// The stream's first bytes; the version is the digit.
pub const MAGIC: &[u8; 7] = b"STCAP1\n";
const KIND_PACKET: u8 = 0;
const KIND_STATS: u8 = 1;
const KIND_APPLIED: u8 = 2;
const APPLIED_LEN: usize = 1 + 8;
const HEADER_LEN: usize = MAGIC.len() + 4;
const PACKET_HEAD_LEN: usize = 1 + 8 + 4 + 4;
const STATS_LEN: usize = 1 + 3 * 8;
/// A captured length above this means a corrupt stream (the helper's snaplen
/// is at most a few hundred KiB).
pub const MAX_CAPTURED_LEN: u32 = 16 << 20;

/// The link-layer type of every packet in the stream (a pcap DLT number).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkType(pub u32);

/// One packet as the kernel saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapturedPacket {
    /// Kernel timestamp, nanoseconds since the Unix epoch (CLOCK_REALTIME).
    pub ts_ns: u64,
    /// The captured bytes, from the link-layer header on.
    pub data: Bytes,
    /// The packet's length on the wire; more than `data.len()` when cut at
    /// the snaplen.
    pub orig_len: u32,
}

/// The helper's counters, from its start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CaptureStats {
    /// Packets that passed the kernel filter. On `lo` each packet counts
    /// twice, as sent and as received; only the received copy is passed on.
    pub received: u64,
    /// Packets the kernel dropped: its ring buffer was full.
    pub dropped: u64,
    /// Packets the interface or its driver dropped.
    pub if_dropped: u64,
}

/// One decoded item of the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// The stream's header: always first, once.
    Header(LinkType),
    Packet(CapturedPacket),
    Stats(CaptureStats),
    /// The helper dealt with this many control lines so far.
    Applied(u64),
}

/// Why a stream can't be decoded; the decoder stays failed after one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FeedError {
    #[error("not a speedtap-capture stream (bad magic)")]
    BadMagic,
    #[error("unknown record kind {0}")]
    UnknownKind(u8),
    #[error("captured length {0} is implausible")]
    TooLong(u32),
}

/// Decodes the stream from chunks of any size.
#[derive(Debug, Default)]
pub struct FeedDecoder {
    buf: BytesMut,
    link: Option<LinkType>,
    failed: Option<FeedError>,
}

impl FeedDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// The link type, once the header was read.
    pub fn link_type(&self) -> Option<LinkType> {
        self.link
    }

    /// Appends `chunk` and returns every record now complete, in order.
    pub fn push(&mut self, chunk: &[u8]) -> Result<Vec<Record>, FeedError> {
        let mut out = Vec::new();
        self.push_into(chunk, &mut out)?;
        Ok(out)
    }

    /// As [`push`](Self::push), appending to `out` (which the caller may
    /// reuse). On an error, `out` keeps the records before it.
    pub fn push_into(&mut self, chunk: &[u8], out: &mut Vec<Record>) -> Result<(), FeedError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        self.buf.extend_from_slice(chunk);
        let r = self.drain(out);
        if let Err(e) = &r {
            self.failed = Some(e.clone());
            self.buf = BytesMut::new();
        }
        r
    }

    fn drain(&mut self, out: &mut Vec<Record>) -> Result<(), FeedError> {
        if self.link.is_none() {
            // Fail on the first wrong byte, not only once 11 bytes are in.
            let n = self.buf.len().min(MAGIC.len());
            if self.buf[..n] != MAGIC[..n] {
                return Err(FeedError::BadMagic);
            }
            if self.buf.len() < HEADER_LEN {
                return Ok(());
            }
            self.buf.advance(MAGIC.len());
            let link = LinkType(self.buf.get_u32_le());
            self.link = Some(link);
            out.push(Record::Header(link));
        }
        while let Some(&kind) = self.buf.first() {
            match kind {
                KIND_PACKET => {
                    if self.buf.len() < PACKET_HEAD_LEN {
                        return Ok(());
                    }
                    let caplen =
                        u32::from_le_bytes([self.buf[9], self.buf[10], self.buf[11], self.buf[12]]);
                    if caplen > MAX_CAPTURED_LEN {
                        return Err(FeedError::TooLong(caplen));
                    }
                    let need = PACKET_HEAD_LEN + caplen as usize;
                    if self.buf.len() < need {
                        // Room for the rest at once, not in doublings.
                        self.buf.reserve(need - self.buf.len());
                        return Ok(());
                    }
                    self.buf.advance(1);
                    let ts_ns = self.buf.get_u64_le();
                    self.buf.advance(4);
                    let orig_len = self.buf.get_u32_le();
                    let data = self.buf.split_to(caplen as usize).freeze();
                    out.push(Record::Packet(CapturedPacket {
                        ts_ns,
                        data,
                        orig_len,
                    }));
                }
                KIND_STATS => {
                    if self.buf.len() < STATS_LEN {
                        return Ok(());
                    }
                    self.buf.advance(1);
                    out.push(Record::Stats(CaptureStats {
                        received: self.buf.get_u64_le(),
                        dropped: self.buf.get_u64_le(),
                        if_dropped: self.buf.get_u64_le(),
                    }));
                }
                KIND_APPLIED => {
                    if self.buf.len() < APPLIED_LEN {
                        return Ok(());
                    }
                    self.buf.advance(1);
                    out.push(Record::Applied(self.buf.get_u64_le()));
                }
                other => return Err(FeedError::UnknownKind(other)),
            }
        }
        Ok(())
    }
}

/// Encodes the stream's header, as the helper writes it (for tests and fakes).
pub fn encode_header(link: LinkType, out: &mut BytesMut) {
    out.put_slice(MAGIC);
    out.put_u32_le(link.0);
}

/// Encodes one packet record, as the helper writes it.
pub fn encode_packet(p: &CapturedPacket, out: &mut BytesMut) {
    out.put_u8(KIND_PACKET);
    out.put_u64_le(p.ts_ns);
    out.put_u32_le(p.data.len() as u32);
    out.put_u32_le(p.orig_len);
    out.put_slice(&p.data);
}

/// Encodes one applied record, as the helper writes it.
pub fn encode_applied(lines: u64, out: &mut BytesMut) {
    out.put_u8(KIND_APPLIED);
    out.put_u64_le(lines);
}

/// Encodes one statistics record, as the helper writes it.
pub fn encode_stats(s: &CaptureStats, out: &mut BytesMut) {
    out.put_u8(KIND_STATS);
    out.put_u64_le(s.received);
    out.put_u64_le(s.dropped);
    out.put_u64_le(s.if_dropped);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn packet(ts_ns: u64, data: &'static [u8], orig_len: u32) -> CapturedPacket {
        CapturedPacket {
            ts_ns,
            data: Bytes::from_static(data),
            orig_len,
        }
    }

    fn sample() -> (Vec<u8>, Vec<Record>) {
        let records = vec![
            Record::Header(LinkType(1)),
            Record::Packet(packet(1_764_000_000_123_456_789, b"\x45syn", 3)),
            Record::Stats(CaptureStats {
                received: 1,
                dropped: 0,
                if_dropped: 0,
            }),
            Record::Packet(packet(u64::MAX, b"", 0)),
            Record::Applied(1),
            Record::Packet(packet(7, b"payload cut at the snaplen", 70_000)),
            Record::Stats(CaptureStats {
                received: u64::MAX,
                dropped: 1 << 40,
                if_dropped: 3,
            }),
        ];
        let mut out = BytesMut::new();
        for r in &records {
            match r {
                Record::Header(l) => encode_header(*l, &mut out),
                Record::Packet(p) => encode_packet(p, &mut out),
                Record::Stats(s) => encode_stats(s, &mut out),
                Record::Applied(n) => encode_applied(*n, &mut out),
            }
        }
        (out.to_vec(), records)
    }

    #[test]
    fn decodes_a_whole_stream_at_once() {
        let (bytes, records) = sample();
        let mut d = FeedDecoder::new();
        assert_eq!(d.link_type(), None);
        assert_eq!(d.push(&bytes).unwrap(), records);
        assert_eq!(d.link_type(), Some(LinkType(1)));
        assert_eq!(d.push(&[]).unwrap(), vec![]);
    }

    #[test]
    fn split_at_every_byte_boundary() {
        let (bytes, records) = sample();
        for cut in 0..=bytes.len() {
            let mut d = FeedDecoder::new();
            let mut got = d.push(&bytes[..cut]).unwrap();
            got.extend(d.push(&bytes[cut..]).unwrap());
            assert_eq!(got, records, "cut at {cut}");
        }
    }

    #[test]
    fn one_byte_at_a_time() {
        let (bytes, records) = sample();
        let mut d = FeedDecoder::new();
        let mut got = Vec::new();
        for b in &bytes {
            d.push_into(std::slice::from_ref(b), &mut got).unwrap();
        }
        assert_eq!(got, records);
    }

    #[test]
    fn bad_magic_fails_at_the_first_wrong_byte_and_stays_failed() {
        let mut d = FeedDecoder::new();
        assert_eq!(d.push(b"STC").unwrap(), vec![]);
        assert_eq!(d.push(b"X"), Err(FeedError::BadMagic));
        let (bytes, _) = sample();
        assert_eq!(d.push(&bytes), Err(FeedError::BadMagic));
        // An older or newer version is a bad magic too.
        assert_eq!(
            FeedDecoder::new().push(b"STCAP2\n\x01\0\0\0"),
            Err(FeedError::BadMagic)
        );
    }

    #[test]
    fn unknown_kind_and_implausible_length_fail() {
        let mut head = BytesMut::new();
        encode_header(LinkType(113), &mut head);
        let mut d = FeedDecoder::new();
        let mut bytes = head.to_vec();
        bytes.push(9);
        assert_eq!(d.push(&bytes), Err(FeedError::UnknownKind(9)));

        let mut bytes = head.to_vec();
        bytes.push(0);
        bytes.extend_from_slice(&1u64.to_le_bytes());
        bytes.extend_from_slice(&(MAX_CAPTURED_LEN + 1).to_le_bytes());
        bytes.extend_from_slice(&0u32.to_le_bytes());
        assert_eq!(
            FeedDecoder::new().push(&bytes),
            Err(FeedError::TooLong(MAX_CAPTURED_LEN + 1))
        );
    }

    #[test]
    fn records_before_an_error_are_kept() {
        let mut bytes = BytesMut::new();
        encode_header(LinkType(1), &mut bytes);
        encode_packet(&packet(5, b"ab", 2), &mut bytes);
        bytes.put_u8(0xff);
        let mut out = Vec::new();
        let r = FeedDecoder::new().push_into(&bytes, &mut out);
        assert_eq!(r, Err(FeedError::UnknownKind(0xff)));
        assert_eq!(
            out,
            vec![
                Record::Header(LinkType(1)),
                Record::Packet(packet(5, b"ab", 2))
            ]
        );
    }
}
