use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;
use tower_llm_core::layer::{Bounded, CallExt};
use tower_llm_core::{BoxError, Call, Deadline, Failure, LlmRequest, Metrics, RecordsAttempts};
use tower_service::Service;

use crate::{DeadlineLayer, ResponseFuture, header_timeout};

/// Enforces one absolute deadline per call: see the [crate docs](crate).
///
/// Built by [`DeadlineLayer`].
#[derive(Debug, Clone)]
pub struct EnforceDeadline<S> {
    inner: S,
    budget: Duration,
    metrics: Metrics,
}

impl<S> EnforceDeadline<S> {
    /// Wraps `inner`, giving each call at most `budget`.
    pub fn new(inner: S, budget: Duration) -> Self {
        EnforceDeadline {
            inner,
            budget,
            metrics: Metrics::global(),
        }
    }

    /// Records the per-call metrics on `metrics` instead (see
    /// [`DeadlineLayer::with_metrics`]).
    #[must_use]
    pub fn with_metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// A [`DeadlineLayer`] with this budget.
    pub fn layer(budget: Duration) -> DeadlineLayer {
        DeadlineLayer::new(budget)
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The wrapped service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, Req> Service<Req> for EnforceDeadline<S>
where
    S: Service<Req>,
    S::Error: Into<BoxError> + 'static,
    S::Response: RecordsAttempts,
    Req: LlmRequest,
{
    type Response = S::Response;
    type Error = Failure;
    type Future = ResponseFuture<S::Future>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Failure::from_inner)
    }

    fn call(&mut self, mut req: Req) -> Self::Future {
        let now = Instant::now();
        let mut deadline = Deadline::after_from(now, self.budget);
        if let Some(timeout) = LlmRequest::headers(&req).and_then(header_timeout) {
            deadline = deadline.min(Deadline::after_from(now, timeout));
        }
        let (deadline, owner) = Call::begin(&mut req, deadline, &self.metrics);
        let call = if deadline.instant() <= now {
            // Nothing can finish in no time: do not spend a provider call.
            Bounded::expired(deadline.instant())
        } else {
            let _span = owner.as_ref().map(|o| o.span().enter());
            Bounded::new(self.inner.call(req), deadline.instant())
        };
        ResponseFuture::new(call, owner)
    }
}
