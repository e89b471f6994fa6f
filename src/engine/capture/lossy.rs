//! Loss forced on purpose: every protocol's call played through a packet
//! source that drops, duplicates and reorders segments at a seeded rate,
//! and the honesty rules checked on what settles.
//!
//! Each trial is one call on its own connection, written as a real
//! loopback conversation: handshake, the request in 1,000-byte segments
//! (its `model` last, as the `openai` SDK writes it), the server's ACK, the
//! response head and one chunk per token each ACKed by the client, and the
//! closing FINs. Then the clients are done: the kernel's socket table says
//! the connection is gone, and time moves on tick by tick (an injected
//! clock; nothing sleeps). For every trial:
//!
//! - the call settles (none is left in flight), at most once;
//! - its count is at or below the truth (nothing counted twice);
//! - a call with lost bytes is flagged `capture_gap` and shows no rate;
//! - a call with no flag is exact: the server's count and the right model;
//! - a model shown is the one the client asked for.

use std::sync::atomic::Ordering;

use super::rig::{Rig, SERVER};
use super::{QUIET, TICK};
use crate::capture::flows::script::Talk;
use crate::capture::packet::Segment;
use crate::model::{ApiKind, Call, CallStatus};

/// Output tokens of every response: enough for a timed rate.
const TOKENS: usize = 30;
/// Words o200k reads as one token each, so an estimate of the text seen
/// is an honest lower bound of the server's count.
const WORDS: [&str; 10] = [
    " the", " of", " and", " to", " in", " is", " it", " that", " was", " for",
];

/// One protocol's call: its request and the response's events.
struct Proto {
    api: ApiKind,
    path: &'static str,
    /// The request body, `model` last.
    body: String,
    content_type: &'static str,
    /// The response body's events, one per write (the first opens the
    /// stream, the last ends it).
    events: Vec<String>,
}

/// A long prompt, so the request takes several segments.
fn prompt() -> String {
    "lorem ipsum ".repeat(300)
}

fn sse(data: &str) -> String {
    format!("data: {data}\n\n")
}

fn named(event: &str, data: &str) -> String {
    format!("event: {event}\ndata: {data}\n\n")
}

fn openai(api: ApiKind) -> Proto {
    let chat = api == ApiKind::OpenaiChat;
    let (path, object, input) = if chat {
        let messages = format!(r#""messages":[{{"role":"user","content":"{}"}}]"#, prompt());
        ("/v1/chat/completions", "chat.completion.chunk", messages)
    } else {
        (
            "/v1/completions",
            "text_completion",
            format!(r#""prompt":"{}""#, prompt()),
        )
    };
    let choice = |w: &str| {
        if chat {
            format!(r#"{{"index":0,"delta":{{"content":"{w}"}},"finish_reason":null}}"#)
        } else {
            format!(r#"{{"index":0,"text":"{w}","finish_reason":null}}"#)
        }
    };
    let chunk = |choices: String, extra: &str| {
        sse(&format!(
            r#"{{"id":"c1","object":"{object}","created":1,"model":"m","choices":[{choices}]{extra}}}"#
        ))
    };
    let mut events: Vec<String> = tokens().map(|w| chunk(choice(w), "")).collect();
    events.push(chunk(
        String::new(),
        r#","usage":{"prompt_tokens":7,"completion_tokens":30,"total_tokens":37}"#,
    ));
    events.push(sse("[DONE]"));
    Proto {
        api,
        path,
        body: format!(
            r#"{{{input},"stream":true,"stream_options":{{"include_usage":true}},"model":"m"}}"#
        ),
        content_type: "text/event-stream",
        events,
    }
}

fn responses() -> Proto {
    let mut events = vec![named(
        "response.created",
        r#"{"type":"response.created","response":{"id":"r","model":"m","status":"in_progress"}}"#,
    )];
    events.extend(tokens().map(|w| {
        named(
            "response.output_text.delta",
            &format!(
                r#"{{"type":"response.output_text.delta","item_id":"m1","output_index":0,"content_index":0,"delta":"{w}"}}"#
            ),
        )
    }));
    events.push(named(
        "response.completed",
        r#"{"type":"response.completed","response":{"id":"r","model":"m","status":"completed","usage":{"input_tokens":7,"output_tokens":30,"total_tokens":37}}}"#,
    ));
    Proto {
        api: ApiKind::OpenaiResponses,
        path: "/v1/responses",
        body: format!(r#"{{"input":"{}","stream":true,"model":"m"}}"#, prompt()),
        content_type: "text/event-stream",
        events,
    }
}

fn anthropic() -> Proto {
    let mut events = vec![
        named(
            "message_start",
            r#"{"type":"message_start","message":{"id":"msg","type":"message","role":"assistant","model":"m","content":[],"usage":{"input_tokens":7,"output_tokens":0}}}"#,
        ),
        named(
            "content_block_start",
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
        ),
    ];
    events.extend(tokens().map(|w| {
        named(
            "content_block_delta",
            &format!(
                r#"{{"type":"content_block_delta","index":0,"delta":{{"type":"text_delta","text":"{w}"}}}}"#
            ),
        )
    }));
    events.push(named(
        "content_block_stop",
        r#"{"type":"content_block_stop","index":0}"#,
    ));
    events.push(named(
        "message_delta",
        r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":30}}"#,
    ));
    events.push(named("message_stop", r#"{"type":"message_stop"}"#));
    Proto {
        api: ApiKind::AnthropicMessages,
        path: "/v1/messages",
        body: format!(
            r#"{{"messages":[{{"role":"user","content":"{}"}}],"max_tokens":100,"stream":true,"model":"m"}}"#,
            prompt()
        ),
        content_type: "text/event-stream",
        events,
    }
}

fn ollama(api: ApiKind) -> Proto {
    let chat = api == ApiKind::OllamaChat;
    let piece = |w: &str| {
        if chat {
            format!(r#""message":{{"role":"assistant","content":"{w}"}}"#)
        } else {
            format!(r#""response":"{w}""#)
        }
    };
    let mut events: Vec<String> = tokens()
        .map(|w| format!("{{\"model\":\"m\",{},\"done\":false}}\n", piece(w)))
        .collect();
    events.push(format!(
        "{{\"model\":\"m\",{},\"done\":true,\"done_reason\":\"stop\",\"prompt_eval_count\":7,\"eval_count\":30}}\n",
        piece("")
    ));
    let (path, input) = if chat {
        let messages = format!(r#""messages":[{{"role":"user","content":"{}"}}]"#, prompt());
        ("/api/chat", messages)
    } else {
        ("/api/generate", format!(r#""prompt":"{}""#, prompt()))
    };
    Proto {
        api,
        path,
        body: format!(r#"{{{input},"stream":true,"model":"m"}}"#),
        content_type: "application/x-ndjson",
        events,
    }
}

fn llamacpp() -> Proto {
    let mut events: Vec<String> = tokens()
        .enumerate()
        .map(|(i, w)| {
            sse(&format!(
                r#"{{"content":"{w}","stop":false,"id_slot":0,"tokens_predicted":{}}}"#,
                i + 1
            ))
        })
        .collect();
    events.push(sse(
        r#"{"content":"","stop":true,"model":"m","tokens_predicted":30,"tokens_evaluated":7,"stop_type":"eos"}"#,
    ));
    Proto {
        api: ApiKind::LlamacppCompletion,
        path: "/completion",
        body: format!(r#"{{"prompt":"{}","stream":true,"model":"m"}}"#, prompt()),
        content_type: "text/event-stream",
        events,
    }
}

fn tgi() -> Proto {
    let events = tokens()
        .enumerate()
        .map(|(i, w)| {
            let last = i + 1 == TOKENS;
            let (text, details) = if last {
                (
                    r#""all""#,
                    r#"{"finish_reason":"eos_token","generated_tokens":30,"seed":null}"#,
                )
            } else {
                ("null", "null")
            };
            format!(
                "data:{{\"index\":{i},\"token\":{{\"id\":1,\"text\":\"{w}\",\"logprob\":0.0,\"special\":false}},\"generated_text\":{text},\"details\":{details}}}\n\n"
            )
        })
        .collect();
    Proto {
        api: ApiKind::TgiGenerate,
        path: "/generate_stream",
        body: format!(
            r#"{{"inputs":"{}","parameters":{{"max_new_tokens":30}},"model":"m"}}"#,
            prompt()
        ),
        content_type: "text/event-stream",
        events,
    }
}

fn tokens() -> impl Iterator<Item = &'static str> {
    (0..TOKENS).map(|i| WORDS[i % WORDS.len()])
}

/// The 8 protocols.
fn protocols() -> Vec<Proto> {
    vec![
        openai(ApiKind::OpenaiChat),
        openai(ApiKind::OpenaiCompletions),
        responses(),
        anthropic(),
        ollama(ApiKind::OllamaChat),
        ollama(ApiKind::OllamaGenerate),
        llamacpp(),
        tgi(),
    ]
}

/// One segment of the conversation and the milliseconds since the last.
type Step = (Segment, u64);

/// The whole conversation of one call, as the wire carries it. `chunked`
/// picks the response's framing (chunked, or Content-Length).
fn conversation(p: &Proto, client: &str, chunked: bool) -> Vec<Step> {
    let mut talk = Talk::new(client, SERVER, 4_000_000_000, 9_000);
    let mut steps: Vec<Step> = talk.handshake().into_iter().map(|s| (s, 0)).collect();
    let request = format!(
        "POST {} HTTP/1.1\r\nHost: 127.0.0.1:11434\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{}",
        p.path,
        p.body.len(),
        p.body
    );
    for piece in request.as_bytes().chunks(1_000) {
        steps.push((talk.client(piece), 0));
    }
    steps.push((talk.server(b""), 1));
    let framing = if chunked {
        "Transfer-Encoding: chunked".to_owned()
    } else {
        format!("Content-Length: {}", p.events.concat().len())
    };
    let head = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: {}\r\n{framing}\r\n\r\n",
        p.content_type
    );
    steps.push((talk.server(head.as_bytes()), 100));
    steps.push((talk.client(b""), 0));
    for event in &p.events {
        let write = if chunked {
            format!("{:x}\r\n{event}\r\n", event.len())
        } else {
            event.clone()
        };
        steps.push((talk.server(write.as_bytes()), 50));
        steps.push((talk.client(b""), 0));
    }
    if chunked {
        steps.push((talk.server(b"0\r\n\r\n"), 1));
        steps.push((talk.client(b""), 0));
    }
    steps.push((talk.fin(true), 1));
    steps.push((talk.fin(false), 0));
    steps.push((talk.client(b""), 0));
    steps
}

/// A tiny seeded generator (xorshift64): the same loss every run.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// True with probability `per_mille` / 1000.
    fn chance(&mut self, per_mille: u64) -> bool {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % 1_000 < per_mille
    }
}

/// The conversation as a lossy packet source gives it: each segment
/// dropped, duplicated, or swapped with the next at `per_mille` each.
/// Returns the segments and whether any was dropped.
fn lossy(steps: Vec<Step>, per_mille: u64, rng: &mut Rng) -> (Vec<Step>, bool) {
    let mut out: Vec<Step> = Vec::with_capacity(steps.len());
    let mut dropped = false;
    let mut steps = steps.into_iter().peekable();
    while let Some(step) = steps.next() {
        if rng.chance(per_mille) {
            dropped = true;
            continue;
        }
        if rng.chance(per_mille) {
            out.push(step.clone());
        }
        if rng.chance(per_mille) {
            if let Some(next) = steps.next() {
                out.push(next);
            }
        }
        out.push(step);
    }
    (out, dropped)
}

/// Plays one trial and returns the call it settled, if one started.
async fn trial(rig: &mut Rig, steps: Vec<Step>) -> Option<Call> {
    let started = rig.task.calls_started();
    rig.sockets_gone.store(false, Ordering::Relaxed);
    play(rig, steps);
    // The clients are done: the kernel lists none of their sockets. Time
    // moves on until every wait (a hole, a quiet flow) has run out.
    rig.sockets_gone.store(true, Ordering::Relaxed);
    let mut now = rig.now();
    let until = now + QUIET * 3;
    while now < until {
        now += TICK;
        rig.task.tick(now);
    }
    assert!(rig.task.flows.is_empty(), "no flow lingers");
    // Settled (within seconds, or the test fails): not in flight.
    match rig.task.calls_started() - started {
        0 => None,
        1 => Some(rig.settled().await),
        n => panic!("{n} calls started for one exchange"),
    }
}

/// Feeds the segments, ticking every [`TICK`] of packet time between them
/// as the task's loop does while a call is in flight.
fn play(rig: &mut Rig, steps: Vec<Step>) {
    let mut next_tick = rig.now() + TICK;
    for (seg, after_ms) in steps {
        rig.feed(seg, after_ms);
        while rig.now() >= next_tick {
            rig.task.tick(next_tick);
            next_tick += TICK;
        }
    }
}

/// Checks one settled call against the truth; `lost` says whether any
/// segment was dropped.
fn check(call: &Call, p: &Proto, lost: bool, what: &str) {
    let speed = call.speed.as_ref();
    let count = speed.map_or(0, |s| s.output_tokens);
    assert!(
        count <= TOKENS as u64,
        "{what}: counted {count} of {TOKENS}: {call:?}"
    );
    assert_eq!(call.identity.api, p.api, "{what}");
    if let Some(model) = &call.identity.model {
        assert_eq!(model, "m", "{what}: a model the client asked for");
    }
    if call.details.capture_gap {
        assert_eq!(
            speed.and_then(|s| s.output_tokens_per_second),
            None,
            "{what}: a gap shows no rate"
        );
    } else {
        assert_eq!(call.status, CallStatus::Ok, "{what}: {call:?}");
        assert_eq!(count, TOKENS as u64, "{what}: an unflagged call is exact");
        assert_eq!(call.identity.model.as_deref(), Some("m"), "{what}");
    }
    if !lost {
        assert!(!call.details.capture_gap, "{what}: nothing was lost");
    }
}

/// Runs `trials` calls of every protocol at `per_mille` loss; returns how
/// many lost packets and how many settled with a gap, for the caller to
/// check the loss was really exercised.
async fn run(per_mille: u64, trials: u64) -> (u64, u64) {
    let mut rig = Rig::new().await;
    let (mut lost_trials, mut gaps) = (0, 0);
    let mut port = 20_000u16;
    for (n, p) in protocols().iter().enumerate() {
        for seed in 0..trials {
            port += 1;
            let chunked = (seed + n as u64) % 2 == 0;
            let mut rng = Rng::new(seed * 31 + n as u64 + per_mille * 1_000);
            let steps = conversation(p, &format!("127.0.0.1:{port}"), chunked);
            let (steps, lost) = lossy(steps, per_mille, &mut rng);
            lost_trials += u64::from(lost);
            let what = format!("{:?} seed {seed} at {per_mille}‰", p.api);
            if let Some(call) = trial(&mut rig, steps).await {
                gaps += u64::from(call.details.capture_gap);
                check(&call, p, lost, &what);
            } else {
                assert!(lost, "{what}: a clean call always starts");
            }
        }
    }
    (lost_trials, gaps)
}

#[actix::test]
async fn every_protocol_without_loss_is_counted_exactly_with_its_rate_and_model() {
    let mut rig = Rig::new().await;
    for (i, p) in protocols().iter().enumerate() {
        for chunked in [true, false] {
            let client = format!("127.0.0.1:{}", 30_000 + 2 * i + usize::from(chunked));
            let call = trial(&mut rig, conversation(p, &client, chunked))
                .await
                .expect("a call");
            let what = format!("{:?} chunked {chunked}", p.api);
            check(&call, p, false, &what);
            let speed = call.speed.expect("a snapshot");
            assert!(
                speed.output_tokens_per_second.is_some(),
                "{what}: {speed:?}"
            );
        }
    }
}

#[actix::test]
async fn at_one_percent_loss_every_call_of_every_protocol_settles_honestly() {
    let (lost, _) = run(10, 12).await;
    assert!(lost > 0, "some packets were lost");
}

#[actix::test]
async fn at_ten_percent_loss_every_call_of_every_protocol_settles_honestly() {
    let (lost, gaps) = run(100, 12).await;
    assert!(lost > 40, "most trials lost packets ({lost})");
    assert!(gaps > 20, "and were flagged ({gaps})");
}

#[actix::test]
async fn a_call_whose_flow_ends_unseen_settles_once_the_kernel_says_it_is_gone() {
    let mut rig = Rig::new().await;
    let p = ollama(ApiKind::OllamaGenerate);
    let mut steps = conversation(&p, "127.0.0.1:40001", true);
    // The last response chunk (the final line), the terminator and both
    // FINs never reach the capture, nor the ACKs that follow them.
    steps.truncate(steps.len() - 7);
    let call = trial(&mut rig, steps).await.expect("a call");
    assert_eq!(call.status, CallStatus::Abandoned, "{call:?}");
    assert!(call.details.capture_gap, "the lost tail is a gap: {call:?}");
    let speed = call.speed.expect("a snapshot");
    assert_eq!(speed.output_tokens_per_second, None);
    assert!(speed.output_tokens <= TOKENS as u64);
}

#[actix::test]
async fn a_call_whose_end_of_body_was_lost_settles_ok_at_its_marker_on_a_live_connection() {
    let mut rig = Rig::new().await;
    let p = openai(ApiKind::OpenaiChat);
    let mut steps = conversation(&p, "127.0.0.1:40002", true);
    // The terminator and the FINs are lost; the client keeps the
    // connection (a pool): the kernel still lists it.
    steps.truncate(steps.len() - 5);
    play(&mut rig, steps);
    let mut now = rig.now();
    for _ in 0..30 {
        now += TICK;
        rig.task.tick(now);
    }
    let call = rig.settled().await;
    assert_eq!(call.status, CallStatus::Ok, "{call:?}");
    assert_eq!(call.speed.expect("a snapshot").output_tokens, 30);
}

#[actix::test]
async fn a_request_whose_model_was_lost_takes_the_model_its_response_names_and_is_flagged() {
    let mut rig = Rig::new().await;
    let p = openai(ApiKind::OpenaiChat);
    let mut steps = conversation(&p, "127.0.0.1:40003", true);
    // The request's last segment (holding `model`) is lost; the server's
    // ACK says it was sent.
    let last_request = steps
        .iter()
        .rposition(|(seg, _)| seg.src.port() == 40_003 && !seg.payload.is_empty())
        .expect("request segments");
    steps.remove(last_request);
    let call = trial(&mut rig, steps).await.expect("a call");
    assert!(call.details.capture_gap, "{call:?}");
    assert_eq!(call.identity.model.as_deref(), Some("m"), "{call:?}");
    assert_eq!(call.status, CallStatus::Ok);
    let speed = call.speed.expect("a snapshot");
    assert_eq!(speed.output_tokens, 30, "the server's count is kept");
    assert_eq!(speed.output_tokens_per_second, None);
}
