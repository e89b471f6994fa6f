//! The tray icon: draws the [`TrayView`] that [`crate::tray_model`]
//! computes on the StatusNotifierItem of [`crate::sni`], and reacts to the
//! menu.
//!
//! Data flow: [`crate::follow_events`] hands every engine event to
//! [`TrayIcon::on_event`], which updates the model (cheap, under a short
//! lock) and, on each global reading (`Stats`, the engine's publishing
//! cadence: 1 s while tokens flow, 10 s when idle) or a slow-first-token
//! alarm, redraws. A redraw sends only what differs from what is shown: the
//! label, the icon, the menu (updated in place while its shape holds).
//!
//! Menu clicks arrive on zbus's own thread: they only flip flags, notify,
//! or *spawn* the work (a redraw on the app's runtime, the window process),
//! so the bus is never held up.
//!
//! On Linux the label is the item's `XAyatanaLabel` and the menu is
//! exported over `com.canonical.dbusmenu`: what tray hosts show, and what
//! the D-Bus tests read.

use std::sync::{Arc, Mutex, Weak};

use speedtap::host::EngineHandle;
use speedtap::model::{CallsQuery, EngineEvent, EngineQueries};
use tokio::time::Instant;

use crate::sni::{Icon, IconError, Tray};
use crate::tray_extras::{decorate, ID_AUTOSTART};
use crate::tray_model::{
    TrayModel, TrayState, TrayView, ViewInputs, ID_COPY_PREFIX, ID_OPEN, ID_PAUSE, ID_QUIT,
};
use crate::App;

/// The icon for each state, decoded once. Colour and shape both differ
/// (see `icons/gen_icons.py`), for trays that draw no label.
struct Icons {
    idle: Icon,
    waiting: Icon,
    streaming: Icon,
    slow: Icon,
    problem: Icon,
}

impl Icons {
    fn decode() -> Result<Self, IconError> {
        Ok(Icons {
            idle: Icon::from_png(include_bytes!("../icons/tray-idle.png"))?,
            waiting: Icon::from_png(include_bytes!("../icons/tray-waiting.png"))?,
            streaming: Icon::from_png(include_bytes!("../icons/tray-streaming.png"))?,
            slow: Icon::from_png(include_bytes!("../icons/tray-slow.png"))?,
            problem: Icon::from_png(include_bytes!("../icons/tray-problem.png"))?,
        })
    }

    /// A port the app could not have shows while nothing more urgent (a
    /// slow call) does.
    fn pick(&self, state: TrayState, problem: bool) -> &Icon {
        if problem && state != TrayState::Slow {
            return &self.problem;
        }
        match state {
            TrayState::Idle => &self.idle,
            TrayState::Waiting => &self.waiting,
            TrayState::Streaming => &self.streaming,
            TrayState::Slow => &self.slow,
            // A failed call: the problem icon, until the model succeeds.
            TrayState::Failed => &self.problem,
        }
    }
}

/// What is on screen now.
struct Drawn {
    view: TrayView,
    /// A port conflict is shown (the problem icon).
    problem: bool,
}

/// The tray icon and its model.
pub struct TrayIcon {
    sni: Tray,
    icons: Icons,
    model: Mutex<TrayModel>,
    /// Taken by redraws only, so two never interleave.
    drawn: tokio::sync::Mutex<Drawn>,
    /// Kept alive: on X11 the copied text is served by the clipboard owner,
    /// so dropping it right after copying would lose the text.
    clipboard: Mutex<Option<arboard::Clipboard>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl TrayIcon {
    /// Exports the tray icon, idle, with its menu.
    pub async fn start(app: &Arc<App>) -> Result<Arc<TrayIcon>, String> {
        let icons = Icons::decode().map_err(|e| e.to_string())?;
        let model = TrayModel::new();
        let routes = app.engine.route_infos();
        let mut view = model.view(
            Instant::now(),
            &ViewInputs {
                paused: app.notifications.is_paused(),
                routes: &routes,
                slow_ttft_ms: app.engine.settings_snapshot().slow_ttft_ms,
                // The watcher's first list comes as an event.
                servers: &[],
                loaded: &[],
                now_unix_ms: unix_ms_now(),
            },
        );
        let problem = add_app_entries(app, &mut view);
        let clicks = Arc::downgrade(app);
        let activations = Arc::downgrade(app);
        let sni = Tray::start(
            &view.title,
            icons.pick(view.state, problem).clone(),
            view.menu.clone(),
            move |id| on_click(&clicks, &id),
            move || {
                if let Some(app) = activations.upgrade() {
                    app.show_window();
                }
            },
        )
        .await
        .map_err(|e| e.to_string())?;
        Ok(Arc::new(TrayIcon {
            sni,
            icons,
            model: Mutex::new(model),
            drawn: tokio::sync::Mutex::new(Drawn { view, problem }),
            clipboard: Mutex::new(None),
        }))
    }

    /// Starts over from the engine's list of calls (after (re)subscribing).
    pub async fn reseed(&self, engine: &EngineHandle) {
        let calls = engine.calls(CallsQuery::default()).await;
        lock(&self.model).reseed(&calls, Instant::now());
    }

    /// Takes one engine event; redraws at the global cadence.
    pub async fn on_event(&self, app: &Arc<App>, event: &EngineEvent) {
        let redraw = lock(&self.model).apply(event, Instant::now());
        if redraw {
            self.refresh(app).await;
        }
    }

    /// Redraws whatever changed.
    pub async fn refresh(&self, app: &Arc<App>) {
        let routes = app.engine.routes().await.routes;
        let doc = app.engine.servers().await;
        let slow_ttft_ms = app.engine.settings_snapshot().slow_ttft_ms;
        let mut view = {
            let mut model = lock(&self.model);
            model.set_unloads_shown(!doc.loaded.is_empty());
            model.view(
                Instant::now(),
                &ViewInputs {
                    paused: app.notifications.is_paused(),
                    routes: &routes,
                    slow_ttft_ms,
                    servers: &doc.servers,
                    loaded: &doc.loaded,
                    now_unix_ms: unix_ms_now(),
                },
            )
        };
        let problem = add_app_entries(app, &mut view);
        let mut drawn = self.drawn.lock().await;
        if view.title != drawn.view.title {
            self.sni.set_label(&view.title).await;
        }
        if view.state != drawn.view.state || problem != drawn.problem {
            self.sni
                .set_icon(self.icons.pick(view.state, problem).clone())
                .await;
        }
        if view.menu != drawn.view.menu {
            self.sni.set_menu(view.menu.clone()).await;
        }
        *drawn = Drawn { view, problem };
    }

    fn copy_proxy_url(&self, app: &App, route: &str) {
        // Never the demo's: its proxy feeds its own simulator.
        let Some(bound) = app
            .engine
            .route_infos()
            .into_iter()
            .find(|r| r.name == route && !r.demo)
        else {
            return;
        };
        let mut clipboard = lock(&self.clipboard);
        if clipboard.is_none() {
            match arboard::Clipboard::new() {
                Ok(c) => *clipboard = Some(c),
                Err(e) => {
                    tracing::warn!("no clipboard: {e}");
                    return;
                }
            }
        }
        if let Some(c) = clipboard.as_mut() {
            if let Err(e) = c.set_text(bound.proxy_url) {
                tracing::warn!("proxy URL not copied: {e}");
            }
        }
    }
}

/// The app's own entries (port conflicts, start at login); true when a
/// conflict is shown.
fn add_app_entries(app: &App, view: &mut TrayView) -> bool {
    let conflicts = app.conflicts.list();
    let autostart = app.login.as_ref().map(|l| l.is_enabled());
    decorate(view, &conflicts, autostart);
    !conflicts.is_empty()
}

/// Runs on the D-Bus task: never waits there (see the module docs).
fn on_click(app: &Weak<App>, id: &str) {
    let Some(app) = app.upgrade() else {
        return;
    };
    match id {
        ID_OPEN => app.show_window(),
        ID_PAUSE => {
            app.notifications.set_paused(!app.notifications.is_paused());
            redraw_soon(app);
        }
        ID_AUTOSTART => {
            if let Some(item) = &app.login {
                if let Err(e) = item.set_enabled(!item.is_enabled()) {
                    tracing::warn!("start at login not changed: {e}");
                }
            }
            redraw_soon(app);
        }
        ID_QUIT => app.quit.notify_one(),
        id => {
            if let Some(route) = id.strip_prefix(ID_COPY_PREFIX) {
                if let Some(tray) = app.tray.get() {
                    tray.copy_proxy_url(&app, route);
                }
            }
        }
    }
}

fn redraw_soon(app: Arc<App>) {
    let runtime = app.runtime.clone();
    runtime.spawn(async move { app.refresh_tray().await });
}

/// The wall clock, unix ms (loaded models unload at a date).
fn unix_ms_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
