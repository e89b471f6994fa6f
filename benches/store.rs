//! Store write throughput and size (being written).
fn main() {}
