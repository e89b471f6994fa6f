//! speedtap-window: the tray app's dashboard window, a process of its own.
//! One webview on the dashboard the tray app's control API serves at
//! `--window-of URL`, so the window and a browser show the very same page
//! with the same data (HTTP and the event stream). The tray process
//! (`speedtap-desktop`, which never loads GTK or WebKit) starts it when the
//! window is opened; closing the window ends it, and WebKit's processes and
//! memory with it. It also ends when the tray process is gone (its standard
//! input, a pipe the tray holds, ends: `--ends-with-stdin`).
//!
//! The page asks the few things the control API does not know (the tray
//! app's port conflicts, start at login) through one command, `app`, which
//! forwards the question to the tray process over its single-instance
//! socket (`speedtap_desktop::app_commands`). The page is served over
//! `http://127.0.0.1`, a remote origin to Tauri, so that command alone is
//! granted to it (`capabilities/default.json`).
//!
//! One window per tray app: the process claims a socket named after the
//! tray's; a second one finds it taken, asks the first to show itself and
//! exits 0.

// No console window on Windows release builds.
#![cfg_attr(not(debug_assertions), windows_subsystem = "windows")]

use std::path::{Path, PathBuf};

use clap::Parser;
use serde_json::Value;
use tauri::{Manager, Runtime, State, WebviewUrl, WebviewWindowBuilder, Window, WindowEvent};

use speedtap_desktop::instance::{self, Claim, Request};
use speedtap_desktop::window::{ENDS_WITH_STDIN_FLAG, MAIN_WINDOW, TITLE, WINDOW_FLAG};
use speedtap_desktop::window_state::{self, Geometry, DEFAULT_SIZE, MIN_SIZE};

/// speedtap's dashboard window (started by speedtap-desktop).
#[derive(Debug, Parser)]
#[command(name = "speedtap-window", version)]
struct WindowArgs {
    /// The dashboard to show: the tray app's control API.
    #[arg(long = WINDOW_FLAG.trim_start_matches("--"), value_name = "URL")]
    window_of: String,
    /// The tray app's config file (it names the tray's socket).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Exit when standard input ends (the tray process holds the other end).
    #[arg(long = ENDS_WITH_STDIN_FLAG.trim_start_matches("--"))]
    ends_with_stdin: bool,
}

fn main() {
    // Before anything starts a thread: these edit the environment.
    give_webkit_a_language();
    keep_gtk_off_opengl();
    speedtap_desktop::init_tracing();
    let args = WindowArgs::parse();
    let tray = instance::tray_socket(args.config.as_deref());
    let place = Place(window_state::path_beside(args.config.as_deref()));
    run(&args.window_of, tray, place, args.ends_with_stdin)
}

/// The tray process's single-instance socket name (managed).
struct TraySocket(String);

/// Where the window's size and position are remembered (managed).
struct Place(PathBuf);

/// The window process's own socket name, beside the tray's.
fn socket_name(tray: &str) -> String {
    format!("{tray}/window")
}

/// Runs the window process until its window closes (or, with
/// `ends_with_stdin`, until the tray process that started it is gone).
/// Exits the process.
fn run(url: &str, tray_socket: String, place: Place, ends_with_stdin: bool) -> ! {
    let url: tauri::Url = match url.parse() {
        Ok(url) => url,
        Err(e) => {
            eprintln!("speedtap-window: {WINDOW_FLAG} {url}: not a URL ({e})");
            std::process::exit(2)
        }
    };
    let listener = match instance::claim(&socket_name(&tray_socket), Request::Show) {
        Ok(Claim::Forwarded) => {
            eprintln!("speedtap-window: the window is already open; brought it up");
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
        .manage(place)
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
            let place = app.state::<Place>().0.clone();
            build_window(app.handle(), url, &place)?;
            Ok(())
        })
        .build(tauri::generate_context!());
    match app {
        // The default: the process exits once its last window has closed.
        Ok(app) => app.run(|_, _| {}),
        Err(e) => {
            eprintln!("speedtap-window: cannot open the window: {e}");
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

fn build_window(app: &tauri::AppHandle, url: tauri::Url, place: &Path) -> tauri::Result<()> {
    let (width, height) = DEFAULT_SIZE;
    let mut builder = WebviewWindowBuilder::new(app, MAIN_WINDOW, WebviewUrl::External(url))
        .title(TITLE)
        .inner_size(width, height)
        .min_inner_size(MIN_SIZE.0, MIN_SIZE.1);
    // Where the user left it, when that is remembered.
    if let Some(g) = window_state::load(place) {
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

/// `window`'s geometry now, when the platform reports it.
fn geometry_of<R: Runtime>(window: &Window<R>) -> Option<Geometry> {
    let scale = window.scale_factor().ok()?;
    let size = window.inner_size().ok()?.to_logical::<f64>(scale);
    let at = window.outer_position().ok()?.to_logical::<f64>(scale);
    Some(Geometry {
        width: size.width,
        height: size.height,
        x: at.x,
        y: at.y,
    })
}

fn remember_place(window: &tauri::Window) {
    let Some(place) = window.try_state::<Place>() else {
        return;
    };
    if let Some(geometry) = geometry_of(window) {
        let path = &place.0;
        if let Err(e) = window_state::save(path, geometry) {
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

/// WebKitGTK takes `navigator.language` from the process's `LC_CTYPE`
/// locale name: `C` and `POSIX` become `en-US`, but `C.UTF-8` (the default
/// of minimal systems, containers and root shells) becomes `C`, which is no
/// language tag: every `Intl` constructor given `navigator.language` then
/// throws, and the dashboard's chart library does that as it loads. So
/// under a `C.*` character-type locale, use plain `C` for `LC_CTYPE`
/// (inherited by WebKit's web process): the page gets `en-US`. Nothing of
/// ours depends on the C library's character type.
fn give_webkit_a_language() {
    let set = |var: &str| {
        std::env::var(var)
            .ok()
            .filter(|v| !v.is_empty())
            .map(|v| (var.to_owned(), v))
    };
    let Some((var, value)) = set("LC_ALL")
        .or_else(|| set("LC_CTYPE"))
        .or_else(|| set("LANG"))
    else {
        return;
    };
    if value.starts_with("C.") {
        // LC_ALL overrides every category, so that is the one to change
        // when it is what is set; otherwise LC_CTYPE alone.
        let target = if var == "LC_ALL" {
            "LC_ALL"
        } else {
            "LC_CTYPE"
        };
        std::env::set_var(target, "C");
    }
}

/// GTK 3 on X11 picks its GL visuals when it opens the display, which loads
/// the OpenGL driver (Mesa, and with it LLVM): measured with
/// `scripts/footprint` on a release build when the tray app still hosted
/// GTK itself, 30 MB of its 100 MB PSS were Mesa and LLVM, and WebKit's web
/// process held 217 MB instead of 116 MB with `GDK_GL=disable`. Nothing here draws with GTK's
/// GL (the page is HTML; WebKit renders it, checked by the window tests'
/// screenshots). A `GDK_GL` of the user's own, any value, is kept.
fn keep_gtk_off_opengl() {
    if std::env::var_os("GDK_GL").is_none() {
        std::env::set_var("GDK_GL", "disable");
    }
}
