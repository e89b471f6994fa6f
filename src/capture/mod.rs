//! Passive capture of the loopback traffic to model servers: the packet
//! source (a privileged helper, `speedtap-capture`, started by the engine) and
//! the record stream it writes.

pub mod feed;
pub mod source;
