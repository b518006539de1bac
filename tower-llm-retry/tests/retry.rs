//! Behaviour of the retry layer under virtual time: exact attempt counts,
//! exact delays or bands, exact failure classes.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::StatusCode;
use tokio::time::Instant;
use tower::util::BoxCloneService;
use tower::{Layer, ServiceBuilder, ServiceExt, service_fn};
use tower_llm_core::layer::AttemptLogExt as _;
use tower_llm_core::{
    AttemptLog, AttemptOutcome, AttemptRecord, AttemptStatus, Attempts, ChatRequest, ChatResponse,
    Deadline, Failure, FailureClass, Link, Message, NotReplayable, RetryStop, Usage,
};
use tower_llm_deadline::DeadlineLayer;
use tower_llm_retry::{FixedFraction, RetryBudget, RetryLayer, SplitMix64};

const MS: fn(u64) -> Duration = Duration::from_millis;

/// One scripted answer of the mock provider.
#[derive(Clone, Copy, Debug)]
enum Step {
    Ok,
    Fail(FailureClass, Option<u16>, Option<Duration>),
    Hang,
}

fn fail(class: FailureClass, status: u16) -> Step {
    Step::Fail(class, Some(status), None)
}

/// A provider that plays `steps` in order (the last one repeats) and
/// records when each call arrived.
#[derive(Clone, Default)]
struct Mock {
    steps: Arc<Mutex<VecDeque<Step>>>,
    calls: Arc<Mutex<Vec<Instant>>>,
    dropped: Arc<AtomicUsize>,
}

struct DropCount(Arc<AtomicUsize>);
impl Drop for DropCount {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

impl Mock {
    fn new(steps: &[Step]) -> Self {
        Mock {
            steps: Arc::new(Mutex::new(steps.iter().copied().collect())),
            ..Mock::default()
        }
    }

    fn next(&self) -> Step {
        let mut steps = self.steps.lock().expect("lock");
        if steps.len() > 1 {
            steps.pop_front().expect("non-empty")
        } else {
            *steps.front().expect("a script")
        }
    }

    fn calls(&self) -> Vec<Instant> {
        self.calls.lock().expect("lock").clone()
    }

    fn gaps(&self) -> Vec<Duration> {
        self.calls().windows(2).map(|w| w[1] - w[0]).collect()
    }

    fn chat(&self) -> BoxCloneService<ChatRequest, ChatResponse, Failure> {
        let mock = self.clone();
        BoxCloneService::new(service_fn(move |req: ChatRequest| {
            mock.calls.lock().expect("lock").push(Instant::now());
            let step = mock.next();
            let guard = DropCount(mock.dropped.clone());
            async move {
                let _guard = guard;
                match step {
                    Step::Ok => Ok(answer(&req)),
                    Step::Fail(class, status, retry_after) => {
                        Err(failure(class, status, retry_after))
                    }
                    Step::Hang => std::future::pending().await,
                }
            }
        }))
    }

    fn http(&self) -> BoxCloneService<http::Request<()>, http::Response<()>, Failure> {
        let mock = self.clone();
        BoxCloneService::new(service_fn(move |_req: http::Request<()>| {
            mock.calls.lock().expect("lock").push(Instant::now());
            let step = mock.next();
            async move {
                match step {
                    Step::Ok => Ok(http::Response::new(())),
                    Step::Fail(_, Some(status), retry_after) => {
                        let mut res = http::Response::builder().status(status);
                        if let Some(d) = retry_after {
                            res = res.header("retry-after", d.as_secs().to_string());
                        }
                        Ok(res.body(()).expect("response"))
                    }
                    Step::Fail(class, None, _) => Err(Failure::new(class)),
                    Step::Hang => std::future::pending().await,
                }
            }
        }))
    }
}

fn failure(class: FailureClass, status: Option<u16>, retry_after: Option<Duration>) -> Failure {
    let mut f = Failure::new(class);
    if let Some(s) = status {
        f = f.with_status(StatusCode::from_u16(s).expect("status"));
    }
    if let Some(d) = retry_after {
        f = f.with_retry_after(d);
    }
    f
}

fn answer(req: &ChatRequest) -> ChatResponse {
    ChatResponse {
        id: "id".into(),
        model: req.model.to_string(),
        provider: "mock".into(),
        fallback_position: 0,
        degraded: false,
        idempotent_replayed: false,
        cache: None,
        choices: vec![],
        usage: Usage::default(),
        latency: Duration::ZERO,
        attempts: vec![],
    }
}

fn req() -> ChatRequest {
    ChatRequest::new("m", vec![Message::user("hi")])
}

/// Deadline (30 s) → retry (fixed jitter fraction) → mock.
fn stack(
    mock: &Mock,
    retry: RetryLayer,
) -> impl tower::Service<
    ChatRequest,
    Response = ChatResponse,
    Error = Failure,
    Future = impl Future<Output = Result<ChatResponse, Failure>>,
> + Clone {
    ServiceBuilder::new()
        .layer(DeadlineLayer::new(Duration::from_secs(30)))
        .layer(retry)
        .service(mock.chat())
}

fn statuses(records: &[AttemptRecord]) -> Vec<AttemptStatus> {
    records.iter().map(AttemptRecord::status).collect()
}

#[tokio::test(start_paused = true)]
async fn seed_ac2_503_then_200_retries_once_within_the_band() {
    for (fraction, expected) in [(0.0, MS(160)), (0.5, MS(200)), (0.999_999, MS(240))] {
        let mock = Mock::new(&[fail(FailureClass::Transient, 503), Step::Ok]);
        let retry = RetryLayer::new().with_rng(FixedFraction(fraction));
        let res = stack(&mock, retry)
            .oneshot(req())
            .await
            .expect("second attempt");
        assert_eq!(mock.calls().len(), 2);
        let gap = mock.gaps()[0];
        assert!(gap >= MS(160) && gap <= MS(240), "{gap:?}");
        assert!(gap.abs_diff(expected) < MS(1), "{gap:?} vs {expected:?}");
        assert_eq!(
            statuses(&res.attempts),
            [AttemptStatus::RetriedAfter5xx, AttemptStatus::Succeeded]
        );
        assert_eq!(res.attempts[0].http_status, Some(503));
        assert_eq!(res.attempts[0].attempt, 1);
        assert_eq!(res.attempts[1].attempt, 2);
    }
}

#[tokio::test(start_paused = true)]
async fn three_503s_use_both_bands_and_return_the_last_failure() {
    for seed in [1, 2, 3, 42, u64::MAX] {
        let mock = Mock::new(&[fail(FailureClass::Transient, 503)]);
        let retry = RetryLayer::new().with_rng(SplitMix64::seeded(seed));
        let start = Instant::now();
        let err = stack(&mock, retry)
            .oneshot(req())
            .await
            .expect_err("all fail");
        assert_eq!(mock.calls().len(), 3);
        let gaps = mock.gaps();
        assert!(gaps[0] >= MS(160) && gaps[0] <= MS(240), "{gaps:?}");
        assert!(gaps[1] >= MS(640) && gaps[1] <= MS(960), "{gaps:?}");
        assert_eq!(start.elapsed(), gaps[0] + gaps[1]);
        assert!(err.is_transient());
        assert_eq!(err.http_status(), Some(StatusCode::SERVICE_UNAVAILABLE));
        assert_eq!(err.provider(), Some("default"));
        assert_eq!(
            statuses(err.attempts()),
            [
                AttemptStatus::RetriedAfter5xx,
                AttemptStatus::RetriedAfter5xx,
                AttemptStatus::Failed
            ]
        );
        assert_eq!(
            err.attempts()[2].retry_stop,
            Some(RetryStop::AttemptsExhausted)
        );
    }
}

#[tokio::test(start_paused = true)]
async fn seed_ac12_retry_after_is_slept_exactly() {
    let mock = Mock::new(&[
        Step::Fail(
            FailureClass::RateLimited,
            Some(429),
            Some(Duration::from_secs(5)),
        ),
        Step::Ok,
    ]);
    let res = stack(&mock, RetryLayer::new())
        .oneshot(req())
        .await
        .expect("retried");
    assert_eq!(mock.gaps(), [Duration::from_secs(5)]);
    assert_eq!(
        statuses(&res.attempts),
        [AttemptStatus::RetriedAfter429, AttemptStatus::Succeeded]
    );
}

#[tokio::test(start_paused = true)]
async fn seed_ac12_retry_after_past_the_deadline_returns_at_once() {
    let mock = Mock::new(&[
        Step::Fail(
            FailureClass::RateLimited,
            Some(429),
            Some(Duration::from_secs(60)),
        ),
        Step::Ok,
    ]);
    let svc = ServiceBuilder::new()
        .layer(DeadlineLayer::new(Duration::from_secs(10)))
        .layer(RetryLayer::new())
        .service(mock.chat());
    let start = Instant::now();
    let err = svc
        .oneshot(req())
        .await
        .expect_err("no sleep into the deadline");
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(mock.calls().len(), 1);
    assert!(err.is_rate_limited());
    assert_eq!(err.retry_after(), Some(Duration::from_secs(60)));
    assert_eq!(err.attempts()[0].retry_stop, Some(RetryStop::PastDeadline));
}

#[tokio::test(start_paused = true)]
async fn backoff_that_would_pass_the_deadline_is_not_slept() {
    let mock = Mock::new(&[fail(FailureClass::Transient, 503)]);
    let svc = ServiceBuilder::new()
        .layer(DeadlineLayer::new(MS(150)))
        .layer(RetryLayer::new().with_rng(FixedFraction(0.0)))
        .service(mock.chat());
    let start = Instant::now();
    let err = svc.oneshot(req()).await.expect_err("fails");
    // The 160 ms backoff would end past the 150 ms deadline.
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(mock.calls().len(), 1);
    assert!(err.is_transient());
    assert_eq!(err.attempts()[0].retry_stop, Some(RetryStop::PastDeadline));
}

#[tokio::test(start_paused = true)]
async fn terminal_http_statuses_are_tried_exactly_once() {
    for status in [400, 401, 403, 404, 422] {
        let mock = Mock::new(&[fail(FailureClass::Transient, status), Step::Ok]);
        let svc = ServiceBuilder::new()
            .layer(DeadlineLayer::new(Duration::from_secs(30)))
            .layer(RetryLayer::http())
            .service(mock.http());
        let res = svc.oneshot(kept()).await.expect("an HTTP answer");
        assert_eq!(res.status().as_u16(), status);
        assert_eq!(mock.calls().len(), 1, "status {status}");
        let attempts = &res.extensions().get::<Attempts>().expect("attempts").0;
        assert_eq!(attempts.len(), 1);
        assert_eq!(attempts[0].retry_stop, Some(RetryStop::NotRetryable));
        assert_eq!(attempts[0].http_status, Some(status));
    }
}

#[tokio::test(start_paused = true)]
async fn terminal_classes_are_tried_exactly_once() {
    for class in [
        FailureClass::BadRequest,
        FailureClass::Auth,
        FailureClass::NotFound,
        FailureClass::QuotaExhausted,
        FailureClass::ContentFiltered,
        FailureClass::ContextWindowExceeded,
        FailureClass::CircuitOpen,
        FailureClass::Cancelled,
        FailureClass::InvalidResponse,
    ] {
        let mock = Mock::new(&[Step::Fail(class, None, None), Step::Ok]);
        let err = stack(&mock, RetryLayer::new())
            .oneshot(req())
            .await
            .expect_err("terminal");
        assert_eq!(err.class(), class);
        assert_eq!(mock.calls().len(), 1, "{class:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn seed_004_first_attempt_times_out_second_succeeds() {
    let mock = Mock::new(&[Step::Hang, Step::Ok]);
    let retry = RetryLayer::new()
        .with_attempt_timeout(Duration::from_secs(2))
        .with_rng(FixedFraction(0.5));
    let start = Instant::now();
    let res = stack(&mock, retry).oneshot(req()).await.expect("second");
    assert_eq!(start.elapsed(), Duration::from_secs(2) + MS(200));
    assert_eq!(mock.gaps(), [Duration::from_secs(2) + MS(200)]);
    // The hung attempt was cancelled when its timeout fired.
    assert_eq!(mock.dropped.load(Ordering::SeqCst), 2);
    assert_eq!(
        statuses(&res.attempts),
        [AttemptStatus::RetriedAfterTimeout, AttemptStatus::Succeeded]
    );
    assert_eq!(res.attempts[0].elapsed, Duration::from_secs(2));
    assert_eq!(res.attempts[0].http_status, None);
}

#[tokio::test(start_paused = true)]
async fn the_deadline_ends_an_attempt_as_deadline_exceeded_not_timeout() {
    let mock = Mock::new(&[Step::Hang]);
    // No deadline layer: the caller's own deadline is in the extensions.
    let svc = RetryLayer::new().layer(mock.chat());
    let mut r = req();
    Deadline::after(Duration::from_secs(5)).store(&mut r);
    let start = Instant::now();
    let err = svc.oneshot(r).await.expect_err("deadline");
    assert!(err.is_deadline_exceeded(), "{err:?}");
    assert_eq!(start.elapsed(), Duration::from_secs(5));
    assert_eq!(mock.calls().len(), 1);
    assert_eq!(
        statuses(err.attempts()),
        [AttemptStatus::DeadlineExceededMidCall]
    );
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_attempt_stays_in_the_log_as_cancelled() {
    let mock = Mock::new(&[Step::Hang]);
    let mut r = req();
    let log = AttemptLog::install(&mut r).expect("the test owns the log");
    let call = tokio::spawn(RetryLayer::new().layer(mock.chat()).oneshot(r));
    tokio::time::sleep(Duration::from_secs(3)).await;
    call.abort();
    assert!(call.await.expect_err("aborted").is_cancelled());
    let records = log.snapshot();
    assert_eq!(records.len(), 1);
    assert_eq!(
        records[0].outcome,
        AttemptOutcome::Failed(FailureClass::Cancelled)
    );
    assert_eq!(records[0].elapsed, Duration::from_secs(3));
    assert_eq!(mock.dropped.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn nothing_starts_after_the_deadline() {
    let mock = Mock::new(&[Step::Ok]);
    let svc = RetryLayer::new().layer(mock.chat());
    let mut r = req();
    Deadline::after(Duration::ZERO).store(&mut r);
    let err = svc.oneshot(r).await.expect_err("expired");
    assert!(err.is_deadline_exceeded());
    assert!(mock.calls().is_empty());
}

/// Drives `n` calls per `tick` for `ticks` through one layer against an
/// always-failing provider; returns (calls, upstream attempts, budget stops).
async fn storm(n: usize, tick: Duration, ticks: usize) -> (usize, usize, usize) {
    let mock = Mock::new(&[fail(FailureClass::Transient, 503)]);
    let svc = RetryLayer::new()
        .with_rng(SplitMix64::seeded(9))
        .layer(mock.chat());
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..ticks {
        for _ in 0..n {
            tasks.spawn(svc.clone().oneshot(req()));
        }
        tokio::time::sleep(tick).await;
    }
    let mut calls = 0;
    let mut budget_stops = 0;
    while let Some(done) = tasks.join_next().await {
        let err = done.expect("task").expect_err("always fails");
        calls += 1;
        budget_stops += err
            .attempts()
            .iter()
            .filter(|a| a.retry_stop == Some(RetryStop::BudgetExhausted))
            .count();
    }
    (calls, mock.calls().len(), budget_stops)
}

#[tokio::test(start_paused = true)]
async fn budget_caps_a_burst_storm_at_1_2_attempts_per_call() {
    let (calls, attempts, budget_stops) = storm(1000, MS(1), 1).await;
    assert_eq!(calls, 1000);
    let per_call = attempts as f64 / calls as f64;
    assert!(per_call <= 1.2, "{per_call}");
    assert!(
        per_call >= 1.19,
        "the budget should still allow retries: {per_call}"
    );
    assert!(budget_stops >= 790, "{budget_stops}");
}

#[tokio::test(start_paused = true)]
async fn budget_caps_a_sustained_storm_at_1_2_attempts_per_call() {
    // 40 calls every 250 ms for 30 s: 4,800 calls, three budget windows.
    let (calls, attempts, _) = storm(40, MS(250), 120).await;
    assert_eq!(calls, 4800);
    let per_call = attempts as f64 / calls as f64;
    assert!(per_call <= 1.2, "{per_call}");
    assert!(
        per_call >= 1.15,
        "the budget should still allow retries: {per_call}"
    );
}

#[tokio::test(start_paused = true)]
async fn concurrent_calls_keep_their_own_attempt_logs() {
    let mock = Mock::new(&[Step::Ok]);
    let flaky_calls = Arc::new(AtomicUsize::new(0));
    let inner = {
        let ok = mock.chat();
        let flaky_calls = flaky_calls.clone();
        service_fn(move |req: ChatRequest| {
            let ok = ok.clone();
            let first = !req
                .extensions
                .get::<Seen>()
                .is_some_and(|s| s.0.swap(true, Ordering::SeqCst));
            let odd = Link::of(&req).is_some_and(|l| l.position() % 2 == 1);
            if first && odd {
                flaky_calls.fetch_add(1, Ordering::SeqCst);
            }
            async move {
                // Odd callers fail their first attempt after a while.
                tokio::time::sleep(MS(10)).await;
                if first && odd {
                    Err(Failure::new(FailureClass::Transient))
                } else {
                    ok.oneshot(req).await
                }
            }
        })
    };
    // A budget roomy enough that it is not what this test is about.
    let budget = RetryBudget::new(Duration::from_secs(10), 1000, 1.0).expect("budget");
    let svc = ServiceBuilder::new()
        .layer(DeadlineLayer::new(Duration::from_secs(30)))
        .layer(RetryLayer::new().with_budget(budget))
        .service(inner);
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..100u8 {
        let mut r = req();
        Link::new(format!("p{i}"), "m")
            .with_position(i)
            .store(&mut r);
        r.extensions.insert(Seen(Arc::new(AtomicBool::new(false))));
        let svc = svc.clone();
        tasks.spawn(async move { (i, svc.oneshot(r).await) });
    }
    while let Some(done) = tasks.join_next().await {
        let (i, res) = done.expect("task");
        let res = res.expect("every call succeeds");
        let expected = if i % 2 == 1 { 2 } else { 1 };
        assert_eq!(res.attempts.len(), expected, "call {i}");
        for a in &res.attempts {
            assert_eq!(&*a.provider, format!("p{i}"));
            assert_eq!(a.fallback_position, i);
        }
    }
    assert_eq!(flaky_calls.load(Ordering::SeqCst), 50);
}

/// Shared by the copies of one request: has it been sent before?
#[derive(Clone)]
struct Seen(Arc<AtomicBool>);

#[tokio::test(start_paused = true)]
async fn a_request_that_cannot_be_replayed_is_sent_once() {
    let mock = Mock::new(&[fail(FailureClass::Transient, 503), Step::Ok]);
    let mut r = req();
    r.extensions.insert(NotReplayable);
    let err = stack(&mock, RetryLayer::new())
        .oneshot(r)
        .await
        .expect_err("not retried");
    assert!(err.is_transient());
    assert_eq!(mock.calls().len(), 1);
    assert_eq!(err.attempts().len(), 1);
    assert_eq!(
        err.attempts()[0].outcome,
        AttemptOutcome::Failed(FailureClass::Transient)
    );
}

#[tokio::test(start_paused = true)]
async fn a_retry_after_longer_than_the_maximum_is_not_waited_out() {
    let mock = Mock::new(&[
        Step::Fail(
            FailureClass::RateLimited,
            Some(429),
            Some(Duration::from_secs(3600)),
        ),
        Step::Ok,
    ]);
    // No deadline anywhere: only max_retry_after (60 s) bounds the wait.
    let svc = RetryLayer::new().layer(mock.chat());
    let start = Instant::now();
    let err = svc.oneshot(req()).await.expect_err("not waited out");
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(mock.calls().len(), 1);
    assert_eq!(
        err.attempts()[0].retry_stop,
        Some(RetryStop::RetryAfterTooLong)
    );

    let mock = Mock::new(&[
        Step::Fail(
            FailureClass::RateLimited,
            Some(429),
            Some(Duration::from_secs(90)),
        ),
        Step::Ok,
    ]);
    let svc = RetryLayer::new()
        .with_max_retry_after(Duration::from_secs(120))
        .layer(mock.chat());
    svc.oneshot(req()).await.expect("waited 90 s");
    assert_eq!(mock.gaps(), [Duration::from_secs(90)]);
}

#[tokio::test(start_paused = true)]
async fn polling_a_finished_call_again_sends_nothing_more() {
    let mock = Mock::new(&[Step::Ok]);
    let mut svc = RetryLayer::new().layer(mock.chat());
    std::future::poll_fn(|cx| tower::Service::poll_ready(&mut svc, cx))
        .await
        .expect("ready");
    let mut fut = tokio_test::task::spawn(tower::Service::call(&mut svc, req()));
    assert!(tokio_test::assert_ready!(fut.poll()).is_ok());
    let again = tokio_test::assert_ready!(fut.poll());
    assert!(again.expect_err("no second answer").is_cancelled());
    tokio::time::advance(Duration::from_secs(5)).await;
    assert_eq!(mock.calls().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_full_attempt_log_stops_before_calling() {
    let mock = Mock::new(&[Step::Ok]);
    let mut r = req();
    let log = AttemptLog::install(&mut r).expect("owner");
    for n in 1..=16 {
        log.push(AttemptRecord::new(
            &Link::new("earlier", "m"),
            n,
            AttemptOutcome::Failed(FailureClass::Transient),
            Duration::ZERO,
        ))
        .expect("room");
    }
    let err = RetryLayer::new()
        .layer(mock.chat())
        .oneshot(r)
        .await
        .expect_err("cap");
    assert!(err.is_invalid_response());
    assert!(err.to_string().contains("attempts cap exceeded"), "{err}");
    assert!(mock.calls().is_empty());
    assert_eq!(log.len(), 16);
}

#[tokio::test(start_paused = true)]
async fn http_final_failure_is_the_last_response() {
    let mock = Mock::new(&[fail(FailureClass::Transient, 503)]);
    let svc = RetryLayer::http()
        .with_rng(FixedFraction(0.5))
        .layer(mock.http());
    let start = Instant::now();
    let res = svc.oneshot(kept()).await.expect("response");
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(start.elapsed(), MS(1000));
    let attempts = &res.extensions().get::<Attempts>().expect("owned log").0;
    assert_eq!(attempts.len(), 3);
}

#[tokio::test(start_paused = true)]
async fn the_policy_works_inside_towers_own_retry() {
    let mock = Mock::new(&[fail(FailureClass::Transient, 502), Step::Ok]);
    let layer = RetryLayer::new().with_rng(FixedFraction(0.5));
    let svc = ServiceBuilder::new()
        .layer(DeadlineLayer::new(Duration::from_secs(30)))
        .layer(tower::retry::RetryLayer::new(layer.policy()))
        .layer(layer.attempt_layer())
        .service(mock.chat());
    let res = svc.oneshot(req()).await.expect("retried");
    assert_eq!(mock.gaps(), [MS(200)]);
    assert_eq!(
        statuses(&res.attempts),
        [AttemptStatus::RetriedAfter5xx, AttemptStatus::Succeeded]
    );
}

/// Seed 004: "no retry if backoff + next attempt cannot finish within
/// remaining deadline". A 200 ms backoff fits in 1 s, a 200 ms wait plus
/// the default 1 s minimum attempt does not: the failure comes back at
/// once, for the fallback to use the time.
#[tokio::test(start_paused = true)]
async fn seed_004_no_retry_when_the_wait_and_a_useful_attempt_do_not_fit() {
    let mock = Mock::new(&[fail(FailureClass::Transient, 503), Step::Ok]);
    let svc = ServiceBuilder::new()
        .layer(DeadlineLayer::new(Duration::from_secs(1)))
        .layer(RetryLayer::new().with_rng(FixedFraction(0.5)))
        .service(mock.chat());
    let start = Instant::now();
    let err = svc.oneshot(req()).await.expect_err("not retried");
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(mock.calls().len(), 1);
    assert!(err.is_transient());
    assert_eq!(err.attempts()[0].retry_stop, Some(RetryStop::PastDeadline));

    // With a 1.2 s deadline, 200 ms + 1 s fits exactly: retried.
    let mock = Mock::new(&[fail(FailureClass::Transient, 503), Step::Ok]);
    let svc = ServiceBuilder::new()
        .layer(DeadlineLayer::new(MS(1_200)))
        .layer(RetryLayer::new().with_rng(FixedFraction(0.5)))
        .service(mock.chat());
    svc.oneshot(req()).await.expect("retried");
    assert_eq!(mock.gaps(), [MS(200)]);
}

#[tokio::test(start_paused = true)]
async fn the_minimum_useful_attempt_is_configurable() {
    // 200 ms + 500 ms fits in 1 s.
    let mock = Mock::new(&[fail(FailureClass::Transient, 503), Step::Ok]);
    let svc = ServiceBuilder::new()
        .layer(DeadlineLayer::new(Duration::from_secs(1)))
        .layer(
            RetryLayer::new()
                .with_rng(FixedFraction(0.5))
                .with_min_attempt(MS(500)),
        )
        .service(mock.chat());
    let res = svc.oneshot(req()).await.expect("retried");
    assert_eq!(mock.gaps(), [MS(200)]);
    assert_eq!(
        statuses(&res.attempts),
        [AttemptStatus::RetriedAfter5xx, AttemptStatus::Succeeded]
    );
    // Never more than the attempt timeout: a 300 ms attempt timeout makes
    // 200 ms + 300 ms the test, which fits in 600 ms.
    let mock = Mock::new(&[fail(FailureClass::Transient, 503), Step::Ok]);
    let svc = ServiceBuilder::new()
        .layer(DeadlineLayer::new(MS(600)))
        .layer(
            RetryLayer::new()
                .with_rng(FixedFraction(0.5))
                .with_attempt_timeout(MS(300)),
        )
        .service(mock.chat());
    svc.oneshot(req()).await.expect("retried");
    assert_eq!(mock.calls().len(), 2);
}

/// Seed 000: Retry-After is a floor under the backoff, not a replacement:
/// `Retry-After: 0` (or a date in the past) still waits the schedule, so a
/// storm of zero hints cannot turn into back-to-back retries.
#[tokio::test(start_paused = true)]
async fn seed_000_retry_after_zero_still_waits_the_backoff() {
    let zero = Step::Fail(FailureClass::RateLimited, Some(429), Some(Duration::ZERO));
    let mock = Mock::new(&[zero]);
    let start = Instant::now();
    let err = stack(&mock, RetryLayer::new().with_rng(FixedFraction(0.5)))
        .oneshot(req())
        .await
        .expect_err("three 429s");
    assert!(err.is_rate_limited());
    assert_eq!(mock.gaps(), [MS(200), MS(800)]);
    assert_eq!(start.elapsed(), MS(1_000));

    // A shorter hint than the backoff: the backoff; a longer one: the hint.
    let short = Step::Fail(FailureClass::RateLimited, Some(429), Some(MS(50)));
    let long = Step::Fail(FailureClass::RateLimited, Some(429), Some(MS(3_000)));
    let mock = Mock::new(&[short, long, Step::Ok]);
    stack(&mock, RetryLayer::new().with_rng(FixedFraction(0.5)))
        .oneshot(req())
        .await
        .expect("third attempt");
    assert_eq!(mock.gaps(), [MS(200), MS(3_000)]);
}

#[tokio::test(start_paused = true)]
async fn a_retry_after_date_in_the_past_waits_the_backoff() {
    let calls = Arc::new(Mutex::new(Vec::new()));
    let seen = calls.clone();
    let svc = ServiceBuilder::new()
        .layer(DeadlineLayer::new(Duration::from_secs(30)))
        .layer(RetryLayer::http().with_rng(FixedFraction(0.5)))
        .service(service_fn(move |_req: http::Request<()>| {
            seen.lock().expect("lock").push(Instant::now());
            async {
                Ok::<_, Failure>(
                    http::Response::builder()
                        .status(503)
                        .header("retry-after", "Wed, 21 Oct 2015 07:28:00 GMT")
                        .body(())
                        .expect("response"),
                )
            }
        }));
    let res = svc.oneshot(http::Request::new(())).await.expect("answer");
    assert_eq!(res.status(), 503);
    let calls = calls.lock().expect("lock").clone();
    let gaps: Vec<_> = calls.windows(2).map(|w| w[1] - w[0]).collect();
    assert_eq!(gaps, [MS(200), MS(800)]);
}

/// Seed 004: a version/lock conflict needs a re-read, not the same request
/// again: a 409 is tried once by default, and a policy can opt in.
#[tokio::test(start_paused = true)]
async fn seed_004_a_409_conflict_is_not_retried_unless_the_policy_says_so() {
    let mock = Mock::new(&[fail(FailureClass::Transient, 409), Step::Ok]);
    let svc = ServiceBuilder::new()
        .layer(DeadlineLayer::new(Duration::from_secs(30)))
        .layer(RetryLayer::http())
        .service(mock.http());
    let res = svc.oneshot(kept()).await.expect("answer");
    assert_eq!(res.status(), 409);
    assert_eq!(mock.calls().len(), 1);
    let attempts = &res.extensions().get::<Attempts>().expect("attempts").0;
    assert_eq!(
        attempts[0].outcome,
        AttemptOutcome::Failed(FailureClass::Conflict)
    );
    assert_eq!(attempts[0].retry_stop, Some(RetryStop::NotRetryable));

    let retry_conflicts = tower_llm_core::FailurePolicy::default().with(
        FailureClass::Conflict,
        tower_llm_core::Disposition {
            retry: true,
            trip_breaker: false,
            failover: false,
        },
    );
    let mock = Mock::new(&[fail(FailureClass::Transient, 409), Step::Ok]);
    let svc = ServiceBuilder::new()
        .layer(DeadlineLayer::new(Duration::from_secs(30)))
        .layer(
            RetryLayer::http()
                .with_rng(FixedFraction(0.5))
                .with_failure_policy(retry_conflicts),
        )
        .service(mock.http());
    let res = svc.oneshot(http::Request::new(())).await.expect("answer");
    assert_eq!(res.status(), 200);
    assert_eq!(mock.gaps(), [MS(200)]);
}

/// A request that asks for the attempt records on its response.
fn kept() -> http::Request<()> {
    let mut req = http::Request::new(());
    req.extensions_mut().insert(tower_llm_core::KeepAttempts);
    req
}

/// A request going to a link that links follow (as the fallback layer
/// marks it) or not.
fn req_on_link(alternates_after: bool) -> ChatRequest {
    let mut r = req();
    Link::new("primary", "m")
        .with_alternates_after(alternates_after)
        .store(&mut r);
    r
}

#[tokio::test(start_paused = true)]
async fn failover_on_timeout_gives_a_timed_out_attempt_to_the_next_link_at_once() {
    let mock = Mock::new(&[Step::Hang]);
    let retry = RetryLayer::new()
        .with_attempt_timeout(MS(2_000))
        .with_failover_on_timeout(true);
    let start = Instant::now();
    let err = stack(&mock, retry)
        .oneshot(req_on_link(true))
        .await
        .expect_err("timed out");
    assert!(err.is_timeout(), "{err:?}");
    assert_eq!(start.elapsed(), MS(2_000), "one attempt, no retry");
    assert_eq!(mock.calls().len(), 1);
    assert_eq!(err.attempts().len(), 1);
    assert_eq!(
        err.attempts()[0].retry_stop,
        Some(RetryStop::FailoverOnTimeout)
    );
}

#[tokio::test(start_paused = true)]
async fn failover_on_timeout_still_retries_the_last_link_and_other_failures() {
    // The last link (nothing follows): the timeout is retried, 3 attempts.
    let mock = Mock::new(&[Step::Hang]);
    let retry = || {
        RetryLayer::new()
            .with_attempt_timeout(MS(2_000))
            .with_failover_on_timeout(true)
            .with_rng(FixedFraction(0.5))
    };
    let err = stack(&mock, retry())
        .oneshot(req_on_link(false))
        .await
        .expect_err("timed out");
    assert!(err.is_timeout(), "{err:?}");
    assert_eq!(mock.calls().len(), 3);
    assert_eq!(
        err.attempts()[2].retry_stop,
        Some(RetryStop::AttemptsExhausted)
    );
    // A 408 from the provider is its answer, not our timeout: retried.
    let mock = Mock::new(&[fail(FailureClass::Timeout, 408), Step::Ok]);
    stack(&mock, retry())
        .oneshot(req_on_link(true))
        .await
        .expect("retried after the 408");
    assert_eq!(mock.calls().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn without_failover_on_timeout_a_timeout_is_retried_on_the_same_link() {
    let mock = Mock::new(&[Step::Hang]);
    let retry = RetryLayer::new()
        .with_attempt_timeout(MS(2_000))
        .with_rng(FixedFraction(0.5));
    let err = stack(&mock, retry)
        .oneshot(req_on_link(true))
        .await
        .expect_err("timed out");
    assert!(err.is_timeout(), "{err:?}");
    assert_eq!(mock.calls().len(), 3);
}
