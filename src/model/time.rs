//! Times as the contract writes them: RFC 3339 UTC with milliseconds, and
//! unix milliseconds.

use std::time::{Duration, UNIX_EPOCH};

/// A time that is neither unix milliseconds nor an RFC 3339 UTC time.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid time {0:?}: expected unix milliseconds or an RFC 3339 UTC time such as \
     2026-11-30T10:42:07Z"
)]
pub struct InvalidTime(pub String);

/// Unix milliseconds of an RFC 3339 UTC time (`2026-11-30T10:42:07.123Z`;
/// also without the `Z` or with a space for the `T`, read as UTC). `None`
/// for anything else, including times before 1970.
pub fn rfc3339_to_ms(text: &str) -> Option<u64> {
    let t = humantime::parse_rfc3339_weak(text.trim()).ok()?;
    let since = t.duration_since(UNIX_EPOCH).ok()?;
    u64::try_from(since.as_millis()).ok()
}

/// The RFC 3339 UTC string with milliseconds for unix ms, the engine's
/// format (`2026-11-30T10:42:07.123Z`).
pub fn ms_to_rfc3339(ms: u64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

/// A time filter as users type it (`since=`, `until=`, `--since`): unix
/// milliseconds (all digits) or an RFC 3339 UTC time.
pub fn parse_time(text: &str) -> Result<u64, InvalidTime> {
    let t = text.trim();
    if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
        return t.parse().map_err(|_| InvalidTime(text.to_owned()));
    }
    rfc3339_to_ms(t).ok_or_else(|| InvalidTime(text.to_owned()))
}
