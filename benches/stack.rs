//! The whole stack, healthy and failing fast, side by side with the bare
//! service and the peers in one run:
//!
//! - bare: a service that answers at once;
//! - tower-llm: deadline → fallback (3 links) → retry → breaker, per link;
//! - the same with the primary's circuit open (fast-fail into link 2);
//! - `tower::timeout` + `tower::retry` (a policy that keeps a copy of the
//!   request, as any retrying policy must, and never retries);
//! - the `tower-resilience` crate's time limiter → retry → circuit breaker.
//!
//! Per call, each variant and the bare service are timed alternately (41
//! rounds, medians) so that this VM's drift hits both alike; criterion
//! groups follow. Heap allocations per call are counted with `stats_alloc`,
//! and the contended case runs 2 worker threads × 64 tasks on one key.
//!
//! ```text
//! cargo bench --bench stack
//! ```
//!
//! `STACK_PROFILE=variant:calls` makes only that many calls of one variant
//! (`bare`, `healthy`, `open`, `tower`, `resilience`, `deadline`,
//! `deadline+retry`) and exits: `scripts/instructions.py` runs it under
//! callgrind for instruction counts that do not drift with the VM.

use std::alloc::System;
use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use stats_alloc::{INSTRUMENTED_SYSTEM, StatsAlloc};
use tower::{Layer, Service, ServiceBuilder, ServiceExt};
use tower_llm::breaker::{BreakerKey, BreakerLayer};
use tower_llm::deadline::DeadlineLayer;
use tower_llm::fallback::{FallbackLayer, LinkSpec};
use tower_llm::retry::RetryLayer;
use tower_llm::{Failure, HttpClassifier, Metrics, ServiceBuilderExt};

mod support;
use support::{NeverRetry, Req, Res, allocations, bare, call, current_thread, full_stack, paired};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// The full stack, and its breaker layer (to open the primary's circuit).
fn ours() -> (
    impl Service<Req, Response = Res, Error = Failure, Future: Send> + Clone + Send + 'static,
    BreakerLayer<tower_llm::breaker::LinkKey, HttpClassifier>,
) {
    let breaker = BreakerLayer::http();
    (full_stack(breaker.clone(), Metrics::global()), breaker)
}

fn tower_peer() -> impl Service<Req, Response = Res, Error = tower::BoxError> + Clone {
    ServiceBuilder::new()
        .timeout(Duration::from_secs(30))
        .retry(NeverRetry)
        .service(bare())
}

fn resilience_peer() -> impl Service<Req, Response = Res> + Clone + Send + 'static {
    support::resilience_stack!(bare(), Req, Res)
}

const TASKS: usize = 64;
const CALLS: usize = 200;

/// Nanoseconds per call with TASKS tasks of CALLS calls on `rt`.
fn contended<S>(rt: &tokio::runtime::Runtime, svc: &S) -> f64
where
    S: Service<Req, Response = Res> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send,
{
    let mut best = f64::MAX;
    for _ in 0..7 {
        let start = Instant::now();
        rt.block_on(async {
            let mut tasks = tokio::task::JoinSet::new();
            for _ in 0..TASKS {
                let svc = svc.clone();
                tasks.spawn(async move {
                    for _ in 0..CALLS {
                        let _ = black_box(svc.clone().oneshot(http::Request::new(())).await);
                    }
                });
            }
            while tasks.join_next().await.is_some() {}
        });
        let ns = start.elapsed().as_nanos() as f64 / (TASKS * CALLS) as f64;
        best = best.min(ns);
    }
    best
}

/// `STACK_PROFILE=variant:calls`: makes `calls` calls of one variant and
/// exits, for `valgrind --tool=callgrind` (see `scripts/instructions.py`).
fn profile_only() {
    let Ok(spec) = std::env::var("STACK_PROFILE") else {
        return;
    };
    let (variant, calls) = spec.split_once(':').unwrap_or((&spec, "1000"));
    let calls: usize = calls.parse().expect("STACK_PROFILE=variant:calls");
    fn run<S>(mut svc: S, calls: usize)
    where
        S: Service<Req, Response = Res>,
    {
        for _ in 0..calls {
            black_box(call(&mut svc));
        }
    }
    match variant {
        "bare" => run(bare(), calls),
        "healthy" => run(ours().0, calls),
        "open" => {
            let (mut svc, breaker) = ours();
            call(&mut svc);
            assert!(
                breaker
                    .handle()
                    .isolate(&BreakerKey::new("openai", "gpt-4o"))
            );
            run(svc, calls);
        }
        "tower" => run(tower_peer(), calls),
        "deadline" => run(
            ServiceBuilder::new()
                .llm_deadline(Duration::from_secs(30))
                .service(bare()),
            calls,
        ),
        "deadline+retry" => run(
            ServiceBuilder::new()
                .llm_deadline(Duration::from_secs(30))
                .llm_retry(RetryLayer::http())
                .service(bare()),
            calls,
        ),
        "resilience" => run(resilience_peer(), calls),
        other => panic!(
            "unknown variant {other}: bare, healthy, open, tower, resilience, deadline, deadline+retry"
        ),
    }
    std::process::exit(0);
}

fn bench(c: &mut Criterion) {
    let rt = current_thread();
    let _guard = rt.enter();
    profile_only();

    let mut plain = bare();
    let (mut healthy, _) = ours();
    let (mut failing, breaker) = ours();
    assert!(
        breaker
            .handle()
            .isolate(&BreakerKey::new("openai", "gpt-4o"))
            || {
                // The circuit is created on first use: make one call, then isolate.
                call(&mut failing);
                breaker
                    .handle()
                    .isolate(&BreakerKey::new("openai", "gpt-4o"))
            }
    );
    let mut tower_stack = tower_peer();
    let mut resilience = resilience_peer();

    println!("\nper call, paired medians against the bare service in the same rounds:");
    for (name, (b, v)) in [
        (
            "tower-llm full stack, healthy",
            paired(&mut plain, &mut healthy),
        ),
        (
            "tower-llm full stack, primary circuit open",
            paired(&mut plain, &mut failing),
        ),
        (
            "tower::timeout + tower::retry",
            paired(&mut plain, &mut tower_stack),
        ),
        (
            "tower-resilience limiter + retry + breaker",
            paired(&mut plain, &mut resilience),
        ),
    ] {
        println!(
            "  {name:<44} {v:>7.0} ns  (bare {b:.0} ns, +{:.0} ns)",
            v - b
        );
    }

    println!("\nheap allocations per call (10,000 calls):");
    let report = |name: &str, allocs: (f64, f64)| {
        println!(
            "  {name:<44} {:>5.2} allocations, {:>7.1} bytes",
            allocs.0, allocs.1
        );
    };
    report("bare", allocations(&mut plain, GLOBAL));
    report(
        "DeadlineLayer",
        allocations(
            &mut DeadlineLayer::new(Duration::from_secs(30)).layer(bare()),
            GLOBAL,
        ),
    );
    report(
        "RetryLayer",
        allocations(&mut RetryLayer::http().layer(bare()), GLOBAL),
    );
    report(
        "BreakerLayer",
        allocations(&mut BreakerLayer::http().layer(bare()), GLOBAL),
    );
    report(
        "FallbackLayer (3 links)",
        allocations(
            &mut FallbackLayer::builder(LinkSpec::new("openai", "gpt-4o"))
                .or(LinkSpec::new("anthropic", "claude-sonnet-4-5"), bare())
                .or(LinkSpec::new("bedrock", "nova-pro"), bare())
                .with_classifier(HttpClassifier)
                .build()
                .expect("valid chain")
                .layer(bare()),
            GLOBAL,
        ),
    );
    report("full stack, healthy", allocations(&mut healthy, GLOBAL));
    report(
        "full stack, primary circuit open",
        allocations(&mut failing, GLOBAL),
    );
    report(
        "tower::timeout + tower::retry",
        allocations(&mut tower_stack, GLOBAL),
    );

    let workers = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .expect("runtime");
    let single = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_time()
        .build()
        .expect("runtime");
    let (healthy_svc, _) = ours();
    let one = contended(&single, &healthy_svc);
    let two = contended(&workers, &healthy_svc);
    let bare_two = contended(&workers, &bare());
    println!(
        "\ncontended, {TASKS} tasks × {CALLS} calls, one breaker key (each call through oneshot on a clone):"
    );
    println!("  bare, 2 workers            {bare_two:>7.0} ns per call");
    println!("  full stack, 1 worker       {one:>7.0} ns per call");
    println!(
        "  full stack, 2 workers      {two:>7.0} ns per call of wall time ({:.2}× the 1-worker cost per call of CPU)",
        2.0 * two / one
    );

    let mut group = c.benchmark_group("stack");
    group.bench_function("bare", |b| b.iter(|| call(&mut plain)));
    group.bench_function("tower_llm_healthy", |b| b.iter(|| call(&mut healthy)));
    group.bench_function("tower_llm_primary_open", |b| b.iter(|| call(&mut failing)));
    group.bench_function("tower_timeout_retry", |b| b.iter(|| call(&mut tower_stack)));
    group.bench_function("tower_resilience", |b| b.iter(|| call(&mut resilience)));
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
