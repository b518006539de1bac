//! Per-call cost of the retry layer on the success path (no retry), side by
//! side with the bare service and `tower::retry::Retry`, plus heap
//! allocations per call from a counting global allocator.
//!
//! ```text
//! cargo bench --bench retry
//! ```
//!
//! All variants call an `http::Request<()>` service that answers at once,
//! polled once with a no-op waker inside a tokio runtime context.
//! `tower::retry::Retry` runs a policy that keeps a copy of the request (as
//! any policy that may retry must) and never retries.

use std::alloc::System;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use stats_alloc::{INSTRUMENTED_SYSTEM, StatsAlloc};
use tower::{Layer, ServiceBuilder};
use tower_llm::deadline::DeadlineLayer;
use tower_llm::retry::RetryLayer;

mod support;
use support::{NeverRetry, allocations, bare, call, current_thread};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

fn bench(c: &mut Criterion) {
    let rt = current_thread();
    let _guard = rt.enter();
    let budget = Duration::from_secs(30);
    let retry = RetryLayer::http();

    let mut report = Vec::new();
    let mut group = c.benchmark_group("retry");

    let mut svc = bare();
    report.push(("bare", allocations(&mut svc, GLOBAL)));
    group.bench_function("bare", |b| b.iter(|| call(&mut svc)));

    let mut svc = tower::retry::RetryLayer::new(NeverRetry).layer(bare());
    report.push(("tower_retry", allocations(&mut svc, GLOBAL)));
    group.bench_function("tower_retry", |b| b.iter(|| call(&mut svc)));

    let mut svc = retry.layer(bare());
    report.push(("llm_retry", allocations(&mut svc, GLOBAL)));
    group.bench_function("llm_retry", |b| b.iter(|| call(&mut svc)));

    let mut svc = DeadlineLayer::new(budget).layer(bare());
    report.push(("llm_deadline", allocations(&mut svc, GLOBAL)));
    group.bench_function("llm_deadline", |b| b.iter(|| call(&mut svc)));

    let mut svc = ServiceBuilder::new()
        .layer(DeadlineLayer::new(budget))
        .layer(tower::retry::RetryLayer::new(NeverRetry))
        .service(bare());
    report.push(("llm_deadline+tower_retry", allocations(&mut svc, GLOBAL)));
    group.bench_function("llm_deadline+tower_retry", |b| b.iter(|| call(&mut svc)));

    let mut svc = ServiceBuilder::new()
        .layer(DeadlineLayer::new(budget))
        .layer(retry.clone())
        .service(bare());
    report.push(("llm_deadline+llm_retry", allocations(&mut svc, GLOBAL)));
    group.bench_function("llm_deadline+llm_retry", |b| b.iter(|| call(&mut svc)));
    group.finish();

    println!("\nheap allocations per call (success path):");
    for (name, (allocs, bytes)) in report {
        println!("  {name:<24} {allocs:>5.2} allocations, {bytes:>7.1} bytes");
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
