//! How a settled call went wrong (`docs/metering.md`, "A failed call"),
//! decided once from what its end showed: an unreachable upstream, the
//! status of the response head, the protocol's error event, and how the
//! transport ended before the protocol's end marker.
//!
//! Pure: the call actor hands in what it saw; the server's message comes
//! from its error body or its error event, and [`Failure::new`] cleans and
//! caps it.

use crate::decode::protocols::json;
use crate::meter::pipeline::{Outcome, StreamEnd};
use crate::model::{Failure, FailureKind};

/// What the end of a call showed, for [`failure`].
pub struct End<'a> {
    /// The upstream could not be reached (the proxy answered 502).
    pub unreachable: bool,
    /// The response head's status, once it came.
    pub http_status: Option<u16>,
    /// How the meter judged the stream.
    pub outcome: Outcome,
    /// How the transport ended.
    pub end: StreamEnd,
    /// The start of a non-2xx body (at most `MAX_ERROR_BODY` bytes).
    pub error_body: &'a [u8],
    /// The error event's type or code, and its prose, when the stream
    /// carried one.
    pub stream_error: Option<&'a str>,
    pub stream_error_text: Option<&'a str>,
    /// Output tokens streamed before the end.
    pub output_tokens: u64,
}

/// The call's failure, or `None` for a call that ended well. A non-2xx
/// head decides before the stream, and the stream's error event before
/// the transport: a cut after an error event is that error.
pub fn failure(e: &End<'_>) -> Option<Failure> {
    let n = e.output_tokens;
    if e.unreachable {
        return Some(Failure::new(FailureKind::Unreachable, n, None));
    }
    if e.http_status.is_some_and(|c| !(200..300).contains(&c)) {
        let message = body_message(e.error_body);
        return Some(Failure::new(FailureKind::Http, n, message.as_deref()));
    }
    if let Some(kind) = e.stream_error {
        let message = e.stream_error_text.unwrap_or(kind);
        return Some(Failure::new(FailureKind::StreamError, n, Some(message)));
    }
    match (e.outcome, e.end) {
        (Outcome::Ok, _) => None,
        (_, StreamEnd::ClientGone) => Some(Failure::new(FailureKind::ClientLeft, n, None)),
        // A head that never came is the unreachable case above, or a
        // client gone; an upstream error without an event is a non-2xx.
        _ if e.http_status.is_none() => None,
        _ => Some(Failure::new(FailureKind::BrokeOff, n, None)),
    }
}

/// The server's message from its error body: the prose of a JSON error
/// (`{"error": "..."}`, `{"error": {"message": ...}}`, `{"detail": ...}`),
/// else the body's text when it is text. `None` for an empty body.
pub fn body_message(body: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(value) => json::error_text(&value),
        // A body cut at the read limit is not JSON any more: its text still
        // says what went wrong, but an HTML page says nothing worth a line.
        Err(_) if text.starts_with('<') => None,
        Err(_) => Some(text.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn end(http_status: Option<u16>, outcome: Outcome, stream_end: StreamEnd) -> End<'static> {
        End {
            unreachable: false,
            http_status,
            outcome,
            end: stream_end,
            error_body: b"",
            stream_error: None,
            stream_error_text: None,
            output_tokens: 30,
        }
    }

    #[test]
    fn a_call_that_ended_well_has_no_failure() {
        let ok = end(Some(200), Outcome::Ok, StreamEnd::ClientGone);
        assert_eq!(failure(&ok), None);
    }

    #[test]
    fn an_http_error_keeps_the_servers_own_message() {
        let mut e = end(Some(500), Outcome::UpstreamError, StreamEnd::Complete);
        e.output_tokens = 0;
        e.error_body = br#"{"error":{"code":500,"message":"failed to load model\nout of memory","type":"server_error"}}"#;
        let f = failure(&e).unwrap();
        assert_eq!(f.kind, FailureKind::Http);
        assert_eq!(f.label(Some(500)), "HTTP 500");
        assert_eq!(
            f.message.as_deref(),
            Some("failed to load model out of memory")
        );
        e.error_body = br#"{"error":"model 'x' not found, try pulling it first"}"#;
        let f = failure(&e).unwrap();
        assert_eq!(
            f.message.as_deref(),
            Some("model 'x' not found, try pulling it first")
        );
        e.error_body = b"Too Many Requests\r\n";
        e.http_status = Some(429);
        let f = failure(&e).unwrap();
        assert_eq!(
            (f.label(Some(429)).as_str(), f.message.as_deref()),
            ("HTTP 429", Some("Too Many Requests"))
        );
        e.error_body = b"<html><body>502</body></html>";
        assert_eq!(failure(&e).unwrap().message, None);
    }

    #[test]
    fn an_error_event_in_a_200_stream_is_a_server_error_mid_stream() {
        let mut e = end(Some(200), Outcome::UpstreamError, StreamEnd::UpstreamCut);
        e.stream_error = Some("server_error");
        e.stream_error_text = Some("the model crashed");
        let f = failure(&e).unwrap();
        assert_eq!(f.kind, FailureKind::StreamError);
        assert_eq!(f.after_tokens, 30);
        assert_eq!(f.message.as_deref(), Some("the model crashed"));
        e.stream_error_text = None;
        assert_eq!(failure(&e).unwrap().message.as_deref(), Some("server_error"));
    }

    #[test]
    fn a_stream_cut_before_its_marker_broke_off_and_a_client_that_hung_up_left() {
        let cut = end(Some(200), Outcome::Abandoned, StreamEnd::UpstreamCut);
        let f = failure(&cut).unwrap();
        assert_eq!(f.label(Some(200)), "broke after 30 tokens");
        let unfinished = end(Some(200), Outcome::Abandoned, StreamEnd::Complete);
        assert_eq!(failure(&unfinished).unwrap().kind, FailureKind::BrokeOff);
        let gone = end(Some(200), Outcome::Abandoned, StreamEnd::ClientGone);
        assert_eq!(failure(&gone).unwrap().kind, FailureKind::ClientLeft);
        let before_head = end(None, Outcome::Abandoned, StreamEnd::ClientGone);
        assert_eq!(failure(&before_head).unwrap().kind, FailureKind::ClientLeft);
    }

    #[test]
    fn an_unreachable_upstream_is_its_own_kind() {
        let mut e = end(Some(502), Outcome::Abandoned, StreamEnd::UpstreamCut);
        e.unreachable = true;
        assert_eq!(failure(&e).unwrap().label(Some(502)), "unreachable");
    }
}
