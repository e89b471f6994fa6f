//! Ollama native `/api/chat` and `/api/generate` (NDJSON).
//!
//! Choices, written down:
//! - One line per token, `done: false`; reasoning in `message.thinking`
//!   (chat) or `thinking` (generate) with empty `content` / `response`.
//! - The `done: true` line always carries `done_reason: "stop"`,
//!   `prompt_eval_count` and `eval_count` (Ollama always reports counts).
//!   The durations (`total_duration`, `prompt_eval_duration`,
//!   `eval_duration`, integer ns) come only with server timings, measured:
//!   `eval_duration` is first to last token, `prompt_eval_duration` arrival
//!   to first token (prefill and base ttft, after any load or queue wait).
//!   `load_duration` (integer ns, after `total_duration` as in api/types.go
//!   `Metrics`) is the call's wait for its model to load and comes whenever
//!   it is not zero (Ollama always sends it; `omitempty` drops a zero).
//! - `prompt_eval_count` is the prompt as processed: when the prompt was
//!   longer than the context and cut, the cut count. `/api/generate`'s `context` token array is omitted (it encodes
//!   the prompt).
//! - `created_at` is the wall-clock time of each line, RFC 3339 with
//!   nanoseconds as Go writes it (trailing zeros trimmed).

use std::time::{SystemTime, UNIX_EPOCH};

use super::{ndjson, Reply, Token, Totals};
use crate::decode::event::OutputChannel;
use crate::model::ApiKind;
use crate::simulate::json::Obj;

fn is_chat(r: &Reply) -> bool {
    r.api == ApiKind::OllamaChat
}

fn head(r: &Reply) -> Obj {
    Obj::new()
        .field("model", &r.model)
        .field("created_at", rfc3339(r.wall))
}

/// The text fields of a line: chat's `message` or generate's
/// `response`/`thinking`.
fn text(r: &Reply, o: Obj, content: &str, thinking: &str) -> Obj {
    if is_chat(r) {
        let mut m = Obj::new()
            .field("role", "assistant")
            .field("content", content);
        if !thinking.is_empty() {
            m = m.field("thinking", thinking);
        }
        o.obj("message", m)
    } else {
        let o = o.field("response", content);
        if thinking.is_empty() {
            o
        } else {
            o.field("thinking", thinking)
        }
    }
}

/// The `done: true` fields.
fn done(r: &Reply, o: Obj, t: &Totals) -> Obj {
    let ns = |ms: f64| (ms * 1e6).round() as u64;
    let mut o = o.field("done", true).field("done_reason", "stop");
    if r.timings {
        o = o.field("total_duration", ns(t.total_ms));
    }
    // Ollama always reports the load; `omitempty` drops it when zero.
    if ns(t.load_ms) > 0 {
        o = o.field("load_duration", ns(t.load_ms));
    }
    o = o.field("prompt_eval_count", t.input_tokens);
    if r.timings {
        o = o.field("prompt_eval_duration", ns(t.prompt_ms));
    }
    o = o.field("eval_count", t.output_tokens);
    if r.timings {
        o = o.field("eval_duration", ns(t.predicted_ms));
    }
    o
}

pub(super) fn token(r: &mut Reply, t: &Token) -> String {
    let (content, thinking) = match t.channel {
        OutputChannel::Reasoning => ("", t.text),
        _ => (t.text, ""),
    };
    let line = text(r, head(r), content, thinking)
        .field("done", false)
        .finish();
    ndjson(&line)
}

pub(super) fn finish(r: &mut Reply, totals: &Totals) -> String {
    let o = text(r, head(r), "", "");
    ndjson(&done(r, o, totals).finish())
}

pub(super) fn whole(r: &Reply, totals: &Totals) -> String {
    let o = text(r, head(r), &r.answer_text, &r.reasoning_text);
    done(r, o, totals).finish()
}

/// Ollama's error object, `{"error":"…"}`: the whole body of an error
/// reply, or the last NDJSON line after output has started.
pub(super) fn error_object(message: &str) -> String {
    Obj::new().field("error", message).finish()
}

/// RFC 3339 UTC with nanoseconds, trailing zeros trimmed (Go's
/// `time.RFC3339Nano`), e.g. `2023-11-14T22:13:20.25Z`.
pub(crate) fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, day) = civil_from_days(days as i64);
    let mut s = format!(
        "{y:04}-{m:02}-{day:02}T{:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    );
    let nanos = d.subsec_nanos();
    if nanos > 0 {
        let frac = format!("{nanos:09}");
        s.push('.');
        s.push_str(frac.trim_end_matches('0'));
    }
    s.push('Z');
    s
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian
/// (Howard Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::*;
    use serde_json::Value;
    use std::time::Duration;

    fn lines(text: &str) -> Vec<Value> {
        assert!(text.ends_with('\n'));
        text.lines()
            .map(|l| serde_json::from_str(l).expect(l))
            .collect()
    }

    #[test]
    fn chat_lines() {
        let (mut r, totals) = reply(ApiKind::OllamaChat, 1, 2, false, false);
        let v = lines(&stream(&mut r, &totals));
        assert_eq!(v.len(), 4);
        assert_eq!(v[0]["message"]["thinking"], " the");
        assert_eq!(v[0]["message"]["content"], "");
        assert_eq!(v[1]["message"]["content"], " model");
        assert!(v[1]["message"].get("thinking").is_none());
        assert_eq!(v[1]["done"], false);
        assert_eq!(v[1]["created_at"], "2023-11-14T22:13:20.25Z");
        let last = &v[3];
        assert_eq!(last["done"], true);
        assert_eq!(last["done_reason"], "stop");
        assert_eq!(last["eval_count"], 3);
        assert_eq!(last["prompt_eval_count"], 4);
        assert!(last.get("eval_duration").is_none());
        assert!(last.get("total_duration").is_none());
    }

    #[test]
    fn generate_lines_with_durations() {
        let (mut r, totals) = reply(ApiKind::OllamaGenerate, 0, 2, true, false);
        let v = lines(&stream(&mut r, &totals));
        assert_eq!(v[0]["response"], " the");
        assert!(v[0].get("message").is_none());
        let last = &v[2];
        assert_eq!(last["response"], "");
        assert_eq!(last["eval_duration"], 1_000_000_000u64);
        assert_eq!(last["prompt_eval_duration"], 200_000_000u64);
        assert_eq!(last["total_duration"], 1_200_000_000u64);
        let keys: Vec<&String> = last.as_object().unwrap().keys().collect();
        assert!(keys.iter().all(|k| k.as_str() != "load_duration"));

        let w: Value = serde_json::from_str(&whole(&r, &totals)).unwrap();
        assert_eq!(w["response"], " the model");
        assert_eq!(w["done"], true);
        assert_eq!(w["eval_count"], 2);
    }

    #[test]
    fn dates() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        let t = UNIX_EPOCH + Duration::new(951_782_400, 123_000_000); // 2000-02-29
        assert_eq!(rfc3339(t), "2000-02-29T00:00:00.123Z");
        let t = UNIX_EPOCH + Duration::from_secs(1_735_689_599); // 2024-12-31T23:59:59
        assert_eq!(rfc3339(t), "2024-12-31T23:59:59Z");
    }
}
