//! The stale-safe rung: a stored answer past its freshness, served when
//! no provider can answer.

use tower::Layer;

use super::*;

/// Answers the first call, then fails every call with `class`.
fn answers_then_fails(class: FailureClass) -> Provider {
    Provider::scripted(move |n| {
        if n == 0 {
            Reply::Answer
        } else {
            Reply::Fail(class)
        }
    })
}

#[tokio::test(start_paused = true)]
async fn a_failing_provider_gets_the_stale_answer_with_its_exact_age_up_to_ttl_plus_stale() {
    let provider = answers_then_fails(FailureClass::Transient);
    let svc = cache(config(60_000, 60_000)).layer(provider.service());
    call(&svc, ask()).await.expect("answers");
    advance(secs(90)).await;
    let served = call(&svc, ask()).await.expect("stale");
    assert_eq!(seen(&served), ("answer 0", stale(secs(90))));
    assert_eq!(served.text(), "answer 0");
    advance(secs(30)).await;
    let at_edge = call(&svc, ask()).await.expect("stale");
    assert_eq!(seen(&at_edge), ("answer 0", stale(secs(120))));
    advance(ms(1)).await;
    let past = call(&svc, ask()).await.expect_err("too stale");
    assert_eq!(past.class(), FailureClass::Transient);
    assert_eq!(provider.calls(), 4);
}

#[tokio::test(start_paused = true)]
async fn every_outage_class_gets_the_stale_answer() {
    for class in [
        FailureClass::Transient,
        FailureClass::RateLimited,
        FailureClass::QuotaExhausted,
        FailureClass::Timeout,
        FailureClass::CircuitOpen,
        FailureClass::InvalidResponse,
        FailureClass::DeadlineExceeded,
    ] {
        let provider = answers_then_fails(class);
        let svc = cache(config(60_000, 60_000)).layer(provider.service());
        call(&svc, ask()).await.expect("answers");
        advance(secs(61)).await;
        let served = call(&svc, ask()).await.expect("stale");
        assert_eq!(seen(&served), ("answer 0", stale(secs(61))), "{class:?}");
        assert_eq!(provider.calls(), 2, "{class:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_failure_of_the_request_itself_is_returned_as_it_is() {
    for class in [
        FailureClass::BadRequest,
        FailureClass::Auth,
        FailureClass::CostBudgetExhausted,
        FailureClass::ContentFiltered,
    ] {
        let provider = answers_then_fails(class);
        let svc = cache(config(60_000, 60_000)).layer(provider.service());
        call(&svc, ask()).await.expect("answers");
        advance(secs(61)).await;
        let failed = call(&svc, ask()).await.expect_err("no stale answer");
        assert_eq!(failed.class(), class);
        assert_eq!(provider.calls(), 2, "{class:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_degraded_answer_is_replaced_by_the_stale_one() {
    let provider = Provider::scripted(|n| {
        if n == 0 {
            Reply::Answer
        } else {
            Reply::Degraded
        }
    });
    let svc = cache(config(60_000, 60_000)).layer(provider.service());
    call(&svc, ask()).await.expect("answers");
    advance(secs(75)).await;
    let served = call(&svc, ask()).await.expect("stale");
    assert!(!served.degraded);
    assert_eq!(seen(&served), ("answer 0", stale(secs(75))));
    // Past the window the degraded answer itself comes back.
    advance(secs(46)).await;
    let degraded = call(&svc, ask()).await.expect("degraded");
    assert!(degraded.degraded);
    assert_eq!(seen(&degraded), ("degraded 2", MISS));
    assert_eq!(provider.calls(), 3);
}

#[tokio::test(start_paused = true)]
async fn stale_for_risk_admits_only_requests_whose_risk_is_listed_byte_for_byte() {
    let provider = answers_then_fails(FailureClass::Transient);
    let svc = cache(CacheConfig {
        stale_for_risk: Some(vec!["LOW".into()]),
        ..config(60_000, 60_000)
    })
    .layer(provider.service());
    call(&svc, ask()).await.expect("answers");
    advance(secs(90)).await;
    let low = call(&svc, ask_with(&[("x-llm-risk", "LOW")]))
        .await
        .expect("stale");
    assert_eq!(seen(&low), ("answer 0", stale(secs(90))));
    for refused in [
        ask_with(&[("x-llm-risk", "low")]),
        ask_with(&[("x-llm-risk", "MEDIUM")]),
        ask_with(&[("x-llm-risk", "LOW, MEDIUM")]),
        ask_with(&[]),
        ask(),
    ] {
        let failed = call(&svc, refused).await.expect_err("not admitted");
        assert_eq!(failed.class(), FailureClass::Transient);
    }
    assert_eq!(provider.calls(), 7);
}

#[tokio::test(start_paused = true)]
async fn with_no_freshness_nothing_is_a_hit_but_stale_answers_are_served() {
    let provider = Provider::scripted(|n| {
        if n < 2 {
            Reply::Answer
        } else {
            Reply::Fail(FailureClass::Transient)
        }
    });
    let svc = cache(config(0, 60_000)).layer(provider.service());
    let first = call(&svc, ask()).await.expect("answers");
    assert_eq!(seen(&first), ("answer 0", MISS));
    let second = call(&svc, ask()).await.expect("answers");
    assert_eq!(seen(&second), ("answer 1", MISS));
    advance(secs(30)).await;
    let served = call(&svc, ask()).await.expect("stale");
    assert_eq!(seen(&served), ("answer 1", stale(secs(30))));
    assert_eq!(provider.calls(), 3);
}

#[tokio::test(start_paused = true)]
async fn the_stale_limit_holds_when_the_answer_is_served_not_only_when_found() {
    // Found 119 s old (limit 120 s), served after a 20 s failing call:
    // 139 s old by then, too stale.
    let provider = Provider::scripted(|n| {
        if n == 0 {
            Reply::Answer
        } else {
            Reply::FailAfter(FailureClass::Transient, secs(20))
        }
    });
    let svc = cache(config(60_000, 60_000)).layer(provider.service());
    call(&svc, ask()).await.expect("answers");
    advance(secs(119)).await;
    let failed = call(&svc, ask()).await.expect_err("too stale when served");
    assert_eq!(failed.class(), FailureClass::Transient);
    // Found 90 s old, served 20 s later: 110 s, within the limit.
    let provider = Provider::scripted(|n| {
        if n == 0 {
            Reply::Answer
        } else {
            Reply::FailAfter(FailureClass::Transient, secs(20))
        }
    });
    let svc = cache(config(60_000, 60_000)).layer(provider.service());
    call(&svc, ask()).await.expect("answers");
    advance(secs(90)).await;
    let served = call(&svc, ask()).await.expect("stale");
    assert_eq!(seen(&served), ("answer 0", stale(secs(110))));
}

#[tokio::test(start_paused = true)]
async fn max_age_without_stale_if_error_refuses_a_stale_answer() {
    let provider = answers_then_fails(FailureClass::Transient);
    let svc = cache(config(60_000, 600_000)).layer(provider.service());
    call(&svc, ask()).await.expect("answers");
    advance(secs(61)).await;
    let failed = call(&svc, ask_with(&[("cache-control", "max-age=3600")]))
        .await
        .expect_err("no stale answer for max-age alone");
    assert_eq!(failed.class(), FailureClass::Transient);
    let served = call(
        &svc,
        ask_with(&[("cache-control", "max-age=3600, stale-if-error=600")]),
    )
    .await
    .expect("stale with stale-if-error");
    assert_eq!(seen(&served), ("answer 0", stale(secs(61))));
}

#[tokio::test(start_paused = true)]
async fn a_degraded_answer_after_a_quota_or_budget_refusal_is_not_replaced() {
    use tower::ServiceBuilder;
    use tower_llm_deadline::DeadlineLayer;
    for (class, replaced) in [
        (FailureClass::TenantQuotaExhausted, false),
        (FailureClass::CostBudgetExhausted, false),
        (FailureClass::Auth, false),
        (FailureClass::Transient, true),
    ] {
        let provider = Provider::scripted(move |n| {
            if n == 0 {
                Reply::Answer
            } else {
                Reply::DegradedAfter(class)
            }
        });
        let svc = ServiceBuilder::new()
            .layer(DeadlineLayer::new(secs(30)))
            .layer(cache(config(60_000, 600_000)))
            .service(provider.service());
        call(&svc, ask()).await.expect("answers");
        advance(secs(61)).await;
        let got = call(&svc, ask()).await.expect("an answer");
        if replaced {
            assert_eq!(seen(&got), ("answer 0", stale(secs(61))), "{class:?}");
        } else {
            assert!(got.degraded, "{class:?}: {got:?}");
            assert_eq!(
                got.cache.map(|c| c.status),
                Some(CacheStatus::Miss),
                "{class:?}"
            );
        }
    }
}
