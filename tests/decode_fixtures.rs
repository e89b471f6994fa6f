//! The decoders against every real capture in `tests/fixtures/real`
//! (llama-server and llama-cpp-python), through the public API only:
//! `detect_request` + `detect_framing` + `StreamDecoder`.
//!
//! The expectations below were written by reading each capture (its
//! `response.txt`, and the `usage`/`timings` its `index.json` row reports),
//! not by recording what the decoder prints. On top of them, the decoded
//! text is compared with an independent, naive reading of the same body
//! (`support::decode_capture::reference`).
//!
//! Then the split invariance: whatever the read boundaries (the real ones
//! from `chunks.jsonl`, every two-piece cut, random multi-piece cuts), the
//! events are the same as for the body fed whole, once adjacent output
//! pieces of one channel are merged.

use crate::util::decode_capture as capture;

use std::collections::BTreeSet;

use capture::{index_timings, index_usage, load_all, pieces, reference, Capture, Lcg};
use speedtap::decode::{OutputChannel, Usage};
use speedtap::model::ApiKind;

/// What one capture must decode to.
struct Expect {
    /// `set/name`.
    id: &'static str,
    api: ApiKind,
    streamed: bool,
    /// Non-empty output events (body fed whole).
    outputs: usize,
    /// The visible text starts with this (read from the capture); empty
    /// means no visible text at all.
    text_prefix: &'static str,
    /// The whole tool-call channel (names and arguments).
    tool: &'static str,
    usage: Option<Usage>,
    /// Server timings events; when > 0 the merged timings must equal the
    /// index row's `timings`.
    timings_events: usize,
    done: bool,
    error: Option<&'static str>,
}

const SEA: &str = "The sea is a vast and mysterious realm, teeming with life";
const SEA_COMPLETION: &str = " a place of endless possibilities, where the boundaries of what's";
const CALL: &str = "get_weather{\n    \"city\": \"Paris\"\n}";
const LIGHTHOUSE: &str = "The story of a lighthouse keeper is a tale of resilience";
const NUMBERED_SEA: &str = "1. The sea is a vast and mysterious realm";
const SEA_REALITY: &str = " a place of endless possibilities, where the boundaries between reality";
const TOOL_RESPONSE: &str =
    "<tool_response>\n{\"temp_c\": 18, \"sky\": \"sunny\"}\n</tool_response>";
const TWO_CALLS: &str =
    "get_weather{\n    \"city\": \"Paris\"\n}get_weather{\n    \"city\": \"Paris\"\n}";

const fn u(output: u64, input: u64, cached: Option<u64>) -> Option<Usage> {
    Some(Usage {
        output_tokens: Some(output),
        input_tokens: Some(input),
        reasoning_tokens: None,
        cached_input_tokens: cached,
    })
}

/// Not an LLM call: nothing decoded at all.
const fn unmetered(id: &'static str, streamed: bool) -> Expect {
    Expect {
        id,
        api: ApiKind::Unknown,
        streamed,
        outputs: 0,
        text_prefix: "",
        tool: "",
        usage: None,
        timings_events: 0,
        done: false,
        error: None,
    }
}

/// An error reply: one `Error`, nothing else.
const fn error(id: &'static str, api: ApiKind, message: &'static str) -> Expect {
    Expect {
        id,
        api,
        streamed: false,
        outputs: 0,
        text_prefix: "",
        tool: "",
        usage: None,
        timings_events: 0,
        done: false,
        error: Some(message),
    }
}

/// A successful generation.
#[allow(clippy::too_many_arguments)]
const fn ok(
    id: &'static str,
    api: ApiKind,
    streamed: bool,
    outputs: usize,
    text_prefix: &'static str,
    tool: &'static str,
    usage: Option<Usage>,
    timings_events: usize,
) -> Expect {
    Expect {
        id,
        api,
        streamed,
        outputs,
        text_prefix,
        tool,
        usage,
        timings_events,
        done: true,
        error: None,
    }
}

/// One row per capture. `ok(id, api, streamed, outputs, text prefix,
/// tool text, usage, timings events)`; usage is `u(output, input, cached)`.
#[rustfmt::skip]
fn expectations() -> Vec<Expect> {
    use ApiKind::*;
    const S: bool = true; // streamed
    const J: bool = false; // one JSON body
    vec![
        // ---- llama-server ----
        unmetered("llama-server/anthropic_count_tokens", J),
        // Anthropic input = input_tokens (1, the uncached part) + cache_read (37).
        ok("llama-server/anthropic_messages_nonstream", AnthropicMessages, J, 1, SEA, "", u(47, 38, Some(37)), 0),
        ok("llama-server/anthropic_messages_stream", AnthropicMessages, S, 46, SEA, "", u(47, 38, Some(37)), 0),
        // The tool name from content_block_start + 8 input_json_delta pieces.
        ok("llama-server/anthropic_messages_tools_stream", AnthropicMessages, S, 9, "", CALL, u(29, 211, Some(210)), 0),
        unmetered("llama-server/chat_input_tokens", J),
        ok("llama-server/chat_nonstream", OpenaiChat, J, 1, SEA, "", u(47, 38, Some(37)), 1),
        // No include_usage: no usage at all, timings on the finish chunk.
        ok("llama-server/chat_stream", OpenaiChat, S, 46, SEA, "", None, 1),
        ok("llama-server/chat_stream_200tok", OpenaiChat, S, 200, LIGHTHOUSE, "", u(200, 40, Some(24)), 1),
        ok("llama-server/chat_stream_context_full", OpenaiChat, S, 216, LIGHTHOUSE, "", u(216, 40, Some(0)), 1),
        ok("llama-server/chat_stream_include_usage", OpenaiChat, S, 46, SEA, "", u(47, 38, Some(37)), 1),
        ok("llama-server/chat_stream_long_prompt", OpenaiChat, S, 28, "The lighthouse keeper's actions in the log", "", u(29, 910, Some(0)), 1),
        ok("llama-server/chat_stream_no_prompt_cache", OpenaiChat, S, 46, SEA, "", u(47, 38, Some(0)), 1),
        ok("llama-server/chat_stream_stop_natural", OpenaiChat, S, 2, "Hello.", "", u(3, 36, Some(24)), 1),
        // timings_per_token: the 16 content chunks and the usage chunk carry timings.
        ok("llama-server/chat_stream_timings_per_token", OpenaiChat, S, 16, SEA, "", u(16, 38, Some(24)), 17),
        // 25 content deltas, but "</" (a prefix of `</think>`) is held back by
        // the think splitter and leaves together with the next delta "tool": 24.
        ok("llama-server/chat_tools_followup_stream", OpenaiChat, S, 24, TOOL_RESPONSE, "", u(29, 274, Some(215)), 1),
        ok("llama-server/chat_tools_nonstream", OpenaiChat, J, 1, "", CALL, u(29, 211, Some(210)), 1),
        // The name and the first argument fragment share a delta: 8 pieces.
        ok("llama-server/chat_tools_stream", OpenaiChat, S, 8, "", CALL, u(29, 211, Some(0)), 1),
        ok("llama-server/chat_tools_stream_two_calls_length", OpenaiChat, S, 16, "", TWO_CALLS, u(64, 211, Some(210)), 1),
        ok("llama-server/chat_tools_unsupported_template_stream", OpenaiChat, S, 64, "Paris, the City of Light", "", u(64, 37, Some(24)), 1),
        ok("llama-server/completions_nonstream", OpenaiCompletions, J, 1, SEA_COMPLETION, "", u(32, 3, Some(2)), 1),
        ok("llama-server/completions_stream", OpenaiCompletions, S, 32, SEA_COMPLETION, "", u(32, 3, Some(0)), 1),
        ok("llama-server/completions_stream_include_usage", OpenaiCompletions, S, 32, SEA_COMPLETION, "", u(32, 3, Some(2)), 1),
        ok("llama-server/concurrent_a_stream", OpenaiChat, S, 46, SEA, "", u(47, 38, Some(0)), 1),
        ok("llama-server/concurrent_b_stream", OpenaiChat, S, 37, "The majestic peaks of the Himalayas", "", u(38, 37, Some(0)), 1),
        error("llama-server/error_bad_json_chat", OpenaiChat, "server_error"),
        error("llama-server/error_context_overflow_stream", OpenaiChat, "exceed_context_size_error"),
        error("llama-server/error_missing_messages", OpenaiChat, "invalid_request_error"),
        // An unknown model is accepted: a normal 8-token stream, no usage asked.
        ok("llama-server/error_unknown_model_chat_stream", OpenaiChat, S, 8, "The sea is a vast and mysterious realm", "", None, 1),
        unmetered("llama-server/error_unknown_path", J),
        unmetered("llama-server/health", J),
        unmetered("llama-server/metrics", J),
        ok("llama-server/native_completion_nonstream", LlamacppCompletion, J, 1, SEA_COMPLETION, "", u(32, 3, None), 1),
        ok("llama-server/native_completion_stream", LlamacppCompletion, S, 32, SEA_COMPLETION, "", u(32, 3, None), 1),
        // timings_per_token: the 16 token events and the stop event.
        ok("llama-server/native_completion_stream_timings_per_token", LlamacppCompletion, S, 16, SEA_COMPLETION, "", u(16, 3, None), 17),
        unmetered("llama-server/props", J),
        ok("llama-server/responses_nonstream", OpenaiResponses, J, 1, SEA, "", u(47, 38, Some(37)), 0),
        ok("llama-server/responses_stream", OpenaiResponses, S, 46, SEA, "", u(47, 38, Some(37)), 1),
        // Two function_call items: 2 names + 16 argument deltas.
        ok("llama-server/responses_tools_stream", OpenaiResponses, S, 18, "", TWO_CALLS, u(64, 211, Some(210)), 1),
        unmetered("llama-server/slots", J),
        unmetered("llama-server/tokenize", J),
        unmetered("llama-server/v1_models", J),
        // ---- llama-cpp-python ----
        error("llama-cpp-python/anthropic_messages_stream", AnthropicMessages, "Not Found"),
        ok("llama-cpp-python/chat_nonstream", OpenaiChat, J, 1, NUMBERED_SEA, "", u(63, 38, None), 0),
        // No usage and no timings in its streams, even with include_usage.
        ok("llama-cpp-python/chat_stream", OpenaiChat, S, 63, NUMBERED_SEA, "", None, 0),
        ok("llama-cpp-python/chat_stream_include_usage", OpenaiChat, S, 63, NUMBERED_SEA, "", None, 0),
        ok("llama-cpp-python/completions_nonstream", OpenaiCompletions, J, 1, SEA_REALITY, "", u(32, 3, None), 0),
        ok("llama-cpp-python/completions_stream", OpenaiCompletions, S, 32, SEA_REALITY, "", None, 0),
        ok("llama-cpp-python/completions_stream_200tok", OpenaiCompletions, S, 200, " named Captain Jameson had a daughter named Elizabeth", "", None, 0),
        // 500 text/plain "Internal Server Error": not a framing that is decoded.
        Expect { api: OpenaiChat, ..unmetered("llama-cpp-python/error_bad_json_chat", J) },
        // 200 event-stream with an empty body: no event, and no Done.
        Expect { api: OpenaiChat, ..unmetered("llama-cpp-python/error_context_overflow_stream", S) },
        // Not rejected: the model generates from an empty conversation.
        ok("llama-cpp-python/error_missing_messages", OpenaiChat, S, 154, "I've always been passionate about music", "", None, 0),
        ok("llama-cpp-python/error_unknown_model_chat_stream", OpenaiChat, S, 8, "1. The sea is a vast and", "", None, 0),
        unmetered("llama-cpp-python/health", J),
        error("llama-cpp-python/responses_stream", OpenaiResponses, "Not Found"),
        unmetered("llama-cpp-python/tokenize_count", J),
        unmetered("llama-cpp-python/v1_models", J),
    ]
}

fn expectation<'a>(all: &'a [Expect], c: &Capture) -> &'a Expect {
    all.iter()
        .find(|e| e.id == c.id)
        .unwrap_or_else(|| panic!("no expectation written for {}", c.id))
}

#[test]
fn every_capture_has_an_expectation() {
    let captures: BTreeSet<String> = load_all().into_iter().map(|c| c.id).collect();
    let expected: BTreeSet<String> = expectations().iter().map(|e| e.id.to_owned()).collect();
    assert_eq!(captures, expected);
    assert_eq!(captures.len(), 56);
}

#[test]
fn captures_decode_to_what_they_say() {
    let all = expectations();
    for c in load_all() {
        let e = expectation(&all, &c);
        let id = &c.id;
        assert_eq!(
            c.status,
            c.index["status"].as_u64().unwrap() as u16,
            "{id}: head vs index"
        );
        assert_eq!(c.facts().api, e.api, "{id}: api");
        let d = c.decode_whole();
        assert_eq!(d.streamed, e.streamed, "{id}: streamed");
        assert_eq!(d.unparsed, 0, "{id}: unparsed messages");

        // Output.
        assert_eq!(d.outputs(), e.outputs, "{id}: output events");
        let text = d.text(OutputChannel::Text);
        assert!(
            text.starts_with(e.text_prefix),
            "{id}: text starts {:?}",
            &text[..text.len().min(80)]
        );
        assert_eq!(
            text.is_empty(),
            e.text_prefix.is_empty(),
            "{id}: text presence"
        );
        assert_eq!(
            d.text(OutputChannel::ToolArguments),
            e.tool,
            "{id}: tool channel"
        );
        assert_eq!(
            d.text(OutputChannel::Reasoning),
            "",
            "{id}: no reasoning in these captures"
        );
        if e.api != ApiKind::Unknown && e.outputs > 0 {
            let body = String::from_utf8(c.body.clone()).expect("utf-8 body");
            let r = reference(e.api, e.streamed, &body);
            assert_eq!(text, r.text, "{id}: text vs independent reading");
            assert_eq!(
                d.text(OutputChannel::ToolArguments),
                r.tool,
                "{id}: tool vs independent reading"
            );
            if !e.id.ends_with("chat_tools_followup_stream") {
                assert_eq!(
                    d.outputs(),
                    r.pieces,
                    "{id}: one output per non-empty piece"
                );
            }
        }

        // Receipts.
        assert_eq!(d.usage(), e.usage, "{id}: usage");
        if let Some(index) =
            index_usage(e.api, &c.index["usage"]).filter(|_| e.api != ApiKind::Unknown)
        {
            let got = d.usage().unwrap_or_default();
            let pairs = [
                (index.output_tokens, got.output_tokens),
                (index.input_tokens, got.input_tokens),
                (index.cached_input_tokens, got.cached_input_tokens),
            ];
            for (want, have) in pairs {
                if want.is_some() {
                    assert_eq!(have, want, "{id}: usage vs index.json");
                }
            }
        }
        assert_eq!(
            d.timings_events().len(),
            e.timings_events,
            "{id}: timings events"
        );
        if e.timings_events > 0 {
            assert_eq!(
                d.timings(),
                index_timings(&c.index["timings"]),
                "{id}: timings vs index.json"
            );
        }

        // End.
        assert_eq!(d.dones(), usize::from(e.done), "{id}: Done");
        if e.done {
            assert_eq!(
                d.events.last(),
                Some(&speedtap::decode::StreamEvent::Done),
                "{id}: Done last"
            );
        }
        assert_eq!(
            d.errors(),
            e.error.into_iter().collect::<Vec<_>>(),
            "{id}: errors"
        );
    }
}

#[test]
fn running_timings_grow_with_each_token() {
    for c in load_all()
        .iter()
        .filter(|c| c.name.contains("timings_per_token"))
    {
        let d = c.decode_whole();
        let generated: Vec<u64> = d
            .timings_events()
            .iter()
            .map(|t| t.generated_tokens.expect("predicted_n"))
            .collect();
        assert!(
            generated.windows(2).all(|w| w[0] <= w[1]),
            "{}: {generated:?}",
            c.id
        );
        assert_eq!(generated.first(), Some(&1), "{}", c.id);
        // The first token's 0.001 ms is a placeholder, not a duration.
        assert_eq!(d.timings_events()[0].generation_ms, None, "{}", c.id);
        assert!(d.timings_events()[1].generation_ms.is_some(), "{}", c.id);
    }
}

#[test]
fn real_read_boundaries_give_the_same_events() {
    for c in load_all() {
        assert_eq!(
            c.reads.concat(),
            c.body,
            "{}: chunks.jsonl rebuilds the body",
            c.id
        );
        let whole = c.decode_whole().normalised();
        let replay = c
            .decode_pieces(c.reads.iter().map(Vec::as_slice))
            .normalised();
        assert_eq!(replay, whole, "{}", c.id);
    }
}

/// The cut offsets for the two-piece test. Every offset of every capture
/// would be ~12 GB of decoding in a debug build (minutes on two cores), so:
/// every offset in the first and last [`EDGE`] bytes (the role chunk, first
/// tokens, several whole messages and every position inside them, then the
/// finish, usage and `[DONE]` tail), every offset within 4 bytes of a
/// non-ASCII byte (UTF-8 sequences cut in two), and every [`STRIDE`]th
/// offset in between (a prime, so the cut walks through all positions of
/// the repeating token messages). Most captures are shorter than
/// 2 × `EDGE` and so are cut at every byte.
const EDGE: usize = 1024;
const STRIDE: usize = 101;

fn two_piece_offsets(body: &[u8]) -> impl Iterator<Item = usize> + '_ {
    let near_non_ascii = |k: usize| {
        body[k.saturating_sub(4)..(k + 4).min(body.len())]
            .iter()
            .any(|b| !b.is_ascii())
    };
    (1..body.len()).filter(move |&k| {
        k < EDGE || k > body.len().saturating_sub(EDGE) || k % STRIDE == 0 || near_non_ascii(k)
    })
}

#[test]
fn two_piece_splits_give_the_same_events() {
    let captures = load_all();
    // Two threads: the machine has two cores and this is the slow test.
    let (a, b) = captures.split_at(captures.len() / 2);
    std::thread::scope(|s| {
        for half in [a, b] {
            s.spawn(move || {
                for c in half {
                    let whole = c.decode_whole().normalised();
                    for at in two_piece_offsets(&c.body) {
                        let (x, y) = c.body.split_at(at);
                        let split = c.decode_pieces([x, y]).normalised();
                        assert!(split == whole, "{}: split at byte {at}", c.id);
                    }
                }
            });
        }
    });
}

#[test]
fn random_multi_splits_give_the_same_events() {
    let mut rng = Lcg(0x5eed_cafe);
    for c in load_all() {
        let whole = c.decode_whole().normalised();
        let one_by_one = c.decode_pieces(c.body.chunks(1)).normalised();
        assert_eq!(one_by_one, whole, "{}: byte by byte", c.id);
        for round in 0..24 {
            let max_piece = [2, 3, 7, 16, 64, 300][round % 6];
            let cuts = rng.cuts(c.body.len(), max_piece);
            let split = c.decode_pieces(pieces(&c.body, &cuts)).normalised();
            assert!(split == whole, "{}: cuts {cuts:?}", c.id);
        }
    }
}
