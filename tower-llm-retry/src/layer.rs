use std::sync::Arc;
use std::time::Duration;

use tower_layer::Layer;
use tower_llm_core::{ChatClassifier, FailurePolicy, HttpClassifier, Link, MAX_ATTEMPTS_PER_CALL};

use crate::policy::Shared;
use crate::{AttemptLayer, Backoff, Budget, RandomSource, Retry, RetryPolicy};

/// Retries failed attempts on the same link: see the [crate docs](crate).
///
/// Cheap to clone: the settings, the [retry budget](crate::RetryBudget)
/// and the random source sit behind `Arc`s, so every clone of one layer,
/// and every service it builds, share one budget.
///
/// ```
/// use std::time::Duration;
/// use tower_llm_retry::{Backoff, RetryLayer};
///
/// let layer = RetryLayer::new()             // typed chat calls
///     .with_max_attempts(3)
///     .with_attempt_timeout(Duration::from_secs(20))
///     .with_backoff(Backoff::seed_default());
/// let http_layer = RetryLayer::http();      // raw http::Request / Response
/// # let _ = (layer, http_layer);
/// ```
#[derive(Debug)]
pub struct RetryLayer<C = ChatClassifier> {
    shared: Arc<Shared<C>>,
}

impl<C> Clone for RetryLayer<C> {
    fn clone(&self) -> Self {
        RetryLayer {
            shared: self.shared.clone(),
        }
    }
}

impl RetryLayer<ChatClassifier> {
    /// A layer for typed chat services (`ChatRequest` → `ChatResponse`),
    /// with the seed defaults: 3 attempts, 30 s per attempt, 200 ms / 800 ms
    /// ±20 % backoff, a 20 % retry budget.
    pub fn new() -> Self {
        RetryLayer::with_classifier(ChatClassifier)
    }
}

impl Default for RetryLayer<ChatClassifier> {
    fn default() -> Self {
        RetryLayer::new()
    }
}

impl RetryLayer<HttpClassifier> {
    /// A layer for raw HTTP services (`http::Request<B>` → `http::Response<B>`),
    /// classifying answers by status and `Retry-After` / `x-should-retry`.
    /// A retried call that still fails returns the last response (for
    /// example the final 503) as `Ok`, as HTTP clients expect.
    pub fn http() -> Self {
        RetryLayer::with_classifier(HttpClassifier)
    }
}

impl<C: Clone> RetryLayer<C> {
    /// A layer using `classifier` to tell success from failure.
    pub fn with_classifier(classifier: C) -> Self {
        RetryLayer {
            shared: Arc::new(Shared::new(classifier)),
        }
    }

    fn update(mut self, f: impl FnOnce(&mut Shared<C>)) -> Self {
        f(Arc::make_mut(&mut self.shared));
        self
    }

    /// Attempts per call on this link, the first included (default 3).
    /// Clamped to `1..=16` (16 is the per-call attempt-log cap).
    #[must_use]
    pub fn with_max_attempts(self, max_attempts: u8) -> Self {
        let cap = u8::try_from(MAX_ATTEMPTS_PER_CALL).unwrap_or(u8::MAX);
        self.update(|s| s.max_attempts = max_attempts.clamp(1, cap))
    }

    /// The longest one attempt may take (default 30 s); never more than
    /// the call's remaining deadline.
    #[must_use]
    pub fn with_attempt_timeout(self, timeout: Duration) -> Self {
        self.update(|s| s.attempt_timeout = timeout)
    }

    /// The longest `Retry-After` the layer will wait out before a retry
    /// (default 60 s, as the OpenAI SDK). A longer one returns the failure
    /// at once (so the fallback layer can move on), whatever the deadline.
    /// A shorter one is a floor under the backoff: the wait is
    /// `max(backoff, Retry-After)`.
    #[must_use]
    pub fn with_max_retry_after(self, max: Duration) -> Self {
        self.update(|s| s.max_retry_after = max)
    }

    /// The shortest time worth starting a retry with (default 1 s): a
    /// retry starts only if its wait plus this much still fits before the
    /// call's deadline; otherwise the failure is returned at once, so a
    /// fallback link can use the time left (seed 004: no retry if the
    /// backoff and the next attempt cannot finish within the remaining
    /// deadline). Set it near the link's typical (p50) latency. Never more
    /// than the attempt timeout; [`Duration::ZERO`] checks only the wait.
    #[must_use]
    pub fn with_min_attempt(self, min_attempt: Duration) -> Self {
        self.update(|s| s.min_attempt = min_attempt)
    }

    /// With `true`, an attempt that ends by its own timeout (the attempt
    /// timeout, or a stream's first-token timeout: a
    /// [`Timeout`](tower_llm_core::FailureClass::Timeout) without an HTTP
    /// status) is not retried on this link when links follow it in its
    /// fallback chain ([`Link::has_alternates_after`](tower_llm_core::Link::has_alternates_after)):
    /// the failure goes back at once, so the fallback tries the next link
    /// (its record says [`RetryStop::FailoverOnTimeout`](tower_llm_core::RetryStop::FailoverOnTimeout)).
    /// The last link, and a layer used without a fallback, still retry.
    /// Default `false` (seed 002 retries a timeout on the same link).
    #[must_use]
    pub fn with_failover_on_timeout(self, failover: bool) -> Self {
        self.update(|s| s.failover_on_timeout = failover)
    }

    /// The backoff schedule (default [`Backoff::seed_default`]).
    #[must_use]
    pub fn with_backoff(self, backoff: Backoff) -> Self {
        self.update(|s| s.backoff = backoff)
    }

    /// The retry budget (default [`RetryBudget::seed_default`](crate::RetryBudget::seed_default)).
    /// Any `tower::retry::budget::Budget` works, tower's `TpsBudget` included.
    #[must_use]
    pub fn with_budget(self, budget: impl Budget + Send + Sync + 'static) -> Self {
        self.with_shared_budget(Arc::new(budget))
    }

    /// A retry budget shared with other layers.
    #[must_use]
    pub fn with_shared_budget(self, budget: Arc<dyn Budget + Send + Sync>) -> Self {
        self.update(|s| s.budget = budget)
    }

    /// The random source for jitter (default [`SplitMix64`](crate::SplitMix64)
    /// seeded from the process's entropy).
    #[must_use]
    pub fn with_rng(self, rng: impl RandomSource + 'static) -> Self {
        self.update(|s| s.rng = Arc::new(rng))
    }

    /// Which failure classes are retried (default [`FailurePolicy::default`]).
    #[must_use]
    pub fn with_failure_policy(self, failures: FailurePolicy) -> Self {
        self.update(|s| s.failures = failures)
    }

    /// The provider and model named in attempt records when the request
    /// carries no [`Link`] (a fallback layer sets one per link). Default:
    /// provider `"default"`, empty model.
    #[must_use]
    pub fn with_link(self, link: Link) -> Self {
        self.update(|s| s.link = link)
    }

    /// Records the per-call metrics on `metrics` when this layer owns the
    /// call (no outer tower-llm layer does). Default: [`Metrics::global`]
    /// (a no-op until the host installs an OpenTelemetry SDK);
    /// [`Metrics::disabled`] for none.
    ///
    /// [`Metrics::global`]: tower_llm_core::Metrics::global
    /// [`Metrics::disabled`]: tower_llm_core::Metrics::disabled
    #[must_use]
    pub fn with_metrics(self, metrics: tower_llm_core::Metrics) -> Self {
        self.update(|s| s.metrics = metrics)
    }

    /// The retry policy, for use inside `tower::retry::Retry` (together with
    /// [`attempt_layer`](Self::attempt_layer)).
    pub fn policy(&self) -> RetryPolicy<C> {
        RetryPolicy::new(self.shared.clone())
    }

    /// The per-attempt layer, for use inside `tower::retry::Retry`.
    pub fn attempt_layer(&self) -> AttemptLayer<C> {
        AttemptLayer::from_shared(self.shared.clone())
    }
}

impl<S, C: Clone> Layer<S> for RetryLayer<C> {
    type Service = Retry<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        Retry::new(
            self.policy(),
            self.attempt_layer().layer(inner),
            self.shared.metrics.clone(),
        )
    }
}
