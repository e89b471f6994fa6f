//! What the tray shows, computed from the engine's events: the label, the
//! icon state and the menu entries. Pure: events and the current time go
//! in, a [`TrayView`] comes out; [`crate::tray`] applies it to the real
//! tray icon. Keeping the decisions here means they are unit-tested without
//! a display, and the tray module only diffs and draws.
//!
//! Choices where the issue is silent, made for what a user glancing at the
//! tray expects:
//! - The label says whose rate it shows: the one streaming call's own
//!   live rate (`41.7 tok/s`); with several, one figure per model, each
//!   the mean of that model's streams, in model order (`qwen3:8b 40 ·
//!   gemma3 15`), marked `~` while it rests on an estimated count
//!   (`~41.7 tok/s`). Never the engine's mean over every stream, which with
//!   two models matches neither. Without a rate it says what is going on
//!   instead: why the newest
//!   call waiting for its first token waits, when the engine knows
//!   (`loading 3.2 s`, `queued #2`, `prefill 60%`), else the longest
//!   current wait (`waiting 3.2 s`); the phase of a call that streams but
//!   has no honest rate yet (`responding`); or `idle`. Never `0 tok/s`: no
//!   number rather than a wrong one.
//! - A call that streamed and went silent past its stall threshold
//!   (`stalled_ms`) labels the tray `stalled 12 s`, before the global rate:
//!   a stuck stream is what the user needs to see. A waiting call the
//!   server has shown no sign of life for [`NO_LIFE_MS`] or more says
//!   `no sign of life 30 s`; one it showed life for within
//!   [`ALIVE_WITHIN_MS`] adds `· alive` to its wait (`prefill 41% · alive`).
//! - The icon state is the most urgent thing happening: `Slow` (a call is
//!   waiting longer than the slow-first-token threshold, or the engine
//!   raised the alarm for it) beats `Streaming` beats `Waiting` beats
//!   `Idle`.
//! - The menu lists at most [`MAX_CALL_ENTRIES`] calls, longest-running
//!   first, then a "… and N more" line, so a burst of parallel calls
//!   cannot grow the menu off the screen.
//! - Each model a server has loaded says whether the next call is warm or
//!   cold: `qwen3:32b unloads in 3 min · next call cold: ~6 s` (the
//!   route's usual load time, when a load was seen), `· 29% on CPU` when
//!   part of it runs off the GPU. Counted against the wall clock passed
//!   in ([`ViewInputs::now_unix_ms`]), since `expires_at` is a date.

use std::collections::{BTreeMap, HashSet};

use serde::Deserialize;
use speedtap::model::Stats;
use speedtap::model::{Call, CallIdentity, CallStatus, EngineEvent};
use speedtap::model::{FollowedServer, FollowedState, LoadedModelDoc, RouteInfo};
use speedtap::model::{Phase, Snapshot, TokenSource};
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
/// Prefix of the line saying a model's last call failed (`failed:ROUTE/MODEL`).
pub const ID_FAILED_PREFIX: &str = "failed:";
/// The most models whose last failure the menu lists.
pub const MAX_FAILED_ENTRIES: usize = 3;
/// "Open speedtap": show and focus the window.
pub const ID_OPEN: &str = "open";
/// "Pause notifications" (a check item).
pub const ID_PAUSE: &str = "pause-notifications";
/// "Copy proxy URL (NAME)", one per bound route.
pub const ID_COPY_PREFIX: &str = "copy:";
/// "Quit": exit 0.
pub const ID_QUIT: &str = "quit";
/// One followed model server (`server:NAME`), with how it is measured.
pub const ID_SERVER_PREFIX: &str = "server:";
/// One loaded model (`loaded:ROUTE/MODEL`): warm or cold next time.
pub const ID_LOADED_PREFIX: &str = "loaded:";

/// An unload further away than this is "stays loaded" (Ollama's
/// `keep_alive: -1` shows a date centuries away).
pub const FOREVER_MS: u64 = 365 * 86_400_000;

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
    /// Nothing in flight, and the last call of some model failed (until
    /// that model's next call succeeds).
    Failed,
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
    /// The model servers followed on this machine, in the order found.
    pub servers: &'a [FollowedServer],
    /// The models the servers have loaded (`GET /api/v1/servers` `loaded`).
    pub loaded: &'a [LoadedModelDoc],
    /// The wall clock now, unix ms: when each loaded model unloads is a
    /// date.
    pub now_unix_ms: u64,
}

/// Why a call waits for its first token, as far as the tray shows it: the
/// snapshot's `wait` (docs/api.md), read through its published JSON so the
/// tray depends on the contract's shape alone. Every number is optional:
/// absent means not known.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct WaitView {
    /// `loading_model`, `queued`, `prefilling`, `unknown`, or a reason a
    /// newer engine added (shown as the plain wait).
    pub reason: String,
    /// Queued: calls ahead of this one on the same upstream.
    #[serde(default)]
    pub position: Option<u32>,
    /// Prefilling: prompt tokens processed / the call's prompt tokens.
    #[serde(default)]
    pub progress: Option<f64>,
    /// Time since the server last showed life for the call, when the
    /// snapshot was published.
    #[serde(default)]
    pub silent_ms: Option<u64>,
}

/// A waiting call the server showed life for this recently is `alive`.
pub const ALIVE_WITHIN_MS: u64 = 3_000;

/// A waiting call the server has shown no sign of life for this long says
/// so instead of why it waits.
pub const NO_LIFE_MS: u64 = 30_000;

impl WaitView {
    /// The wait a snapshot carries, if it waits and the engine explained why.
    pub fn of(speed: &Snapshot) -> Option<WaitView> {
        if speed.phase != Phase::AwaitingFirstToken {
            return None;
        }
        Self::from_snapshot_json(&serde_json::to_value(speed).ok()?)
    }

    /// The `wait` of a snapshot's JSON; None when absent or malformed (a
    /// wait the tray can't read is shown as the plain wait, never an error).
    pub fn from_snapshot_json(snapshot: &serde_json::Value) -> Option<WaitView> {
        let wait = snapshot.get("wait")?;
        serde_json::from_value(wait.clone()).ok()
    }

    /// The short words for the label and the menu: `loading`, `queued #2`,
    /// `prefill 60%`; None for a wait whose reason is unknown.
    fn words(&self) -> Option<String> {
        match self.reason.as_str() {
            "loading_model" => Some("loading".to_owned()),
            "queued" => Some(match self.position {
                Some(n) => format!("queued #{n}"),
                None => "queued".to_owned(),
            }),
            "prefilling" => Some(match self.progress.and_then(percent) {
                Some(p) => format!("prefill {p}%"),
                None => "prefill".to_owned(),
            }),
            _ => None,
        }
    }
}

/// A fraction as a whole percentage, rounded down (a prefill at 99.6% is
/// not done) and clamped to 0..=100; None for a value that is not a number.
fn percent(fraction: f64) -> Option<u32> {
    if !fraction.is_finite() || fraction < 0.0 {
        return None;
    }
    // The epsilon keeps 0.29 at 29 (0.29 * 100 is 28.999... in binary).
    Some((fraction.min(1.0) * 100.0 + 1e-9).floor() as u32)
}

/// A call in flight as the tray knows it.
#[derive(Clone, Debug)]
struct Active {
    call: CallIdentity,
    speed: Snapshot,
    /// Why it waits, while it waits and the engine says.
    wait: Option<WaitView>,
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
    /// Per (route, model): how its last call failed, until a call of that
    /// model succeeds.
    failed: BTreeMap<(String, String), String>,
    stats: Stats,
    /// The menu shows when loaded models unload: each reading redraws, so
    /// the time left counts down while nothing else happens.
    unloads_shown: bool,
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
            failed: BTreeMap::new(),
            stats: Stats::default(),
            unloads_shown: false,
        }
    }

    /// Whether the menu drawn last shows loaded models' unload times.
    pub fn set_unloads_shown(&mut self, shown: bool) {
        self.unloads_shown = shown;
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
            EngineEvent::Speed { call, speed, .. } => {
                if speed.is_final {
                    self.forget(&call.id);
                } else {
                    self.upsert(call, speed, now);
                }
                false
            }
            EngineEvent::Settled(call) => {
                self.forget(&call.identity.id);
                self.note_outcome(call)
            }
            // Each reading redraws while calls are shown (their waits and
            // rates age with `now`); an idle engine repeats the same
            // reading every 10 s, which redraws nothing (a redraw asks the
            // engine for its routes and wakes the main thread).
            EngineEvent::Stats(stats) => {
                let changed = self.stats != *stats;
                if changed {
                    self.stats = stats.clone();
                }
                changed || !self.active.is_empty() || self.unloads_shown
            }
            EngineEvent::SlowFirstToken(slow) => {
                if self.active.contains_key(&slow.call.id) {
                    self.alarmed.insert(slow.call.id.clone());
                }
                true
            } // Notified on its own; nothing on the tray changes.
            EngineEvent::PromptTruncated(_) => false,
            // The menu lists the servers (read from the engine at redraw).
            EngineEvent::Servers(_) => true,
        }
    }

    /// Keeps how a model's last call failed, or forgets it once a call of
    /// that model succeeds; a client that left, the demo's calls and a
    /// relay's legs say nothing about the model. True when that changed.
    fn note_outcome(&mut self, call: &Call) -> bool {
        if call.identity.demo || call.details.relay.is_some() {
            return false;
        }
        let key = (
            call.identity.route.clone(),
            call.identity.model.clone().unwrap_or_default(),
        );
        match &call.details.failure {
            Some(f) if f.is_error() => {
                let label = f.label(call.http_status);
                self.failed.insert(key, label.clone()) != Some(label)
            }
            _ if call.status == CallStatus::Ok => self.failed.remove(&key).is_some(),
            _ => false,
        }
    }

    fn upsert(&mut self, call: &CallIdentity, speed: &Snapshot, now: Instant) {
        self.insert(call, speed, WaitView::of(speed), now);
    }

    fn insert(
        &mut self,
        call: &CallIdentity,
        speed: &Snapshot,
        wait: Option<WaitView>,
        now: Instant,
    ) {
        self.active.insert(
            call.id.clone(),
            Active {
                call: call.clone(),
                speed: speed.clone(),
                wait,
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
        if let Some(ms) = self.longest_stall(now) {
            return format!("stalled {}", whole_seconds(ms));
        }
        if let Some(rates) = self.rates_label() {
            return rates;
        }
        if let Some(ms) = self.longest_lifeless(now) {
            return format!("no sign of life {}", whole_seconds(ms));
        }
        let waiting: Vec<(&Active, u64)> = self
            .active
            .values()
            .filter_map(|a| Self::waiting_ms(a, now).map(|ms| (a, ms)))
            .collect();
        // The newest waiting call (the shortest wait) is the one the user
        // just sent: say why it waits, when the engine knows.
        let newest = waiting
            .iter()
            .min_by_key(|(a, ms)| (*ms, std::cmp::Reverse(a.call.id.as_str())));
        if let Some(words) = newest.and_then(|(a, ms)| wait_words(a, *ms, now)) {
            return words;
        }
        if let Some(longest) = waiting.iter().map(|(_, ms)| *ms).max() {
            return format!("waiting {}", seconds(longest));
        }
        match self.active.values().map(|a| a.speed.phase).next() {
            Some(phase) => phase_label(phase).to_owned(),
            None => "idle".to_owned(),
        }
    }

    /// Whose rate is shown: the one streaming call's own live rate, or
    /// with several, each model's (the mean of its streams, whole
    /// tok/s). None while no call in flight has a rate.
    fn rates_label(&self) -> Option<String> {
        let mut by_model: BTreeMap<&str, (Vec<f64>, bool)> = BTreeMap::new();
        for a in self.active.values() {
            if let Some(rate) = own_rate(a) {
                let model = a.call.model.as_deref().unwrap_or(&a.call.route);
                let (rates, estimated) = by_model.entry(model).or_default();
                rates.push(rate);
                *estimated |= is_estimated(a);
            }
        }
        let streams: usize = by_model.values().map(|(rates, _)| rates.len()).sum();
        match streams {
            0 => None,
            1 => by_model
                .values()
                .next()
                .map(|(rates, est)| format!("{}{:.1} tok/s", mark(*est), rates[0])),
            _ => Some(
                by_model
                    .iter()
                    .map(|(model, (rates, est))| {
                        let mean = rates.iter().sum::<f64>() / rates.len() as f64;
                        format!("{model} {}{mean:.0}", mark(*est))
                    })
                    .collect::<Vec<_>>()
                    .join(" · "),
            ),
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
        if state == TrayState::Idle && !self.failed.is_empty() {
            state = TrayState::Failed;
        }
        state
    }

    /// Everything the tray shows at `now`.
    pub fn view(&self, now: Instant, inputs: &ViewInputs<'_>) -> TrayView {
        let mut menu = Vec::new();
        let mut calls: Vec<&Active> = self.active.values().collect();
        // Longest-running first: the ones a user is most likely wondering
        // about. Ordered by when each was dispatched, which no snapshot
        // changes, so the menu keeps its order as their snapshots arrive.
        calls.sort_by(|a, b| dispatch_order(&a.call).cmp(&dispatch_order(&b.call)));
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
                call_line(a, Self::waiting_ms(a, now), now),
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
        for ((route, model), label) in self.failed.iter().take(MAX_FAILED_ENTRIES) {
            let name = if model.is_empty() { route } else { model };
            menu.push(MenuEntry::new(
                format!("{ID_FAILED_PREFIX}{route}/{model}"),
                EntryKind::Info,
                format!("Last call failed: {name} ({label})"),
            ));
        }
        if !inputs.servers.is_empty() {
            menu.push(MenuEntry::separator(3));
        }
        for server in inputs.servers {
            menu.push(MenuEntry::new(
                format!("{ID_SERVER_PREFIX}{}", server.name),
                EntryKind::Info,
                server_line(server),
            ));
        }
        if !inputs.loaded.is_empty() {
            menu.push(MenuEntry::separator(4));
        }
        for model in inputs.loaded {
            menu.push(MenuEntry::new(
                format!("{ID_LOADED_PREFIX}{}/{}", model.route, model.model),
                EntryKind::Info,
                loaded_line(model, inputs.now_unix_ms),
            ));
        }
        menu.push(MenuEntry::separator(1));
        menu.push(MenuEntry::new(ID_OPEN, EntryKind::Action, "Open speedtap"));
        menu.push(MenuEntry::new(
            ID_PAUSE,
            EntryKind::Check(inputs.paused),
            "Pause notifications",
        ));
        // The demo's route feeds its own simulator: never a URL to give
        // clients.
        for route in inputs.routes.iter().filter(|r| !r.demo) {
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

    /// The longest stall now, with its call.
    fn longest_stall(&self, now: Instant) -> Option<u64> {
        self.active
            .values()
            .filter_map(|a| stalled_ms(a, now))
            .max()
    }

    /// The longest silence now of a waiting call the server has shown no
    /// sign of life for [`NO_LIFE_MS`] or more.
    fn longest_lifeless(&self, now: Instant) -> Option<u64> {
        self.active
            .values()
            .filter(|a| a.speed.phase == Phase::AwaitingFirstToken)
            .filter_map(|a| silent_ms(a, now))
            .filter(|ms| *ms >= NO_LIFE_MS)
            .max()
    }
}

/// `a`'s own live rate, when it streams with one (never a stalled
/// stream's last rate: the label says `stalled` first).
fn own_rate(a: &Active) -> Option<f64> {
    if a.speed.is_final || a.speed.stalled_ms.is_some() {
        return None;
    }
    a.speed
        .output_tokens_per_second
        .filter(|r| r.is_finite() && *r > 0.0)
}

/// Whether `a`'s count, and so its rate, is still speedtap's estimate.
fn is_estimated(a: &Active) -> bool {
    a.speed.token_source == TokenSource::Estimated
}

/// The mark of a rate resting on an estimated count: `~41.7 tok/s`.
fn mark(estimated: bool) -> &'static str {
    if estimated {
        "~"
    } else {
        ""
    }
}

/// Milliseconds since `a`'s snapshot arrived.
fn since(a: &Active, now: Instant) -> u64 {
    now.saturating_duration_since(a.seen_at).as_millis() as u64
}

/// How long `a` has been stalled at `now`, if its snapshot said stalled.
fn stalled_ms(a: &Active, now: Instant) -> Option<u64> {
    a.speed.stalled_ms.map(|ms| ms + since(a, now))
}

/// How long the server has been silent for waiting call `a` at `now`.
fn silent_ms(a: &Active, now: Instant) -> Option<u64> {
    a.wait.as_ref()?.silent_ms.map(|ms| ms + since(a, now))
}

/// The server showed life for waiting call `a` lately: a sign came after
/// dispatch (its silence is shorter than its wait) and within
/// [`ALIVE_WITHIN_MS`].
fn alive(a: &Active, now: Instant) -> bool {
    let Some(silent) = a.wait.as_ref().and_then(|w| w.silent_ms) else {
        return false;
    };
    silent < a.speed.elapsed_ms && silent + since(a, now) < ALIVE_WITHIN_MS
}

/// `12 s`: whole seconds, rounded down.
fn whole_seconds(ms: u64) -> String {
    format!("{} s", ms / 1000)
}

/// A call's place in dispatch order: its wall-clock start (RFC 3339 UTC,
/// which sorts as text), then its id (numbered in dispatch order; the
/// length first, so `c-1000000` follows `c-999999`).
fn dispatch_order(call: &CallIdentity) -> (&str, usize, &str) {
    (call.started_at.as_str(), call.id.len(), call.id.as_str())
}

/// One followed server in the menu: its name and how it is measured, e.g.
/// `ollama: measured (capture)`, `llama-server-9931: through
/// 127.0.0.1:9932`, `lm-studio: down`.
fn server_line(server: &FollowedServer) -> String {
    let how = match server.state {
        FollowedState::Measured if server.route != server.name => {
            format!("measured (route {})", server.route)
        }
        FollowedState::Measured => format!(
            "measured ({})",
            server.seen_by.as_deref().unwrap_or("capture")
        ),
        FollowedState::Proxied => match &server.proxy_listen {
            Some(listen) => format!("through {listen}"),
            None => "proxied".to_owned(),
        },
        FollowedState::Down => "down".to_owned(),
        FollowedState::Ignored => "ignored".to_owned(),
    };
    format!("{}: {how}", server.name)
}

/// One loaded model, warm or cold next time: `qwen3:32b unloads in 3 min
/// · next call cold: ~6 s`, `… · 29% on CPU`; `stays loaded` for a model
/// kept (almost) forever, `unloaded` once its time has passed, `loaded`
/// when the server gave no time. The cold cost only with a usual load
/// time; the CPU share only when part of the model is off the GPU.
pub fn loaded_line(model: &LoadedModelDoc, now_unix_ms: u64) -> String {
    let unloads = model
        .expires_at
        .as_deref()
        .and_then(speedtap::model::time::rfc3339_offset_to_ms);
    let when = match unloads {
        Some(at) if at <= now_unix_ms => "unloaded".to_owned(),
        Some(at) if at - now_unix_ms >= FOREVER_MS => "stays loaded".to_owned(),
        Some(at) => format!("unloads in {}", time_left(at - now_unix_ms)),
        None => "loaded".to_owned(),
    };
    let mut line = format!("{} {when}", model.model);
    if let Some(ms) = model.usual_load_ms {
        line.push_str(&format!(" · next call cold: ~{}", load_time(ms)));
    }
    if let Some(share) = model.cpu_share.filter(|s| *s >= 0.01) {
        line.push_str(&format!(" · {:.0}% on CPU", share * 100.0));
    }
    line
}

/// Time left, whole units rounded down: `3 min`, `45 s`, `2 h`.
fn time_left(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..=59 => format!("{s} s"),
        60..=7_199 => format!("{} min", s / 60),
        _ => format!("{} h", s / 3600),
    }
}

/// A usual load time: `6 s` (whole seconds, rounded), `0.4 s` under one.
fn load_time(ms: u64) -> String {
    if ms < 1_000 {
        format!("{:.1} s", ms as f64 / 1000.0)
    } else {
        format!("{} s", (ms + 500) / 1000)
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

/// Why `a` waits, in the label's words: `loading 3.2 s` (with how long it
/// has waited: a load has no progress to show), `queued #2`,
/// `prefill 60%`, with `· alive` when the server showed life for it
/// lately; None without an explanation the tray can show.
fn wait_words(a: &Active, waiting_ms: u64, now: Instant) -> Option<String> {
    let wait = a.wait.as_ref()?;
    let words = wait.words()?;
    let words = if wait.reason == "loading_model" {
        format!("{words} {}", seconds(waiting_ms))
    } else {
        words
    };
    Some(if alive(a, now) {
        format!("{words} · alive")
    } else {
        words
    })
}

/// `qwen3:8b on ollama · responding · 41.7 tok/s`; a waiting call shows
/// its wait (and why, when known) instead of a rate, and a call without a
/// rate shows none.
fn call_line(a: &Active, waiting_ms: Option<u64>, now: Instant) -> String {
    let model = a.call.model.as_deref().unwrap_or("unknown model");
    let head = format!("{model} on {}", a.call.route);
    if let Some(ms) = stalled_ms(a, now) {
        return format!("{head} · stalled {}", whole_seconds(ms));
    }
    if let Some(silent) = silent_ms(a, now).filter(|ms| *ms >= NO_LIFE_MS && waiting_ms.is_some()) {
        return format!("{head} · no sign of life {}", whole_seconds(silent));
    }
    if let Some(wait) = waiting_ms {
        return match wait_words(a, wait, now) {
            Some(words) => format!("{head} · {words}"),
            None => format!("{head} · waiting {}", seconds(wait)),
        };
    }
    let phase = phase_label(a.speed.phase);
    match a.speed.output_tokens_per_second {
        Some(tps) => format!("{head} · {phase} · {}{tps:.1} tok/s", mark(is_estimated(a))),
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
    use speedtap::model::{Failure, FailureKind, SlowFirstToken};

    use super::*;

    fn ident(id: &str, model: &str) -> CallIdentity {
        CallIdentity {
            id: id.into(),
            route: "ollama".into(),
            api: ApiKind::OllamaChat,
            model: Some(model.into()),
            started_at: "2026-11-30T10:42:07.123Z".into(),
            demo: false,
        }
    }

    fn snap(phase: Phase, elapsed_ms: u64, tps: Option<f64>) -> Snapshot {
        Snapshot {
            stalled_ms: None,
            phase,
            is_final: phase == Phase::Complete,
            elapsed_ms,
            time_to_first_token_ms: (phase != Phase::AwaitingFirstToken).then_some(300),
            output_tokens: 10,
            output_tokens_per_second: tps,
            token_source: TokenSource::Provider,
            wait: None,
        }
    }

    fn speed(id: &str, phase: Phase, elapsed_ms: u64, tps: Option<f64>) -> EngineEvent {
        EngineEvent::Speed {
            call: ident(id, "qwen3:8b"),
            speed: snap(phase, elapsed_ms, tps),
            seen_by: speedtap::model::SeenBy::Proxy,
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

    #[test]
    fn the_menu_lists_each_followed_server_and_how_it_is_measured() {
        let server =
            |name: &str, state, seen_by: Option<&str>, proxy: Option<&str>| FollowedServer {
                name: name.into(),
                kind: "ollama".into(),
                upstream: "http://127.0.0.1:11434".into(),
                state,
                seen_by: seen_by.map(str::to_owned),
                route: name.into(),
                proxy_listen: proxy.map(str::to_owned),
                pid: None,
                process: None,
                version: None,
                found_at: 0,
                last_seen: 0,
            };
        let servers = [
            server("ollama", FollowedState::Measured, Some("capture"), None),
            server(
                "llama-server-9931",
                FollowedState::Proxied,
                Some("proxy"),
                Some("127.0.0.1:9932"),
            ),
            server("lm-studio", FollowedState::Down, None, None),
        ];
        let inputs = ViewInputs {
            servers: &servers,
            ..INPUTS
        };
        let view = TrayModel::new().view(Instant::now(), &inputs);
        let lines: Vec<&str> = view
            .menu
            .iter()
            .filter(|e| e.id.starts_with(ID_SERVER_PREFIX))
            .map(|e| e.text.as_str())
            .collect();
        assert_eq!(
            lines,
            [
                "ollama: measured (capture)",
                "llama-server-9931: through 127.0.0.1:9932",
                "lm-studio: down",
            ]
        );
        let without = TrayModel::new().view(Instant::now(), &INPUTS);
        assert!(!without.menu.iter().any(|e| e.id == "sep-3"));
    }

    fn loaded(
        model: &str,
        expires_at: Option<&str>,
        usual_load_ms: Option<u64>,
        cpu_share: Option<f64>,
    ) -> LoadedModelDoc {
        LoadedModelDoc {
            route: "ollama".into(),
            model: model.into(),
            expires_at: expires_at.map(Into::into),
            cpu_share,
            usual_load_ms,
        }
    }

    #[test]
    fn a_loaded_model_says_when_it_unloads_and_what_the_next_call_costs_cold() {
        // 2026-11-30T10:42:07Z.
        let now = speedtap::model::time::rfc3339_to_ms("2026-11-30T10:42:07Z").unwrap();
        let at = |text: &str| loaded("qwen3:32b", Some(text), Some(6_200), None);
        assert_eq!(
            loaded_line(&at("2026-11-30T10:45:37.5Z"), now),
            "qwen3:32b unloads in 3 min · next call cold: ~6 s"
        );
        // Ollama writes its local time with the offset: the same instant.
        assert_eq!(
            loaded_line(&at("2026-11-30T11:45:37.5+01:00"), now),
            "qwen3:32b unloads in 3 min · next call cold: ~6 s"
        );
        assert_eq!(
            loaded_line(&at("2026-11-30T10:42:52Z"), now),
            "qwen3:32b unloads in 45 s · next call cold: ~6 s"
        );
        // The same model a minute later: the time left counts down with
        // the clock passed in.
        assert_eq!(
            loaded_line(&at("2026-11-30T10:45:37.5Z"), now + 60_000),
            "qwen3:32b unloads in 2 min · next call cold: ~6 s"
        );
        assert_eq!(
            loaded_line(&at("2026-11-30T10:42:07Z"), now),
            "qwen3:32b unloaded · next call cold: ~6 s"
        );
        assert_eq!(
            loaded_line(&at("2318-01-01T00:00:00Z"), now),
            "qwen3:32b stays loaded · next call cold: ~6 s"
        );
        // No load seen on the route: no cold cost; part on the CPU: said.
        assert_eq!(
            loaded_line(
                &loaded("gemma3", Some("2026-11-30T10:47:07Z"), None, Some(0.29)),
                now
            ),
            "gemma3 unloads in 5 min · 29% on CPU"
        );
        assert_eq!(
            loaded_line(&loaded("tiny", None, Some(400), Some(0.0)), now),
            "tiny loaded · next call cold: ~0.4 s"
        );
    }

    #[test]
    fn the_menu_lists_each_loaded_model_below_the_servers_and_counts_down_while_idle() {
        let now = speedtap::model::time::rfc3339_to_ms("2026-11-30T10:42:07Z").unwrap();
        let models = [
            loaded("qwen3:32b", Some("2026-11-30T10:45:37Z"), Some(6_000), None),
            loaded("gemma3", Some("2026-11-30T10:43:07Z"), None, None),
        ];
        let inputs = ViewInputs {
            loaded: &models,
            now_unix_ms: now,
            ..INPUTS
        };
        let mut m = TrayModel::new();
        let view = m.view(Instant::now(), &inputs);
        let lines: Vec<(&str, &str)> = view
            .menu
            .iter()
            .filter(|e| e.id.starts_with(ID_LOADED_PREFIX))
            .map(|e| (e.id.as_str(), e.text.as_str()))
            .collect();
        assert_eq!(
            lines,
            [
                (
                    "loaded:ollama/qwen3:32b",
                    "qwen3:32b unloads in 3 min · next call cold: ~6 s"
                ),
                ("loaded:ollama/gemma3", "gemma3 unloads in 1 min"),
            ]
        );
        assert!(!m
            .view(Instant::now(), &INPUTS)
            .menu
            .iter()
            .any(|e| e.id == "sep-4"));
        // An idle engine's repeated reading redraws only while unload
        // times are shown.
        let idle = EngineEvent::Stats(Stats::default());
        assert!(!m.apply(&idle, Instant::now()));
        m.set_unloads_shown(true);
        assert!(m.apply(&idle, Instant::now()));
    }

    const INPUTS: ViewInputs<'static> = ViewInputs {
        paused: false,
        routes: &[],
        slow_ttft_ms: 5000,
        servers: &[],
        loaded: &[],
        now_unix_ms: 0,
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
    fn the_label_is_the_one_streaming_calls_own_rate_with_one_decimal() {
        let t0 = Instant::now();
        let mut m = TrayModel::new();
        m.apply(&speed("c-1", Phase::Responding, 900, Some(41.66)), t0);
        // A global reading that disagrees with the row is not what the
        // label shows: the row's own rate is.
        assert!(m.apply(&stats(Some(43.6), Some(52.1), Some(31.4)), t0));
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
    fn an_idle_engines_repeated_reading_redraws_nothing_but_a_waiting_calls_does() {
        let t0 = Instant::now();
        let mut m = TrayModel::new();
        let idle = EngineEvent::Stats(Stats::default());
        assert!(!m.apply(&idle, t0), "the same idle reading as at start");
        assert!(m.apply(&stats(None, Some(52.1), Some(31.4)), t0));
        assert!(!m.apply(&stats(None, Some(52.1), Some(31.4)), t0));
        // A call waiting for its first token: the same reading each second
        // still redraws, so "waiting 3.2 s" counts up.
        m.apply(&speed("c-1", Phase::AwaitingFirstToken, 900, None), t0);
        assert!(m.apply(&stats(None, Some(52.1), Some(31.4)), t0));
        assert!(m.apply(&stats(None, Some(52.1), Some(31.4)), t0));
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
            reason: None,
            usual_ms: None,
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

    /// A waiting call the engine explained: `wait` is the snapshot's
    /// `wait` as the contract spells it (docs/api.md).
    fn explained(
        m: &mut TrayModel,
        id: &str,
        elapsed_ms: u64,
        wait: serde_json::Value,
        now: Instant,
    ) {
        let wait = WaitView::from_snapshot_json(&serde_json::json!({ "wait": wait }));
        assert!(wait.is_some(), "the contract's wait parses");
        m.insert(
            &ident(id, "qwen3:32b"),
            &snap(Phase::AwaitingFirstToken, elapsed_ms, None),
            wait,
            now,
        );
    }

    #[test]
    fn a_call_waiting_for_its_model_labels_the_tray_loading_with_the_time_waited() {
        let t0 = Instant::now();
        let mut m = TrayModel::new();
        explained(
            &mut m,
            "c-1",
            1200,
            serde_json::json!({"reason": "loading_model", "eta_ms": 800, "usual_ms": 4000}),
            t0,
        );
        let v = m.view(t0 + Duration::from_millis(2000), &INPUTS);
        assert_eq!(v.title, "loading 3.2 s");
        assert_eq!(v.state, TrayState::Waiting);
        assert_eq!(v.menu[0].text, "qwen3:32b on ollama · loading 3.2 s");
    }

    #[test]
    fn a_queued_call_labels_the_tray_with_its_place_in_the_queue() {
        let t0 = Instant::now();
        let mut m = TrayModel::new();
        explained(
            &mut m,
            "c-1",
            300,
            serde_json::json!({"reason": "queued", "position": 2}),
            t0,
        );
        assert_eq!(m.title(t0), "queued #2");
        explained(
            &mut m,
            "c-1",
            300,
            serde_json::json!({"reason": "queued"}),
            t0,
        );
        assert_eq!(m.title(t0), "queued", "no position known: no number");
    }

    #[test]
    fn a_prefilling_call_labels_the_tray_with_its_progress_rounded_down() {
        let t0 = Instant::now();
        let mut m = TrayModel::new();
        for (progress, label) in [
            (0.6, "prefill 60%"),
            (0.29, "prefill 29%"),
            (0.996, "prefill 99%"),
            (1.3, "prefill 100%"),
        ] {
            explained(
                &mut m,
                "c-1",
                300,
                serde_json::json!({"reason": "prefilling", "progress": progress, "prompt_tokens": 12000}),
                t0,
            );
            assert_eq!(m.title(t0), label);
        }
        explained(
            &mut m,
            "c-1",
            300,
            serde_json::json!({"reason": "prefilling"}),
            t0,
        );
        assert_eq!(m.title(t0), "prefill");
        assert_eq!(
            m.view(t0, &INPUTS).menu[0].text,
            "qwen3:32b on ollama · prefill"
        );
    }

    #[test]
    fn the_newest_waiting_call_decides_the_label() {
        let t0 = Instant::now();
        let mut m = TrayModel::new();
        explained(
            &mut m,
            "c-1",
            9000,
            serde_json::json!({"reason": "prefilling", "progress": 0.5}),
            t0,
        );
        explained(
            &mut m,
            "c-2",
            500,
            serde_json::json!({"reason": "queued", "position": 1}),
            t0,
        );
        assert_eq!(m.title(t0), "queued #1");
        // The newest one has no explanation: the plain label, with the
        // longest wait as before.
        m.apply(&speed("c-3", Phase::AwaitingFirstToken, 100, None), t0);
        assert_eq!(m.title(t0), "waiting 9.0 s");
    }

    #[test]
    fn a_stalled_stream_labels_the_tray_before_the_global_rate_and_not_after_it_resumes() {
        let t0 = Instant::now();
        let mut m = TrayModel::new();
        m.apply(&stats(Some(41.7), None, None), t0);
        let mut stalled = snap(Phase::Responding, 15_000, Some(20.0));
        stalled.stalled_ms = Some(12_400);
        m.apply(
            &EngineEvent::Speed {
                call: ident("c-1", "qwen3:32b"),
                speed: stalled,
                seen_by: speedtap::model::SeenBy::Proxy,
            },
            t0,
        );
        assert_eq!(m.title(t0), "stalled 12 s");
        assert_eq!(m.title(t0 + Duration::from_millis(700)), "stalled 13 s");
        assert_eq!(
            m.view(t0, &INPUTS).menu[0].text,
            "qwen3:32b on ollama · stalled 12 s"
        );
        m.apply(&speed("c-1", Phase::Responding, 16_000, Some(20.0)), t0);
        assert_eq!(m.title(t0), "20.0 tok/s");
    }

    fn streaming(id: &str, model: &str, tps: Option<f64>) -> EngineEvent {
        EngineEvent::Speed {
            call: ident(id, model),
            speed: snap(Phase::Responding, 5_000, tps),
            seen_by: speedtap::model::SeenBy::Proxy,
        }
    }

    #[test]
    fn several_streams_label_the_tray_per_model_never_with_a_mean_across_models() {
        let t0 = Instant::now();
        let mut m = TrayModel::new();
        m.apply(&streaming("c-1", "qwen3", Some(40.0)), t0);
        m.apply(&streaming("c-2", "gemma", Some(15.0)), t0);
        // The engine's mean over both (27.5) matches no model.
        m.apply(&stats(Some(27.5), None, None), t0);
        assert_eq!(m.title(t0), "gemma 15 · qwen3 40");
        // Two streams of one model: that model's mean; a stream without a
        // rate yet adds nothing.
        m.apply(&streaming("c-3", "qwen3", Some(38.0)), t0);
        m.apply(&streaming("c-4", "gemma", None), t0);
        assert_eq!(m.title(t0), "gemma 15 · qwen3 39");
        // When only one stream is left with a rate, it is that call's own.
        m.apply(&speed("c-1", Phase::Complete, 6_000, Some(40.0)), t0);
        m.apply(&speed("c-3", Phase::Complete, 6_000, Some(38.0)), t0);
        assert_eq!(m.title(t0), "15.0 tok/s");
    }

    #[test]
    fn a_prefill_the_server_pings_through_is_alive_and_a_silent_wait_says_no_sign_of_life() {
        let t0 = Instant::now();
        let mut m = TrayModel::new();
        explained(
            &mut m,
            "c-1",
            6_000,
            serde_json::json!({"reason": "prefilling", "progress": 0.41, "silent_ms": 400}),
            t0,
        );
        assert_eq!(m.title(t0), "prefill 41% · alive");
        assert_eq!(
            m.view(t0, &INPUTS).menu[0].text,
            "qwen3:32b on ollama · prefill 41% · alive"
        );
        // No snapshot for 3 s: the last sign is too old to say alive.
        assert_eq!(m.title(t0 + Duration::from_secs(3)), "prefill 41%");
        // A call with no sign since dispatch is never alive.
        explained(
            &mut m,
            "c-1",
            1_000,
            serde_json::json!({"reason": "prefilling", "progress": 0.1, "silent_ms": 1_000}),
            t0,
        );
        assert_eq!(m.title(t0), "prefill 10%");
        explained(
            &mut m,
            "c-1",
            30_000,
            serde_json::json!({"reason": "unknown", "silent_ms": 30_000}),
            t0,
        );
        assert_eq!(m.title(t0), "no sign of life 30 s");
        assert_eq!(
            m.view(t0, &INPUTS).menu[0].text,
            "qwen3:32b on ollama · no sign of life 30 s"
        );
        explained(
            &mut m,
            "c-1",
            29_000,
            serde_json::json!({"reason": "unknown", "silent_ms": 29_000}),
            t0,
        );
        assert_eq!(m.title(t0), "waiting 29.0 s");
    }

    #[test]
    fn a_wait_of_unknown_reason_keeps_the_plain_waiting_label() {
        let t0 = Instant::now();
        let mut m = TrayModel::new();
        explained(
            &mut m,
            "c-1",
            3200,
            serde_json::json!({"reason": "unknown"}),
            t0,
        );
        assert_eq!(m.title(t0), "waiting 3.2 s");
        explained(
            &mut m,
            "c-1",
            3200,
            serde_json::json!({"reason": "warming_up"}),
            t0,
        );
        assert_eq!(m.title(t0), "waiting 3.2 s", "a reason from a newer engine");
        assert_eq!(
            m.view(t0, &INPUTS).menu[0].text,
            "qwen3:32b on ollama · waiting 3.2 s"
        );
    }

    #[test]
    fn a_rate_resting_on_an_estimated_count_says_so_in_the_label_and_the_menu() {
        let t0 = Instant::now();
        let mut m = TrayModel::new();
        let mut estimated = snap(Phase::Responding, 5_000, Some(41.66));
        estimated.token_source = TokenSource::Estimated;
        let event = |id: &str, model: &str, speed: &Snapshot| EngineEvent::Speed {
            call: ident(id, model),
            speed: speed.clone(),
            seen_by: speedtap::model::SeenBy::Proxy,
        };
        m.apply(&event("c-1", "qwen3", &estimated), t0);
        assert_eq!(m.title(t0), "~41.7 tok/s");
        assert_eq!(
            m.view(t0, &INPUTS).menu[0].text,
            "qwen3 on ollama · responding · ~41.7 tok/s"
        );
        m.apply(&streaming("c-2", "gemma", Some(15.0)), t0);
        assert_eq!(m.title(t0), "gemma 15 · qwen3 ~42");
    }

    #[test]
    fn a_streaming_calls_rate_still_beats_a_wait_explanation() {
        let t0 = Instant::now();
        let mut m = TrayModel::new();
        explained(
            &mut m,
            "c-1",
            300,
            serde_json::json!({"reason": "queued", "position": 1}),
            t0,
        );
        m.apply(&speed("c-2", Phase::Responding, 900, Some(41.7)), t0);
        m.apply(&stats(Some(41.7), None, None), t0);
        assert_eq!(m.title(t0), "41.7 tok/s");
    }

    #[test]
    fn the_first_token_ends_the_explanation() {
        let t0 = Instant::now();
        let mut m = TrayModel::new();
        explained(
            &mut m,
            "c-1",
            300,
            serde_json::json!({"reason": "queued", "position": 1}),
            t0,
        );
        m.apply(&speed("c-1", Phase::Responding, 900, None), t0);
        assert_eq!(m.title(t0), "responding");
        assert_eq!(
            m.view(t0, &INPUTS).menu[0].text,
            "qwen3:8b on ollama · responding"
        );
    }

    #[test]
    fn a_wait_is_read_from_the_snapshot_json_and_a_missing_or_malformed_one_is_none() {
        let parsed = WaitView::from_snapshot_json(&serde_json::json!({
            "phase": "awaiting_first_token",
            "wait": {"reason": "prefilling", "progress": 0.6, "eta_ms": 3000, "usual_ms": 4000, "prompt_tokens": 12000, "silent_ms": 800}
        }));
        assert_eq!(
            parsed,
            Some(WaitView {
                reason: "prefilling".into(),
                position: None,
                progress: Some(0.6),
                silent_ms: Some(800),
            })
        );
        assert_eq!(
            WaitView::from_snapshot_json(&serde_json::json!({"phase": "awaiting_first_token"})),
            None
        );
        assert_eq!(
            WaitView::from_snapshot_json(&serde_json::json!({"wait": {"position": 2}})),
            None
        );
        assert_eq!(
            WaitView::from_snapshot_json(
                &serde_json::json!({"wait": {"reason": "queued", "position": -1}})
            ),
            None
        );
        // A snapshot without an explanation, or one that no longer waits, has none.
        assert_eq!(
            WaitView::of(&snap(Phase::AwaitingFirstToken, 100, None)),
            None
        );
        assert_eq!(WaitView::of(&snap(Phase::Responding, 100, None)), None);
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
                reason: None,
                usual_ms: None,
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

    fn settled_as(
        id: &str,
        model: &str,
        status: CallStatus,
        failure: Option<Failure>,
    ) -> EngineEvent {
        let mut call = Call {
            identity: ident(id, model),
            status,
            http_status: Some(500),
            speed: Some(snap(Phase::Complete, 2000, None)),
            input_tokens: None,
            details: Default::default(),
        };
        call.details.failure = failure;
        EngineEvent::Settled(call)
    }

    #[test]
    fn a_failed_call_shows_in_the_icon_and_menu_until_that_models_next_call_succeeds() {
        let t0 = Instant::now();
        let mut m = TrayModel::new();
        let http = Some(Failure::new(FailureKind::Http, 0, Some("boom")));
        assert!(m.apply(
            &settled_as("c-1", "phi4", CallStatus::UpstreamError, http),
            t0
        ));
        let failed = |m: &TrayModel| -> Vec<String> {
            let view = m.view(t0, &INPUTS);
            view.menu
                .iter()
                .filter(|e| e.id.starts_with(ID_FAILED_PREFIX))
                .map(|e| e.text.clone())
                .collect()
        };
        assert_eq!(m.view(t0, &INPUTS).state, TrayState::Failed);
        assert_eq!(failed(&m), ["Last call failed: phi4 (HTTP 500)"]);
        // A client that left says nothing about the model: still failed.
        let left = Some(Failure::new(FailureKind::ClientLeft, 3, None));
        m.apply(&settled_as("c-2", "phi4", CallStatus::Abandoned, left), t0);
        assert_eq!(failed(&m).len(), 1);
        // Another model's success leaves phi4's failure shown.
        m.apply(&settled_as("c-3", "gemma3", CallStatus::Ok, None), t0);
        assert_eq!(m.view(t0, &INPUTS).state, TrayState::Failed);
        // phi4 succeeds: the failure is gone.
        assert!(m.apply(&settled_as("c-4", "phi4", CallStatus::Ok, None), t0));
        assert!(failed(&m).is_empty());
        assert_eq!(m.view(t0, &INPUTS).state, TrayState::Idle);
    }

    /// A snapshot of a call dispatched at second `second` of a minute.
    fn speed_started(id: &str, second: u64, elapsed_ms: u64) -> EngineEvent {
        let mut call = ident(id, "qwen3:8b");
        call.started_at = format!("2026-11-30T10:42:{second:02}.000Z");
        EngineEvent::Speed {
            call,
            speed: snap(Phase::Responding, elapsed_ms, Some(10.0)),
            seen_by: speedtap::model::SeenBy::Proxy,
        }
    }

    fn menu_calls(m: &TrayModel, now: Instant) -> Vec<String> {
        m.view(now, &INPUTS)
            .menu
            .into_iter()
            .filter(|e| e.id.starts_with(ID_CALL_PREFIX))
            .map(|e| e.id)
            .collect()
    }

    #[test]
    fn the_menu_keeps_its_calls_in_start_order_over_ten_updates() {
        let t0 = Instant::now();
        let mut m = TrayModel::new();
        let started = [("c-000001", 10), ("c-000002", 11), ("c-000003", 11)];
        let expected = ["call:c-000001", "call:c-000002", "call:c-000003"];
        for update in 0..10u64 {
            let now = t0 + std::time::Duration::from_millis(update * 250);
            // Snapshots come in a different order each round, and their
            // elapsed times jitter (each is stamped when its call's actor
            // published), so an order by elapsed time would swap rows.
            for k in 0..started.len() {
                let (id, second) = started[(k + update as usize) % started.len()];
                let jitter = (update * 37 + k as u64 * 101) % 400;
                let elapsed = (20 - second) * 1000 + update * 250 + jitter;
                m.apply(&speed_started(id, second, elapsed), now);
            }
            assert_eq!(menu_calls(&m, now), expected, "update {update}");
        }
    }

    #[test]
    fn many_calls_are_capped_longest_running_first() {
        let t0 = Instant::now();
        let mut m = TrayModel::new();
        for i in 0..11u64 {
            // c-10 was dispatched first.
            m.apply(&speed_started(&format!("c-{i:02}"), 30 - i, i * 100), t0);
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
    fn menu_has_the_fixed_entries_and_one_copy_entry_per_route_but_none_for_the_demo() {
        let t0 = Instant::now();
        let routes = vec![
            RouteInfo {
                name: "ollama".into(),
                listen: "127.0.0.1:11435".into(),
                upstream: "http://127.0.0.1:11434".into(),
                proxy_url: "http://127.0.0.1:11435".into(),
                demo: false,
            },
            RouteInfo {
                name: "demo".into(),
                listen: "127.0.0.1:40000".into(),
                upstream: "http://127.0.0.1:39999".into(),
                proxy_url: "http://127.0.0.1:40000".into(),
                demo: true,
            },
        ];
        let inputs = ViewInputs {
            paused: true,
            routes: &routes,
            slow_ttft_ms: 5000,
            servers: &[],
            loaded: &[],
            now_unix_ms: 0,
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
