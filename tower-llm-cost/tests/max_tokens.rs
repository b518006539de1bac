//! The output cap: written into a held request so the provider cannot
//! generate (nor bill) more than was held; an attempt with no bound at all
//! is refused before it is sent.

use std::sync::Arc;
use std::time::Duration;

use tower::{Layer, ServiceExt};
use tower_llm_core::{Budget, ChatRequest, Cost, FailureClass, Tenant};
use tower_llm_cost::{Ask, CostLayer, Limits, MemoryQuota, QuotaConfig};

mod common;
use common::*;

fn budgeted(max_tokens: Option<u32>, limit: u64) -> (ChatRequest, Budget) {
    let mut r = req();
    r.max_tokens = max_tokens;
    let budget = Budget::new(nanos(limit)).store(&mut r);
    (r, budget)
}

#[tokio::test(start_paused = true)]
async fn the_layer_s_cap_is_written_into_a_request_without_max_tokens() {
    let p = Provider::new("p", &[ok(usual())]);
    let (r, budget) = budgeted(None, 1_000_000_000);
    let svc = CostLayer::new(cheap())
        .with_max_output_tokens(100)
        .layer(p.service());
    svc.oneshot(r).await.expect("answered");
    assert_eq!(p.max_tokens_seen(), [Some(100)]);
    assert_eq!(budget.spent(), nanos(40_000));
}

#[tokio::test(start_paused = true)]
async fn a_request_s_own_lower_max_tokens_is_kept_and_held_as_its_worst_case() {
    let p = Provider::new("p", &[ok(usual())]);
    // 29 × 1,000 + 50 × 2,000 = 129,000 exactly: the layer's cap of 100
    // (worst case 229,000) would not fit.
    let (r, budget) = budgeted(Some(50), 129_000);
    let svc = CostLayer::new(cheap())
        .with_max_output_tokens(100)
        .layer(p.service());
    svc.oneshot(r).await.expect("answered within its own cap");
    assert_eq!(p.max_tokens_seen(), [Some(50)]);
    assert_eq!((budget.spent(), budget.held()), (nanos(40_000), Cost::ZERO));
}

#[tokio::test(start_paused = true)]
async fn a_request_s_higher_max_tokens_is_lowered_to_the_layer_s_cap() {
    let p = Provider::new("p", &[ok(usual())]);
    let (r, _budget) = budgeted(Some(500), 1_000_000_000);
    let svc = CostLayer::new(cheap())
        .with_max_output_tokens(100)
        .layer(p.service());
    svc.oneshot(r).await.expect("answered");
    assert_eq!(p.max_tokens_seen(), [Some(100)]);
}

#[tokio::test(start_paused = true)]
async fn an_attempt_with_no_output_bound_under_a_budget_is_refused_unsent() {
    let p = Provider::new("p", &[ok(usual())]);
    let (r, budget) = budgeted(None, 1_000_000_000);
    let err = CostLayer::new(cheap())
        .layer(p.service())
        .oneshot(r)
        .await
        .expect_err("no bound");
    assert_eq!(err.class(), FailureClass::CostBudgetExhausted);
    assert!(
        err.message().is_some_and(|m| m.contains("max_tokens")),
        "{err}"
    );
    assert_eq!(p.calls(), 0, "never sent");
    assert_eq!((budget.spent(), budget.held()), (Cost::ZERO, Cost::ZERO));
}

#[tokio::test(start_paused = true)]
async fn an_attempt_with_no_output_bound_under_a_quota_is_refused_unsent() {
    let p = Provider::new("p", &[ok(usual())]);
    let quota = MemoryQuota::new(QuotaConfig::new(
        Duration::from_secs(86_400),
        Limits {
            max_cost: Some(nanos(1_000_000_000)),
            max_tokens: None,
        },
    ));
    let err = CostLayer::new(cheap())
        .with_quota(Arc::new(quota.clone()))
        .layer(p.service())
        .oneshot(req())
        .await
        .expect_err("no bound");
    assert_eq!(err.class(), FailureClass::TenantQuotaExhausted);
    assert_eq!(p.calls(), 0, "never sent");
    let anyone = Tenant::new(Vec::new());
    assert_eq!(quota.used(&anyone), Ask::default());
}

#[tokio::test(start_paused = true)]
async fn the_request_s_own_max_tokens_bounds_an_attempt_on_a_link_without_a_cap() {
    let p = Provider::new("p", &[ok(usual())]);
    let (r, budget) = budgeted(Some(10), 1_000_000_000);
    CostLayer::new(cheap())
        .layer(p.service())
        .oneshot(r)
        .await
        .expect("bounded by the request");
    assert_eq!(p.max_tokens_seen(), [Some(10)]);
    assert_eq!(budget.spent(), nanos(40_000));
}

#[tokio::test(start_paused = true)]
async fn a_call_with_neither_budget_nor_quota_is_sent_as_it_is() {
    let p = Provider::new("p", &[ok(usual())]);
    CostLayer::new(cheap())
        .with_max_output_tokens(100)
        .layer(p.service())
        .oneshot(req())
        .await
        .expect("answered");
    assert_eq!(p.max_tokens_seen(), [None], "nothing held, nothing capped");
}
