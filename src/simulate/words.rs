//! The simulated output text.
//!
//! Every entry of [`WORDS`] is exactly one `o200k_base` token *including its
//! leading space*, and they are all plain lowercase words, so tiktoken's
//! pre-tokenizer splits a run of them at every space and never merges two:
//! the o200k estimate of any simulated text equals the number of tokens the
//! simulator scheduled. That makes the simulator an exact reference for the
//! estimator-based metering path (with `usage_factor` standing in for a
//! server tokenizer that differs from o200k by a known factor).

/// Words that are each exactly one o200k_base token including their leading
/// space, cycled to build the output text (token `i` is
/// `WORDS[i % WORDS.len()]`).
pub const WORDS: &[&str] = &[
    " the", " model", " of", " and", " to", " in", " is", " that", " for", " it", " with", " as",
    " on", " this", " be", " are", " by", " from", " at", " or", " an", " was", " can", " will",
    " more", " time", " data", " token", " speed", " stream", " fast", " local", " server",
    " answer", " text", " word", " line", " test", " value", " first", " next", " each", " rate",
    " second", " output", " input", " result", " simple", " small", " large", " number", " order",
    " every", " part", " point", " water", " light", " world", " sound", " clear", " short",
    " long", " plan", " step", " field", " place", " state", " check", " start", " close", " open",
    " build", " write", " read",
];

/// The text of output token `index` (0-based over reasoning and answer).
pub(crate) fn word(index: u64) -> &'static str {
    WORDS[(index % WORDS.len() as u64) as usize]
}

/// A stable fake vocabulary id for output token `index`, for the APIs that
/// report token ids (llama.cpp `tokens`, TGI `token.id`). Ids below 1000 are
/// left for "special" tokens such as TGI's end-of-sequence.
pub(crate) fn token_id(index: u64) -> u64 {
    1000 + index % WORDS.len() as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::{O200kEstimator, TokenEstimator};

    #[test]
    fn every_word_is_one_o200k_token_with_its_space() {
        for w in WORDS {
            assert!(w.starts_with(' ') && w.len() > 1, "{w:?}");
            assert_eq!(O200kEstimator.count_tokens(w), 1, "{w:?}");
        }
        let all = WORDS.concat();
        assert_eq!(O200kEstimator.count_tokens(&all), WORDS.len() as u64);
    }

    #[test]
    fn cycling_keeps_the_count_exact() {
        // Across the wrap-around point too (last word followed by the first).
        let n = WORDS.len() as u64 * 2 + 7;
        let text: String = (0..n).map(word).collect();
        assert_eq!(O200kEstimator.count_tokens(&text), n);
    }

    #[test]
    fn word_and_id_cycle() {
        let len = WORDS.len() as u64;
        assert_eq!(word(0), WORDS[0]);
        assert_eq!(word(len), WORDS[0]);
        assert_eq!(token_id(len + 1), token_id(1));
        assert_ne!(token_id(0), token_id(1));
    }
}
