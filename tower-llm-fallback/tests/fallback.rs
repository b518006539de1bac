//! The fallback layer composed with deadline, retry and breaker over
//! scripted providers, under virtual time.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use tower::{Layer, ServiceBuilder, ServiceExt, service_fn};
use tower_llm_breaker::{BreakerKey, BreakerLayer};
use tower_llm_core::{
    AttemptOutcome, AttemptStatus, ChatRequest, ChatResponse, Deadline, Failure, FailureClass,
    NextStep, NotReplayable, Usage,
};
use tower_llm_deadline::DeadlineLayer;
use tower_llm_fallback::{FallbackLayer, LinkSpec};

mod common;
use common::*;

fn statuses(attempts: &[tower_llm_core::AttemptRecord]) -> Vec<(String, AttemptStatus)> {
    attempts
        .iter()
        .map(|a| (a.provider.to_string(), a.status()))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn seed_ac3_three_503s_fail_over_to_the_next_link() {
    let bedrock = Provider::new("bedrock", &[now(503)]);
    let anthropic = Provider::new("anthropic", &[now(200)]);
    let (svc, _) = chain(Duration::from_secs(30), &bedrock, &[&anthropic]);
    let start = Instant::now();
    let res = svc.oneshot(req()).await.expect("served by the fallback");
    assert_eq!(res.provider.as_ref(), "anthropic");
    assert_eq!(res.model, "anthropic-model");
    assert_eq!(res.fallback_position, 1);
    assert_eq!(bedrock.calls(), 3);
    assert_eq!(anthropic.calls(), 1);
    // 200 ms + 800 ms of backoff on the primary, no sleep between links.
    assert_eq!(
        anthropic.call_times()[0] - start,
        Duration::from_millis(1000)
    );
    use AttemptStatus::*;
    let s = |p: &str, st| (p.to_string(), st);
    assert_eq!(
        statuses(&res.attempts),
        [
            s("bedrock", RetriedAfter5xx),
            s("bedrock", RetriedAfter5xx),
            s("bedrock", FailedOver),
            s("anthropic", Succeeded),
        ]
    );
    assert_eq!(res.attempts[3].fallback_position, 1);
}

#[tokio::test(start_paused = true)]
async fn seed_ac4_5_6_terminal_errors_never_fail_over() {
    for (status, class) in [
        (400, FailureClass::BadRequest),
        (401, FailureClass::Auth),
        (403, FailureClass::Auth),
        (404, FailureClass::NotFound),
    ] {
        let primary = Provider::new("bedrock", &[now(status)]);
        let backup = Provider::new("anthropic", &[now(200)]);
        let (svc, _) = chain(Duration::from_secs(30), &primary, &[&backup]);
        let err = svc.oneshot(req()).await.expect_err("terminal");
        assert_eq!(err.class(), class, "status {status}");
        assert_eq!(err.http_status().map(|s| s.as_u16()), Some(status));
        assert!(!err.is_all_links_failed());
        assert_eq!(primary.calls(), 1);
        assert_eq!(backup.calls(), 0, "status {status} must not fail over");
    }
}

#[tokio::test(start_paused = true)]
async fn seed_ac7_the_whole_chain_spends_one_deadline() {
    let slow_503 = Step {
        delay: Duration::from_secs(8),
        status: 503,
        retry_after: None,
    };
    let providers: Vec<_> = ["bedrock", "anthropic", "openai", "azure"]
        .into_iter()
        .map(|n| Provider::new(n, &[slow_503]))
        .collect();
    let alternates: Vec<&Provider> = providers[1..].iter().collect();
    let (svc, _) = chain(Duration::from_secs(30), &providers[0], &alternates);
    let start = Instant::now();
    let err = svc.oneshot(req()).await.expect_err("out of time");
    assert!(start.elapsed() <= Duration::from_secs(31));
    assert!(err.is_deadline_exceeded(), "{err:?}");
    let deadline = start + Duration::from_secs(30);
    for p in &providers {
        for t in p.call_times() {
            assert!(
                t < deadline,
                "{} started an attempt at {:?}",
                p.name,
                t - start
            );
        }
    }
    // Primary: 3 attempts (0 s, 8.2 s, 17 s); anthropic starts at 25 s and
    // is cut by the deadline; nothing else starts.
    assert_eq!(providers[0].calls(), 3);
    assert_eq!(providers[1].calls(), 1);
    assert_eq!(providers[2].calls() + providers[3].calls(), 0);
    let last = err.attempts().last().expect("records").status();
    assert_eq!(last, AttemptStatus::DeadlineExceededMidCall);
}

#[tokio::test(start_paused = true)]
async fn seed_ac12b_a_long_retry_after_fails_over_at_once() {
    let primary = Provider::new(
        "bedrock",
        &[Step {
            delay: Duration::ZERO,
            status: 429,
            retry_after: Some(60),
        }],
    );
    let backup = Provider::new("anthropic", &[now(200)]);
    let (svc, _) = chain(Duration::from_secs(10), &primary, &[&backup]);
    let start = Instant::now();
    let res = svc.oneshot(req()).await.expect("fallback serves");
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(res.provider.as_ref(), "anthropic");
    assert_eq!(primary.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn seed_ac13_the_attempt_cap_stops_a_long_chain_at_16() {
    let names = ["p0", "p1", "p2", "p3", "p4", "p5"];
    let providers: Vec<_> = names
        .iter()
        .map(|n| Provider::new(n, &[now(503)]))
        .collect();
    let alternates: Vec<&Provider> = providers[1..].iter().collect();
    let (svc, _) = chain(Duration::from_secs(120), &providers[0], &alternates);
    let err = svc.oneshot(req()).await.expect_err("capped");
    let total: usize = providers.iter().map(Provider::calls).sum();
    assert_eq!(total, 16, "no 17th attempt");
    assert!(err.to_string().contains("attempts cap exceeded"), "{err}");
    assert!(err.is_invalid_response());
    assert_eq!(err.attempts().len(), 16);
}

#[tokio::test(start_paused = true)]
async fn an_open_primary_circuit_fails_over_with_no_sleep() {
    let primary = Provider::new("bedrock", &[now(200)]);
    let backup = Provider::new("anthropic", &[now(200)]);
    let (svc, breaker) = chain(Duration::from_secs(30), &primary, &[&backup]);
    breaker
        .handle()
        .isolate(&BreakerKey::new("bedrock", "bedrock-model"));
    let start = Instant::now();
    let res = svc.oneshot(req()).await.expect("fallback serves");
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(primary.calls(), 0);
    assert_eq!(res.provider.as_ref(), "anthropic");
    assert_eq!(
        res.attempts[0].outcome,
        AttemptOutcome::Failed(FailureClass::CircuitOpen)
    );
    assert_eq!(res.attempts[0].next, NextStep::FailedOver);
}

#[derive(Clone)]
struct Region(&'static str);

#[tokio::test(start_paused = true)]
async fn a_request_bound_to_the_eu_never_reaches_a_us_link() {
    let us = Provider::new("us-provider", &[now(200)]);
    let eu = Provider::new("eu-provider", &[now(200)]);
    let eu_only = |region: &'static str| {
        move |req: &ChatRequest| req.extensions.get::<Region>().is_none_or(|r| r.0 == region)
    };
    let layer =
        FallbackLayer::builder(LinkSpec::new("us-provider", "m").with_admission(eu_only("us")))
            .or(
                LinkSpec::new("eu-provider", "m").with_admission(eu_only("eu")),
                eu.service(),
            )
            .build()
            .expect("chain");
    let svc = layer.layer(us.service());

    let mut r = req();
    r.extensions.insert(Region("eu"));
    let res = svc.clone().oneshot(r).await.expect("eu serves");
    assert_eq!(res.provider.as_ref(), "eu-provider");
    assert_eq!(us.calls(), 0);
    assert_eq!(res.attempts.len(), 1);
    assert_eq!(res.attempts[0].status(), AttemptStatus::SkippedByPolicy);
    assert_eq!(&*res.attempts[0].provider, "us-provider");

    // A US request uses the primary as usual.
    let mut r = req();
    r.extensions.insert(Region("us"));
    svc.oneshot(r).await.expect("us serves");
    assert_eq!(us.calls(), 1);
    assert_eq!(eu.calls(), 1);

    // A forbidden alternate is skipped too, even when the primary fails.
    let eu_down = Provider::new("eu-provider", &[now(503)]);
    let us = Provider::new("us-provider", &[now(200)]);
    let layer =
        FallbackLayer::builder(LinkSpec::new("eu-provider", "m").with_admission(eu_only("eu")))
            .or(
                LinkSpec::new("us-provider", "m").with_admission(eu_only("us")),
                us.service(),
            )
            .build()
            .expect("chain");
    let mut r = req();
    r.extensions.insert(Region("eu"));
    let err = layer
        .layer(eu_down.service())
        .oneshot(r)
        .await
        .expect_err("nowhere to go");
    assert!(err.is_all_links_failed());
    assert_eq!(us.calls(), 0);
    let last = err.attempts().last().expect("records");
    assert_eq!(
        (&*last.provider, last.status()),
        ("us-provider", AttemptStatus::SkippedByPolicy)
    );
}

#[tokio::test(start_paused = true)]
async fn seed_ac9_concurrent_calls_with_different_chains_keep_their_own_logs() {
    let mut tasks = tokio::task::JoinSet::new();
    let names: Vec<&'static str> = (0..200)
        .map(|i| &*Box::leak(format!("p{i}").into_boxed_str()))
        .collect();
    for i in 0..100 {
        let (a, b) = (names[2 * i], names[2 * i + 1]);
        let primary = Provider::new(a, &[now(if i % 2 == 1 { 503 } else { 200 })]);
        let backup = Provider::new(b, &[now(200)]);
        let (svc, _) = chain(Duration::from_secs(30), &primary, &[&backup]);
        tasks.spawn(async move { (i, a, b, svc.oneshot(req()).await) });
    }
    while let Some(done) = tasks.join_next().await {
        let (i, a, b, res) = done.expect("task");
        let res = res.expect("served");
        for record in &res.attempts {
            assert!(&*record.provider == a || &*record.provider == b, "call {i}");
        }
        let expected = if i % 2 == 1 { 4 } else { 1 };
        assert_eq!(res.attempts.len(), expected, "call {i}");
    }
}

#[tokio::test(start_paused = true)]
async fn when_every_link_waits_the_earliest_retry_after_comes_back() {
    let limited = |s| Step {
        delay: Duration::ZERO,
        status: 429,
        retry_after: Some(s),
    };
    let a = Provider::new("a", &[limited(90)]);
    let b = Provider::new("b", &[limited(75)]);
    let (svc, _) = chain(Duration::from_secs(30), &a, &[&b]);
    let err = svc.oneshot(req()).await.expect_err("all wait");
    assert!(err.is_all_links_failed());
    assert!(err.is_rate_limited());
    assert_eq!(err.retry_after(), Some(Duration::from_secs(75)));
    assert!(err.to_string().starts_with("all links failed"), "{err}");

    // One link that simply broke: no promise of when to come back.
    let a = Provider::new("a", &[limited(90)]);
    let b = Provider::new("b", &[now(503)]);
    let (svc, _) = chain(Duration::from_secs(30), &a, &[&b]);
    let err = svc.oneshot(req()).await.expect_err("all fail");
    assert!(err.is_all_links_failed());
    assert_eq!(err.retry_after(), None);
}

#[tokio::test(start_paused = true)]
async fn context_window_fails_over_only_to_a_long_context_link() {
    let small = Provider::new("small", &[now(413)]);
    let other = Provider::new("other", &[now(200)]);
    let long = Provider::new("long", &[now(200)]);
    let layer = FallbackLayer::builder(LinkSpec::new("small", "m"))
        .or(LinkSpec::new("other", "m"), other.service())
        .or(
            LinkSpec::new("long", "m").serves_long_context(),
            long.service(),
        )
        .build()
        .expect("chain");
    let res = layer
        .layer(small.service())
        .oneshot(req())
        .await
        .expect("long serves");
    assert_eq!(res.provider.as_ref(), "long");
    assert_eq!(other.calls(), 0);
    assert_eq!(res.fallback_position, 2);
}

#[tokio::test(start_paused = true)]
async fn a_request_that_cannot_be_replayed_stays_on_its_link() {
    let primary = Provider::new("a", &[now(503)]);
    let backup = Provider::new("b", &[now(200)]);
    let layer = FallbackLayer::builder(LinkSpec::new("a", "m"))
        .or(LinkSpec::new("b", "m"), backup.service())
        .build()
        .expect("chain");
    let mut r = req();
    r.extensions.insert(NotReplayable);
    let err = layer
        .layer(primary.service())
        .oneshot(r)
        .await
        .expect_err("no failover");
    assert!(err.is_transient());
    assert_eq!(backup.calls(), 0);
}

#[tokio::test(start_paused = true)]
async fn http_503_answers_fail_over_with_the_http_classifier() {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let primary = service_fn(|_r: http::Request<()>| async {
        Ok::<_, Failure>(
            http::Response::builder()
                .status(503)
                .body(())
                .expect("response"),
        )
    });
    let backup = service_fn(move |_r: http::Request<()>| {
        c.fetch_add(1, Ordering::SeqCst);
        async { Ok::<_, Failure>(http::Response::new(())) }
    });
    let layer = FallbackLayer::builder(LinkSpec::new("a", "m"))
        .or(LinkSpec::new("b", "m"), backup)
        .with_classifier(tower_llm_core::HttpClassifier)
        .build()
        .expect("chain");
    let res = layer
        .layer(primary)
        .oneshot(http::Request::new(()))
        .await
        .expect("answer");
    assert_eq!(res.status(), 200);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let served = res
        .extensions()
        .get::<tower_llm_core::ServedBy>()
        .expect("served by");
    assert_eq!(served.0.provider(), "b");
    assert_eq!(served.0.position(), 1);
}

#[test]
fn duplicate_links_are_refused() {
    let backup = Provider::new("b", &[now(200)]);
    let err = FallbackLayer::builder(LinkSpec::<ChatRequest>::new("a", "m"))
        .or(LinkSpec::new("a", "m"), backup.service())
        .build()
        .expect_err("duplicate");
    assert_eq!(
        err.to_string(),
        "invalid fallback chain: duplicate link a/m"
    );
}

fn ok_answer(provider: &str) -> ChatResponse {
    ChatResponse {
        id: "degraded".into(),
        model: String::new(),
        provider: provider.into(),
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

#[tokio::test(start_paused = true)]
async fn health_ordering_tries_the_healthiest_alternate_first() {
    for ordered in [false, true] {
        let primary = Provider::new("p", &[now(503)]);
        let sick = Provider::new("sick", &[now(503)]);
        let well = Provider::new("well", &[now(200)]);
        let mut builder = FallbackLayer::builder(LinkSpec::new("p", "m"))
            .or(LinkSpec::new("sick", "m"), sick.service())
            .or(LinkSpec::new("well", "m"), well.service());
        if ordered {
            builder = builder.with_health_ordering(Duration::from_secs(60));
        }
        let svc = builder.build().expect("chain").layer(primary.service());
        for _ in 0..3 {
            let res = svc.clone().oneshot(req()).await.expect("well serves");
            assert_eq!(res.provider.as_ref(), "well");
        }
        // With no data both alternates score neutral, so the first call
        // keeps the configured order; after it, "sick" is tried last.
        let expected = if ordered { 1 } else { 3 };
        assert_eq!(sick.calls(), expected, "ordered: {ordered}");
        assert_eq!(well.calls(), 3);
    }
}

#[tokio::test(start_paused = true)]
async fn a_degraded_step_answers_when_every_link_failed() {
    let a = Provider::new("a", &[now(503)]);
    let b = Provider::new("b", &[now(502)]);
    let layer = FallbackLayer::builder(LinkSpec::new("a", "m"))
        .or(LinkSpec::new("b", "m"), b.service())
        .with_degraded(|last: &Failure| {
            assert!(last.is_all_links_failed());
            ok_answer("cache")
        })
        .build()
        .expect("chain");
    let res = layer
        .layer(a.service())
        .oneshot(req())
        .await
        .expect("degraded answer");
    assert!(res.degraded);
    assert_eq!(res.provider.as_ref(), "cache");

    // Terminal failures are not papered over.
    let a = Provider::new("a", &[now(401)]);
    let layer = FallbackLayer::builder(LinkSpec::new("a", "m"))
        .or(LinkSpec::new("b", "m"), b.service())
        .with_degraded(|_: &Failure| ok_answer("cache"))
        .build()
        .expect("chain");
    let err = layer
        .layer(a.service())
        .oneshot(req())
        .await
        .expect_err("auth");
    assert!(err.is_auth());
}

#[tokio::test(start_paused = true)]
async fn a_one_shot_request_whose_primary_is_skipped_goes_to_one_link_only() {
    let primary = Provider::new("a", &[now(200)]);
    let b = Provider::new("b", &[now(503)]);
    let c = Provider::new("c", &[now(200)]);
    let layer =
        FallbackLayer::builder(LinkSpec::new("a", "m").with_admission(|_: &ChatRequest| false))
            .or(LinkSpec::new("b", "m"), b.service())
            .or(LinkSpec::new("c", "m"), c.service())
            .build()
            .expect("chain");
    let mut r = req();
    r.extensions.insert(NotReplayable);
    let err = layer
        .layer(primary.service())
        .oneshot(r)
        .await
        .expect_err("b failed");
    assert!(err.is_transient());
    assert_eq!((primary.calls(), b.calls(), c.calls()), (0, 1, 0));
}

#[tokio::test(start_paused = true)]
async fn failed_over_marks_the_link_left_even_across_a_skipped_link() {
    let breaker = BreakerLayer::new();
    let a = Provider::new("a", &[now(503)]);
    let b = Provider::new("b", &[now(200)]);
    let c = Provider::new("c", &[now(200)]);
    let layer = FallbackLayer::builder(LinkSpec::new("a", "m"))
        .or(
            LinkSpec::new("b", "m").with_admission(|_: &ChatRequest| false),
            b.link(&breaker),
        )
        .or(LinkSpec::new("c", "m"), c.link(&breaker))
        .build()
        .expect("chain");
    let res = ServiceBuilder::new()
        .layer(DeadlineLayer::new(Duration::from_secs(30)))
        .layer(layer)
        .service(a.link(&breaker))
        .oneshot(req())
        .await
        .expect("c serves");
    use AttemptStatus::*;
    let s = |p: &str, st| (p.to_string(), st);
    assert_eq!(
        statuses(&res.attempts),
        [
            s("a", RetriedAfter5xx),
            s("a", RetriedAfter5xx),
            s("a", FailedOver),
            s("b", SkippedByPolicy),
            s("c", Succeeded),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn the_degraded_step_also_answers_for_failing_http_links() {
    let failing = |status: u16| {
        service_fn(move |_r: http::Request<()>| async move {
            Ok::<_, Failure>(
                http::Response::builder()
                    .status(status)
                    .body(())
                    .expect("response"),
            )
        })
    };
    let layer = FallbackLayer::builder(LinkSpec::new("a", "m"))
        .or(LinkSpec::new("b", "m"), failing(502))
        .with_classifier(tower_llm_core::HttpClassifier)
        .with_degraded(|last: &Failure| {
            assert!(last.is_all_links_failed());
            assert_eq!(last.http_status().map(|s| s.as_u16()), Some(502));
            http::Response::new(())
        })
        .build()
        .expect("chain");
    let res = layer
        .layer(failing(503))
        .oneshot(http::Request::new(()))
        .await
        .expect("degraded");
    assert_eq!(res.status(), 200);
    assert!(res.extensions().get::<tower_llm_core::Degraded>().is_some());
}

#[tokio::test(start_paused = true)]
async fn a_context_window_failure_with_no_long_context_link_stays_terminal() {
    let small = Provider::new("small", &[now(413)]);
    let other = Provider::new("other", &[now(200)]);
    let layer = FallbackLayer::builder(LinkSpec::new("small", "m"))
        .or(LinkSpec::new("other", "m"), other.service())
        .with_degraded(|_: &Failure| ok_answer("cache"))
        .build()
        .expect("chain");
    let err = layer
        .layer(small.service())
        .oneshot(req())
        .await
        .expect_err("terminal");
    assert!(err.is_context_window_exceeded());
    assert!(!err.is_all_links_failed());
    assert_eq!(other.calls(), 0);
}

/// An admission rule sees what the link would see: the call's deadline
/// (set by the deadline layer outside), on a request that arrived with no
/// extensions of its own.
#[tokio::test(start_paused = true)]
async fn an_admission_rule_sees_the_calls_deadline() {
    let primary = Provider::new("primary", &[now(503)]);
    let slow = Provider::new("slow", &[now(200)]);
    let fast = Provider::new("fast", &[now(200)]);
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let rule = {
        let seen = seen.clone();
        move |req: &ChatRequest| {
            let left = Deadline::remaining_in(req);
            seen.lock().expect("lock").push(left);
            // A slow link only with more than 20 s to go.
            left.is_some_and(|d| d > Duration::from_secs(20))
        }
    };
    let chain = FallbackLayer::builder(LinkSpec::new("primary", "m"))
        .or(
            LinkSpec::new("slow", "m").with_admission(rule),
            slow.service(),
        )
        .or(LinkSpec::new("fast", "m"), fast.service())
        .build()
        .expect("chain");
    let svc = ServiceBuilder::new()
        .layer(DeadlineLayer::new(Duration::from_secs(10)))
        .layer(chain)
        .service(primary.service());
    let res = svc.oneshot(req()).await.expect("fast serves");
    assert_eq!(res.provider.as_ref(), "fast");
    assert_eq!(slow.calls(), 0);
    assert_eq!(
        *seen.lock().expect("lock"),
        vec![Some(Duration::from_secs(10))]
    );
    let skipped: Vec<_> = res
        .attempts
        .iter()
        .filter(|a| a.status() == AttemptStatus::SkippedByPolicy)
        .map(|a| &*a.provider)
        .collect();
    assert_eq!(skipped, ["slow"]);
}
