use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use pin_project_lite::pin_project;
use tower_llm_core::{AttemptLog, Failure, RecordsAttempts};

pin_project! {
    /// Response future of [`Retry`](crate::Retry).
    #[derive(Debug)]
    pub struct ResponseFuture<F> {
        #[pin]
        inner: F,
        log: Option<AttemptLog>,
    }
}

impl<F> ResponseFuture<F> {
    pub(crate) fn new(inner: F, log: Option<AttemptLog>) -> Self {
        ResponseFuture { inner, log }
    }
}

impl<F, Res> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Res, Failure>>,
    Res: RecordsAttempts,
{
    type Output = Result<Res, Failure>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut result = ready!(this.inner.poll(cx));
        if let Some(log) = this.log.take() {
            log.attach(&mut result);
        }
        Poll::Ready(result)
    }
}
