//! Response ids (`chatcmpl-…`, `resp_…`, `msg_…`) that look like the real
//! ones: random alphanumerics, different per server process and per reply.
//! Not cryptographic: nothing depends on them being unguessable.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};

const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

/// A source of unique random-looking ids.
#[derive(Debug)]
pub(crate) struct IdSource {
    seed: u64,
    counter: AtomicU64,
}

impl IdSource {
    /// A source seeded from the process's hash randomness.
    pub(crate) fn new() -> IdSource {
        IdSource {
            seed: RandomState::new().hash_one(0x5eed_u64),
            counter: AtomicU64::new(0),
        }
    }

    /// `prefix` followed by `len` alphanumerics.
    pub(crate) fn next(&self, prefix: &str, len: usize) -> String {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let mut state = self.seed ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let mut out = String::with_capacity(prefix.len() + len);
        out.push_str(prefix);
        for _ in 0..len {
            let r = splitmix64(&mut state);
            out.push(ALPHABET[(r % ALPHABET.len() as u64) as usize] as char);
        }
        out
    }
}

/// SplitMix64: a tiny, well-mixed generator step.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_have_the_shape_and_differ() {
        let ids = IdSource::new();
        let a = ids.next("chatcmpl-", 32);
        let b = ids.next("chatcmpl-", 32);
        assert_eq!(a.len(), 9 + 32);
        assert!(a.starts_with("chatcmpl-"));
        assert!(a[9..].bytes().all(|c| c.is_ascii_alphanumeric()));
        assert_ne!(a, b);
    }
}
