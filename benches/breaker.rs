//! The circuit breaker's cost on the success path, side by side with the
//! bare service and the `tower-resilience` crate's circuit breaker, one call
//! at a time and contended (2 worker threads × 64 tasks, one key and 1,000
//! keys).
//!
//! ```text
//! cargo bench --bench breaker
//! ```

use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tower::{Layer, Service, ServiceExt};
use tower_llm::Link;
use tower_llm::breaker::BreakerLayer;

mod support;
use support::{Bare, bare, call, current_thread};

type Resilience = tower_resilience_circuitbreaker::CircuitBreaker<
    Bare,
    tower_resilience_circuitbreaker::DefaultClassifier,
>;

fn resilience() -> Resilience {
    tower_resilience_circuitbreaker::CircuitBreakerLayer::builder()
        .failure_rate_threshold(0.5)
        .sliding_window_size(100)
        .wait_duration_in_open(Duration::from_secs(30))
        .build()
        .expect("valid breaker config")
        .layer(bare())
}

fn single(c: &mut Criterion) {
    let rt = current_thread();
    let _guard = rt.enter();
    let mut group = c.benchmark_group("breaker");
    let mut svc = bare();
    group.bench_function("bare", |b| b.iter(|| call(&mut svc)));
    let mut svc = BreakerLayer::http().layer(bare());
    group.bench_function("llm_breaker", |b| b.iter(|| call(&mut svc)));
    let mut svc = resilience();
    group.bench_function("tower_resilience", |b| b.iter(|| call(&mut svc)));
    group.finish();
}

const TASKS: usize = 64;
const CALLS: usize = 100;

/// Runs TASKS tasks of CALLS calls each on a 2-worker runtime; request
/// `i` of a task carries `links[i % links.len()]` when links are given.
fn contended<S>(rt: &tokio::runtime::Runtime, svc: &S, links: &[Link], iters: u64) -> Duration
where
    S: Service<http::Request<()>, Response = http::Response<()>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send,
{
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        let start = Instant::now();
        rt.block_on(async {
            let mut tasks = tokio::task::JoinSet::new();
            for t in 0..TASKS {
                let svc = svc.clone();
                let links = links.to_vec();
                tasks.spawn(async move {
                    for i in 0..CALLS {
                        let mut req = http::Request::new(());
                        if !links.is_empty() {
                            req.extensions_mut()
                                .insert(links[(t * CALLS + i) % links.len()].clone());
                        }
                        let _ = svc.clone().oneshot(req).await;
                    }
                });
            }
            while tasks.join_next().await.is_some() {}
        });
        total += start.elapsed();
    }
    total
}

fn contention(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .expect("runtime");
    let one_key = vec![Link::new("openai", "gpt-4o-mini")];
    let many_keys: Vec<_> = (0..1000)
        .map(|i| Link::new("openai", format!("model-{i}")))
        .collect();

    let mut group = c.benchmark_group("breaker_contended");
    group.throughput(Throughput::Elements((TASKS * CALLS) as u64));
    group.sample_size(20);
    let svc = bare();
    group.bench_function("bare", |b| {
        b.iter_custom(|n| contended(&rt, &svc, &one_key, n))
    });
    let svc = BreakerLayer::http().layer(bare());
    group.bench_function("llm_breaker_1_key", |b| {
        b.iter_custom(|n| contended(&rt, &svc, &one_key, n))
    });
    let svc = BreakerLayer::http().layer(bare());
    group.bench_function("llm_breaker_1000_keys", |b| {
        b.iter_custom(|n| contended(&rt, &svc, &many_keys, n))
    });
    let svc = resilience();
    group.bench_function("tower_resilience_1_key", |b| {
        b.iter_custom(|n| contended(&rt, &svc, &one_key, n))
    });
    group.finish();
}

criterion_group!(benches, single, contention);
criterion_main!(benches);
