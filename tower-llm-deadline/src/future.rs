use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use pin_project_lite::pin_project;
use tower_llm_core::{AttemptLog, Bounded, BoxError, Failure, FailureClass, RecordsAttempts};

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
        // Set when this layer owns the call's attempt log.
        log: Option<AttemptLog>,
        // Set once it has resolved.
        finished: bool,
    }
}

impl<F> ResponseFuture<F> {
    pub(crate) fn new(call: Bounded<F>, log: Option<AttemptLog>) -> Self {
        ResponseFuture {
            call,
            log,
            finished: false,
        }
    }
}

impl<F, Res, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Res, E>>,
    E: Into<BoxError>,
    Res: RecordsAttempts,
{
    type Output = Result<Res, Failure>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        if *this.finished {
            return Poll::Ready(Err(Failure::new(FailureClass::Cancelled)
                .with_message("deadline future polled after completion")));
        }
        let mut result = match ready!(this.call.as_mut().poll(cx)) {
            Some(result) => result.map_err(|e| Failure::from_error(e.into())),
            None => {
                // Cancel the call now rather than when the caller drops us.
                this.call.cancel();
                Err(Failure::deadline_exceeded())
            }
        };
        *this.finished = true;
        if let Some(log) = this.log.take() {
            log.attach(&mut result);
        }
        Poll::Ready(result)
    }
}
