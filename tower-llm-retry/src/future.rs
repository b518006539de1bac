use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use pin_project_lite::pin_project;
use tower_llm_core::{CallOwner, Failure, RecordsAttempts};

pin_project! {
    /// Response future of [`Retry`](crate::Retry).
    #[derive(Debug)]
    pub struct ResponseFuture<F> {
        #[pin]
        inner: F,
        owner: Option<CallOwner>,
    }
}

impl<F> ResponseFuture<F> {
    pub(crate) fn new(inner: F, owner: Option<CallOwner>) -> Self {
        ResponseFuture { inner, owner }
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
        let polled = {
            let _span = this.owner.as_ref().map(|o| o.span().enter());
            this.inner.poll(cx)
        };
        let mut result = ready!(polled);
        if let Some(owner) = this.owner.take() {
            owner.finish(&mut result);
        }
        Poll::Ready(result)
    }
}
