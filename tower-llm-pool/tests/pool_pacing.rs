//! A pool under its deployments' rate limits: a deployment without room
//! is skipped; when none has room a call waits for the soonest (within its
//! deadline and the pool's queue), or fails at once as rate limited with
//! the time to that room; background (low priority) calls never wait.
//! Virtual time throughout.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use tower::util::BoxCloneSyncService;
use tower::{ServiceExt, service_fn};
use tower_llm_core::{ChatRequest, ChatResponse, Deadline, Failure, FailureClass, Message};
use tower_llm_pool::{Deployment, PaceLimits, Pacer, Pool, Priority};

type Svc = BoxCloneSyncService<ChatRequest, ChatResponse, Failure>;

/// A deployment that answers at once and counts its calls.
fn counted(calls: &Arc<AtomicUsize>) -> Svc {
    let calls = calls.clone();
    BoxCloneSyncService::new(service_fn(move |_req: ChatRequest| {
        calls.fetch_add(1, Ordering::SeqCst);
        async { Ok(ChatResponse::builder("m").text("ok").build()) }
    }))
}

/// Two deployments of 2 requests per minute each (a bucket of 2,
/// refilled one request every 30 s).
fn two_slow_keys() -> (Pool<Svc>, [Arc<AtomicUsize>; 2]) {
    let calls = [Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0))];
    let limits = PaceLimits {
        rpm: Some(2),
        tpm: None,
        burst_ms: None,
    };
    let pool = Pool::new(vec![
        Deployment::new("a", counted(&calls[0])).with_pacer(Arc::new(Pacer::new(limits))),
        Deployment::new("b", counted(&calls[1])).with_pacer(Arc::new(Pacer::new(limits))),
    ]);
    (pool, calls)
}

fn hello() -> ChatRequest {
    ChatRequest::new("m", vec![Message::user("hi")])
}

#[tokio::test(start_paused = true)]
async fn a_call_no_deployment_has_room_for_waits_for_the_soonest_room() {
    let (pool, calls) = two_slow_keys();
    let start = Instant::now();
    for _ in 0..4 {
        pool.clone().oneshot(hello()).await.expect("room");
    }
    assert_eq!(start.elapsed(), Duration::ZERO, "four fit the two buckets");
    assert_eq!(
        calls
            .iter()
            .map(|c| c.load(Ordering::SeqCst))
            .collect::<Vec<_>>(),
        [2, 2]
    );
    // The fifth waits for the first refill: 30 s.
    pool.clone()
        .oneshot(hello())
        .await
        .expect("served after the wait");
    assert_eq!(start.elapsed(), Duration::from_secs(30));
}

#[tokio::test(start_paused = true)]
async fn a_call_whose_deadline_comes_first_fails_at_once_as_rate_limited() {
    let (pool, _) = two_slow_keys();
    for _ in 0..4 {
        pool.clone().oneshot(hello()).await.expect("room");
    }
    let mut req = hello();
    Deadline::after(Duration::from_secs(10)).store(&mut req);
    let start = Instant::now();
    let failure = pool
        .clone()
        .oneshot(req)
        .await
        .expect_err("no room in time");
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(failure.class(), FailureClass::RateLimited);
    assert_eq!(failure.retry_after(), Some(Duration::from_secs(30)));
}

#[tokio::test(start_paused = true)]
async fn a_low_priority_call_never_waits() {
    let (pool, _) = two_slow_keys();
    let pool = pool.with_priority(|req: &ChatRequest| {
        if req.model.as_ref() == "background" {
            Priority::Low
        } else {
            Priority::Normal
        }
    });
    for _ in 0..4 {
        pool.clone().oneshot(hello()).await.expect("room");
    }
    let start = Instant::now();
    let low = ChatRequest::new("background", vec![Message::user("hi")]);
    let failure = pool.clone().oneshot(low).await.expect_err("shed");
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(failure.class(), FailureClass::RateLimited);
    pool.clone()
        .oneshot(hello())
        .await
        .expect("a normal one waits");
    assert_eq!(start.elapsed(), Duration::from_secs(30));
}

#[tokio::test(start_paused = true)]
async fn the_queue_is_bounded_and_the_rest_fail_at_once() {
    let (pool, calls) = two_slow_keys();
    let pool = pool.with_queue(2, Duration::from_secs(60));
    for _ in 0..4 {
        pool.clone().oneshot(hello()).await.expect("room");
    }
    let start = Instant::now();
    let waiting: Vec<_> = (0..2)
        .map(|_| tokio::spawn(pool.clone().oneshot(hello())))
        .collect();
    tokio::task::yield_now().await;
    let failure = pool.clone().oneshot(hello()).await.expect_err("queue full");
    assert_eq!(failure.class(), FailureClass::RateLimited);
    assert_eq!(start.elapsed(), Duration::ZERO);
    for w in waiting {
        w.await.expect("joined").expect("served after the wait");
    }
    assert_eq!(start.elapsed(), Duration::from_secs(30));
    assert_eq!(
        calls
            .iter()
            .map(|c| c.load(Ordering::SeqCst))
            .sum::<usize>(),
        6
    );
}

#[tokio::test(start_paused = true)]
async fn a_configured_tpm_paces_calls_that_name_no_output_cap() {
    // 60 tokens a minute; each answer reports 30 (20 in, 10 out).
    let calls = Arc::new(AtomicUsize::new(0));
    let used = {
        let calls = calls.clone();
        BoxCloneSyncService::new(service_fn(move |_req: ChatRequest| {
            calls.fetch_add(1, Ordering::SeqCst);
            async {
                Ok::<_, Failure>(
                    ChatResponse::builder("m")
                        .text("ok")
                        .usage(tower_llm_core::Usage {
                            prompt_tokens: 20,
                            completion_tokens: 10,
                            cached_input_tokens: 0,
                        })
                        .build(),
                )
            }
        }))
    };
    let pacer = Arc::new(Pacer::new(PaceLimits {
        rpm: None,
        tpm: Some(60),
        burst_ms: None,
    }));
    let pool = Pool::new(vec![
        Deployment::new("only", used).with_pacer(pacer.clone()),
    ]);
    let start = Instant::now();
    for _ in 0..2 {
        pool.clone().oneshot(hello()).await.expect("room");
    }
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(
        pacer.snapshot().tokens,
        Some(0),
        "two calls of 30 used the 60"
    );
    // The third waits for room for its input bound (26 tokens: 26 s).
    pool.clone().oneshot(hello()).await.expect("after a wait");
    assert!(
        start.elapsed() >= Duration::from_secs(25),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[tokio::test(start_paused = true)]
async fn waiters_are_served_in_order_of_arrival() {
    // Two keys of 2 a minute; each records which waiter it served, when.
    let start = Instant::now();
    let served = Arc::new(std::sync::Mutex::new(Vec::new()));
    let recording = || {
        let served = served.clone();
        BoxCloneSyncService::new(service_fn(move |req: ChatRequest| {
            served
                .lock()
                .expect("lock")
                .push((req.model.to_string(), start.elapsed()));
            async { Ok(ChatResponse::builder("m").text("ok").build()) }
        }))
    };
    let limits = PaceLimits {
        rpm: Some(2),
        tpm: None,
        burst_ms: None,
    };
    let pool: Pool<Svc> = Pool::new(vec![
        Deployment::new("a", recording()).with_pacer(Arc::new(Pacer::new(limits))),
        Deployment::new("b", recording()).with_pacer(Arc::new(Pacer::new(limits))),
    ]);
    for _ in 0..4 {
        pool.clone().oneshot(hello()).await.expect("room");
    }
    let mut waiters = Vec::new();
    for n in 0..4 {
        let pool = pool.clone();
        let req = ChatRequest::new(format!("w{n}"), vec![Message::user("hi")]);
        waiters.push(tokio::spawn(async move { pool.oneshot(req).await }));
        // Each arrives after the one before is waiting.
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    for w in waiters {
        w.await.expect("joined").expect("served");
    }
    let served: Vec<_> = served.lock().expect("lock")[4..].to_vec();
    let order: Vec<_> = served.iter().map(|(m, _)| m.as_str()).collect();
    assert_eq!(order, ["w0", "w1", "w2", "w3"], "{served:?}");
    // Two rooms every 30 s (one per key).
    assert_eq!(served[1].1, Duration::from_secs(30));
    assert_eq!(served[3].1, Duration::from_secs(60));
}

#[tokio::test(start_paused = true)]
async fn an_answer_of_unknown_usage_keeps_what_was_taken_and_no_more() {
    // 6000 tokens a minute; the answer reports no usage (as a stream's
    // head does): the call keeps its estimate (its input bound, 26), the
    // bucket is not drained.
    let calls = Arc::new(AtomicUsize::new(0));
    let pacer = Arc::new(Pacer::new(PaceLimits {
        rpm: None,
        tpm: Some(6_000),
        burst_ms: None,
    }));
    let pool = Pool::new(vec![
        Deployment::new("only", counted(&calls)).with_pacer(pacer.clone()),
    ]);
    pool.clone().oneshot(hello()).await.expect("served");
    assert_eq!(pacer.snapshot().tokens, Some(6_000 - 26));
}
