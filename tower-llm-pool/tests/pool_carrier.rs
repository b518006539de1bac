//! What a pool carries to its deployments and back: the [`Link`] a
//! deployment's service sees, the model it is sent, the attempt record
//! naming the deployment that served, and the in-flight counts of
//! `status()` as calls end or are dropped.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::StatusCode;
use tower::util::BoxCloneSyncService;
use tower::{Layer, ServiceExt, service_fn};
use tower_llm_core::{ChatRequest, ChatResponse, Failure, FailureClass, Link, Message};
use tower_llm_pool::{Deployment, Pool};
use tower_llm_retry::{RetryLayer, SplitMix64};

type Svc = BoxCloneSyncService<ChatRequest, ChatResponse, Failure>;

/// What a deployment's service saw of one call: its link's provider,
/// model and position, and the request's model.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    provider: String,
    link_model: String,
    position: u8,
    model: String,
}

/// The affinity key a request carries.
#[derive(Clone, Copy)]
struct Key(u64);

fn req() -> ChatRequest {
    ChatRequest::new("gpt-4o", vec![Message::user("hi")])
}

fn keyed(key: u64) -> ChatRequest {
    let mut r = req();
    r.extensions.insert(Key(key));
    r
}

/// A deployment that notes what it saw, waits `ms`, then answers with
/// its link's provider or fails with `fail()`.
fn dep(seen: &Arc<Mutex<Vec<Seen>>>, ms: u64, fail: Option<fn() -> Failure>) -> Svc {
    let seen = seen.clone();
    BoxCloneSyncService::new(service_fn(move |req: ChatRequest| {
        let link = Link::of(&req).cloned();
        seen.lock().expect("lock").push(Seen {
            provider: link.as_ref().map_or("", Link::provider).to_owned(),
            link_model: link.as_ref().map_or("", Link::model).to_owned(),
            position: link.as_ref().map_or(0, Link::position),
            model: req.model.to_string(),
        });
        async move {
            if ms > 0 {
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            match fail {
                Some(f) => Err(f()),
                None => Ok(ChatResponse::builder(req.model.to_string())
                    .text(link.as_ref().map_or("", Link::provider))
                    .build()),
            }
        }
    }))
}

fn with_key(pool: Pool<Svc>) -> Pool<Svc> {
    pool.with_random(Arc::new(SplitMix64::seeded(3)))
        .with_affinity(|r: &ChatRequest| r.extensions.get::<Key>().map(|k| k.0))
}

/// A key that a pool of deployments named `names` sends to `target` first.
async fn key_for(names: &[&'static str], target: &str) -> u64 {
    let seen = Arc::default();
    let probe = with_key(Pool::new(
        names
            .iter()
            .map(|n| Deployment::new(*n, dep(&seen, 0, None)))
            .collect(),
    ));
    for key in 0..1_000 {
        let answer = probe.clone().oneshot(keyed(key)).await.expect("answers");
        if answer.text() == target {
            return key;
        }
    }
    panic!("no key lands on {target}");
}

fn rate_limited() -> Failure {
    Failure::new(FailureClass::RateLimited).with_status(StatusCode::TOO_MANY_REQUESTS)
}

fn unavailable() -> Failure {
    Failure::new(FailureClass::Transient).with_status(StatusCode::SERVICE_UNAVAILABLE)
}

/// Each deployment's service sees a link naming the deployment as its
/// provider, keeping the outer link's model and position, and is sent
/// the pool's model or the deployment's own (`with_model`).
#[tokio::test(start_paused = true)]
async fn a_deployment_sees_its_name_in_the_link_and_its_model() {
    let names = ["east", "west"];
    let seen_east = Arc::default();
    let seen_west = Arc::default();
    let pool = with_key(Pool::new(vec![
        Deployment::new("east", dep(&seen_east, 0, None)),
        Deployment::new("west", dep(&seen_west, 0, None)).with_model("gpt-4o-west-2024"),
    ]));
    for (name, seen) in [("east", &seen_east), ("west", &seen_west)] {
        let key = key_for(&names, name).await;
        let mut r = keyed(key);
        Link::new("azure", "gpt-4o").with_position(2).store(&mut r);
        let answer = pool.clone().oneshot(r).await.expect("answers");
        assert_eq!(answer.text(), name);
        let model = if name == "west" {
            "gpt-4o-west-2024"
        } else {
            "gpt-4o"
        };
        assert_eq!(
            seen.lock().expect("lock").clone(),
            vec![Seen {
                provider: name.to_owned(),
                link_model: "gpt-4o".to_owned(),
                position: 2,
                model: model.to_owned(),
            }]
        );
    }

    // Without an outer link, the deployment's name is still the provider.
    let answer = pool.clone().oneshot(req()).await.expect("answers");
    let last = if answer.text() == "east" {
        &seen_east
    } else {
        &seen_west
    };
    let last = last.lock().expect("lock").last().cloned().expect("a call");
    assert_eq!(last.provider, answer.text());
}

/// Inside a retry layer, the one attempt of a call that moved from a
/// rate-limited deployment to another names the one that served.
#[tokio::test(start_paused = true)]
async fn inside_retry_the_attempt_names_the_deployment_that_served() {
    let seen = Arc::default();
    let key = key_for(&["limited", "fine"], "limited").await;
    let pool = with_key(Pool::new(vec![
        Deployment::new("limited", dep(&seen, 0, Some(rate_limited))),
        Deployment::new("fine", dep(&seen, 0, None)),
    ]));
    let link = RetryLayer::new().layer(pool);
    let answer = link.oneshot(keyed(key)).await.expect("fine serves");
    assert_eq!(answer.text(), "fine");
    assert_eq!(answer.attempts.len(), 1, "{:?}", answer.attempts);
    assert_eq!(&*answer.attempts[0].provider, "fine");
    assert_eq!(answer.attempts[0].attempt, 1);
    let providers: Vec<String> = seen
        .lock()
        .expect("lock")
        .iter()
        .map(|s| s.provider.clone())
        .collect();
    assert_eq!(providers, ["limited", "fine"]);
}

/// Inside a retry layer, each attempt of a call no deployment could serve
/// names the deployment that failed last within it, and the call's
/// failure carries those records.
#[tokio::test(start_paused = true)]
async fn inside_retry_a_failed_attempt_names_the_last_deployment_tried() {
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let pool = with_key(Pool::new(vec![
        Deployment::new("a", dep(&seen, 0, Some(unavailable))),
        Deployment::new("b", dep(&seen, 0, Some(unavailable))),
    ]));
    let link = RetryLayer::new().with_max_attempts(2).layer(pool);
    let err = link.oneshot(req()).await.expect_err("all fail");
    assert_eq!(err.class(), FailureClass::Transient);
    let providers: Vec<String> = seen
        .lock()
        .expect("lock")
        .iter()
        .map(|s| s.provider.clone())
        .collect();
    assert_eq!(
        providers.len(),
        4,
        "two deployments per attempt: {providers:?}"
    );
    let attempts = err.attempts();
    assert_eq!(attempts.len(), 2, "{attempts:?}");
    assert_eq!(&*attempts[0].provider, providers[1]);
    assert_eq!(&*attempts[1].provider, providers[3]);
    assert_eq!(attempts[0].http_status, Some(503));
}

/// `status()` counts calls in flight per deployment: they rise as calls
/// start and return to zero when the calls end, or when a call's future
/// is dropped (a timeout around it, an aborted task).
#[tokio::test(start_paused = true)]
async fn status_counts_calls_in_flight_until_they_end_or_are_dropped() {
    let seen = Arc::default();
    let pool = Pool::new(vec![
        Deployment::new("a", dep(&seen, 1_000, None)),
        Deployment::new("b", dep(&seen, 1_000, None)),
    ])
    .with_random(Arc::new(SplitMix64::seeded(9)));
    let in_flight =
        |pool: &Pool<Svc>| -> Vec<u32> { pool.status().iter().map(|s| s.load.in_flight).collect() };
    assert_eq!(in_flight(&pool), [0, 0]);

    let calls: Vec<_> = (0..6)
        .map(|_| tokio::spawn(pool.clone().oneshot(req())))
        .collect();
    tokio::task::yield_now().await;
    assert_eq!(in_flight(&pool), [3, 3]);
    for call in calls {
        call.await.expect("joins").expect("answers");
    }
    assert_eq!(in_flight(&pool), [0, 0], "ended calls");

    // Dropped by a timeout around it.
    let dropped = Arc::new(AtomicUsize::new(0));
    let watch = {
        let dropped = dropped.clone();
        let pool = pool.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let total: u32 = pool.status().iter().map(|s| s.load.in_flight).sum();
            dropped.store(total as usize, Ordering::SeqCst);
        })
    };
    let timed_out = tokio::time::timeout(Duration::from_millis(600), pool.clone().oneshot(req()));
    assert!(timed_out.await.is_err(), "the call outlives the timeout");
    watch.await.expect("joins");
    assert_eq!(dropped.load(Ordering::SeqCst), 1, "in flight at 500 ms");
    assert_eq!(in_flight(&pool), [0, 0], "dropped by a timeout");

    // Dropped with its task.
    let calls: Vec<_> = (0..4)
        .map(|_| tokio::spawn(pool.clone().oneshot(req())))
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(in_flight(&pool).iter().sum::<u32>(), 4);
    for call in &calls[..2] {
        call.abort();
    }
    for call in calls.into_iter().take(2) {
        assert!(call.await.expect_err("aborted").is_cancelled());
    }
    assert_eq!(in_flight(&pool).iter().sum::<u32>(), 2, "two aborted");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(in_flight(&pool), [0, 0]);
}
