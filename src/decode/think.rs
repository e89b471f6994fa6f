//! Inline reasoning: splits text that carries `<think>...</think>` (or
//! gpt-oss harmony channel markers) into reasoning and visible text.
//!
//! Servers that do not split reasoning into its own field (llama.cpp with
//! `--reasoning-format none` or native `/completion`, vLLM without a
//! reasoning parser, raw `/v1/completions`) leave the tags inside the text;
//! see `docs/protocols.md` "Reasoning". The splitter is a small state
//! machine: text is [`OutputChannel::Text`] until `<think>`, then
//! [`OutputChannel::Reasoning`] until `</think>`, then text again. Markers
//! are removed from the output.
//!
//! A marker can be cut across chunks (`</thi` + `nk>`), so a suffix that is
//! a prefix of some marker is held back until the next push decides it.
//! This makes the split *invariant*: any input cut at any points yields the
//! same text per channel, in the same channel order, as the input whole.
//!
//! Recognised markers:
//! - `<think>` starts reasoning, `</think>` starts text. Stray extra tags
//!   (`<think>` while already reasoning, `</think>` while already in text)
//!   are removed and change nothing. Whitespace right after `</think>` is
//!   ordinary text.
//! - gpt-oss harmony: `<|channel|>analysis<|message|>` starts reasoning,
//!   `<|channel|>final<|message|>` starts text, and `<|start|>assistant`,
//!   `<|end|>` and `<|return|>` are removed. Other harmony markup (the
//!   `commentary` tool-call channel, `<|constrain|>`, `<|call|>`) is passed
//!   through as text: recognising it would need a parser, not a splitter.
//!
//! A `</think>` that closes thinking the splitter never saw open (models
//! whose template opens it in the prompt) can only be honoured when known in
//! advance: with `forced_open` the whole pre-tag text is reasoning. Without
//! it, text already emitted cannot be recalled, and holding all text back
//! until a `</think>` that may never come would destroy time to first token;
//! treating only the not-yet-emitted part of a chunk as reasoning would make
//! the result depend on chunk boundaries. So the pre-tag span is text, and
//! the phase for that span was shown as `responding`. Token counts are
//! unaffected: all channels count together.

use crate::decode::OutputChannel;

/// What a recognised marker does.
#[derive(Clone, Copy, Debug)]
enum Marker {
    /// Switch to this channel from here on.
    Enter(OutputChannel),
    /// Remove the marker, change nothing.
    Drop,
}

/// Every marker. No marker is a prefix of another, so at a given position
/// at most one can match and the first match is the only one.
const MARKERS: &[(&str, Marker)] = &[
    ("<think>", Marker::Enter(OutputChannel::Reasoning)),
    ("</think>", Marker::Enter(OutputChannel::Text)),
    (
        "<|channel|>analysis<|message|>",
        Marker::Enter(OutputChannel::Reasoning),
    ),
    (
        "<|channel|>final<|message|>",
        Marker::Enter(OutputChannel::Text),
    ),
    ("<|start|>assistant", Marker::Drop),
    ("<|end|>", Marker::Drop),
    ("<|return|>", Marker::Drop),
];

/// Lowercase substrings of model names whose chat template ends the prompt
/// with `<think>`, so the output starts inside the reasoning and shows only
/// the closing tag: DeepSeek-R1 and its distills (`deepseek-r1:7b`,
/// `DeepSeek-R1-Distill-Qwen-7B`, `..._r1_...` spellings are normalised),
/// QwQ, and names containing `thinking` (Qwen3 `*-Thinking-2507`). A model
/// in this list that emits `<think>` itself anyway is still handled: the
/// tag is a stray one and is removed.
const FORCED_OPEN_NAMES: &[&str] = &["deepseek-r1", "r1-distill", "qwq", "thinking"];

/// Streaming `<think>` splitter for one response.
#[derive(Clone, Debug)]
pub struct ThinkSplitter {
    /// The channel text goes to right now.
    channel: OutputChannel,
    /// A suffix of the input that may be the start of a marker, held back
    /// until more text decides it. Always starts with `<` and is shorter
    /// than the longest marker.
    held: String,
}

impl ThinkSplitter {
    /// `forced_open`: the model opens its thinking in the prompt template,
    /// so output is reasoning from the first byte until `</think>`.
    pub fn new(forced_open: bool) -> Self {
        Self {
            channel: if forced_open {
                OutputChannel::Reasoning
            } else {
                OutputChannel::Text
            },
            held: String::new(),
        }
    }

    /// True when a model name belongs to a family whose template forces
    /// thinking open. Case-insensitive, `_` and spaces read as `-`; the
    /// name matches when it contains `deepseek-r1`, `r1-distill`, `qwq` or
    /// `thinking` (DeepSeek-R1 and its distills, QwQ, Qwen3
    /// `*-Thinking-2507`). Matching a substring keeps Ollama tags
    /// (`deepseek-r1:7b`) and GGUF repository paths working.
    pub fn model_forces_open(model: &str) -> bool {
        let name: String = model
            .chars()
            .map(|c| match c {
                '_' | ' ' => '-',
                c => c.to_ascii_lowercase(),
            })
            .collect();
        FORCED_OPEN_NAMES.iter().any(|n| name.contains(n))
    }

    /// Splits visible text; pushes (channel, non-empty text) pieces in
    /// order. Holds back a suffix that could be the start of a marker.
    pub fn push(&mut self, text: &str, out: &mut Vec<(OutputChannel, String)>) {
        let floor = out.len();
        let mut buf = std::mem::take(&mut self.held);
        buf.push_str(text);
        let mut pending = String::new();
        let mut rest = buf.as_str();
        while let Some(lt) = rest.find('<') {
            pending.push_str(&rest[..lt]);
            let tail = &rest[lt..];
            match classify(tail) {
                Match::Marker(len, marker) => {
                    if let Marker::Enter(channel) = marker {
                        if channel != self.channel {
                            emit(out, floor, self.channel, std::mem::take(&mut pending));
                            self.channel = channel;
                        }
                    }
                    rest = &tail[len..];
                }
                Match::Undecided => {
                    self.held = tail.to_owned();
                    rest = "";
                    break;
                }
                Match::None => {
                    pending.push('<');
                    rest = &tail[1..];
                }
            }
        }
        pending.push_str(rest);
        emit(out, floor, self.channel, pending);
    }

    /// Flushes held-back text: at end of stream an unfinished marker is
    /// just text.
    pub fn finish(&mut self, out: &mut Vec<(OutputChannel, String)>) {
        let held = std::mem::take(&mut self.held);
        emit(out, out.len(), self.channel, held);
    }
}

/// Pushes a non-empty piece, merged with the previous one when that was
/// pushed by the same call (index `floor` or later) on the same channel.
/// Pieces the caller already had are left alone.
fn emit(
    out: &mut Vec<(OutputChannel, String)>,
    floor: usize,
    channel: OutputChannel,
    text: String,
) {
    if text.is_empty() {
        return;
    }
    let own_last = out.len() > floor;
    match out.last_mut() {
        Some((last, piece)) if own_last && *last == channel => piece.push_str(&text),
        _ => out.push((channel, text)),
    }
}

/// What the text at a `<` is.
enum Match {
    /// A whole marker of this byte length.
    Marker(usize, Marker),
    /// The text ends while still a prefix of some marker: wait for more.
    Undecided,
    /// No marker starts here.
    None,
}

fn classify(tail: &str) -> Match {
    let mut undecided = false;
    for &(tag, marker) in MARKERS {
        if tail.starts_with(tag) {
            return Match::Marker(tag.len(), marker);
        }
        if tag.starts_with(tail) {
            undecided = true;
        }
    }
    if undecided {
        Match::Undecided
    } else {
        Match::None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use OutputChannel::{Reasoning, Text};

    fn run(forced_open: bool, pieces: &[&str]) -> Vec<(OutputChannel, String)> {
        let mut s = ThinkSplitter::new(forced_open);
        let mut out = Vec::new();
        for p in pieces {
            s.push(p, &mut out);
        }
        s.finish(&mut out);
        out
    }

    /// Merges adjacent same-channel pieces (pieces from different pushes
    /// are separate) so results of different splits can be compared.
    fn merged(pieces: Vec<(OutputChannel, String)>) -> Vec<(OutputChannel, String)> {
        let mut out = Vec::new();
        for (c, t) in pieces {
            assert!(!t.is_empty(), "empty piece pushed");
            emit(&mut out, 0, c, t);
        }
        out
    }

    fn p(c: OutputChannel, t: &str) -> (OutputChannel, String) {
        (c, t.to_owned())
    }

    #[test]
    fn think_block_then_answer() {
        assert_eq!(
            run(false, &["<think>\nplan\n</think>\n\nHi!"]),
            vec![p(Reasoning, "\nplan\n"), p(Text, "\n\nHi!")]
        );
        assert_eq!(
            run(false, &["pre <think>r</think> post"]),
            vec![p(Text, "pre "), p(Reasoning, "r"), p(Text, " post")]
        );
    }

    #[test]
    fn tags_split_at_every_offset() {
        let input = "ab<think>reason é</think>answer <b>bold</b>";
        let expected = vec![
            p(Text, "ab"),
            p(Reasoning, "reason é"),
            p(Text, "answer <b>bold</b>"),
        ];
        assert_eq!(run(false, &[input]), expected);
        for (cut, _) in input.char_indices() {
            let out = run(false, &[&input[..cut], &input[cut..]]);
            assert_eq!(merged(out), expected, "cut at {cut}");
        }
        let chars: Vec<String> = input.chars().map(String::from).collect();
        let refs: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(merged(run(false, &refs)), expected);
    }

    #[test]
    fn partial_tag_is_held_back_until_decided() {
        let mut s = ThinkSplitter::new(false);
        let mut out = Vec::new();
        s.push("Hello </thi", &mut out);
        assert_eq!(out, vec![p(Text, "Hello ")]);
        s.push("s is not a tag", &mut out);
        assert_eq!(
            merged(out.clone()),
            vec![p(Text, "Hello </this is not a tag")]
        );
        out.clear();
        s.push("x<thi", &mut out);
        s.finish(&mut out);
        assert_eq!(out, vec![p(Text, "x"), p(Text, "<thi")]);
    }

    #[test]
    fn forced_open_makes_pre_tag_text_reasoning() {
        assert_eq!(
            run(true, &["Let me think.", "..</thi", "nk>\n\nAnswer"]),
            vec![
                p(Reasoning, "Let me think."),
                p(Reasoning, ".."),
                p(Text, "\n\nAnswer")
            ]
        );
        // A forced-open model that prints the opening tag anyway.
        assert_eq!(
            run(true, &["<think>r</think>a"]),
            vec![p(Reasoning, "r"), p(Text, "a")]
        );
        // Never closed: all reasoning.
        assert_eq!(
            run(true, &["still thinking"]),
            vec![p(Reasoning, "still thinking")]
        );
    }

    #[test]
    fn closing_tag_without_forced_open_stays_text() {
        // Documented limitation: emitted text cannot be recalled.
        assert_eq!(
            run(false, &["reasoning</think>answer"]),
            vec![p(Text, "reasoninganswer")]
        );
    }

    #[test]
    fn stray_tags_are_removed() {
        assert_eq!(
            run(false, &["<think><think>r</think></think>a<think></think>b"]),
            vec![p(Reasoning, "r"), p(Text, "ab")]
        );
        assert_eq!(run(false, &["<think></think>"]), vec![]);
        assert_eq!(
            run(false, &["a<think>r</think>b<think>s</think>c"]),
            vec![
                p(Text, "a"),
                p(Reasoning, "r"),
                p(Text, "b"),
                p(Reasoning, "s"),
                p(Text, "c")
            ]
        );
    }

    #[test]
    fn lookalikes_are_text() {
        assert_eq!(
            run(false, &["a < b <thinking> <THINK> <<think>x"]),
            vec![p(Text, "a < b <thinking> <THINK> <"), p(Reasoning, "x")]
        );
        assert_eq!(run(false, &["<"]), vec![p(Text, "<")]);
    }

    #[test]
    fn harmony_channels() {
        let input = "<|channel|>analysis<|message|>Need time.<|end|><|start|>assistant<|channel|>final<|message|>It is noon.<|return|>";
        let expected = vec![p(Reasoning, "Need time."), p(Text, "It is noon.")];
        assert_eq!(run(false, &[input]), expected);
        for cut in 0..=input.len() {
            assert_eq!(
                merged(run(false, &[&input[..cut], &input[cut..]])),
                expected
            );
        }
        // Other harmony channels pass through as text.
        assert_eq!(
            run(false, &["<|channel|>commentary x"]),
            vec![p(Text, "<|channel|>commentary x")]
        );
    }

    #[test]
    fn model_names_that_force_thinking_open() {
        for name in [
            "deepseek-r1:7b",
            "DeepSeek-R1-Distill-Qwen-7B",
            "hf.co/unsloth/DeepSeek-R1-Distill-Llama-8B-GGUF:Q4_K_M",
            "deepseek_r1",
            "QwQ-32B",
            "qwq:latest",
            "Qwen3-30B-A3B-Thinking-2507",
        ] {
            assert!(ThinkSplitter::model_forces_open(name), "{name}");
        }
        for name in [
            "qwen3:8b",
            "llama3.2",
            "deepseek-v3",
            "gpt-oss:20b",
            "SmolLM2-135M-Instruct",
            "",
        ] {
            assert!(!ThinkSplitter::model_forces_open(name), "{name}");
        }
    }

    /// Per-channel concatenation and the order of channel changes.
    fn summary(pieces: &[(OutputChannel, String)]) -> (String, String, Vec<OutputChannel>) {
        let mut text = String::new();
        let mut reasoning = String::new();
        let mut order: Vec<OutputChannel> = Vec::new();
        for (c, t) in pieces {
            match c {
                Text => text.push_str(t),
                Reasoning => reasoning.push_str(t),
                OutputChannel::ToolArguments => unreachable!("splitter never emits tool args"),
            }
            if order.last() != Some(c) {
                order.push(*c);
            }
        }
        (text, reasoning, order)
    }

    fn vocabulary() -> impl Strategy<Value = &'static str> {
        prop_oneof![
            Just("<think>"),
            Just("</think>"),
            Just("<"),
            Just("</"),
            Just("<th"),
            Just("ink>"),
            Just("think>"),
            Just(">"),
            Just("a"),
            Just("é"),
            Just("🦀"),
            Just("\n"),
            Just(" "),
            Just("<|channel|>analysis<|message|>"),
            Just("<|channel|>final<|message|>"),
            Just("<|channel|>"),
            Just("<|"),
            Just("final"),
            Just("<|message|>"),
            Just("<|end|>"),
            Just("<|start|>assistant"),
            Just("<|return|>"),
        ]
    }

    proptest! {
        #[test]
        fn splitting_anywhere_changes_nothing(
            parts in proptest::collection::vec(vocabulary(), 0..30),
            cuts in proptest::collection::vec(0usize..300, 0..10),
            forced_open in any::<bool>(),
        ) {
            let input: String = parts.concat();
            let mut cuts: Vec<usize> = cuts
                .into_iter()
                .map(|c| {
                    let mut c = c.min(input.len());
                    while !input.is_char_boundary(c) {
                        c -= 1;
                    }
                    c
                })
                .collect();
            cuts.sort_unstable();
            let mut pieces = Vec::new();
            let mut start = 0;
            for &c in &cuts {
                pieces.push(&input[start..c]);
                start = c;
            }
            pieces.push(&input[start..]);
            let whole = run(forced_open, &[&input]);
            let split = run(forced_open, &pieces);
            prop_assert!(split.iter().all(|(_, t)| !t.is_empty()));
            prop_assert_eq!(summary(&split), summary(&whole));
        }
    }
}
