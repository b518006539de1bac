//! Turning a call's result into success or a failure class.

use http::{HeaderMap, HeaderName, StatusCode};

use crate::{Classified, Failure, FailureClass};

/// The header providers use to say whether a failed request is worth
/// retrying (Anthropic, some OpenAI-compatible servers).
pub const X_SHOULD_RETRY: HeaderName = HeaderName::from_static("x-should-retry");

/// The verdict of a [`Classify`] implementation on one result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The call succeeded.
    Success {
        /// The HTTP status of the answer, when the call was HTTP.
        http_status: Option<StatusCode>,
    },
    /// The call failed.
    Failure(Classified),
}

impl Outcome {
    /// `true` for [`Outcome::Success`].
    pub fn is_success(&self) -> bool {
        matches!(self, Outcome::Success { .. })
    }

    /// The HTTP status in either case.
    pub fn http_status(&self) -> Option<StatusCode> {
        match self {
            Outcome::Success { http_status } => *http_status,
            Outcome::Failure(c) => c.http_status,
        }
    }
}

/// Maps one call's result to success or a failure class.
///
/// Every tower-llm layer takes a classifier, so the same layer works on
/// typed chat calls ([`ChatClassifier`]) and on raw HTTP calls
/// ([`HttpClassifier`]); implement it for your own request/response pair to
/// change what counts as a failure (for example, an HTTP 200 whose JSON body
/// holds an error).
///
/// ```
/// use http::StatusCode;
/// use tower_llm_core::{Classify, Failure, FailureClass, HttpClassifier, Outcome};
///
/// let res: Result<http::Response<()>, Failure> = Ok(http::Response::builder()
///     .status(503)
///     .header("x-should-retry", "false")
///     .body(())
///     .unwrap());
/// match HttpClassifier.classify(&res) {
///     Outcome::Failure(c) => {
///         assert_eq!(c.class, FailureClass::Transient);
///         assert_eq!(c.should_retry, Some(false));
///         assert_eq!(c.http_status, Some(StatusCode::SERVICE_UNAVAILABLE));
///     }
///     Outcome::Success { .. } => unreachable!(),
/// }
/// ```
pub trait Classify<Res, E> {
    /// Classifies `result`.
    fn classify(&self, result: &Result<Res, E>) -> Outcome;
}

impl<Res, E, F> Classify<Res, E> for F
where
    F: Fn(&Result<Res, E>) -> Outcome,
{
    fn classify(&self, result: &Result<Res, E>) -> Outcome {
        self(result)
    }
}

/// The default classifier for typed calls ([`ChatResponse`](crate::ChatResponse),
/// [`EmbeddingResponse`](crate::EmbeddingResponse), or any response type
/// whose failures are `Err`s): `Ok` is success with HTTP status 200, `Err`
/// is the [`Failure`]'s own classification.
///
/// A typed answer is a provider's successful HTTP answer, decoded: the
/// provider services turn every other status into an `Err`, and the chat,
/// message and converse endpoints answer 200. So a successful typed
/// attempt is recorded with `http_status: Some(200)` (seed 002 AC 1), the
/// same as a raw HTTP call answered 200.
#[derive(Debug, Clone, Copy, Default)]
pub struct ChatClassifier;

impl<Res> Classify<Res, Failure> for ChatClassifier {
    fn classify(&self, result: &Result<Res, Failure>) -> Outcome {
        match result {
            Ok(_) => Outcome::Success {
                http_status: Some(StatusCode::OK),
            },
            Err(f) => Outcome::Failure(f.classified()),
        }
    }
}

/// The default classifier for raw HTTP calls: the response's status and
/// headers decide (see [`classify_status`]); an `Err` is the [`Failure`]'s
/// own classification (a connect error, reset, timeout, ...).
#[derive(Debug, Clone, Copy, Default)]
pub struct HttpClassifier;

impl<B> Classify<http::Response<B>, Failure> for HttpClassifier {
    fn classify(&self, result: &Result<http::Response<B>, Failure>) -> Outcome {
        match result {
            Ok(res) => classify_status(res.status(), res.headers()),
            Err(f) => Outcome::Failure(f.classified()),
        }
    }
}

/// Classifies an HTTP answer by its status and headers.
///
/// | status | outcome |
/// |---|---|
/// | 1xx, 2xx, 3xx | success |
/// | 400 and any 4xx not below | [`BadRequest`](FailureClass::BadRequest) |
/// | 401, 403 | [`Auth`](FailureClass::Auth) |
/// | 402 | [`QuotaExhausted`](FailureClass::QuotaExhausted) |
/// | 404 | [`NotFound`](FailureClass::NotFound) |
/// | 408 | [`Timeout`](FailureClass::Timeout) |
/// | 409 | [`Conflict`](FailureClass::Conflict) (needs a re-read, not the same request again: not retried by default, although the OpenAI and Anthropic SDKs retry it) |
/// | 429 | [`RateLimited`](FailureClass::RateLimited) |
/// | 500–599 (incl. 529 overloaded) | [`Transient`](FailureClass::Transient) |
/// | 600–999 (not HTTP) | [`InvalidResponse`](FailureClass::InvalidResponse) |
///
/// On a failure, `retry_after` comes from [`retry_after`](crate::retry_after())
/// and `should_retry` from `x-should-retry` (`true`/`false`, any case;
/// anything else is ignored). Distinguishing OpenAI's `insufficient_quota`
/// 429 or a context-window 400 needs the body; provider services do that.
pub fn classify_status(status: StatusCode, headers: &HeaderMap) -> Outcome {
    let code = status.as_u16();
    let class = match code {
        100..=399 => {
            return Outcome::Success {
                http_status: Some(status),
            };
        }
        401 | 403 => FailureClass::Auth,
        402 => FailureClass::QuotaExhausted,
        404 => FailureClass::NotFound,
        408 => FailureClass::Timeout,
        409 => FailureClass::Conflict,
        429 => FailureClass::RateLimited,
        400..=499 => FailureClass::BadRequest,
        500..=599 => FailureClass::Transient,
        _ => FailureClass::InvalidResponse,
    };
    Outcome::Failure(Classified {
        class,
        retry_after: crate::retry_after(headers),
        should_retry: should_retry(headers),
        http_status: Some(status),
    })
}

/// Reads `x-should-retry: true|false` (case-insensitive, trimmed).
pub fn should_retry(headers: &HeaderMap) -> Option<bool> {
    let v = headers.get(X_SHOULD_RETRY)?.to_str().ok()?.trim();
    if v.eq_ignore_ascii_case("true") {
        Some(true)
    } else if v.eq_ignore_ascii_case("false") {
        Some(false)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{ChatResponse, FailurePolicy};

    fn class_of(code: u16) -> Option<FailureClass> {
        let status = StatusCode::from_u16(code).expect("valid status");
        match classify_status(status, &HeaderMap::new()) {
            Outcome::Success { http_status } => {
                assert_eq!(http_status, Some(status));
                None
            }
            Outcome::Failure(c) => {
                assert_eq!(c.http_status, Some(status));
                Some(c.class)
            }
        }
    }

    #[test]
    fn every_status_code_has_a_class() {
        use FailureClass::*;
        for code in 100..=999u16 {
            let expected = match code {
                100..=399 => None,
                401 | 403 => Some(Auth),
                402 => Some(QuotaExhausted),
                404 => Some(NotFound),
                408 => Some(Timeout),
                409 => Some(Conflict),
                429 => Some(RateLimited),
                400..=499 => Some(BadRequest),
                500..=599 => Some(Transient),
                _ => Some(InvalidResponse),
            };
            assert_eq!(class_of(code), expected, "status {code}");
        }
    }

    #[test]
    fn seed_terminal_statuses_neither_retry_nor_fail_over() {
        let p = FailurePolicy::default();
        for code in [400, 401, 403, 404, 409] {
            let class = class_of(code).expect("failure");
            let d = p.get(class);
            assert!(!d.retry && !d.failover && !d.trip_breaker, "status {code}");
        }
        for code in [429, 500, 502, 503, 504, 529] {
            let class = class_of(code).expect("failure");
            let d = p.get(class);
            assert!(d.retry && d.failover && d.trip_breaker, "status {code}");
        }
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().expect("header value"));
        }
        h
    }

    fn classified(code: u16, h: &HeaderMap) -> Classified {
        match classify_status(StatusCode::from_u16(code).expect("status"), h) {
            Outcome::Failure(c) => c,
            Outcome::Success { .. } => panic!("{code} classified as success"),
        }
    }

    #[test]
    fn retry_after_forms() {
        let c = classified(429, &headers(&[("retry-after", "5")]));
        assert_eq!(c.class, FailureClass::RateLimited);
        assert_eq!(c.retry_after, Some(Duration::from_secs(5)));

        let c = classified(429, &headers(&[("retry-after-ms", "1500")]));
        assert_eq!(c.retry_after, Some(Duration::from_millis(1500)));

        // An HTTP-date in the past is "retry now".
        let c = classified(
            503,
            &headers(&[("retry-after", "Wed, 21 Oct 2015 07:28:00 GMT")]),
        );
        assert_eq!(c.retry_after, Some(Duration::ZERO));

        for garbage in ["-1", "soon", "1e9", ""] {
            let c = classified(429, &headers(&[("retry-after", garbage)]));
            assert_eq!(c.retry_after, None, "{garbage:?}");
        }
        let c = classified(
            429,
            &headers(&[("retry-after", "99999999999999999999999999")]),
        );
        assert_eq!(c.retry_after, Some(crate::MAX_RETRY_AFTER));
    }

    #[test]
    fn x_should_retry_false_on_503_vetoes_retry_only() {
        let c = classified(503, &headers(&[("x-should-retry", "false")]));
        assert_eq!(c.class, FailureClass::Transient);
        assert_eq!(c.should_retry, Some(false));
        let d = FailurePolicy::default().disposition(&c);
        assert!(!d.retry);
        assert!(d.failover);
        assert!(d.trip_breaker);
    }

    #[test]
    fn x_should_retry_true_never_makes_a_400_retryable() {
        let c = classified(400, &headers(&[("x-should-retry", "TRUE")]));
        assert_eq!(c.should_retry, Some(true));
        assert!(!FailurePolicy::default().disposition(&c).retry);
        let c = classified(503, &headers(&[("x-should-retry", "maybe")]));
        assert_eq!(c.should_retry, None);
    }

    #[test]
    fn fixture_headers_from_providers() {
        // shared/fixtures/anthropic/error_rate_limit_429.headers (subset)
        let h = headers(&[("retry-after", "12"), ("x-should-retry", "true")]);
        let c = classified(429, &h);
        assert_eq!(c.retry_after, Some(Duration::from_secs(12)));
        assert_eq!(c.should_retry, Some(true));
        assert!(FailurePolicy::default().disposition(&c).retry);
        // shared/fixtures/openai/error_rate_limit.headers (subset)
        let h = headers(&[
            ("retry-after", "10"),
            ("x-ratelimit-reset-tokens", "9.816s"),
        ]);
        assert_eq!(
            classified(429, &h).retry_after,
            Some(Duration::from_secs(10))
        );
    }

    #[test]
    fn classifiers_pass_failures_through() {
        let err: Result<ChatResponse, Failure> = Err(
            Failure::new(FailureClass::QuotaExhausted).with_retry_after(Duration::from_secs(3))
        );
        match ChatClassifier.classify(&err) {
            Outcome::Failure(c) => {
                assert_eq!(c.class, FailureClass::QuotaExhausted);
                assert_eq!(c.retry_after, Some(Duration::from_secs(3)));
            }
            Outcome::Success { .. } => panic!("success"),
        }
        let err: Result<http::Response<()>, Failure> = Err(Failure::new(FailureClass::Timeout));
        assert_eq!(
            HttpClassifier.classify(&err),
            Outcome::Failure(Classified::new(FailureClass::Timeout))
        );
    }

    #[test]
    fn closures_are_classifiers() {
        let always_ok = |_: &Result<u8, Failure>| Outcome::Success { http_status: None };
        assert!(
            always_ok
                .classify(&Err(Failure::deadline_exceeded()))
                .is_success()
        );
    }
}
