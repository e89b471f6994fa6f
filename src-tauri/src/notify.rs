//! Desktop notifications: a late first token (with why it waits, in the
//! engine's words), a follow-up when that call settles (if the user asked
//! for it), a prompt the server cut short (once per route and model), and
//! a settled call that decoded slower than usual for a named cause (the
//! headless engine's line, from the same `SlowdownNotices`: at most once
//! per route, model and cause per hour).
//!
//! The engine decides *when* a first token is late and throttles per route
//! (its `Notifier` calls our hook at most once per route per minute, and
//! not at all while "Pause notifications" is on). This module only decides
//! whether the user still wants to hear about it (the `notifications` and
//! `notify_settled` settings, read live so a save in the window applies at
//! once; the pause switch, checked again here because the settled
//! follow-up does not go through the engine's hook) and hands the message
//! to a [`Sink`].
//!
//! The real sink is [`DesktopSink`]: notify-rust over D-Bus, each
//! notification sent from a blocking-pool thread of the app's tokio
//! runtime. The hook runs on the engine's notifier thread, and a D-Bus call
//! can block for seconds (no notification daemon, a daemon being
//! activated); it must never stall the engine.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use tokio::time::Instant;

use speedtap::engine::notifier::SlowFirstTokenHook;
use speedtap::host::EngineHandle;
use speedtap::meter::slowdown_notice::SlowdownNotices;
use speedtap::model::SettingsDoc;
use speedtap::model::{Call, FailureKind, SlowFirstToken};

/// The application name notifications carry (what notification centres
/// group and label them by).
pub const APP_NAME: &str = "speedtap";

/// The icon theme name the package installs (`Icon=` of its desktop
/// entry), sent with every notification.
pub const ICON_NAME: &str = "speedtap-desktop";

/// The package's desktop entry (`/usr/share/applications/speedtap.desktop`),
/// sent as the `desktop-entry` hint so notification centres group and
/// label the notices as the app's.
pub const DESKTOP_ENTRY: &str = "speedtap";

/// One notification.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    /// The line users read: `qwen3:32b on ollama: no first token after 5.0 s`.
    pub summary: String,
    pub body: String,
}

/// Where notifications go.
pub trait Sink: Send + Sync + 'static {
    /// Shows `note`. Must return quickly (see the module docs).
    fn show(&self, note: Note);
}

/// Desktop notifications through notify-rust (D-Bus
/// `org.freedesktop.Notifications` on Linux), sent on `runtime`'s blocking
/// pool (see the module docs).
pub struct DesktopSink {
    runtime: tokio::runtime::Handle,
}

impl DesktopSink {
    /// Sends on the runtime this is called in. Panics outside a runtime.
    pub fn on_current_runtime() -> Self {
        DesktopSink {
            runtime: tokio::runtime::Handle::current(),
        }
    }

    /// Shows one notification, off the caller's thread; a failure (no
    /// daemon on the bus) is logged, never fatal.
    pub fn send(&self, summary: String, body: String) {
        self.runtime.spawn_blocking(move || {
            let shown = notify_rust::Notification::new()
                .appname(APP_NAME)
                .summary(&summary)
                .body(&body)
                .icon(ICON_NAME)
                .hint(notify_rust::Hint::DesktopEntry(DESKTOP_ENTRY.to_owned()))
                .show();
            if let Err(e) = shown {
                tracing::warn!("desktop notification not shown: {e}");
            }
        });
    }
}

impl Sink for DesktopSink {
    fn show(&self, note: Note) {
        self.send(note.summary, note.body);
    }
}

/// Where the live settings come from: the running engine, once it runs.
/// Before that (and in tests without an engine) the defaults apply:
/// notifications on, no settled follow-up.
fn live_settings(engine: &OnceLock<EngineHandle>) -> (bool, bool) {
    match engine.get() {
        Some(handle) => {
            let SettingsDoc {
                notifications,
                notify_settled,
                ..
            } = handle.settings_snapshot();
            (notifications, notify_settled)
        }
        None => (true, false),
    }
}

/// The tray's notification policy. Shared (`Arc`) between the engine's
/// hook, the event loop (settled follow-ups) and the tray menu (pause).
pub struct Notifications {
    sink: Box<dyn Sink>,
    engine: OnceLock<EngineHandle>,
    paused: AtomicBool,
    /// Overrides for tests: (notifications, notify_settled).
    fixed_settings: Option<(bool, bool)>,
    /// Calls we notified about, waiting for their settled follow-up.
    alarmed: Mutex<HashMap<String, SlowFirstToken>>,
    /// (route, model) pairs whose cut prompt was notified: once is enough
    /// to learn that a context size is too small; every call would be noise.
    truncated: Mutex<HashSet<(String, Option<String>)>>,
    /// When each route, model and slowdown cause was last told.
    slowdowns: Mutex<SlowdownNotices>,
    /// When each route, model and failure kind was last told: one model's
    /// failures never silence another's.
    failures: Mutex<HashMap<(String, String, FailureKind), Instant>>,
}

/// At most one failure notification per route, model and kind in this
/// period.
pub const FAILURE_THROTTLE: std::time::Duration = std::time::Duration::from_secs(60);

/// The most characters of a notification's title: GNOME and KDE cut
/// longer ones.
pub const TITLE_MAX: usize = 60;

impl Notifications {
    /// A policy sending to `sink`, reading the settings from the engine
    /// given later to [`Notifications::attach`].
    pub fn new(sink: impl Sink) -> Arc<Self> {
        Arc::new(Notifications {
            sink: Box::new(sink),
            engine: OnceLock::new(),
            paused: AtomicBool::new(false),
            fixed_settings: None,
            alarmed: Mutex::new(HashMap::new()),
            truncated: Mutex::new(HashSet::new()),
            slowdowns: Mutex::new(SlowdownNotices::new()),
            failures: Mutex::new(HashMap::new()),
        })
    }

    /// A policy with fixed `notifications` / `notify_settled` settings (tests).
    pub fn with_settings(sink: impl Sink, notifications: bool, notify_settled: bool) -> Arc<Self> {
        Arc::new(Notifications {
            sink: Box::new(sink),
            engine: OnceLock::new(),
            paused: AtomicBool::new(false),
            fixed_settings: Some((notifications, notify_settled)),
            alarmed: Mutex::new(HashMap::new()),
            truncated: Mutex::new(HashSet::new()),
            slowdowns: Mutex::new(SlowdownNotices::new()),
            failures: Mutex::new(HashMap::new()),
        })
    }

    /// Reads the live settings from `engine` from now on, and tells it
    /// about the pause switch.
    pub fn attach(&self, engine: EngineHandle) {
        engine.set_notifications_paused(self.is_paused());
        let _ = self.engine.set(engine);
    }

    /// The hook to register in `EngineOptions::slow_first_token_hooks`.
    pub fn hook(self: &Arc<Self>) -> SlowFirstTokenHook {
        let me = Arc::clone(self);
        Arc::new(move |slow: &SlowFirstToken| me.on_slow_first_token(slow))
    }

    /// "Pause notifications": silences both kinds until resumed. The
    /// engine is told too, so its hook stops firing at the source.
    pub fn set_paused(&self, paused: bool) {
        self.paused.store(paused, Ordering::Relaxed);
        if let Some(engine) = self.engine.get() {
            engine.set_notifications_paused(paused);
        }
    }

    pub fn is_paused(&self) -> bool {
        self.paused.load(Ordering::Relaxed)
    }

    fn settings(&self) -> (bool, bool) {
        self.fixed_settings
            .unwrap_or_else(|| live_settings(&self.engine))
    }

    fn alarmed(&self) -> std::sync::MutexGuard<'_, HashMap<String, SlowFirstToken>> {
        self.alarmed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The engine's alarm: a call is still waiting past the threshold.
    pub fn on_slow_first_token(&self, slow: &SlowFirstToken) {
        let (notifications, _) = self.settings();
        if self.is_paused() || !notifications {
            return;
        }
        self.alarmed().insert(slow.call.id.clone(), slow.clone());
        self.sink.show(slow_note(slow));
    }

    /// The engine's truncation alarm (`prompt_truncated`): the server read
    /// less of a prompt than was sent. Notified once per route and model;
    /// `message` is the engine's text (`qwen3:32b on ollama cut the prompt:
    /// 9,000 tokens sent, 2,048 read (context 2,048)`). An alarm silenced
    /// by the pause or the settings is not counted, so the next one shows.
    pub fn on_prompt_truncated(&self, route: &str, model: Option<&str>, message: String) {
        let (notifications, _) = self.settings();
        if self.is_paused() || !notifications {
            return;
        }
        let first = self
            .truncated
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((route.to_owned(), model.map(str::to_owned)));
        if first {
            self.sink.show(truncation_note(message));
        }
    }

    /// The followed servers changed: a version change names the product
    /// of the route's server where one is known.
    pub fn on_servers(&self, doc: &speedtap::model::ServersDoc) {
        self.slowdowns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .know_servers(doc);
    }

    /// A call settled at `now`: its slowdown with a named cause, told in
    /// the headless engine's words, at most once per route, model and
    /// cause per hour. A slowdown silenced by the pause or the settings is
    /// not counted as told, so the next one after resuming shows.
    pub fn on_slowdown(&self, call: &Call, now: Instant) {
        let (notifications, _) = self.settings();
        if self.is_paused() || !notifications || call.identity.demo {
            return;
        }
        let line = self
            .slowdowns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .line(call, now);
        if let Some(line) = line {
            self.sink.show(slowdown_note(line));
        }
    }

    /// A call settled at `now` having failed (an HTTP error, an error
    /// event, a break-off; a client that left is no failure): told once
    /// per route, model and kind per [`FAILURE_THROTTLE`], never for the
    /// demo's calls or a relay's legs. A failure silenced by the pause or
    /// the settings is not counted as told.
    pub fn on_failed(&self, call: &Call, now: Instant) {
        let Some(failure) = call.details.failure.as_ref().filter(|f| f.is_error()) else {
            return;
        };
        let (notifications, _) = self.settings();
        if self.is_paused() || !notifications || call.identity.demo || call.details.relay.is_some()
        {
            return;
        }
        let key = (
            call.identity.route.clone(),
            call.identity.model.clone().unwrap_or_default(),
            failure.kind,
        );
        {
            let mut told = self.failures.lock().unwrap_or_else(|p| p.into_inner());
            if told
                .get(&key)
                .is_some_and(|at| now.saturating_duration_since(*at) < FAILURE_THROTTLE)
            {
                return;
            }
            told.insert(key, now);
        }
        self.sink.show(failure_note(call));
    }

    /// A call settled: the follow-up, if we alarmed about it and the user
    /// wants follow-ups.
    pub fn on_settled(&self, call: &Call) {
        let Some(slow) = self.alarmed().remove(&call.identity.id) else {
            return;
        };
        let (notifications, notify_settled) = self.settings();
        if self.is_paused() || !notifications || !notify_settled {
            return;
        }
        self.sink.show(settled_note(&slow, call));
    }
}

/// The late-first-token notification: the engine's message (who, how
/// long, and why it waits when known: `…, loading the model (usually
/// 4.0 s)`) and a body saying what "late" was judged against.
pub fn slow_note(slow: &SlowFirstToken) -> Note {
    Note {
        summary: slow.message(),
        body: slow_body(&serde_json::to_value(slow).unwrap_or_default()),
    }
}

/// What a slow first token was judged against, from the alarm's JSON
/// (docs/api.md): the route's normal for this model and prompt size
/// (`usual_ms`) when the engine has learned one, else the fixed threshold.
/// Read through the JSON so this depends on the published shape alone.
pub fn slow_body(alarm: &serde_json::Value) -> String {
    let ms = |key: &str| alarm.get(key).and_then(serde_json::Value::as_u64);
    match (ms("usual_ms"), ms("threshold_ms")) {
        (Some(usual), _) => format!(
            "Still waiting; this model on this route usually answers a prompt this size in {:.1} s.",
            usual as f64 / 1000.0
        ),
        (None, Some(threshold)) => format!(
            "Still waiting; the slow-first-token threshold is {:.1} s.",
            threshold as f64 / 1000.0
        ),
        (None, None) => "Still waiting.".to_owned(),
    }
}

/// `model: tail`, the model's name cut (`…`) so the whole stays within
/// [`TITLE_MAX`] characters.
pub fn short_title(model: &str, tail: &str) -> String {
    let room = TITLE_MAX.saturating_sub(tail.chars().count() + 2);
    let name: String = if model.chars().count() > room {
        let mut cut: String = model.chars().take(room.saturating_sub(1)).collect();
        cut.push('…');
        cut
    } else {
        model.to_owned()
    };
    format!("{name}: {tail}")
}

/// The failure notification: `phi4: failed (HTTP 500)` as the title; the
/// body the server's name for the error and where it ran, or, without
/// one, what the call had streamed. Never a repeat of the title.
pub fn failure_note(call: &Call) -> Note {
    let Some(failure) = &call.details.failure else {
        return Note {
            summary: short_title(
                call.identity.model.as_deref().unwrap_or("a model"),
                "failed",
            ),
            body: String::new(),
        };
    };
    let label = failure.label(call.http_status);
    let model = call.identity.model.as_deref().unwrap_or("a model");
    let summary = short_title(model, &format!("failed ({label})"));
    let on = format!("on {}", call.identity.route);
    let body = match &failure.message {
        Some(message) => format!("The server's error: {message} ({on})."),
        None if failure.after_tokens > 0 => format!(
            "The answer stopped after {} output tokens, before its end ({on}).",
            failure.after_tokens
        ),
        None => format!("No answer came back ({on})."),
    };
    Note { summary, body }
}

/// The cut-prompt notification: the engine's message and what to do.
pub fn truncation_note(message: String) -> Note {
    Note {
        summary: message,
        body: "The model answered without the rest of the prompt. Raise the context size \
               (Ollama: num_ctx) or send shorter prompts."
            .to_owned(),
    }
}

/// The slowdown notification: the engine's line and where to look.
pub fn slowdown_note(line: String) -> Note {
    Note {
        summary: line,
        body: "Judged against this model's usual decode rate on this route at this context \
               depth. The call's details in History show the evidence."
            .to_owned(),
    }
}

/// The settled follow-up: `qwen3:32b on ollama: first token after 7.2 s,
/// 41.7 tok/s`. A call that ended without a first token says how it ended
/// instead; a missing rate is left out rather than shown as 0.
pub fn settled_note(slow: &SlowFirstToken, call: &Call) -> Note {
    let who = format!(
        "{} on {}",
        call.identity
            .model
            .as_deref()
            .or(slow.call.model.as_deref())
            .unwrap_or("a model"),
        call.identity.route
    );
    let speed = call.speed.as_ref();
    let summary = match speed.and_then(|s| s.time_to_first_token_ms) {
        Some(ttft) => {
            let mut line = format!("{who}: first token after {:.1} s", ttft as f64 / 1000.0);
            if let Some(tps) = speed.and_then(|s| s.output_tokens_per_second) {
                line.push_str(&format!(", {tps:.1} tok/s"));
            }
            line
        }
        None => format!(
            "{who}: ended without a first token ({})",
            call.status.as_str().replace('_', " ")
        ),
    };
    Note {
        summary,
        body: format!(
            "Earlier: no first token after {:.1} s.",
            slow.waited_ms as f64 / 1000.0
        ),
    }
}

#[cfg(test)]
mod tests {
    use speedtap::model::ApiKind;
    use speedtap::model::{CallIdentity, CallStatus};
    use speedtap::model::{Phase, Slowdown, SlowdownCause, Snapshot, TokenSource};
    use std::time::Duration;

    use super::*;

    #[derive(Clone, Default)]
    struct Collect(Arc<Mutex<Vec<Note>>>);

    impl Sink for Collect {
        fn show(&self, note: Note) {
            self.0.lock().unwrap().push(note);
        }
    }

    impl Collect {
        fn summaries(&self) -> Vec<String> {
            self.0
                .lock()
                .unwrap()
                .iter()
                .map(|n| n.summary.clone())
                .collect()
        }
    }

    fn ident(id: &str) -> CallIdentity {
        CallIdentity {
            id: id.into(),
            route: "ollama".into(),
            api: ApiKind::OllamaChat,
            model: Some("qwen3:32b".into()),
            started_at: String::new(),
            demo: false,
        }
    }

    fn slow(id: &str) -> SlowFirstToken {
        SlowFirstToken {
            call: ident(id),
            waited_ms: 5000,
            threshold_ms: 5000,
            reason: None,
            usual_ms: None,
        }
    }

    fn settled(id: &str, ttft: Option<u64>, tps: Option<f64>, status: CallStatus) -> Call {
        Call {
            identity: ident(id),
            status,
            http_status: Some(200),
            speed: Some(Snapshot {
                stalled_ms: None,
                phase: Phase::Complete,
                is_final: true,
                elapsed_ms: 9000,
                time_to_first_token_ms: ttft,
                output_tokens: 100,
                output_tokens_per_second: tps,
                token_source: TokenSource::Server,
                wait: None,
            }),
            input_tokens: None,
            details: Default::default(),
        }
    }

    #[test]
    fn a_slow_first_token_shows_the_engines_message() {
        let sink = Collect::default();
        let n = Notifications::with_settings(sink.clone(), true, false);
        (n.hook())(&slow("c-1"));
        assert_eq!(
            sink.summaries(),
            ["qwen3:32b on ollama: no first token after 5.0 s"]
        );
    }

    #[test]
    fn a_slow_first_token_says_what_slow_was_judged_against() {
        // The engine's normal for this route, model and prompt size.
        let with_normal = serde_json::json!({
            "call": {"id": "c-1", "route": "ollama", "model": "qwen3:32b"},
            "waited_ms": 9100, "threshold_ms": 5000, "usual_ms": 4000,
            "reason": {"reason": "loading_model", "usual_ms": 4000}
        });
        assert_eq!(
            slow_body(&with_normal),
            "Still waiting; this model on this route usually answers a prompt this size in 4.0 s."
        );
        // No history yet: the fixed threshold is the floor.
        assert_eq!(
            slow_note(&slow("c-1")).body,
            "Still waiting; the slow-first-token threshold is 5.0 s."
        );
        assert_eq!(slow_body(&serde_json::json!({})), "Still waiting.");
    }

    #[test]
    fn the_slow_notification_is_the_engines_message_whatever_it_explains() {
        // Built from the contract's JSON: the reason and the normal ride
        // along, and the summary is the engine's message() verbatim (the
        // engine words the reason; the tray does not second-guess it).
        let alarm: SlowFirstToken = serde_json::from_value(serde_json::json!({
            "call": {"id": "c-1", "route": "ollama", "api": "ollama_chat", "model": "qwen3:32b", "started_at": ""},
            "waited_ms": 9100, "threshold_ms": 5000, "usual_ms": 4000,
            "reason": {"reason": "loading_model", "usual_ms": 4000}
        }))
        .unwrap();
        let sink = Collect::default();
        let n = Notifications::with_settings(sink.clone(), true, false);
        n.on_slow_first_token(&alarm);
        assert_eq!(sink.summaries(), [alarm.message()]);
        assert!(alarm
            .message()
            .starts_with("qwen3:32b on ollama: no first token after 9.1 s"));
    }

    #[test]
    fn a_cut_prompt_is_notified_once_per_route_and_model() {
        let sink = Collect::default();
        let n = Notifications::with_settings(sink.clone(), true, false);
        let cut = |route: &str, model: Option<&str>| {
            n.on_prompt_truncated(
                route,
                model,
                format!(
                    "{} on {route} cut the prompt: 9,000 tokens sent, 2,048 read (context 2,048)",
                    model.unwrap_or("a model")
                ),
            )
        };
        cut("ollama", Some("qwen3:32b"));
        cut("ollama", Some("qwen3:32b"));
        cut("ollama", Some("llama3.2:3b"));
        cut("lab", Some("qwen3:32b"));
        cut("ollama", None);
        cut("ollama", None);
        assert_eq!(
            sink.summaries(),
            [
                "qwen3:32b on ollama cut the prompt: 9,000 tokens sent, 2,048 read (context 2,048)",
                "llama3.2:3b on ollama cut the prompt: 9,000 tokens sent, 2,048 read (context 2,048)",
                "qwen3:32b on lab cut the prompt: 9,000 tokens sent, 2,048 read (context 2,048)",
                "a model on ollama cut the prompt: 9,000 tokens sent, 2,048 read (context 2,048)",
            ]
        );
        assert!(sink.0.lock().unwrap()[0].body.contains("num_ctx"));
    }

    #[test]
    fn a_cut_prompt_silenced_by_the_pause_is_notified_after_resuming() {
        let sink = Collect::default();
        let n = Notifications::with_settings(sink.clone(), true, false);
        n.set_paused(true);
        n.on_prompt_truncated("ollama", Some("m"), "m on ollama cut the prompt".into());
        assert!(sink.summaries().is_empty());
        n.set_paused(false);
        n.on_prompt_truncated("ollama", Some("m"), "m on ollama cut the prompt".into());
        assert_eq!(sink.summaries(), ["m on ollama cut the prompt"]);
        let off = Notifications::with_settings(sink.clone(), false, false);
        off.on_prompt_truncated("ollama", Some("m"), "again".into());
        assert_eq!(
            sink.summaries().len(),
            1,
            "notifications off in the settings"
        );
    }

    fn failed_call(id: &str, model: &str, kind: FailureKind, message: Option<&str>) -> Call {
        let mut call = settled(id, None, None, CallStatus::UpstreamError);
        call.identity.model = Some(model.to_owned());
        call.http_status = Some(500);
        call.details.failure = Some(speedtap::model::Failure::new(kind, 30, message));
        call
    }

    #[test]
    fn a_failed_call_is_notified_once_per_route_model_and_kind_with_a_short_title() {
        let sink = Collect::default();
        let n = Notifications::with_settings(sink.clone(), true, false);
        let t0 = Instant::now();
        let boom = Some("CUDA error: out of memory");
        n.on_failed(&failed_call("c-1", "phi4", FailureKind::Http, boom), t0);
        // The same model and kind within the minute: once is enough.
        n.on_failed(&failed_call("c-2", "phi4", FailureKind::Http, boom), t0);
        // Another model, or another kind, is told at once.
        n.on_failed(&failed_call("c-3", "gemma3", FailureKind::Http, None), t0);
        n.on_failed(&failed_call("c-4", "phi4", FailureKind::BrokeOff, None), t0);
        // A client that left is nobody's failure.
        n.on_failed(
            &failed_call("c-5", "phi4", FailureKind::ClientLeft, None),
            t0,
        );
        n.on_failed(
            &failed_call("c-6", "phi4", FailureKind::Http, boom),
            t0 + FAILURE_THROTTLE,
        );
        assert_eq!(
            sink.summaries(),
            [
                "phi4: failed (HTTP 500)",
                "gemma3: failed (HTTP 500)",
                "phi4: failed (broke after 30 tokens)",
                "phi4: failed (HTTP 500)",
            ]
        );
        let notes = sink.0.lock().unwrap().clone();
        assert_eq!(
            notes[0].body,
            "The server's error: CUDA error: out of memory (on ollama)."
        );
        assert_eq!(
            notes[2].body,
            "The answer stopped after 30 output tokens, before its end (on ollama)."
        );
        for note in &notes {
            assert!(note.summary.chars().count() <= TITLE_MAX, "{note:?}");
            assert!(!note.body.contains(&note.summary), "{note:?}");
        }
    }

    #[test]
    fn a_long_model_name_is_cut_so_the_title_fits_sixty_characters() {
        let model = "hf.co/unsloth/DeepSeek-R1-Distill-Qwen-32B-GGUF:Q4_K_M-very-long";
        let title = short_title(model, "failed (broke after 1,234 tokens)");
        assert_eq!(title.chars().count(), TITLE_MAX, "{title}");
        assert!(
            title.ends_with("…: failed (broke after 1,234 tokens)"),
            "{title}"
        );
        assert_eq!(short_title("phi4", "stalled 30 s"), "phi4: stalled 30 s");
    }

    #[test]
    fn no_failure_notification_while_paused_or_switched_off() {
        let sink = Collect::default();
        let n = Notifications::with_settings(sink.clone(), true, false);
        n.set_paused(true);
        let t0 = Instant::now();
        n.on_failed(&failed_call("c-1", "phi4", FailureKind::Http, None), t0);
        assert!(sink.summaries().is_empty());
        n.set_paused(false);
        n.on_failed(&failed_call("c-2", "phi4", FailureKind::Http, None), t0);
        assert_eq!(
            sink.summaries().len(),
            1,
            "a silenced one is not counted as told"
        );
        let off = Notifications::with_settings(sink.clone(), false, false);
        off.on_failed(&failed_call("c-3", "x", FailureKind::Http, None), t0);
        assert_eq!(sink.summaries().len(), 1);
    }

    #[test]
    fn no_settled_follow_up_unless_enabled() {
        let sink = Collect::default();
        let n = Notifications::with_settings(sink.clone(), true, false);
        n.on_slow_first_token(&slow("c-1"));
        n.on_settled(&settled("c-1", Some(7200), Some(41.7), CallStatus::Ok));
        assert_eq!(sink.summaries().len(), 1);
    }

    #[test]
    fn settled_follow_up_names_ttft_and_rate_once() {
        let sink = Collect::default();
        let n = Notifications::with_settings(sink.clone(), true, true);
        n.on_slow_first_token(&slow("c-1"));
        let call = settled("c-1", Some(7200), Some(41.7), CallStatus::Ok);
        n.on_settled(&call);
        n.on_settled(&call);
        // A call we never alarmed about gets no follow-up.
        n.on_settled(&settled("c-2", Some(100), Some(40.0), CallStatus::Ok));
        assert_eq!(
            sink.summaries()[1..],
            ["qwen3:32b on ollama: first token after 7.2 s, 41.7 tok/s"]
        );
    }

    #[test]
    fn follow_up_without_first_token_says_how_it_ended_and_no_rate() {
        let s = slow("c-1");
        let note = settled_note(&s, &settled("c-1", None, None, CallStatus::Abandoned));
        assert_eq!(
            note.summary,
            "qwen3:32b on ollama: ended without a first token (abandoned)"
        );
        let note = settled_note(&s, &settled("c-1", Some(6000), None, CallStatus::Ok));
        assert_eq!(note.summary, "qwen3:32b on ollama: first token after 6.0 s");
    }

    #[test]
    fn paused_silences_alarms_and_follow_ups() {
        let sink = Collect::default();
        let n = Notifications::with_settings(sink.clone(), true, true);
        n.on_slow_first_token(&slow("c-1"));
        n.set_paused(true);
        n.on_slow_first_token(&slow("c-2"));
        n.on_settled(&settled("c-1", Some(7000), Some(10.0), CallStatus::Ok));
        assert_eq!(sink.summaries().len(), 1);
        n.set_paused(false);
        n.on_slow_first_token(&slow("c-3"));
        assert_eq!(sink.summaries().len(), 2);
    }

    fn decoded_slowly(id: &str, tps: f64) -> Call {
        let mut call = settled(id, Some(300), Some(tps), CallStatus::Ok);
        call.details.slowdown = Some(Slowdown {
            usual_tps: 35.0,
            ratio: 0.34,
            causes: vec![SlowdownCause::CpuOffload { cpu_share: 0.29 }],
        });
        call
    }

    #[test]
    fn a_slowdown_is_notified_in_the_engines_words_once_per_hour() {
        let sink = Collect::default();
        let n = Notifications::with_settings(sink.clone(), true, false);
        let t0 = Instant::now();
        n.on_slowdown(&decoded_slowly("c-1", 12.0), t0);
        n.on_slowdown(
            &decoded_slowly("c-2", 11.0),
            t0 + Duration::from_secs(1_800),
        );
        n.on_slowdown(
            &decoded_slowly("c-3", 12.0),
            t0 + Duration::from_secs(3_599),
        );
        // A call that was not slow says nothing.
        n.on_slowdown(&settled("c-4", Some(300), Some(40.0), CallStatus::Ok), t0);
        assert_eq!(
            sink.summaries(),
            ["qwen3:32b on ollama decodes at 12 tok/s, usually 35: 29% of the model runs on the CPU"]
        );
        n.on_slowdown(
            &decoded_slowly("c-5", 13.0),
            t0 + Duration::from_secs(3_600),
        );
        assert_eq!(
            sink.summaries()[1],
            "qwen3:32b on ollama decodes at 13 tok/s, usually 35: 29% of the model runs on the CPU"
        );
    }

    #[test]
    fn a_slowdown_silenced_by_the_pause_is_notified_after_resuming() {
        let sink = Collect::default();
        let n = Notifications::with_settings(sink.clone(), true, false);
        let t0 = Instant::now();
        n.set_paused(true);
        n.on_slowdown(&decoded_slowly("c-1", 12.0), t0);
        assert!(sink.summaries().is_empty());
        n.set_paused(false);
        n.on_slowdown(&decoded_slowly("c-2", 12.0), t0 + Duration::from_secs(60));
        assert_eq!(sink.summaries().len(), 1);
        let off = Notifications::with_settings(sink.clone(), false, false);
        off.on_slowdown(&decoded_slowly("c-3", 12.0), t0);
        assert_eq!(
            sink.summaries().len(),
            1,
            "notifications off in the settings"
        );
    }

    #[test]
    fn notifications_off_in_settings_silences_everything() {
        let sink = Collect::default();
        let n = Notifications::with_settings(sink.clone(), false, true);
        n.on_slow_first_token(&slow("c-1"));
        n.on_settled(&settled("c-1", Some(7000), Some(10.0), CallStatus::Ok));
        assert!(sink.summaries().is_empty());
    }
}
