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
    if e.stream_error.is_some() {
        let code = e.stream_error_text;
        return Some(Failure::new(FailureKind::StreamError, n, code));
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

/// The server's own name for the error in its body: the `type` or `code`
/// of a JSON error (`{"error": {"type": "server_error", ...}}`). Never
/// its prose, nor a text body: servers quote the request there, and no
/// prompt or answer text is kept (`tests/security.rs`).
pub fn body_message(body: &[u8]) -> Option<String> {
    let value = serde_json::from_slice::<serde_json::Value>(body).ok()?;
    json::error_code(&value)
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
        e.error_body = br#"{"error":{"code":500,"message":"failed to load my secret prompt","type":"server_error"}}"#;
        let f = failure(&e).unwrap();
        assert_eq!(f.kind, FailureKind::Http);
        assert_eq!(f.label(Some(500)), "HTTP 500");
        // The server's name for the error, never its prose.
        assert_eq!(f.message.as_deref(), Some("server_error"));
        e.error_body = br#"{"error":"my secret prompt is not valid"}"#;
        assert_eq!(failure(&e).unwrap().message, None);
        e.error_body = b"Too Many Requests\r\n";
        e.http_status = Some(429);
        let f = failure(&e).unwrap();
        assert_eq!((f.label(Some(429)).as_str(), f.message), ("HTTP 429", None));
        e.error_body = br#"{"type":"error","error":{"type":"overloaded_error","message":"x"}}"#;
        assert_eq!(
            failure(&e).unwrap().message.as_deref(),
            Some("overloaded_error")
        );
    }

    #[test]
    fn an_error_event_in_a_200_stream_is_a_server_error_mid_stream() {
        let mut e = end(Some(200), Outcome::UpstreamError, StreamEnd::UpstreamCut);
        e.stream_error = Some("the answer so far");
        e.stream_error_text = Some("server_error");
        let f = failure(&e).unwrap();
        assert_eq!(f.kind, FailureKind::StreamError);
        assert_eq!(f.after_tokens, 30);
        assert_eq!(f.message.as_deref(), Some("server_error"));
        // Prose alone (an Ollama `{"error": "..."}` line) keeps nothing.
        e.stream_error_text = None;
        assert_eq!(failure(&e).unwrap().message, None);
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
