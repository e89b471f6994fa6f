//! What the rest of the engine may ask the watcher: apart from the
//! watcher itself, so the engine's shared state can hold its inbox.

/// What the rest of the engine may ask the watcher.
pub(crate) enum WatchCommand {
    /// Never measure the server `name` again; the answer says whether
    /// there was one.
    Ignore {
        name: String,
        reply: tokio::sync::oneshot::Sender<Result<(), String>>,
    },
    /// Watch these ports from now on (the Settings view's `watch_ports`).
    WatchPorts(Vec<u16>),
}
