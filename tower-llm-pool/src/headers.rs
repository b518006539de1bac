//! [`RateLimitHeaders`]: what a provider's answer says of its rate limits.
//!
//! Two families of headers are read:
//!
//! - OpenAI and Azure OpenAI: `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`,
//!   the resets as Go-style durations (`120ms`, `9.816s`, `1m30s`, `6m0s`).
//! - Anthropic: `anthropic-ratelimit-{requests,tokens}-{limit,remaining,reset}`,
//!   the resets as RFC 3339 timestamps. Without the `-tokens-*` headers,
//!   the `-input-tokens-*` and `-output-tokens-*` ones are added up.
//!
//! Headers are not trusted: a value that is not ASCII, not a number (or
//! duration, or timestamp), negative, or absurd (a count over
//! [`MAX_HEADER_COUNT`]) is ignored, and a reset further away than
//! [`MAX_HEADER_WAIT`] is cut to it. What was wrong is kept in
//! [`RateLimitHeaders::issues`].

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderMap, HeaderValue};

/// The longest wait any header (or [`Pacer::hold_off`](crate::Pacer::hold_off))
/// can impose: a reset or hold-off further away is cut to this.
pub const MAX_HEADER_WAIT: Duration = Duration::from_secs(60);

/// The largest limit or remaining count a header may state; a larger one
/// is taken for a lie and ignored.
pub const MAX_HEADER_COUNT: u64 = 1_000_000_000;

/// A kind of rate-limit header that was not believed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum HeaderIssue {
    /// A value that is not visible ASCII: ignored.
    NonAscii,
    /// A value that is not a count, duration or timestamp: ignored.
    Malformed,
    /// A negative value: ignored.
    Negative,
    /// A count over [`MAX_HEADER_COUNT`], or a limit of zero: ignored.
    Absurd,
    /// A reset further away than [`MAX_HEADER_WAIT`]: cut to it.
    ResetTooFar,
    /// A hold-off ([`Pacer::hold_off`](crate::Pacer::hold_off)) longer than
    /// [`MAX_HEADER_WAIT`]: cut to it.
    HoldOffTooLong,
}

impl HeaderIssue {
    /// Every kind, in order.
    pub const ALL: [HeaderIssue; 6] = [
        HeaderIssue::NonAscii,
        HeaderIssue::Malformed,
        HeaderIssue::Negative,
        HeaderIssue::Absurd,
        HeaderIssue::ResetTooFar,
        HeaderIssue::HoldOffTooLong,
    ];

    const fn index(self) -> usize {
        match self {
            HeaderIssue::NonAscii => 0,
            HeaderIssue::Malformed => 1,
            HeaderIssue::Negative => 2,
            HeaderIssue::Absurd => 3,
            HeaderIssue::ResetTooFar => 4,
            HeaderIssue::HoldOffTooLong => 5,
        }
    }

    pub(crate) const fn bit(self) -> u8 {
        1 << self.index()
    }

    /// What was wrong, and what was done about it.
    pub fn describe(self) -> &'static str {
        match self {
            HeaderIssue::NonAscii => "a rate-limit header value is not ASCII; ignored",
            HeaderIssue::Malformed => "a rate-limit header value does not parse; ignored",
            HeaderIssue::Negative => "a rate-limit header value is negative; ignored",
            HeaderIssue::Absurd => {
                "a rate-limit header count is absurd (zero limit or over 10^9); ignored"
            }
            HeaderIssue::ResetTooFar => {
                "a rate-limit reset is further than the cap; cut to the cap"
            }
            HeaderIssue::HoldOffTooLong => "a hold-off is longer than the cap; cut to the cap",
        }
    }
}

/// A set of [`HeaderIssue`]s.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HeaderIssues(u8);

impl HeaderIssues {
    /// No issue.
    pub const NONE: HeaderIssues = HeaderIssues(0);

    /// `true` when `issue` is in the set.
    pub fn contains(self, issue: HeaderIssue) -> bool {
        self.0 & issue.bit() != 0
    }

    /// Adds `issue`.
    pub fn insert(&mut self, issue: HeaderIssue) {
        self.0 |= issue.bit();
    }

    /// `true` when there is no issue.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The issues in the set, in [`HeaderIssue::ALL`] order.
    pub fn iter(self) -> impl Iterator<Item = HeaderIssue> {
        HeaderIssue::ALL
            .into_iter()
            .filter(move |i| self.contains(*i))
    }

    pub(crate) fn from_bits(bits: u8) -> Self {
        HeaderIssues(bits)
    }
}

/// What headers say of one limit (requests, or tokens): each part only
/// when a header stated it and was believed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LimitHeaders {
    /// The limit per minute (the provider's bucket's capacity).
    pub limit: Option<u64>,
    /// What is left of it now.
    pub remaining: Option<u64>,
    /// How long until the bucket is full again (at most
    /// [`MAX_HEADER_WAIT`]; a reset in the past is zero).
    pub reset: Option<Duration>,
}

impl LimitHeaders {
    /// `true` when no part was stated.
    pub fn is_empty(&self) -> bool {
        self.limit.is_none() && self.remaining.is_none() && self.reset.is_none()
    }
}

/// What a provider's answer says of its rate limits.
///
/// ```
/// use std::time::Duration;
/// use http::HeaderMap;
/// use tower_llm_pool::RateLimitHeaders;
///
/// let mut headers = HeaderMap::new();
/// headers.insert("x-ratelimit-limit-tokens", "10000".parse().unwrap());
/// headers.insert("x-ratelimit-remaining-tokens", "1446".parse().unwrap());
/// headers.insert("x-ratelimit-reset-tokens", "9.816s".parse().unwrap());
/// headers.insert("x-ratelimit-remaining-requests", "-3".parse().unwrap());
/// let seen = RateLimitHeaders::parse(&headers);
/// assert_eq!(seen.tokens.limit, Some(10_000));
/// assert_eq!(seen.tokens.remaining, Some(1_446));
/// assert_eq!(seen.tokens.reset, Some(Duration::from_millis(9_816)));
/// // A negative count is a lie: ignored, and noted.
/// assert_eq!(seen.requests.remaining, None);
/// assert!(seen.issues.contains(tower_llm_pool::HeaderIssue::Negative));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RateLimitHeaders {
    /// The request limit.
    pub requests: LimitHeaders,
    /// The token limit (input and output).
    pub tokens: LimitHeaders,
    /// What was not believed.
    pub issues: HeaderIssues,
    /// The first header of each kind of issue (by [`HeaderIssue`] index).
    issue_headers: [Option<&'static str>; 6],
}

const OPENAI_PREFIX: &str = "x-ratelimit-";
const ANTHROPIC_PREFIX: &str = "anthropic-ratelimit-";

/// The names of one limit's three headers.
struct Names {
    limit: &'static str,
    remaining: &'static str,
    reset: &'static str,
}

const OPENAI_REQUESTS: Names = Names {
    limit: "x-ratelimit-limit-requests",
    remaining: "x-ratelimit-remaining-requests",
    reset: "x-ratelimit-reset-requests",
};
const OPENAI_TOKENS: Names = Names {
    limit: "x-ratelimit-limit-tokens",
    remaining: "x-ratelimit-remaining-tokens",
    reset: "x-ratelimit-reset-tokens",
};
const ANTHROPIC_REQUESTS: Names = Names {
    limit: "anthropic-ratelimit-requests-limit",
    remaining: "anthropic-ratelimit-requests-remaining",
    reset: "anthropic-ratelimit-requests-reset",
};
const ANTHROPIC_TOKENS: Names = Names {
    limit: "anthropic-ratelimit-tokens-limit",
    remaining: "anthropic-ratelimit-tokens-remaining",
    reset: "anthropic-ratelimit-tokens-reset",
};
const ANTHROPIC_INPUT: Names = Names {
    limit: "anthropic-ratelimit-input-tokens-limit",
    remaining: "anthropic-ratelimit-input-tokens-remaining",
    reset: "anthropic-ratelimit-input-tokens-reset",
};
const ANTHROPIC_OUTPUT: Names = Names {
    limit: "anthropic-ratelimit-output-tokens-limit",
    remaining: "anthropic-ratelimit-output-tokens-remaining",
    reset: "anthropic-ratelimit-output-tokens-reset",
};

/// How a family states its resets.
#[derive(Clone, Copy)]
enum ResetFormat {
    /// A Go-style duration (OpenAI).
    Duration,
    /// An RFC 3339 timestamp (Anthropic).
    Timestamp,
}

impl RateLimitHeaders {
    /// Reads `headers`, measuring RFC 3339 resets against the system clock.
    pub fn parse(headers: &HeaderMap) -> Self {
        Self::parse_at(headers, SystemTime::now)
    }

    /// Like [`parse`](Self::parse), with the clock for RFC 3339 resets
    /// given explicitly (read at most once, only when such a reset is
    /// present).
    pub fn parse_at(headers: &HeaderMap, now: impl FnOnce() -> SystemTime) -> Self {
        let mut seen = RateLimitHeaders::default();
        // One pass over the names: most answers carry no rate-limit header.
        let (mut openai, mut anthropic) = (false, false);
        for name in headers.keys() {
            let name = name.as_str();
            openai |= name.starts_with(OPENAI_PREFIX);
            anthropic |= name.starts_with(ANTHROPIC_PREFIX);
        }
        if !openai && !anthropic {
            return seen;
        }
        let mut clock = Clock {
            now: Some(now),
            read: None,
        };
        if openai {
            seen.requests = seen.read(headers, &OPENAI_REQUESTS, ResetFormat::Duration, &mut clock);
            seen.tokens = seen.read(headers, &OPENAI_TOKENS, ResetFormat::Duration, &mut clock);
        }
        if anthropic {
            let requests = seen.read(
                headers,
                &ANTHROPIC_REQUESTS,
                ResetFormat::Timestamp,
                &mut clock,
            );
            seen.requests = fill(seen.requests, requests);
            let mut tokens = seen.read(
                headers,
                &ANTHROPIC_TOKENS,
                ResetFormat::Timestamp,
                &mut clock,
            );
            if tokens.is_empty() {
                let input = seen.read(
                    headers,
                    &ANTHROPIC_INPUT,
                    ResetFormat::Timestamp,
                    &mut clock,
                );
                let output = seen.read(
                    headers,
                    &ANTHROPIC_OUTPUT,
                    ResetFormat::Timestamp,
                    &mut clock,
                );
                tokens = combine(input, output);
            }
            seen.tokens = fill(seen.tokens, tokens);
        }
        seen
    }

    /// `true` when no header stated anything (issues aside).
    pub fn is_empty(&self) -> bool {
        self.requests.is_empty() && self.tokens.is_empty()
    }

    /// The first header found with `issue`, if any.
    pub fn issue_header(&self, issue: HeaderIssue) -> Option<&'static str> {
        self.issue_headers[issue.index()]
    }

    pub(crate) fn note(&mut self, issue: HeaderIssue, header: &'static str) {
        if !self.issues.contains(issue) {
            self.issues.insert(issue);
            self.issue_headers[issue.index()] = Some(header);
        }
    }

    fn read<F: FnOnce() -> SystemTime>(
        &mut self,
        headers: &HeaderMap,
        names: &Names,
        format: ResetFormat,
        clock: &mut Clock<F>,
    ) -> LimitHeaders {
        let limit = headers
            .get(names.limit)
            .and_then(|v| self.believe(names.limit, parse_count(v)))
            .filter(|limit| {
                // A limit of zero would make a bucket that never holds a
                // request: no provider means that.
                *limit > 0 || {
                    self.note(HeaderIssue::Absurd, names.limit);
                    false
                }
            });
        let remaining = headers
            .get(names.remaining)
            .and_then(|v| self.believe(names.remaining, parse_count(v)));
        let reset = headers.get(names.reset).and_then(|v| {
            let parsed = match format {
                ResetFormat::Duration => parse_go_duration(v),
                ResetFormat::Timestamp => parse_rfc3339(v).map(|at| clock.until(at)),
            };
            let wait = self.believe(names.reset, parsed)?;
            if wait > MAX_HEADER_WAIT {
                self.note(HeaderIssue::ResetTooFar, names.reset);
                Some(MAX_HEADER_WAIT)
            } else {
                Some(wait)
            }
        });
        LimitHeaders {
            limit,
            remaining,
            reset,
        }
    }

    fn believe<T>(&mut self, name: &'static str, parsed: Result<T, HeaderIssue>) -> Option<T> {
        match parsed {
            Ok(v) => Some(v),
            Err(issue) => {
                self.note(issue, name);
                None
            }
        }
    }
}

/// The clock, read once when first needed.
struct Clock<F> {
    now: Option<F>,
    read: Option<SystemTime>,
}

impl<F: FnOnce() -> SystemTime> Clock<F> {
    /// How long from now until `at` (zero when `at` has passed).
    fn until(&mut self, at: Timestamp) -> Duration {
        let now = match self.read {
            Some(now) => now,
            None => {
                let now = self.now.take().map_or(UNIX_EPOCH, |f| f());
                self.read = Some(now);
                now
            }
        };
        let now_ns: i128 = match now.duration_since(UNIX_EPOCH) {
            Ok(d) => i128::try_from(d.as_nanos()).unwrap_or(i128::MAX),
            Err(e) => -i128::try_from(e.duration().as_nanos()).unwrap_or(i128::MAX),
        };
        let wait = at.unix_ns.saturating_sub(now_ns);
        if wait <= 0 {
            Duration::ZERO
        } else {
            // Anything past u64 nanoseconds (584 years) is past the cap anyway.
            Duration::from_nanos(u64::try_from(wait).unwrap_or(u64::MAX))
        }
    }
}

/// `first`, its missing parts taken from `second`.
fn fill(first: LimitHeaders, second: LimitHeaders) -> LimitHeaders {
    LimitHeaders {
        limit: first.limit.or(second.limit),
        remaining: first.remaining.or(second.remaining),
        reset: first.reset.or(second.reset),
    }
}

/// Anthropic's input and output token limits as one: limits and
/// remainings added up (both needed), except that one exhausted side
/// leaves nothing (no request can be served), until its reset.
fn combine(input: LimitHeaders, output: LimitHeaders) -> LimitHeaders {
    let both = |a: Option<u64>, b: Option<u64>| Some(a? + b?);
    let later = |a: Option<Duration>, b: Option<Duration>| match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    };
    let exhausted = [input, output]
        .into_iter()
        .filter(|side| side.remaining == Some(0))
        .map(|side| side.reset)
        .reduce(later);
    match exhausted {
        Some(reset) => LimitHeaders {
            limit: both(input.limit, output.limit),
            remaining: Some(0),
            reset,
        },
        None => LimitHeaders {
            limit: both(input.limit, output.limit),
            remaining: both(input.remaining, output.remaining),
            reset: later(input.reset, output.reset),
        },
    }
}

/// The value's text, trimmed; non-ASCII is refused.
fn text(value: &HeaderValue) -> Result<&str, HeaderIssue> {
    let text = value.to_str().map_err(|_| HeaderIssue::NonAscii)?.trim();
    if text.is_empty() {
        return Err(HeaderIssue::Malformed);
    }
    if text.starts_with('-') {
        return Err(HeaderIssue::Negative);
    }
    Ok(text)
}

/// A count: decimal digits, at most [`MAX_HEADER_COUNT`].
fn parse_count(value: &HeaderValue) -> Result<u64, HeaderIssue> {
    let text = text(value)?;
    if !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(HeaderIssue::Malformed);
    }
    let mut n: u64 = 0;
    for b in text.bytes() {
        n = n * 10 + u64::from(b - b'0');
        if n > MAX_HEADER_COUNT {
            return Err(HeaderIssue::Absurd);
        }
    }
    Ok(n)
}

/// A Go-style duration, as OpenAI sends its resets: one or more
/// `<decimal><unit>` (units `h`, `m`, `s`, `ms`, `us`, `ns`), or a bare
/// `0`. Very long ones saturate (the caller caps them).
fn parse_go_duration(value: &HeaderValue) -> Result<Duration, HeaderIssue> {
    let text = text(value)?;
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let mut rest = text.as_bytes();
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let digits = rest
            .iter()
            .position(|b| !(b.is_ascii_digit() || *b == b'.'))
            .ok_or(HeaderIssue::Malformed)?;
        let (number, tail) = rest.split_at(digits);
        let units = tail
            .iter()
            .position(|b| b.is_ascii_digit() || *b == b'.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(units);
        let unit_ns: u128 = match unit {
            b"h" => 3_600_000_000_000,
            b"m" => 60_000_000_000,
            b"s" => 1_000_000_000,
            b"ms" => 1_000_000,
            b"us" => 1_000,
            b"ns" => 1,
            _ => return Err(HeaderIssue::Malformed),
        };
        total = total.saturating_add(decimal_ns(number, unit_ns)?);
        rest = tail;
    }
    // Saturates at u64 nanoseconds (the caller cuts to the cap).
    Ok(Duration::from_nanos(
        u64::try_from(total).unwrap_or(u64::MAX),
    ))
}

/// `digits[.digits]` (at least one digit) in `unit_ns` nanoseconds,
/// saturating.
fn decimal_ns(number: &[u8], unit_ns: u128) -> Result<u128, HeaderIssue> {
    let text = std::str::from_utf8(number).map_err(|_| HeaderIssue::Malformed)?;
    let (int, frac) = text.split_once('.').unwrap_or((text, ""));
    if (int.is_empty() && frac.is_empty()) || frac.contains('.') {
        return Err(HeaderIssue::Malformed);
    }
    let mut whole: u128 = 0;
    for b in int.bytes() {
        whole = whole
            .saturating_mul(10)
            .saturating_add(u128::from(b - b'0'));
    }
    let mut scale = unit_ns;
    let mut frac_ns: u128 = 0;
    for b in frac.bytes() {
        scale /= 10;
        frac_ns += u128::from(b - b'0') * scale;
    }
    Ok(whole.saturating_mul(unit_ns).saturating_add(frac_ns))
}

/// An instant as nanoseconds since the Unix epoch.
#[derive(Clone, Copy)]
struct Timestamp {
    unix_ns: i128,
}

/// An RFC 3339 timestamp: `YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM)`
/// (`t`, `z` and a space separator accepted too).
fn parse_rfc3339(value: &HeaderValue) -> Result<Timestamp, HeaderIssue> {
    let text = text(value)?;
    let b = text.as_bytes();
    let bad = HeaderIssue::Malformed;
    if b.len() < 20 {
        return Err(bad);
    }
    let num = |range: std::ops::Range<usize>| -> Result<i64, HeaderIssue> {
        let part = &b[range];
        if !part.iter().all(u8::is_ascii_digit) {
            return Err(HeaderIssue::Malformed);
        }
        Ok(part.iter().fold(0i64, |n, d| n * 10 + i64::from(d - b'0')))
    };
    if b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b't' | b' ')
        || b[13] != b':'
        || b[16] != b':'
    {
        return Err(bad);
    }
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&month)
        || day < 1
        || day > days_in_month(year, month)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return Err(bad);
    }
    let mut at = 19;
    let mut frac_ns: i128 = 0;
    if b[at] == b'.' {
        at += 1;
        let start = at;
        let mut scale: i128 = 1_000_000_000;
        while at < b.len() && b[at].is_ascii_digit() {
            scale /= 10;
            frac_ns += i128::from(b[at] - b'0') * scale;
            at += 1;
        }
        if at == start {
            return Err(bad);
        }
    }
    let offset_s: i64 = match &b[at..] {
        [b'Z' | b'z'] => 0,
        [sign @ (b'+' | b'-'), h1, h2, b':', m1, m2] => {
            let digits = [*h1, *h2, *m1, *m2];
            if !digits.iter().all(u8::is_ascii_digit) {
                return Err(bad);
            }
            let d = |i: usize| i64::from(digits[i] - b'0');
            let (h, m) = (d(0) * 10 + d(1), d(2) * 10 + d(3));
            if h > 23 || m > 59 {
                return Err(bad);
            }
            let s = h * 3600 + m * 60;
            if *sign == b'+' { s } else { -s }
        }
        _ => return Err(bad),
    };
    let days = days_from_civil(year, month, day);
    let secs = days * 86_400 + hour * 3_600 + minute * 60 + second - offset_s;
    Ok(Timestamp {
        unix_ns: i128::from(secs) * 1_000_000_000 + frac_ns,
    })
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's
/// algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> HeaderValue {
        HeaderValue::from_str(s).unwrap()
    }

    #[test]
    fn go_durations() {
        let ok = |s: &str| parse_go_duration(&v(s));
        assert_eq!(ok("120ms"), Ok(Duration::from_millis(120)));
        assert_eq!(ok("9.816s"), Ok(Duration::from_millis(9_816)));
        assert_eq!(ok("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(ok("6m0s"), Ok(Duration::from_secs(360)));
        assert_eq!(ok("1h2m3.5s"), Ok(Duration::from_millis(3_723_500)));
        assert_eq!(ok("0"), Ok(Duration::ZERO));
        assert_eq!(ok("0s"), Ok(Duration::ZERO));
        assert_eq!(ok("15us"), Ok(Duration::from_micros(15)));
        assert_eq!(ok("7ns"), Ok(Duration::from_nanos(7)));
        assert_eq!(ok(".5s"), Ok(Duration::from_millis(500)));
        assert_eq!(
            ok(&format!("{}h", "9".repeat(60))),
            Ok(Duration::from_nanos(u64::MAX))
        );
        for bad in ["s", "5", "5x", "1.2.3s", "1e3s", "ms5", "5 s", "+5s", "."] {
            assert_eq!(ok(bad), Err(HeaderIssue::Malformed), "{bad}");
        }
        assert_eq!(ok("-1s"), Err(HeaderIssue::Negative));
    }

    #[test]
    fn timestamps() {
        let ts = |s: &str| parse_rfc3339(&v(s)).map(|t| t.unix_ns);
        assert_eq!(ts("1970-01-01T00:00:00Z"), Ok(0));
        assert_eq!(
            ts("2026-02-25T20:02:44Z"),
            Ok(1_772_049_764 * 1_000_000_000)
        );
        assert_eq!(
            ts("2026-02-25T21:02:44.5+01:00"),
            Ok(1_772_049_764 * 1_000_000_000 + 500_000_000)
        );
        assert_eq!(
            ts("2024-02-29t00:00:00z"),
            Ok(1_709_164_800 * 1_000_000_000)
        );
        for bad in [
            "2023-02-29T00:00:00Z",
            "2026-13-01T00:00:00Z",
            "2026-02-25T24:00:00Z",
            "2026-02-25T20:02:44",
            "2026-02-25T20:02:44+1:00",
            "2026-02-25T20:02:44.Z",
            "2026/02/25T20:02:44Z",
            "Wed, 25 Feb 2026 20:02:44 GMT",
        ] {
            assert_eq!(ts(bad), Err(HeaderIssue::Malformed), "{bad}");
        }
    }

    #[test]
    fn counts() {
        assert_eq!(parse_count(&v("1446")), Ok(1446));
        assert_eq!(parse_count(&v(" 0 ")), Ok(0));
        assert_eq!(parse_count(&v("1000000000")), Ok(MAX_HEADER_COUNT));
        assert_eq!(parse_count(&v("1000000001")), Err(HeaderIssue::Absurd));
        assert_eq!(parse_count(&v(&"9".repeat(50))), Err(HeaderIssue::Absurd));
        assert_eq!(parse_count(&v("-1")), Err(HeaderIssue::Negative));
        assert_eq!(parse_count(&v("1.5")), Err(HeaderIssue::Malformed));
        assert_eq!(parse_count(&v("")), Err(HeaderIssue::Malformed));
        let non_ascii = HeaderValue::from_bytes(b"12\xc2\xb5").unwrap();
        assert_eq!(parse_count(&non_ascii), Err(HeaderIssue::NonAscii));
    }
}
