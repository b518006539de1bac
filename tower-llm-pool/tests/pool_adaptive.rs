//! Adaptive concurrency (AIMD) per deployment: its own faults cut its
//! limit, successes raise it back, and a deployment at its limit is
//! skipped. Virtual time throughout.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use tower::util::BoxCloneSyncService;
use tower::{ServiceExt, service_fn};
use tower_llm_core::{ChatRequest, ChatResponse, Failure, FailureClass, Message};
use tower_llm_pool::{Deployment, Pool};

type Svc = BoxCloneSyncService<ChatRequest, ChatResponse, Failure>;

/// A deployment that fails (429, no Retry-After) while `failing` is set,
/// else answers after 100 ms; counts its calls.
fn flaky(failing: &Arc<AtomicBool>, calls: &Arc<AtomicUsize>) -> Svc {
    let (failing, calls) = (failing.clone(), calls.clone());
    BoxCloneSyncService::new(service_fn(move |_req: ChatRequest| {
        calls.fetch_add(1, Ordering::SeqCst);
        let fail = failing.load(Ordering::SeqCst);
        async move {
            if fail {
                return Err(Failure::new(FailureClass::RateLimited));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            Ok(ChatResponse::builder("m").text("ok").build())
        }
    }))
}

fn hello() -> ChatRequest {
    ChatRequest::new("m", vec![Message::user("hi")])
}

#[tokio::test(start_paused = true)]
async fn a_deployment_s_own_faults_cut_its_limit_and_successes_raise_it() {
    let failing = Arc::new(AtomicBool::new(true));
    let calls = Arc::new(AtomicUsize::new(0));
    let pool = Pool::new(vec![Deployment::new("flaky", flaky(&failing, &calls))])
        .with_adaptive_concurrency(8);
    let limit = |pool: &Pool<Svc>| pool.status()[0].load.concurrency_limit.expect("on");
    assert_eq!(limit(&pool), 8.0);
    // Each fault cuts the limit by 30 %: 8, 5.6, 3.92, 2.74, 1.92, 1.34, 1.
    let mut seen = Vec::new();
    for _ in 0..6 {
        let failure = pool
            .clone()
            .oneshot(hello())
            .await
            .expect_err("its own fault");
        assert_eq!(failure.class(), FailureClass::RateLimited);
        seen.push((limit(&pool) * 100.0).round() / 100.0);
    }
    assert_eq!(seen, [5.6, 3.92, 2.74, 1.92, 1.34, 1.0]);
    // Healthy again: each success adds one over the limit.
    failing.store(false, Ordering::SeqCst);
    pool.clone().oneshot(hello()).await.expect("served");
    assert_eq!(limit(&pool), 2.0);
    for _ in 0..100 {
        pool.clone().oneshot(hello()).await.expect("served");
    }
    let raised = limit(&pool);
    assert!((14.0_f64.sqrt()..=8.0).contains(&raised), "{raised}");
    assert_eq!(calls.load(Ordering::SeqCst), 107);
}

#[tokio::test(start_paused = true)]
async fn a_deployment_at_its_limit_is_skipped() {
    let never = Arc::new(AtomicBool::new(false));
    let (a, b) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let pool = Pool::new(vec![
        Deployment::new("one", flaky(&never, &a)),
        Deployment::new("two", flaky(&never, &b)),
    ])
    .with_adaptive_concurrency(1);
    // Two at once: one each (each takes one call at a time).
    let (x, y) = tokio::join!(pool.clone().oneshot(hello()), pool.clone().oneshot(hello()));
    x.expect("served");
    y.expect("served");
    assert_eq!((a.load(Ordering::SeqCst), b.load(Ordering::SeqCst)), (1, 1));
    // Three at once: the third finds both full and fails over (rate limited).
    let (x, y, z) = tokio::join!(
        pool.clone().oneshot(hello()),
        pool.clone().oneshot(hello()),
        pool.clone().oneshot(hello())
    );
    let failed: Vec<_> = [x, y, z].into_iter().filter_map(Result::err).collect();
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].class(), FailureClass::RateLimited);
}
