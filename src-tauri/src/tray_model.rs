//! What the tray shows, computed from the engine's events: the label, the
//! icon state and the menu entries. Pure: events and the current time go
//! in, a [`TrayView`] comes out; [`crate::tray`] applies it to the real
//! tray icon. Keeping the decisions here means they are unit-tested without
//! a display, and the tray module only diffs and draws.
//!
//! Choices where the issue is silent, made for what a user glancing at the
//! tray expects:
//! - The label is the global `tps` (`41.7 tok/s`) whenever the engine has
//!   one. Without a rate it says what is going on instead: the longest
//!   current wait for a first token (`waiting 3.2 s`), the phase of a call
//!   that streams but has no honest rate yet (`responding`), or `idle`.
//!   Never `0 tok/s`: no number rather than a wrong one.
//! - The icon state is the most urgent thing happening: `Slow` (a call is
//!   waiting longer than the slow-first-token threshold, or the engine
//!   raised the alarm for it) beats `Streaming` beats `Waiting` beats
//!   `Idle`.
//! - The menu lists at most [`MAX_CALL_ENTRIES`] calls, longest-running
//!   first, then a "… and N more" line, so a burst of parallel calls
//!   cannot grow the menu off the screen.

use std::collections::{BTreeMap, HashSet};

use speedtap::model::RouteInfo;
use speedtap::model::Stats;
use speedtap::model::{Call, CallIdentity, EngineEvent};
use speedtap::model::{Phase, Snapshot};
use tokio::time::Instant;

/// Menu item ids. Entries whose id starts with [`ID_CALL_PREFIX`] or
/// [`ID_COPY_PREFIX`] carry a call id or a route name after the prefix.
pub const ID_CALL_PREFIX: &str = "call:";
/// "… and N more" below the listed calls.
pub const ID_MORE_CALLS: &str = "calls-more";
/// "No calls in flight".
pub const ID_NO_CALLS: &str = "calls-none";
/// The hour's high and low.
pub const ID_HOUR: &str = "hour";
/// "Open speedtap": show and focus the window.
pub const ID_OPEN: &str = "open";
/// "Pause notifications" (a check item).
pub const ID_PAUSE: &str = "pause-notifications";
/// "Copy proxy URL (NAME)", one per bound route.
pub const ID_COPY_PREFIX: &str = "copy:";
/// "Quit": exit 0.
pub const ID_QUIT: &str = "quit";

/// At most this many calls get their own menu line.
pub const MAX_CALL_ENTRIES: usize = 8;

/// The four states the tray icon can show.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TrayState {
    /// No call in flight.
    Idle,
    /// Calls in flight, none has produced a first token yet.
    Waiting,
    /// Tokens are flowing.
    Streaming,
    /// A first token is later than the threshold.
    Slow,
}

/// What a menu line is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EntryKind {
    /// Greyed-out information (a call, the hour's high/low).
    Info,
    /// A clickable action.
    Action,
    /// A check item and whether it is checked.
    Check(bool),
    Separator,
}

/// One menu line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MenuEntry {
    /// A stable id: the tray matches clicks on it, and an entry with the
    /// same id and kind is updated in place instead of rebuilding the menu.
    pub id: String,
    pub kind: EntryKind,
    pub text: String,
}

impl MenuEntry {
    fn new(id: impl Into<String>, kind: EntryKind, text: impl Into<String>) -> Self {
        MenuEntry {
            id: id.into(),
            kind,
            text: text.into(),
        }
    }

    fn separator(n: usize) -> Self {
        MenuEntry::new(format!("sep-{n}"), EntryKind::Separator, "")
    }
}

/// Everything the tray shows.
#[derive(Clone, Debug, PartialEq)]
pub struct TrayView {
    /// The label next to the icon (the appindicator label on Linux, the
    /// menu-bar title on macOS).
    pub title: String,
    pub state: TrayState,
    pub menu: Vec<MenuEntry>,
}

impl TrayView {
    /// True when `other` has the same entries in the same order with the
    /// same kinds (texts and check marks may differ): then the menu can be
    /// updated in place.
    pub fn same_menu_shape(&self, other: &TrayView) -> bool {
        self.menu.len() == other.menu.len()
            && self
                .menu
                .iter()
                .zip(&other.menu)
                .all(|(a, b)| a.id == b.id && same_kind(&a.kind, &b.kind))
    }
}

fn same_kind(a: &EntryKind, b: &EntryKind) -> bool {
    matches!(
        (a, b),
        (EntryKind::Info, EntryKind::Info)
            | (EntryKind::Action, EntryKind::Action)
            | (EntryKind::Check(_), EntryKind::Check(_))
            | (EntryKind::Separator, EntryKind::Separator)
    )
}

/// What the view needs besides the events.
#[derive(Clone, Debug, PartialEq)]
pub struct ViewInputs<'a> {
    /// "Pause notifications" is on.
    pub paused: bool,
    /// The routes bound now (for the copy entries).
    pub routes: &'a [RouteInfo],
    /// The slow-first-token threshold now (settings can change it live).
    pub slow_ttft_ms: u64,
}

/// A call in flight as the tray knows it.
#[derive(Clone, Debug)]
struct Active {
    call: CallIdentity,
    speed: Snapshot,
    /// When `speed` arrived: a waiting call's wait keeps growing after its
    /// last snapshot.
    seen_at: Instant,
}

/// The tray's model of the engine: calls in flight and the latest global
/// reading.
#[derive(Debug)]
pub struct TrayModel {
    active: BTreeMap<String, Active>,
    /// Calls the engine raised the slow-first-token alarm for.
    alarmed: HashSet<String>,
    stats: Stats,
}

impl Default for TrayModel {
    fn default() -> Self {
        Self::new()
    }
}

impl TrayModel {
    pub fn new() -> Self {
        TrayModel {
            active: BTreeMap::new(),
            alarmed: HashSet::new(),
            stats: Stats::default(),
        }
    }

    /// Starts over from a list of calls (after (re)subscribing, when events
    /// may have been missed): keeps the in-flight ones.
    pub fn reseed(&mut self, calls: &[Call], now: Instant) {
        self.active.clear();
        self.alarmed.clear();
        for call in calls {
            if call.status.is_settled() {
                continue;
            }
            if let Some(speed) = &call.speed {
                self.upsert(&call.identity, speed, now);
            }
        }
    }

    /// Takes one engine event into account. Returns true when the tray
    /// should be redrawn now: on each global reading (the cadence the label
    /// follows) and on a slow-first-token alarm (an alarm should not wait
    /// for the next idle-cadence reading).
    pub fn apply(&mut self, event: &EngineEvent, now: Instant) -> bool {
        match event {
            EngineEvent::Speed { call, speed } => {
                if speed.is_final {
                    self.forget(&call.id);
                } else {
                    self.upsert(call, speed, now);
                }
                false
            }
            EngineEvent::Settled(call) => {
                self.forget(&call.identity.id);
                false
            }
            EngineEvent::Stats(stats) => {
                self.stats = stats.clone();
                true
            }
            EngineEvent::SlowFirstToken(slow) => {
                if self.active.contains_key(&slow.call.id) {
                    self.alarmed.insert(slow.call.id.clone());
                }
                true
            }
        }
    }

    fn upsert(&mut self, call: &CallIdentity, speed: &Snapshot, now: Instant) {
        self.active.insert(
            call.id.clone(),
            Active {
                call: call.clone(),
                speed: speed.clone(),
                seen_at: now,
            },
        );
    }

    fn forget(&mut self, id: &str) {
        self.active.remove(id);
        self.alarmed.remove(id);
    }

    /// Number of calls in flight.
    pub fn active_calls(&self) -> usize {
        self.active.len()
    }

    /// How long `a` has been waiting for its first token at `now`, if it is.
    fn waiting_ms(a: &Active, now: Instant) -> Option<u64> {
        (a.speed.phase == Phase::AwaitingFirstToken).then(|| {
            a.speed.elapsed_ms + now.saturating_duration_since(a.seen_at).as_millis() as u64
        })
    }

    /// The label next to the icon.
    pub fn title(&self, now: Instant) -> String {
        if let Some(tps) = self.stats.tps.filter(|_| self.stats.tps_available) {
            return format!("{tps:.1} tok/s");
        }
        if let Some(wait) = self
            .active
            .values()
            .filter_map(|a| Self::waiting_ms(a, now))
            .max()
        {
            return format!("waiting {}", seconds(wait));
        }
        match self.active.values().map(|a| a.speed.phase).next() {
            Some(phase) => phase_label(phase).to_owned(),
            None => "idle".to_owned(),
        }
    }

    /// The icon state.
    pub fn state(&self, now: Instant, slow_ttft_ms: u64) -> TrayState {
        let mut state = TrayState::Idle;
        for (id, a) in &self.active {
            let here = match Self::waiting_ms(a, now) {
                Some(wait) if wait >= slow_ttft_ms || self.alarmed.contains(id) => {
                    return TrayState::Slow
                }
                Some(_) => TrayState::Waiting,
                None => TrayState::Streaming,
            };
            if here == TrayState::Streaming || state == TrayState::Idle {
                state = here;
            }
        }
        if state == TrayState::Idle && self.stats.tps_available {
            // A stream the engine still counts (a token in the last minute)
            // whose settled event has not reached us yet.
            state = TrayState::Streaming;
        }
        state
    }

    /// Everything the tray shows at `now`.
    pub fn view(&self, now: Instant, inputs: &ViewInputs<'_>) -> TrayView {
        let mut menu = Vec::new();
        let mut calls: Vec<&Active> = self.active.values().collect();
        // Longest-running first: the ones a user is most likely wondering about.
        calls.sort_by_key(|a| std::cmp::Reverse(Self::elapsed_ms(a, now)));
        if calls.is_empty() {
            menu.push(MenuEntry::new(
                ID_NO_CALLS,
                EntryKind::Info,
                "No calls in flight",
            ));
        }
        for a in calls.iter().take(MAX_CALL_ENTRIES) {
            menu.push(MenuEntry::new(
                format!("{ID_CALL_PREFIX}{}", a.call.id),
                EntryKind::Info,
                call_line(a, Self::waiting_ms(a, now)),
            ));
        }
        if calls.len() > MAX_CALL_ENTRIES {
            menu.push(MenuEntry::new(
                ID_MORE_CALLS,
                EntryKind::Info,
                format!("… and {} more", calls.len() - MAX_CALL_ENTRIES),
            ));
        }
        menu.push(MenuEntry::new(
            ID_HOUR,
            EntryKind::Info,
            hour_line(&self.stats),
        ));
        menu.push(MenuEntry::separator(1));
        menu.push(MenuEntry::new(ID_OPEN, EntryKind::Action, "Open speedtap"));
        menu.push(MenuEntry::new(
            ID_PAUSE,
            EntryKind::Check(inputs.paused),
            "Pause notifications",
        ));
        for route in inputs.routes {
            menu.push(MenuEntry::new(
                format!("{ID_COPY_PREFIX}{}", route.name),
                EntryKind::Action,
                format!("Copy proxy URL ({})", route.name),
            ));
        }
        menu.push(MenuEntry::separator(2));
        menu.push(MenuEntry::new(ID_QUIT, EntryKind::Action, "Quit"));
        TrayView {
            title: self.title(now),
            state: self.state(now, inputs.slow_ttft_ms),
            menu,
        }
    }

    fn elapsed_ms(a: &Active, now: Instant) -> u64 {
        a.speed.elapsed_ms + now.saturating_duration_since(a.seen_at).as_millis() as u64
    }
}

/// `3.2 s`, one decimal.
fn seconds(ms: u64) -> String {
    format!("{:.1} s", ms as f64 / 1000.0)
}

/// A phase in words, for the label and the menu.
pub fn phase_label(phase: Phase) -> &'static str {
    match phase {
        Phase::AwaitingFirstToken => "waiting",
        Phase::Reasoning => "reasoning",
        Phase::Responding => "responding",
        Phase::CallingTool => "calling a tool",
        Phase::Complete => "complete",
    }
}

/// `qwen3:8b on ollama · responding · 41.7 tok/s`; a waiting call shows
/// its wait instead of a rate, and a call without a rate shows none.
fn call_line(a: &Active, waiting_ms: Option<u64>) -> String {
    let model = a.call.model.as_deref().unwrap_or("unknown model");
    let head = format!("{model} on {}", a.call.route);
    if let Some(wait) = waiting_ms {
        return format!("{head} · waiting {}", seconds(wait));
    }
    let phase = phase_label(a.speed.phase);
    match a.speed.output_tokens_per_second {
        Some(tps) => format!("{head} · {phase} · {tps:.1} tok/s"),
        None => format!("{head} · {phase}"),
    }
}

/// The hour's high and low, or that there is none yet.
fn hour_line(stats: &Stats) -> String {
    match (stats.high, stats.low) {
        (Some(high), Some(low)) => format!("Last hour: high {high:.1} · low {low:.1} tok/s"),
        (Some(one), None) | (None, Some(one)) => format!("Last hour: {one:.1} tok/s"),
        (None, None) => "Last hour: no readings yet".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use speedtap::model::ApiKind;
    use speedtap::model::TokenSource;
    use speedtap::model::{CallStatus, SlowFirstToken};

    use super::*;

    fn ident(id: &str, model: &str) -> CallIdentity {
        CallIdentity {
            id: id.into(),
            route: "ollama".into(),
            api: ApiKind::OllamaChat,
            model: Some(model.into()),
            started_at: "2026-11-30T10:42:07.123Z".into(),
        }
    }

    fn snap(phase: Phase, elapsed_ms: u64, tps: Option<f64>) -> Snapshot {
        Snapshot {
            phase,
            is_final: phase == Phase::Complete,
            elapsed_ms,
            time_to_first_token_ms: (phase != Phase::AwaitingFirstToken).then_some(300),
            output_tokens: 10,
            output_tokens_per_second: tps,
            token_source: TokenSource::Estimated,
        }
    }

    fn speed(id: &str, phase: Phase, elapsed_ms: u64, tps: Option<f64>) -> EngineEvent {
        EngineEvent::Speed {
            call: ident(id, "qwen3:8b"),
            speed: snap(phase, elapsed_ms, tps),
        }
    }

    fn stats(tps: Option<f64>, high: Option<f64>, low: Option<f64>) -> EngineEvent {
        EngineEvent::Stats(Stats {
            tps,
            tps_available: tps.is_some(),
            estimated: false,
            high,
            low,
            active: 1,
            aggregate_tps: tps,
            dropped_subscribers: 0,
            capture_dropped_packets: 0,
        })
    }

    const INPUTS: ViewInputs<'static> = ViewInputs {
        paused: false,
        routes: &[],
        slow_ttft_ms: 5000,
    };

    #[test]
    fn idle_until_something_happens() {
        let t0 = Instant::now();
        let m = TrayModel::new();
        let v = m.view(t0, &INPUTS);
        assert_eq!(v.title, "idle");
        assert_eq!(v.state, TrayState::Idle);
        assert_eq!(v.menu[0].text, "No calls in flight");
        assert_eq!(v.menu[1].text, "Last hour: no readings yet");
    }

    #[test]
    fn label_is_the_global_rate_with_one_decimal() {
        let t0 = Instant::now();
        let mut m = TrayModel::new();
        m.apply(&speed("c-1", Phase::Responding, 900, Some(41.66)), t0);
        assert!(m.apply(&stats(Some(41.7), Some(52.1), Some(31.4)), t0));
        let v = m.view(t0, &INPUTS);
        assert_eq!(v.title, "41.7 tok/s");
        assert_eq!(v.state, TrayState::Streaming);
        assert_eq!(v.menu[0].id, "call:c-1");
        assert_eq!(
            v.menu[0].text,
            "qwen3:8b on ollama · responding · 41.7 tok/s"
        );
        assert_eq!(v.menu[1].text, "Last hour: high 52.1 · low 31.4 tok/s");
    }

    #[test]
    fn speed_events_do_not_ask_for_a_redraw_only_stats_and_alarms_do() {
        let t0 = Instant::now();
        let mut m = TrayModel::new();
        assert!(!m.apply(&speed("c-1", Phase::Responding, 900, Some(4.0)), t0));
        assert!(m.apply(&stats(None, None, None), t0));
        let alarm = EngineEvent::SlowFirstToken(SlowFirstToken {
            call: ident("c-1", "qwen3:8b"),
            waited_ms: 5000,
            threshold_ms: 5000,
        });
        assert!(m.apply(&alarm, t0));
    }

    #[test]
    fn waiting_label_counts_on_after_the_last_snapshot() {
        let t0 = Instant::now();
        let mut m = TrayModel::new();
        m.apply(&speed("c-1", Phase::AwaitingFirstToken, 1200, None), t0);
        m.apply(&stats(None, None, None), t0);
        let later = t0 + Duration::from_millis(2000);
        let v = m.view(later, &INPUTS);
        assert_eq!(v.title, "waiting 3.2 s");
        assert_eq!(v.state, TrayState::Waiting);
        assert_eq!(v.menu[0].text, "qwen3:8b on ollama · waiting 3.2 s");
    }

    #[test]
    fn a_wait_past_the_threshold_is_slow_and_beats_streaming() {
        let t0 = Instant::now();
        let mut m = TrayModel::new();
        m.apply(&speed("c-1", Phase::Responding, 900, Some(30.0)), t0);
        m.apply(&speed("c-2", Phase::AwaitingFirstToken, 4000, None), t0);
        assert_eq!(m.state(t0, 5000), TrayState::Streaming);
        assert_eq!(
            m.state(t0 + Duration::from_millis(1000), 5000),
            TrayState::Slow
        );
        // A lower threshold saved in the settings applies at once.
        assert_eq!(m.state(t0, 3000), TrayState::Slow);
    }

    #[test]
    fn the_engines_alarm_marks_a_call_slow_whatever_the_local_threshold() {
        let t0 = Instant::now();
        let mut m = TrayModel::new();
        m.apply(&speed("c-1", Phase::AwaitingFirstToken, 100, None), t0);
        m.apply(
            &EngineEvent::SlowFirstToken(SlowFirstToken {
                call: ident("c-1", "qwen3:8b"),
                waited_ms: 900,
                threshold_ms: 800,
            }),
            t0,
        );
        assert_eq!(m.state(t0, 60_000), TrayState::Slow);
        // Once its first token arrives it is streaming, not slow.
        m.apply(&speed("c-1", Phase::Responding, 1500, None), t0);
        assert_eq!(m.state(t0, 60_000), TrayState::Streaming);
    }

    #[test]
    fn a_stream_without_a_rate_yet_shows_its_phase_not_a_number() {
        let t0 = Instant::now();
        let mut m = TrayModel::new();
        m.apply(&speed("c-1", Phase::Reasoning, 400, None), t0);
        let v = m.view(t0, &INPUTS);
        assert_eq!(v.title, "reasoning");
        assert_eq!(v.menu[0].text, "qwen3:8b on ollama · reasoning");
    }

    #[test]
    fn settled_and_final_snapshots_leave_the_menu() {
        let t0 = Instant::now();
        let mut m = TrayModel::new();
        m.apply(&speed("c-1", Phase::Responding, 900, Some(30.0)), t0);
        m.apply(&speed("c-2", Phase::Responding, 900, Some(30.0)), t0);
        m.apply(&speed("c-1", Phase::Complete, 2000, Some(30.0)), t0);
        assert_eq!(m.active_calls(), 1);
        m.apply(
            &EngineEvent::Settled(Call {
                identity: ident("c-2", "qwen3:8b"),
                status: CallStatus::Ok,
                http_status: Some(200),
                speed: Some(snap(Phase::Complete, 2000, Some(30.0))),
                input_tokens: None,
                details: Default::default(),
            }),
            t0,
        );
        assert_eq!(m.active_calls(), 0);
        assert_eq!(m.view(t0, &INPUTS).state, TrayState::Idle);
    }

    #[test]
    fn many_calls_are_capped_longest_running_first() {
        let t0 = Instant::now();
        let mut m = TrayModel::new();
        for i in 0..11u64 {
            m.apply(
                &speed(&format!("c-{i:02}"), Phase::Responding, i * 100, Some(10.0)),
                t0,
            );
        }
        let v = m.view(t0, &INPUTS);
        let calls: Vec<&str> = v
            .menu
            .iter()
            .filter(|e| e.id.starts_with(ID_CALL_PREFIX))
            .map(|e| e.id.as_str())
            .collect();
        assert_eq!(calls.len(), MAX_CALL_ENTRIES);
        assert_eq!(calls[0], "call:c-10");
        let more = v.menu.iter().find(|e| e.id == ID_MORE_CALLS).unwrap();
        assert_eq!(more.text, "… and 3 more");
    }

    #[test]
    fn menu_has_the_fixed_entries_and_one_copy_entry_per_route() {
        let t0 = Instant::now();
        let routes = vec![
            RouteInfo {
                name: "ollama".into(),
                listen: "127.0.0.1:11435".into(),
                upstream: "http://127.0.0.1:11434".into(),
                proxy_url: "http://127.0.0.1:11435".into(),
            },
            RouteInfo {
                name: "demo".into(),
                listen: "127.0.0.1:40000".into(),
                upstream: "http://127.0.0.1:39999".into(),
                proxy_url: "http://127.0.0.1:40000".into(),
            },
        ];
        let inputs = ViewInputs {
            paused: true,
            routes: &routes,
            slow_ttft_ms: 5000,
        };
        let v = TrayModel::new().view(t0, &inputs);
        let texts: Vec<&str> = v
            .menu
            .iter()
            .filter(|e| e.kind != EntryKind::Separator)
            .map(|e| e.text.as_str())
            .collect();
        assert_eq!(
            texts,
            [
                "No calls in flight",
                "Last hour: no readings yet",
                "Open speedtap",
                "Pause notifications",
                "Copy proxy URL (ollama)",
                "Copy proxy URL (demo)",
                "Quit"
            ]
        );
        let pause = v.menu.iter().find(|e| e.id == ID_PAUSE).unwrap();
        assert_eq!(pause.kind, EntryKind::Check(true));
        assert_eq!(v.menu.last().unwrap().id, ID_QUIT);
    }

    #[test]
    fn rate_changes_keep_the_menu_shape_new_calls_change_it() {
        let t0 = Instant::now();
        let mut m = TrayModel::new();
        m.apply(&speed("c-1", Phase::Responding, 900, Some(30.0)), t0);
        let a = m.view(t0, &INPUTS);
        m.apply(&speed("c-1", Phase::Responding, 1900, Some(35.0)), t0);
        let b = m.view(t0, &INPUTS);
        assert_ne!(a, b);
        assert!(a.same_menu_shape(&b));
        m.apply(&speed("c-2", Phase::AwaitingFirstToken, 10, None), t0);
        assert!(!b.same_menu_shape(&m.view(t0, &INPUTS)));
        // Toggling the check mark is an in-place update too.
        let paused = ViewInputs {
            paused: true,
            ..INPUTS
        };
        let empty = TrayModel::new();
        assert!(empty
            .view(t0, &INPUTS)
            .same_menu_shape(&empty.view(t0, &paused)));
    }

    #[test]
    fn reseed_keeps_only_calls_in_flight() {
        let t0 = Instant::now();
        let mut m = TrayModel::new();
        m.apply(&speed("c-9", Phase::Responding, 900, Some(30.0)), t0);
        let calls = vec![
            Call {
                identity: ident("c-1", "a"),
                status: CallStatus::InFlight,
                http_status: None,
                speed: Some(snap(Phase::AwaitingFirstToken, 700, None)),
                input_tokens: None,
                details: Default::default(),
            },
            Call {
                identity: ident("c-2", "b"),
                status: CallStatus::Ok,
                http_status: Some(200),
                speed: Some(snap(Phase::Complete, 700, Some(3.0))),
                input_tokens: None,
                details: Default::default(),
            },
        ];
        m.reseed(&calls, t0);
        assert_eq!(m.active_calls(), 1);
        assert_eq!(m.title(t0), "waiting 0.7 s");
    }
}
