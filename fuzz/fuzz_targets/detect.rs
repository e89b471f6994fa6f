//! The request detector and framing detector (`speedtap_fuzz::decode::detect`).
//!
//! Payload layout: `PATH \n CONTENT-TYPE \n BODY` (missing parts are empty;
//! the body is any bytes, the two header lines are decoded lossily). Flags
//! bits 0-2 pick the method; bit 3 says whether the response has a content
//! type at all. The split seed picks a cut of the body, as the proxy only
//! hands the detector a prefix.
//!
//! Checks: never panics (body cut anywhere, also mid-UTF-8 and mid-JSON);
//! only POST (any case) is metered, and the method's case does not matter;
//! a query string or fragment never changes the API; a trailing `/` never
//! changes it; the framing ignores the content type's case and parameters,
//! and an empty content type is the same as none.
#![no_main]

use libfuzzer_sys::fuzz_target;
use speedtap_fuzz::decode::detect::{detect_framing, detect_request};
use speedtap_fuzz::model::ApiKind;
use speedtap_fuzz::Input;

const METHODS: [&str; 8] = [
    "POST", "post", "PoSt", "GET", "PUT", "DELETE", "OPTIONS", "",
];

fuzz_target!(|data: &[u8]| {
    let input = Input::parse(data);
    let mut parts = input.payload.splitn(3, |&b| b == b'\n');
    let path = String::from_utf8_lossy(parts.next().unwrap_or_default());
    let content_type = String::from_utf8_lossy(parts.next().unwrap_or_default());
    let body = parts.next().unwrap_or_default();
    let method = METHODS[usize::from(input.flags & 7)];
    let has_ct = input.flags & 8 == 0;

    let facts = detect_request(method, &path, body);
    if !method.eq_ignore_ascii_case("POST") {
        assert_eq!(facts.api, ApiKind::Unknown, "non-POST metered");
    } else {
        assert_eq!(detect_request("POST", &path, body), facts, "method case");
    }
    let with_query = format!("{path}?stream=true#x");
    assert_eq!(
        detect_request(method, &with_query, body),
        facts,
        "query changed the API"
    );
    if !path.contains(['?', '#']) {
        let slash = format!("{path}/");
        assert_eq!(
            detect_request(method, &slash, body),
            facts,
            "trailing slash"
        );
    }
    // A prefix of the body (the proxy reads at most 256 KiB) never panics.
    let cut = usize::from(input.seed) * body.len() / 255;
    let _ = detect_request(method, &path, &body[..cut]);

    let ct = has_ct.then_some(content_type.as_ref());
    let framing = detect_framing(facts.api, facts.stream, ct);
    if let Some(ct) = ct {
        let upper = ct.to_ascii_uppercase();
        assert_eq!(
            detect_framing(facts.api, facts.stream, Some(&upper)),
            framing,
            "case"
        );
        if !ct.contains(';') {
            let param = format!("{ct}; charset=utf-8");
            assert_eq!(
                detect_framing(facts.api, facts.stream, Some(&param)),
                framing,
                "params"
            );
        }
    } else {
        assert_eq!(
            detect_framing(facts.api, facts.stream, Some("")),
            framing,
            "empty type"
        );
    }
});
