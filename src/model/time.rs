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

/// Unix milliseconds of an RFC 3339 time with any UTC offset, as servers
/// write them (Ollama's `expires_at`: `2026-11-30T11:42:07.123456789+01:00`,
/// local time with its offset); `Z` and no offset read as UTC. `None` for
/// anything else, including times before 1970.
pub fn rfc3339_offset_to_ms(text: &str) -> Option<u64> {
    let text = text.trim();
    let bytes = text.as_bytes();
    let n = bytes.len();
    let has_offset = n > 6
        && matches!(bytes[n - 6], b'+' | b'-')
        && bytes[n - 3] == b':'
        && text[..n - 6].contains('T');
    if !has_offset {
        return rfc3339_to_ms(text);
    }
    let hours: i64 = text[n - 5..n - 3].parse().ok()?;
    let minutes: i64 = text[n - 2..].parse().ok()?;
    let sign = if bytes[n - 6] == b'+' { 1 } else { -1 };
    let local = rfc3339_to_ms(&text[..n - 6])? as i64;
    u64::try_from(local - sign * (hours * 60 + minutes) * 60_000).ok()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_servers_local_time_with_its_offset_reads_as_the_same_instant_in_utc() {
        let utc = rfc3339_to_ms("2026-11-30T10:42:07.123Z").unwrap();
        assert_eq!(rfc3339_offset_to_ms("2026-11-30T10:42:07.123Z"), Some(utc));
        assert_eq!(
            rfc3339_offset_to_ms("2026-11-30T11:42:07.123456789+01:00"),
            Some(utc)
        );
        assert_eq!(
            rfc3339_offset_to_ms("2026-11-30T02:42:07.123-08:00"),
            Some(utc)
        );
        assert_eq!(rfc3339_offset_to_ms("2026-11-30T10:42:07.123"), Some(utc));
        assert_eq!(rfc3339_offset_to_ms("soon"), None);
        assert_eq!(rfc3339_offset_to_ms("2026-11-30T10:42:07+1:00"), None);
    }
}
