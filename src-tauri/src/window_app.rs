//! The window process (`speedtap-desktop --window-of URL`): one webview on
//! the dashboard the tray app's control API serves at `URL`, so the window
//! and a browser show the very same page with the same data (HTTP and the
//! event stream). The tray process starts it ([`crate::window`]); closing
//! the window ends it, and WebKit's processes and memory with it.
//!
//! The page asks the few things the control API does not know (the tray
//! app's port conflicts, start at login) through one command, `app`, which
//! forwards the question to the tray process ([`crate::app_commands`]).
//! The page is served over `http://127.0.0.1`, a remote origin to Tauri, so
//! that command alone is granted to it (`capabilities/default.json`).
//!
//! One window per tray app: the process claims a socket named after the
//! tray's; a second one finds it taken, asks the first to show itself and
//! exits 0.

use serde_json::Value;
use tauri::{Manager, State, WebviewUrl, WebviewWindowBuilder, WindowEvent};

use crate::instance::{self, Claim, Request};
use crate::window::TITLE;
use crate::window_state::{self, DEFAULT_SIZE, MIN_SIZE};
use crate::MAIN_WINDOW;

/// The tray process's single-instance socket name (managed).
struct TraySocket(String);

/// The window process's own socket name, beside the tray's.
pub fn socket_name(tray: &str) -> String {
    format!("{tray}/window")
}

/// Runs the window process until its window closes (or, with
/// `ends_with_stdin`, until the tray process that started it is gone).
/// Exits the process.
pub fn run(url: &str, tray_socket: String, ends_with_stdin: bool) -> ! {
    let url: tauri::Url = match url.parse() {
        Ok(url) => url,
        Err(e) => {
            eprintln!(
                "speedtap-desktop: {} {url}: not a URL ({e})",
                crate::window::WINDOW_FLAG
            );
            std::process::exit(2)
        }
    };
    let listener = match instance::claim(&socket_name(&tray_socket), Request::Show) {
        Ok(Claim::Forwarded) => {
            eprintln!("speedtap-desktop: the window is already open; brought it up");
            std::process::exit(0)
        }
        Ok(Claim::First(listener)) => Some(listener),
        Err(e) => {
            tracing::warn!("cannot check for an open window: {e}");
            None
        }
    };
    if ends_with_stdin {
        exit_when_stdin_ends();
    }
    let app = tauri::Builder::default()
        .manage(TraySocket(tray_socket))
        .invoke_handler(tauri::generate_handler![app])
        .on_window_event(|window, event| {
            // Where the window is as it closes is where it opens next.
            if let WindowEvent::CloseRequested { .. } = event {
                remember_place(window);
            }
        })
        .setup(move |app| {
            if let Some(listener) = listener {
                let later = app.handle().clone();
                instance::serve(listener, move |request| {
                    if request == Request::Show {
                        let app = later.clone();
                        let _ = later.run_on_main_thread(move || focus(&app));
                    }
                    "ok".to_owned()
                });
            }
            build_window(app.handle(), url)?;
            Ok(())
        })
        .build(crate::context());
    match app {
        // The default: the process exits once its last window has closed.
        Ok(app) => app.run(|_, _| {}),
        Err(e) => {
            eprintln!("speedtap-desktop: cannot open the window: {e}");
            std::process::exit(1)
        }
    }
    std::process::exit(0)
}

/// Exits once standard input reaches its end: the tray process, its only
/// writer, is gone. A thread blocked in `read`: no wake-ups meanwhile.
fn exit_when_stdin_ends() {
    let watching = std::thread::Builder::new()
        .name("tray-watch".into())
        .spawn(|| {
            let mut buf = [0u8; 64];
            let mut stdin = std::io::stdin().lock();
            while matches!(std::io::Read::read(&mut stdin, &mut buf), Ok(n) if n > 0) {}
            std::process::exit(0);
        });
    if let Err(e) = watching {
        tracing::warn!("the window will not close with the tray app: {e}");
    }
}

fn build_window(app: &tauri::AppHandle, url: tauri::Url) -> tauri::Result<()> {
    let (width, height) = DEFAULT_SIZE;
    let mut builder = WebviewWindowBuilder::new(app, MAIN_WINDOW, WebviewUrl::External(url))
        .title(TITLE)
        .inner_size(width, height)
        .min_inner_size(MIN_SIZE.0, MIN_SIZE.1);
    // Where the user left it, when that is remembered.
    if let Some(g) = window_state::load(&window_state::default_path()) {
        builder = builder.inner_size(g.width, g.height).position(g.x, g.y);
    }
    let window = builder.build()?;
    let _ = window.set_focus();
    Ok(())
}

/// Brings the open window up for a second opening.
fn focus(app: &tauri::AppHandle) {
    if let Some(window) = app.get_webview_window(MAIN_WINDOW) {
        let _ = window.unminimize();
        let _ = window.show();
        let _ = window.set_focus();
    }
}

fn remember_place(window: &tauri::Window) {
    if let Some(geometry) = window_state::Geometry::of(window) {
        let path = window_state::default_path();
        if let Err(e) = window_state::save(&path, geometry) {
            tracing::warn!(
                "cannot remember the window's place in {}: {e}",
                path.display()
            );
        }
    }
}

/// `app(command, args)`: the page's question about the tray app, answered
/// by the tray process. Rejects with a sentence when it cannot be asked.
#[tauri::command]
async fn app(
    tray: State<'_, TraySocket>,
    command: String,
    args: Option<Value>,
) -> Result<Value, String> {
    let mut question = match args {
        Some(Value::Object(map)) => map,
        _ => serde_json::Map::new(),
    };
    question.insert("command".into(), Value::String(command));
    let line = Value::Object(question).to_string();
    let name = tray.0.clone();
    let answer =
        tauri::async_runtime::spawn_blocking(move || instance::ask(&name, &Request::App(line)))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("the tray app did not answer: {e}"))?;
    let mut reply: Value =
        serde_json::from_str(&answer).map_err(|e| format!("the tray app's answer: {e}"))?;
    match reply.get("error").and_then(Value::as_str) {
        Some(error) => Err(error.to_owned()),
        None => Ok(reply.get_mut("ok").map(Value::take).unwrap_or(Value::Null)),
    }
}
