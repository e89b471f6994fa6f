//! What an idle `speedtap run` leaves out until a call needs it, seen from
//! outside: the tokenizer's tables are built when the first metered call
//! starts, not at start-up, and that first call still gets its live token
//! estimate. (The memory and wake-up figures themselves are measured by
//! `scripts/footprint-headless`, not here: numbers live in scripts.)

use std::io::{BufReader, Write};

use serde_json::{json, Value};

use crate::util::process::{scratch, start_run_with, start_simulate, STARTUP};
use crate::util::raw_http::{connect, read_body, read_head, request};

/// Answer tokens of the call; each simulated word is one o200k token.
const TOKENS: u64 = 60;

#[test]
fn the_first_call_after_start_shows_a_live_token_estimate_while_the_tokenizer_loads() {
    let dir = scratch("headless_footprint", "first_call_live_estimate");
    // 60 tokens at 40 tok/s: 1.5 s of stream, several 250 ms snapshots;
    // no usage receipt, so every count is the tokenizer's own.
    let (_sim, upstream) =
        start_simulate(&dir, &["--tokens", "60", "--tps", "40", "--ttft-ms", "50"]);
    let run = start_run_with(&dir, upstream, &["--no-db"], &[]);

    let body = json!({
        "model": "sim-model",
        "stream": true,
        "messages": [{"role": "user", "content": "Count to sixty."}]
    })
    .to_string();
    let mut stream = connect(run.proxy);
    stream
        .write_all(&request(
            "POST",
            run.proxy,
            "/v1/chat/completions",
            body.as_bytes(),
            &[("x-sim-usage", "false")],
        ))
        .unwrap();
    let mut r = BufReader::new(stream);
    let head = read_head(&mut r).expect("a response head");
    assert_eq!(head.status, 200);
    let (_, complete) = read_body(&mut r, &head);
    assert!(complete, "the stream reached its end");

    let is_final = |v: &Value| v["speed"]["is_final"] == true;
    let final_line = run.proc.stdout.wait_for("the settled call", STARTUP, |l| {
        serde_json::from_str::<Value>(l).is_ok_and(|v| is_final(&v))
    });
    let settled: Value = serde_json::from_str(&final_line).unwrap();
    assert_eq!(settled["speed"]["output_tokens"], TOKENS, "{settled}");
    assert_eq!(settled["speed"]["token_source"], "estimated", "{settled}");

    // The live snapshots before the final one: the tokenizer was loading
    // while the call waited for its first token, and counting waited for
    // it instead of reporting nothing.
    let live: Vec<Value> = run
        .proc
        .stdout
        .lines_so_far()
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .take_while(|v| !is_final(v))
        .collect();
    let counts: Vec<u64> = live
        .iter()
        .filter(|v| v["speed"]["phase"] == "responding")
        .filter_map(|v| v["speed"]["output_tokens"].as_u64())
        .collect();
    assert!(
        counts.iter().any(|&n| n > 0 && n < TOKENS),
        "a live estimate part-way through the first call: {counts:?} in {live:?}"
    );
    run.proc.signal("TERM");
}
