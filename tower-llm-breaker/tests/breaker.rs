//! Behaviour of the circuit breaker, under virtual time (and one stress
//! test on two worker threads).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::StatusCode;
use tower::util::BoxCloneService;
use tower::{Layer, ServiceExt, service_fn};
use tower_llm_breaker::{
    BreakerConfig, BreakerHandle, BreakerKey, BreakerLayer, CircuitState, RatioTrigger, Transition,
};
use tower_llm_core::layer::AttemptLogExt as _;
use tower_llm_core::{ChatRequest, ChatResponse, Failure, FailureClass, Link, Message, Usage};

type Svc = BoxCloneService<ChatRequest, ChatResponse, Failure>;

/// What the provider does with the next call.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Answer {
    Ok,
    Status(u16),
    RateLimited(u64),
    HangThen(u64, bool),
    LateRateLimited(u64, u64),
}

/// A provider whose next answer the test sets; counts calls.
#[derive(Clone)]
struct Provider {
    answer: Arc<Mutex<Answer>>,
    calls: Arc<AtomicUsize>,
}

impl Provider {
    fn new(answer: Answer) -> Self {
        Provider {
            answer: Arc::new(Mutex::new(answer)),
            calls: Arc::new(AtomicUsize::new(0)),
        }
    }

    fn set(&self, answer: Answer) {
        *self.answer.lock().expect("lock") = answer;
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    fn service(&self) -> Svc {
        let p = self.clone();
        BoxCloneService::new(service_fn(move |req: ChatRequest| {
            p.calls.fetch_add(1, Ordering::SeqCst);
            let answer = *p.answer.lock().expect("lock");
            async move {
                let status = |s: u16| StatusCode::from_u16(s).expect("status");
                match answer {
                    Answer::Ok => Ok(ok(&req)),
                    Answer::Status(s) => {
                        let class = match s {
                            400 => FailureClass::BadRequest,
                            401 | 403 => FailureClass::Auth,
                            404 => FailureClass::NotFound,
                            _ => FailureClass::Transient,
                        };
                        Err(Failure::new(class).with_status(status(s)))
                    }
                    Answer::RateLimited(secs) => Err(Failure::new(FailureClass::RateLimited)
                        .with_status(status(429))
                        .with_retry_after(Duration::from_secs(secs))),
                    Answer::LateRateLimited(ms, secs) => {
                        tokio::time::sleep(Duration::from_millis(ms)).await;
                        Err(Failure::new(FailureClass::RateLimited)
                            .with_status(status(429))
                            .with_retry_after(Duration::from_secs(secs)))
                    }
                    Answer::HangThen(ms, succeed) => {
                        tokio::time::sleep(Duration::from_millis(ms)).await;
                        if succeed {
                            Ok(ok(&req))
                        } else {
                            Err(Failure::new(FailureClass::Transient).with_status(status(503)))
                        }
                    }
                }
            }
        }))
    }
}

fn ok(req: &ChatRequest) -> ChatResponse {
    ChatResponse {
        id: "id".into(),
        model: req.model.to_string(),
        provider: "p".into(),
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

fn req_for(provider: &str) -> ChatRequest {
    let mut r = req();
    Link::new(provider, "m").store(&mut r);
    r
}

fn key() -> BreakerKey {
    BreakerKey::new("default", "")
}

fn breaker(config: BreakerConfig) -> (BreakerLayer, BreakerHandle) {
    let layer = BreakerLayer::new()
        .with_config(config)
        .expect("valid config");
    let handle = layer.handle();
    (layer, handle)
}

fn state(handle: &BreakerHandle, key: &BreakerKey) -> CircuitState {
    handle.get(key).expect("circuit exists").state
}

#[tokio::test(start_paused = true)]
async fn five_503s_open_the_circuit_and_the_sixth_fails_fast() {
    let provider = Provider::new(Answer::Status(503));
    let (layer, handle) = breaker(BreakerConfig::default());
    let svc = layer.layer(provider.service());
    for n in 1..=5 {
        let err = svc.clone().oneshot(req()).await.expect_err("503");
        assert!(err.is_transient(), "call {n}: {err:?}");
    }
    assert_eq!(provider.calls(), 5);
    assert_eq!(state(&handle, &key()), CircuitState::Open);

    tokio::time::advance(Duration::from_secs(1)).await;
    let err = svc.clone().oneshot(req()).await.expect_err("open");
    assert!(err.is_circuit_open(), "{err:?}");
    assert_eq!(err.retry_after(), Some(Duration::from_secs(29)));
    assert_eq!(err.provider(), Some("default"));
    assert_eq!(provider.calls(), 5, "the inner service was not called");
}

async fn open_it(svc: &Svc, provider: &Provider, handle: &BreakerHandle) {
    provider.set(Answer::Status(503));
    for _ in 0..5 {
        let _ = svc.clone().oneshot(req()).await;
    }
    assert_eq!(state(handle, &key()), CircuitState::Open);
}

#[tokio::test(start_paused = true)]
async fn after_the_cooldown_exactly_one_of_ten_concurrent_calls_probes() {
    for probe_succeeds in [true, false] {
        let provider = Provider::new(Answer::Status(503));
        let (layer, handle) = breaker(BreakerConfig::default());
        let svc: Svc = BoxCloneService::new(layer.layer(provider.service()));
        open_it(&svc, &provider, &handle).await;
        let before = provider.calls();

        tokio::time::advance(Duration::from_secs(30)).await;
        provider.set(Answer::HangThen(100, probe_succeeds));
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..10 {
            tasks.spawn(svc.clone().oneshot(req()));
        }
        let mut refused = 0;
        while let Some(done) = tasks.join_next().await {
            if let Err(e) = done.expect("task") {
                if e.is_circuit_open() {
                    refused += 1;
                }
            }
        }
        assert_eq!(provider.calls() - before, 1, "exactly one probe");
        assert_eq!(refused, 9);
        let expected = if probe_succeeds {
            CircuitState::Closed
        } else {
            CircuitState::Open
        };
        assert_eq!(state(&handle, &key()), expected);
        if !probe_succeeds {
            let snap = handle.get(&key()).expect("circuit");
            assert_eq!(snap.retry_after, Some(Duration::from_secs(30)));
            assert_eq!(snap.reopens, 1);
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_dropped_probe_frees_its_slot() {
    let provider = Provider::new(Answer::Status(503));
    let (layer, handle) = breaker(BreakerConfig::default());
    let svc: Svc = BoxCloneService::new(layer.layer(provider.service()));
    open_it(&svc, &provider, &handle).await;

    tokio::time::advance(Duration::from_secs(30)).await;
    provider.set(Answer::HangThen(60_000, true));
    let probe = tokio::spawn(svc.clone().oneshot(req()));
    tokio::task::yield_now().await;
    assert_eq!(state(&handle, &key()), CircuitState::HalfOpen);
    assert!(
        svc.clone()
            .oneshot(req())
            .await
            .expect_err("slot taken")
            .is_circuit_open()
    );
    probe.abort();
    let _ = probe.await;

    // The slot is free at once: the next call probes and closes it.
    provider.set(Answer::Ok);
    svc.clone().oneshot(req()).await.expect("new probe");
    assert_eq!(state(&handle, &key()), CircuitState::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_probe_that_never_answers_is_presumed_lost_after_a_cooldown() {
    let provider = Provider::new(Answer::Status(503));
    let (layer, handle) = breaker(BreakerConfig::default());
    let svc: Svc = BoxCloneService::new(layer.layer(provider.service()));
    open_it(&svc, &provider, &handle).await;

    tokio::time::advance(Duration::from_secs(30)).await;
    provider.set(Answer::HangThen(3_600_000, true));
    let _hung = tokio::spawn(svc.clone().oneshot(req()));
    tokio::task::yield_now().await;
    tokio::time::advance(Duration::from_secs(29)).await;
    assert!(
        svc.clone()
            .oneshot(req())
            .await
            .expect_err("still probing")
            .is_circuit_open()
    );
    tokio::time::advance(Duration::from_secs(1)).await;
    provider.set(Answer::Ok);
    svc.clone().oneshot(req()).await.expect("a fresh probe");
    assert_eq!(state(&handle, &key()), CircuitState::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_lost_probe_coming_back_late_does_not_free_its_replacements_slot() {
    let provider = Provider::new(Answer::Status(503));
    let (layer, handle) = breaker(BreakerConfig::default());
    let svc: Svc = BoxCloneService::new(layer.layer(provider.service()));
    open_it(&svc, &provider, &handle).await;

    tokio::time::advance(Duration::from_secs(30)).await;
    provider.set(Answer::HangThen(3_600_000, true));
    let lost = tokio::spawn(svc.clone().oneshot(req()));
    tokio::task::yield_now().await;
    tokio::time::advance(Duration::from_secs(30)).await;
    let replacement = tokio::spawn(svc.clone().oneshot(req()));
    tokio::task::yield_now().await;
    let before = provider.calls();
    // The lost probe finally goes away...
    lost.abort();
    let _ = lost.await;
    // ...but the replacement still holds the only slot.
    let err = svc.clone().oneshot(req()).await.expect_err("slot taken");
    assert!(err.is_circuit_open());
    assert_eq!(provider.calls(), before);
    assert_eq!(handle.get(&key()).expect("circuit").probes_in_flight, 1);
    replacement.abort();
}

#[tokio::test(start_paused = true)]
async fn a_late_rate_limit_hold_extends_an_open_circuit() {
    let provider = Provider::new(Answer::LateRateLimited(1_000, 120));
    let (layer, handle) = breaker(BreakerConfig {
        consecutive_failures: 1,
        ..BreakerConfig::default()
    });
    let svc: Svc = BoxCloneService::new(layer.layer(provider.service()));
    // Admitted while closed; its 429 (hold 120 s) arrives at 1 s.
    let late = tokio::spawn(svc.clone().oneshot(req()));
    tokio::task::yield_now().await;
    // Meanwhile a 503 trips the circuit for the 30 s cooldown.
    provider.set(Answer::Status(503));
    let _ = svc.clone().oneshot(req()).await;
    assert_eq!(
        handle.get(&key()).expect("circuit").retry_after,
        Some(Duration::from_secs(30))
    );
    assert!(
        late.await
            .expect("task")
            .expect_err("429")
            .is_rate_limited()
    );
    // The late hold extends the open circuit to 1 s + 120 s.
    let snap = handle.get(&key()).expect("circuit");
    assert_eq!(snap.state, CircuitState::Open);
    assert_eq!(snap.retry_after, Some(Duration::from_secs(120)));
}

#[tokio::test(start_paused = true)]
async fn circuits_whose_failures_went_stale_are_evicted_when_full() {
    use tower_llm_breaker::MemoryStore;
    let provider = Provider::new(Answer::Status(503));
    let store = Arc::new(MemoryStore::new(2).with_stale_after(Duration::from_secs(10)));
    let layer = BreakerLayer::new()
        .with_key_fn(|req: &ChatRequest, link: &Link| {
            BreakerKey::from_link(Link::of(req).unwrap_or(link))
        })
        .with_store(store.clone());
    let handle = layer.handle();
    let svc = layer.layer(provider.service());
    for tenant in ["t1", "t2"] {
        let _ = svc.clone().oneshot(req_for(tenant)).await;
    }
    assert_eq!(store.len(), 2);
    tokio::time::advance(Duration::from_secs(11)).await;
    for _ in 0..5 {
        let _ = svc.clone().oneshot(req_for("t3")).await;
    }
    assert_eq!(
        state(&handle, &BreakerKey::new("t3", "m")),
        CircuitState::Open
    );
    assert!(store.len() <= 2);
}

#[tokio::test(start_paused = true)]
async fn client_errors_neither_reset_nor_advance_the_count() {
    let provider = Provider::new(Answer::Status(503));
    let (layer, handle) = breaker(BreakerConfig::default());
    let svc = layer.layer(provider.service());
    let script = [503, 400, 503, 401, 503, 404, 503, 403];
    for status in script {
        provider.set(Answer::Status(status));
        let _ = svc.clone().oneshot(req()).await;
    }
    let snap = handle.get(&key()).expect("circuit");
    assert_eq!(snap.state, CircuitState::Closed);
    assert_eq!(snap.consecutive_failures, 4);
    provider.set(Answer::Status(503));
    let _ = svc.clone().oneshot(req()).await;
    assert_eq!(state(&handle, &key()), CircuitState::Open);
    // A success, by contrast, resets the count.
    handle.close(&key());
    for answer in [
        Answer::Status(503),
        Answer::Status(503),
        Answer::Ok,
        Answer::Status(503),
    ] {
        provider.set(answer);
        let _ = svc.clone().oneshot(req()).await;
    }
    assert_eq!(handle.get(&key()).expect("circuit").consecutive_failures, 1);
}

#[tokio::test(start_paused = true)]
async fn one_provider_open_another_serving() {
    let a = Provider::new(Answer::Status(503));
    let b = Provider::new(Answer::Ok);
    let (layer, handle) = breaker(BreakerConfig::default());
    // One layer (one store) in front of a router by provider name.
    let router = route_a_or_b(&a, &b);
    let svc = layer.layer(router);
    for _ in 0..5 {
        let _ = svc.clone().oneshot(req_for("a")).await;
    }
    assert!(
        svc.clone()
            .oneshot(req_for("a"))
            .await
            .expect_err("a open")
            .is_circuit_open()
    );
    for _ in 0..3 {
        svc.clone().oneshot(req_for("b")).await.expect("b serves");
    }
    assert_a_open_b_closed(&handle);
}

/// Routes requests whose link is provider "a" to `a`, the rest to `b`.
fn route_a_or_b(a: &Provider, b: &Provider) -> Svc {
    let (sa, sb) = (a.service(), b.service());
    BoxCloneService::new(service_fn(move |req: ChatRequest| {
        let to_a = Link::of(&req).is_some_and(|l| l.provider() == "a");
        if to_a { sa.clone() } else { sb.clone() }.oneshot(req)
    }))
}

fn assert_a_open_b_closed(handle: &BreakerHandle) {
    assert_eq!(
        state(handle, &BreakerKey::new("a", "m")),
        CircuitState::Open
    );
    assert_eq!(
        state(handle, &BreakerKey::new("b", "m")),
        CircuitState::Closed
    );
}

/// The tenant a request is made for.
#[derive(Clone)]
struct Tenant(&'static str);

#[tokio::test(start_paused = true)]
async fn a_credential_scoped_key_opens_only_for_that_credential() {
    let provider = Provider::new(Answer::Ok);
    let layer = BreakerLayer::new().with_key_fn(|req: &ChatRequest, link: &Link| {
        let key = BreakerKey::from_link(tower_llm_core::Link::of(req).unwrap_or(link));
        match req.extensions.get::<Tenant>() {
            Some(t) => key.with_scope(t.0),
            None => key,
        }
    });
    let handle = layer.handle();
    let failing = provider.service();
    // Tenant t1's key is revoked upstream: 5xx-class failures for t1 only.
    let svc = layer.layer(service_fn(move |req: ChatRequest| {
        let revoked = req.extensions.get::<Tenant>().is_some_and(|t| t.0 == "t1");
        let inner = failing.clone();
        async move {
            if revoked {
                Err(Failure::new(FailureClass::Transient))
            } else {
                inner.oneshot(req).await
            }
        }
    }));
    let for_tenant = |t: &'static str| {
        let mut r = req();
        r.extensions.insert(Tenant(t));
        r
    };
    for _ in 0..5 {
        let _ = svc.clone().oneshot(for_tenant("t1")).await;
    }
    assert!(
        svc.clone()
            .oneshot(for_tenant("t1"))
            .await
            .expect_err("t1")
            .is_circuit_open()
    );
    svc.clone()
        .oneshot(for_tenant("t2"))
        .await
        .expect("t2 unaffected");
    assert_eq!(
        state(&handle, &BreakerKey::new("default", "").with_scope("t1")),
        CircuitState::Open
    );
    assert_eq!(
        state(&handle, &BreakerKey::new("default", "").with_scope("t2")),
        CircuitState::Closed
    );
}

#[tokio::test(start_paused = true)]
async fn the_failure_ratio_waits_for_its_minimum_calls() {
    let provider = Provider::new(Answer::Ok);
    let (layer, handle) = breaker(BreakerConfig {
        consecutive_failures: 0,
        failure_ratio: Some(RatioTrigger {
            ratio: 0.5,
            min_calls: 20,
            window: Duration::from_secs(30),
        }),
        ..BreakerConfig::default()
    });
    let svc = layer.layer(provider.service());
    // 19 calls, 10 failing: 53 %, but below the minimum.
    for i in 0..19 {
        provider.set(if i % 2 == 0 {
            Answer::Status(503)
        } else {
            Answer::Ok
        });
        let _ = svc.clone().oneshot(req()).await;
    }
    assert_eq!(state(&handle, &key()), CircuitState::Closed);
    provider.set(Answer::Status(503));
    let _ = svc.clone().oneshot(req()).await;
    assert_eq!(state(&handle, &key()), CircuitState::Open);
}

#[tokio::test(start_paused = true)]
async fn the_failure_ratio_forgets_calls_outside_its_window() {
    let provider = Provider::new(Answer::Status(503));
    let (layer, handle) = breaker(BreakerConfig {
        consecutive_failures: 0,
        failure_ratio: Some(RatioTrigger {
            ratio: 0.5,
            min_calls: 4,
            window: Duration::from_secs(10),
        }),
        ..BreakerConfig::default()
    });
    let svc = layer.layer(provider.service());
    for _ in 0..3 {
        let _ = svc.clone().oneshot(req()).await;
    }
    tokio::time::advance(Duration::from_secs(11)).await;
    let _ = svc.clone().oneshot(req()).await;
    assert_eq!(state(&handle, &key()), CircuitState::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_long_429_hold_refuses_new_attempts_then_admits_every_caller() {
    // One tripping failure would open the circuit; a held 429 must not.
    let provider = Provider::new(Answer::RateLimited(5));
    let transitions = Arc::new(Mutex::new(Vec::<Transition>::new()));
    let seen = transitions.clone();
    let layer = BreakerLayer::new()
        .with_config(BreakerConfig {
            consecutive_failures: 1,
            ..BreakerConfig::default()
        })
        .expect("valid config")
        .on_transition(move |t| seen.lock().expect("lock").push(t.clone()));
    let handle = layer.handle();
    let svc = layer.layer(provider.service());

    let err = svc.clone().oneshot(req()).await.expect_err("429");
    assert!(err.is_rate_limited());
    let snap = handle.get(&key()).expect("circuit");
    assert_eq!(snap.state, CircuitState::Closed);
    assert_eq!(snap.consecutive_failures, 0);
    assert_eq!(snap.retry_after, Some(Duration::from_secs(5)));

    // Until the hold ends, new attempts are refused as rate-limited with
    // the rest of the hold (a retry layer outside waits it out; the circuit
    // is not open); the provider is not called.
    provider.set(Answer::HangThen(1_000, true));
    tokio::time::advance(Duration::from_millis(4_999)).await;
    let err = svc.clone().oneshot(req()).await.expect_err("held");
    assert!(err.is_rate_limited() && !err.is_circuit_open());
    assert_eq!(err.retry_after(), Some(Duration::from_millis(1)));
    assert_eq!(provider.calls(), 1);

    // Then every concurrent caller is let through, not one probe.
    tokio::time::advance(Duration::from_millis(1)).await;
    let calls: Vec<_> = (0..9)
        .map(|_| tokio::spawn(svc.clone().oneshot(req())))
        .collect();
    for call in calls {
        call.await.expect("task").expect("admitted and answered");
    }
    assert_eq!(provider.calls(), 10);
    assert_eq!(state(&handle, &key()), CircuitState::Closed);
    assert!(
        transitions.lock().expect("lock").is_empty(),
        "a hold is no state change"
    );
}

#[tokio::test(start_paused = true)]
async fn a_short_429_hold_is_no_hold_and_counts_as_an_ordinary_failure() {
    // 500 ms < the 1 s threshold: the retry layer's wait handles it.
    let provider = Provider::new(Answer::Status(429));
    let (layer, handle) = breaker(BreakerConfig {
        consecutive_failures: 2,
        ..BreakerConfig::default()
    });
    let svc = BoxCloneService::new(layer.layer(service_fn({
        let calls = provider.calls.clone();
        move |_req: ChatRequest| {
            calls.fetch_add(1, Ordering::SeqCst);
            async move {
                Err::<ChatResponse, _>(
                    Failure::new(FailureClass::RateLimited)
                        .with_status(StatusCode::TOO_MANY_REQUESTS)
                        .with_retry_after(Duration::from_millis(500)),
                )
            }
        }
    })));
    let _ = svc.clone().oneshot(req()).await;
    let snap = handle.get(&key()).expect("circuit");
    assert_eq!((snap.state, snap.retry_after), (CircuitState::Closed, None));
    assert_eq!(snap.consecutive_failures, 1);
    // The next attempt is admitted at once; a second 429 in a row opens
    // the circuit like any two tripping failures.
    let _ = svc.clone().oneshot(req()).await;
    assert_eq!(provider.calls(), 2);
    assert_eq!(state(&handle, &key()), CircuitState::Open);
}

#[tokio::test(start_paused = true)]
async fn reopening_only_ever_extends() {
    let provider = Provider::new(Answer::RateLimited(60));
    let (layer, handle) = breaker(BreakerConfig::default());
    let svc = layer.layer(provider.service());
    let _ = svc.clone().oneshot(req()).await;
    assert_eq!(
        handle.get(&key()).expect("c").retry_after,
        Some(Duration::from_secs(60))
    );
    // A later, shorter hold arriving from a call admitted earlier does not
    // shorten it (the outcome belongs to an old generation anyway).
    handle.isolate(&key());
    assert_eq!(state(&handle, &key()), CircuitState::Isolated);
    tokio::time::advance(Duration::from_secs(3600)).await;
    assert!(
        svc.clone()
            .oneshot(req())
            .await
            .expect_err("isolated")
            .is_circuit_open()
    );
    handle.close(&key());
    provider.set(Answer::Ok);
    svc.clone().oneshot(req()).await.expect("closed by hand");
}

#[tokio::test(start_paused = true)]
async fn cooldown_grows_on_consecutive_reopens_up_to_the_cap() {
    let provider = Provider::new(Answer::Status(503));
    let (layer, handle) = breaker(BreakerConfig {
        consecutive_failures: 1,
        cooldown: Duration::from_secs(10),
        cooldown_growth: 2.0,
        max_cooldown: Duration::from_secs(35),
        ..BreakerConfig::default()
    });
    let svc = layer.layer(provider.service());
    let _ = svc.clone().oneshot(req()).await;
    let mut seen = vec![handle.get(&key()).expect("c").retry_after];
    for _ in 0..3 {
        let wait = seen.last().copied().flatten().expect("open");
        tokio::time::advance(wait).await;
        let _ = svc.clone().oneshot(req()).await; // the probe fails
        seen.push(handle.get(&key()).expect("c").retry_after);
    }
    let secs = |s| Some(Duration::from_secs(s));
    assert_eq!(seen, [secs(10), secs(20), secs(35), secs(35)]);
}

#[tokio::test(start_paused = true)]
async fn an_attempt_timeout_of_the_retry_layer_counts_against_the_circuit() {
    let provider = Provider::new(Answer::HangThen(60_000, true));
    let (layer, handle) = breaker(BreakerConfig {
        consecutive_failures: 2,
        ..BreakerConfig::default()
    });
    let svc = tower::ServiceBuilder::new()
        .layer(
            tower_llm_retry::RetryLayer::new()
                .with_max_attempts(1)
                .with_attempt_timeout(Duration::from_secs(1)),
        )
        .layer(layer)
        .service(provider.service());
    for _ in 0..2 {
        assert!(
            svc.clone()
                .oneshot(req())
                .await
                .expect_err("timeout")
                .is_timeout()
        );
    }
    assert_eq!(state(&handle, &key()), CircuitState::Open);
}

#[tokio::test(start_paused = true)]
async fn the_deadline_and_cancellation_do_not_count() {
    let provider = Provider::new(Answer::HangThen(60_000, true));
    let (layer, handle) = breaker(BreakerConfig {
        consecutive_failures: 1,
        ..BreakerConfig::default()
    });
    let svc = tower::ServiceBuilder::new()
        .layer(tower_llm_deadline::DeadlineLayer::new(Duration::from_secs(
            1,
        )))
        .layer(tower_llm_retry::RetryLayer::new())
        .layer(layer)
        .service(provider.service());
    for _ in 0..3 {
        let err = svc.clone().oneshot(req()).await.expect_err("deadline");
        assert!(err.is_deadline_exceeded(), "{err:?}");
    }
    assert_eq!(state(&handle, &key()), CircuitState::Closed);

    // A caller that goes away mid-attempt does not count either.
    for _ in 0..3 {
        let call = tokio::spawn(svc.clone().oneshot(req()));
        tokio::time::advance(Duration::from_millis(500)).await;
        call.abort();
        assert!(call.await.expect_err("aborted").is_cancelled());
    }
    assert_eq!(state(&handle, &key()), CircuitState::Closed);
}

#[tokio::test(start_paused = true)]
async fn only_this_calls_own_attempt_record_can_charge_a_timeout() {
    // An earlier attempt of the call (another link) timed out; this
    // breaker sits with no retry layer of its own, and its call is cancelled.
    let provider = Provider::new(Answer::HangThen(60_000, true));
    let (layer, handle) = breaker(BreakerConfig {
        consecutive_failures: 1,
        ..BreakerConfig::default()
    });
    let svc = layer.layer(provider.service());
    let mut r = req();
    let log = tower_llm_core::AttemptLog::install(&mut r).expect("owner");
    log.push(tower_llm_core::AttemptRecord::new(
        &Link::new("other", "m"),
        1,
        tower_llm_core::AttemptOutcome::Failed(FailureClass::Timeout),
        Duration::from_secs(1),
    ))
    .expect("room");
    let call = tokio::spawn(svc.oneshot(r));
    tokio::time::advance(Duration::from_secs(1)).await;
    call.abort();
    let _ = call.await;
    assert_eq!(state(&handle, &key()), CircuitState::Closed);
}

#[tokio::test(start_paused = true)]
async fn slow_successes_can_count_as_failures() {
    let provider = Provider::new(Answer::HangThen(2_000, true));
    let (layer, handle) = breaker(BreakerConfig {
        consecutive_failures: 2,
        slow_call: Some(Duration::from_secs(1)),
        ..BreakerConfig::default()
    });
    let svc = layer.layer(provider.service());
    for _ in 0..2 {
        svc.clone().oneshot(req()).await.expect("slow but fine");
    }
    assert_eq!(state(&handle, &key()), CircuitState::Open);
}

/// Many tasks on two worker threads race for half-open probe slots; the
/// provider always fails, so every call that reaches it after the first
/// trip is a probe. Each round ends the cooldown by hand; within a round at
/// most K probes may reach the provider, and never more than K at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_more_than_k_probes_in_flight() {
    const K: u32 = 2;
    let in_flight = Arc::new(AtomicUsize::new(0));
    let max_in_flight = Arc::new(AtomicUsize::new(0));
    let calls = Arc::new(AtomicUsize::new(0));
    let (f, m, c) = (in_flight.clone(), max_in_flight.clone(), calls.clone());
    let provider = service_fn(move |_req: ChatRequest| {
        let (f, m, c) = (f.clone(), m.clone(), c.clone());
        async move {
            c.fetch_add(1, Ordering::SeqCst);
            let now = f.fetch_add(1, Ordering::SeqCst) + 1;
            m.fetch_max(now, Ordering::SeqCst);
            for _ in 0..8 {
                tokio::task::yield_now().await;
            }
            f.fetch_sub(1, Ordering::SeqCst);
            Err::<ChatResponse, _>(Failure::new(FailureClass::Transient))
        }
    });
    let layer = BreakerLayer::new()
        .with_config(BreakerConfig {
            consecutive_failures: 1,
            half_open_probes: K,
            cooldown: Duration::from_secs(3600),
            ..BreakerConfig::default()
        })
        .expect("config");
    let handle = layer.handle();
    let svc = layer.layer(provider);
    let _ = svc.clone().oneshot(req()).await;
    assert_eq!(state(&handle, &key()), CircuitState::Open);

    for round in 0..50 {
        let before = calls.load(Ordering::SeqCst);
        handle.probe_now(&key());
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..64 {
            let svc = svc.clone();
            tasks.spawn(async move {
                for _ in 0..4 {
                    let _ = svc.clone().oneshot(req()).await;
                    tokio::task::yield_now().await;
                }
            });
        }
        while tasks.join_next().await.is_some() {}
        let probes = calls.load(Ordering::SeqCst) - before;
        assert!(
            (1..=K as usize).contains(&probes),
            "round {round}: {probes} probes"
        );
        assert_eq!(state(&handle, &key()), CircuitState::Open);
    }
    assert!(max_in_flight.load(Ordering::SeqCst) <= K as usize);
}

/// One service (not a fresh clone per call) keeps its last key's circuit:
/// calls alternating between two keys still land on each key's own
/// circuit.
#[tokio::test(start_paused = true)]
async fn one_service_alternating_keys_keeps_each_keys_circuit() {
    use tower::Service;
    let a = Provider::new(Answer::Status(503));
    let b = Provider::new(Answer::Ok);
    let (layer, handle) = breaker(BreakerConfig::default());
    let mut svc = layer.layer(route_a_or_b(&a, &b));
    for _ in 0..5 {
        let _ = svc.ready().await.expect("ready").call(req_for("a")).await;
        svc.ready()
            .await
            .expect("ready")
            .call(req_for("b"))
            .await
            .expect("b serves");
    }
    let refused = svc.ready().await.expect("ready").call(req_for("a")).await;
    assert!(refused.expect_err("a open").is_circuit_open());
    assert_eq!(a.calls(), 5);
    assert_eq!(b.calls(), 5);
    assert_a_open_b_closed(&handle);
}

/// A full store hands out circuits it does not keep; a service must not
/// hold on to one, or that key would trip a circuit nobody can see.
#[tokio::test(start_paused = true)]
async fn a_circuit_the_full_store_did_not_keep_is_never_reused() {
    use tower::Service;
    use tower_llm_breaker::MemoryStore;
    let provider = Provider::new(Answer::HangThen(60_000, true));
    let store = Arc::new(MemoryStore::new(1));
    let layer = BreakerLayer::new().with_store(store.clone());
    let handle = layer.handle();
    let mut svc = layer.layer(provider.service());
    // Key "busy" fills the store and stays in flight.
    let busy = svc.ready().await.expect("ready").call(req_for("busy"));
    let busy = tokio::spawn(busy);
    tokio::task::yield_now().await;
    provider.set(Answer::Status(503));
    for _ in 0..8 {
        let failure = svc
            .ready()
            .await
            .expect("ready")
            .call(req_for("extra"))
            .await
            .expect_err("503");
        assert!(!failure.is_circuit_open());
    }
    assert_eq!(provider.calls(), 9);
    assert_eq!(store.len(), 1);
    assert!(handle.get(&BreakerKey::new("extra", "m")).is_none());
    busy.abort();
}

/// A service remembers its last key's circuit only weakly: the store still
/// forgets that circuit once it is idle, and the service then takes the
/// store's new circuit for the key, the one the handle sees.
#[tokio::test(start_paused = true)]
async fn a_services_last_circuit_can_still_be_evicted() {
    use tower::Service;
    use tower_llm_breaker::MemoryStore;
    let provider = Provider::new(Answer::Status(503));
    let store = Arc::new(MemoryStore::new(1).with_stale_after(Duration::from_secs(10)));
    let layer = BreakerLayer::new().with_store(store.clone());
    let handle = layer.handle();
    let mut svc = layer.layer(provider.service());
    let _ = svc.ready().await.expect("ready").call(req_for("a")).await;
    assert!(handle.get(&BreakerKey::new("a", "m")).is_some());
    // "a"'s failure goes stale; another service's key needs the room.
    tokio::time::advance(Duration::from_secs(11)).await;
    provider.set(Answer::Ok);
    let _ = layer
        .layer(provider.service())
        .oneshot(req_for("b"))
        .await
        .expect("b serves");
    assert!(handle.get(&BreakerKey::new("a", "m")).is_none(), "evicted");
    assert!(handle.get(&BreakerKey::new("b", "m")).is_some());
    // "a" again through the first service: the store's circuit, not the
    // forgotten one, counts its failures.
    tokio::time::advance(Duration::from_secs(11)).await;
    provider.set(Answer::Status(503));
    for _ in 0..5 {
        let _ = svc.ready().await.expect("ready").call(req_for("a")).await;
    }
    assert_eq!(
        state(&handle, &BreakerKey::new("a", "m")),
        CircuitState::Open
    );
    let refused = svc.ready().await.expect("ready").call(req_for("a")).await;
    assert!(refused.expect_err("open").is_circuit_open());
}

/// Seed 000: `Retry-After: 0` (or a date in the past, parsed as zero) asks
/// for no wait: it holds nothing open. It counts as the failure it is, but
/// does not flip the circuit open and half-open on every 429.
#[tokio::test(start_paused = true)]
async fn a_429_with_retry_after_zero_holds_nothing_open() {
    let provider = Provider::new(Answer::RateLimited(0));
    let transitions = Arc::new(Mutex::new(Vec::<Transition>::new()));
    let seen = transitions.clone();
    let layer =
        BreakerLayer::new().on_transition(move |t| seen.lock().expect("lock").push(t.clone()));
    let handle = layer.handle();
    let svc = layer.layer(provider.service());
    for _ in 0..4 {
        let err = svc.clone().oneshot(req()).await.expect_err("429");
        assert!(err.is_rate_limited(), "{err:?}");
    }
    let c = handle.get(&key()).expect("circuit");
    assert_eq!((c.state, c.consecutive_failures), (CircuitState::Closed, 4));
    assert_eq!(provider.calls(), 4);
    assert!(transitions.lock().expect("lock").is_empty());
}

/// Records what circuits report; admits probes only while `permits` > 0.
#[derive(Debug, Default)]
struct Recorder {
    events: Mutex<Vec<(tower_llm_breaker::CircuitEvent, Option<CircuitState>)>>,
    permits: AtomicUsize,
}

impl tower_llm_breaker::CircuitEvents for Recorder {
    fn on_event(
        &self,
        _circuit: &tower_llm_breaker::Circuit,
        event: tower_llm_breaker::CircuitEvent,
        transition: Option<&Transition>,
    ) {
        self.events
            .lock()
            .expect("lock")
            .push((event, transition.map(|t| t.to)));
    }

    fn permit_probe(&self, _key: &BreakerKey) -> bool {
        self.permits
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }
}

type Recorded = (
    BreakerLayer,
    BreakerHandle,
    Arc<Recorder>,
    Arc<tower_llm_breaker::MemoryStore>,
);

fn recorded(layer_config: BreakerConfig) -> Recorded {
    use tower_llm_breaker::{Circuit, MemoryStore};
    let recorder = Arc::new(Recorder::default());
    let events = recorder.clone();
    let store = Arc::new(
        MemoryStore::new(10).with_circuits(move |key| Circuit::with_events(key, events.clone())),
    );
    let layer = BreakerLayer::new()
        .with_config(layer_config)
        .expect("valid config")
        .with_store(store.clone());
    let handle = layer.handle();
    (layer, handle, recorder, store)
}

#[tokio::test(start_paused = true)]
async fn a_circuit_reports_what_it_counts_and_asks_before_each_probe() {
    use tower_llm_breaker::CircuitEvent as E;
    let provider = Provider::new(Answer::Ok);
    let config = BreakerConfig {
        consecutive_failures: 2,
        ..BreakerConfig::default()
    };
    let (layer, handle, recorder, _) = recorded(config);
    let svc: Svc = BoxCloneService::new(layer.layer(provider.service()));
    svc.clone().oneshot(req()).await.expect("ok");
    provider.set(Answer::Status(400));
    let _ = svc.clone().oneshot(req()).await; // neutral: not reported
    provider.set(Answer::Status(503));
    for _ in 0..2 {
        let _ = svc.clone().oneshot(req()).await;
    }
    assert_eq!(
        *recorder.events.lock().expect("lock"),
        vec![
            (E::Success, None),
            (E::Failure, None),
            (E::Failure, Some(CircuitState::Open)),
        ]
    );

    // Half-open without a permit: refused as open, the provider untouched.
    tokio::time::advance(Duration::from_secs(30)).await;
    provider.set(Answer::Ok);
    let err = svc.clone().oneshot(req()).await.expect_err("no permit");
    assert!(err.is_circuit_open(), "{err:?}");
    assert_eq!(provider.calls(), 4);
    assert_eq!(state(&handle, &key()), CircuitState::HalfOpen);

    // With one: the probe goes out and closes the circuit.
    recorder.permits.store(1, Ordering::SeqCst);
    svc.clone().oneshot(req()).await.expect("probe");
    assert_eq!(provider.calls(), 5);
    assert_eq!(state(&handle, &key()), CircuitState::Closed);

    handle.isolate(&key());
    handle.close(&key());
    handle.close(&key()); // already closed: still a reset, still reported
    let events = recorder.events.lock().expect("lock");
    assert_eq!(
        events[3..],
        [
            (E::ProbeSucceeded, Some(CircuitState::Closed)),
            (E::Isolated, Some(CircuitState::Isolated)),
            (E::ClosedByHand, Some(CircuitState::Closed)),
            (E::ClosedByHand, None),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn adopted_states_change_the_circuit_without_being_reported() {
    use tower_llm_breaker::TransitionReason as R;
    let provider = Provider::new(Answer::Ok);
    use tower_llm_breaker::BreakerStore;
    let (layer, handle, recorder, store) = recorded(BreakerConfig::default());
    let svc: Svc = BoxCloneService::new(layer.layer(provider.service()));
    svc.clone().oneshot(req()).await.expect("ok");
    recorder.events.lock().expect("lock").clear();
    let circuit = store.find(&key()).expect("circuit");

    let t = circuit
        .adopt_open(Duration::from_secs(3), 2, R::ConsecutiveFailures)
        .expect("opens");
    assert_eq!(
        (t.from, t.to, t.open_for),
        (
            CircuitState::Closed,
            CircuitState::Open,
            Some(Duration::from_secs(3))
        )
    );
    // Only ever extended: a shorter open changes nothing.
    assert!(
        circuit
            .adopt_open(Duration::from_secs(1), 2, R::ConsecutiveFailures)
            .is_none()
    );
    let snap = handle.get(&key()).expect("circuit");
    assert_eq!(
        (snap.retry_after, snap.reopens),
        (Some(Duration::from_secs(3)), 2)
    );
    let err = svc.clone().oneshot(req()).await.expect_err("open");
    assert!(err.is_circuit_open());
    assert_eq!(provider.calls(), 1);

    assert_eq!(
        circuit.adopt_isolated().map(|t| t.to),
        Some(CircuitState::Isolated)
    );
    // An isolated circuit ignores opens from elsewhere.
    assert!(
        circuit
            .adopt_open(Duration::from_secs(9), 0, R::ConsecutiveFailures)
            .is_none()
    );
    assert_eq!(
        circuit.adopt_closed(R::ClosedByHand).map(|t| t.to),
        Some(CircuitState::Closed)
    );
    assert!(circuit.adopt_closed(R::ProbesSucceeded).is_none());
    svc.clone().oneshot(req()).await.expect("closed again");
    assert_eq!(
        *recorder.events.lock().expect("lock"),
        vec![(tower_llm_breaker::CircuitEvent::Success, None)],
        "adoptions are not reported"
    );
}
