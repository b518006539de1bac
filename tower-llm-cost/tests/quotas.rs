//! Tenant quotas counted by a `MemoryQuota` behind the cost layer:
//! concurrent calls never pass a quota, a refusal says what is left and
//! when it resets, shadow mode refuses nothing, a call without a tenant
//! is the empty tenant's.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tower::util::BoxCloneSyncService;
use tower::{Layer, Service, ServiceBuilder, ServiceExt};
use tower_llm_core::{AttemptRecord, Budget, ChatRequest, Cost, FailureClass, Link, Tenant};
use tower_llm_cost::{Ask, CostLayer, Limits, MemoryQuota, QuotaConfig};
use tower_llm_retry::RetryLayer;

mod common;
use common::*;

const DAY: u64 = 86_400;

fn quota_of(limits: Limits) -> MemoryQuota {
    MemoryQuota::new(QuotaConfig::new(Duration::from_secs(DAY), limits))
}

fn max_cost(n: u64) -> Limits {
    Limits {
        max_cost: Some(nanos(n)),
        max_tokens: None,
    }
}

/// cost (cheap, capped, held to `quota`) → `provider`.
fn costed(quota: &MemoryQuota, provider: &Provider) -> Svc {
    BoxCloneSyncService::new(
        CostLayer::new(cheap())
            .with_max_output_tokens(CAP)
            .with_quota(Arc::new(quota.clone()))
            .layer(provider.service()),
    )
}

fn for_tenant(id: &[u8]) -> ChatRequest {
    let mut r = req();
    Tenant::new(id).store(&mut r);
    r
}

fn sum(records: &[AttemptRecord]) -> Cost {
    records.iter().fold(Cost::ZERO, |total, r| {
        total.saturating_add(r.cost.expect("every attempt is priced"))
    })
}

#[tokio::test(start_paused = true)]
async fn concurrent_calls_of_one_tenant_never_pass_its_quota() {
    // Room for 4 worst cases (4 × 229,000 = 916,000) at a time.
    let quota = quota_of(max_cost(1_000_000));
    let acme = Tenant::new(&b"acme"[..]);
    let provider = Provider::new("p", &[ok_after(1_000, usual())]);
    // retry (1 attempt: it owns the log, so each answer carries its record)
    // → cost → provider.
    let svc = BoxCloneSyncService::new(
        ServiceBuilder::new()
            .layer(
                RetryLayer::new()
                    .with_max_attempts(1)
                    .with_link(Link::new("p", "m")),
            )
            .service(costed(&quota, &provider)),
    );
    let mut charged = Cost::ZERO;
    let mut calls = 0;
    for (wave, fits) in [(1, 4), (2, 3), (3, 3)] {
        let tasks: Vec<_> = (0..10)
            .map(|_| tokio::spawn(svc.clone().oneshot(for_tenant(b"acme"))))
            .collect();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let held = quota.held(&acme);
        assert_eq!(held.cost, nanos(fits * worst(1, 2)), "wave {wave}");
        assert!(quota.used(&acme).cost <= nanos(1_000_000), "wave {wave}");
        let (mut granted, mut refused) = (0, 0);
        for task in tasks {
            match task.await.expect("no panic") {
                Ok(res) => {
                    granted += 1;
                    assert_eq!(res.attempts[0].cost, Some(nanos(40_000)));
                    charged = charged.saturating_add(sum(&res.attempts));
                }
                Err(err) => {
                    refused += 1;
                    assert_eq!(err.class(), FailureClass::TenantQuotaExhausted);
                    assert_eq!(err.attempts()[0].cost, Some(Cost::ZERO));
                    charged = charged.saturating_add(sum(err.attempts()));
                }
            }
        }
        calls += fits;
        assert_eq!((granted, refused), (fits, 10 - fits), "wave {wave}");
        assert_eq!(provider.calls(), usize::try_from(calls).expect("small"));
        assert_eq!(quota.held(&acme), Ask::default(), "wave {wave}");
        let used = quota.used(&acme);
        assert_eq!(used.cost, charged, "wave {wave}");
        assert_eq!(used.cost, nanos(calls * 40_000), "wave {wave}");
        assert_eq!(used.tokens, calls * 30, "wave {wave}");
    }
    // 10 × 40,000 spent: a fourth wave fits (1,000,000 - 400,000) / 229,000 = 2.
    assert!(quota.used(&acme).cost <= nanos(1_000_000));
}

/// Time to the end of the day-long window, for each Unix second the quota
/// could have been created in.
fn resets_between(before: u64, after: u64) -> Vec<Duration> {
    (before..=after)
        .map(|s| Duration::from_secs(DAY - s % DAY))
        .collect()
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs()
}

#[tokio::test(start_paused = true)]
async fn a_refusal_says_what_is_left_and_retries_after_the_window_ends() {
    let before = unix_now();
    let quota = quota_of(max_cost(300_000));
    let after = unix_now();
    let provider = Provider::new("p", &[ok_after(200_000, usual())]);
    let svc = costed(&quota, &provider);

    // One call holds 229,000 of 300,000 for 200 s.
    let first = tokio::spawn(svc.clone().oneshot(for_tenant(b"acme")));
    tokio::task::yield_now().await;
    let err = svc
        .clone()
        .oneshot(for_tenant(b"acme"))
        .await
        .expect_err("71,000 left, 229,000 asked");
    assert_eq!(err.class(), FailureClass::TenantQuotaExhausted);
    let resets = err.retry_after().expect("a retry-after");
    assert!(
        resets_between(before, after).contains(&resets),
        "{resets:?}"
    );
    assert_eq!(
        err.message(),
        Some(
            format!(
                "0.000071 dollars left of the tenant's quota; it resets in {} s",
                resets.as_secs()
            )
            .as_str()
        )
    );
    assert_eq!(provider.calls(), 1);

    // 100 s later the window is 100 s closer to its end.
    if resets > Duration::from_secs(150) {
        tokio::time::advance(Duration::from_secs(100)).await;
        let err = svc
            .clone()
            .oneshot(for_tenant(b"acme"))
            .await
            .expect_err("still held");
        assert_eq!(err.retry_after(), Some(resets - Duration::from_secs(100)));
    }

    // The first call settles to its usage: 260,000 left, room for one more.
    first.await.expect("no panic").expect("answered");
    let acme = Tenant::new(&b"acme"[..]);
    assert_eq!(
        quota.used(&acme),
        Ask {
            cost: nanos(40_000),
            tokens: 30
        }
    );
    if resets > Duration::from_secs(250) {
        let fast = Provider::new("p", &[ok(usual())]);
        costed(&quota, &fast)
            .oneshot(for_tenant(b"acme"))
            .await
            .expect("fits again");
        assert_eq!(quota.used(&acme).cost, nanos(80_000));
    }
}

#[tokio::test(start_paused = true)]
async fn a_token_limit_refusal_names_the_tokens_left() {
    let quota = quota_of(Limits {
        max_cost: None,
        max_tokens: Some(200),
    });
    let provider = Provider::new("p", &[ok(usual())]);
    let svc = costed(&quota, &provider);
    // 30 tokens used: 170 left, 129 asked.
    svc.clone().oneshot(for_tenant(b"t")).await.expect("fits");
    svc.clone().oneshot(for_tenant(b"t")).await.expect("fits");
    // 60 used: 140 left.
    svc.clone().oneshot(for_tenant(b"t")).await.expect("fits");
    // 90 used: 110 left < 129.
    let err = svc
        .oneshot(for_tenant(b"t"))
        .await
        .expect_err("out of tokens");
    assert_eq!(err.class(), FailureClass::TenantQuotaExhausted);
    let message = err.message().expect("a message");
    assert!(
        message.starts_with("110 tokens left of the tenant's quota; it resets in "),
        "{message}"
    );
    assert_eq!(provider.calls(), 3);
}

#[tokio::test(start_paused = true)]
async fn shadow_mode_refuses_nothing_and_still_counts() {
    let quota =
        MemoryQuota::new(QuotaConfig::new(Duration::from_secs(DAY), max_cost(1)).shadow(true));
    let provider = Provider::new("p", &[ok(usual())]);
    let svc = costed(&quota, &provider);
    let tasks: Vec<_> = (0..3)
        .map(|_| tokio::spawn(svc.clone().oneshot(for_tenant(b"t"))))
        .collect();
    for task in tasks {
        task.await.expect("no panic").expect("never refused");
    }
    assert_eq!(provider.calls(), 3);
    let t = Tenant::new(&b"t"[..]);
    assert_eq!(
        quota.used(&t).cost,
        nanos(120_000),
        "over the limit: counted"
    );
    assert_eq!(quota.held(&t), Ask::default());
}

#[tokio::test(start_paused = true)]
async fn a_call_without_a_tenant_is_counted_as_the_empty_tenant() {
    // Room for one worst case (229,000) and the spend of another.
    let quota = quota_of(max_cost(250_000));
    let provider = Provider::new("p", &[ok(usual())]);
    let svc = costed(&quota, &provider);
    svc.clone().oneshot(req()).await.expect("fits");
    let empty = Tenant::new(Vec::new());
    assert_eq!(
        quota.used(&empty),
        Ask {
            cost: nanos(40_000),
            tokens: 30
        }
    );
    // 210,000 left for the empty tenant, named or not.
    let err = svc
        .clone()
        .oneshot(for_tenant(b""))
        .await
        .expect_err("the same quota");
    assert_eq!(err.class(), FailureClass::TenantQuotaExhausted);
    let err = svc.clone().oneshot(req()).await.expect_err("no escape");
    assert_eq!(err.class(), FailureClass::TenantQuotaExhausted);
    svc.oneshot(for_tenant(b"other"))
        .await
        .expect("another tenant has its own quota");
    assert_eq!(provider.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_quota_refusal_releases_the_call_budget_s_hold() {
    let quota = quota_of(max_cost(100_000));
    let provider = Provider::new("p", &[ok(usual())]);
    let mut r = for_tenant(b"t");
    let budget = Budget::new(nanos(1_000_000)).store(&mut r);
    let err = costed(&quota, &provider)
        .oneshot(r)
        .await
        .expect_err("the quota refuses");
    assert_eq!(err.class(), FailureClass::TenantQuotaExhausted);
    assert_eq!(provider.calls(), 0);
    assert_eq!((budget.spent(), budget.held()), (Cost::ZERO, Cost::ZERO));
    assert_eq!(quota.used(&Tenant::new(&b"t"[..])), Ask::default());
}

/// The `QuotaStore` contract: "a reserve future dropped before it resolves
/// leaves nothing held": a call future dropped before its first poll
/// (still reserving) holds nothing, not even until `hold_secs`.
#[tokio::test(start_paused = true)]
async fn a_call_dropped_before_its_first_poll_holds_nothing() {
    let quota = quota_of(max_cost(1_000_000));
    let provider = Provider::new("p", &[ok(usual())]);
    let mut r = for_tenant(b"t");
    let budget = Budget::new(nanos(1_000_000)).store(&mut r);
    let mut svc = costed(&quota, &provider);
    svc.ready().await.expect("ready");
    let never_polled = svc.call(r);
    drop(never_polled);
    assert_eq!(provider.calls(), 0);
    assert_eq!((budget.spent(), budget.held()), (Cost::ZERO, Cost::ZERO));
    let t = Tenant::new(&b"t"[..]);
    assert_eq!(quota.held(&t), Ask::default(), "the quota hold leaked");
    assert_eq!(quota.used(&t), Ask::default());
}
