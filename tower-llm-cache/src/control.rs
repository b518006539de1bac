//! A request's `Cache-Control`, read strictly: anything malformed or
//! contradictory is treated as absent, never as an error.

use std::time::Duration;

use http::HeaderMap;
use http::header::CACHE_CONTROL;

/// The request directives of `Cache-Control` (RFC 9111 §5.2.1, and
/// `stale-if-error` from RFC 5861 §4) that the cache honours.
///
/// A header that is malformed or contradictory reads as absent
/// ([`CacheControl::default`]): a directive repeated with different
/// values, a `max-age` or `stale-if-error` without a number of seconds, a
/// value that is not ASCII, a directive name with characters a token may
/// not hold. Unknown directives (`max-stale`, `private`, extensions) are
/// ignored. Several `Cache-Control` headers read as one list. Reading is
/// linear in the header's length and allocates nothing.
///
/// ```
/// use std::time::Duration;
/// use http::{HeaderMap, HeaderValue};
/// use tower_llm_cache::CacheControl;
///
/// let mut headers = HeaderMap::new();
/// headers.insert("cache-control", HeaderValue::from_static("max-age=60, stale-if-error=600"));
/// let cc = CacheControl::from_headers(&headers);
/// assert_eq!(cc.max_age, Some(Duration::from_secs(60)));
/// assert_eq!(cc.stale_if_error, Some(Duration::from_secs(600)));
///
/// // Contradictory: ignored as a whole.
/// headers.insert("cache-control", HeaderValue::from_static("max-age=60, max-age=5"));
/// assert_eq!(CacheControl::from_headers(&headers), CacheControl::default());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CacheControl {
    /// `no-cache`: do not answer from the cache while fresh; ask a
    /// provider (and store its answer). The stale-safe rung still applies.
    pub no_cache: bool,
    /// `no-store`: do not store the answer to this request.
    pub no_store: bool,
    /// `max-age=N`: take a stored answer only if it is at most this old
    /// (the route's `ttl_ms` still caps it).
    pub max_age: Option<Duration>,
    /// `stale-if-error=N`: when every provider fails, take a stored answer
    /// at most this much past its freshness (the route's `stale_ms` still
    /// caps it; `0` refuses stale answers).
    pub stale_if_error: Option<Duration>,
}

/// The largest delta-seconds kept (RFC 9111 §1.2.2: a larger value is
/// taken as 2^31).
const MAX_DELTA_SECONDS: u64 = 1 << 31;

impl CacheControl {
    /// The directives of every `Cache-Control` header in `headers`, or
    /// the default (no directive) when there is none or it is malformed.
    pub fn from_headers(headers: &HeaderMap) -> Self {
        let mut cc = CacheControl::default();
        for value in headers.get_all(CACHE_CONTROL) {
            if cc.read(value.as_bytes()).is_none() {
                return CacheControl::default();
            }
        }
        cc
    }

    /// The directives of one header value, or `None` if it is malformed
    /// or contradictory.
    ///
    /// ```
    /// use tower_llm_cache::CacheControl;
    ///
    /// assert!(CacheControl::parse(b"no-store").unwrap().no_store);
    /// assert_eq!(CacheControl::parse(b"max-age=soon"), None);
    /// assert_eq!(CacheControl::parse("max-age=\u{663}".as_bytes()), None);
    /// ```
    pub fn parse(value: &[u8]) -> Option<Self> {
        let mut cc = CacheControl::default();
        cc.read(value)?;
        Some(cc)
    }

    fn read(&mut self, value: &[u8]) -> Option<()> {
        if !value.is_ascii() {
            return None;
        }
        for part in Elements::new(value) {
            let part = part?.trim_ascii();
            if part.is_empty() {
                // `a, , b` and a trailing comma: empty list elements are
                // allowed (RFC 9110 §5.6.1).
                continue;
            }
            let (name, arg) = match part.iter().position(|&b| b == b'=') {
                Some(i) => (part[..i].trim_ascii(), Some(part[i + 1..].trim_ascii())),
                None => (part, None),
            };
            if name.is_empty() || !name.iter().all(|&b| is_tchar(b)) {
                return None;
            }
            if name.eq_ignore_ascii_case(b"no-cache") {
                // `no-cache` takes no argument in a request.
                if arg.is_some() {
                    return None;
                }
                self.no_cache = true;
            } else if name.eq_ignore_ascii_case(b"no-store") {
                if arg.is_some() {
                    return None;
                }
                self.no_store = true;
            } else if name.eq_ignore_ascii_case(b"max-age") {
                set_once(&mut self.max_age, seconds(unquote(arg?)?)?)?;
            } else if name.eq_ignore_ascii_case(b"stale-if-error") {
                set_once(&mut self.stale_if_error, seconds(unquote(arg?)?)?)?;
            } else if let Some(arg) = arg {
                // Not ours: ignored, as long as its value is a token or a
                // whole quoted string.
                if arg.is_empty() || (arg.contains(&b'"') && !is_quoted(arg)) {
                    return None;
                }
            }
        }
        Some(())
    }
}

/// The elements of a comma-separated list, split on commas outside
/// quoted strings (RFC 9110 §5.6.4: `ext="a,b"` is one element; `\`
/// escapes the next character inside quotes). An unterminated quote
/// makes the last element `None` (malformed).
struct Elements<'a> {
    rest: &'a [u8],
    done: bool,
}

impl<'a> Elements<'a> {
    fn new(value: &'a [u8]) -> Self {
        Elements {
            rest: value,
            done: false,
        }
    }
}

impl<'a> Iterator for Elements<'a> {
    type Item = Option<&'a [u8]>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let (mut quoted, mut escaped) = (false, false);
        for (i, &b) in self.rest.iter().enumerate() {
            if quoted {
                match (escaped, b) {
                    (true, _) => escaped = false,
                    (false, b'\\') => escaped = true,
                    (false, b'"') => quoted = false,
                    _ => {}
                }
            } else if b == b'"' {
                quoted = true;
            } else if b == b',' {
                let element = &self.rest[..i];
                self.rest = &self.rest[i + 1..];
                return Some(Some(element));
            }
        }
        self.done = true;
        if quoted {
            return Some(None);
        }
        Some(Some(self.rest))
    }
}

/// `true` for one whole quoted string (escapes allowed inside).
fn is_quoted(arg: &[u8]) -> bool {
    let [b'"', inner @ .., b'"'] = arg else {
        return false;
    };
    let mut escaped = false;
    for &b in inner {
        match (escaped, b) {
            (true, _) => escaped = false,
            (false, b'\\') => escaped = true,
            (false, b'"') => return false,
            _ => {}
        }
    }
    !escaped
}

/// Sets `slot` to `value`, refusing a second, different value.
fn set_once(slot: &mut Option<Duration>, value: Duration) -> Option<()> {
    match slot {
        Some(old) if *old != value => None,
        _ => {
            *slot = Some(value);
            Some(())
        }
    }
}

/// delta-seconds: one or more digits, no sign, no fraction.
fn seconds(arg: &[u8]) -> Option<Duration> {
    if arg.is_empty() || !arg.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut n: u64 = 0;
    for &d in arg {
        n = n.saturating_mul(10).saturating_add(u64::from(d - b'0'));
    }
    Some(Duration::from_secs(n.min(MAX_DELTA_SECONDS)))
}

/// A quoted-string's content (RFC 9111 allows `max-age="5"` to be read),
/// or the token as it is. No escapes inside digits: a backslash is
/// malformed.
fn unquote(arg: &[u8]) -> Option<&[u8]> {
    match arg {
        [b'"', inner @ .., b'"'] if !inner.contains(&b'"') && !inner.contains(&b'\\') => {
            Some(inner)
        }
        _ if arg.contains(&b'"') => None,
        _ => Some(arg),
    }
}

/// A token character (RFC 9110 §5.6.2).
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn cc(v: &str) -> Option<CacheControl> {
        CacheControl::parse(v.as_bytes())
    }

    #[test]
    fn directives_are_read_case_insensitively_with_spaces_and_quotes() {
        let got = cc(" No-Cache ,NO-STORE,  Max-Age = \"30\" , stale-if-error=0,").unwrap();
        assert_eq!(
            got,
            CacheControl {
                no_cache: true,
                no_store: true,
                max_age: Some(Duration::from_secs(30)),
                stale_if_error: Some(Duration::ZERO),
            }
        );
    }

    #[test]
    fn malformed_or_contradictory_values_are_refused() {
        for bad in [
            "max-age",
            "max-age=",
            "max-age=-1",
            "max-age=1.5",
            "max-age=1 2",
            "max-age=\"1",
            "max-age=\"1\\2\"",
            "stale-if-error=ten",
            "max-age=5, max-age=6",
            "no-cache=\"x\"",
            "no-store=1",
            "max age=5",
            "=5",
            "max-age=5;",
        ] {
            assert_eq!(cc(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_repeated_directive_with_the_same_value_is_not_a_contradiction() {
        assert_eq!(
            cc("max-age=5, max-age=5").unwrap().max_age,
            Some(Duration::from_secs(5))
        );
    }

    #[test]
    fn a_comma_inside_a_quoted_value_does_not_split_the_list() {
        assert_eq!(
            cc(r#"no-store, ext="a,b", max-age=5"#),
            Some(CacheControl {
                no_store: true,
                max_age: Some(Duration::from_secs(5)),
                ..CacheControl::default()
            })
        );
        assert!(cc(r#"no-store, ext="a\"b,c""#).unwrap().no_store);
        assert_eq!(cc(r#"no-store, ext="open"#), None);
        assert_eq!(cc(r#"no-store, ext=a"b"#), None);
    }

    #[test]
    fn unknown_directives_are_ignored() {
        assert_eq!(
            cc("private, max-stale=10, community=\"UCI\", only-if-cached"),
            Some(CacheControl::default())
        );
    }

    #[test]
    fn huge_numbers_saturate_at_two_to_the_31_seconds() {
        let got = cc("max-age=99999999999999999999999999999999").unwrap();
        assert_eq!(got.max_age, Some(Duration::from_secs(1 << 31)));
    }

    #[test]
    fn several_headers_read_as_one_list_and_one_bad_header_voids_all() {
        let mut h = HeaderMap::new();
        h.append(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        h.append(CACHE_CONTROL, HeaderValue::from_static("max-age=9"));
        let got = CacheControl::from_headers(&h);
        assert!(got.no_cache);
        assert_eq!(got.max_age, Some(Duration::from_secs(9)));
        h.append(CACHE_CONTROL, HeaderValue::from_static("max-age=10"));
        assert_eq!(CacheControl::from_headers(&h), CacheControl::default());
    }

    #[test]
    fn a_value_that_is_not_ascii_is_ignored() {
        let mut h = HeaderMap::new();
        h.insert(
            CACHE_CONTROL,
            HeaderValue::from_bytes(b"max-age=5, caf\xe9").unwrap(),
        );
        assert_eq!(CacheControl::from_headers(&h), CacheControl::default());
    }

    #[test]
    fn reading_a_long_header_is_linear() {
        // 100,000 directives: read once each.
        let long = "no-cache, ".repeat(100_000);
        assert!(cc(&long).unwrap().no_cache);
    }
}
