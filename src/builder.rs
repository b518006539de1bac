//! [`ServiceBuilderExt`]: tower-llm's layers as `ServiceBuilder` methods.

use std::time::Duration;

use tower::ServiceBuilder;
use tower::layer::util::Stack;
use tower_llm_breaker::BreakerLayer;
use tower_llm_deadline::DeadlineLayer;
use tower_llm_fallback::FallbackLayer;
use tower_llm_hedge::HedgeLayer;
use tower_llm_retry::RetryLayer;

mod sealed {
    pub trait Sealed<L> {}
    impl<L> Sealed<L> for tower::ServiceBuilder<L> {}
}

/// Adds tower-llm's layers to [`tower::ServiceBuilder`].
///
/// The method names never clash with tower's own `retry` and `timeout`.
/// Layers run outermost first, in the order you add them; the order that
/// makes them work together is
///
/// ```text
/// deadline → fallback → retry → breaker → provider
/// ```
///
/// - **deadline** outermost: every retry and failover spends one budget.
/// - **fallback** outside retry: each link gets its own retries.
/// - **breaker** inside retry: each attempt is admitted or refused; an open
///   circuit is never retried, it goes straight to the next link.
///
/// This trait is sealed: only `ServiceBuilder` implements it.
///
/// ```
/// use std::time::Duration;
/// use tower::{service_fn, ServiceBuilder, ServiceExt};
/// use tower_llm::prelude::*;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let svc = ServiceBuilder::new()
///     .llm_deadline(Duration::from_secs(30))
///     .llm_retry(RetryLayer::http().with_max_attempts(3))
///     .llm_breaker(BreakerLayer::http())
///     .service(service_fn(|req: http::Request<()>| async move {
///         let left = Deadline::remaining_in(&req).unwrap();
///         Ok::<_, Failure>(http::Response::new(left))
///     }));
/// let res = svc.oneshot(http::Request::new(())).await.unwrap();
/// assert_eq!(*res.body(), Duration::from_secs(30));
/// # }
/// ```
pub trait ServiceBuilderExt<L>: sealed::Sealed<L> + Sized {
    /// Adds a [`DeadlineLayer`] giving each call at most `budget`.
    fn llm_deadline(self, budget: Duration) -> ServiceBuilder<Stack<DeadlineLayer, L>>;

    /// Adds a [`FallbackLayer`] (built with `FallbackLayer::builder`). Put it
    /// inside the deadline layer and outside each link's retry and breaker.
    fn llm_fallback<Req, Res, C>(
        self,
        fallback: FallbackLayer<Req, Res, C>,
    ) -> ServiceBuilder<Stack<FallbackLayer<Req, Res, C>, L>>;

    /// Adds a [`RetryLayer`] (build it with `RetryLayer::new()` for chat
    /// services or `RetryLayer::http()` for raw HTTP). Put it inside the
    /// deadline and fallback layers, outside the breaker.
    fn llm_retry<C>(self, retry: RetryLayer<C>) -> ServiceBuilder<Stack<RetryLayer<C>, L>>;

    /// Adds a [`HedgeLayer`] (one per link). Put it inside the fallback
    /// layer, outside the link's retry and breaker.
    fn llm_hedge(self, hedge: HedgeLayer) -> ServiceBuilder<Stack<HedgeLayer, L>>;

    /// Adds a [`BreakerLayer`] (`BreakerLayer::new()` for chat services,
    /// `BreakerLayer::http()` for raw HTTP). Put it inside the retry layer,
    /// right around the provider.
    fn llm_breaker<K, C>(
        self,
        breaker: BreakerLayer<K, C>,
    ) -> ServiceBuilder<Stack<BreakerLayer<K, C>, L>>;
}

impl<L> ServiceBuilderExt<L> for ServiceBuilder<L> {
    fn llm_deadline(self, budget: Duration) -> ServiceBuilder<Stack<DeadlineLayer, L>> {
        self.layer(DeadlineLayer::new(budget))
    }

    fn llm_fallback<Req, Res, C>(
        self,
        fallback: FallbackLayer<Req, Res, C>,
    ) -> ServiceBuilder<Stack<FallbackLayer<Req, Res, C>, L>> {
        self.layer(fallback)
    }

    fn llm_retry<C>(self, retry: RetryLayer<C>) -> ServiceBuilder<Stack<RetryLayer<C>, L>> {
        self.layer(retry)
    }

    fn llm_hedge(self, hedge: HedgeLayer) -> ServiceBuilder<Stack<HedgeLayer, L>> {
        self.layer(hedge)
    }

    fn llm_breaker<K, C>(
        self,
        breaker: BreakerLayer<K, C>,
    ) -> ServiceBuilder<Stack<BreakerLayer<K, C>, L>> {
        self.layer(breaker)
    }
}
