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
