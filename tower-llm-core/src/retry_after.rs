//! Parsing of the provider's "wait this long" headers.
//!
//! Three headers are read, first match wins:
//! 1. `retry-after-ms`: milliseconds, as OpenAI and Anthropic send it
//!    (a non-negative decimal; a fraction is accepted).
//! 2. `Retry-After` as delta-seconds (RFC 9110 §10.2.3; a non-negative
//!    integer, a fraction is accepted as the OpenAI SDK does).
//! 3. `Retry-After` as an HTTP-date, measured against the given clock; a
//!    date in the past means "now" (zero).
//!
//! Garbage never panics and never errors: a value that is empty, negative,
//! not a number, `inf`/`NaN`, or not valid text is ignored (`None`). A value
//! larger than [`MAX_RETRY_AFTER`] (including one too large for any integer
//! type) is clamped to it.

use std::time::{Duration, SystemTime};

use http::header::RETRY_AFTER;
use http::{HeaderMap, HeaderName};

/// The largest wait any retry-after header can ask for (one hour); larger
/// values are clamped to this. Any wait this long exceeds every sensible
/// call deadline, so the retry layer fails over instead of sleeping.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

/// The `retry-after-ms` header name.
pub const RETRY_AFTER_MS: HeaderName = HeaderName::from_static("retry-after-ms");

/// Reads the retry-after hint from response headers, measuring an HTTP-date
/// against the system clock.
///
/// ```
/// use std::time::Duration;
/// use http::{HeaderMap, HeaderName};
///
/// let mut headers = HeaderMap::new();
/// headers.insert("retry-after", "5".parse().unwrap());
/// assert_eq!(tower_llm_core::retry_after(&headers), Some(Duration::from_secs(5)));
/// headers.insert("retry-after-ms", "1500".parse().unwrap());
/// assert_eq!(tower_llm_core::retry_after(&headers), Some(Duration::from_millis(1500)));
/// ```
pub fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    retry_after_at(headers, SystemTime::now)
}

/// Like [`retry_after`], with the clock for HTTP-dates given explicitly (it
/// is only called when the header holds a date).
pub fn retry_after_at(headers: &HeaderMap, now: impl FnOnce() -> SystemTime) -> Option<Duration> {
    if let Some(v) = headers.get(RETRY_AFTER_MS) {
        if let Some(d) = parse_retry_after_ms(v.as_bytes()) {
            return Some(d);
        }
    }
    headers
        .get(RETRY_AFTER)
        .and_then(|v| parse_retry_after(v.as_bytes(), now))
}

/// Parses one `Retry-After` value: delta-seconds or an HTTP-date.
///
/// ```
/// use std::time::{Duration, SystemTime, UNIX_EPOCH};
/// use tower_llm_core::parse_retry_after;
///
/// let now = || UNIX_EPOCH + Duration::from_secs(1_445_412_470); // Wed, 21 Oct 2015 07:27:50 GMT
/// assert_eq!(parse_retry_after(b"120", now), Some(Duration::from_secs(120)));
/// assert_eq!(
///     parse_retry_after(b"Wed, 21 Oct 2015 07:28:00 GMT", now),
///     Some(Duration::from_secs(10)),
/// );
/// assert_eq!(parse_retry_after(b"-5", now), None);
/// assert_eq!(parse_retry_after(b"soon", now), None);
/// ```
pub fn parse_retry_after(value: &[u8], now: impl FnOnce() -> SystemTime) -> Option<Duration> {
    let text = std::str::from_utf8(value).ok()?.trim();
    if let Some(d) = parse_decimal(text, Duration::from_secs(1)) {
        return Some(d);
    }
    let date = httpdate::parse_http_date(text).ok()?;
    let wait = date.duration_since(now()).unwrap_or(Duration::ZERO);
    Some(wait.min(MAX_RETRY_AFTER))
}

/// Parses one `retry-after-ms` value (milliseconds).
pub fn parse_retry_after_ms(value: &[u8]) -> Option<Duration> {
    let text = std::str::from_utf8(value).ok()?.trim();
    parse_decimal(text, Duration::from_millis(1))
}

/// Parses `digits[.digits]` in `unit`s, clamped to [`MAX_RETRY_AFTER`].
fn parse_decimal(text: &str, unit: Duration) -> Option<Duration> {
    let (int, frac) = text.split_once('.').unwrap_or((text, ""));
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    if !int.bytes().all(|b| b.is_ascii_digit()) || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let unit_ns = unit.as_nanos();
    let max_ns = MAX_RETRY_AFTER.as_nanos();
    let mut whole: u128 = 0;
    for b in int.bytes() {
        whole = whole * 10 + u128::from(b - b'0');
        if whole * unit_ns > max_ns {
            return Some(MAX_RETRY_AFTER);
        }
    }
    let mut scale = unit_ns;
    let mut frac_ns: u128 = 0;
    for b in frac.bytes() {
        scale /= 10;
        if scale == 0 {
            break;
        }
        frac_ns += u128::from(b - b'0') * scale;
    }
    let total = (whole * unit_ns + frac_ns).min(max_ns);
    // `total <= max_ns`, which fits in u64 nanoseconds.
    Some(Duration::from_nanos(
        u64::try_from(total).unwrap_or(u64::MAX),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    fn now() -> SystemTime {
        // Wed, 21 Oct 2015 07:28:00 GMT
        UNIX_EPOCH + Duration::from_secs(1_445_412_480)
    }

    #[test]
    fn delta_seconds() {
        assert_eq!(parse_retry_after(b"0", now), Some(Duration::ZERO));
        assert_eq!(parse_retry_after(b"5", now), Some(Duration::from_secs(5)));
        assert_eq!(
            parse_retry_after(b" 12 ", now),
            Some(Duration::from_secs(12))
        );
        assert_eq!(
            parse_retry_after(b"1.5", now),
            Some(Duration::from_millis(1500))
        );
    }

    #[test]
    fn http_dates_in_all_three_formats() {
        let in_ten = Some(Duration::from_secs(10));
        assert_eq!(
            parse_retry_after(b"Wed, 21 Oct 2015 07:28:10 GMT", now),
            in_ten
        );
        assert_eq!(
            parse_retry_after(b"Wednesday, 21-Oct-15 07:28:10 GMT", now),
            in_ten
        );
        assert_eq!(parse_retry_after(b"Wed Oct 21 07:28:10 2015", now), in_ten);
        // A date in the past means "now".
        assert_eq!(
            parse_retry_after(b"Wed, 21 Oct 2015 07:00:00 GMT", now),
            Some(Duration::ZERO)
        );
        // Far future is clamped.
        assert_eq!(
            parse_retry_after(b"Fri, 31 Dec 9999 23:59:59 GMT", now),
            Some(MAX_RETRY_AFTER)
        );
    }

    #[test]
    fn garbage_is_ignored() {
        for v in [
            &b""[..],
            b" ",
            b"-5",
            b"-0.5",
            b"+5",
            b"5s",
            b"NaN",
            b"inf",
            b"1e3",
            b".",
            b"1.2.3",
            b"0x10",
            b"\xff\xfe",
            b"Mon, 32 Oct 2015 07:28:00 GMT",
        ] {
            assert_eq!(
                parse_retry_after(v, now),
                None,
                "{:?}",
                String::from_utf8_lossy(v)
            );
        }
    }

    #[test]
    fn enormous_values_clamp() {
        assert_eq!(parse_retry_after(b"3601", now), Some(MAX_RETRY_AFTER));
        assert_eq!(parse_retry_after(b"3600", now), Some(MAX_RETRY_AFTER));
        assert_eq!(
            parse_retry_after(b"3599", now),
            Some(Duration::from_secs(3599))
        );
        let huge = "9".repeat(400);
        assert_eq!(
            parse_retry_after(huge.as_bytes(), now),
            Some(MAX_RETRY_AFTER)
        );
        assert_eq!(parse_retry_after_ms(huge.as_bytes()), Some(MAX_RETRY_AFTER));
    }

    #[test]
    fn milliseconds() {
        assert_eq!(
            parse_retry_after_ms(b"1500"),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(
            parse_retry_after_ms(b"0.5"),
            Some(Duration::from_micros(500))
        );
        assert_eq!(parse_retry_after_ms(b"-1"), None);
        assert_eq!(parse_retry_after_ms(b"abc"), None);
    }

    #[test]
    fn ms_header_wins_and_bad_ms_falls_back() {
        let mut h = HeaderMap::new();
        h.insert(RETRY_AFTER, "5".parse().expect("value"));
        h.insert(RETRY_AFTER_MS, "1500".parse().expect("value"));
        assert_eq!(retry_after_at(&h, now), Some(Duration::from_millis(1500)));
        h.insert(RETRY_AFTER_MS, "garbage".parse().expect("value"));
        assert_eq!(retry_after_at(&h, now), Some(Duration::from_secs(5)));
        h.remove(RETRY_AFTER);
        assert_eq!(retry_after_at(&h, now), None);
    }

    #[test]
    fn clock_is_only_read_for_dates() {
        let mut h = HeaderMap::new();
        h.insert(RETRY_AFTER, "7".parse().expect("value"));
        let d = retry_after_at(&h, || panic!("clock read for delta-seconds"));
        assert_eq!(d, Some(Duration::from_secs(7)));
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..64)) {
            if let Some(d) = parse_retry_after(&bytes, now) {
                proptest::prop_assert!(d <= MAX_RETRY_AFTER);
            }
            if let Some(d) = parse_retry_after_ms(&bytes) {
                proptest::prop_assert!(d <= MAX_RETRY_AFTER);
            }
        }

        #[test]
        fn any_header_value_never_panics(s in "\\PC{0,40}") {
            if let Ok(v) = http::HeaderValue::from_str(&s) {
                let mut h = HeaderMap::new();
                h.insert(RETRY_AFTER, v.clone());
                h.insert(RETRY_AFTER_MS, v);
                if let Some(d) = retry_after_at(&h, now) {
                    proptest::prop_assert!(d <= MAX_RETRY_AFTER);
                }
            }
        }

        #[test]
        fn integers_round_trip(n in 0u64..3600) {
            proptest::prop_assert_eq!(
                parse_retry_after(n.to_string().as_bytes(), now),
                Some(Duration::from_secs(n))
            );
        }
    }
}
