use std::task::{Context, Poll};

use tower_llm_core::layer::Replay;
use tower_llm_core::{BoxError, Classify, Failure, LlmRequest, Metrics, RecordsAttempts};
use tower_service::Service;

use crate::{Attempt, ResponseFuture, RetryPolicy};

/// The service built by [`RetryLayer`](crate::RetryLayer): the retry
/// loop of `tower::retry::Retry`, driven by a [`RetryPolicy`], around an
/// [`Attempt`] per try.
///
/// It also owns the call (its [`AttemptLog`](tower_llm_core::AttemptLog),
/// metrics and span) when no outer tower-llm layer does, and then attaches
/// the records to the response or the error.
#[derive(Debug)]
pub struct Retry<S, C> {
    policy: RetryPolicy<C>,
    attempt: Attempt<S, C>,
    metrics: Metrics,
}

impl<S: Clone, C> Clone for Retry<S, C> {
    fn clone(&self) -> Self {
        Retry {
            policy: self.policy.clone(),
            attempt: self.attempt.clone(),
            metrics: self.metrics.clone(),
        }
    }
}

impl<S, C> Retry<S, C> {
    pub(crate) fn new(policy: RetryPolicy<C>, attempt: Attempt<S, C>, metrics: Metrics) -> Self {
        Retry {
            policy,
            attempt,
            metrics,
        }
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        self.attempt.get_ref()
    }

    /// The wrapped service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        self.attempt.get_mut()
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.attempt.into_inner()
    }
}

impl<S, C, Req> Service<Req> for Retry<S, C>
where
    S: Service<Req> + Clone,
    S::Error: Into<BoxError> + 'static,
    S::Response: RecordsAttempts,
    C: Classify<S::Response, Failure> + Clone,
    Req: Clone + LlmRequest,
{
    type Response = S::Response;
    type Error = Failure;
    type Future = ResponseFuture<S, C, Req>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.attempt.poll_ready(cx)
    }

    fn call(&mut self, mut req: Req) -> Self::Future {
        // Before the copy is made, so every copy shares the log.
        let (owner, copy) = Replay::enter(&mut req, &self.metrics, true);
        let fut = {
            let _span = owner.as_ref().map(|o| o.span().enter());
            self.attempt.call(req)
        };
        // As tower's `Retry` does: the future keeps a clone of the service
        // for later attempts (made ready again before each), and this one,
        // with whatever it learnt serving the call, serves the next call.
        ResponseFuture::new(fut, copy, self.policy.clone(), self.attempt.clone(), owner)
    }
}
