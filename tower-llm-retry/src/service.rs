use std::task::{Context, Poll};

use tower_llm_core::{
    BoxError, CallOwner, Classify, Failure, HasExtensions, Metrics, RecordsAttempts,
};
use tower_service::Service;

use crate::{Attempt, ResponseFuture, RetryPolicy};

/// The service built by [`RetryLayer`](crate::RetryLayer): tower's own
/// `Retry` driven by a [`RetryPolicy`], around an [`Attempt`] per try.
///
/// It also owns the call (its [`AttemptLog`](tower_llm_core::AttemptLog),
/// metrics and span) when no outer tower-llm layer does, and then attaches
/// the records to the response or the error.
#[derive(Debug)]
pub struct Retry<S, C> {
    inner: tower::retry::Retry<RetryPolicy<C>, Attempt<S, C>>,
    metrics: Metrics,
}

impl<S: Clone, C> Clone for Retry<S, C> {
    fn clone(&self) -> Self {
        Retry {
            inner: self.inner.clone(),
            metrics: self.metrics.clone(),
        }
    }
}

impl<S, C> Retry<S, C> {
    pub(crate) fn new(
        inner: tower::retry::Retry<RetryPolicy<C>, Attempt<S, C>>,
        metrics: Metrics,
    ) -> Self {
        Retry { inner, metrics }
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        self.inner.get_ref().get_ref()
    }

    /// The wrapped service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        self.inner.get_mut().get_mut()
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner.into_inner().into_inner()
    }
}

impl<S, C, Req> Service<Req> for Retry<S, C>
where
    S: Service<Req> + Clone,
    S::Error: Into<BoxError>,
    S::Response: RecordsAttempts,
    C: Classify<S::Response, Failure> + Clone,
    Req: Clone + HasExtensions,
{
    type Response = S::Response;
    type Error = Failure;
    type Future =
        ResponseFuture<tower::retry::future::ResponseFuture<RetryPolicy<C>, Attempt<S, C>, Req>>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Req) -> Self::Future {
        // Before tower's Retry keeps its copy, so every copy shares the log.
        let owner = CallOwner::install(req.extensions_mut(), &self.metrics);
        let _span = owner.as_ref().map(|o| o.span().enter());
        let fut = self.inner.call(req);
        drop(_span);
        ResponseFuture::new(fut, owner)
    }
}
