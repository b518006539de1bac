//! Helpers shared by the benches: drive an always-ready service by hand.

#![allow(dead_code)]

use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use tower::Service;

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
