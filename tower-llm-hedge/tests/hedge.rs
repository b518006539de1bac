//! The hedge layer on virtual time: when a hedge starts, who wins, what
//! happens to the loser, and when no hedge starts at all.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tower::{ServiceBuilder, ServiceExt, service_fn};
use tower_llm_core::{
    AttemptOutcome, ChatRequest, ChatResponse, Failure, FailureClass, Message, NotReplayable,
};
use tower_llm_deadline::DeadlineLayer;
use tower_llm_hedge::{HedgeConfig, HedgeLayer};
use tower_llm_retry::RetryLayer;

/// What one upstream call does: wait, then answer or fail.
#[derive(Clone, Copy)]
enum Then {
    Answer,
    Fail(FailureClass),
}

/// A provider whose `n`th call waits `plan[n].0` then does `plan[n].1`
/// (the last entry repeats), recording when each call started and whether
/// it was dropped before it ended.
#[derive(Clone)]
struct Provider {
    plan: Arc<Vec<(u64, Then)>>,
    started: Arc<Mutex<Vec<Duration>>>,
    dropped: Arc<AtomicUsize>,
    origin: Instant,
}

struct DropFlag(Arc<AtomicUsize>, bool);

impl Drop for DropFlag {
    fn drop(&mut self) {
        if !self.1 {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl Provider {
    fn new(plan: &[(u64, Then)]) -> Self {
        Provider {
            plan: Arc::new(plan.to_vec()),
            started: Arc::default(),
            dropped: Arc::default(),
            origin: Instant::now(),
        }
    }

    fn calls(&self) -> usize {
        self.started.lock().expect("lock").len()
    }

    fn starts_ms(&self) -> Vec<u128> {
        self.started
            .lock()
            .expect("lock")
            .iter()
            .map(Duration::as_millis)
            .collect()
    }

    fn service(
        &self,
    ) -> impl tower::Service<
        ChatRequest,
        Response = ChatResponse,
        Error = Failure,
        Future = impl Send + 'static,
    > + Clone
    + Send
    + 'static {
        let this = self.clone();
        service_fn(move |_req: ChatRequest| {
            let n = {
                let mut started = this.started.lock().expect("lock");
                started.push(this.origin.elapsed());
                started.len() - 1
            };
            let (wait, then) = this.plan[n.min(this.plan.len() - 1)];
            let dropped = this.dropped.clone();
            async move {
                let mut flag = DropFlag(dropped, false);
                tokio::time::sleep(Duration::from_millis(wait)).await;
                flag.1 = true;
                match then {
                    Then::Answer => Ok(answer(n)),
                    Then::Fail(class) => Err(Failure::new(class)),
                }
            }
        })
    }
}

fn answer(n: usize) -> ChatResponse {
    ChatResponse {
        id: n.to_string(),
        model: "m".into(),
        provider: "mock".into(),
        ..ChatResponse::default()
    }
}

fn req() -> ChatRequest {
    ChatRequest::new("m", vec![Message::user("hi")])
}

fn hedge(delay_ms: u64) -> HedgeLayer {
    HedgeLayer::new(HedgeConfig {
        delay_ms,
        budget_ratio: 1.0,
        ..HedgeConfig::default()
    })
    .expect("valid")
}

/// deadline (30 s) → hedge → retry (1 attempt) → provider.
async fn call(layer: HedgeLayer, provider: &Provider) -> Result<ChatResponse, Failure> {
    ServiceBuilder::new()
        .layer(DeadlineLayer::new(Duration::from_secs(30)))
        .layer(layer)
        .layer(RetryLayer::new().with_max_attempts(1))
        .service(provider.service())
        .oneshot(req())
        .await
}

#[tokio::test(start_paused = true)]
async fn a_hedge_starts_exactly_at_the_delay_and_its_answer_wins() {
    let provider = Provider::new(&[(10_000, Then::Answer), (50, Then::Answer)]);
    let start = Instant::now();
    let res = call(hedge(200), &provider)
        .await
        .expect("the hedge answers");
    assert_eq!(start.elapsed(), Duration::from_millis(250));
    assert_eq!(res.id, "1");
    assert_eq!(provider.starts_ms(), [0, 200]);
    assert_eq!(
        provider.dropped.load(Ordering::SeqCst),
        1,
        "the first attempt is dropped"
    );
    let outcomes: Vec<_> = res.attempts.iter().map(|r| (r.outcome, r.hedge)).collect();
    assert_eq!(
        outcomes,
        [
            (AttemptOutcome::CancelledByHedge, false),
            (AttemptOutcome::Succeeded, true)
        ]
    );
    assert_eq!(
        res.attempts[0].status().as_metric_label(),
        "cancelled_by_hedge"
    );
}

#[tokio::test(start_paused = true)]
async fn no_hedge_when_the_first_attempt_answers_within_the_delay() {
    let provider = Provider::new(&[(199, Then::Answer)]);
    let res = call(hedge(200), &provider).await.expect("answers");
    assert_eq!(res.id, "0");
    assert_eq!(provider.calls(), 1);
    assert_eq!(res.attempts.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn the_first_attempt_still_wins_after_a_hedge_started() {
    let provider = Provider::new(&[(300, Then::Answer), (1_000, Then::Answer)]);
    let start = Instant::now();
    let res = call(hedge(200), &provider).await.expect("answers");
    assert_eq!(start.elapsed(), Duration::from_millis(300));
    assert_eq!(res.id, "0");
    assert_eq!(
        provider.dropped.load(Ordering::SeqCst),
        1,
        "the hedge is dropped"
    );
    let outcomes: Vec<_> = res.attempts.iter().map(|r| (r.outcome, r.hedge)).collect();
    assert_eq!(
        outcomes,
        [
            (AttemptOutcome::Succeeded, false),
            (AttemptOutcome::CancelledByHedge, true)
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn when_both_fail_the_later_failure_is_returned() {
    let provider = Provider::new(&[
        (300, Then::Fail(FailureClass::Transient)),
        (200, Then::Fail(FailureClass::RateLimited)),
    ]);
    let start = Instant::now();
    let err = call(hedge(200), &provider).await.expect_err("both fail");
    assert_eq!(start.elapsed(), Duration::from_millis(400));
    assert!(err.is_rate_limited(), "{err:?}");
    assert_eq!(provider.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_failure_before_the_delay_is_returned_without_a_hedge() {
    let provider = Provider::new(&[(100, Then::Fail(FailureClass::Transient))]);
    let err = call(hedge(200), &provider).await.expect_err("fails");
    assert!(err.is_transient());
    assert_eq!(provider.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_request_that_must_be_sent_once_is_never_hedged() {
    let provider = Provider::new(&[(1_000, Then::Answer)]);
    let mut once = req();
    once.extensions.insert(NotReplayable);
    let res = ServiceBuilder::new()
        .layer(hedge(200))
        .service(provider.service())
        .oneshot(once)
        .await
        .expect("answers");
    assert_eq!(res.id, "0");
    assert_eq!(provider.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn no_hedge_when_a_useful_attempt_no_longer_fits_before_the_deadline() {
    let provider = Provider::new(&[(10_000, Then::Answer)]);
    let start = Instant::now();
    let err = ServiceBuilder::new()
        .layer(DeadlineLayer::new(Duration::from_millis(1_100)))
        .layer(hedge(200)) // 900 ms left at the hedge time, 1,000 needed
        .service(provider.service())
        .oneshot(req())
        .await
        .expect_err("the deadline");
    assert!(err.is_deadline_exceeded());
    assert_eq!(start.elapsed(), Duration::from_millis(1_100));
    assert_eq!(provider.calls(), 1);

    // With 1,000 ms left at the hedge time, it starts.
    let provider = Provider::new(&[(10_000, Then::Answer), (100, Then::Answer)]);
    let res = ServiceBuilder::new()
        .layer(DeadlineLayer::new(Duration::from_millis(1_200)))
        .layer(hedge(200))
        .service(provider.service())
        .oneshot(req())
        .await
        .expect("the hedge answers");
    assert_eq!(res.id, "1");
}

#[tokio::test(start_paused = true)]
async fn the_budget_caps_hedges_in_a_slow_everything_storm() {
    let provider = Provider::new(&[(5_000, Then::Answer)]);
    let layer = HedgeLayer::new(HedgeConfig {
        delay_ms: 200,
        budget_ratio: 0.1,
        ..HedgeConfig::default()
    })
    .expect("valid");
    let svc = ServiceBuilder::new()
        .layer(DeadlineLayer::new(Duration::from_secs(30)))
        .layer(layer)
        .service(provider.service());
    let calls: Vec<_> = (0..200)
        .map(|_| tokio::spawn(svc.clone().oneshot(req())))
        .collect();
    for c in calls {
        c.await.expect("joined").expect("answers");
    }
    // 10 % of 200 (over the floor of 1 per second over 10 s).
    assert_eq!(provider.calls(), 220, "200 calls, 20 hedged");
}

#[tokio::test(start_paused = true)]
async fn a_learned_delay_replaces_the_configured_one_after_min_samples() {
    let provider = Provider::new(&[
        (100, Then::Answer),
        (100, Then::Answer),
        (100, Then::Answer),
        (100, Then::Answer),
        (100, Then::Answer),
        (10_000, Then::Answer),
        (10, Then::Answer),
    ]);
    let layer = HedgeLayer::new(HedgeConfig {
        delay_ms: 1_000,
        quantile: Some(0.5),
        min_samples: 5,
        floor_ms: 20,
        budget_ratio: 1.0,
        ..HedgeConfig::default()
    })
    .expect("valid");
    assert_eq!(layer.delay(), Duration::from_millis(1_000));
    let svc = ServiceBuilder::new()
        .layer(layer.clone())
        .service(provider.service());
    for _ in 0..5 {
        svc.clone().oneshot(req()).await.expect("answers");
    }
    // Latencies of 100 ms: the bucket's upper bound, 2^(27/4) ≈ 107.6 ms.
    let learned = layer.delay();
    assert!(
        learned > Duration::from_millis(100) && learned < Duration::from_millis(110),
        "{learned:?}"
    );
    let res = svc.oneshot(req()).await.expect("the hedge answers");
    assert_eq!(res.id, "6");
    let starts = provider.starts_ms();
    // tokio's timers fire on the next whole millisecond.
    assert_eq!(starts[6] - starts[5], learned.as_micros().div_ceil(1_000));
}

#[tokio::test(start_paused = true)]
async fn no_hedge_while_the_retry_layer_retries_a_failed_first_attempt() {
    // The first attempt fails at 100 ms; the retry layer waits its backoff
    // (about 200 ms) then tries again (1 s): the hedge due at 200 ms must
    // not start.
    let provider = Provider::new(&[
        (100, Then::Fail(FailureClass::Transient)),
        (1_000, Then::Answer),
        (10, Then::Answer),
    ]);
    let res = ServiceBuilder::new()
        .layer(DeadlineLayer::new(Duration::from_secs(30)))
        .layer(hedge(200))
        .layer(RetryLayer::new().with_max_attempts(2))
        .service(provider.service())
        .oneshot(req())
        .await
        .expect("the retry answers");
    assert_eq!(res.id, "1");
    assert_eq!(provider.calls(), 2, "no hedge: {:?}", provider.starts_ms());
}
