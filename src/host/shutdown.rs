//! Shutdown ([`RunningEngine::shutdown`]): stop accepting, let in-flight
//! calls drain for a grace period, then stop the actors, which settles
//! whatever is still open.

use std::time::Duration;

use crate::engine::messages::DetachStore;
use crate::engine::metrics::otlp::OtlpExporter;
use crate::model::{CallsQuery, EngineQueries};

use super::*;

/// After the drain, how long shutdown waits for the calls it ended to be
/// settled by their actors.
pub const SETTLE_WAIT: Duration = Duration::from_secs(1);

impl RunningEngine {
    /// Where metrics are pushed, when an OTLP exporter runs.
    pub fn otlp_url(&self) -> Option<&str> {
        self.otlp.as_ref().map(OtlpExporter::url)
    }

    /// Stops accepting, lets in-flight calls finish for up to `grace`,
    /// then stops the actors (settling any call still open as abandoned).
    pub async fn shutdown(self, grace: Duration) {
        let _ = self.stop_accepting.send(true);
        if let Some(demo) = self.handle.shared.demo.lock().await.take() {
            if let Some(t) = demo.traffic {
                t.abort();
            }
        }
        let mut servers = std::mem::take(&mut *self.handle.shared.servers.lock().await);
        let drained = tokio::time::timeout(grace, async {
            while servers.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            servers.abort_all();
            while servers.join_next().await.is_some() {}
        }
        // The connections the drain ended dropped their taps, which queued
        // the calls' final reports. Wait (briefly) until the supervisor has
        // settled them, so subscribers see every call end before the
        // actors stop.
        let deadline = tokio::time::Instant::now() + SETTLE_WAIT;
        while tokio::time::Instant::now() < deadline {
            let in_flight = self
                .handle
                .calls(CallsQuery {
                    limit: usize::MAX,
                    route: None,
                    unmetered: true,
                })
                .await
                .iter()
                .any(|c| !c.status.is_settled());
            if !in_flight {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Commit what the writer still holds before the threads end.
        if let Ok(Some(writer)) = self.handle.supervisor.send(DetachStore).await {
            let _ = tokio::task::spawn_blocking(move || drop(writer)).await;
        }
        self.system.stop();
        if let Some(exporter) = self.otlp {
            // The last calls get exported before the process ends.
            let _ = tokio::task::spawn_blocking(move || exporter.shutdown()).await;
        }
    }
}
