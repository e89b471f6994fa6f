//! The helper's filter changed while a flow runs, end to end: the built
//! `speedtap-capture` on `lo` and on `any`, a TCP flow sending one small segment at a
//! time, and `ports` lines on its standard input between them. Every data
//! segment of the flow must come out, however often the set changes
//! around it. Skipped (with the reason) where the helper can't open the
//! packet socket, unless `SPEEDTAP_CAPTURE_REQUIRE` is set.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;

const HELPER: &str = env!("CARGO_BIN_EXE_speedtap-capture");

/// Whether the helper may capture here; prints why not.
fn permitted() -> bool {
    let out = Command::new(HELPER)
        .args(["--check", "--interface", "lo"])
        .output()
        .expect("the helper runs");
    if out.status.success() {
        return true;
    }
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        std::env::var_os("SPEEDTAP_CAPTURE_REQUIRE").is_none(),
        "SPEEDTAP_CAPTURE_REQUIRE is set but the helper can't capture: {said}"
    );
    eprintln!("skipped: the helper can't capture here: {said}");
    false
}

/// Reads the stream's header (once it is out, the capture is open):
/// the length of the link header in front of each packet's IP header.
fn read_header(out: &mut impl Read) -> usize {
    let mut head = [0u8; 11];
    out.read_exact(&mut head).expect("the stream's header");
    assert_eq!(&head[..7], b"STCAP1\n");
    match u32::from_le_bytes(head[7..11].try_into().unwrap()) {
        1 => 14,   // Ethernet, on lo
        113 => 16, // Linux cooked (SLL), on any
        276 => 20, // Linux cooked v2
        other => panic!("unexpected link type {other}"),
    }
}

/// Reads the helper's stream after its header; sends the count of
/// distinct data segments (by sequence number: a copy seen twice counts
/// once) sent to `port` so far after each new one.
fn count_data_to(
    mut out: impl Read,
    link_len: usize,
    port: u16,
    counted: std::sync::mpsc::Sender<usize>,
) {
    let mut seqs = std::collections::HashSet::new();
    let mut kind = [0u8; 1];
    while out.read_exact(&mut kind).is_ok() {
        if kind[0] == 1 {
            let mut stats = [0u8; 24];
            out.read_exact(&mut stats).unwrap();
            continue;
        }
        if kind[0] == 2 {
            // A control line dealt with.
            let mut applied = [0u8; 8];
            out.read_exact(&mut applied).unwrap();
            continue;
        }
        let mut rec = [0u8; 16];
        out.read_exact(&mut rec).unwrap();
        let caplen = u32::from_le_bytes(rec[8..12].try_into().unwrap()) as usize;
        let mut data = vec![0u8; caplen];
        out.read_exact(&mut data).unwrap();
        let ip = &data[link_len..];
        let ihl = usize::from(ip[0] & 0x0f) * 4;
        let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
        let tcp = &ip[ihl..total];
        let dst = u16::from_be_bytes([tcp[2], tcp[3]]);
        let data_off = usize::from(tcp[12] >> 4) * 4;
        if dst == port && tcp.len() > data_off {
            let seq = u32::from_be_bytes(tcp[4..8].try_into().unwrap());
            if seqs.insert(seq) && counted.send(seqs.len()).is_err() {
                return;
            }
        }
    }
}

#[test]
fn a_flow_loses_no_segment_while_the_port_set_changes_around_it() {
    changes_lose_nothing_on("lo");
}

/// The same on `any`, a cooked link: the program's offsets are rewritten
/// for the kernel before it is attached.
#[test]
fn on_a_cooked_link_too_a_flow_loses_no_segment_while_the_port_set_changes() {
    changes_lose_nothing_on("any");
}

fn changes_lose_nothing_on(interface: &str) {
    if !permitted() {
        return;
    }
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut helper = Command::new(HELPER)
        .args(["--interface", interface, "--port", &port.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut control = helper.stdin.take().unwrap();
    let mut stdout = helper.stdout.take().unwrap();
    let link_len = read_header(&mut stdout);
    let (counted, counts) = std::sync::mpsc::channel();
    std::thread::spawn(move || count_data_to(stdout, link_len, port, counted));

    let mut client = TcpStream::connect(("127.0.0.1", port)).unwrap();
    client.set_nodelay(true).unwrap();
    let (mut server, _) = listener.accept().unwrap();
    const SEGMENTS: usize = 2_000;
    let other = port.wrapping_add(1).max(1);
    let sets = [
        format!("ports {port}\n"),
        format!("ports {port} {other}\n"),
        format!("ports {other} 1 2 3 {port}\n"),
    ];
    let mut byte = [0u8; 1];
    for i in 0..SEGMENTS {
        if i % 2 == 0 {
            control.write_all(sets[(i / 2) % 3].as_bytes()).unwrap();
        }
        client.write_all(b"x").unwrap();
        // The server reads each byte before the next is sent, so each is a
        // segment of its own (no coalescing behind an unacknowledged one).
        server.read_exact(&mut byte).unwrap();
    }
    drop(client);
    drop(server);
    // Every segment comes out within the ring's block timeout; 10 s at most.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut seen = 0;
    while seen < SEGMENTS {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match counts.recv_timeout(left) {
            Ok(n) => seen = n,
            Err(_) => break,
        }
    }
    let _ = helper.kill();
    let _ = helper.wait();
    let mut said = String::new();
    helper
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut said)
        .unwrap();
    assert_eq!(
        seen,
        SEGMENTS,
        "segments captured on {interface} across {} changes; stderr: {said}",
        SEGMENTS / 2
    );
}
