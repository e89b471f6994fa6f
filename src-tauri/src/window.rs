//! The dashboard window, created only when it is opened and destroyed when
//! it closes. A WebKit webview costs two helper processes (WebKit's web
//! and network processes) and most of the app's memory; the tray, the
//! notifications and the engine need none of it, and a tray app mostly
//! runs with its window closed. So nothing of WebKit exists until the user
//! opens the window ("Open speedtap" in the tray, a second launch, a start
//! without `--hidden`), and closing the window gives it all back.
//!
//! The page reloads its state from the engine when it opens (the same
//! `calls`/`stats_history` commands it calls at every start), so nothing
//! is lost by not keeping it alive.

use tauri::{AppHandle, Manager, Runtime, WebviewUrl, WebviewWindowBuilder};

use crate::window_state::{self, DEFAULT_SIZE, MIN_SIZE};
use crate::MAIN_WINDOW;

/// The window's title (the desktop tests find it by this name).
pub const TITLE: &str = "speedtap";

/// Shows, un-minimises and focuses the window, creating it first if it is
/// not open.
pub fn open<R: Runtime>(app: &AppHandle<R>) {
    if let Some(window) = app.get_webview_window(MAIN_WINDOW) {
        let _ = window.unminimize();
        let _ = window.show();
        let _ = window.set_focus();
        return;
    }
    let (width, height) = DEFAULT_SIZE;
    let mut builder =
        WebviewWindowBuilder::new(app, MAIN_WINDOW, WebviewUrl::App("index.html".into()))
            .title(TITLE)
            .inner_size(width, height)
            .min_inner_size(MIN_SIZE.0, MIN_SIZE.1);
    // Where the user left it, when that is remembered.
    if let Some(g) = window_state::load(&window_state::default_path()) {
        builder = builder.inner_size(g.width, g.height).position(g.x, g.y);
    }
    let built = builder.build();
    match built {
        Ok(window) => {
            let _ = window.set_focus();
        }
        Err(e) => tracing::warn!("cannot open the window: {e}"),
    }
}

/// After the window is gone: hands the freed heap back to the system.
/// glibc keeps freed memory in its arenas, so without this the app's
/// resident size stays near its size with the window open.
pub fn give_back_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        extern "C" {
            fn malloc_trim(pad: usize) -> i32;
        }
        // SAFETY: malloc_trim only releases free heap pages; it takes no
        // pointers and is safe to call from any thread at any time.
        unsafe {
            malloc_trim(0);
        }
    }
}
