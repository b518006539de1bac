use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use pin_project_lite::pin_project;
use tokio::time::Sleep;
use tower_llm_core::layer::{CallOwner, Replay};
use tower_llm_core::{BoxError, Classify, Failure, LlmRequest, RecordsAttempts};
use tower_service::Service;

use crate::{Attempt, AttemptFuture, RetryPolicy};

pin_project! {
    #[project = StateProj]
    enum State<F> {
        // An attempt is running.
        Called { #[pin] fut: F },
        // Waiting out the backoff or `Retry-After` (boxed: only retries
        // pay for the timer's room).
        Waiting { sleep: Pin<Box<Sleep>> },
        // Waiting for the service to be ready for the next attempt.
        Retrying,
    }
}

pin_project! {
    /// Response future of [`Retry`](crate::Retry): the retry loop of
    /// `tower::retry::Retry`, driven by the same [`RetryPolicy`], with a
    /// request copy that carries the call's [`Call`](tower_llm_core::Call)
    /// only once it is used (see the
    /// [crate docs](crate#how-it-differs-from-towerretry)).
    pub struct ResponseFuture<S, C, Req>
    where
        S: Service<Req>,
    {
        #[pin]
        state: State<AttemptFuture<S::Future, C>>,
        // The copy for the next attempt; `None` once it may not be retried.
        copy: Option<Replay<Req>>,
        policy: RetryPolicy<C>,
        service: Attempt<S, C>,
        // Set when this layer owns the call (its attempt log, metrics, span).
        owner: Option<CallOwner>,
    }
}

impl<S: Service<Req>, C, Req> std::fmt::Debug for ResponseFuture<S, C, Req> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("retryable", &self.copy.is_some())
            .field("owner", &self.owner)
            .finish_non_exhaustive()
    }
}

impl<S: Service<Req>, C, Req> ResponseFuture<S, C, Req> {
    pub(crate) fn new(
        fut: AttemptFuture<S::Future, C>,
        copy: Option<Replay<Req>>,
        policy: RetryPolicy<C>,
        service: Attempt<S, C>,
        owner: Option<CallOwner>,
    ) -> Self {
        ResponseFuture {
            state: State::Called { fut },
            copy,
            policy,
            service,
            owner,
        }
    }
}

impl<S, C, Req> Future for ResponseFuture<S, C, Req>
where
    S: Service<Req>,
    S::Error: Into<BoxError> + 'static,
    S::Response: RecordsAttempts,
    C: Classify<S::Response, Failure> + Clone,
    Req: Clone + LlmRequest,
{
    type Output = Result<S::Response, Failure>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let _span = this.owner.as_ref().map(|o| o.span().enter());
        let mut result = loop {
            match this.state.as_mut().project() {
                StateProj::Called { mut fut } => {
                    let mut result = ready!(fut.as_mut().poll(cx));
                    let Some(copy) = this.copy.as_mut() else {
                        break result;
                    };
                    let index = fut.record_index();
                    let wait = this.policy.decide(&mut result, index, copy);
                    match wait {
                        Some(sleep) => this.state.set(State::Waiting {
                            sleep: Box::pin(sleep),
                        }),
                        None => break result,
                    }
                }
                StateProj::Waiting { sleep } => {
                    ready!(sleep.as_mut().poll(cx));
                    this.state.set(State::Retrying);
                }
                StateProj::Retrying => {
                    if let Err(e) = ready!(this.service.poll_ready(cx)) {
                        break Err(e);
                    }
                    let Some(copy) = this.copy.take() else {
                        // Never: `Retrying` is entered with a copy.
                        break Err(Failure::new(tower_llm_core::FailureClass::Cancelled)
                            .with_message("retry future polled after completion"));
                    };
                    let mut req = copy.into_request();
                    // As tower's loop asks `clone_request` for each copy.
                    *this.copy = req.is_replayable().then(|| Replay::of(&mut req));
                    let fut = this.service.call(req);
                    this.state.set(State::Called { fut });
                }
            }
        };
        // Nothing more to retry: drop the copy now rather than with us.
        *this.copy = None;
        drop(_span);
        if let Some(owner) = this.owner.take() {
            owner.finish(&mut result);
        }
        Poll::Ready(result)
    }
}
