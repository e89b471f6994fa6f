//! What `speedtap run` prints: one JSON line per snapshot with `--json`, or
//! the live terminal view on a TTY.
//!
//! Everything here is pure: the caller feeds engine events in, asks for
//! output with the current time, and writes what it gets. The view never
//! reads a clock or the terminal, so its throttling and layout are tested
//! with plain values.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::time::Duration;

use tokio::time::Instant;

use crate::model::Stats;
use crate::model::{Call, CallIdentity, CallStatus, EngineEvent, SlowFirstToken};
use crate::model::{Phase, Snapshot};

/// Shortest gap between two draws: at most 4 redraws a second.
pub const MIN_REDRAW: Duration = Duration::from_millis(250);

/// Shown wherever a number doesn't exist (yet): never a misleading 0.
pub const ABSENT: &str = "–";

/// How many settled ids are remembered to drop late `Speed` events.
const RECENT_SETTLED: usize = 1024;

/// Narrowest layout; a smaller reported width is taken as this.
const MIN_WIDTH: usize = 20;

const ROUTE_W: usize = 12;
const MODEL_W: usize = 24;
const STATE_W: usize = 10;

const BOLD: &str = "\x1b[1m";
const YELLOW: &str = "\x1b[33m";
const RESET: &str = "\x1b[0m";

/// The live terminal view.
///
/// Layout, top to bottom: lines that scroll (settled calls, printed once,
/// and slow-first-token warnings), then the live block, redrawn in place:
/// one line per active call (route, model, phase, TTFT, tok/s, tokens, token
/// source, elapsed), in the order the calls were first seen, and the global
/// stats line last.
///
/// Choices:
/// - Redraws are throttled to [`MIN_REDRAW`]; events in between are
///   coalesced, and lines to scroll wait for the next draw (nothing is lost,
///   they are only delayed by at most 250 ms).
/// - Columns have fixed widths (long route and model names are cut with
///   `…`), and every line is cut to one less than the terminal width so the
///   terminal never wraps it, which would break the in-place redraw.
/// - A call's token count shows [`ABSENT`] until its first token, like TTFT
///   and tok/s: "0 tokens" next to "no TTFT" would read as a measurement.
/// - `Speed` events that arrive after their call settled are ignored.
#[derive(Debug)]
pub struct TerminalView {
    width: usize,
    live: Vec<(CallIdentity, Snapshot)>,
    recent_settled: VecDeque<String>,
    scroll: Vec<String>,
    stats: Option<Stats>,
    dirty: bool,
    last_draw: Option<Instant>,
    /// Lines of the live block on screen, to move back over on redraw.
    drawn_lines: usize,
}

impl TerminalView {
    /// A view for a terminal `width` columns wide.
    pub fn new(width: usize) -> Self {
        TerminalView {
            width: width.max(MIN_WIDTH),
            live: Vec::new(),
            recent_settled: VecDeque::new(),
            scroll: Vec::new(),
            stats: None,
            dirty: true,
            last_draw: None,
            drawn_lines: 0,
        }
    }

    /// The terminal was resized.
    pub fn set_width(&mut self, width: usize) {
        let width = width.max(MIN_WIDTH);
        if width != self.width {
            self.width = width;
            self.dirty = true;
        }
    }

    /// Takes one engine event into the view's state.
    pub fn apply(&mut self, event: &EngineEvent) {
        match event {
            EngineEvent::Speed { call, speed, .. } => {
                if self.recent_settled.contains(&call.id) {
                    return;
                }
                match self.live.iter_mut().find(|(c, _)| c.id == call.id) {
                    Some((c, s)) => {
                        if c != call || s != speed {
                            *c = call.clone();
                            *s = speed.clone();
                            self.dirty = true;
                        }
                    }
                    None => {
                        self.live.push((call.clone(), speed.clone()));
                        self.dirty = true;
                    }
                }
            }
            EngineEvent::Settled(call) => {
                self.live.retain(|(c, _)| c.id != call.identity.id);
                if self.recent_settled.len() == RECENT_SETTLED {
                    self.recent_settled.pop_front();
                }
                self.recent_settled.push_back(call.identity.id.clone());
                let line = self.fit(&settled_line(call));
                self.scroll.push(line);
                self.dirty = true;
            }
            EngineEvent::Stats(stats) => {
                if self.stats.as_ref() != Some(stats) {
                    self.stats = Some(stats.clone());
                    self.dirty = true;
                }
            }
            EngineEvent::SlowFirstToken(slow) => {
                let line = self.fit(&Self::warning_line(slow));
                self.scroll.push(format!("{YELLOW}{line}{RESET}"));
                self.dirty = true;
            }
            EngineEvent::PromptTruncated(cut) => {
                let line = self.fit(&format!("warning: {}", cut.message()));
                self.scroll.push(format!("{YELLOW}{line}{RESET}"));
                self.dirty = true;
            }
            // Said on stderr by the watcher's own lines.
            EngineEvent::Servers(_) => {}
        }
    }

    /// Whether something changed since the last draw.
    pub fn is_dirty(&self) -> bool {
        self.dirty
    }

    /// The bytes to write now, or `None` if nothing changed or the last draw
    /// was less than [`MIN_REDRAW`] ago.
    pub fn render(&mut self, now: Instant) -> Option<String> {
        if !self.dirty {
            return None;
        }
        if let Some(last) = self.last_draw {
            if now.saturating_duration_since(last) < MIN_REDRAW {
                return None;
            }
        }
        self.last_draw = Some(now);
        Some(self.draw())
    }

    /// Draws whatever is pending regardless of the throttle: for the last
    /// frame before exit, so settled calls printed in the final 250 ms show.
    pub fn flush(&mut self) -> Option<String> {
        self.dirty.then(|| self.draw())
    }

    /// Prints a warning above the live block (a settled call's slowdown).
    pub fn warn(&mut self, line: &str) {
        let line = self.fit(line);
        self.scroll.push(format!("{YELLOW}{line}{RESET}"));
        self.dirty = true;
    }

    /// The headless warning for a late first token (plain text, no ANSI), e.g.
    /// `warning: qwen3:32b on ollama: no first token after 5.0 s (threshold 5.0 s)`.
    pub fn warning_line(slow: &SlowFirstToken) -> String {
        format!(
            "warning: {} (threshold {:.1} s)",
            slow.message(),
            slow.threshold_ms as f64 / 1000.0
        )
    }

    fn draw(&mut self) -> String {
        let mut out = String::new();
        if self.drawn_lines > 0 {
            // Back to the first line of the previous live block, then clear
            // it and everything below.
            let _ = write!(out, "\x1b[{}A", self.drawn_lines);
        }
        out.push_str("\r\x1b[J");
        for line in self.scroll.drain(..) {
            out.push_str(&line);
            out.push('\n');
        }
        for (call, speed) in &self.live {
            let line = live_line(call, speed);
            out.push_str(&fit(&line, self.width));
            out.push('\n');
        }
        let streaming = self
            .live
            .iter()
            .filter(|(_, speed)| speed.phase != Phase::AwaitingFirstToken)
            .count();
        let counts = CallCounts {
            in_flight: self.live.len(),
            streaming,
        };
        let stats = fit(&stats_line(self.stats.as_ref(), counts), self.width);
        let _ = writeln!(out, "{BOLD}{stats}{RESET}");
        self.drawn_lines = self.live.len() + 1;
        self.dirty = false;
        out
    }

    fn fit(&self, line: &str) -> String {
        fit(line, self.width)
    }
}

/// Cuts a line to `width - 1` visible characters (see [`TerminalView`]),
/// marking the cut with `…`. Lines here hold no escape sequences.
fn fit(line: &str, width: usize) -> String {
    let max = width.saturating_sub(1).max(1);
    if line.chars().count() <= max {
        return line.to_string();
    }
    let mut cut: String = line.chars().take(max - 1).collect();
    cut.push('…');
    cut
}

/// Left-aligns `s` in exactly `w` characters, cutting with `…`.
fn col(s: &str, w: usize) -> String {
    let n = s.chars().count();
    if n > w {
        let mut cut: String = s.chars().take(w.saturating_sub(1)).collect();
        cut.push('…');
        cut
    } else {
        format!("{s}{}", " ".repeat(w - n))
    }
}

fn phase_label(phase: Phase) -> &'static str {
    match phase {
        Phase::AwaitingFirstToken => "waiting",
        Phase::Reasoning => "reasoning",
        Phase::Responding => "responding",
        Phase::CallingTool => "tool call",
        Phase::Complete => "complete",
    }
}

/// The status column: `failed` for a call that failed, `left` for one
/// whose client hung up; how it failed follows the numbers
/// ([`failure_tail`]).
fn status_label(call: &Call) -> String {
    if let Some(failure) = &call.details.failure {
        return if failure.is_error() { "failed" } else { "left" }.into();
    }
    match call.status {
        CallStatus::Ok => "done".into(),
        CallStatus::InFlight => "in flight".into(),
        CallStatus::Abandoned => "abandoned".into(),
        CallStatus::UpstreamError => match call.http_status {
            Some(code) => format!("error {code}"),
            None => "error".into(),
        },
        CallStatus::Unmetered => "unmetered".into(),
    }
}

/// The numeric columns, shared by live and settled lines so they align.
fn numbers(speed: Option<&Snapshot>) -> String {
    let ttft = speed
        .and_then(|s| s.time_to_first_token_ms)
        .map_or(ABSENT.to_string(), |ms| format!("{ms} ms"));
    let tps = speed
        .and_then(|s| s.output_tokens_per_second)
        .map_or(ABSENT.to_string(), |r| format!("{r:.1}"));
    let tokens = speed
        .filter(|s| s.output_tokens > 0 || s.time_to_first_token_ms.is_some())
        .map_or(ABSENT.to_string(), |s| s.output_tokens.to_string());
    let source = speed.map_or("", |s| s.token_source.as_str());
    let elapsed = speed.map_or(ABSENT.to_string(), |s| {
        format!("{:.1} s", s.elapsed_ms as f64 / 1000.0)
    });
    format!("TTFT {ttft:>9}  {tps:>7} tok/s  {tokens:>7} tok  {source:<9}  {elapsed:>8}")
}

fn identity_columns(call: &CallIdentity) -> String {
    format!(
        "{} {}",
        col(&call.route, ROUTE_W),
        col(call.model.as_deref().unwrap_or(ABSENT), MODEL_W)
    )
}

fn live_line(call: &CallIdentity, speed: &Snapshot) -> String {
    format!(
        "{} {} {}",
        identity_columns(call),
        col(phase_label(speed.phase), STATE_W),
        numbers(Some(speed))
    )
}

fn settled_line(call: &Call) -> String {
    format!(
        "{} {} {}{}",
        identity_columns(&call.identity),
        col(&status_label(call), STATE_W),
        numbers(call.speed.as_ref()),
        failure_tail(call)
    )
    .trim_end()
    .to_string()
}

/// How a call failed, after its numbers, in the words every front end
/// uses ([`crate::model::Failure::label`]): `  · broke after 30 tokens`,
/// `  · HTTP 500 (server_error)`, `  · client left`.
fn failure_tail(call: &Call) -> String {
    let Some(failure) = &call.details.failure else {
        return String::new();
    };
    let mut tail = format!("  · {}", failure.label(call.http_status));
    if let Some(message) = &failure.message {
        tail.push_str(&format!(" ({message})"));
    }
    tail
}

/// The calls the live block lists: all of them in flight, and those past
/// their first token. Counted from the lines shown, never from the meter's
/// active set (which leaves out calls still waiting), so the footer can't
/// say 0 under three call lines.
#[derive(Clone, Copy, Debug)]
struct CallCounts {
    in_flight: usize,
    streaming: usize,
}

fn stats_line(stats: Option<&Stats>, counts: CallCounts) -> String {
    let num = |v: Option<f64>| v.map_or(ABSENT.to_string(), |x| format!("{x:.1}"));
    let tps = num(stats.and_then(|s| s.tps));
    let est = if stats.is_some_and(|s| s.tps.is_some() && s.estimated) {
        " (est.)"
    } else {
        "       "
    };
    let aggregate = num(stats.and_then(|s| s.aggregate_tps));
    let CallCounts {
        in_flight,
        streaming,
    } = counts;
    let high = num(stats.and_then(|s| s.high));
    let low = num(stats.and_then(|s| s.low));
    format!(
        "{} {tps:>7} tok/s{est}  aggregate {aggregate:>7} tok/s  in flight {in_flight:>2} · streaming {streaming:>2}  hour high {high} low {low}",
        col("all calls", ROUTE_W)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{json_line, ApiKind, SeenBy, SpeedEvent, TokenSource};

    fn ident(id: &str, model: Option<&str>) -> CallIdentity {
        CallIdentity {
            id: id.into(),
            route: "ollama".into(),
            api: ApiKind::OpenaiChat,
            model: model.map(str::to_string),
            started_at: "2026-11-30T10:42:07.123Z".into(),
            demo: false,
        }
    }

    fn waiting(elapsed_ms: u64) -> Snapshot {
        Snapshot {
            stalled_ms: None,
            phase: Phase::AwaitingFirstToken,
            is_final: false,
            elapsed_ms,
            time_to_first_token_ms: None,
            output_tokens: 0,
            output_tokens_per_second: None,
            token_source: TokenSource::Estimated,
            wait: None,
        }
    }

    fn responding(tokens: u64, tps: f64) -> Snapshot {
        Snapshot {
            stalled_ms: None,
            phase: Phase::Responding,
            is_final: false,
            elapsed_ms: 2000,
            time_to_first_token_ms: Some(312),
            output_tokens: tokens,
            output_tokens_per_second: Some(tps),
            token_source: TokenSource::Estimated,
            wait: None,
        }
    }

    fn speed(id: &str, s: Snapshot) -> EngineEvent {
        EngineEvent::Speed {
            call: ident(id, Some("qwen3:8b")),
            speed: s,
            seen_by: SeenBy::Proxy,
        }
    }

    fn settled(id: &str) -> EngineEvent {
        EngineEvent::Settled(Call {
            identity: ident(id, Some("qwen3:8b")),
            status: CallStatus::Ok,
            http_status: Some(200),
            speed: Some(Snapshot {
                stalled_ms: None,
                phase: Phase::Complete,
                is_final: true,
                elapsed_ms: 5120,
                time_to_first_token_ms: Some(312),
                output_tokens: 201,
                output_tokens_per_second: Some(41.7),
                token_source: TokenSource::Server,
                wait: None,
            }),
            input_tokens: Some(37),
            details: Default::default(),
        })
    }

    /// Visible lines of one frame: escape sequences removed.
    fn lines(frame: &str) -> Vec<String> {
        let mut plain = String::new();
        let mut chars = frame.chars();
        while let Some(c) = chars.next() {
            if c == '\x1b' {
                // CSI: ESC [ params final-byte
                chars.next();
                for c in chars.by_ref() {
                    if c.is_ascii_alphabetic() {
                        break;
                    }
                }
            } else if c != '\r' {
                plain.push(c);
            }
        }
        plain.lines().map(str::to_string).collect()
    }

    #[test]
    fn json_line_is_the_sse_speed_payload() {
        let call = ident("c-000042", Some("qwen3:8b"));
        let snap = responding(201, 41.7);
        let line = json_line(&call, &snap, SeenBy::Capture);
        assert!(!line.contains('\n'));

        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        let keys = |v: &serde_json::Value| {
            let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
            k.sort();
            k
        };
        assert_eq!(keys(&v), ["call", "seen_by", "speed"]);
        assert_eq!(v["seen_by"], "capture");
        assert_eq!(
            keys(&v["call"]),
            ["api", "id", "model", "route", "started_at"]
        );
        assert_eq!(
            keys(&v["speed"]),
            [
                "elapsed_ms",
                "is_final",
                "output_tokens",
                "output_tokens_per_second",
                "phase",
                "time_to_first_token_ms",
                "token_source"
            ]
        );
        assert_eq!(v["call"]["api"], "openai_chat");
        assert_eq!(v["speed"]["phase"], "responding");
        assert_eq!(v["speed"]["output_tokens_per_second"], 41.7);

        let back: SpeedEvent = serde_json::from_str(&line).unwrap();
        assert_eq!(
            back,
            SpeedEvent {
                call,
                speed: snap,
                seen_by: SeenBy::Capture
            }
        );

        // Absent numbers are absent, not zero.
        let v: serde_json::Value =
            serde_json::from_str(&json_line(&ident("c-1", None), &waiting(10), SeenBy::Proxy))
                .unwrap();
        assert!(v["speed"].get("time_to_first_token_ms").is_none());
        assert!(v["speed"].get("output_tokens_per_second").is_none());
        assert!(v["call"].get("model").is_none());
    }

    #[test]
    fn render_is_throttled_to_four_a_second_and_skips_when_unchanged() {
        let t0 = Instant::now();
        let mut view = TerminalView::new(120);
        view.apply(&speed("c-1", responding(10, 20.0)));
        assert!(view.render(t0).is_some());
        // Nothing changed: nothing to draw, however late.
        assert!(view.render(t0 + Duration::from_secs(5)).is_none());

        view.apply(&speed("c-1", responding(20, 21.0)));
        assert!(view.render(t0 + Duration::from_millis(249)).is_none());
        let frame = view.render(t0 + Duration::from_millis(250)).expect("due");
        assert!(frame.contains("21.0 tok/s"), "{frame}");

        // The same snapshot again is no change.
        view.apply(&speed("c-1", responding(20, 21.0)));
        assert!(view.render(t0 + Duration::from_secs(10)).is_none());

        // Events within the window are coalesced into the next frame.
        view.apply(&speed("c-1", responding(30, 22.0)));
        view.apply(&speed("c-1", responding(40, 23.0)));
        assert!(view.render(t0 + Duration::from_millis(400)).is_none());
        let frame = view.render(t0 + Duration::from_millis(500)).unwrap();
        assert!(
            frame.contains("23.0 tok/s") && !frame.contains("22.0"),
            "{frame}"
        );
    }

    #[test]
    fn absent_numbers_show_a_dash_not_zero() {
        let mut view = TerminalView::new(160);
        view.apply(&EngineEvent::Speed {
            call: ident("c-1", None),
            speed: waiting(1500),
            seen_by: SeenBy::Proxy,
        });
        let frame = view.render(Instant::now()).unwrap();
        let l = lines(&frame);
        assert_eq!(l.len(), 2, "{l:?}");
        let call = &l[0];
        assert!(call.contains("waiting"), "{call}");
        // model, TTFT, tok/s and tokens are all absent.
        assert_eq!(call.matches(ABSENT).count(), 4, "{call}");
        assert!(
            !call.contains(" 0 ") && !call.contains("0.0") && !call.contains("0 ms"),
            "{call}"
        );
        assert!(call.contains("1.5 s"), "{call}");
        // Without stats every number is absent; the counts are the lines
        // shown: one call in flight, not streaming yet.
        let stats = &l[1];
        assert_eq!(stats.matches(ABSENT).count(), 4, "{stats}");
        assert!(stats.contains("in flight  1 · streaming  0"), "{stats}");
        assert!(!stats.contains("0.0"), "{stats}");
    }

    #[test]
    fn stats_line_shows_the_global_numbers() {
        let mut view = TerminalView::new(160);
        view.apply(&EngineEvent::Stats(Stats {
            tps: Some(47.3),
            tps_available: true,
            estimated: true,
            high: Some(52.1),
            low: Some(31.4),
            active: 2,
            aggregate_tps: Some(94.6),
            dropped_subscribers: 0,
            capture_dropped_packets: 0,
        }));
        let l = lines(&view.render(Instant::now()).unwrap());
        assert_eq!(l.len(), 1);
        let s = &l[0];
        for part in [
            "47.3 tok/s (est.)",
            "aggregate    94.6 tok/s",
            "in flight  0 · streaming  0",
            "hour high 52.1 low 31.4",
        ] {
            assert!(s.contains(part), "{s:?} lacks {part:?}");
        }
    }

    #[test]
    fn the_footer_counts_the_calls_it_lists_not_the_meters_active_streams() {
        let mut view = TerminalView::new(200);
        view.apply(&speed("c-1", responding(30, 20.0)));
        view.apply(&speed("c-2", waiting(100)));
        view.apply(&speed("c-3", waiting(200)));
        // The meter counts only streams with a token: it says 1, or 0 once
        // that stream went quiet, beside three call lines.
        view.apply(&EngineEvent::Stats(Stats {
            active: 0,
            ..Stats::default()
        }));
        let l = lines(&view.render(Instant::now()).unwrap());
        assert_eq!(l.len(), 4, "{l:?}");
        assert!(l[3].contains("in flight  3 · streaming  1"), "{:?}", l[3]);
    }

    #[test]
    fn settled_calls_scroll_above_the_live_block_once() {
        let t0 = Instant::now();
        let mut view = TerminalView::new(160);
        view.apply(&speed("c-1", responding(10, 20.0)));
        view.apply(&speed("c-2", waiting(100)));
        let first = view.render(t0).unwrap();
        assert!(
            first.starts_with("\r\x1b[J"),
            "no cursor-up on the first frame: {first:?}"
        );
        assert_eq!(lines(&first).len(), 3);

        view.apply(&settled("c-1"));
        // A late snapshot of the settled call must not bring it back.
        view.apply(&speed("c-1", responding(11, 20.0)));
        let frame = view.render(t0 + Duration::from_millis(300)).unwrap();
        // Back over the 3 lines drawn before, then clear.
        assert!(frame.starts_with("\x1b[3A\r\x1b[J"), "{frame:?}");
        let l = lines(&frame);
        assert_eq!(l.len(), 3, "{l:?}");
        assert!(
            l[0].contains("done") && l[0].contains("201") && l[0].contains("41.7"),
            "{l:?}"
        );
        assert!(l[0].contains("server") && l[0].contains("312 ms"), "{l:?}");
        assert!(l[1].contains("waiting"), "{l:?}");
        assert!(l[2].starts_with("all calls"), "{l:?}");

        // Next frame: the settled line is not printed again, and only the
        // live block (1 call + stats) is redrawn.
        view.apply(&speed("c-2", responding(5, 9.0)));
        let frame = view.render(t0 + Duration::from_millis(600)).unwrap();
        assert!(frame.starts_with("\x1b[2A"), "{frame:?}");
        let l = lines(&frame);
        assert_eq!(l.len(), 2, "{l:?}");
        assert!(!frame.contains("done"));
    }

    #[test]
    fn slow_first_token_warnings_scroll_too() {
        let slow = SlowFirstToken {
            call: ident("c-1", Some("qwen3:32b")),
            waited_ms: 5000,
            threshold_ms: 5000,
            reason: None,
            usual_ms: None,
        };
        assert_eq!(
            TerminalView::warning_line(&slow),
            "warning: qwen3:32b on ollama: no first token after 5.0 s (threshold 5.0 s)"
        );
        let mut view = TerminalView::new(160);
        view.apply(&EngineEvent::SlowFirstToken(slow));
        let frame = view.render(Instant::now()).unwrap();
        assert!(
            frame.contains(&format!("{YELLOW}warning: qwen3:32b")),
            "{frame:?}"
        );
        assert_eq!(lines(&frame).len(), 2);
    }

    #[test]
    fn widths_stay_stable_and_lines_fit_the_terminal() {
        let t0 = Instant::now();
        let mut view = TerminalView::new(200);
        view.apply(&speed("c-1", responding(9, 5.0)));
        let a = lines(&view.render(t0).unwrap());
        view.apply(&speed("c-1", responding(12345, 123.4)));
        let b = lines(&view.render(t0 + MIN_REDRAW).unwrap());
        let len = |s: &String| s.chars().count();
        assert_eq!(len(&a[0]), len(&b[0]), "{a:?} {b:?}");
        assert_eq!(a[0].find("tok/s"), b[0].find("tok/s"));

        let mut narrow = TerminalView::new(40);
        narrow.apply(&EngineEvent::Speed {
            call: ident("c-1", Some("a-very-long-model-name-that-goes-on:70b")),
            speed: responding(1, 1.0),
            seen_by: SeenBy::Proxy,
        });
        for l in lines(&narrow.render(t0).unwrap()) {
            assert!(l.chars().count() <= 39, "{l:?}");
            assert!(l.ends_with('…'), "{l:?}");
        }
    }

    #[test]
    fn flush_ignores_the_throttle_but_not_the_dirty_flag() {
        let t0 = Instant::now();
        let mut view = TerminalView::new(100);
        assert!(view.render(t0).is_some());
        view.apply(&settled("c-9"));
        assert!(view.render(t0 + Duration::from_millis(1)).is_none());
        let frame = view.flush().unwrap();
        assert!(lines(&frame)[0].contains("done"));
        assert!(view.flush().is_none());
    }

    #[test]
    fn upstream_errors_and_unmetered_calls_settle_readably() {
        let mut call = match settled("c-1") {
            EngineEvent::Settled(c) => c,
            _ => unreachable!(),
        };
        call.status = CallStatus::UpstreamError;
        call.http_status = Some(502);
        call.speed = None;
        let line = settled_line(&call);
        assert!(line.contains("error 502"), "{line}");
        assert_eq!(line.matches(ABSENT).count(), 4, "{line}");
        call.status = CallStatus::Unmetered;
        assert!(settled_line(&call).contains("unmetered"));
    }

    #[test]
    fn a_failed_call_says_how_it_failed_and_a_client_that_left_is_no_failure() {
        use crate::model::{Failure, FailureKind};
        let mut call = match settled("c-1") {
            EngineEvent::Settled(c) => c,
            _ => unreachable!(),
        };
        call.status = CallStatus::Abandoned;
        call.http_status = Some(200);
        call.details.failure = Some(Failure::new(FailureKind::BrokeOff, 30, None));
        let line = settled_line(&call);
        assert!(line.contains(" failed "), "{line}");
        assert!(line.ends_with("· broke after 30 tokens"), "{line}");
        assert!(!line.contains("error 200"), "{line}");
        call.details.failure = Some(Failure::new(FailureKind::ClientLeft, 3, None));
        let line = settled_line(&call);
        assert!(
            line.ends_with("· client left") && !line.contains("failed"),
            "{line}"
        );
    }
}
