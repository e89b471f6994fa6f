//! Small, total readers over `serde_json::Value` shared by the protocol
//! decoders: counts, durations, usage receipts, llama.cpp `timings` and
//! error messages.
//!
//! Every reader answers `None` for a missing, `null` or ill-typed field
//! instead of failing: servers add, move and mistype fields, and one odd
//! field must never cost the rest of a message.

use serde_json::Value;

use crate::decode::event::{PromptProgress, ServerTimings, Usage};

/// A duration at or below this (1 µs) is a placeholder, not a measurement:
/// KoboldCpp's Ollama emulation sends 1 ns durations, llama.cpp reports
/// `predicted_ms: 0.001` for a single token, and 0 means "not measured".
pub const MIN_PLAUSIBLE_MS: f64 = 0.001;

/// Fastest believable generation rate, tokens per second. No single local
/// stream decodes anywhere near 100k tok/s (fast GPUs do a few hundred,
/// speculative decoding a few thousand); a duration implying more is a
/// placeholder and is dropped rather than divided by.
pub const MAX_GENERATION_TOKENS_PER_S: f64 = 100_000.0;

/// Fastest believable prompt-processing rate, tokens per second. Prefill is
/// much faster than decode (tens of thousands of tok/s on big GPUs), so the
/// bound is ten times looser.
pub const MAX_PROMPT_TOKENS_PER_S: f64 = 1_000_000.0;

/// Error messages are cut to this many characters: they name the server's
/// error, they do not carry payloads.
pub const MAX_ERROR_CHARS: usize = 120;

/// A token count: a non-negative integer. A float that is a whole number
/// (some servers serialise counts as `47.0`) is accepted; negatives,
/// fractions, strings and `null` are not.
pub fn count(v: Option<&Value>) -> Option<u64> {
    let v = v?;
    if let Some(n) = v.as_u64() {
        return Some(n);
    }
    let f = v.as_f64()?;
    if f.is_finite() && f >= 0.0 && f.fract() == 0.0 && f <= u64::MAX as f64 {
        Some(f as u64)
    } else {
        None
    }
}

/// A finite number (`null`, NaN written as `null`, strings: `None`).
pub fn number(v: Option<&Value>) -> Option<f64> {
    v?.as_f64().filter(|f| f.is_finite())
}

/// A non-empty string field.
pub fn nonempty_str<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key)?.as_str().filter(|s| !s.is_empty())
}

/// A non-null object field.
pub fn object<'a>(v: &'a Value, key: &str) -> Option<&'a Value> {
    v.get(key).filter(|o| o.is_object())
}

/// Keeps a duration (ms) only if it is a real measurement: above
/// [`MIN_PLAUSIBLE_MS`] and, when the token count over it is known, not
/// implying more than `max_rate` tokens per second.
pub fn plausible_ms(ms: Option<f64>, tokens: Option<u64>, max_rate: f64) -> Option<f64> {
    let ms = ms?;
    if !ms.is_finite() || ms <= MIN_PLAUSIBLE_MS {
        return None;
    }
    if let Some(n) = tokens {
        if n as f64 / (ms / 1000.0) > max_rate {
            return None;
        }
    }
    Some(ms)
}

/// Nanoseconds (Ollama's integer durations) to milliseconds.
pub fn ns_to_ms(v: Option<&Value>) -> Option<f64> {
    number(v).map(|ns| ns / 1e6)
}

/// An OpenAI-style usage object, read liberally: Chat/Completions names
/// (`completion_tokens`, `prompt_tokens`, `*_tokens_details`) and
/// Responses names (`output_tokens`, `input_tokens`, ...) are both
/// accepted, since OpenAI-compatible servers mix them. `None` for a
/// non-object or an object without any known field (`usage: {}`).
pub fn openai_usage(v: Option<&Value>) -> Option<Usage> {
    let u = v.filter(|u| u.is_object())?;
    let output = count(u.get("completion_tokens")).or_else(|| count(u.get("output_tokens")));
    let input = count(u.get("prompt_tokens")).or_else(|| count(u.get("input_tokens")));
    let out_details = u
        .get("completion_tokens_details")
        .or_else(|| u.get("output_tokens_details"));
    let in_details = u
        .get("prompt_tokens_details")
        .or_else(|| u.get("input_tokens_details"));
    let usage = Usage {
        output_tokens: output,
        input_tokens: input,
        reasoning_tokens: out_details.and_then(|d| count(d.get("reasoning_tokens"))),
        cached_input_tokens: in_details.and_then(|d| count(d.get("cached_tokens"))),
    };
    non_empty_usage(usage)
}

/// `Some` unless every field is absent.
pub fn non_empty_usage(u: Usage) -> Option<Usage> {
    if u == Usage::default() {
        None
    } else {
        Some(u)
    }
}

/// A llama.cpp `prompt_progress` object, when it holds a total and a
/// processed count no larger than it (`cache` and `time_ms` default to 0).
pub fn llamacpp_prompt_progress(v: Option<&Value>) -> Option<PromptProgress> {
    let p = v.filter(|p| p.is_object())?;
    let (total, processed) = (count(p.get("total"))?, count(p.get("processed"))?);
    (total > 0 && processed <= total).then(|| PromptProgress {
        total,
        cache: count(p.get("cache")).unwrap_or(0).min(total),
        processed,
        time_ms: number(p.get("time_ms"))
            .filter(|ms| ms.is_finite() && *ms >= 0.0)
            .unwrap_or(0.0),
    })
}

/// A llama.cpp `timings` object (OpenAI routes, Responses, native
/// `/completion`). Durations go through [`plausible_ms`]; see
/// [`real_timings`] for when the result is worth emitting.
pub fn llamacpp_timings(v: Option<&Value>) -> Option<ServerTimings> {
    let t = v.filter(|t| t.is_object())?;
    let generated = count(t.get("predicted_n"));
    let prompt = count(t.get("prompt_n"));
    let generation_ms = plausible_ms(
        number(t.get("predicted_ms")),
        generated,
        MAX_GENERATION_TOKENS_PER_S,
    );
    real_timings(ServerTimings {
        generated_tokens: generated,
        generation_ms,
        generation_rate: generation_ms.and_then(|ms| {
            number(t.get("predicted_per_second"))
                .filter(|r| r.is_finite() && *r > 0.0)
                .or_else(|| rate_after_first_token(generated?, ms))
        }),
        prompt_tokens: prompt,
        prompt_ms: plausible_ms(number(t.get("prompt_ms")), prompt, MAX_PROMPT_TOKENS_PER_S),
        load_ms: None,
        cached_tokens: count(t.get("cache_n")),
        draft_tokens: count(t.get("draft_n")),
        draft_accepted: count(t.get("draft_n_accepted")),
    })
}

/// llama.cpp's own rule for a speed, for servers of its family that give
/// `predicted_n` and `predicted_ms` without `predicted_per_second`: the
/// clock starts when the first token is sampled, so that token is not
/// part of the timed span, and the rate is (n − 1) ÷ seconds.
pub fn rate_after_first_token(generated: u64, ms: f64) -> Option<f64> {
    (generated >= 2 && ms > 0.0).then(|| (generated - 1) as f64 / (ms / 1000.0))
}

/// Ollama's own rule (`ollama run --verbose` prints "eval rate" as
/// `eval_count` ÷ `eval_duration`): every counted token over the timed
/// span.
pub fn rate_over_all_tokens(generated: u64, ms: f64) -> Option<f64> {
    (generated >= 1 && ms > 0.0).then(|| generated as f64 / (ms / 1000.0))
}

/// Server timings are worth an event only when at least one duration
/// survived the plausibility guard: the counts alone are what a usage
/// receipt already says, and a timings event without a real duration would
/// invite a consumer to treat placeholder numbers (KoboldCpp's Ollama
/// emulation) as the server's own measurement.
pub fn real_timings(t: ServerTimings) -> Option<ServerTimings> {
    if t.generation_ms.is_some() || t.prompt_ms.is_some() || t.load_ms.is_some() {
        Some(t)
    } else {
        None
    }
}

/// A short name for an error value, preferring the server's identifiers
/// over its prose: `type`, then `code`, then `error_type`, then `message`
/// (cut to [`MAX_ERROR_CHARS`]). A bare string error is cut the same way.
/// Nested `{"error": {...}}` is unwrapped. Never empty.
pub fn error_message(v: &Value) -> String {
    match v {
        Value::String(s) if !s.trim().is_empty() => short(s),
        Value::Object(map) => {
            if let Some(inner) = map.get("error").filter(|e| !e.is_null()) {
                // `{"error": "...", "error_type": "validation"}` (TGI): the
                // type names the error better than its prose.
                if inner.is_string() {
                    if let Some(t) = nonblank_str(v, "error_type") {
                        return short(t);
                    }
                }
                return error_message(inner);
            }
            for key in ["type", "code", "error_type"] {
                match map.get(key) {
                    // Anthropic/Responses wrap errors as `{"type": "error", ...}`:
                    // that type says nothing, keep looking.
                    // A blank one says nothing either (and made the message
                    // empty: fuzz/regressions/openai_chat).
                    Some(Value::String(s)) if !s.trim().is_empty() && s.trim() != "error" => {
                        return short(s)
                    }
                    Some(Value::Number(n)) => return short(&n.to_string()),
                    _ => {}
                }
            }
            match map.get("message").or_else(|| map.get("detail")) {
                Some(Value::String(s)) if !s.trim().is_empty() => short(s),
                // FastAPI validation errors: a list of `{type, loc, msg, input}`.
                // `input` may quote the request, so only the type is kept.
                Some(Value::Array(items)) => items
                    .first()
                    .and_then(|i| nonblank_str(i, "type"))
                    .map(short)
                    .unwrap_or_else(|| "validation_error".to_owned()),
                _ => "error".to_owned(),
            }
        }
        Value::Array(items) => items
            .first()
            .and_then(|i| nonblank_str(i, "type"))
            .map(short)
            .unwrap_or_else(|| "error".to_owned()),
        _ => "error".to_owned(),
    }
}

/// The server's own name for an error value, as it may be kept: its
/// `type`, `code` or `error_type` identifier (`invalid_request_error`,
/// `server_error`, `500`), nested `{"error": ...}` unwrapped. Never its
/// prose (`message`, `detail`, a bare string): servers quote the request
/// and the answer there ("… is not a valid prompt"), and neither may be
/// kept (`tests/security.rs`). `None` when it names no identifier.
pub fn error_code(v: &Value) -> Option<String> {
    let Value::Object(map) = v else {
        return None;
    };
    if let Some(inner) = map.get("error").filter(|e| e.is_object()) {
        if let Some(code) = error_code(inner) {
            return Some(code);
        }
    }
    ["type", "code", "error_type"].iter().find_map(|k| {
        let id = match map.get(*k)? {
            Value::String(s) => s.trim().to_owned(),
            Value::Number(n) => n.to_string(),
            _ => return None,
        };
        is_identifier(&id).then_some(id)
    })
}

/// A short machine name: letters, digits, `_ . : -`, at most 64, and not
/// the word `error` alone (Anthropic's wrapper type says nothing).
fn is_identifier(s: &str) -> bool {
    !s.is_empty()
        && s != "error"
        && s.len() <= 64
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | ':' | '-'))
}

/// A string field with something besides whitespace: what [`short`] is
/// given, so the message it makes is never empty.
fn nonblank_str<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key)?.as_str().filter(|s| !s.trim().is_empty())
}

/// Trims and cuts a message to [`MAX_ERROR_CHARS`] characters.
fn short(s: &str) -> String {
    let s = s.trim();
    match s.char_indices().nth(MAX_ERROR_CHARS) {
        Some((cut, _)) => s[..cut].to_owned(),
        None => s.to_owned(),
    }
}

/// Text from a content value that is either a string or an array of parts
/// (`[{"type": "text", "text": "..."}]`, as some OpenAI-compatible servers
/// send). Parts without a string `text` are skipped.
pub fn content_text(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        Value::Array(parts) => {
            let joined: String = parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect();
            (!joined.is_empty()).then_some(joined)
        }
        _ => None,
    }
}

/// The generated text of a function call: its name followed by its
/// arguments. Both are model output (the name is generated tokens too), so
/// both count toward the tool-call channel. `arguments` is normally a JSON
/// string (OpenAI); an object (Ollama, non-compliant servers) is serialised
/// compactly, which is close to what the model produced.
pub fn call_text(name: Option<&Value>, arguments: Option<&Value>) -> String {
    let mut text = String::new();
    if let Some(n) = name.and_then(Value::as_str) {
        text.push_str(n);
    }
    match arguments {
        Some(Value::String(s)) => text.push_str(s),
        Some(a @ (Value::Object(_) | Value::Array(_))) => text.push_str(&a.to_string()),
        _ => {}
    }
    text
}

/// A JSON string read by the typed fast paths: borrowed from the message
/// when it has no escapes (the common case), owned when it has some.
/// (serde's own `Cow<str>` always owns inside an `Option`.)
#[derive(Debug)]
pub struct Text<'a>(pub std::borrow::Cow<'a, str>);

impl Text<'_> {
    /// The text of an optional field.
    pub fn str<'s>(t: &'s Option<Text<'_>>) -> Option<&'s str> {
        t.as_ref().map(|t| &*t.0)
    }

    /// The text, `None` when empty (what [`nonempty_str`] answers).
    pub fn nonempty<'s>(t: &'s Option<Text<'_>>) -> Option<&'s str> {
        Self::str(t).filter(|s| !s.is_empty())
    }
}

impl<'de: 'a, 'a> serde::Deserialize<'de> for Text<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Text<'de>, E> {
                Ok(Text(std::borrow::Cow::Borrowed(s)))
            }
            fn visit_str<E>(self, s: &str) -> Result<Text<'de>, E> {
                Ok(Text(std::borrow::Cow::Owned(s.to_owned())))
            }
            fn visit_string<E>(self, s: String) -> Result<Text<'de>, E> {
                Ok(Text(std::borrow::Cow::Owned(s)))
            }
        }
        d.deserialize_str(Visit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn counts_accept_whole_floats_only() {
        assert_eq!(count(Some(&json!(47))), Some(47));
        assert_eq!(count(Some(&json!(47.0))), Some(47));
        assert_eq!(count(Some(&json!(47.5))), None);
        assert_eq!(count(Some(&json!(-1))), None);
        assert_eq!(count(Some(&json!("47"))), None);
        assert_eq!(count(Some(&Value::Null)), None);
        assert_eq!(count(None), None);
    }

    #[test]
    fn placeholder_durations_are_dropped() {
        let g = MAX_GENERATION_TOKENS_PER_S;
        assert_eq!(plausible_ms(Some(0.0), Some(10), g), None);
        assert_eq!(plausible_ms(Some(1e-6), Some(10), g), None); // 1 ns
        assert_eq!(plausible_ms(Some(0.001), Some(1), g), None); // llama.cpp 1-token placeholder
        assert_eq!(plausible_ms(Some(-5.0), None, g), None);
        assert_eq!(plausible_ms(Some(f64::NAN), None, g), None);
        // 200 tokens in 1 ms = 200k tok/s: implausible.
        assert_eq!(plausible_ms(Some(1.0), Some(200), g), None);
        assert_eq!(plausible_ms(Some(2780.2), Some(200), g), Some(2780.2));
        assert_eq!(plausible_ms(Some(0.5), None, g), Some(0.5));
    }

    #[test]
    fn usage_reads_both_naming_schemes() {
        let chat = json!({"completion_tokens": 47, "prompt_tokens": 38,
            "completion_tokens_details": {"reasoning_tokens": 5},
            "prompt_tokens_details": {"cached_tokens": 37}});
        assert_eq!(
            openai_usage(Some(&chat)),
            Some(Usage {
                output_tokens: Some(47),
                input_tokens: Some(38),
                reasoning_tokens: Some(5),
                cached_input_tokens: Some(37)
            })
        );
        let resp = json!({"output_tokens": 3, "input_tokens": 2,
            "output_tokens_details": {"reasoning_tokens": 1},
            "input_tokens_details": {"cached_tokens": 0}});
        assert_eq!(
            openai_usage(Some(&resp)),
            Some(Usage {
                output_tokens: Some(3),
                input_tokens: Some(2),
                reasoning_tokens: Some(1),
                cached_input_tokens: Some(0)
            })
        );
        assert_eq!(openai_usage(Some(&json!({}))), None);
        assert_eq!(openai_usage(Some(&Value::Null)), None);
    }

    #[test]
    fn timings_without_a_real_duration_are_not_emitted() {
        let t = json!({"predicted_n": 1, "predicted_ms": 0.001, "prompt_n": 0, "prompt_ms": 0});
        assert_eq!(llamacpp_timings(Some(&t)), None);
        let t = json!({"predicted_n": 1, "predicted_ms": 0.001, "prompt_n": 1, "prompt_ms": 16.2, "cache_n": 2});
        assert_eq!(
            llamacpp_timings(Some(&t)),
            Some(ServerTimings {
                generated_tokens: Some(1),
                generation_ms: None,
                generation_rate: None,
                prompt_tokens: Some(1),
                prompt_ms: Some(16.2),
                load_ms: None,
                cached_tokens: Some(2),
                draft_tokens: None,
                draft_accepted: None,
            })
        );
        let t = json!({"predicted_n": 3, "predicted_ms": null, "prompt_ms": null});
        assert_eq!(llamacpp_timings(Some(&t)), None);
    }

    #[test]
    fn error_messages_prefer_identifiers() {
        let e = json!({"error": {"code": 400, "message": "long prose", "type": "exceed_context_size_error"}});
        assert_eq!(error_message(&e), "exceed_context_size_error");
        let e = json!({"type": "error", "error": {"type": "overloaded_error", "message": "x"}});
        assert_eq!(error_message(&e), "overloaded_error");
        let e = json!({"type": "error", "code": "server_error", "message": "x"});
        assert_eq!(error_message(&e), "server_error");
        let e = json!({"error": "Input validation error", "error_type": "validation"});
        assert_eq!(error_message(&e), "validation");
        let e = json!({"error": "model 'x' not found"});
        assert_eq!(error_message(&e), "model 'x' not found");
        let e = json!({"detail": [{"type": "missing", "loc": ["body"], "input": {"secret": 1}}]});
        assert_eq!(error_message(&e), "missing");
        let e = json!({"detail": "Not Found"});
        assert_eq!(error_message(&e), "Not Found");
        let e = json!({"error": {"code": 500}});
        assert_eq!(error_message(&e), "500");
        let long = "é".repeat(500);
        assert_eq!(
            error_message(&json!({ "error": long })).chars().count(),
            MAX_ERROR_CHARS
        );
        assert_eq!(error_message(&json!({})), "error");
        assert_eq!(error_message(&json!(3)), "error");
    }

    /// Broke the protocol fuzz targets' "error messages are never empty"
    /// check (input in fuzz/regressions/openai_chat): a blank `type` (or
    /// `error_type`, or FastAPI item `type`) was taken as the name and
    /// trimmed to an empty message.
    #[test]
    fn blank_error_names_are_skipped_never_empty() {
        let cases = [
            json!({"error": {"type": " "}}),
            json!({"error": {"type": "\t", "message": "boom"}}),
            json!({"error": " ", "error_type": "  "}),
            json!({"detail": [{"type": " "}]}),
            json!([{"type": "\n"}]),
            json!({"type": " error "}),
        ];
        for v in &cases {
            let m = error_message(v);
            assert!(!m.trim().is_empty(), "{v}: empty message");
        }
        assert_eq!(error_message(&cases[1]), "boom");
    }

    #[test]
    fn call_text_joins_name_and_arguments() {
        assert_eq!(
            call_text(Some(&json!("get_time")), Some(&json!("{\"tz\":"))),
            "get_time{\"tz\":"
        );
        assert_eq!(
            call_text(None, Some(&json!({"tz": "UTC"}))),
            "{\"tz\":\"UTC\"}"
        );
        assert_eq!(call_text(None, None), "");
    }

    #[test]
    fn content_text_accepts_strings_and_parts() {
        assert_eq!(content_text(Some(&json!("hi"))), Some("hi".into()));
        assert_eq!(content_text(Some(&json!(""))), None);
        assert_eq!(
            content_text(Some(
                &json!([{"type": "text", "text": "a"}, {"type": "image"}, {"text": "b"}])
            )),
            Some("ab".into())
        );
        assert_eq!(content_text(Some(&Value::Null)), None);
    }
}
