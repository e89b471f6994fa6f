//! Passive capture: captured loopback packets to HTTP/1.1 exchanges.
//!
//! The pure core of the capture interceptor: no socket, no clock, no
//! engine. Frames go in with their capture timestamps; HTTP events come
//! out with the timestamp of the packet that completed them.
//!
//! - [`packet`] parses one captured frame (Ethernet, Linux cooked v1 and
//!   v2, raw IP; IPv4 and IPv6) into a TCP [`packet::Segment`];
//! - [`reassembly`] puts one direction of a flow back in order, with gaps
//!   where bytes were lost;
//! - [`http1`] parses both directions of one connection into requests and
//!   responses, matched in order;
//! - [`flows`] is the connection table that routes segments to the above
//!   for the configured server ports.

pub mod http1;
pub mod packet;
pub mod reassembly;

/// A packet timestamp in nanoseconds, as the capture source gives it
/// (kernel `SO_TIMESTAMPNS` / pcap nanosecond precision). The core only
/// compares and subtracts them; the engine maps them onto its monotonic
/// clock.
pub type Nanos = u64;
