//! The retry, failover and breaker rules held across the layers: each
//! test names the rule it holds the stack to.

use std::time::Duration;

use tower::{ServiceBuilder, ServiceExt};
use tower_llm::breaker::{BreakerConfig, BreakerCount, CircuitState};
use tower_llm::prelude::*;
use tower_llm::retry::FixedFraction;
use tower_llm::{AttemptOutcome, AttemptRecord, AttemptStatus, FailureClass, Link, NextStep};
use tower_llm_providers::mock::{Reply, ScriptedTransport};

fn req() -> ChatRequest {
    ChatRequest::new("gpt-4o-mini", vec![Message::user("hi")])
}

/// Seed 004: a 409 conflict needs a re-read, not the same request: it is
/// tried once, it does not trip the breaker (a threshold of 1 would open
/// on any tripping failure) and it does not fail over.
#[tokio::test(start_paused = true)]
async fn seed_004_a_409_is_not_retried_does_not_trip_and_does_not_fail_over() {
    let primary = ScriptedTransport::new(Reply::openai_error(
        409,
        "invalid_request_error",
        "conflict",
    ));
    let backup = ScriptedTransport::new(Reply::openai_text("backup"));
    let breaker = BreakerLayer::new()
        .with_config(BreakerConfig {
            consecutive_failures: 1,
            ..BreakerConfig::default()
        })
        .expect("config");
    let handle = breaker.handle();
    let link = |svc| {
        ServiceBuilder::new()
            .llm_retry(RetryLayer::new().with_rng(FixedFraction(0.5)))
            .llm_breaker(breaker.clone())
            .service(svc)
    };
    let chain = FallbackLayer::builder(LinkSpec::new("openai", "gpt-4o-mini"))
        .or(LinkSpec::new("backup", "gpt-4o"), link(backup.openai()))
        .build()
        .expect("chain");
    let svc = ServiceBuilder::new()
        .llm_deadline(Duration::from_secs(30))
        .llm_fallback(chain)
        .service(link(primary.openai()));

    for _ in 0..3 {
        let err = svc.clone().oneshot(req()).await.expect_err("conflict");
        assert!(err.is_conflict(), "{err:?}");
        assert_eq!(err.http_status().map(|s| s.as_u16()), Some(409));
        assert_eq!(err.attempts().len(), 1);
        assert_eq!(
            err.attempts()[0].outcome,
            AttemptOutcome::Failed(FailureClass::Conflict)
        );
    }
    assert_eq!(primary.received().len(), 3, "one attempt per call");
    assert_eq!(backup.received().len(), 0, "never failed over");
    let circuits = handle.snapshot();
    assert!(
        circuits
            .iter()
            .all(|c| c.state == CircuitState::Closed && c.consecutive_failures == 0),
        "{circuits:?}"
    );
}

/// Seed 002 AC 1 and AC 10: a typed chat call that succeeds records
/// `http_status == Some(200)`, like a raw HTTP call.
#[tokio::test(start_paused = true)]
async fn seed_ac1_a_typed_success_records_http_200() {
    let t = ScriptedTransport::new(Reply::openai_text("hello"));
    let svc = ServiceBuilder::new()
        .llm_deadline(Duration::from_secs(30))
        .llm_retry(RetryLayer::new().with_link(Link::new("openai", "gpt-4o-mini")))
        .service(t.openai());
    let res = svc.oneshot(req()).await.expect("answer");
    assert_eq!(res.attempts.len(), 1);
    assert_eq!(res.attempts[0].status(), AttemptStatus::Succeeded);
    assert_eq!(res.attempts[0].http_status, Some(200));
}

/// Every field of a record, checked at once.
fn assert_record(
    r: &AttemptRecord,
    (provider, model, attempt, position): (&str, &str, u8, u8),
    outcome: AttemptOutcome,
    next: NextStep,
    http_status: Option<u16>,
) {
    assert_eq!(&*r.provider, provider, "{r:?}");
    assert_eq!(&*r.model, model, "{r:?}");
    assert_eq!(r.attempt, attempt, "{r:?}");
    assert_eq!(r.fallback_position, position, "{r:?}");
    assert_eq!(r.outcome, outcome, "{r:?}");
    assert_eq!(r.next, next, "{r:?}");
    assert_eq!(r.http_status, http_status, "{r:?}");
}

/// Seed 002 AC 10: every record is complete whether or not a retry layer
/// is in the stack. Deadline → breaker: the breaker writes the record of
/// each attempt itself (success, provider failure, its own refusal).
#[tokio::test(start_paused = true)]
async fn seed_ac10_a_deadline_and_breaker_stack_records_every_attempt() {
    let t = ScriptedTransport::new(Reply::openai_text("hello"));
    let breaker = BreakerLayer::new()
        .with_link(Link::new("openai", "gpt-4o-mini"))
        .with_config(BreakerConfig {
            consecutive_failures: 1,
            ..BreakerConfig::default()
        })
        .expect("config");
    let svc = ServiceBuilder::new()
        .llm_deadline(Duration::from_secs(30))
        .llm_breaker(breaker)
        .service(t.openai());
    let link = ("openai", "gpt-4o-mini", 1, 0);

    let res = svc.clone().oneshot(req()).await.expect("answer");
    assert_eq!(res.attempts.len(), 1);
    assert_record(
        &res.attempts[0],
        link,
        AttemptOutcome::Succeeded,
        NextStep::Returned,
        Some(200),
    );

    t.push(Reply::openai_error(503, "server_error", "overloaded").after(Duration::from_millis(40)));
    let err = svc.clone().oneshot(req()).await.expect_err("503");
    assert_eq!(err.attempts().len(), 1);
    assert_record(
        &err.attempts()[0],
        link,
        AttemptOutcome::Failed(FailureClass::Transient),
        NextStep::Returned,
        Some(503),
    );
    assert_eq!(err.attempts()[0].elapsed, Duration::from_millis(40));
    assert_eq!(err.provider(), Some("openai"));

    // The circuit is open now: the refusal is an attempt record too.
    let err = svc.clone().oneshot(req()).await.expect_err("open");
    assert!(err.is_circuit_open());
    assert_eq!(err.attempts().len(), 1);
    assert_record(
        &err.attempts()[0],
        link,
        AttemptOutcome::Failed(FailureClass::CircuitOpen),
        NextStep::Returned,
        None,
    );
    assert_eq!(t.received().len(), 2);
}

/// Deadline → fallback → breaker (no retry layer): one record per link
/// tried, the first marked failed over.
#[tokio::test(start_paused = true)]
async fn seed_ac10_a_fallback_without_retry_records_each_link() {
    let primary = ScriptedTransport::new(Reply::openai_error(503, "server_error", "overloaded"));
    let backup = ScriptedTransport::new(Reply::openai_text("backup"));
    let breaker = BreakerLayer::new();
    let chain = FallbackLayer::builder(LinkSpec::new("openai", "gpt-4o-mini"))
        .or(
            LinkSpec::new("backup", "gpt-4o"),
            ServiceBuilder::new()
                .llm_breaker(breaker.clone())
                .service(backup.openai()),
        )
        .build()
        .expect("chain");
    let svc = ServiceBuilder::new()
        .llm_deadline(Duration::from_secs(30))
        .llm_fallback(chain)
        .llm_breaker(breaker)
        .service(primary.openai());
    let res = svc.oneshot(req()).await.expect("served by the backup");
    assert_eq!(res.attempts.len(), 2);
    assert_record(
        &res.attempts[0],
        ("openai", "gpt-4o-mini", 1, 0),
        AttemptOutcome::Failed(FailureClass::Transient),
        NextStep::FailedOver,
        Some(503),
    );
    assert_record(
        &res.attempts[1],
        ("backup", "gpt-4o", 1, 1),
        AttemptOutcome::Succeeded,
        NextStep::Returned,
        Some(200),
    );
}

/// deadline → retry (3 attempts) → breaker (threshold 5) → `transport`.
fn counted_stack(
    transport: &ScriptedTransport,
    breaker: BreakerLayer,
    attempt_timeout: Duration,
) -> impl tower::Service<
    ChatRequest,
    Response = ChatResponse,
    Error = Failure,
    Future = impl Future<Output = Result<ChatResponse, Failure>>,
> + Clone {
    ServiceBuilder::new()
        .llm_deadline(Duration::from_secs(30))
        .llm_retry(
            RetryLayer::new()
                .with_rng(FixedFraction(0.5))
                .with_attempt_timeout(attempt_timeout)
                .with_link(Link::new("openai", "gpt-4o-mini")),
        )
        .llm_breaker(breaker)
        .service(transport.openai())
}

fn threshold(n: u32) -> BreakerConfig {
    BreakerConfig {
        consecutive_failures: n,
        ..BreakerConfig::default()
    }
}

/// The breaker sits inside retry, so by default it counts attempts: with 3
/// attempts per call, a threshold of 5 opens during the 2nd failed call
/// (as the breaker docs say).
#[tokio::test(start_paused = true)]
async fn seed_001_the_breaker_counts_attempts_by_default_two_calls_open_it() {
    let t = ScriptedTransport::new(Reply::openai_error(503, "server_error", "down"));
    let breaker = BreakerLayer::new()
        .with_config(threshold(5))
        .expect("config");
    let handle = breaker.handle();
    let svc = counted_stack(&t, breaker, Duration::from_secs(30));
    let err = svc.clone().oneshot(req()).await.expect_err("503");
    assert!(err.is_transient());
    assert_eq!(t.received().len(), 3);
    assert_eq!(handle.snapshot()[0].state, CircuitState::Closed);
    let err = svc.clone().oneshot(req()).await.expect_err("opened");
    // Attempts 4 and 5 failed, the 3rd attempt of call 2 was refused.
    assert!(err.is_circuit_open(), "{err:?}");
    assert_eq!(t.received().len(), 5);
    assert_eq!(handle.snapshot()[0].state, CircuitState::Open);
}

/// `count = "calls"`: one outcome per logical call per link, so the same
/// threshold of 5 opens during the 5th failed call (on its first attempt,
/// after 4 × 3 + 1 = 13 attempts).
#[tokio::test(start_paused = true)]
async fn seed_000_counting_calls_opens_on_the_fifth_failed_call() {
    let t = ScriptedTransport::new(Reply::openai_error(503, "server_error", "down"));
    let breaker = BreakerLayer::new()
        .with_config(threshold(5))
        .expect("config")
        .with_count(BreakerCount::Calls);
    let handle = breaker.handle();
    let svc = counted_stack(&t, breaker, Duration::from_secs(30));
    for call in 1..=4u32 {
        let err = svc.clone().oneshot(req()).await.expect_err("503");
        assert!(err.is_transient(), "call {call}: {err:?}");
        assert_eq!(err.attempts().len(), 3);
        let c = &handle.snapshot()[0];
        assert_eq!(
            (c.state, c.consecutive_failures),
            (CircuitState::Closed, call)
        );
    }
    assert_eq!(t.received().len(), 12);
    let err = svc.clone().oneshot(req()).await.expect_err("opened");
    assert!(err.is_circuit_open(), "{err:?}");
    assert_eq!(t.received().len(), 13);
    assert_eq!(handle.snapshot()[0].state, CircuitState::Open);
}

/// Counting calls, a call that recovers on its 2nd attempt counts its
/// first failure and its success (which resets the count), and the
/// setting loads from a config file.
#[tokio::test(start_paused = true)]
async fn counting_calls_a_recovered_call_is_a_success_and_the_option_loads() {
    let cfg: BreakerConfig =
        serde_json::from_str(r#"{"consecutive_failures": 3, "count": "calls"}"#).expect("cfg");
    assert_eq!(cfg.count, BreakerCount::Calls);
    let t = ScriptedTransport::new(Reply::openai_text("ok"));
    let breaker = BreakerLayer::new().with_config(cfg).expect("config");
    let handle = breaker.handle();
    let svc = counted_stack(&t, breaker, Duration::from_secs(30));
    t.push(Reply::openai_error(503, "server_error", "down"));
    t.push(Reply::openai_error(503, "server_error", "down"));
    t.push(Reply::openai_error(503, "server_error", "down"));
    svc.clone().oneshot(req()).await.expect_err("three 503s");
    assert_eq!(handle.snapshot()[0].consecutive_failures, 1);
    t.push(Reply::openai_error(503, "server_error", "down"));
    let res = svc.clone().oneshot(req()).await.expect("recovered");
    assert_eq!(res.attempts.len(), 2);
    let c = &handle.snapshot()[0];
    assert_eq!((c.state, c.consecutive_failures), (CircuitState::Closed, 0));
}

/// Counting calls, attempts cut by the per-attempt timeout count at most
/// once per call per link.
#[tokio::test(start_paused = true)]
async fn counting_calls_timeouts_count_once_per_call() {
    let hung = Reply::openai_text("late").after(Duration::from_secs(60));
    let t = ScriptedTransport::new(hung);
    let breaker = BreakerLayer::new()
        .with_config(threshold(2))
        .expect("config")
        .with_count(BreakerCount::Calls);
    let handle = breaker.handle();
    let svc = counted_stack(&t, breaker, Duration::from_secs(1));
    let err = svc.clone().oneshot(req()).await.expect_err("timeouts");
    assert!(err.is_timeout(), "{err:?}");
    assert_eq!(t.received().len(), 3);
    let c = &handle.snapshot()[0];
    assert_eq!((c.state, c.consecutive_failures), (CircuitState::Closed, 1));
    svc.clone().oneshot(req()).await.expect_err("timeouts");
    assert_eq!(handle.snapshot()[0].state, CircuitState::Open);
}

/// Counting calls: a held 429 counts nothing, so it must not mute the
/// same call's next failure on the link (the mark is set when a failure
/// is actually counted, not guessed from the log).
#[tokio::test(start_paused = true)]
async fn counting_calls_a_held_429_does_not_mute_the_next_failure() {
    let t = ScriptedTransport::new(Reply::openai_error(503, "server_error", "down"));
    t.push(
        Reply::openai_error(429, "rate_limit_exceeded", "slow down")
            .with_header("retry-after", "2"),
    );
    let breaker = BreakerLayer::new()
        .with_config(threshold(1))
        .expect("config")
        .with_count(BreakerCount::Calls);
    let handle = breaker.handle();
    let svc = counted_stack(&t, breaker, Duration::from_secs(5));
    let err = svc.oneshot(req()).await.expect_err("503 after the hold");
    assert!(err.is_circuit_open() || err.is_transient(), "{err:?}");
    // The 429, then the 503 once the hold ended: the 503 counted.
    assert_eq!(t.received().len(), 2);
    assert_eq!(handle.snapshot()[0].state, CircuitState::Open);
}

/// Row 7: OpenAI's content-filter error is a failure (`content_filtered`)
/// that never fails over by default, and fails over, opt-in, only to a
/// link marked `allows_filtered_content()`.
#[tokio::test(start_paused = true)]
async fn row7_a_content_filter_failure_fails_over_only_to_a_link_that_allows_it() {
    let filtered = || {
        ScriptedTransport::new(Reply::openai_error(
            400,
            "content_filter",
            "The response was filtered due to the prompt triggering the content management policy.",
        ))
    };
    let build = |primary: &ScriptedTransport, others: &[(&ScriptedTransport, bool)]| {
        let mut chain = FallbackLayer::builder(LinkSpec::new("azure", "gpt-4o"));
        for (i, (t, allows)) in others.iter().enumerate() {
            let mut spec = LinkSpec::new(format!("alt{i}"), "m");
            if *allows {
                spec = spec.allows_filtered_content();
            }
            chain = chain.or(
                spec,
                ServiceBuilder::new()
                    .llm_retry(RetryLayer::new())
                    .service(t.openai()),
            );
        }
        ServiceBuilder::new()
            .llm_deadline(Duration::from_secs(30))
            .llm_fallback(chain.build().expect("chain"))
            .llm_retry(RetryLayer::new())
            .service(primary.openai())
    };

    // No link allows it: the failure comes back, nothing else is called.
    let (primary, alt) = (
        filtered(),
        ScriptedTransport::new(Reply::openai_text("alt")),
    );
    let err = build(&primary, &[(&alt, false)])
        .oneshot(req())
        .await
        .expect_err("filtered");
    assert!(err.is_content_filtered(), "{err:?}");
    assert_eq!(err.attempts()[0].status(), AttemptStatus::Terminal400);
    assert_eq!((primary.received().len(), alt.received().len()), (1, 0));

    // Opt-in: the next link that allows filtered content serves it.
    let (primary, alt, lenient) = (
        filtered(),
        ScriptedTransport::new(Reply::openai_text("alt")),
        ScriptedTransport::new(Reply::openai_text("lenient")),
    );
    let res = build(&primary, &[(&alt, false), (&lenient, true)])
        .oneshot(req())
        .await
        .expect("served by the lenient link");
    assert_eq!(res.text(), "lenient");
    assert_eq!(
        (
            primary.received().len(),
            alt.received().len(),
            lenient.received().len()
        ),
        (1, 0, 1)
    );
}

/// A deadline + breaker stack whose provider hangs: the breaker's record of
/// the attempt says the deadline ended it.
#[tokio::test(start_paused = true)]
async fn seed_ac10_a_breaker_record_cut_by_the_deadline_says_so() {
    let t = ScriptedTransport::new(Reply::openai_text("late").after(Duration::from_secs(60)));
    let svc = ServiceBuilder::new()
        .llm_deadline(Duration::from_secs(2))
        .llm_breaker(BreakerLayer::new().with_link(Link::new("openai", "gpt-4o-mini")))
        .service(t.openai());
    let err = svc.oneshot(req()).await.expect_err("deadline");
    assert!(err.is_deadline_exceeded());
    assert_eq!(err.attempts().len(), 1);
    assert_record(
        &err.attempts()[0],
        ("openai", "gpt-4o-mini", 1, 0),
        AttemptOutcome::Failed(FailureClass::DeadlineExceeded),
        NextStep::Returned,
        None,
    );
    assert_eq!(err.attempts()[0].elapsed, Duration::from_secs(2));
}
