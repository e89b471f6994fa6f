//! The reasoning cost of one call: how long it thought and how many
//! tokens that took, split from the answer (`docs/metering.md`, "Reasoning
//! cost").
//!
//! Pure: fed each non-empty output's channel and arrival time, and the
//! call's token count at the first answer output; it never reads the
//! clock. The thinking runs from the first reasoning output to the first
//! answer output (text or tool arguments) after it, or, when no answer
//! came, to the last output. Its tokens are the server's own
//! `reasoning_tokens` when the usage receipt carries them, else the
//! call's count up to the first answer output (an estimate, labelled so).

use tokio::time::Instant;

use crate::decode::OutputChannel;

/// What one call spent reasoning, settled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReasoningCost {
    /// Reasoning tokens.
    pub tokens: u64,
    /// First reasoning output to the first answer output (or the last
    /// output), in ms.
    pub ms: u64,
    /// `tokens` is speedtap's count of the streamed reasoning, not the
    /// server's.
    pub estimated: bool,
}

/// The split as the outputs arrive.
#[derive(Clone, Debug, Default)]
pub struct ReasoningSplit {
    first_reasoning_at: Option<Instant>,
    answer_at: Option<Instant>,
    last_output_at: Option<Instant>,
    /// The call's output count when its first answer output arrived,
    /// before that output was counted: the reasoning's share.
    tokens_before_answer: Option<u64>,
}

impl ReasoningSplit {
    /// The next output is on `channel`: true when it is the first answer
    /// after reasoning, so the caller must pass the count so far to
    /// [`ReasoningSplit::on_output`] before counting it.
    pub fn answer_begins(&self, channel: OutputChannel) -> bool {
        channel != OutputChannel::Reasoning
            && self.first_reasoning_at.is_some()
            && self.answer_at.is_none()
    }

    /// A non-empty output on `channel` at `now`. `tokens_so_far`: the
    /// call's count before this output, given when
    /// [`ReasoningSplit::answer_begins`] said so.
    pub fn on_output(&mut self, channel: OutputChannel, now: Instant, tokens_so_far: Option<u64>) {
        self.last_output_at = Some(now);
        if channel == OutputChannel::Reasoning {
            self.first_reasoning_at.get_or_insert(now);
        } else if self.answer_begins(channel) {
            self.answer_at = Some(now);
            self.tokens_before_answer = tokens_so_far;
        }
    }

    /// The settled cost, or `None` when the call never reasoned.
    /// `all_tokens`: the call's whole output count (the reasoning's when
    /// it never answered); `server_reasoning_tokens`: the usage receipt's.
    pub fn settle(
        &self,
        all_tokens: u64,
        server_reasoning_tokens: Option<u64>,
    ) -> Option<ReasoningCost> {
        let began = self.first_reasoning_at?;
        let ended = self.answer_at.or(self.last_output_at)?;
        let counted = match self.answer_at {
            Some(_) => self.tokens_before_answer?,
            None => all_tokens,
        };
        let (tokens, estimated) = match server_reasoning_tokens.filter(|n| *n > 0) {
            Some(n) => (n, false),
            None => (counted, true),
        };
        Some(ReasoningCost {
            tokens,
            ms: ended.saturating_duration_since(began).as_millis() as u64,
            estimated,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(t0: Instant, ms: u64) -> Instant {
        t0 + Duration::from_millis(ms)
    }

    #[test]
    fn thinking_runs_from_the_first_reasoning_to_the_first_answer_output() {
        let t0 = Instant::now();
        let mut s = ReasoningSplit::default();
        s.on_output(OutputChannel::Reasoning, at(t0, 500), None);
        s.on_output(OutputChannel::Reasoning, at(t0, 41_500), None);
        assert!(s.answer_begins(OutputChannel::Text));
        s.on_output(OutputChannel::Text, at(t0, 41_600), Some(1_800));
        assert!(!s.answer_begins(OutputChannel::Text));
        // More reasoning after the answer began changes nothing.
        s.on_output(OutputChannel::Reasoning, at(t0, 43_000), None);
        s.on_output(OutputChannel::Text, at(t0, 44_600), None);
        assert_eq!(
            s.settle(2_000, None),
            Some(ReasoningCost {
                tokens: 1_800,
                ms: 41_100,
                estimated: true
            })
        );
    }

    #[test]
    fn the_servers_reasoning_count_wins_over_the_estimate() {
        let t0 = Instant::now();
        let mut s = ReasoningSplit::default();
        s.on_output(OutputChannel::Reasoning, at(t0, 100), None);
        s.on_output(OutputChannel::Text, at(t0, 2_100), Some(70));
        let cost = s.settle(90, Some(64)).unwrap();
        assert_eq!((cost.tokens, cost.ms, cost.estimated), (64, 2_000, false));
    }

    #[test]
    fn a_call_that_only_reasoned_thought_until_its_last_output() {
        let t0 = Instant::now();
        let mut s = ReasoningSplit::default();
        s.on_output(OutputChannel::Reasoning, at(t0, 200), None);
        s.on_output(OutputChannel::Reasoning, at(t0, 3_200), None);
        let cost = s.settle(120, None).unwrap();
        assert_eq!((cost.tokens, cost.ms), (120, 3_000));
    }

    #[test]
    fn a_call_that_never_reasoned_has_no_reasoning_cost() {
        let t0 = Instant::now();
        let mut s = ReasoningSplit::default();
        assert!(!s.answer_begins(OutputChannel::Text));
        s.on_output(OutputChannel::Text, at(t0, 200), None);
        assert_eq!(s.settle(50, Some(10)), None);
    }
}
