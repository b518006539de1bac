//! The one structured error every tower-llm layer and provider returns.

use std::borrow::Cow;
use std::error::Error as StdError;
use std::fmt;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;

use crate::{AttemptRecord, Classified, FailureClass};

/// The message of [`Failure::attempts_cap_exceeded`].
const ATTEMPTS_CAP_EXCEEDED: &str =
    "attempts cap exceeded (16); programmer error in the retry or fallback chain";

/// A type-erased error, as used by `tower` (`Box<dyn Error + Send + Sync>`).
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// Why a call through tower-llm failed.
///
/// An opaque struct in the style of `hyper::Error`: ask it questions with the
/// `is_*()` predicates and getters rather than matching on its internals.
/// It carries its [`FailureClass`], an optional `retry_after` hint, the
/// provider, model and HTTP status it came from, a human message, the
/// underlying source error, and (when returned by the outermost layer) the
/// per-call [attempt log](crate::AttemptLog).
///
/// ```
/// use std::time::Duration;
/// use http::StatusCode;
/// use tower_llm_core::{Failure, FailureClass};
///
/// let err = Failure::new(FailureClass::RateLimited)
///     .with_status(StatusCode::TOO_MANY_REQUESTS)
///     .with_retry_after(Duration::from_secs(5))
///     .with_provider("openai");
/// assert!(err.is_rate_limited());
/// assert_eq!(err.retry_after(), Some(Duration::from_secs(5)));
/// assert_eq!(err.http_status(), Some(StatusCode::TOO_MANY_REQUESTS));
/// assert_eq!(
///     err.to_string(),
///     "rate limited (provider openai, HTTP 429, retry after 5000 ms)"
/// );
/// ```
pub struct Failure {
    inner: Box<Inner>,
}

struct Inner {
    class: FailureClass,
    retry_after: Option<Duration>,
    should_retry: Option<bool>,
    status: Option<StatusCode>,
    provider: Option<Arc<str>>,
    model: Option<Arc<str>>,
    message: Option<Cow<'static, str>>,
    source: Option<BoxError>,
    attempts: Vec<AttemptRecord>,
    all_links_failed: bool,
    /// Made by [`Failure::attempts_cap_exceeded`] (a flag, so that no
    /// upstream text can pass for it).
    attempts_cap: bool,
}

impl Failure {
    /// A failure of the given class with nothing else attached.
    pub fn new(class: FailureClass) -> Self {
        Failure {
            inner: Box::new(Inner {
                class,
                retry_after: None,
                should_retry: None,
                status: None,
                provider: None,
                model: None,
                message: None,
                source: None,
                attempts: Vec::new(),
                all_links_failed: false,
                attempts_cap: false,
            }),
        }
    }

    /// The failure returned when a call's deadline passes.
    pub fn deadline_exceeded() -> Self {
        Failure::new(FailureClass::DeadlineExceeded)
    }

    /// The failure a circuit breaker returns while open; `retry_after` is the
    /// rest of the cooldown.
    pub fn circuit_open(retry_after: Option<Duration>) -> Self {
        let mut f = Failure::new(FailureClass::CircuitOpen);
        f.inner.retry_after = retry_after;
        f
    }

    /// The failure returned when the [attempt log](crate::AttemptLog) is full:
    /// an invalid-response failure reading "attempts cap exceeded".
    pub fn attempts_cap_exceeded() -> Self {
        let mut f = Failure::new(FailureClass::InvalidResponse).with_message(ATTEMPTS_CAP_EXCEEDED);
        f.inner.attempts_cap = true;
        f
    }

    /// `true` for the failure made by [`attempts_cap_exceeded`](Self::attempts_cap_exceeded):
    /// a call refused a 17th attempt (logged at `severity = "sev-2"` when
    /// the call ends).
    pub fn is_attempts_cap_exceeded(&self) -> bool {
        self.inner.attempts_cap
    }

    /// A failure built from a classification (as returned by a
    /// [`Classify`](crate::Classify) implementation).
    pub fn from_classified(c: Classified) -> Self {
        let mut f = Failure::new(c.class);
        f.inner.retry_after = c.retry_after;
        f.inner.should_retry = c.should_retry;
        f.inner.status = c.http_status;
        f
    }

    /// Turns any error into a `Failure`.
    ///
    /// If `err` is a `Failure`, it is returned as is. Otherwise it is
    /// classified by what it is: an
    /// [`io::Error`] anywhere in its source chain of kind `TimedOut` is a
    /// [`Timeout`](FailureClass::Timeout); any other transport error
    /// (connection refused or reset, broken pipe, unexpected EOF, or an
    /// error we do not recognise) is [`Transient`](FailureClass::Transient).
    /// The original error is kept as the source.
    pub fn from_error(err: BoxError) -> Self {
        match err.downcast::<Failure>() {
            Ok(f) => *f,
            Err(err) => {
                let class = if io_kind(&*err) == Some(io::ErrorKind::TimedOut) {
                    FailureClass::Timeout
                } else {
                    FailureClass::Transient
                };
                Failure::new(class).with_source(err)
            }
        }
    }

    /// An inner service's error as a `Failure`: a `Failure` is returned as
    /// is (without the boxing that `from_error(e.into())` costs, which a
    /// failure crossing each layer of a stack would pay again at every
    /// layer); any other error goes through [`from_error`](Self::from_error).
    ///
    /// ```
    /// use tower_llm_core::{Failure, FailureClass};
    ///
    /// let f = Failure::from_inner(Failure::new(FailureClass::RateLimited));
    /// assert!(f.is_rate_limited());
    /// let io = std::io::Error::new(std::io::ErrorKind::TimedOut, "slow");
    /// assert!(Failure::from_inner(io).is_timeout());
    /// ```
    pub fn from_inner<E>(err: E) -> Self
    where
        E: Into<BoxError> + 'static,
    {
        let mut slot = Some(err);
        if let Some(failure) = (&mut slot as &mut dyn std::any::Any)
            .downcast_mut::<Option<Failure>>()
            .and_then(Option::take)
        {
            return failure;
        }
        match slot {
            Some(err) => Failure::from_error(err.into()),
            // Unreachable: the slot is taken only when it held a Failure.
            None => Failure::new(FailureClass::Transient),
        }
    }

    /// Sets the `retry_after` hint (for example from a `Retry-After` header).
    #[must_use]
    pub fn with_retry_after(mut self, retry_after: Duration) -> Self {
        self.inner.retry_after = Some(retry_after);
        self
    }

    /// Records the provider's own retry advice (`x-should-retry`).
    #[must_use]
    pub fn with_should_retry(mut self, should_retry: bool) -> Self {
        self.inner.should_retry = Some(should_retry);
        self
    }

    /// Sets the HTTP status the provider answered with.
    #[must_use]
    pub fn with_status(mut self, status: StatusCode) -> Self {
        self.inner.status = Some(status);
        self
    }

    /// Sets the provider name (for example `"openai"`).
    #[must_use]
    pub fn with_provider(mut self, provider: impl Into<Arc<str>>) -> Self {
        self.inner.provider = Some(provider.into());
        self
    }

    /// Sets the model id.
    #[must_use]
    pub fn with_model(mut self, model: impl Into<Arc<str>>) -> Self {
        self.inner.model = Some(model.into());
        self
    }

    /// Sets a human-readable message (for example the provider's own error
    /// message). Never put secrets here: it is shown by `Display`.
    #[must_use]
    pub fn with_message(mut self, message: impl Into<Cow<'static, str>>) -> Self {
        self.inner.message = Some(message.into());
        self
    }

    /// Sets the underlying error.
    #[must_use]
    pub fn with_source(mut self, source: impl Into<BoxError>) -> Self {
        self.inner.source = Some(source.into());
        self
    }

    /// Sets the provider and model in place, if no provider is set yet
    /// (through [`AttemptLog::complete`](crate::AttemptLog::complete): the
    /// layer that made an attempt's record names its link this way).
    pub(crate) fn set_origin_if_unset(&mut self, provider: &Arc<str>, model: &Arc<str>) {
        if self.inner.provider.is_none() {
            self.inner.provider = Some(provider.clone());
            self.inner.model = Some(model.clone());
        }
    }

    /// Marks this, the last link's failure, as the end of a fallback chain
    /// in which every link failed (`layer::FailureExt::mark_all_links_failed`).
    pub(crate) fn set_all_links_failed(&mut self, earliest: Option<Duration>) {
        self.inner.all_links_failed = true;
        self.inner.retry_after = earliest;
    }

    /// `true` when every link of a fallback chain failed (this is the last
    /// one's failure); the call metrics' `all_failed` outcome.
    pub fn is_all_links_failed(&self) -> bool {
        self.inner.all_links_failed
    }

    /// Attaches the per-call attempt log in place (the call's owner does,
    /// through [`AttemptLog::attach`](crate::AttemptLog::attach)).
    pub(crate) fn set_attempts(&mut self, attempts: Vec<AttemptRecord>) {
        self.inner.attempts = attempts;
    }

    /// The failure class.
    pub fn class(&self) -> FailureClass {
        self.inner.class
    }

    /// The class, retry hint, provider advice and status, as a
    /// [`Classified`] value the layers can act on.
    pub fn classified(&self) -> Classified {
        Classified {
            class: self.inner.class,
            retry_after: self.inner.retry_after,
            should_retry: self.inner.should_retry,
            http_status: self.inner.status,
        }
    }

    /// How long the provider (or breaker) asked us to wait, if it said.
    pub fn retry_after(&self) -> Option<Duration> {
        self.inner.retry_after
    }

    /// The provider's own retry advice (`x-should-retry`), if it gave any.
    pub fn should_retry(&self) -> Option<bool> {
        self.inner.should_retry
    }

    /// The HTTP status of the failed answer, if there was one.
    pub fn http_status(&self) -> Option<StatusCode> {
        self.inner.status
    }

    /// The provider that failed, if known.
    pub fn provider(&self) -> Option<&str> {
        self.inner.provider.as_deref()
    }

    /// The model that failed, if known.
    pub fn model(&self) -> Option<&str> {
        self.inner.model.as_deref()
    }

    /// The human-readable message, if any.
    pub fn message(&self) -> Option<&str> {
        self.inner.message.as_deref()
    }

    /// Every attempt this call made, oldest first (empty unless the outermost
    /// tower-llm layer attached the log).
    pub fn attempts(&self) -> &[AttemptRecord] {
        &self.inner.attempts
    }

    /// Class is [`Transient`](FailureClass::Transient).
    pub fn is_transient(&self) -> bool {
        self.inner.class == FailureClass::Transient
    }
    /// Class is [`RateLimited`](FailureClass::RateLimited).
    pub fn is_rate_limited(&self) -> bool {
        self.inner.class == FailureClass::RateLimited
    }
    /// Class is [`QuotaExhausted`](FailureClass::QuotaExhausted).
    pub fn is_quota_exhausted(&self) -> bool {
        self.inner.class == FailureClass::QuotaExhausted
    }
    /// Class is [`Timeout`](FailureClass::Timeout).
    pub fn is_timeout(&self) -> bool {
        self.inner.class == FailureClass::Timeout
    }
    /// Class is [`CircuitOpen`](FailureClass::CircuitOpen).
    pub fn is_circuit_open(&self) -> bool {
        self.inner.class == FailureClass::CircuitOpen
    }
    /// Class is [`BadRequest`](FailureClass::BadRequest).
    pub fn is_bad_request(&self) -> bool {
        self.inner.class == FailureClass::BadRequest
    }
    /// Class is [`ContextWindowExceeded`](FailureClass::ContextWindowExceeded).
    pub fn is_context_window_exceeded(&self) -> bool {
        self.inner.class == FailureClass::ContextWindowExceeded
    }
    /// Class is [`Auth`](FailureClass::Auth).
    pub fn is_auth(&self) -> bool {
        self.inner.class == FailureClass::Auth
    }
    /// Class is [`NotFound`](FailureClass::NotFound).
    pub fn is_not_found(&self) -> bool {
        self.inner.class == FailureClass::NotFound
    }
    /// Class is [`Conflict`](FailureClass::Conflict).
    pub fn is_conflict(&self) -> bool {
        self.inner.class == FailureClass::Conflict
    }
    /// Class is [`ContentFiltered`](FailureClass::ContentFiltered).
    pub fn is_content_filtered(&self) -> bool {
        self.inner.class == FailureClass::ContentFiltered
    }
    /// Class is [`InvalidResponse`](FailureClass::InvalidResponse).
    pub fn is_invalid_response(&self) -> bool {
        self.inner.class == FailureClass::InvalidResponse
    }
    /// Class is [`Cancelled`](FailureClass::Cancelled).
    pub fn is_cancelled(&self) -> bool {
        self.inner.class == FailureClass::Cancelled
    }
    /// Class is [`DeadlineExceeded`](FailureClass::DeadlineExceeded).
    pub fn is_deadline_exceeded(&self) -> bool {
        self.inner.class == FailureClass::DeadlineExceeded
    }
}

fn io_kind(err: &(dyn StdError + 'static)) -> Option<io::ErrorKind> {
    let mut cur: Option<&(dyn StdError + 'static)> = Some(err);
    while let Some(e) = cur {
        if let Some(io) = e.downcast_ref::<io::Error>() {
            return Some(io.kind());
        }
        cur = e.source();
    }
    None
}

impl From<FailureClass> for Failure {
    fn from(class: FailureClass) -> Self {
        Failure::new(class)
    }
}

impl From<BoxError> for Failure {
    fn from(err: BoxError) -> Self {
        Failure::from_error(err)
    }
}

impl fmt::Debug for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Failure");
        d.field("class", &self.inner.class);
        if let Some(r) = self.inner.retry_after {
            d.field("retry_after", &r);
        }
        if let Some(s) = self.inner.should_retry {
            d.field("should_retry", &s);
        }
        if let Some(s) = self.inner.status {
            d.field("status", &s.as_u16());
        }
        if let Some(p) = &self.inner.provider {
            d.field("provider", p);
        }
        if let Some(m) = &self.inner.model {
            d.field("model", m);
        }
        if let Some(m) = &self.inner.message {
            d.field("message", m);
        }
        if let Some(s) = &self.inner.source {
            d.field("source", s);
        }
        if !self.inner.attempts.is_empty() {
            d.field("attempts", &self.inner.attempts.len());
        }
        if self.inner.all_links_failed {
            d.field("all_links_failed", &true);
        }
        d.finish()
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.inner.all_links_failed {
            f.write_str("all links failed, the last with: ")?;
        }
        fmt::Display::fmt(&self.inner.class, f)?;
        if let Some(m) = &self.inner.message {
            write!(f, ": {m}")?;
        }
        let mut sep = " (";
        if let Some(p) = &self.inner.provider {
            write!(f, "{sep}provider {p}")?;
            sep = ", ";
        }
        if let Some(m) = &self.inner.model {
            write!(f, "{sep}model {m}")?;
            sep = ", ";
        }
        if let Some(s) = self.inner.status {
            write!(f, "{sep}HTTP {}", s.as_u16())?;
            sep = ", ";
        }
        if let Some(r) = self.inner.retry_after {
            write!(f, "{sep}retry after {} ms", r.as_millis())?;
            sep = ", ";
        }
        if sep == ", " {
            f.write_str(")")?;
        }
        Ok(())
    }
}

impl StdError for Failure {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.inner.source.as_deref().map(|e| e as _)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boxed_failure_round_trips_unchanged() {
        let f = Failure::new(FailureClass::Auth).with_provider("anthropic");
        let boxed: BoxError = Box::new(f);
        let back = Failure::from_error(boxed);
        assert!(back.is_auth());
        assert_eq!(back.provider(), Some("anthropic"));
    }

    #[test]
    fn io_timeout_is_timeout_and_reset_is_transient() {
        let t: BoxError = Box::new(io::Error::from(io::ErrorKind::TimedOut));
        assert!(Failure::from_error(t).is_timeout());
        let r: BoxError = Box::new(io::Error::from(io::ErrorKind::ConnectionReset));
        let f = Failure::from_error(r);
        assert!(f.is_transient());
        assert!(f.source().is_some());
    }

    #[derive(Debug)]
    struct Wrapper(io::Error);
    impl fmt::Display for Wrapper {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("client error")
        }
    }
    impl StdError for Wrapper {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn io_kind_found_in_source_chain() {
        let e: BoxError = Box::new(Wrapper(io::Error::from(io::ErrorKind::TimedOut)));
        assert!(Failure::from_error(e).is_timeout());
    }

    #[test]
    fn display_without_details_has_no_parens() {
        assert_eq!(
            Failure::deadline_exceeded().to_string(),
            "deadline exceeded"
        );
        let f = Failure::circuit_open(Some(Duration::from_millis(1500)))
            .with_provider("bedrock")
            .with_model("m");
        assert_eq!(
            f.to_string(),
            "circuit open (provider bedrock, model m, retry after 1500 ms)"
        );
    }

    #[test]
    fn cap_failure_names_the_cap() {
        let f = Failure::attempts_cap_exceeded();
        assert!(f.is_invalid_response());
        assert!(f.is_attempts_cap_exceeded());
        assert!(!Failure::new(FailureClass::InvalidResponse).is_attempts_cap_exceeded());
        // An upstream that answers with the cap's very text is not the cap.
        let lookalike = Failure::new(FailureClass::InvalidResponse)
            .with_message(f.message().unwrap_or_default().to_owned());
        assert!(!lookalike.is_attempts_cap_exceeded());
        assert!(f.to_string().contains("attempts cap exceeded"));
    }

    #[test]
    fn failure_is_send_sync_and_small() {
        fn assert_send_sync<T: Send + Sync + 'static>() {}
        assert_send_sync::<Failure>();
        assert_eq!(std::mem::size_of::<Failure>(), std::mem::size_of::<usize>());
    }
}
