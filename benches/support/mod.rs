//! Helpers shared by the benches: the bare service, the full stack, the
//! runtime, and driving an always-ready service by hand.

#![allow(dead_code)]

use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tower::{Service, ServiceBuilder, service_fn};
use tower_llm::breaker::{BreakerLayer, LinkKey};
use tower_llm::deadline::DeadlineLayer;
use tower_llm::fallback::{FallbackLayer, LinkSpec};
use tower_llm::retry::RetryLayer;
use tower_llm::{Failure, HttpClassifier, Metrics, ServiceBuilderExt};

pub(crate) type Req = http::Request<()>;
pub(crate) type Res = http::Response<()>;
/// The bare service: answers at once.
pub(crate) type Bare = tower::util::ServiceFn<fn(Req) -> std::future::Ready<Result<Res, Failure>>>;

/// A service that answers at once.
pub(crate) fn bare() -> Bare {
    service_fn(|_req: Req| std::future::ready(Ok(http::Response::new(()))))
}

/// A current-thread runtime with a timer: enter it (`let _guard =
/// rt.enter();`) so the layers find tokio's clock.
pub(crate) fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime")
}

/// deadline (30 s, per-call metrics on `metrics`) → fallback (3 links) →
/// retry → `breaker`, per link, around [`bare`].
pub(crate) fn full_stack(
    breaker: BreakerLayer<LinkKey, HttpClassifier>,
    metrics: Metrics,
) -> impl Service<Req, Response = Res, Error = Failure, Future: Send> + Clone + Send + 'static {
    let link = || {
        ServiceBuilder::new()
            .llm_retry(RetryLayer::http())
            .llm_breaker(breaker.clone())
            .service(bare())
    };
    let fallback = FallbackLayer::builder(LinkSpec::new("openai", "gpt-4o"))
        .or(LinkSpec::new("anthropic", "claude-sonnet-4-5"), link())
        .or(LinkSpec::new("bedrock", "nova-pro"), link())
        .with_classifier(HttpClassifier)
        .build()
        .expect("valid chain");
    ServiceBuilder::new()
        .layer(DeadlineLayer::new(Duration::from_secs(30)).with_metrics(metrics))
        .llm_fallback(fallback)
        .service(link())
}

/// Polls a future that must be ready at once, with a no-op waker.
pub(crate) fn now_or_never<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("the benchmarked service is always ready"),
    }
}

/// One call with `req`: readiness, then the response future polled once.
pub(crate) fn call_with<S>(svc: &mut S, req: http::Request<()>) -> bool
where
    S: Service<http::Request<()>, Response = http::Response<()>>,
{
    if now_or_never(std::future::poll_fn(|cx| svc.poll_ready(cx))).is_err() {
        return false;
    }
    now_or_never(svc.call(black_box(req))).is_ok()
}

/// One call with a fresh request (no extensions allocated yet).
pub(crate) fn call<S>(svc: &mut S) -> bool
where
    S: Service<http::Request<()>, Response = http::Response<()>>,
{
    call_with(svc, http::Request::new(()))
}

/// Heap allocations and bytes per call over 10,000 calls, counted by the
/// bench binary's instrumented global allocator.
pub(crate) fn allocations<S>(
    svc: &mut S,
    allocator: &'static stats_alloc::StatsAlloc<std::alloc::System>,
) -> (f64, f64)
where
    S: Service<http::Request<()>, Response = http::Response<()>>,
{
    const N: usize = 10_000;
    call(svc);
    let region = stats_alloc::Region::new(allocator);
    for _ in 0..N {
        call(svc);
    }
    let stats = region.change();
    let allocs = stats.allocations + stats.reallocations;
    (
        allocs as f64 / N as f64,
        stats.bytes_allocated as f64 / N as f64,
    )
}

/// A `tower::retry` policy that keeps a copy of the request (as any
/// retrying policy must) and never retries.
#[derive(Clone)]
pub(crate) struct NeverRetry;

impl<Req: Clone, Res, E> tower::retry::Policy<Req, Res, E> for NeverRetry {
    type Future = std::future::Ready<()>;
    fn retry(&mut self, _: &mut Req, _: &mut Result<Res, E>) -> Option<Self::Future> {
        None
    }
    fn clone_request(&mut self, req: &Req) -> Option<Req> {
        Some(req.clone())
    }
}

/// Median nanoseconds per call of `a` and `b`, timed alternately (41
/// rounds of 20,000 calls) so that a VM's drift hits both alike.
pub(crate) fn paired<A, B>(a: &mut A, b: &mut B) -> (f64, f64)
where
    A: Service<http::Request<()>, Response = http::Response<()>>,
    B: Service<http::Request<()>, Response = http::Response<()>>,
{
    const N: u32 = 20_000;
    let (mut ta, mut tb) = (Vec::new(), Vec::new());
    for _ in 0..41 {
        let t = std::time::Instant::now();
        for _ in 0..N {
            black_box(call(a));
        }
        ta.push(t.elapsed().as_nanos() as f64 / f64::from(N));
        let t = std::time::Instant::now();
        for _ in 0..N {
            black_box(call(b));
        }
        tb.push(t.elapsed().as_nanos() as f64 / f64::from(N));
    }
    ta.sort_by(f64::total_cmp);
    tb.sort_by(f64::total_cmp);
    (ta[20], tb[20])
}

/// One call with a typed request `req` to a service that answers at once:
/// readiness, then the response future polled once.
pub(crate) fn call_typed<S: Service<tower_llm::ChatRequest>>(
    svc: &mut S,
    req: tower_llm::ChatRequest,
) -> bool {
    if now_or_never(std::future::poll_fn(|cx| svc.poll_ready(cx))).is_err() {
        return false;
    }
    now_or_never(svc.call(black_box(req))).is_ok()
}

/// Median nanoseconds per call of `a` and `b` on typed requests (from `ra`
/// and `rb`), timed alternately as [`paired`] does.
pub(crate) fn paired_typed<A, B>(
    a: &mut A,
    ra: &mut impl FnMut() -> tower_llm::ChatRequest,
    b: &mut B,
    rb: &mut impl FnMut() -> tower_llm::ChatRequest,
) -> (f64, f64)
where
    A: Service<tower_llm::ChatRequest>,
    B: Service<tower_llm::ChatRequest>,
{
    const N: u32 = 20_000;
    let (mut ta, mut tb) = (Vec::new(), Vec::new());
    for _ in 0..41 {
        let t = std::time::Instant::now();
        for _ in 0..N {
            black_box(call_typed(a, ra()));
        }
        ta.push(t.elapsed().as_nanos() as f64 / f64::from(N));
        let t = std::time::Instant::now();
        for _ in 0..N {
            black_box(call_typed(b, rb()));
        }
        tb.push(t.elapsed().as_nanos() as f64 / f64::from(N));
    }
    ta.sort_by(f64::total_cmp);
    tb.sort_by(f64::total_cmp);
    (ta[20], tb[20])
}

/// The `tower-resilience` crate's time limiter (30 s) → retry (3 attempts,
/// 200 ms exponential) → circuit breaker (50 % over 100 calls) around
/// `$inner` (requests `$req`, answers `$res`): the peer every stack bench
/// compares with. A macro, because the crate's types are long to name.
#[allow(unused_macros)] // not every bench compares with it
macro_rules! resilience_stack {
    ($inner:expr, $req:ty, $res:ty) => {{
        use tower::Layer as _;
        let breaker = tower_resilience_circuitbreaker::CircuitBreakerLayer::builder()
            .failure_rate_threshold(0.5)
            .sliding_window_size(100)
            .wait_duration_in_open(std::time::Duration::from_secs(30))
            .build()
            .expect("valid breaker config");
        let retry = tower_resilience_retry::RetryLayer::<
            $req,
            $res,
            tower_resilience_circuitbreaker::CircuitBreakerError<tower_llm::Failure>,
        >::builder()
        .max_attempts(3)
        .exponential_backoff(std::time::Duration::from_millis(200))
        .build();
        let limiter = tower_resilience_timelimiter::TimeLimiterLayer::builder()
            .timeout_duration(std::time::Duration::from_secs(30))
            .cancel_running_future(true)
            .build();
        limiter.layer(retry.layer(breaker.layer($inner)))
    }};
}
#[allow(unused_imports)]
pub(crate) use resilience_stack;
