//! speedtap-desktop: the tray app. A thin host of the engine `speedtap run`
//! hosts, with the same config file and flags, plus a tray icon whose label
//! is the current tokens per second, desktop notifications for slow first
//! tokens, and the dashboard in a window.
//!
//! # Two processes
//! This process, the tray process, holds the engine, the tray, the
//! notifications and the capture, and never loads GTK or WebKit: the tray
//! is a StatusNotifierItem spoken straight over D-Bus ([`sni`], [`tray`]).
//! The window is a process of its own, `speedtap-window`, started when the
//! window is opened ([`window`]) and ended when it closes, which takes all
//! of WebKit's memory with it. It shows the dashboard the control API
//! serves, and asks this process only about the app itself
//! ([`app_commands`], over the single-instance socket, [`instance`]).
//!
//! # Data flow
//! - [`run`] parses the flags (`speedtap run`'s, via
//!   [`speedtap::host::args::RunArgs`], plus [`DesktopArgs::hidden`]),
//!   resolves the settings as `speedtap run` does (except that `capture`,
//!   when nothing says, follows whether the capture helper has its
//!   permission: off until it exists, then on), and starts the engine.
//! - One task subscribes to the engine's events and fans each one out: to
//!   the tray (via [`tray_model`]) and to the notification policy
//!   ([`notify`]) for settled follow-ups. Slow-first-token alarms reach
//!   [`notify`] through the engine's own hook, which throttles them per
//!   route.
//!
//! No metering happens here: every number comes from the engine.
//!
//! # Lifecycle
//! The app lives in the tray until "Quit" (or SIGINT/SIGTERM), which exits
//! 0 after the engine's clean shutdown (in-flight calls get up to 5 s, like
//! `speedtap run`); the window process ends with it.
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
pub mod tray;
pub mod tray_extras;
pub mod tray_model;
pub mod window;
pub mod window_state;

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use clap::Parser;
use speedtap::config::{self, Settings};
use speedtap::host::args::RunArgs;
use speedtap::host::settings::{
    engine_options, resolve_settings_capture_by_permission, watch_options, RunError, SHUTDOWN_GRACE,
};
use speedtap::host::{Engine, EngineError, EngineHandle, RunningEngine};
use speedtap::model::{EngineEvent, EngineQueries};

use autostart::LoginItem;
use notify::{DesktopSink, Notifications};
use ports::{Conflicts, PortConflict};

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
}

/// What the tray process's tasks share: the engine and the app's own
/// state. The tray, once exported, is set in [`App::tray`].
pub struct App {
    pub engine: EngineHandle,
    pub notifications: Arc<Notifications>,
    /// The ports the app could not have.
    pub conflicts: Conflicts,
    /// Start at login, where there is a home to write it in.
    pub login: Option<LoginItem>,
    /// The config file the window process is told (it names the tray's
    /// single-instance socket).
    pub config: PathBuf,
    /// `--json`: one JSON line per published call snapshot on stdout, as
    /// `speedtap run --json` prints.
    pub json: bool,
    /// The tray icon, when a session bus took it.
    pub tray: OnceLock<Arc<tray::TrayIcon>>,
    /// Notified by "Quit".
    pub quit: tokio::sync::Notify,
    /// The app's runtime, for work started where none is current (the
    /// tray's clicks arrive on zbus's own thread).
    pub runtime: tokio::runtime::Handle,
}

impl App {
    /// Shows the window: starts the window process, or brings up the one
    /// open ([`window::open`]).
    pub fn show_window(&self) {
        window::open(self.engine.api_addr(), &self.config);
    }

    /// Redraws the tray, if there is one (after the app's own state
    /// changed: a port conflict resolved, start at login switched).
    pub async fn refresh_tray(self: &Arc<Self>) {
        if let Some(tray) = self.tray.get() {
            tray.refresh(self).await;
        }
    }
}

/// The whole app: flags, engine, tray, window. Exits the process.
pub fn run() {
    init_tracing();
    let args = DesktopArgs::parse();
    if let Err(message) = check_display() {
        eprintln!("speedtap-desktop: {message}");
        std::process::exit(1);
    }
    let settings =
        resolve_settings_capture_by_permission(&args.run).unwrap_or_else(|e| exit_with(e));
    // Before the engine binds anything: a second launch only knocks.
    let first = claim_instance(&args);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| {
            eprintln!("speedtap-desktop: cannot start: {e}");
            std::process::exit(1)
        });
    let code = runtime.block_on(serve(args, settings, first));
    std::process::exit(code)
}

/// Runs the app until Quit or a signal; answers the exit code.
async fn serve(
    args: DesktopArgs,
    settings: Settings,
    first: Option<std::os::unix::net::UnixListener>,
) -> i32 {
    let notifications = Notifications::new(DesktopSink::on_current_runtime());
    let (engine, conflicts) = match start_engine(&args.run, settings.clone(), &notifications).await
    {
        Ok(started) => started,
        Err(e) => exit_with(e),
    };
    for line in engine.summary() {
        eprintln!("speedtap-desktop: {line}");
    }
    for conflict in &conflicts {
        eprintln!("speedtap-desktop: warning: {}", conflict.sentence());
    }
    notify_conflicts(&conflicts);
    // No tokenizer warm-up here: its tables are tens of megabytes, and a
    // tray app mostly idles; the engine builds them when a call needs them.
    let config = config_file(&args);
    let app = Arc::new(App {
        engine: engine.handle.clone(),
        notifications,
        conflicts: Conflicts::new(conflicts),
        login: LoginItem::from_env(&["--config".to_owned(), config.display().to_string()]),
        config,
        json: settings.json,
        tray: OnceLock::new(),
        quit: tokio::sync::Notify::new(),
        runtime: tokio::runtime::Handle::current(),
    });
    if let Some(listener) = first {
        serve_later_launches(listener, &app);
    }
    match tray::TrayIcon::start(&app).await {
        Ok(tray) => {
            let _ = app.tray.set(tray);
        }
        Err(e) => eprintln!("speedtap-desktop: warning: no tray icon (no session bus?): {e}"),
    }
    tokio::spawn(follow_events(Arc::clone(&app)));
    if !args.hidden {
        app.show_window();
    }
    tokio::select! {
        _ = wait_for_signal() => {}
        _ = app.quit.notified() => {}
    }
    engine.shutdown(SHUTDOWN_GRACE).await;
    0
}

/// Answers later launches (show the window) and the window process's
/// questions on the single-instance socket's thread.
fn serve_later_launches(listener: std::os::unix::net::UnixListener, app: &Arc<App>) {
    let app = Arc::clone(app);
    let runtime = app.runtime.clone();
    instance::serve(listener, move |request| match request {
        instance::Request::Show => {
            app.show_window();
            "ok".to_owned()
        }
        instance::Request::Nothing => "ok".to_owned(),
        instance::Request::App(line) => runtime.block_on(app_commands::answer(&app, &line)),
    });
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
    match instance::claim(&instance::tray_socket(Some(&config)), request) {
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
    DesktopSink::on_current_runtime().send("speedtap: a port is taken".into(), body);
}

fn exit_with(e: RunError) -> ! {
    eprintln!("speedtap-desktop: {e}");
    std::process::exit(e.exit_code())
}

/// Warnings and above to stderr, or what `RUST_LOG` asks (the window
/// process too).
pub fn init_tracing() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
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

/// Subscribes to the engine and fans every event out (see the crate docs).
/// The engine drops a subscriber that falls behind; then this subscribes
/// again and re-reads the calls in flight.
pub async fn follow_events(app: Arc<App>) {
    loop {
        let mut rx = app.engine.subscribe().await;
        if let Some(tray) = app.tray.get() {
            tray.reseed(&app.engine).await;
        }
        while let Some(event) = rx.recv().await {
            fan_out(&app, &event);
            if let Some(tray) = app.tray.get() {
                tray.on_event(&app, &event).await;
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// One event to the notification policy and, with `--json`, stdout.
fn fan_out(app: &App, event: &EngineEvent) {
    let notifications = &app.notifications;
    match event {
        EngineEvent::Settled(call) => {
            notifications.on_settled(call);
            notifications.on_slowdown(call, tokio::time::Instant::now());
            notifications.on_failed(call, tokio::time::Instant::now());
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
        } if app.json => {
            println!("{}", speedtap::model::json_line(call, speed, *seen_by));
        }
        _ => {}
    }
}

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
