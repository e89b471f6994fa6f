//! One captured frame to one TCP segment.
//!
//! The capture helper hands the engine raw frames with their link type;
//! this module peels the link, IP and TCP headers and keeps the payload as
//! a slice of the frame's [`Bytes`], so a body byte is never copied between
//! the packet socket and the HTTP parser's buffer.
//!
//! The headers are parsed by hand (about 150 lines) rather than with a
//! crate such as `etherparse`: we need four fixed layouts and one
//! extension-header walk, and every rule (what a truncated frame or an IPv6
//! fragment gives) is visible and tested here. Anything that is not a
//! whole, unfragmented TCP segment over IPv4 or IPv6 is `None`: the capture
//! only measures, so a frame it cannot read is a hole for the reassembler,
//! never an error.
//!
//! Link types, by their `LINKTYPE_*` numbers (what libpcap and
//! `AF_PACKET` report):
//! - Ethernet (1): what Linux `lo` gives (14-byte header with zero MACs);
//!   one 802.1Q VLAN tag is skipped, for bridges.
//! - Linux cooked capture SLL (113) and SLL2 (276): what the `any`
//!   pseudo-interface gives. On `any`, a loopback packet is seen twice
//!   (outgoing and incoming); both parse, and the reassembler drops the
//!   second copy as a duplicate.
//! - Raw IP (101, also 12 on Linux): no link header.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use bytes::Bytes;

/// How a captured frame starts, as the capture source reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkType {
    /// `LINKTYPE_ETHERNET` (1): Linux `lo` and real NICs.
    Ethernet,
    /// `LINKTYPE_LINUX_SLL` (113): cooked capture v1, the `any` device.
    LinuxSll,
    /// `LINKTYPE_LINUX_SLL2` (276): cooked capture v2, the `any` device.
    LinuxSll2,
    /// `LINKTYPE_RAW` (101): the frame starts with the IP header.
    RawIp,
}

impl LinkType {
    /// The link type for a pcap `LINKTYPE_*` / DLT number, if we read it.
    pub fn from_linktype(number: u32) -> Option<LinkType> {
        match number {
            1 => Some(LinkType::Ethernet),
            113 => Some(LinkType::LinuxSll),
            276 => Some(LinkType::LinuxSll2),
            // 12 is DLT_RAW on Linux and OpenBSD; 101 is LINKTYPE_RAW.
            12 | 101 => Some(LinkType::RawIp),
            _ => None,
        }
    }
}

/// The TCP flags the reassembler and the flow table act on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TcpFlags {
    pub syn: bool,
    pub fin: bool,
    pub rst: bool,
    pub ack: bool,
    pub psh: bool,
}

/// One TCP segment out of a captured frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    pub src: SocketAddr,
    pub dst: SocketAddr,
    pub seq: u32,
    pub ack: u32,
    pub flags: TcpFlags,
    /// The TCP payload: a zero-copy slice of the captured frame.
    pub payload: Bytes,
}

const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86DD;
const ETHERTYPE_VLAN: u16 = 0x8100;
const IPPROTO_TCP: u8 = 6;

/// Parses one frame of the given link type into a TCP segment.
///
/// `None` for anything else: other link or network protocols, non-TCP,
/// IP fragments (a fragment's TCP header or payload is elsewhere; loopback
/// traffic is never fragmented), and truncated frames (a snap length
/// shorter than the packet would hand the parser a payload with bytes
/// missing, which must not pass for the real stream).
pub fn parse(link: LinkType, frame: &Bytes) -> Option<Segment> {
    let (ethertype, ip_start) = match link {
        LinkType::Ethernet => {
            let mut ethertype = be16(frame, 12)?;
            let mut start = 14;
            if ethertype == ETHERTYPE_VLAN {
                ethertype = be16(frame, 16)?;
                start = 18;
            }
            (Some(ethertype), start)
        }
        // SLL: packet type, ARPHRD, address length, 8 address bytes, protocol.
        LinkType::LinuxSll => (Some(be16(frame, 14)?), 16),
        // SLL2: protocol first, then reserved, ifindex, ARPHRD, type, address.
        LinkType::LinuxSll2 => {
            if frame.len() < 20 {
                return None;
            }
            (Some(be16(frame, 0)?), 20)
        }
        LinkType::RawIp => (None, 0),
    };
    let version = frame.get(ip_start)? >> 4;
    match (ethertype, version) {
        (Some(ETHERTYPE_IPV4) | None, 4) => parse_ipv4(frame, ip_start),
        (Some(ETHERTYPE_IPV6) | None, 6) => parse_ipv6(frame, ip_start),
        _ => None,
    }
}

/// IPv4: the header length comes from IHL (options are skipped) and the
/// packet's end from the total length (link padding is not payload).
fn parse_ipv4(frame: &Bytes, at: usize) -> Option<Segment> {
    let header = frame.get(at..at + 20)?;
    let ihl = usize::from(header[0] & 0x0f) * 4;
    let total = usize::from(u16::from_be_bytes([header[2], header[3]]));
    let flags_fragment = u16::from_be_bytes([header[6], header[7]]);
    let more_fragments = flags_fragment & 0x2000 != 0;
    let offset = flags_fragment & 0x1fff;
    if ihl < 20 || total < ihl || more_fragments || offset != 0 || header[9] != IPPROTO_TCP {
        return None;
    }
    let src = IpAddr::V4(Ipv4Addr::new(
        header[12], header[13], header[14], header[15],
    ));
    let dst = IpAddr::V4(Ipv4Addr::new(
        header[16], header[17], header[18], header[19],
    ));
    let end = at.checked_add(total)?;
    if frame.len() < end {
        return None;
    }
    parse_tcp(frame, at + ihl, end, src, dst)
}

/// IPv6: hop-by-hop, routing and destination-options headers are walked;
/// a fragment header (or anything else before TCP) gives up.
fn parse_ipv6(frame: &Bytes, at: usize) -> Option<Segment> {
    let header = frame.get(at..at + 40)?;
    let payload_len = usize::from(u16::from_be_bytes([header[4], header[5]]));
    let mut next = header[6];
    let src = IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(&header[8..24]).ok()?));
    let dst = IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(&header[24..40]).ok()?));
    // A zero payload length means a jumbogram, which loopback never sends.
    if payload_len == 0 {
        return None;
    }
    let end = at + 40 + payload_len;
    if frame.len() < end {
        return None;
    }
    let mut cursor = at + 40;
    loop {
        match next {
            IPPROTO_TCP => return parse_tcp(frame, cursor, end, src, dst),
            // Hop-by-hop, routing, destination options: length in 8-octet
            // units, not counting the first 8.
            0 | 43 | 60 => {
                let ext = frame.get(cursor..cursor + 2)?;
                next = ext[0];
                cursor += (usize::from(ext[1]) + 1) * 8;
                if cursor > end {
                    return None;
                }
            }
            _ => return None,
        }
    }
}

/// TCP: the payload starts after the data offset (options skipped).
fn parse_tcp(frame: &Bytes, at: usize, end: usize, src: IpAddr, dst: IpAddr) -> Option<Segment> {
    let header = frame.get(at..at + 20)?;
    let data_offset = usize::from(header[12] >> 4) * 4;
    if data_offset < 20 || at + data_offset > end {
        return None;
    }
    let bits = header[13];
    Some(Segment {
        src: SocketAddr::new(src, u16::from_be_bytes([header[0], header[1]])),
        dst: SocketAddr::new(dst, u16::from_be_bytes([header[2], header[3]])),
        seq: u32::from_be_bytes([header[4], header[5], header[6], header[7]]),
        ack: u32::from_be_bytes([header[8], header[9], header[10], header[11]]),
        flags: TcpFlags {
            fin: bits & 0x01 != 0,
            syn: bits & 0x02 != 0,
            rst: bits & 0x04 != 0,
            psh: bits & 0x08 != 0,
            ack: bits & 0x10 != 0,
        },
        payload: frame.slice(at + data_offset..end),
    })
}

fn be16(frame: &[u8], at: usize) -> Option<u16> {
    let b = frame.get(at..at + 2)?;
    Some(u16::from_be_bytes([b[0], b[1]]))
}

/// Frame builders for this module's tests and the capture tests elsewhere:
/// the inverse of [`parse`], with the fields the tests vary.
#[cfg(test)]
pub(crate) mod build {
    use super::*;

    /// A TCP header (20 bytes plus `options`, padded to 4) and payload.
    pub fn tcp(seg: &Segment, options: &[u8]) -> Vec<u8> {
        let mut opts = options.to_vec();
        while opts.len() % 4 != 0 {
            opts.push(1); // NOP
        }
        let mut out = Vec::new();
        out.extend_from_slice(&seg.src.port().to_be_bytes());
        out.extend_from_slice(&seg.dst.port().to_be_bytes());
        out.extend_from_slice(&seg.seq.to_be_bytes());
        out.extend_from_slice(&seg.ack.to_be_bytes());
        out.push((((20 + opts.len()) / 4) as u8) << 4);
        let f = seg.flags;
        out.push(
            u8::from(f.fin)
                | u8::from(f.syn) << 1
                | u8::from(f.rst) << 2
                | u8::from(f.psh) << 3
                | u8::from(f.ack) << 4,
        );
        out.extend_from_slice(&[0xff, 0xff, 0, 0, 0, 0]); // window, checksum, urgent
        out.extend_from_slice(&opts);
        out.extend_from_slice(&seg.payload);
        out
    }

    /// An IP packet (v4 with `v4_options`, or v6 with `v6_ext` extension
    /// headers as (next-header number, body) pairs) around `tcp`.
    pub fn ip(seg: &Segment, tcp: &[u8], v4_options: &[u8], v6_ext: &[(u8, Vec<u8>)]) -> Vec<u8> {
        let mut out = Vec::new();
        match (seg.src.ip(), seg.dst.ip()) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                let mut opts = v4_options.to_vec();
                while opts.len() % 4 != 0 {
                    opts.push(0);
                }
                let ihl = 20 + opts.len();
                out.push(0x40 | (ihl / 4) as u8);
                out.push(0);
                out.extend_from_slice(&((ihl + tcp.len()) as u16).to_be_bytes());
                out.extend_from_slice(&[0, 0, 0x40, 0, 64, IPPROTO_TCP, 0, 0]);
                out.extend_from_slice(&s.octets());
                out.extend_from_slice(&d.octets());
                out.extend_from_slice(&opts);
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                let mut exts = Vec::new();
                for (i, (_, body)) in v6_ext.iter().enumerate() {
                    let next = v6_ext.get(i + 1).map_or(IPPROTO_TCP, |e| e.0);
                    let mut h = vec![next, 0];
                    h.extend_from_slice(body);
                    while h.len() % 8 != 0 {
                        h.push(0);
                    }
                    h[1] = (h.len() / 8 - 1) as u8;
                    exts.extend_from_slice(&h);
                }
                out.extend_from_slice(&[0x60, 0, 0, 0]);
                out.extend_from_slice(&((exts.len() + tcp.len()) as u16).to_be_bytes());
                out.push(v6_ext.first().map_or(IPPROTO_TCP, |e| e.0));
                out.push(64);
                out.extend_from_slice(&s.octets());
                out.extend_from_slice(&d.octets());
                out.extend_from_slice(&exts);
            }
            _ => panic!("mixed address families"),
        }
        out.extend_from_slice(tcp);
        out
    }

    /// The Ethernet frame Linux `lo` gives: zero MACs.
    pub fn ethernet(seg: &Segment) -> Bytes {
        let ip = ip(seg, &tcp(seg, &[]), &[], &[]);
        let mut out = vec![0u8; 12];
        out.extend_from_slice(&ethertype(seg).to_be_bytes());
        out.extend_from_slice(&ip);
        Bytes::from(out)
    }

    pub fn ethertype(seg: &Segment) -> u16 {
        if seg.src.is_ipv4() {
            ETHERTYPE_IPV4
        } else {
            ETHERTYPE_IPV6
        }
    }

    /// A segment with the given ends, sequence number, flags and payload.
    pub fn segment(src: &str, dst: &str, seq: u32, flags: TcpFlags, payload: &[u8]) -> Segment {
        Segment {
            src: src.parse().expect("src"),
            dst: dst.parse().expect("dst"),
            seq,
            ack: 0,
            flags,
            payload: Bytes::copy_from_slice(payload),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::build::*;
    use super::*;

    fn psh_ack() -> TcpFlags {
        TcpFlags {
            psh: true,
            ack: true,
            ..TcpFlags::default()
        }
    }

    fn v4_segment() -> Segment {
        let mut s = segment(
            "127.0.0.1:50000",
            "127.0.0.1:11434",
            0xfffffff0,
            psh_ack(),
            b"GET / HTTP/1.1\r\n",
        );
        s.ack = 42;
        s
    }

    fn v6_segment() -> Segment {
        segment("[::1]:50000", "[::1]:11434", 7, psh_ack(), b"hello")
    }

    #[test]
    fn an_ethernet_frame_from_lo_gives_its_segment() {
        let seg = v4_segment();
        assert_eq!(parse(LinkType::Ethernet, &ethernet(&seg)), Some(seg));
    }

    #[test]
    fn the_payload_is_a_slice_of_the_frame() {
        let seg = v4_segment();
        let frame = ethernet(&seg);
        let parsed = parse(LinkType::Ethernet, &frame).expect("parses");
        let inside = frame.as_ptr_range();
        assert!(inside.contains(&parsed.payload.as_ptr()));
    }

    #[test]
    fn every_flag_bit_is_read() {
        let all = TcpFlags {
            syn: true,
            fin: true,
            rst: true,
            ack: true,
            psh: true,
        };
        for flags in [
            all,
            TcpFlags::default(),
            TcpFlags {
                syn: true,
                ..TcpFlags::default()
            },
        ] {
            let seg = segment("127.0.0.1:1", "127.0.0.1:2", 1, flags, b"");
            assert_eq!(
                parse(LinkType::Ethernet, &ethernet(&seg)).map(|s| s.flags),
                Some(flags)
            );
        }
    }

    #[test]
    fn a_vlan_tag_is_skipped() {
        let seg = v4_segment();
        let ip = ip(&seg, &tcp(&seg, &[]), &[], &[]);
        let mut frame = vec![0u8; 12];
        frame.extend_from_slice(&[0x81, 0x00, 0x00, 0x05, 0x08, 0x00]);
        frame.extend_from_slice(&ip);
        assert_eq!(parse(LinkType::Ethernet, &Bytes::from(frame)), Some(seg));
    }

    #[test]
    fn linux_cooked_v1_and_v2_frames_give_their_segments() {
        for seg in [v4_segment(), v6_segment()] {
            let ip = ip(&seg, &tcp(&seg, &[]), &[], &[]);
            let mut sll = vec![0, 0, 0, 1, 0, 6, 0, 0, 0, 0, 0, 0, 0, 0];
            sll.extend_from_slice(&ethertype(&seg).to_be_bytes());
            sll.extend_from_slice(&ip);
            assert_eq!(
                parse(LinkType::LinuxSll, &Bytes::from(sll)),
                Some(seg.clone())
            );

            let mut sll2 = ethertype(&seg).to_be_bytes().to_vec();
            sll2.extend_from_slice(&[0, 0, 0, 0, 0, 1, 0, 1, 0, 6, 0, 0, 0, 0, 0, 0, 0, 0]);
            sll2.extend_from_slice(&ip);
            assert_eq!(parse(LinkType::LinuxSll2, &Bytes::from(sll2)), Some(seg));
        }
    }

    #[test]
    fn a_raw_ip_frame_gives_its_segment() {
        let seg = v6_segment();
        let frame = Bytes::from(ip(&seg, &tcp(&seg, &[]), &[], &[]));
        assert_eq!(parse(LinkType::RawIp, &frame), Some(seg));
    }

    #[test]
    fn ipv4_options_and_tcp_options_are_skipped() {
        let seg = v4_segment();
        // TCP: MSS, SACK permitted, timestamps; IPv4: a router alert.
        let tcp = tcp(
            &seg,
            &[2, 4, 0xff, 0xd7, 4, 2, 8, 10, 0, 0, 0, 1, 0, 0, 0, 0],
        );
        let ip = ip(&seg, &tcp, &[0x94, 0x04, 0, 0], &[]);
        assert_eq!(parse(LinkType::RawIp, &Bytes::from(ip)), Some(seg));
    }

    #[test]
    fn ethernet_padding_after_the_ip_packet_is_not_payload() {
        let seg = segment("127.0.0.1:1", "127.0.0.1:2", 5, psh_ack(), b"x");
        let mut frame = ethernet(&seg).to_vec();
        frame.extend_from_slice(&[0; 6]);
        assert_eq!(parse(LinkType::Ethernet, &Bytes::from(frame)), Some(seg));
    }

    #[test]
    fn ipv6_extension_headers_are_walked() {
        let seg = v6_segment();
        let exts = vec![
            (0u8, vec![1, 4, 0, 0, 0, 0]),
            (43, vec![0; 6]),
            (60, vec![1, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
        ];
        let ip = ip(&seg, &tcp(&seg, &[]), &[], &exts);
        assert_eq!(parse(LinkType::RawIp, &Bytes::from(ip)), Some(seg));
    }

    #[test]
    fn an_ipv6_fragment_is_given_up() {
        let seg = v6_segment();
        let ip = ip(&seg, &tcp(&seg, &[]), &[], &[(44, vec![0; 6])]);
        assert_eq!(parse(LinkType::RawIp, &Bytes::from(ip)), None);
    }

    #[test]
    fn an_ipv4_fragment_is_given_up() {
        let seg = v4_segment();
        for (flags_hi, flags_lo) in [(0x20, 0x00), (0x00, 0x10)] {
            let mut ip = ip(&seg, &tcp(&seg, &[]), &[], &[]);
            ip[6] = flags_hi;
            ip[7] = flags_lo;
            assert_eq!(parse(LinkType::RawIp, &Bytes::from(ip)), None);
        }
    }

    #[test]
    fn udp_arp_and_unknown_link_types_are_not_segments() {
        let seg = v4_segment();
        let mut udp = ip(&seg, &tcp(&seg, &[]), &[], &[]);
        udp[9] = 17;
        assert_eq!(parse(LinkType::RawIp, &Bytes::from(udp)), None);
        let mut arp = ethernet(&seg).to_vec();
        arp[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
        assert_eq!(parse(LinkType::Ethernet, &Bytes::from(arp)), None);
        assert_eq!(LinkType::from_linktype(105), None);
        assert_eq!(LinkType::from_linktype(276), Some(LinkType::LinuxSll2));
    }

    #[test]
    fn a_frame_cut_anywhere_is_not_a_segment() {
        for seg in [v4_segment(), v6_segment()] {
            let frame = ethernet(&seg);
            for len in 0..frame.len() {
                assert_eq!(
                    parse(LinkType::Ethernet, &frame.slice(..len)),
                    None,
                    "cut at {len}"
                );
            }
        }
    }

    #[test]
    fn a_bad_header_length_is_not_a_segment() {
        let seg = v4_segment();
        let mut small_ihl = ip(&seg, &tcp(&seg, &[]), &[], &[]);
        small_ihl[0] = 0x44;
        assert_eq!(parse(LinkType::RawIp, &Bytes::from(small_ihl)), None);
        let mut small_offset = ip(&seg, &tcp(&seg, &[]), &[], &[]);
        small_offset[20 + 12] = 0x40;
        assert_eq!(parse(LinkType::RawIp, &Bytes::from(small_offset)), None);
        let mut huge_offset = ip(&seg, &tcp(&seg, &[]), &[], &[]);
        huge_offset[20 + 12] = 0xf0;
        assert_eq!(parse(LinkType::RawIp, &Bytes::from(huge_offset)), None);
    }
}
