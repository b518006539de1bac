use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep, sleep_until};
use tower_llm_core::{AttemptLog, BoxError, Deadline, Failure, RecordsAttempts};

/// Attaches the attempt log this layer owns, if it owns one.
fn finish<Res: RecordsAttempts>(
    log: Option<AttemptLog>,
    mut result: Result<Res, Failure>,
) -> Result<Res, Failure> {
    if let Some(log) = log {
        log.attach(&mut result);
    }
    result
}

pin_project! {
    /// Response future of [`EnforceDeadline`](crate::EnforceDeadline).
    ///
    /// Resolves to the inner result, or to a deadline-exceeded [`Failure`]
    /// when the deadline passes first; the inner future is dropped at that
    /// moment.
    #[derive(Debug)]
    pub struct ResponseFuture<F> {
        // `None` once finished, or from the start when the deadline had
        // already passed at call time.
        #[pin]
        inner: Option<F>,
        // Armed on the first poll that finds the inner future pending, so an
        // answer that is ready at once never touches the timer.
        #[pin]
        sleep: Option<Sleep>,
        deadline: Instant,
        log: Option<AttemptLog>,
    }
}

impl<F> ResponseFuture<F> {
    pub(crate) fn new(inner: Option<F>, deadline: Deadline, log: Option<AttemptLog>) -> Self {
        ResponseFuture {
            inner,
            sleep: None,
            deadline: deadline.instant(),
            log,
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
        // The inner future goes first: an answer ready in the same poll as
        // the deadline wins, as with `tower::timeout::Timeout`.
        // With no inner future the deadline had passed before the call.
        if let Some(inner) = this.inner.as_mut().as_pin_mut() {
            if let Poll::Ready(result) = inner.poll(cx) {
                this.inner.set(None);
                let result = result.map_err(|e| Failure::from_error(e.into()));
                return Poll::Ready(finish(this.log.take(), result));
            }
            if this.sleep.is_none() {
                this.sleep.set(Some(sleep_until(*this.deadline)));
            }
            if let Some(sleep) = this.sleep.as_pin_mut() {
                ready!(sleep.poll(cx));
            }
        }
        // Cancel the call now rather than when the caller drops us.
        this.inner.set(None);
        Poll::Ready(finish(this.log.take(), Err(Failure::deadline_exceeded())))
    }
}
