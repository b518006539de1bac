//! The fallback layer's cost when the primary succeeds (a chain of three
//! links), side by side with the bare service, plus heap allocations per
//! call.
//!
//! ```text
//! cargo bench --bench fallback
//! ```

use std::alloc::System;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use stats_alloc::{INSTRUMENTED_SYSTEM, StatsAlloc};
use tower::{Layer, ServiceBuilder};
use tower_llm::deadline::DeadlineLayer;
use tower_llm::fallback::{FallbackLayer, LinkSpec};

mod support;
use support::{allocations, bare, call, current_thread};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

fn three_links() -> FallbackLayer<http::Request<()>, http::Response<()>, tower_llm::HttpClassifier>
{
    FallbackLayer::builder(LinkSpec::new("openai", "gpt-4o"))
        .or(LinkSpec::new("anthropic", "claude-sonnet-4-5"), bare())
        .or(LinkSpec::new("bedrock", "nova-pro"), bare())
        .with_classifier(tower_llm::HttpClassifier)
        .build()
        .expect("valid chain")
}

fn bench(c: &mut Criterion) {
    let rt = current_thread();
    let _guard = rt.enter();
    let mut report = Vec::new();
    let mut group = c.benchmark_group("fallback");

    let mut svc = bare();
    report.push(("bare", allocations(&mut svc, GLOBAL)));
    group.bench_function("bare", |b| b.iter(|| call(&mut svc)));

    let mut svc = three_links().layer(bare());
    report.push(("llm_fallback_3_links", allocations(&mut svc, GLOBAL)));
    group.bench_function("llm_fallback_3_links", |b| b.iter(|| call(&mut svc)));

    let mut svc = DeadlineLayer::new(Duration::from_secs(30)).layer(bare());
    report.push(("llm_deadline", allocations(&mut svc, GLOBAL)));
    group.bench_function("llm_deadline", |b| b.iter(|| call(&mut svc)));

    let mut svc = ServiceBuilder::new()
        .layer(DeadlineLayer::new(Duration::from_secs(30)))
        .layer(three_links())
        .service(bare());
    report.push(("llm_deadline+llm_fallback", allocations(&mut svc, GLOBAL)));
    group.bench_function("llm_deadline+llm_fallback", |b| b.iter(|| call(&mut svc)));
    group.finish();

    println!("\nheap allocations per call (primary succeeds):");
    for (name, (allocs, bytes)) in report {
        println!("  {name:<26} {allocs:>5.2} allocations, {bytes:>7.1} bytes");
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
