//! The endpoints where servers publish their state, rendered from a
//! [`Snapshot`]: Ollama's `GET /api/ps`, llama-server's `GET /slots`,
//! `GET /props` and `GET /metrics`.
//!
//! Why they exist: speedtap's pollers explain a call's wait from what the
//! server publishes (loading, queued, prefill progress), so the simulator
//! publishes the same facts, in the same shapes, consistent with what its
//! generation path is doing at that instant. Field names, order and types
//! follow the real captures in `tests/fixtures/real/llama-server`
//! (`slots`, `props`, `metrics`) and the upstream sources named on each
//! function; values the simulator has no notion of (sampling parameters,
//! digests) are fixed stand-ins, and fields that would carry request text
//! (`prompt`, `generated` in a debug `/slots`) are never sent.

use std::time::SystemTime;

use super::json::Obj;
use super::plan::DEFAULT_MODEL;
use super::state::{Slot, Snapshot, FOREVER};
use super::wire::rfc3339;

/// llama-server's `build_info` as the simulator reports it.
pub(crate) const BUILD_INFO: &str = "b0-speedtap-sim";

/// `GET /api/ps`: ollama api/types.go `ProcessResponse { models:
/// []ProcessModelResponse }`, each `name`, `model`, `size`, `digest`,
/// `details`, `expires_at`, `size_vram`, `context_length` in that order,
/// sorted as server/routes.go `PsHandler` sorts them (longest remaining
/// first). `wall` maps the snapshot's instants to wall-clock time. A model
/// in use shows `now + keep_alive` (sched.go `loadedModels` estimates a
/// runner without an expiry the same way); one kept forever shows a date a
/// century away, as Ollama's `keep_alive: -1` does.
pub(crate) fn api_ps(
    snap: &Snapshot,
    n_ctx: u64,
    wall: impl Fn(tokio::time::Instant) -> SystemTime,
) -> String {
    let models = snap
        .models
        .iter()
        .map(|m| {
            let expires = match m.expires_at() {
                Some(at) => at,
                None => snap.now + m.keep_alive.unwrap_or(FOREVER),
            };
            Obj::new()
                .field("name", &m.name)
                .field("model", &m.name)
                .field("size", m.size)
                .field("digest", digest(&m.name))
                .obj("details", details())
                .field("expires_at", rfc3339(wall(expires)))
                .field("size_vram", m.size_vram)
                .field("context_length", n_ctx)
        })
        .collect();
    Obj::new().arr("models", models).finish()
}

/// ollama api/types.go `ModelDetails` (as `/api/tags` also shows it).
pub(crate) fn details() -> Obj {
    Obj::new()
        .field("parent_model", "")
        .field("format", "gguf")
        .field("family", "sim")
        .field("families", ["sim"])
        .field("parameter_size", "0")
        .field("quantization_level", "F16")
}

/// A stable 64-hex stand-in digest per model name (FNV-1a, repeated), so
/// two models never share one.
fn digest(name: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}").repeat(4)
}

/// The sampling `params` of a slot or of `/props`'
/// `default_generation_settings`: the leading fields of llama-server's
/// `task_params::to_json(only_metrics = true)` (server-task.cpp) with its
/// defaults, as in the captures.
fn params(n_predict: i64, stream: bool, speculative: bool) -> Obj {
    Obj::new()
        .field("seed", 4_294_967_295u64)
        .field("temperature", 0.8)
        .field("top_k", 40)
        .field("top_p", 0.95)
        .field("min_p", 0.05)
        .field("max_tokens", n_predict)
        .field("n_predict", n_predict)
        .field("n_keep", 0)
        .field("n_discard", 0)
        .field("ignore_eos", false)
        .field("stream", stream)
        .field("n_probs", 0)
        .field("min_keep", 0)
        .field(
            "speculative.types",
            if speculative { "draft" } else { "none" },
        )
        .field("timings_per_token", false)
}

/// One slot of `GET /slots`: llama-server server-context.cpp
/// `server_slot::to_json(only_metrics = true)`: `id`, `n_ctx`,
/// `speculative`, `is_processing`, then, once the slot has had a task,
/// `id_task`, `n_prompt_tokens`, `n_prompt_tokens_processed` (rising
/// during the prefill), `n_prompt_tokens_cache`, `params` and `next_token`
/// (an array of one object, as nlohmann's double braces make it).
fn slot(s: &Slot, n_ctx: u64, speculative: bool, now: tokio::time::Instant) -> Obj {
    let mut o = Obj::new()
        .field("id", s.id)
        .field("n_ctx", n_ctx)
        .field("speculative", speculative)
        .field("is_processing", s.busy);
    if let Some(t) = &s.task {
        let decoded = if s.busy { t.decoded(now) } else { t.n_output };
        let next = Obj::new()
            .field("has_next_token", s.busy && decoded < t.n_output)
            .field("has_new_line", false)
            .field("n_remain", -1)
            .field("n_decoded", decoded);
        o = o
            .field("id_task", t.id)
            .field("n_prompt_tokens", t.n_prompt)
            .field(
                "n_prompt_tokens_processed",
                if s.busy { t.processed(now) } else { t.n_prompt },
            )
            .field("n_prompt_tokens_cache", 0)
            .obj("params", params(-1, t.stream, t.speculative))
            .arr("next_token", vec![next]);
    }
    o
}

/// A server with no parallel limit always has a slot for the next call:
/// its slot list gets an idle one when every slot it has used is busy, so
/// `/slots`, `/props` `total_slots` and `/metrics` all show the room.
pub(crate) fn with_room(snap: &mut Snapshot) {
    if snap.slots.iter().all(|s| s.busy) {
        let id = snap.slots.len() as u32;
        snap.slots.push(Slot {
            id,
            busy: false,
            task: None,
        });
    }
}

/// `GET /slots`: a JSON array of every slot.
pub(crate) fn slots(snap: &Snapshot, n_ctx: u64, speculative: bool) -> String {
    let items: Vec<String> = snap
        .slots
        .iter()
        .map(|s| slot(s, n_ctx, speculative, snap.now).finish())
        .collect();
    format!("[{}]", items.join(","))
}

/// `GET /props`: llama-server server-context.cpp `get_props`, the fields
/// a poller needs (`default_generation_settings.n_ctx`, `total_slots`,
/// `model_alias`, `model_path`, `modalities`, `endpoint_*`, `build_info`,
/// `is_sleeping`) in the captured order; the chat template and its caps
/// are left out (the simulator has none). With unlimited slots
/// `total_slots` is the number of slots used so far plus an idle one
/// when all of those are busy ([`with_room`]).
pub(crate) fn props(snap: &Snapshot, n_ctx: u64, speculative: bool) -> String {
    let total_slots = snap.slots.len().max(1);
    Obj::new()
        .obj(
            "default_generation_settings",
            Obj::new()
                .obj("params", params(-1, false, speculative))
                .field("n_ctx", n_ctx),
        )
        .field("total_slots", total_slots)
        .field("model_alias", DEFAULT_MODEL)
        .field("model_ftype", "F16")
        .field("model_path", format!("models/{DEFAULT_MODEL}.gguf"))
        .obj(
            "modalities",
            Obj::new()
                .field("vision", false)
                .field("video", false)
                .field("audio", false),
        )
        .field("endpoint_slots", true)
        .field("endpoint_props", false)
        .field("endpoint_metrics", true)
        .field("build_info", BUILD_INFO)
        .field("is_sleeping", false)
        .finish()
}

/// `GET /metrics`: llama-server's Prometheus text (server-task.cpp
/// `server_task_result_metrics::to_metrics`), every counter then every
/// gauge, each with its `# HELP` and `# TYPE` lines, names prefixed
/// `llamacpp:`. The throughput gauges are the cumulative averages (the
/// real ones average since the previous scrape).
pub(crate) fn metrics(snap: &Snapshot) -> String {
    let counters = metric_counters(snap);
    let gauges = metric_gauges(snap);
    let mut out = String::new();
    for (kind, items) in [("counter", &counters[..]), ("gauge", &gauges[..])] {
        for (name, help, value) in items {
            out.push_str(&format!(
                "# HELP llamacpp:{name} {help}\n# TYPE llamacpp:{name} {kind}\nllamacpp:{name} {}\n",
                cpp_number(*value)
            ));
        }
    }
    out
}

/// One `/metrics` family: its name after `llamacpp:`, its help and its
/// value.
type Metric = (&'static str, &'static str, f64);

/// The counters of `/metrics`, in llama-server's order.
fn metric_counters(snap: &Snapshot) -> [Metric; 10] {
    let c = &snap.counters;
    [
        (
            "prompt_tokens_total",
            "Number of prompt tokens processed, excluding cached tokens",
            c.prompt_tokens as f64,
        ),
        (
            "prompt_tokens_cached_total",
            "Number of prompt tokens reused from the cache",
            0.0,
        ),
        (
            "prompt_seconds_total",
            "Total time spent processing prompts",
            c.prompt_seconds,
        ),
        (
            "tokens_predicted_total",
            "Number of generation tokens processed",
            c.predicted_tokens as f64,
        ),
        (
            "tokens_predicted_seconds_total",
            "Total time spent generating tokens",
            c.predicted_seconds,
        ),
        (
            "n_decode_total",
            "Total number of llama_decode() calls, excluding speculative decoding and multimodal decoding",
            c.n_decode as f64,
        ),
        (
            "n_tokens_max",
            "Largest observed sequence length (prompt + generation)",
            c.n_tokens_max as f64,
        ),
        (
            "spec_decode_num_draft_tokens_total",
            "Speculative: Total draft tokens generated",
            c.draft_tokens as f64,
        ),
        (
            "spec_decode_num_accepted_tokens_total",
            "Speculative: Total draft tokens accepted by the target model",
            c.draft_accepted as f64,
        ),
        (
            "spec_decode_num_drafts_total",
            "Speculative: Total speculative decoding verification steps",
            c.drafts as f64,
        ),
    ]
}

/// The gauges of `/metrics`, in llama-server's order.
fn metric_gauges(snap: &Snapshot) -> [Metric; 5] {
    let c = &snap.counters;
    let rate = |n: u64, s: f64| if s > 0.0 { n as f64 / s } else { 0.0 };
    [
        (
            "prompt_tokens_seconds",
            "Average prompt throughput in tokens/s",
            rate(c.prompt_tokens, c.prompt_seconds),
        ),
        (
            "predicted_tokens_seconds",
            "Average generation throughput in tokens/s",
            rate(c.predicted_tokens, c.predicted_seconds),
        ),
        (
            "requests_processing",
            "Number of requests processing",
            snap.processing() as f64,
        ),
        (
            "requests_deferred",
            "Number of requests deferred",
            snap.deferred as f64,
        ),
        (
            "n_busy_slots_per_decode",
            "Average number of busy slots per llama_decode() call",
            if c.n_decode > 0 { 1.0 } else { 0.0 },
        ),
    ]
}

/// A double as a C++ `std::stringstream` writes it by default (`%g` with
/// 6 significant digits): `1524`, `1.4859`, `94.2191`, `1e+06`.
pub(crate) fn cpp_number(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return if v.is_nan() {
            "nan".into()
        } else if v.is_infinite() {
            if v > 0.0 { "inf" } else { "-inf" }.into()
        } else {
            "0".into()
        };
    }
    let exp = v.abs().log10().floor() as i32;
    // Round to 6 significant digits first: rounding can carry into the
    // next power of ten (999999.5 -> 1e+06).
    let sci = format!("{v:.5e}");
    let (mantissa, e) = sci.split_once('e').unwrap_or((&sci, "0"));
    let e: i32 = e.parse().unwrap_or(exp);
    if !(-4..6).contains(&e) {
        let m = trim_zeros(mantissa);
        let sign = if e < 0 { '-' } else { '+' };
        return format!("{m}e{sign}{:02}", e.abs());
    }
    let decimals = (5 - e).max(0) as usize;
    trim_zeros(&format!("{v:.decimals$}")).to_owned()
}

fn trim_zeros(s: &str) -> &str {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_print_like_cpp_streams() {
        for (v, s) in [
            (0.0, "0"),
            (1524.0, "1524"),
            (1.4859, "1.4859"),
            (94.219_123, "94.2191"),
            (22.310_74, "22.3107"),
            (1.0, "1"),
            (1e6, "1e+06"),
            (123_456.7, "123457"),
            (0.000_012_5, "1.25e-05"),
        ] {
            assert_eq!(cpp_number(v), s, "{v}");
        }
    }

    #[test]
    fn digests_are_64_hex_and_differ_per_model() {
        let a = digest("a");
        assert_eq!(a.len(), 64);
        assert!(a.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(a, digest("b"));
    }
}
