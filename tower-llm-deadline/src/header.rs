//! Timeouts that arrive in request headers.

use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};

/// The gRPC timeout header (`grpc-timeout: 1*8DIGIT unit`).
pub const GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");

/// A plain millisecond timeout header (`x-request-timeout-ms: 1500`).
pub const X_REQUEST_TIMEOUT_MS: HeaderName = HeaderName::from_static("x-request-timeout-ms");

/// The tightest timeout among `grpc-timeout` and `x-request-timeout-ms`.
/// Headers that do not parse are ignored.
pub fn header_timeout(headers: &HeaderMap) -> Option<Duration> {
    if headers.is_empty() {
        return None;
    }
    let grpc = headers.get(GRPC_TIMEOUT).and_then(parse_grpc_timeout);
    let ms = headers
        .get(X_REQUEST_TIMEOUT_MS)
        .and_then(parse_request_timeout_ms);
    match (grpc, ms) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Parses a `grpc-timeout` value as the gRPC over HTTP/2 spec defines it:
/// one to eight ASCII digits followed by a unit, `H` (hours), `M` (minutes),
/// `S` (seconds), `m` (milliseconds), `u` (microseconds) or `n`
/// (nanoseconds). Anything else is `None`.
///
/// ```
/// use std::time::Duration;
/// use http::HeaderValue;
/// use tower_llm_deadline::parse_grpc_timeout;
///
/// assert_eq!(parse_grpc_timeout(&HeaderValue::from_static("250m")), Some(Duration::from_millis(250)));
/// assert_eq!(parse_grpc_timeout(&HeaderValue::from_static("3S")), Some(Duration::from_secs(3)));
/// assert_eq!(parse_grpc_timeout(&HeaderValue::from_static("123456789S")), None); // 9 digits
/// assert_eq!(parse_grpc_timeout(&HeaderValue::from_static("5s")), None); // unit is case-sensitive
/// ```
pub fn parse_grpc_timeout(value: &HeaderValue) -> Option<Duration> {
    let bytes = value.as_bytes();
    let (&unit, digits) = bytes.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n = digits
        .iter()
        .fold(0u64, |acc, d| acc * 10 + u64::from(d - b'0'));
    Some(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

/// Parses an `x-request-timeout-ms` value: a non-negative integer number of
/// milliseconds, surrounding spaces allowed. Anything else (including a
/// number too large for `u64`) is `None`.
pub fn parse_request_timeout_ms(value: &HeaderValue) -> Option<Duration> {
    let text = value.to_str().ok()?.trim();
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse::<u64>().ok().map(Duration::from_millis)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grpc(s: &'static str) -> Option<Duration> {
        parse_grpc_timeout(&HeaderValue::from_static(s))
    }

    #[test]
    fn grpc_units() {
        assert_eq!(grpc("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(grpc("2M"), Some(Duration::from_secs(120)));
        assert_eq!(grpc("2S"), Some(Duration::from_secs(2)));
        assert_eq!(grpc("2m"), Some(Duration::from_millis(2)));
        assert_eq!(grpc("2u"), Some(Duration::from_micros(2)));
        assert_eq!(grpc("2n"), Some(Duration::from_nanos(2)));
        assert_eq!(grpc("0m"), Some(Duration::ZERO));
        assert_eq!(
            grpc("99999999H"),
            Some(Duration::from_secs(99_999_999 * 3600))
        );
    }

    #[test]
    fn grpc_garbage() {
        for v in [
            "",
            "m",
            "10",
            "10x",
            "-1S",
            " 1S",
            "1 S",
            "1.5S",
            "123456789m",
            "1SS",
        ] {
            assert_eq!(grpc(v), None, "{v:?}");
        }
    }

    #[test]
    fn request_timeout_ms() {
        let p = |s: &'static str| parse_request_timeout_ms(&HeaderValue::from_static(s));
        assert_eq!(p("1500"), Some(Duration::from_millis(1500)));
        assert_eq!(p(" 7 "), Some(Duration::from_millis(7)));
        for v in ["", "-1", "1.5", "1e3", "99999999999999999999999"] {
            assert_eq!(p(v), None, "{v:?}");
        }
    }

    #[test]
    fn tightest_header_wins() {
        let mut h = HeaderMap::new();
        assert_eq!(header_timeout(&h), None);
        h.insert(GRPC_TIMEOUT, HeaderValue::from_static("2S"));
        assert_eq!(header_timeout(&h), Some(Duration::from_secs(2)));
        h.insert(X_REQUEST_TIMEOUT_MS, HeaderValue::from_static("1500"));
        assert_eq!(header_timeout(&h), Some(Duration::from_millis(1500)));
        h.insert(GRPC_TIMEOUT, HeaderValue::from_static("900m"));
        assert_eq!(header_timeout(&h), Some(Duration::from_millis(900)));
        h.insert(GRPC_TIMEOUT, HeaderValue::from_static("bogus"));
        assert_eq!(header_timeout(&h), Some(Duration::from_millis(1500)));
    }
}
