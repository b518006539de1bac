//! One attempt: per-attempt timeout, deadline check, attempt record.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::Instant;
use tower_layer::Layer;
use tower_llm_core::layer::{AttemptLogExt as _, AttemptRecordExt as _, Bounded};
use tower_llm_core::{
    AttemptLog, AttemptOutcome, AttemptRecord, BoxError, Call, Classify, Deadline, Failure,
    FailureClass, LlmRequest, Outcome,
};
use tower_service::Service;

use crate::policy::Shared;

/// Wraps each attempt of a [`RetryLayer`](crate::RetryLayer): see [`Attempt`].
///
/// Only needed on its own when using [`RetryPolicy`](crate::RetryPolicy)
/// inside `tower::retry::Retry`: put it inside the `Retry`.
#[derive(Debug)]
pub struct AttemptLayer<C> {
    shared: Arc<Shared<C>>,
}

impl<C> Clone for AttemptLayer<C> {
    fn clone(&self) -> Self {
        AttemptLayer {
            shared: self.shared.clone(),
        }
    }
}

impl<C> AttemptLayer<C> {
    pub(crate) fn from_shared(shared: Arc<Shared<C>>) -> Self {
        AttemptLayer { shared }
    }
}

impl<S, C> Layer<S> for AttemptLayer<C> {
    type Service = Attempt<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        Attempt {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// One attempt of a retried call.
///
/// - Refuses to start when the call's [`Deadline`] has passed (deadline
///   exceeded) or the [`AttemptLog`] is full (attempts cap exceeded): the
///   inner service is not called.
/// - Bounds the attempt by `min(attempt_timeout, deadline)`: when the
///   attempt timeout fires first the failure is
///   [`Timeout`](FailureClass::Timeout) (retryable); when the deadline does,
///   [`DeadlineExceeded`](FailureClass::DeadlineExceeded). The inner future
///   is dropped at that moment.
/// - Appends one [`AttemptRecord`] to the call's log when it ends.
#[derive(Debug)]
pub struct Attempt<S, C> {
    inner: S,
    shared: Arc<Shared<C>>,
}

impl<S: Clone, C> Clone for Attempt<S, C> {
    fn clone(&self) -> Self {
        Attempt {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S, C> Attempt<S, C> {
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

impl<S, C, Req> Service<Req> for Attempt<S, C>
where
    S: Service<Req>,
    S::Error: Into<BoxError> + 'static,
    C: Classify<S::Response, Failure> + Clone,
    Req: LlmRequest,
{
    type Response = S::Response;
    type Error = Failure;
    type Future = AttemptFuture<S::Future, C>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Failure::from_inner)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let shared = &*self.shared;
        let start = Instant::now();
        let call = req.call();
        let deadline = call.and_then(Call::deadline).map(Deadline::instant);
        let timeout_at = start
            .checked_add(shared.attempt_timeout)
            .unwrap_or_else(|| start + Duration::from_secs(86_400 * 365));
        let (until, deadline_bound) = match deadline {
            Some(d) if d <= timeout_at => (d, true),
            _ => (timeout_at, false),
        };
        // Built in one expression at the end: a response future is copied
        // each time it is moved, so it is not built and then patched.
        let early = |early: Failure, span| AttemptFuture {
            call: Bounded::expired(until),
            deadline_bound,
            early: Some(early),
            record: None,
            index: None,
            start,
            classifier: shared.classifier.clone(),
            finished: false,
            span,
        };
        if deadline.is_some_and(|d| d <= start) {
            // Nothing starts after the deadline.
            return early(Failure::deadline_exceeded(), tracing::Span::none());
        }
        let begun = AttemptRecord::begun(call, &shared.link);
        let span = tracing::info_span!(
            "llm.attempt",
            provider = &*begun.provider,
            model = &*begun.model,
            attempt = begun.attempt,
            fallback_position = begun.fallback_position,
            hedge = begun.hedge,
            outcome = tracing::field::Empty,
            http_status = tracing::field::Empty,
        );
        let mut record = None;
        if let Some(log) = call.and_then(Call::log) {
            match log.begin(begun) {
                Ok(index) => record = Some((log.clone(), index)),
                Err(cap) => return early(cap, span),
            }
        }
        let inner = {
            let _span = span.enter();
            self.inner.call(req)
        };
        AttemptFuture {
            call: Bounded::new(inner, until),
            deadline_bound,
            early: None,
            index: record.as_ref().map(|(_, i)| *i),
            record,
            start,
            classifier: shared.classifier.clone(),
            finished: false,
            span,
        }
    }
}

pin_project! {
    /// Response future of [`Attempt`].
    ///
    /// Dropped before it ends (the caller went away, or an outer deadline
    /// fired), it marks its attempt record as cancelled or deadline exceeded.
    #[derive(Debug)]
    pub struct AttemptFuture<F, C> {
        #[pin]
        call: Bounded<F>,
        // The bound is the call's deadline rather than the attempt timeout.
        deadline_bound: bool,
        early: Option<Failure>,
        // The call's log and this attempt's record in it, until finished.
        record: Option<(AttemptLog, usize)>,
        // This attempt's record in the call's log, kept after it finished.
        index: Option<usize>,
        start: Instant,
        classifier: C,
        // Set once it has resolved.
        finished: bool,
        // The `llm.attempt` span.
        span: tracing::Span,
    }

    impl<F, C> PinnedDrop for AttemptFuture<F, C> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if let Some((log, index)) = this.record.take() {
                let now = Instant::now();
                let class = if *this.deadline_bound && now >= this.call.until() {
                    FailureClass::DeadlineExceeded
                } else {
                    FailureClass::Cancelled
                };
                let elapsed = now.saturating_duration_since(*this.start);
                log.finish(index, |r| {
                    r.outcome = AttemptOutcome::Failed(class);
                    r.elapsed = elapsed;
                });
                this.span.record("outcome", class.as_metric_label());
            }
        }
    }
}

impl<F, C> AttemptFuture<F, C> {
    /// The index of this attempt's record in the call's attempt log, if it
    /// made one (still known after the attempt ended).
    pub fn record_index(&self) -> Option<usize> {
        self.index
    }
}

impl<F, C, Res, E> Future for AttemptFuture<F, C>
where
    F: Future<Output = Result<Res, E>>,
    E: Into<BoxError> + 'static,
    C: Classify<Res, Failure>,
{
    type Output = Result<Res, Failure>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        if *this.finished {
            // Polled again after it resolved: never a fresh failure that a
            // retry policy would act on.
            return Poll::Ready(Err(Failure::new(FailureClass::Cancelled)
                .with_message("attempt future polled after completion")));
        }
        if let Some(early) = this.early.take() {
            *this.finished = true;
            return Poll::Ready(Err(early));
        }
        let polled = {
            let _span = this.span.enter();
            this.call.as_mut().poll(cx)
        };
        let (mut result, expired) = match ready!(polled) {
            Some(result) => (result.map_err(Failure::from_inner), false),
            None if *this.deadline_bound => (Err(Failure::deadline_exceeded()), true),
            None => (
                Err(Failure::new(FailureClass::Timeout).with_message("attempt timed out")),
                true,
            ),
        };
        if !this.span.is_disabled() {
            let outcome = this.classifier.classify(&result);
            this.span.record(
                "outcome",
                match &outcome {
                    Outcome::Success { .. } => "succeeded",
                    Outcome::Failure(c) => c.class.as_metric_label(),
                },
            );
            if let Some(status) = outcome.http_status() {
                this.span.record("http_status", status.as_u16());
            }
        }
        if let Some((log, index)) = this.record.take() {
            let outcome = this.classifier.classify(&result);
            let elapsed = this.start.elapsed();
            log.complete(index, &outcome, elapsed, &mut result);
        }
        *this.finished = true;
        if expired {
            // After the record says why: the inner call (a circuit breaker,
            // say) may read it as it is dropped.
            this.call.cancel();
        }
        Poll::Ready(result)
    }
}
