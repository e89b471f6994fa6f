//! speedtap-desktop: the tray app. A thin host of the engine `speedtap run`
//! hosts, with the same config file and flags, plus a tray icon whose label
//! is the current tokens per second, desktop notifications for slow first
//! tokens, and the web dashboard in a window.
//!
//! # Data flow
//! - [`run`] parses the flags (`speedtap run`'s, via
//!   [`speedtap::host::args::RunArgs`], plus [`DesktopArgs::hidden`]),
//!   resolves the settings as `speedtap run` does (except that `capture`,
//!   when nothing says, follows whether the capture helper has its
//!   permission: off until it exists, then on), starts the
//!   engine on Tauri's tokio runtime, then hands it to [`build_app`].
//! - One task subscribes to the engine's events and fans each one out: to
//!   the window as a Tauri event ([`events`]), to the tray (`tray`, via
//!   [`tray_model`]), and to the notification policy ([`notify`]) for
//!   settled follow-ups. Slow-first-token alarms reach [`notify`] through
//!   the engine's own hook, which throttles them per route.
//! - The window is a process of its own ([`window`], [`window_app`]) that
//!   shows the dashboard the control API serves, and asks the tray process
//!   only about the app itself ([`app_commands`]).
//!
//! No metering happens here: every number comes from the engine.
//!
//! # Lifecycle
//! The tray process never makes a webview: the window process exists only
//! while the window is open, so the tray app idles without WebKit and
//! closing the window gives all of WebKit's memory back. The app lives on
//! in the tray until "Quit" (or SIGINT/SIGTERM),
//! which exits 0 after the engine's clean shutdown (in-flight calls get up
//! to 5 s, like `speedtap run`).
//!
//! One app runs per user and config file ([`instance`]): a second launch
//! shows the first one's window and exits 0. A port the app cannot have
//! does not stop it ([`ports`]): the tray and the window say which one
//! and who holds it, and the rest runs. Start at login is [`autostart`].

pub mod app_commands;
pub mod autostart;
pub mod instance;
pub mod notify;
pub mod ports;
pub mod sni;
mod tray;
pub mod tray_extras;
pub mod tray_model;
pub mod window;
pub mod window_app;
pub mod window_state;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Parser;
use speedtap::config::{self, Settings};
use speedtap::host::args::RunArgs;
use speedtap::host::settings::{
    engine_options, resolve_settings_capture_by_permission, watch_options, RunError, SHUTDOWN_GRACE,
};
use speedtap::host::{Engine, EngineError, EngineHandle, RunningEngine};
use speedtap::model::{EngineEvent, EngineQueries};
use tauri::{App, AppHandle, Builder, Manager, RunEvent, Runtime};

use autostart::LoginItem;
use notify::{DesktopSink, Notifications};
use ports::{Conflicts, PortConflict};

/// The window's label (`tauri.conf.json`).
pub const MAIN_WINDOW: &str = "main";

/// speedtap-desktop: live TTFT and tokens per second of every local LLM
/// call, in the tray.
///
/// Takes the same config file and options as `speedtap run`; the tray label
/// shows the current speed, the window the live calls.
#[derive(Debug, Parser)]
#[command(name = "speedtap-desktop", version)]
pub struct DesktopArgs {
    #[command(flatten)]
    pub run: RunArgs,
    /// Start in the tray only, without opening the window.
    #[arg(long)]
    pub hidden: bool,
    /// Internal: be the window process, showing the dashboard at URL (the
    /// tray process starts it so; see `window`).
    #[arg(long = "window-of", value_name = "URL", hide = true)]
    pub window_of: Option<String>,
    /// Internal, with `--window-of`: exit when standard input ends (the
    /// tray process holds the other end).
    #[arg(long, hide = true, requires = "window_of")]
    pub ends_with_stdin: bool,
}

/// What [`build_app`] hosts.
pub struct Host {
    pub engine: RunningEngine,
    pub notifications: Arc<Notifications>,
    /// Open the window at start (`--hidden` turns it off).
    pub show_window: bool,
    /// `--json`: one JSON line per published call snapshot on stdout, as
    /// `speedtap run --json` prints.
    pub json: bool,
    /// The config file the window process is told (it names the tray's
    /// single-instance socket).
    pub config: PathBuf,
}

/// The running engine, taken out for the clean shutdown at exit.
struct Running(Mutex<Option<RunningEngine>>);

impl Running {
    fn take(&self) -> Option<RunningEngine> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    fn is_stopping(&self) -> bool {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).is_none()
    }
}

/// True once the app is exiting (the engine has been taken out for its
/// shutdown). Background work that needs the main thread (tray redraws)
/// stops then: the main thread is busy waiting for the engine to drain.
pub(crate) fn is_exiting<R: Runtime>(app: &AppHandle<R>) -> bool {
    app.try_state::<Running>()
        .is_none_or(|running| running.is_stopping())
}

/// The whole app: flags, engine, window, tray. Exits the process.
pub fn run() {
    // Before anything starts a thread: this edits the environment.
    give_webkit_a_language();
    keep_gtk_off_opengl();
    init_tracing();
    let args = DesktopArgs::parse();
    if let Err(message) = check_display() {
        eprintln!("speedtap-desktop: {message}");
        std::process::exit(1);
    }
    if let Some(url) = &args.window_of {
        window_app::run(
            url,
            instance_socket(&config_file(&args)),
            args.ends_with_stdin,
        );
    }
    let settings =
        resolve_settings_capture_by_permission(&args.run).unwrap_or_else(|e| exit_with(e));
    // Before the engine binds anything: a second launch only knocks.
    let first = claim_instance(&args);
    let notifications = Notifications::new(DesktopSink);
    let (engine, conflicts) =
        tauri::async_runtime::block_on(start_engine(&args.run, settings.clone(), &notifications))
            .unwrap_or_else(|e| exit_with(e));
    for line in engine.summary() {
        eprintln!("speedtap-desktop: {line}");
    }
    for conflict in &conflicts {
        eprintln!("speedtap-desktop: warning: {}", conflict.sentence());
    }
    notify_conflicts(&conflicts);
    // No tokenizer warm-up here: its tables are tens of megabytes, and a
    // tray app mostly idles; the engine builds them when a call needs them.
    let host = Host {
        engine,
        notifications,
        show_window: !args.hidden,
        json: settings.json,
        config: config_file(&args),
    };
    let extra = args
        .run
        .config
        .as_ref()
        .map(|c| std::fs::canonicalize(c).unwrap_or_else(|_| c.clone()))
        .map(|c| vec!["--config".to_owned(), c.to_string_lossy().into_owned()])
        .unwrap_or_default();
    let mut builder = Builder::default().manage(Conflicts::new(conflicts));
    if let Some(item) = LoginItem::from_env(&extra) {
        builder = builder.manage(item);
    }
    if let Some(listener) = first {
        builder = builder.manage(InstanceListener(Mutex::new(Some(listener))));
    }
    let app = build_app(builder, host).unwrap_or_else(|e| {
        eprintln!("speedtap-desktop: cannot start the window: {e}");
        std::process::exit(1)
    });
    app.run(on_run_event);
}

/// The single-instance socket, served once the app runs (managed).
struct InstanceListener(Mutex<Option<std::os::unix::net::UnixListener>>);

impl InstanceListener {
    fn take(&self) -> Option<std::os::unix::net::UnixListener> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

/// The config file this app runs with (the default one when none is
/// named), its path made absolute: it names the single-instance socket.
fn config_file(args: &DesktopArgs) -> PathBuf {
    let config = args
        .run
        .config
        .clone()
        .unwrap_or_else(config::default_config_path);
    std::fs::canonicalize(&config).unwrap_or(config)
}

/// The tray process's single-instance socket name for `config`.
fn instance_socket(config: &std::path::Path) -> String {
    use std::os::unix::fs::MetadataExt;
    let uid = std::fs::metadata("/proc/self")
        .map(|m| m.uid())
        .unwrap_or(0);
    instance::name(uid, config)
}

/// Becomes the one instance for this user and config file, or hands the
/// request to the running one and exits 0. Should the socket fail (no
/// abstract namespace...), runs anyway: better two copies than none.
fn claim_instance(args: &DesktopArgs) -> Option<std::os::unix::net::UnixListener> {
    let config = config_file(args);
    let request = if args.hidden {
        instance::Request::Nothing
    } else {
        instance::Request::Show
    };
    match instance::claim(&instance_socket(&config), request) {
        Ok(instance::Claim::First(listener)) => Some(listener),
        Ok(instance::Claim::Forwarded) => {
            eprintln!(
                "speedtap-desktop: already running (for {}); showed its window",
                config.display()
            );
            std::process::exit(0)
        }
        Err(e) => {
            eprintln!("speedtap-desktop: warning: cannot check for a running copy: {e}");
            None
        }
    }
}

/// One desktop notification naming the ports the app could not have: it
/// may have been started at login, where nobody sees its terminal.
fn notify_conflicts(conflicts: &[PortConflict]) {
    if conflicts.is_empty() {
        return;
    }
    let body = conflicts
        .iter()
        .map(PortConflict::sentence)
        .collect::<Vec<_>>()
        .join("\n");
    // Off the start-up path: a missing notification daemon must not hold it up.
    std::thread::spawn(move || {
        let shown = notify_rust::Notification::new()
            .appname("speedtap")
            .summary("speedtap: a port is taken")
            .body(&body)
            .show();
        if let Err(e) = shown {
            tracing::warn!("notification not shown: {e}");
        }
    });
}

fn exit_with(e: RunError) -> ! {
    eprintln!("speedtap-desktop: {e}");
    std::process::exit(e.exit_code())
}

fn init_tracing() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
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
/// the OpenGL driver (Mesa, and with it LLVM) into a tray app that may never
/// show a window: measured with `scripts/footprint` on a release build, the
/// app alone held 100 MB PSS with its window never opened, 30 MB of it Mesa
/// and LLVM; with `GDK_GL=disable` 69 MB, and WebKit's web process 116 MB
/// instead of 217 MB while the window is open. Nothing here draws with GTK's
/// GL (the page is HTML; WebKit renders it, checked by the window tests'
/// screenshots). A `GDK_GL` of the user's own, any value, is kept.
fn keep_gtk_off_opengl() {
    if std::env::var_os("GDK_GL").is_none() {
        std::env::set_var("GDK_GL", "disable");
    }
}

/// A desktop session is needed; without one GTK would abort with a less
/// helpful message. `speedtap run` is the headless host.
fn check_display() -> Result<(), String> {
    if cfg!(target_os = "linux")
        && std::env::var_os("DISPLAY").is_none()
        && std::env::var_os("WAYLAND_DISPLAY").is_none()
    {
        return Err("no display (neither DISPLAY nor WAYLAND_DISPLAY is set); \
                    use `speedtap run` to run headless"
            .into());
    }
    Ok(())
}

/// How many listeners may fail before the app gives up on starting.
const MAX_CONFLICTS: usize = 64;

/// Starts the engine as `speedtap run` does, with the tray's notification
/// hook, following the machine when no route is configured (servers are
/// measured as they start; the window's first-run view lists them as they
/// appear and can start demo traffic). Unlike `speedtap run`, a port that
/// cannot be bound is not an error: the engine starts
/// without that listener (a route, or the control API), and the conflict
/// is returned for the tray and the window to show ([`ports`]).
pub async fn start_engine(
    args: &RunArgs,
    settings: Settings,
    notifications: &Arc<Notifications>,
) -> Result<(RunningEngine, Vec<PortConflict>), RunError> {
    let mut conflicts: Vec<PortConflict> = Vec::new();
    loop {
        // The same options `speedtap run` builds, store included (built
        // again after a failed bind: starting consumes them).
        let mut options = engine_options(args, &settings)?;
        options.routes.retain(|r| {
            !conflicts
                .iter()
                .any(|c| c.route.as_deref() == Some(r.name.as_str()))
        });
        if conflicts.iter().any(|c| c.route.is_none()) {
            // The window reads the control API: without its own port it
            // gets one the system picks, on loopback only.
            options.api = Some(std::net::SocketAddr::from(([127, 0, 0, 1], 0)));
        }
        options.slow_first_token_hooks.push(notifications.hook());
        options.watch = watch_options(
            &settings,
            Arc::new(|line: &str| eprintln!("speedtap-desktop: {line}")),
        );
        match Engine::start(options).await {
            Ok(engine) => {
                notifications.attach(engine.handle.clone());
                return Ok((engine, conflicts));
            }
            Err(EngineError::Bind { what, addr, source }) if conflicts.len() < MAX_CONFLICTS => {
                let spec = settings
                    .routes
                    .iter()
                    .find(|r| r.listen == addr && what == format!("route {}", r.name))
                    .cloned();
                conflicts.push(PortConflict::find(&what, addr, &source, spec));
            }
            Err(e) => return Err(RunError::Runtime(e.to_string())),
        }
    }
}

/// The generated context (`tauri.conf.json`, the capabilities), for the
/// tray process and the window process alike.
pub(crate) fn context<R: Runtime>() -> tauri::Context<R> {
    tauri::generate_context!()
}

/// What opening the window needs (managed): the engine, for the control
/// API's address, and the config file the window process is told.
struct WindowOpener {
    engine: EngineHandle,
    config: PathBuf,
}

/// Builds the app around a running engine: state, tray, event loop, the
/// single-instance socket. No webview is ever made here ([`window`]).
/// Generic over the runtime so the unit tests can use
/// `tauri::test::mock_builder()`.
pub fn build_app<R: Runtime>(builder: Builder<R>, host: Host) -> tauri::Result<App<R>> {
    let Host {
        engine,
        notifications,
        show_window: show,
        json,
        config,
    } = host;
    let handle = engine.handle.clone();
    builder
        .manage(WindowOpener {
            engine: handle.clone(),
            config,
        })
        .manage(Running(Mutex::new(Some(engine))))
        .manage(notifications.clone())
        .setup(move |app| {
            let listener = app.try_state::<InstanceListener>().and_then(|l| l.take());
            if let Some(listener) = listener {
                let later = app.handle().clone();
                let engine = handle.clone();
                instance::serve(listener, move |request| match request {
                    instance::Request::Show => {
                        show_window(&later);
                        "ok".to_owned()
                    }
                    instance::Request::Nothing => "ok".to_owned(),
                    instance::Request::App(line) => app_commands::answer(&later, &engine, &line),
                });
            }
            #[cfg(all(desktop, not(test)))]
            tray::create(app.handle(), &handle)?;
            start_following_events(app.handle(), handle, notifications, json);
            // SIGINT/SIGTERM stop the app as Quit does (clean engine
            // shutdown, exit 0). Not in unit tests: they share a process.
            #[cfg(not(test))]
            {
                let exit_on_signal = app.handle().clone();
                tauri::async_runtime::spawn(async move {
                    wait_for_signal().await;
                    exit_on_signal.exit(0);
                });
            }
            if show {
                show_window(app.handle());
            }
            Ok(())
        })
        .build(context())
}

/// Shows the window: starts the window process, or brings up the one open
/// ([`window::open`]).
pub fn show_window<R: Runtime>(app: &AppHandle<R>) {
    if let Some(opener) = app.try_state::<WindowOpener>() {
        window::open(opener.engine.api_addr(), &opener.config);
    }
}

/// The app's event-loop callback.
pub fn on_run_event<R: Runtime>(app: &AppHandle<R>, event: RunEvent) {
    match event {
        // Keep the event loop running even if all windows are closed: the
        // tray stays. An explicit exit (Quit, a signal) carries a code.
        RunEvent::ExitRequested {
            api, code: None, ..
        } => api.prevent_exit(),
        RunEvent::Exit => {
            if let Some(engine) = app.state::<Running>().take() {
                tauri::async_runtime::block_on(engine.shutdown(SHUTDOWN_GRACE));
            }
        }
        _ => {}
    }
}

/// Starts the task that fans the engine's events out to the window, the
/// tray and the notification policy. Called from the app's setup (which
/// Tauri runs when the event loop starts; the unit tests, which never start
/// it, call this directly).
pub fn start_following_events<R: Runtime>(
    app: &AppHandle<R>,
    engine: EngineHandle,
    notifications: Arc<Notifications>,
    json: bool,
) {
    tauri::async_runtime::spawn(follow_events(app.clone(), engine, notifications, json));
}

/// Subscribes to the engine and fans every event out (see the crate docs).
/// The engine drops a subscriber that falls behind; then this subscribes
/// again and re-reads the calls in flight, until the app is exiting.
async fn follow_events<R: Runtime>(
    app: AppHandle<R>,
    engine: EngineHandle,
    notifications: Arc<Notifications>,
    json: bool,
) {
    loop {
        let mut rx = engine.subscribe().await;
        #[cfg(all(desktop, not(test)))]
        tray::reseed(&app, &engine).await;
        while let Some(event) = rx.recv().await {
            match &event {
                EngineEvent::Settled(call) => {
                    notifications.on_settled(call);
                    notifications.on_slowdown(call, tokio::time::Instant::now());
                }
                EngineEvent::PromptTruncated(cut) => notifications.on_prompt_truncated(
                    &cut.call.route,
                    cut.call.model.as_deref(),
                    cut.message(),
                ),
                EngineEvent::Servers(doc) => notifications.on_servers(doc),
                EngineEvent::Speed {
                    call,
                    speed,
                    seen_by,
                } if json => {
                    println!("{}", speedtap::model::json_line(call, speed, *seen_by));
                }
                _ => {}
            }
            #[cfg(all(desktop, not(test)))]
            tray::on_event(&app, &event).await;
        }
        if is_exiting(&app) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[cfg_attr(test, allow(dead_code))]
async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

#[cfg(test)]
mod tests;
