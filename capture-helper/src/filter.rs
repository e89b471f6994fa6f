//! Changing the kernel filter of an open capture without a gap: the new
//! expression compiled by libpcap, its instructions attached to the packet
//! socket with `SO_ATTACH_FILTER` (one atomic swap in the kernel), their
//! load offsets rewritten first on a cooked link. Why not
//! `pcap_setfilter`: see the crate doc's *Changing the filter*.

use std::io;
use std::os::fd::AsRawFd;

use pcap::{Active, BpfInstruction, BpfProgram, Capture};

/// pcap's link types for Linux cooked captures (the `any` interface).
const DLT_LINUX_SLL: i32 = 113;
const DLT_LINUX_SLL2: i32 = 276;
/// The cooked headers' lengths.
const SLL_HDR_LEN: u32 = 16;
const SLL2_HDR_LEN: u32 = 20;

// Classic BPF opcode parts (linux/filter.h, pcap/bpf.h).
const BPF_CLASS_MASK: u16 = 0x07;
const BPF_LD: u16 = 0x00;
const BPF_LDX: u16 = 0x01;
const BPF_MODE_MASK: u16 = 0xe0;
const BPF_ABS: u16 = 0x20;
const BPF_IND: u16 = 0x40;
const BPF_MSH: u16 = 0xa0;

/// How a change was made.
#[derive(Debug, PartialEq, Eq)]
pub enum Applied {
    /// Swapped in the kernel, no packet lost.
    Attached,
    /// Through `pcap_setfilter` (a program the kernel can't run on a cooked
    /// link): packets of other flows arriving during the swap may be lost.
    SetFilter,
}

/// The filter in place, kept to run in userland on every packet read: the
/// ring may still hold packets the previous kernel filter let through (and,
/// right after the open, packets from before any filter), which the new
/// set must not pass on. libpcap's own userland pass isn't used: it only
/// knows the filters set through it.
pub struct Filter {
    program: BpfProgram,
}

impl Filter {
    /// Whether a packet read from the ring (link header first) passes.
    pub fn matches(&self, packet: &[u8]) -> bool {
        self.program.filter(packet)
    }
}

/// Replaces the capture's kernel filter with `expression`'s program.
pub fn replace(cap: &mut Capture<Active>, expression: &str) -> Result<(Filter, Applied), String> {
    let program = cap.compile(expression, true).map_err(|e| e.to_string())?;
    let mut insns = to_sock_filter(program.get_instructions());
    let link = cap.get_datalink().0;
    let header = match link {
        DLT_LINUX_SLL => Some(Cooked::Sll),
        DLT_LINUX_SLL2 => Some(Cooked::Sll2),
        _ => None,
    };
    if let Some(cooked) = header {
        if !fix_cooked(&mut insns, cooked) {
            cap.filter(expression, true).map_err(|e| e.to_string())?;
            return Ok((Filter { program }, Applied::SetFilter));
        }
    }
    attach(cap.as_raw_fd(), &insns).map_err(|e| format!("SO_ATTACH_FILTER: {e}"))?;
    Ok((Filter { program }, Applied::Attached))
}

/// The program's instructions in the kernel's type.
fn to_sock_filter(insns: &[BpfInstruction]) -> Vec<libc::sock_filter> {
    const _: () = assert!(
        std::mem::size_of::<BpfInstruction>() == std::mem::size_of::<libc::sock_filter>()
            && std::mem::align_of::<BpfInstruction>() == std::mem::align_of::<libc::sock_filter>()
    );
    // SAFETY: `BpfInstruction` is `repr(transparent)` over libpcap's
    // `struct bpf_insn { u16 code; u8 jt; u8 jf; u32 k; }` (`repr(C)`), the
    // very layout of the kernel's `struct sock_filter`; size and alignment
    // are checked above. The slice is copied before the program is freed.
    unsafe { std::slice::from_raw_parts(insns.as_ptr().cast::<libc::sock_filter>(), insns.len()) }
        .to_vec()
}

/// Attaches `insns` as the socket's filter: the kernel replaces the old
/// one atomically (no moment without a filter, none with a reject-all).
fn attach(fd: libc::c_int, insns: &[libc::sock_filter]) -> io::Result<()> {
    let len = u16::try_from(insns.len())
        .map_err(|_| io::Error::other(format!("{} instructions is too many", insns.len())))?;
    let prog = libc::sock_fprog {
        len,
        filter: insns.as_ptr().cast_mut(),
    };
    // SAFETY: `prog` points at `insns`, alive for the call; the kernel
    // copies the program.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ATTACH_FILTER,
            std::ptr::from_ref(&prog).cast(),
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if r == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Which cooked header the compiled program expects in front of the
/// network header.
#[derive(Clone, Copy, Debug)]
pub enum Cooked {
    Sll,
    Sll2,
}

/// The kernel's ancillary load offset for field `ad` (`SKF_AD_OFF + ad`).
fn ancillary(ad: libc::c_int) -> u32 {
    (libc::SKF_AD_OFF + ad) as u32
}

/// Rewrites the absolute and indexed loads of a program compiled for a
/// cooked link so the kernel can run it on packets that start at the
/// network header, as libpcap's `fix_offset` does before it attaches one.
/// False when a load reads a header field the kernel has no ancillary
/// field for: then the program can't run in the kernel.
pub fn fix_cooked(insns: &mut [libc::sock_filter], cooked: Cooked) -> bool {
    for insn in insns {
        let class = insn.code & BPF_CLASS_MASK;
        let mode = insn.code & BPF_MODE_MASK;
        if !(class == BPF_LD || class == BPF_LDX) || !matches!(mode, BPF_ABS | BPF_IND | BPF_MSH) {
            continue;
        }
        let k = insn.k;
        let (header, fields): (u32, &[(u32, libc::c_int)]) = match cooked {
            // SLL: packet type at 0, protocol at 14.
            Cooked::Sll => (
                SLL_HDR_LEN,
                &[(0, libc::SKF_AD_PKTTYPE), (14, libc::SKF_AD_PROTOCOL)],
            ),
            // SLL2: protocol at 0, interface index at 4, packet type at 10.
            Cooked::Sll2 => (
                SLL2_HDR_LEN,
                &[
                    (0, libc::SKF_AD_PROTOCOL),
                    (4, libc::SKF_AD_IFINDEX),
                    (10, libc::SKF_AD_PKTTYPE),
                ],
            ),
        };
        if k >= header {
            // Negative offsets (already ancillary) are huge as u32: left be.
            if (k as i32) > 0 {
                insn.k = k - header;
            }
        } else if let Some((_, ad)) = fields.iter().find(|(at, _)| *at == k) {
            insn.k = ancillary(*ad);
        } else {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn insn(code: u16, k: u32) -> libc::sock_filter {
        libc::sock_filter {
            code,
            jt: 0,
            jf: 0,
            k,
        }
    }

    fn ks(insns: &[libc::sock_filter]) -> Vec<u32> {
        insns.iter().map(|i| i.k).collect()
    }

    // ldh [k], ldb [x + k], ldxb 4*([k]&0xf), jeq #k, ret #k
    const LDH_ABS: u16 = 0x28;
    const LDB_IND: u16 = 0x50;
    const LDXB_MSH: u16 = 0xb1;
    const JEQ: u16 = 0x15;
    const RET: u16 = 0x06;

    #[test]
    fn a_cooked_programs_loads_move_to_the_network_header_and_header_fields_become_ancillary() {
        // As `tcp port 11434` compiles on SLL: protocol at 14, IPv4 protocol
        // at 16 + 9, header length at 16, port at x + 16 + 2.
        let mut p = vec![
            insn(LDH_ABS, 14),
            insn(JEQ, 0x0800),
            insn(LDH_ABS, 25),
            insn(LDXB_MSH, 16),
            insn(LDB_IND, 18),
            insn(LDH_ABS, 0),
            insn(RET, 262_144),
        ];
        assert!(fix_cooked(&mut p, Cooked::Sll));
        let protocol = ancillary(libc::SKF_AD_PROTOCOL);
        let pkttype = ancillary(libc::SKF_AD_PKTTYPE);
        assert_eq!(ks(&p), [protocol, 0x0800, 9, 0, 2, pkttype, 262_144]);

        // SLL2: protocol at 0, interface at 4, packet type at 10, IP at 20.
        let mut p = vec![
            insn(LDH_ABS, 0),
            insn(LDH_ABS, 4),
            insn(LDH_ABS, 10),
            insn(LDXB_MSH, 20),
            insn(LDB_IND, 22),
        ];
        assert!(fix_cooked(&mut p, Cooked::Sll2));
        let ifindex = ancillary(libc::SKF_AD_IFINDEX);
        assert_eq!(ks(&p), [protocol, ifindex, pkttype, 0, 2]);
    }

    #[test]
    fn a_load_of_a_cooked_header_field_the_kernel_lacks_keeps_the_program_out_of_the_kernel() {
        // SLL's link-layer address (offset 6) has no ancillary field.
        assert!(!fix_cooked(&mut [insn(LDH_ABS, 6)], Cooked::Sll));
        assert!(!fix_cooked(&mut [insn(LDH_ABS, 8)], Cooked::Sll2));
        // An offset that is already ancillary stays as it is.
        let already = ancillary(libc::SKF_AD_VLAN_TAG);
        let mut p = [insn(LDH_ABS, already)];
        assert!(fix_cooked(&mut p, Cooked::Sll));
        assert_eq!(p[0].k, already);
    }

    #[test]
    fn a_filter_swapped_on_a_live_socket_is_the_one_the_kernel_runs() {
        // A plain UDP socket pair is enough to see SO_ATTACH_FILTER take
        // effect: the kernel runs socket filters on every socket type.
        let rx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_nonblocking(true).unwrap();
        let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        tx.connect(rx.local_addr().unwrap()).unwrap();
        let mut buf = [0u8; 16];
        attach(rx.as_raw_fd(), &[insn(RET, 0)]).unwrap();
        tx.send(b"dropped").unwrap();
        attach(rx.as_raw_fd(), &[insn(RET, u32::MAX)]).unwrap();
        tx.send(b"kept").unwrap();
        // Loopback delivery is synchronous in send(): the datagram is
        // queued (or filtered out) before send returns.
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"kept");
        assert!(
            rx.recv(&mut buf).is_err(),
            "the first datagram was filtered"
        );
    }
}
