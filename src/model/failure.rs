//! How a call went wrong: the kind of failure, the tokens it streamed
//! before it, and the server's own message (`docs/metering.md`, "A failed
//! call"). One record per settled call that did not end well; a call that
//! ended well has none.
//!
//! The short label is what every front end shows in a status column
//! (`HTTP 500`, `broke after 30 tokens`, `server error mid-stream`,
//! `client left`): one wording, written once here.

use serde::{Deserialize, Serialize};

/// The most characters of a server's error message kept (and shown).
pub const MESSAGE_CAP: usize = 300;

/// What went wrong. Spellings are the contract's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// The server answered with a non-2xx status.
    Http,
    /// The server could not be reached (the proxy answered 502).
    Unreachable,
    /// A 2xx stream carried the protocol's error event (an OpenAI `error`
    /// chunk, an Anthropic `error` event, an Ollama `{"error": ...}` line).
    StreamError,
    /// A 2xx stream stopped before the protocol's end marker: the server
    /// cut the connection, or ended the body without finishing.
    BrokeOff,
    /// The client hung up before the answer ended. Not the server's
    /// failure: shown, never counted as an error nor notified.
    ClientLeft,
}

impl FailureKind {
    /// The contract's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::Http => "http",
            FailureKind::Unreachable => "unreachable",
            FailureKind::StreamError => "stream_error",
            FailureKind::BrokeOff => "broke_off",
            FailureKind::ClientLeft => "client_left",
        }
    }
}

/// How one call went wrong.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    /// What went wrong.
    pub kind: FailureKind,
    /// Output tokens the call had streamed before it went wrong.
    pub after_tokens: u64,
    /// The server's own name for the error, from its error body or event
    /// (its `type` or `code`: `server_error`, `invalid_request_error`),
    /// never its prose, which may quote the request or the answer: at most
    /// [`MESSAGE_CAP`] characters, control characters removed
    /// ([`clean_message`]). Absent when the server named none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl Failure {
    /// A failure of `kind` after `after_tokens`, its message cleaned.
    pub fn new(kind: FailureKind, after_tokens: u64, message: Option<&str>) -> Failure {
        Failure {
            kind,
            after_tokens,
            message: message.map(clean_message).filter(|m| !m.is_empty()),
        }
    }

    /// Whether this is the server's failure (an error to count, show red
    /// and notify), not a client that left.
    pub fn is_error(&self) -> bool {
        self.kind != FailureKind::ClientLeft
    }

    /// The status column's text: `HTTP 500`, `unreachable`, `server error
    /// mid-stream`, `broke after 30 tokens`, `client left`. `http_status`
    /// is the call's status code, named for an HTTP failure.
    pub fn label(&self, http_status: Option<u16>) -> String {
        match self.kind {
            FailureKind::Http => match http_status {
                Some(code) => format!("HTTP {code}"),
                None => "HTTP error".into(),
            },
            FailureKind::Unreachable => "unreachable".into(),
            FailureKind::StreamError => "server error mid-stream".into(),
            FailureKind::BrokeOff => match self.after_tokens {
                0 => "broke before any token".into(),
                1 => "broke after 1 token".into(),
                n => format!("broke after {n} tokens"),
            },
            FailureKind::ClientLeft => "client left".into(),
        }
    }
}

/// A server's error message as it may be kept and shown: control
/// characters (newlines included) become spaces, runs of white space one
/// space, and at most [`MESSAGE_CAP`] characters remain (an ellipsis marks
/// a cut).
pub fn clean_message(raw: &str) -> String {
    let mut out = String::new();
    let mut chars = 0;
    let mut last_space = true;
    for c in raw.chars() {
        let c = if c.is_control() || c.is_whitespace() {
            ' '
        } else {
            c
        };
        if c == ' ' && last_space {
            continue;
        }
        if chars == MESSAGE_CAP {
            out.truncate(out.trim_end().len());
            out.push('…');
            return out;
        }
        last_space = c == ' ';
        out.push(c);
        chars += 1;
    }
    out.truncate(out.trim_end().len());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_has_a_short_label_that_fits_a_status_column() {
        let f = |kind, n| Failure::new(kind, n, None);
        assert_eq!(f(FailureKind::Http, 0).label(Some(500)), "HTTP 500");
        assert_eq!(f(FailureKind::Http, 0).label(Some(429)), "HTTP 429");
        assert_eq!(
            f(FailureKind::Unreachable, 0).label(Some(502)),
            "unreachable"
        );
        assert_eq!(
            f(FailureKind::StreamError, 12).label(Some(200)),
            "server error mid-stream"
        );
        assert_eq!(
            f(FailureKind::BrokeOff, 30).label(Some(200)),
            "broke after 30 tokens"
        );
        assert_eq!(
            f(FailureKind::BrokeOff, 1).label(None),
            "broke after 1 token"
        );
        assert_eq!(
            f(FailureKind::ClientLeft, 3).label(Some(200)),
            "client left"
        );
        for kind in [
            FailureKind::Http,
            FailureKind::Unreachable,
            FailureKind::StreamError,
            FailureKind::BrokeOff,
            FailureKind::ClientLeft,
        ] {
            let label = f(kind, 123_456).label(Some(200));
            assert!(!label.contains("error 200"), "{label}");
            assert!(label.chars().count() <= 26, "{label}");
        }
    }

    #[test]
    fn a_client_that_left_is_not_an_error() {
        assert!(!Failure::new(FailureKind::ClientLeft, 0, None).is_error());
        assert!(Failure::new(FailureKind::BrokeOff, 0, None).is_error());
    }

    #[test]
    fn a_message_loses_its_control_characters_and_stops_at_the_cap() {
        assert_eq!(
            clean_message("model \"x\" not found,\n\ttry pulling it\u{7}  first\r\n"),
            "model \"x\" not found, try pulling it first"
        );
        let long = "é".repeat(1000);
        let kept = clean_message(&long);
        assert_eq!(kept.chars().count(), MESSAGE_CAP + 1);
        assert!(kept.ends_with('…'));
        assert_eq!(
            Failure::new(FailureKind::Http, 0, Some("\n\u{0}  ")).message,
            None
        );
    }

    #[test]
    fn a_failure_serialises_with_the_contract_names() {
        let f = Failure::new(FailureKind::BrokeOff, 30, Some("upstream closed"));
        assert_eq!(
            serde_json::to_value(&f).unwrap(),
            serde_json::json!({"kind": "broke_off", "after_tokens": 30, "message": "upstream closed"})
        );
    }
}
