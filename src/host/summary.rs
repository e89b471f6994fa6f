//! What a started engine announces: one line per route, the dashboard, the
//! OTLP push and the capture. Both front ends print these lines, each
//! behind its own name (`speedtap: `, `speedtap-desktop: `).

use std::net::SocketAddr;

use super::{CaptureStatus, RunningEngine};
use crate::model::BoundRoute;

impl RunningEngine {
    /// The start-up announcement, one line each, without the front end's
    /// name: print each as `{name}: {line}` on stderr.
    pub fn summary(&self) -> Vec<String> {
        summary_lines(&self.routes, self.api, self.otlp_url(), &self.capture)
    }
}

fn summary_lines(
    routes: &[BoundRoute],
    api: Option<SocketAddr>,
    otlp_url: Option<&str>,
    capture: &CaptureStatus,
) -> Vec<String> {
    let mut lines: Vec<String> = routes
        .iter()
        .map(|route| {
            format!(
                "route {}: {} -> {}",
                route.name,
                route.proxy_url(),
                route.upstream
            )
        })
        .collect();
    if let Some(api) = api {
        lines.push(format!("dashboard and control API on http://{api}/"));
    }
    if let Some(url) = otlp_url {
        lines.push(format!("pushing metrics to {url}"));
    }
    match capture {
        CaptureStatus::Off => {}
        CaptureStatus::On { ports } if ports.is_empty() => lines.push(
            "capture ready: no model server port yet (ports are added as servers are found)".into(),
        ),
        CaptureStatus::On { ports } => {
            let ports: Vec<String> = ports.iter().map(u16::to_string).collect();
            lines.push(format!(
                "capturing calls to port {} (no client changes needed)",
                ports.join(", ")
            ));
        }
        // One line; the proxy keeps running and the exit code is unchanged.
        CaptureStatus::Unavailable(why) => lines.push(format!("warning: capture is off: {why}")),
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route() -> BoundRoute {
        BoundRoute {
            name: "ollama".into(),
            listen: "127.0.0.1:11435".parse().unwrap(),
            upstream: "http://127.0.0.1:11434".into(),
        }
    }

    #[test]
    fn every_part_gets_its_line_in_order() {
        let lines = summary_lines(
            &[route()],
            Some("127.0.0.1:7878".parse().unwrap()),
            Some("http://127.0.0.1:4318/v1/metrics"),
            &CaptureStatus::On {
                ports: vec![11434, 8080],
            },
        );
        assert_eq!(
            lines,
            [
                "route ollama: http://127.0.0.1:11435 -> http://127.0.0.1:11434",
                "dashboard and control API on http://127.0.0.1:7878/",
                "pushing metrics to http://127.0.0.1:4318/v1/metrics",
                "capturing calls to port 11434, 8080 (no client changes needed)",
            ]
        );
    }

    #[test]
    fn a_capture_with_no_port_yet_says_it_is_ready_for_servers_found_later() {
        let lines = summary_lines(&[], None, None, &CaptureStatus::On { ports: Vec::new() });
        assert_eq!(
            lines,
            ["capture ready: no model server port yet (ports are added as servers are found)"]
        );
    }

    #[test]
    fn an_unavailable_capture_is_a_warning_and_off_says_nothing() {
        let lines = summary_lines(
            &[],
            None,
            None,
            &CaptureStatus::Unavailable("no helper".into()),
        );
        assert_eq!(lines, ["warning: capture is off: no helper"]);
        assert!(summary_lines(&[], None, None, &CaptureStatus::Off).is_empty());
    }
}
