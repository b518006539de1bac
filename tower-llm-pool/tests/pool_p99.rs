//! One slow deployment among three: the pool's power of two choices keeps
//! the tail short where a plain round robin sends every third call to the
//! slow one. Virtual time: 300 calls, one every 10 ms.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use tower::util::BoxCloneSyncService;
use tower::{ServiceExt, service_fn};
use tower_llm_core::{ChatRequest, ChatResponse, Failure, Message};
use tower_llm_pool::{Deployment, Pool};
use tower_llm_retry::SplitMix64;

type Svc = BoxCloneSyncService<ChatRequest, ChatResponse, Failure>;

const CALLS: usize = 300;
const EVERY: Duration = Duration::from_millis(10);

/// A deployment answering every call after `ms` milliseconds, counting
/// its calls.
fn deployment(ms: u64, calls: &Arc<AtomicUsize>) -> Svc {
    let calls = calls.clone();
    BoxCloneSyncService::new(service_fn(move |req: ChatRequest| {
        calls.fetch_add(1, Ordering::SeqCst);
        async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Ok(ChatResponse::builder(req.model.to_string()).build())
        }
    }))
}

/// The slow one (1,000 ms) and two fast ones (50 ms), and their counters.
fn three() -> ([Svc; 3], [Arc<AtomicUsize>; 3]) {
    let counts: [Arc<AtomicUsize>; 3] = Default::default();
    let services = [
        deployment(1_000, &counts[0]),
        deployment(50, &counts[1]),
        deployment(50, &counts[2]),
    ];
    (services, counts)
}

fn pool_of(services: [Svc; 3]) -> Pool<Svc> {
    let [slow, fast_1, fast_2] = services;
    Pool::new(vec![
        Deployment::new("slow", slow),
        Deployment::new("fast-1", fast_1),
        Deployment::new("fast-2", fast_2),
    ])
    .with_random(Arc::new(SplitMix64::seeded(2024)))
}

/// A plain round robin over the same services: call `n` goes to `n % 3`.
fn round_robin(services: [Svc; 3]) -> Svc {
    let next = Arc::new(AtomicUsize::new(0));
    BoxCloneSyncService::new(service_fn(move |req: ChatRequest| {
        let i = next.fetch_add(1, Ordering::SeqCst) % services.len();
        services[i].clone().oneshot(req)
    }))
}

/// Sends `CALLS` calls through `service`, one every `EVERY`, and returns
/// each one's latency.
async fn steady<S>(service: S) -> Vec<Duration>
where
    S: tower::Service<ChatRequest, Response = ChatResponse, Error = Failure>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
{
    let mut calls = Vec::with_capacity(CALLS);
    for _ in 0..CALLS {
        let service = service.clone();
        calls.push(tokio::spawn(async move {
            let started = Instant::now();
            service
                .oneshot(ChatRequest::new("gpt-4o", vec![Message::user("hi")]))
                .await
                .expect("answers");
            started.elapsed()
        }));
        tokio::time::sleep(EVERY).await;
    }
    let mut latencies = Vec::with_capacity(CALLS);
    for call in calls {
        latencies.push(call.await.expect("joins"));
    }
    latencies
}

/// The 99th percentile (nearest rank).
fn p99(mut latencies: Vec<Duration>) -> Duration {
    latencies.sort();
    let rank = (latencies.len() * 99).div_ceil(100);
    latencies[rank - 1]
}

fn counts(c: &[Arc<AtomicUsize>; 3]) -> [usize; 3] {
    [0, 1, 2].map(|i| c[i].load(Ordering::SeqCst))
}

/// Both from cold: no deployment has answered yet when the 300 calls
/// start.
#[tokio::test(start_paused = true)]
async fn from_cold_two_choices_p99_is_well_below_round_robin() {
    let (services, rr_counts) = three();
    let rr = p99(steady(round_robin(services)).await);
    let (services, pool_counts) = three();
    let pool = p99(steady(pool_of(services)).await);
    eprintln!(
        "cold: p99 round robin {rr:?} (slow/fast/fast calls {:?}), \
         power of two choices {pool:?} ({:?})",
        counts(&rr_counts),
        counts(&pool_counts)
    );
    assert_eq!(rr, Duration::from_millis(1_000));
    assert!(pool * 4 <= rr, "pool p99 {pool:?} vs round robin {rr:?}");
}

/// After a warm-up that lets each deployment answer once (one call at a
/// time, until each has a latency), the pool's p99 is the fast ones'
/// 50 ms, round robin's the slow one's 1,000 ms.
#[tokio::test(start_paused = true)]
async fn warmed_up_two_choices_p99_is_well_below_round_robin() {
    let (services, rr_counts) = three();
    let rr = p99(steady(round_robin(services)).await);

    let (services, pool_counts) = three();
    let pool = pool_of(services);
    let mut warm_up = 0;
    while pool.status().iter().any(|s| s.load.latency_ms == 0.0) {
        pool.clone()
            .oneshot(ChatRequest::new("gpt-4o", vec![Message::user("hi")]))
            .await
            .expect("answers");
        warm_up += 1;
        assert!(warm_up < 20, "every deployment answers once");
    }
    let before = counts(&pool_counts);
    let p2c = p99(steady(pool.clone()).await);
    let after = counts(&pool_counts);
    let during = [0, 1, 2].map(|i| after[i] - before[i]);
    eprintln!(
        "warmed up ({warm_up} calls): p99 round robin {rr:?} (slow/fast/fast calls {:?}), \
         power of two choices {p2c:?} ({during:?})",
        counts(&rr_counts),
    );
    assert_eq!(rr, Duration::from_millis(1_000));
    assert_eq!(counts(&rr_counts), [100, 100, 100]);
    assert!(p2c * 4 <= rr, "pool p99 {p2c:?} vs round robin {rr:?}");
    assert!(
        during[0] <= 3,
        "the slow one gets under 1 % of calls: {during:?}"
    );
}
