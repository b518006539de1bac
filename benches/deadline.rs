//! Per-call cost of the deadline layer, side by side with the bare service
//! and `tower::timeout::Timeout`, on the success path.
//!
//! ```text
//! cargo bench --bench deadline
//! ```
//!
//! Each call builds an `http::Request<()>`, checks readiness and polls the
//! response future once with a no-op waker inside a tokio runtime context;
//! the inner service answers at once, so what is measured is the layer.

use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use tower::{Layer, Service, service_fn};
use tower_llm::Failure;
use tower_llm::deadline::DeadlineLayer;

mod support;
use support::{call, call_with, current_thread};

/// One call with a request whose extensions are already in use, as a
/// server framework's requests usually are (axum adds its own entries).
fn call_used<S>(svc: &mut S) -> bool
where
    S: Service<http::Request<()>, Response = http::Response<()>>,
{
    let mut req = http::Request::new(());
    req.extensions_mut().insert(RouteTag(7));
    call_with(svc, req)
}

#[derive(Clone, Copy)]
struct RouteTag(#[allow(dead_code)] u32);

fn bench(c: &mut Criterion) {
    let rt = current_thread();
    let _guard = rt.enter();
    let budget = Duration::from_secs(30);
    let bare = || {
        service_fn(|_req: http::Request<()>| {
            std::future::ready(Ok::<_, Failure>(http::Response::new(())))
        })
    };

    let mut group = c.benchmark_group("deadline");
    let mut svc = bare();
    group.bench_function("bare", |b| b.iter(|| call(&mut svc)));
    let mut svc = tower::timeout::TimeoutLayer::new(budget).layer(bare());
    group.bench_function("tower_timeout", |b| b.iter(|| call(&mut svc)));
    let mut svc = DeadlineLayer::new(budget).layer(bare());
    group.bench_function("llm_deadline", |b| b.iter(|| call(&mut svc)));
    group.finish();

    let mut group = c.benchmark_group("deadline_used_extensions");
    let mut svc = bare();
    group.bench_function("bare", |b| b.iter(|| call_used(&mut svc)));
    let mut svc = tower::timeout::TimeoutLayer::new(budget).layer(bare());
    group.bench_function("tower_timeout", |b| b.iter(|| call_used(&mut svc)));
    let mut svc = DeadlineLayer::new(budget).layer(bare());
    group.bench_function("llm_deadline", |b| b.iter(|| call_used(&mut svc)));
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
