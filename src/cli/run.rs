//! `speedtap run`: resolve the settings, start the engine, show what it
//! measures, stop cleanly on SIGINT/SIGTERM.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use tokio::time::Instant;

use crate::host::args::RunArgs;
use crate::host::settings::{
    engine_options, resolve_settings, watch_options, RunError, SHUTDOWN_GRACE,
};
use crate::host::Engine;
use crate::meter::slowdown_notice::SlowdownNotices;
use crate::model::{json_line, EngineEvent, EngineQueries};

use super::view::TerminalView;

/// Runs until SIGINT/SIGTERM. Returns the process exit code.
pub async fn run(args: RunArgs) -> Result<(), RunError> {
    let settings = resolve_settings(&args)?;
    let mut options = engine_options(&args, &settings)?;
    // With no route configured, speedtap follows the machine (and runs as
    // a service, waiting for servers to start).
    options.watch = watch_options(
        &settings,
        std::sync::Arc::new(|line: &str| eprintln!("speedtap: {line}")),
    );
    // Listen for the stop signals before anything is announced: a script
    // or service manager may stop speedtap as soon as it prints its start
    // lines, and a signal without a handler kills the process undrained.
    let stop = stop_signal();
    let engine = Engine::start(options)
        .await
        .map_err(|e| RunError::Runtime(e.to_string()))?;
    // Subscribe before announcing too, so a call made as soon as the start
    // lines appear still gets every one of its lines.
    let json = settings.json || !std::io::stdout().is_terminal();
    let events = engine.handle.subscribe().await;
    let printer = tokio::spawn(print_events(events, json));
    for line in engine.summary() {
        eprintln!("speedtap: {line}");
    }
    // The tokenizer's tables are built when the first metered call starts
    // (`TokenEstimator::prepare`), not here: an idle speedtap stays small.

    stop.await;
    eprintln!("speedtap: stopping (in-flight calls get up to 5 s to finish)...");
    engine.shutdown(SHUTDOWN_GRACE).await;
    let _ = tokio::time::timeout(Duration::from_secs(1), printer).await;
    Ok(())
}

/// Writes every event: JSON lines, or the live terminal view on a TTY.
/// Slow-first-token warnings go to stderr either way, and so does a
/// settled call's slowdown with a named cause, once per route, model and
/// cause per hour.
async fn print_events(mut events: tokio::sync::mpsc::Receiver<EngineEvent>, json: bool) {
    let mut stdout = std::io::stdout();
    let mut slowdowns = SlowdownNotices::new();
    if json {
        // Lines for every event already queued go out in one write: with
        // many streams, a write (and a flush) per line was a measurable
        // share of the proxy's CPU (docs/benchmarks.md, profile).
        let mut batch = String::new();
        while let Some(event) = events.recv().await {
            let mut next = Some(event);
            while let Some(event) = next.take() {
                match &event {
                    EngineEvent::Speed {
                        call,
                        speed,
                        seen_by,
                    } => {
                        batch.push_str(&json_line(call, speed, *seen_by));
                        batch.push('\n');
                    }
                    EngineEvent::SlowFirstToken(slow) => {
                        eprintln!("{}", TerminalView::warning_line(slow));
                    }
                    EngineEvent::PromptTruncated(cut) => {
                        eprintln!("warning: {}", cut.message());
                    }
                    EngineEvent::Settled(call) => {
                        if let Some(line) = slowdowns.line(call, Instant::now()) {
                            eprintln!("{line}");
                        }
                    }
                    EngineEvent::Servers(doc) => slowdowns.know_servers(doc),
                    _ => {}
                }
                if batch.len() < 64 * 1024 {
                    next = events.try_recv().ok();
                }
            }
            if !batch.is_empty() {
                let _ = stdout.write_all(batch.as_bytes());
                let _ = stdout.flush();
                batch.clear();
            }
        }
        return;
    }
    let width = terminal_width();
    let mut view = TerminalView::new(width);
    let mut redraw = tokio::time::interval(Duration::from_millis(250));
    redraw.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            event = events.recv() => {
                let Some(event) = event else { break };
                match &event {
                    EngineEvent::Settled(call) => {
                        if let Some(line) = slowdowns.line(call, Instant::now()) {
                            view.warn(&line);
                        }
                    }
                    EngineEvent::Servers(doc) => slowdowns.know_servers(doc),
                    _ => {}
                }
                // The view prints slow-first-token warnings above its live
                // block itself.
                view.apply(&event);
            }
            // Only ticks while there is something to draw: an idle speedtap
            // sleeps until the next event (every 10 s, the idle stats).
            _ = redraw.tick(), if view.is_dirty() => {
                if let Some(text) = view.render(Instant::now()) {
                    let _ = stdout.write_all(text.as_bytes());
                    let _ = stdout.flush();
                }
            }
        }
    }
    // Calls that settled in the last moments still get their line.
    if let Some(text) = view.flush() {
        let _ = stdout.write_all(text.as_bytes());
        let _ = stdout.flush();
    }
}

/// The terminal's width: asked of the terminal, else `COLUMNS`, else 100.
fn terminal_width() -> usize {
    terminal_size::terminal_size()
        .map(|(w, _)| w.0 as usize)
        .or_else(|| std::env::var("COLUMNS").ok().and_then(|c| c.parse().ok()))
        .unwrap_or(100)
}

/// Resolves on the first SIGINT or SIGTERM (ctrl-c elsewhere).
///
/// On Unix the handlers are installed when this is *called*, not when the
/// future is first polled (which is how `tokio::signal::ctrl_c` behaves), so
/// calling it before the start lines are printed closes the window in which
/// a stop signal would still get the default action.
pub fn stop_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let interrupt = signal(SignalKind::interrupt());
        let terminate = signal(SignalKind::terminate());
        async move {
            // A listener that failed to install never fires; the other one
            // still does.
            let wait = |s: std::io::Result<tokio::signal::unix::Signal>| async move {
                match s {
                    Ok(mut s) => {
                        s.recv().await;
                    }
                    Err(_) => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                _ = wait(interrupt) => {}
                _ = wait(terminate) => {}
            }
        }
    }
    #[cfg(not(unix))]
    {
        async {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
