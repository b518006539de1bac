//! [`ObserveRateLimits`]: a deployment's HTTP transport, teaching its
//! [`Pacer`] what every answer's rate-limit headers say.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tower::Layer;
use tower_service::Service;

use crate::pacer::Pacer;

/// Wraps an HTTP transport in [`ObserveRateLimits`].
///
/// ```
/// use std::sync::Arc;
/// use tower::{Layer, ServiceExt, service_fn};
/// use tower_llm_pool::{ObserveRateLimitsLayer, PaceLimits, Pacer};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let pacer = Arc::new(Pacer::new(PaceLimits::default()));
/// let transport = service_fn(|_: http::Request<()>| async {
///     let res = http::Response::builder()
///         .header("x-ratelimit-limit-requests", "500")
///         .header("x-ratelimit-remaining-requests", "499")
///         .body(())
///         .unwrap();
///     Ok::<_, std::convert::Infallible>(res)
/// });
/// let transport = ObserveRateLimitsLayer::new(pacer.clone()).layer(transport);
/// transport.oneshot(http::Request::new(())).await.unwrap();
/// assert_eq!(pacer.snapshot().limits.rpm, Some(500));
/// assert_eq!(pacer.snapshot().requests, Some(499));
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct ObserveRateLimitsLayer {
    pacer: Arc<Pacer>,
}

impl ObserveRateLimitsLayer {
    /// Observes every answer into `pacer` (the deployment's, shared with
    /// its [`Deployment`](crate::Deployment)).
    pub fn new(pacer: Arc<Pacer>) -> Self {
        ObserveRateLimitsLayer { pacer }
    }
}

impl<T> Layer<T> for ObserveRateLimitsLayer {
    type Service = ObserveRateLimits<T>;

    fn layer(&self, inner: T) -> Self::Service {
        ObserveRateLimits::new(inner, self.pacer.clone())
    }
}

/// An HTTP transport that shows every answer's headers to a [`Pacer`]
/// ([`Pacer::observe`]) and, on a 429, holds the pacer off for its
/// `Retry-After` (`retry-after-ms` first; both capped), then passes the
/// answer on unchanged. Errors pass through untouched.
#[derive(Debug, Clone)]
pub struct ObserveRateLimits<T> {
    inner: T,
    pacer: Arc<Pacer>,
}

impl<T> ObserveRateLimits<T> {
    /// `inner`, observed into `pacer`.
    pub fn new(inner: T, pacer: Arc<Pacer>) -> Self {
        ObserveRateLimits { inner, pacer }
    }

    /// The pacer observed into.
    pub fn pacer(&self) -> &Arc<Pacer> {
        &self.pacer
    }

    /// The wrapped transport.
    pub fn get_ref(&self) -> &T {
        &self.inner
    }

    /// The wrapped transport, mutably.
    pub fn get_mut(&mut self) -> &mut T {
        &mut self.inner
    }

    /// The wrapped transport.
    pub fn into_inner(self) -> T {
        self.inner
    }
}

impl<T, B, Rb> Service<http::Request<B>> for ObserveRateLimits<T>
where
    T: Service<http::Request<B>, Response = http::Response<Rb>>,
{
    type Response = http::Response<Rb>;
    type Error = T::Error;
    type Future = ObserveFuture<T::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        ObserveFuture {
            inner: self.inner.call(req),
            pacer: Some(self.pacer.clone()),
        }
    }
}

pin_project_lite::pin_project! {
    /// The future of [`ObserveRateLimits`].
    #[derive(Debug)]
    pub struct ObserveFuture<F> {
        #[pin]
        inner: F,
        pacer: Option<Arc<Pacer>>,
    }
}

impl<F, Rb, E> Future for ObserveFuture<F>
where
    F: Future<Output = Result<http::Response<Rb>, E>>,
{
    type Output = Result<http::Response<Rb>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let result = std::task::ready!(this.inner.poll(cx));
        if let (Ok(res), Some(pacer)) = (&result, this.pacer.take()) {
            pacer.observe(res.headers());
            if res.status() == http::StatusCode::TOO_MANY_REQUESTS {
                if let Some(wait) = tower_llm_core::retry_after(res.headers()) {
                    pacer.hold_off(wait);
                }
            }
        }
        Poll::Ready(result)
    }
}
