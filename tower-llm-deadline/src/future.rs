use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use pin_project_lite::pin_project;
use tower_llm_core::layer::{Bounded, CallOwner};
use tower_llm_core::{BoxError, Failure, FailureClass, RecordsAttempts};

pin_project! {
    /// Response future of [`EnforceDeadline`](crate::EnforceDeadline).
    ///
    /// Resolves to the inner result, or to a deadline-exceeded [`Failure`]
    /// when the deadline passes first; the inner future is dropped at that
    /// moment. An answer ready in the same poll as the deadline wins, as
    /// with `tower::timeout::Timeout`.
    #[derive(Debug)]
    pub struct ResponseFuture<F> {
        #[pin]
        call: Bounded<F>,
        // Set when this layer owns the call (its attempt log, metrics, span).
        owner: Option<CallOwner>,
        // Set once it has resolved.
        finished: bool,
    }
}

impl<F> ResponseFuture<F> {
    pub(crate) fn new(call: Bounded<F>, owner: Option<CallOwner>) -> Self {
        ResponseFuture {
            call,
            owner,
            finished: false,
        }
    }
}

impl<F, Res, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Res, E>>,
    E: Into<BoxError> + 'static,
    Res: RecordsAttempts,
{
    type Output = Result<Res, Failure>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        if *this.finished {
            return Poll::Ready(Err(Failure::new(FailureClass::Cancelled)
                .with_message("deadline future polled after completion")));
        }
        let polled = {
            let _span = this.owner.as_ref().map(|o| o.span().enter());
            this.call.as_mut().poll(cx)
        };
        let mut result = match ready!(polled) {
            Some(result) => result.map_err(Failure::from_inner),
            None => {
                // Cancel the call now rather than when the caller drops us.
                this.call.cancel();
                Err(Failure::deadline_exceeded())
            }
        };
        *this.finished = true;
        if let Some(owner) = this.owner.take() {
            owner.finish(&mut result);
        }
        Poll::Ready(result)
    }
}
