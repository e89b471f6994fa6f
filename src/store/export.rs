//! `speedtap export`: the stored calls as CSV or JSON Lines, and the reader
//! for both (round-trip tests, and anyone re-importing an export).
//!
//! Exports run oldest first (a time series reads top to bottom); a filter's
//! `limit` keeps the first calls in that order. They stream: one row is in
//! memory at a time.

use std::io::{BufRead, Write};

use super::query::{for_each_call, Order};
use super::{Store, StoreError};
use crate::model::{Call, CallDetails, CallIdentity, TtftBreakdown};
use crate::model::{ContextUse, DraftCounts, Failure, PromptTruncation, Wait};
use crate::model::{ExportFormat, HistoryFilter};
use crate::model::{Phase, Snapshot};

/// The CSV columns, in order.
///
/// The final snapshot's `phase` and `is_final` are not columns: every stored
/// call is settled, and a settled call's snapshot is always `complete` and
/// final (`docs/metering.md` "Settling"), so the reader restores them. A call
/// has a snapshot exactly when `token_source` is set (unmetered calls have
/// none), and a TTFT breakdown when any of its six columns is set.
///
/// Columns added later go at the end, so a script reading by position keeps
/// working: `seen_by` and `capture_gap` came with the capture interceptor,
/// the `wait_*` columns and the facts after them with the wait
/// explanations, `queued_ms` and `queue_position` with the record of what
/// a call waited for, `server_version` and the `reasoning_*` columns with
/// the server's version and the reasoning cost, `slowdown` (the call's
/// slowdown as its JSON, `docs/api.md` "Slowdown") with the slowdown rule,
/// `response_model` with the model the answer named, `slow_after_ms` and
/// `slow_after_usual_ms` with the limit each call was held to, the
/// `failure_*` columns and the stall columns with the record of how a call
/// went wrong.
pub const CSV_COLUMNS: [&str; 62] = [
    "id",
    "route",
    "api",
    "model",
    "client",
    "status",
    "http_status",
    "started_at",
    "settled_at",
    "elapsed_ms",
    "ttft_ms",
    "output_tokens",
    "output_tokens_per_second",
    "token_source",
    "input_tokens",
    "load_ms",
    "prefill_ms",
    "prefill_tokens",
    "cached_tokens",
    "prefill_tokens_per_second",
    "other_ms",
    "one_burst",
    "unstreamed_reasoning",
    "seen_by",
    "capture_gap",
    "wait_reason",
    "wait_position",
    "wait_progress",
    "wait_eta_ms",
    "wait_usual_ms",
    "wait_prompt_tokens",
    "truncated_request_tokens",
    "truncated_server_tokens",
    "truncated_context_size",
    "context_size",
    "context_used",
    "draft_n",
    "draft_accepted",
    "placement",
    "model_bytes",
    "vram_bytes",
    "start",
    "error",
    "prompt_tokens_estimated",
    "queued_ms",
    "queue_position",
    "server_version",
    "reasoning_tokens",
    "reasoning_tokens_estimated",
    "reasoning_ms",
    "slowdown",
    "response_model",
    "slow_after_ms",
    "slow_after_usual_ms",
    "failure_kind",
    "failure_after_tokens",
    "failure_message",
    "stalls",
    "stalled_ms",
    "longest_stall_ms",
    "longest_stall_after_token",
    "output_tokens_per_second_excluding_stalls",
];

/// Writes the calls `filter` selects to `out`; returns how many.
pub fn export(
    store: &Store,
    filter: &HistoryFilter,
    format: ExportFormat,
    out: &mut dyn Write,
) -> Result<u64, StoreError> {
    let mut line = String::new();
    if format == ExportFormat::Csv {
        write_csv_record(&mut line, CSV_COLUMNS.iter().map(|c| c.to_string()));
        out.write_all(line.as_bytes())
            .map_err(StoreError::ExportWrite)?;
    }
    let n = for_each_call(store, filter, Order::OldestFirst, |call| {
        line.clear();
        match format {
            ExportFormat::Csv => write_csv_record(&mut line, csv_fields(&call)),
            ExportFormat::Jsonl => {
                // Serialising our own plain data can't fail.
                line.push_str(&serde_json::to_string(&call).unwrap_or_default());
                line.push('\n');
            }
        }
        out.write_all(line.as_bytes())
            .map_err(StoreError::ExportWrite)
    })?;
    out.flush().map_err(StoreError::ExportWrite)?;
    Ok(n)
}

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(String::new, |v| v.to_string())
}

/// One call's fields in [`CSV_COLUMNS`] order. Floats use Rust's shortest
/// round-trip form, so reading them back gives the same value.
fn csv_fields(c: &Call) -> impl Iterator<Item = String> {
    let d = &c.details;
    let s = c.speed.as_ref();
    let b = d.ttft_breakdown.as_ref();
    let w = d.wait.as_ref();
    let t = d.prompt_truncated.as_ref();
    [
        c.identity.id.clone(),
        c.identity.route.clone(),
        c.identity.api.as_str().to_owned(),
        opt(c.identity.model.as_deref()),
        opt(d.client.as_deref()),
        c.status.as_str().to_owned(),
        opt(c.http_status),
        c.identity.started_at.clone(),
        opt(d.settled_at.as_deref()),
        opt(s.map(|s| s.elapsed_ms)),
        opt(s.and_then(|s| s.time_to_first_token_ms)),
        opt(s.map(|s| s.output_tokens)),
        opt(s.and_then(|s| s.output_tokens_per_second)),
        opt(s.map(|s| s.token_source.as_str())),
        opt(c.input_tokens),
        opt(b.and_then(|b| b.load_ms)),
        opt(b.and_then(|b| b.prefill_ms)),
        opt(b.and_then(|b| b.prefill_tokens)),
        opt(b.and_then(|b| b.cached_tokens)),
        opt(b.and_then(|b| b.prefill_tokens_per_second)),
        opt(b.and_then(|b| b.other_ms)),
        d.one_burst.to_string(),
        d.unstreamed_reasoning.to_string(),
        d.seen_by.as_str().to_owned(),
        d.capture_gap.to_string(),
        opt(w.map(|w| w.reason.as_str())),
        opt(w.and_then(|w| w.position)),
        opt(w.and_then(|w| w.progress)),
        opt(w.and_then(|w| w.eta_ms)),
        opt(w.and_then(|w| w.usual_ms)),
        opt(w.and_then(|w| w.prompt_tokens)),
        opt(t.map(|t| t.request_tokens)),
        opt(t.map(|t| t.server_tokens)),
        opt(t.and_then(|t| t.context_size)),
        opt(d.context.as_ref().and_then(|c| c.size)),
        opt(d.context.as_ref().map(|c| c.used)),
        opt(d.draft.as_ref().map(|x| x.drafted)),
        opt(d.draft.as_ref().map(|x| x.accepted)),
        opt(d.placement.map(|p| p.as_str())),
        opt(d.model_bytes),
        opt(d.vram_bytes),
        opt(d.start.map(|s| s.as_str())),
        opt(d.error.as_deref()),
        opt(d.prompt_tokens_estimated),
        opt(d.queued_ms),
        opt(d.queue_position),
        opt(d.server_version.as_deref()),
        opt(d.reasoning_tokens),
        d.reasoning_tokens_estimated.to_string(),
        opt(d.reasoning_ms),
        opt(d
            .slowdown
            .as_ref()
            .and_then(|s| serde_json::to_string(s).ok())),
        opt(d.response_model.as_deref()),
        opt(d.slow_after_ms),
        opt(d.slow_after_usual_ms),
        opt(d.failure.as_ref().map(|f| f.kind.as_str())),
        opt(d.failure.as_ref().map(|f| f.after_tokens)),
        opt(d.failure.as_ref().and_then(|f| f.message.as_deref())),
        opt(d.stalls),
        opt(d.stalled_ms),
        opt(d.longest_stall_ms),
        opt(d.longest_stall_after_token),
        opt(d.output_tokens_per_second_excluding_stalls),
    ]
    .into_iter()
}

/// Appends one CSV record and its CRLF.
fn write_csv_record(out: &mut String, fields: impl Iterator<Item = String>) {
    for (i, field) in fields.enumerate() {
        if i > 0 {
            out.push(',');
        }
        if field.contains([',', '"', '\n', '\r']) {
            out.push('"');
            out.push_str(&field.replace('"', "\"\""));
            out.push('"');
        } else {
            out.push_str(&field);
        }
    }
    out.push_str("\r\n");
}

/// Reads an export back into calls, in file order.
pub fn parse_export(
    format: ExportFormat,
    reader: &mut dyn BufRead,
) -> Result<Vec<Call>, StoreError> {
    let mut text = String::new();
    reader
        .read_to_string(&mut text)
        .map_err(|e| StoreError::ExportParse {
            line: 0,
            message: e.to_string(),
        })?;
    match format {
        ExportFormat::Jsonl => parse_jsonl(&text),
        ExportFormat::Csv => parse_csv(&text),
    }
}

fn parse_jsonl(text: &str) -> Result<Vec<Call>, StoreError> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|e| StoreError::ExportParse {
                line: i as u64 + 1,
                message: e.to_string(),
            })
        })
        .collect()
}

/// Splits RFC 4180 text into records of fields, with the line each record
/// starts on. Accepts LF as well as CRLF.
fn csv_records(text: &str) -> Result<Vec<(u64, Vec<String>)>, StoreError> {
    let mut records = Vec::new();
    let mut fields = Vec::new();
    let mut field = String::new();
    let mut quoted = false;
    let mut line = 1u64;
    let mut start_line = 1u64;
    let mut chars = text.chars().peekable();
    let mut at_field_start = true;
    while let Some(ch) = chars.next() {
        if quoted {
            match ch {
                '"' if chars.peek() == Some(&'"') => {
                    chars.next();
                    field.push('"');
                }
                '"' => quoted = false,
                '\n' => {
                    line += 1;
                    field.push(ch);
                }
                _ => field.push(ch),
            }
            continue;
        }
        match ch {
            '"' if at_field_start => {
                quoted = true;
                at_field_start = false;
            }
            ',' => {
                fields.push(std::mem::take(&mut field));
                at_field_start = true;
            }
            '\r' if chars.peek() == Some(&'\n') => {}
            '\n' => {
                fields.push(std::mem::take(&mut field));
                records.push((start_line, std::mem::take(&mut fields)));
                line += 1;
                start_line = line;
                at_field_start = true;
            }
            _ => {
                field.push(ch);
                at_field_start = false;
            }
        }
    }
    if quoted {
        return Err(StoreError::ExportParse {
            line: start_line,
            message: "unterminated quoted field".into(),
        });
    }
    if !field.is_empty() || !fields.is_empty() {
        fields.push(field);
        records.push((start_line, fields));
    }
    Ok(records)
}

fn parse_csv(text: &str) -> Result<Vec<Call>, StoreError> {
    let mut records = csv_records(text)?.into_iter();
    let Some((_, header)) = records.next() else {
        return Ok(Vec::new());
    };
    if header != CSV_COLUMNS {
        return Err(StoreError::ExportParse {
            line: 1,
            message: format!("unexpected header; expected {}", CSV_COLUMNS.join(",")),
        });
    }
    records
        .filter(|(_, f)| !(f.len() == 1 && f[0].is_empty()))
        .map(|(line, fields)| {
            csv_call(&fields).map_err(|message| StoreError::ExportParse { line, message })
        })
        .collect()
}

/// The reverse of [`csv_fields`].
fn csv_call(f: &[String]) -> Result<Call, String> {
    if f.len() != CSV_COLUMNS.len() {
        return Err(format!(
            "{} fields, expected {}",
            f.len(),
            CSV_COLUMNS.len()
        ));
    }
    let r = CsvRow(f);
    let speed = csv_snapshot(r)?;
    let breakdown = csv_breakdown(r)?;
    Ok(Call {
        identity: CallIdentity {
            id: f[0].clone(),
            route: f[1].clone(),
            api: r.named(2)?,
            model: r.text(3),
            started_at: f[7].clone(),
            demo: false,
        },
        status: r.named(5)?,
        http_status: r.num(6)?,
        speed,
        input_tokens: r.num(14)?,
        details: csv_details(r, breakdown)?,
    })
}

/// One CSV record of [`CSV_COLUMNS`], read a field at a time; an error
/// names the column.
#[derive(Clone, Copy)]
struct CsvRow<'a>(&'a [String]);

impl CsvRow<'_> {
    /// A text field; empty is none.
    fn text(self, i: usize) -> Option<String> {
        (!self.0[i].is_empty()).then(|| self.0[i].clone())
    }

    /// A number; empty is none.
    fn num<T: std::str::FromStr>(self, i: usize) -> Result<Option<T>, String> {
        let f = self.0;
        if f[i].is_empty() {
            return Ok(None);
        }
        f[i].parse()
            .map(Some)
            .map_err(|_| format!("{}: not a number: {:?}", CSV_COLUMNS[i], f[i]))
    }

    /// A contract spelling (`ok`, `openai_chat`...), read with serde.
    fn named<T: serde::de::DeserializeOwned>(self, i: usize) -> Result<T, String> {
        serde_json::from_value(serde_json::Value::String(self.0[i].clone()))
            .map_err(|e| format!("{}: {e}", CSV_COLUMNS[i]))
    }

    /// `true` or `false`; empty is false.
    fn boolean(self, i: usize) -> Result<bool, String> {
        match self.0[i].as_str() {
            "true" => Ok(true),
            "false" | "" => Ok(false),
            other => Err(format!("{}: not true or false: {other:?}", CSV_COLUMNS[i])),
        }
    }
}

/// The final snapshot, present exactly when `token_source` is set.
fn csv_snapshot(r: CsvRow<'_>) -> Result<Option<Snapshot>, String> {
    Ok(match r.text(13) {
        None => None,
        Some(_) => Some(Snapshot {
            stalled_ms: None,
            phase: Phase::Complete,
            is_final: true,
            elapsed_ms: r.num(9)?.ok_or("elapsed_ms: missing")?,
            time_to_first_token_ms: r.num(10)?,
            output_tokens: r.num(11)?.ok_or("output_tokens: missing")?,
            output_tokens_per_second: r.num(12)?,
            token_source: r.named(13)?,
            wait: None,
        }),
    })
}

/// The TTFT breakdown's six columns (all empty: the default).
fn csv_breakdown(r: CsvRow<'_>) -> Result<TtftBreakdown, String> {
    Ok(TtftBreakdown {
        load_ms: r.num(15)?,
        prefill_ms: r.num(16)?,
        prefill_tokens: r.num(17)?,
        cached_tokens: r.num(18)?,
        prefill_tokens_per_second: r.num(19)?,
        other_ms: r.num(20)?,
    })
}

/// The call's details, from `client` and the columns after `input_tokens`.
fn csv_details(r: CsvRow<'_>, breakdown: TtftBreakdown) -> Result<CallDetails, String> {
    Ok(CallDetails {
        slow_after_ms: r.num(52)?,
        slow_after_usual_ms: r.num(53)?,
        client: r.text(4),
        ttft_breakdown: (breakdown != TtftBreakdown::default()).then_some(breakdown),
        one_burst: r.boolean(21)?,
        unstreamed_reasoning: r.boolean(22)?,
        settled_at: r.text(8),
        seen_by: r.named(23)?,
        capture_gap: r.boolean(24)?,
        wait: csv_wait(r)?,
        prompt_truncated: match (r.num(31)?, r.num(32)?) {
            (Some(request_tokens), Some(server_tokens)) => Some(PromptTruncation {
                request_tokens,
                server_tokens,
                context_size: r.num(33)?,
            }),
            _ => None,
        },
        context: r.num(35)?.map(|used| ContextUse {
            size: r.num(34).ok().flatten(),
            used,
        }),
        draft: match (r.num(36)?, r.num(37)?) {
            (Some(drafted), Some(accepted)) => Some(DraftCounts { drafted, accepted }),
            _ => None,
        },
        placement: r.text(38).map(|_| r.named(38)).transpose()?,
        model_bytes: r.num(39)?,
        vram_bytes: r.num(40)?,
        start: r.text(41).map(|_| r.named(41)).transpose()?,
        error: r.text(42),
        prompt_tokens_estimated: r.num(43)?,
        queued_ms: r.num(44)?,
        queue_position: r.num(45)?,
        // Legs of a relay are never stored.
        relay: None,
        server_version: r.text(46),
        reasoning_tokens: r.num(47)?,
        reasoning_tokens_estimated: r.boolean(48)?,
        reasoning_ms: r.num(49)?,
        slowdown: r
            .text(50)
            .map(|json| serde_json::from_str(&json).map_err(|e| format!("slowdown: {e}")))
            .transpose()?,
        response_model: r.text(51),
        failure: match r.text(54) {
            Some(_) => Some(Failure {
                kind: r.named(54)?,
                after_tokens: r.num(55)?.unwrap_or(0),
                message: r.text(56),
            }),
            None => None,
        },
        stalls: r.num(57)?,
        stalled_ms: r.num(58)?,
        longest_stall_ms: r.num(59)?,
        longest_stall_after_token: r.num(60)?,
        output_tokens_per_second_excluding_stalls: r.num(61)?,
    })
}

/// The wait explanation, present exactly when `wait_reason` is set.
fn csv_wait(r: CsvRow<'_>) -> Result<Option<Wait>, String> {
    Ok(match r.text(25) {
        None => None,
        Some(_) => Some(Wait {
            reason: r.named(25)?,
            position: r.num(26)?,
            progress: r.num(27)?,
            eta_ms: r.num(28)?,
            usual_ms: r.num(29)?,
            prompt_tokens: r.num(30)?,
            silent_ms: None,
            // Live only: not stored.
            progress_source: None,
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_quotes_only_what_needs_it_and_reads_it_back() {
        let fields = ["plain", "a,b", "say \"hi\"", "two\r\nlines", ""];
        let mut out = String::new();
        write_csv_record(&mut out, fields.iter().map(|s| s.to_string()));
        assert_eq!(
            out,
            "plain,\"a,b\",\"say \"\"hi\"\"\",\"two\r\nlines\",\r\n"
        );
        let records = csv_records(&out).unwrap();
        assert_eq!(records.len(), 1);
        assert_eq!(records[0].1, fields);
    }

    #[test]
    fn csv_reader_numbers_lines_and_rejects_broken_input() {
        let records = csv_records("a,b\n\"x\ny\",z\nlast,row").unwrap();
        assert_eq!(
            records.iter().map(|r| r.0).collect::<Vec<_>>(),
            vec![1, 2, 4]
        );
        assert_eq!(records[1].1, ["x\ny", "z"]);
        let err = csv_records("a,\"open\n").unwrap_err().to_string();
        assert!(
            err.contains("line 1") && err.contains("unterminated"),
            "{err}"
        );
        let err = parse_csv("id,route\n").unwrap_err().to_string();
        assert!(err.contains("unexpected header"), "{err}");
    }

    #[test]
    fn format_names_parse() {
        assert_eq!("CSV".parse::<ExportFormat>(), Ok(ExportFormat::Csv));
        assert_eq!("jsonl".parse::<ExportFormat>(), Ok(ExportFormat::Jsonl));
        assert!("xml".parse::<ExportFormat>().is_err());
    }
}
