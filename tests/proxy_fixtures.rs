//! Every real capture under tests/fixtures/real replayed through the
//! proxy at its recorded timing (the `chunks.jsonl` read times): the client
//! receives the capture's exact bytes, and the settled call agrees with the
//! capture's own `usage` and `timings` (from each folder's `index.json`).

use crate::util::proxy as proxy_support;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use proxy_support::*;
use serde_json::Value;
use speedtap::decode::detect::detect_request;
use speedtap::host::{Engine, EngineOptions};
use speedtap::model::ApiKind;
use speedtap::model::RouteSpec;
use speedtap::model::TokenSource;
use speedtap::model::{Call, CallStatus};
use speedtap::tokens::O200kEstimator;

fn fixtures_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/real")
}

struct Capture {
    name: String,
    folder: String,
    index: Value,
    method: String,
    path: String,
    body: Bytes,
    script: Script,
    response: Vec<u8>,
}

fn load(folder: &str) -> Vec<Capture> {
    let dir = fixtures_root().join(folder);
    let index: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(dir.join("index.json")).unwrap()).unwrap();
    index
        .into_iter()
        .map(|row| {
            let name = row["name"].as_str().unwrap().to_owned();
            let read = |ext: &str| std::fs::read(dir.join(format!("{name}.{ext}"))).unwrap();
            let request: Value = serde_json::from_slice(&read("request.json")).unwrap();
            let body = match (&request["body"], &request["body_raw"]) {
                (Value::Null, Value::String(raw)) => Bytes::from(raw.clone()),
                (Value::Null, _) => Bytes::new(),
                (body, _) => Bytes::from(serde_json::to_vec(body).unwrap()),
            };
            let head = String::from_utf8(read("head.txt")).unwrap();
            let status: u16 = head.split(' ').nth(1).unwrap().parse().unwrap();
            let headers: Vec<(String, String)> = head
                .lines()
                .skip(1)
                .filter_map(|l| l.split_once(':'))
                .map(|(k, v)| (k.trim().to_lowercase(), v.trim().to_owned()))
                .filter(|(k, _)| k == "content-type" || k == "x-accel-buffering")
                .collect();
            let mut frames = Vec::new();
            for line in String::from_utf8(read("chunks.jsonl")).unwrap().lines() {
                let chunk: Value = serde_json::from_str(line).unwrap();
                let data = base64::engine::general_purpose::STANDARD
                    .decode(chunk["body_b64"].as_str().unwrap())
                    .unwrap();
                if !data.is_empty() {
                    let at = Duration::from_secs_f64(chunk["t_ms"].as_f64().unwrap() / 1000.0);
                    frames.push((at, Bytes::from(data)));
                }
            }
            let head_delay =
                Duration::from_secs_f64(row["t_headers_ms"].as_f64().unwrap_or(0.0) / 1000.0);
            let script = Script {
                status,
                headers,
                frames,
                ending: Ending::Clean,
                head_delay,
            };
            Capture {
                folder: folder.to_owned(),
                method: request["method"].as_str().unwrap().to_owned(),
                path: request["path"].as_str().unwrap().to_owned(),
                body,
                response: read("response.txt"),
                script,
                index: row,
                name,
            }
        })
        .collect()
}

fn route_name(cap: &Capture) -> String {
    format!("{}-{}", cap.folder, cap.name)
}

/// The capture's exact output count, wherever its API reports it.
fn exact_tokens(usage: &Value) -> Option<u64> {
    ["completion_tokens", "output_tokens", "tokens_predicted"]
        .iter()
        .find_map(|k| usage[*k].as_u64())
}

/// Checks one settled call against its capture. Returns a description of
/// the first disagreement.
fn check(cap: &Capture, call: &Call) -> Result<(), String> {
    let row = &cap.index;
    let api = detect_request(&cap.method, &cap.path, &cap.body).api;
    let status = row["status"].as_u64().unwrap() as u16;
    let ctx = format!("{}/{}", cap.folder, cap.name);
    if api == ApiKind::Unknown {
        if call.status != CallStatus::Unmetered {
            return Err(format!("{ctx}: expected unmetered, got {call:?}"));
        }
        return Ok(());
    }
    if call.identity.api != api {
        return Err(format!("{ctx}: api {} != {api}", call.identity.api));
    }
    if call.http_status != Some(status) {
        return Err(format!("{ctx}: http_status {:?}", call.http_status));
    }
    if !(200..300).contains(&status) {
        if call.status != CallStatus::UpstreamError {
            return Err(format!("{ctx}: expected upstream_error, got {call:?}"));
        }
        return Ok(());
    }
    if call.details.client.as_deref() != Some("openai-python") {
        return Err(format!("{ctx}: client {:?}", call.details.client));
    }
    let speed = call.speed.as_ref().ok_or(format!("{ctx}: no speed"))?;
    if row["content_events"].as_u64() == Some(0) && row["stream"] == true {
        // 200 with an empty stream (llama-cpp-python's context overflow):
        // no terminal marker, so the call can't be settled as ok.
        if call.status != CallStatus::Abandoned || speed.output_tokens != 0 {
            return Err(format!(
                "{ctx}: empty stream should be abandoned, got {call:?}"
            ));
        }
        return Ok(());
    }
    if call.status != CallStatus::Ok {
        return Err(format!("{ctx}: expected ok, got {call:?}"));
    }
    let exact = exact_tokens(&row["usage"]);
    if let Some(exact) = exact {
        if speed.output_tokens != exact {
            return Err(format!(
                "{ctx}: tokens {} != usage {exact}",
                speed.output_tokens
            ));
        }
    } else if row["stream"] == true {
        // No receipt: an o200k estimate of another model's tokenizer.
        let events = row["content_events"].as_u64().unwrap() as f64;
        let ratio = speed.output_tokens as f64 / events;
        if !(0.5..=1.6).contains(&ratio) {
            return Err(format!(
                "{ctx}: estimate {} vs {events} events",
                speed.output_tokens
            ));
        }
    }
    let timings = &row["timings"];
    let server_n = timings["predicted_n"].as_f64().unwrap_or(0.0);
    let server_ms = timings["predicted_ms"].as_f64().unwrap_or(0.0);
    if server_n >= 20.0 && server_ms > 0.0 {
        // The server's own figure, as it states it: llama.cpp's
        // `predicted_per_second` is (n - 1) / ms (docs/metering.md, "Server
        // rates: the server's own figure").
        let stated = timings["predicted_per_second"]
            .as_f64()
            .unwrap_or((server_n - 1.0) / server_ms * 1000.0);
        let want = (stated * 10.0).round() / 10.0;
        if speed.output_tokens_per_second != Some(want) || speed.token_source != TokenSource::Server
        {
            return Err(format!("{ctx}: server rate {want} expected, got {speed:?}"));
        }
    } else if row["stream"] == false && speed.output_tokens_per_second.is_some() {
        return Err(format!(
            "{ctx}: a non-streamed call without server timings has no rate"
        ));
    }
    // The TTFT breakdown carries the server's own prefill numbers.
    if let Some(prompt_ms) = timings["prompt_ms"].as_f64() {
        let b = call.details.ttft_breakdown.as_ref();
        let want = (prompt_ms * 10.0).round() / 10.0;
        if b.and_then(|b| b.prefill_ms) != Some(want)
            || b.and_then(|b| b.prefill_tokens) != timings["prompt_n"].as_u64()
            || b.and_then(|b| b.cached_tokens) != timings["cache_n"].as_u64()
        {
            return Err(format!("{ctx}: breakdown {b:?} vs timings {timings}"));
        }
    }
    // TTFT: the proxy times arrival from the upstream, which replays at the
    // capture's offsets; allow scheduling slack on a loaded machine.
    let want_ttft = row["t_first_token_ms"]
        .as_f64()
        .or(row["t_first_body_ms"].as_f64())
        .unwrap_or(0.0);
    let ttft = speed.time_to_first_token_ms.unwrap_or(0) as f64;
    if row["stream"] == true && (ttft < want_ttft - 2.0 || ttft > want_ttft + 150.0) {
        return Err(format!("{ctx}: ttft {ttft} vs capture {want_ttft}"));
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_capture_replays_byte_exact_and_settles_like_the_server_said() {
    let captures: Vec<Capture> = ["llama-server", "llama-cpp-python"]
        .iter()
        .flat_map(|f| load(f))
        .collect();
    assert!(captures.len() >= 50, "fixtures missing: {}", captures.len());
    let scripts: HashMap<String, Script> = captures
        .iter()
        .map(|c| (format!("{}/{}", c.folder, c.name), c.script.clone()))
        .collect();
    let up = ScriptedUpstream::start(scripts).await;
    // One route per capture, so each call says which capture it replayed.
    let routes: Vec<RouteSpec> = captures
        .iter()
        .map(|c| RouteSpec::new(&route_name(c), "127.0.0.1:0", &up.url()).unwrap())
        .collect();
    let mut options = EngineOptions::new(routes);
    options.estimator = std::sync::Arc::new(O200kEstimator);
    let engine = Engine::start(options).await.unwrap();
    let listen: HashMap<String, std::net::SocketAddr> = engine
        .routes
        .iter()
        .map(|r| (r.name.clone(), r.listen))
        .collect();

    // All at once, so the whole replay takes as long as the longest capture.
    // The tokenizer's tables are built when the first metered call starts;
    // here the scripted upstream shares this process's cores with that
    // build, which would delay its replayed first tokens. Build them first.
    speedtap::tokens::O200kEstimator::warm_up();
    let mut tasks = Vec::new();
    for cap in &captures {
        let key = format!("{}/{}", cap.folder, cap.name);
        let addr = listen[&route_name(cap)];
        let (method, path, body) = (cap.method.clone(), cap.path.clone(), cap.body.clone());
        tasks.push(tokio::spawn(async move {
            send_with(
                addr,
                &method,
                &path,
                body,
                &[("x-script", &key), ("user-agent", "OpenAI/Python 1.54.0")],
            )
            .await
        }));
    }
    let mut failures = Vec::new();
    for (cap, task) in captures.iter().zip(tasks) {
        let got = task.await.unwrap();
        if got.body() != cap.response {
            failures.push(format!("{}/{}: bytes differ", cap.folder, cap.name));
        }
    }
    let calls = settled_calls(&engine, captures.len()).await;
    for cap in &captures {
        let name = route_name(cap);
        let mine: Vec<&Call> = calls.iter().filter(|c| c.identity.route == name).collect();
        match mine.as_slice() {
            [call] => {
                if let Err(e) = check(cap, call) {
                    failures.push(e);
                }
            }
            other => failures.push(format!("{name}: {} calls", other.len())),
        }
    }
    engine.shutdown(Duration::from_secs(1)).await;
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
