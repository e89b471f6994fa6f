//! The tray icon: draws the [`TrayView`] that [`crate::tray_model`]
//! computes, and reacts to the menu.
//!
//! Data flow: the event loop in `lib.rs` hands every engine event to
//! [`on_event`], which updates the model (cheap, under a short lock) and,
//! on each global reading (`Stats`, the engine's publishing cadence: 1 s
//! while tokens flow, 10 s when idle) or a slow-first-token alarm, redraws.
//! A redraw changes only what differs from what is on screen: the label,
//! the icon, menu texts in place; the menu is rebuilt only when its entries
//! change (a call starts or ends, a route is added).
//!
//! Threading: tray and menu calls hop to the main (GTK) thread and wait for
//! it. So the main thread must never wait for us: menu clicks only flip
//! flags and *spawn* a redraw; only redraw tasks take the [`Drawn`] lock.
//!
//! On Linux the tray is a StatusNotifierItem (libayatana-appindicator): the
//! label is its `XAyatanaLabel`, the menu is exported over
//! `com.canonical.dbusmenu`. That is what the D-Bus tests read.
#![cfg(all(desktop, not(test)))]

use std::sync::{Arc, Mutex};

use speedtap::model::{CallsQuery, EngineQueries};

use speedtap::host::EngineHandle;
use tauri::image::Image;
use tauri::menu::{CheckMenuItem, Menu, MenuEvent, MenuItem, MenuItemKind, PredefinedMenuItem};
use tauri::tray::{MouseButton, MouseButtonState, TrayIcon, TrayIconBuilder, TrayIconEvent};
use tauri::{AppHandle, Manager, Runtime};
use tokio::time::Instant;

use crate::autostart::LoginItem;
use crate::notify::Notifications;
use crate::ports::Conflicts;
use crate::tray_extras::{decorate, ID_AUTOSTART};
use crate::tray_model::{
    EntryKind, MenuEntry, TrayModel, TrayState, TrayView, ViewInputs, ID_COPY_PREFIX, ID_OPEN,
    ID_PAUSE, ID_QUIT,
};

/// The tray icon's id. On Linux the StatusNotifierItem's object path ends
/// with it (`/org/ayatana/NotificationItem/tray_icon_tray_app_speedtap`).
pub const TRAY_ID: &str = "speedtap";

/// The icon for each state. Colour and shape both differ (see
/// `icons/gen_icons.py`), for trays that draw no label. A port the app
/// could not have shows while nothing more urgent (a slow call) does.
fn icon(state: TrayState, problem: bool) -> Image<'static> {
    if problem && state != TrayState::Slow {
        return tauri::include_image!("icons/tray-problem.png");
    }
    match state {
        TrayState::Idle => tauri::include_image!("icons/tray-idle.png"),
        TrayState::Waiting => tauri::include_image!("icons/tray-waiting.png"),
        TrayState::Streaming => tauri::include_image!("icons/tray-streaming.png"),
        TrayState::Slow => tauri::include_image!("icons/tray-slow.png"),
    }
}

/// The engine the tray reads (managed).
struct Engine(EngineHandle);

/// What is on screen now, with the menu items to update in place.
struct Drawn<R: Runtime> {
    view: TrayView,
    /// A port conflict is shown (the problem icon).
    problem: bool,
    items: Vec<MenuItemKind<R>>,
}

/// The tray's state (managed).
struct Tray<R: Runtime> {
    icon: TrayIcon<R>,
    model: Mutex<TrayModel>,
    /// Taken only by redraws (never by the main thread; see module docs).
    drawn: tokio::sync::Mutex<Drawn<R>>,
    /// Kept alive: on X11 the copied text is served by the clipboard owner,
    /// so dropping it right after copying would lose the text.
    clipboard: Mutex<Option<arboard::Clipboard>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Creates the tray icon, idle, with its menu.
pub fn create<R: Runtime>(app: &AppHandle<R>, engine: &EngineHandle) -> tauri::Result<()> {
    let model = TrayModel::new();
    let notifications = app.state::<Arc<Notifications>>();
    let routes = engine.route_infos();
    let mut view = model.view(
        Instant::now(),
        &ViewInputs {
            paused: notifications.is_paused(),
            routes: &routes,
            slow_ttft_ms: engine.settings_snapshot().slow_ttft_ms,
            // The watcher's first list comes as an event.
            servers: &[],
            loaded: &[],
            now_unix_ms: unix_ms_now(),
        },
    );
    let problem = add_app_entries(app, &mut view);
    let (menu, items) = build_menu(app, &view.menu)?;
    let icon = TrayIconBuilder::with_id(TRAY_ID)
        .icon(icon(view.state, problem))
        .title(&view.title)
        .tooltip("speedtap")
        .menu(&menu)
        .show_menu_on_left_click(false)
        .on_menu_event(on_menu_event)
        .on_tray_icon_event(|tray, event| {
            // Where the platform reports clicks (not Linux appindicator,
            // which only opens the menu), a left click opens the window.
            if let TrayIconEvent::Click {
                button: MouseButton::Left,
                button_state: MouseButtonState::Up,
                ..
            } = event
            {
                crate::show_window(tray.app_handle());
            }
        })
        .build(app)?;
    app.manage(Engine(engine.clone()));
    app.manage(Tray {
        icon,
        model: Mutex::new(model),
        drawn: tokio::sync::Mutex::new(Drawn {
            view,
            problem,
            items,
        }),
        clipboard: Mutex::new(None),
    });
    Ok(())
}

fn build_menu<R: Runtime>(
    app: &AppHandle<R>,
    entries: &[MenuEntry],
) -> tauri::Result<(Menu<R>, Vec<MenuItemKind<R>>)> {
    let menu = Menu::new(app)?;
    let mut items = Vec::with_capacity(entries.len());
    for e in entries {
        let item = match e.kind {
            EntryKind::Info => MenuItemKind::MenuItem(MenuItem::with_id(
                app,
                e.id.as_str(),
                &e.text,
                false,
                None::<&str>,
            )?),
            EntryKind::Action => MenuItemKind::MenuItem(MenuItem::with_id(
                app,
                e.id.as_str(),
                &e.text,
                true,
                None::<&str>,
            )?),
            EntryKind::Check(checked) => MenuItemKind::Check(CheckMenuItem::with_id(
                app,
                e.id.as_str(),
                &e.text,
                true,
                checked,
                None::<&str>,
            )?),
            EntryKind::Separator => MenuItemKind::Predefined(PredefinedMenuItem::separator(app)?),
        };
        menu.append(&item)?;
        items.push(item);
    }
    Ok((menu, items))
}

/// Starts over from the engine's list of calls (after (re)subscribing).
pub async fn reseed<R: Runtime>(app: &AppHandle<R>, engine: &EngineHandle) {
    let calls = engine.calls(CallsQuery::default()).await;
    if let Some(tray) = app.try_state::<Tray<R>>() {
        lock(&tray.model).reseed(&calls, Instant::now());
    }
}

/// Takes one engine event; redraws at the global cadence.
pub async fn on_event<R: Runtime>(app: &AppHandle<R>, event: &speedtap::model::EngineEvent) {
    let redraw = match app.try_state::<Tray<R>>() {
        Some(tray) => lock(&tray.model).apply(event, Instant::now()),
        None => false,
    };
    if redraw {
        refresh(app).await;
    }
}

/// Redraws whatever changed.
pub async fn refresh<R: Runtime>(app: &AppHandle<R>) {
    // While exiting, the main thread is busy shutting the engine down; a
    // redraw would park a runtime worker waiting for it.
    if crate::is_exiting(app) {
        return;
    }
    let Some(tray) = app.try_state::<Tray<R>>() else {
        return;
    };
    let engine = app.state::<Engine>();
    let paused = app.state::<Arc<Notifications>>().is_paused();
    let routes = engine.0.routes().await.routes;
    let doc = engine.0.servers().await;
    let slow_ttft_ms = engine.0.settings_snapshot().slow_ttft_ms;
    let mut view = {
        let mut model = lock(&tray.model);
        model.set_unloads_shown(!doc.loaded.is_empty());
        model.view(
            Instant::now(),
            &ViewInputs {
                paused,
                routes: &routes,
                slow_ttft_ms,
                servers: &doc.servers,
                loaded: &doc.loaded,
                now_unix_ms: unix_ms_now(),
            },
        )
    };
    let problem = add_app_entries(app, &mut view);
    let mut drawn = tray.drawn.lock().await;
    if let Err(e) = draw(app, &tray.icon, &mut drawn, view, problem) {
        tracing::warn!("tray not updated: {e}");
    }
}

/// The app's own entries (port conflicts, start at login); true when a
/// conflict is shown.
fn add_app_entries<R: Runtime>(app: &AppHandle<R>, view: &mut TrayView) -> bool {
    let conflicts = app
        .try_state::<Conflicts>()
        .map(|c| c.list())
        .unwrap_or_default();
    let autostart = app.try_state::<LoginItem>().map(|l| l.is_enabled());
    decorate(view, &conflicts, autostart);
    !conflicts.is_empty()
}

fn draw<R: Runtime>(
    app: &AppHandle<R>,
    icon_handle: &TrayIcon<R>,
    drawn: &mut Drawn<R>,
    view: TrayView,
    problem: bool,
) -> tauri::Result<()> {
    if view.title != drawn.view.title {
        icon_handle.set_title(Some(&view.title))?;
    }
    if view.state != drawn.view.state || problem != drawn.problem {
        icon_handle.set_icon(Some(icon(view.state, problem)))?;
        drawn.problem = problem;
    }
    if view.menu != drawn.view.menu {
        if view.same_menu_shape(&drawn.view) {
            for ((new, old), item) in view.menu.iter().zip(&drawn.view.menu).zip(&drawn.items) {
                if new == old {
                    continue;
                }
                match (&new.kind, item) {
                    (EntryKind::Check(checked), MenuItemKind::Check(i)) => {
                        i.set_text(&new.text)?;
                        i.set_checked(*checked)?;
                    }
                    (_, MenuItemKind::MenuItem(i)) => i.set_text(&new.text)?,
                    _ => {}
                }
            }
        } else {
            let (menu, items) = build_menu(app, &view.menu)?;
            icon_handle.set_menu(Some(menu))?;
            drawn.items = items;
        }
    }
    drawn.view = view;
    Ok(())
}

/// Runs on the main thread: never waits for a redraw (see module docs).
fn on_menu_event<R: Runtime>(app: &AppHandle<R>, event: MenuEvent) {
    match event.id.as_ref() {
        ID_OPEN => crate::show_window(app),
        ID_PAUSE => {
            let notifications = app.state::<Arc<Notifications>>();
            notifications.set_paused(!notifications.is_paused());
            let app = app.clone();
            tauri::async_runtime::spawn(async move { refresh(&app).await });
        }
        ID_AUTOSTART => {
            if let Some(item) = app.try_state::<LoginItem>() {
                if let Err(e) = item.set_enabled(!item.is_enabled()) {
                    tracing::warn!("start at login not changed: {e}");
                }
            }
            let app = app.clone();
            tauri::async_runtime::spawn(async move { refresh(&app).await });
        }
        ID_QUIT => app.exit(0),
        id => {
            if let Some(route) = id.strip_prefix(ID_COPY_PREFIX) {
                copy_proxy_url(app, route);
            }
        }
    }
}

fn copy_proxy_url<R: Runtime>(app: &AppHandle<R>, route: &str) {
    let engine = app.state::<Engine>();
    // Never the demo's: its proxy feeds its own simulator.
    let Some(bound) = engine
        .0
        .route_infos()
        .into_iter()
        .find(|r| r.name == route && !r.demo)
    else {
        return;
    };
    let Some(tray) = app.try_state::<Tray<R>>() else {
        return;
    };
    let mut clipboard = lock(&tray.clipboard);
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

/// The wall clock, unix ms (loaded models unload at a date).
fn unix_ms_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
