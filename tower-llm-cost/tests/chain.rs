//! The cost layer inside a whole stack (fallback → hedge → retry → cost →
//! provider) on virtual time: each attempt holds its worst case and is
//! charged exactly what its ending costs; a budget that cannot cover a
//! link skips it; concurrent hedges never pass the budget.

use std::time::Duration;

use tokio::time::Instant;
use tower::util::BoxCloneSyncService;
use tower::{Layer, ServiceBuilder, ServiceExt};
use tower_llm_core::{
    AttemptOutcome, AttemptRecord, Budget, ChatResponse, Cost, FailureClass, Link, NextStep, Price,
};
use tower_llm_cost::{BudgetLayer, CostLayer};
use tower_llm_fallback::{FallbackLayer, LinkSpec};
use tower_llm_hedge::{HedgeConfig, HedgeLayer};
use tower_llm_retry::{FixedFraction, RetryLayer};

mod common;
use common::*;

fn retry(max_attempts: u8) -> RetryLayer {
    RetryLayer::new()
        .with_max_attempts(max_attempts)
        .with_rng(FixedFraction(0.5))
}

/// retry → cost (capped at [`CAP`] output tokens) → `provider`.
fn link(retry: RetryLayer, price: Price, provider: &Provider) -> Svc {
    BoxCloneSyncService::new(
        ServiceBuilder::new()
            .layer(retry)
            .layer(CostLayer::new(price).with_max_output_tokens(CAP))
            .service(provider.service()),
    )
}

/// fallback(expensive: 2 attempts, cheap: 1 attempt), optionally with a
/// degraded answer.
fn two_links(expensive_p: &Provider, cheap_p: &Provider, degraded: bool) -> Svc {
    let mut builder = FallbackLayer::builder(LinkSpec::new("expensive", "big")).or(
        LinkSpec::new("cheap", "small"),
        link(retry(1), cheap(), cheap_p),
    );
    if degraded {
        builder = builder.with_degraded(|_| {
            ChatResponse::builder("none")
                .text("we are over budget")
                .build()
        });
    }
    let layer = builder.build().expect("a valid chain");
    BoxCloneSyncService::new(layer.layer(link(retry(2), expensive(), expensive_p)))
}

/// (outcome, cost, cost_estimated) of each record.
fn costs(records: &[AttemptRecord]) -> Vec<(AttemptOutcome, Option<Cost>, bool)> {
    records
        .iter()
        .map(|r| (r.outcome, r.cost, r.cost_estimated))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn retries_then_failover_charge_each_attempt_exactly_and_release_every_hold() {
    let big = Provider::new("expensive", &[Step::Status(503)]);
    let small = Provider::new("cheap", &[ok(usual())]);
    let svc = two_links(&big, &small, false);
    let mut r = req();
    let budget = Budget::new(nanos(1_000_000_000)).store(&mut r);

    let res = svc.oneshot(r).await.expect("the cheap link answers");

    assert_eq!(res.provider.as_ref(), "cheap");
    assert_eq!((big.calls(), small.calls()), (2, 1), "3 attempts in all");
    let transient = AttemptOutcome::Failed(FailureClass::Transient);
    assert_eq!(
        costs(&res.attempts),
        [
            // A 503 bills nothing.
            (transient, Some(Cost::ZERO), false),
            (transient, Some(Cost::ZERO), false),
            // 20 input tokens × 1,000 + 10 output tokens × 2,000.
            (AttemptOutcome::Succeeded, Some(nanos(40_000)), false),
        ]
    );
    assert_eq!(
        res.attempts.iter().map(|r| r.next).collect::<Vec<_>>(),
        [NextStep::Retried, NextStep::FailedOver, NextStep::Returned]
    );
    assert_eq!(budget.spent(), nanos(40_000));
    assert_eq!(budget.held(), Cost::ZERO);
    assert_eq!(budget.left(), nanos(1_000_000_000 - 40_000));
}

#[tokio::test(start_paused = true)]
async fn a_budget_short_of_a_link_s_worst_case_skips_it_unsent_and_the_cheaper_link_serves() {
    // The expensive worst case is 3,290,000; the cheap one 229,000.
    assert_eq!(worst(10, 30), 3_290_000);
    assert_eq!(worst(1, 2), 229_000);
    let big = Provider::new("expensive", &[ok(usual())]);
    let small = Provider::new("cheap", &[ok(usual())]);
    let svc = two_links(&big, &small, false);
    let mut r = req();
    let budget = Budget::new(nanos(1_000_000)).store(&mut r);

    let start = Instant::now();
    let res = svc.oneshot(r).await.expect("the cheap link answers");

    assert_eq!(start.elapsed(), Duration::ZERO, "no backoff for a refusal");
    assert_eq!(res.provider.as_ref(), "cheap");
    assert_eq!(big.calls(), 0, "the expensive provider never saw the call");
    assert_eq!(small.calls(), 1);
    assert_eq!(
        costs(&res.attempts),
        [
            (
                AttemptOutcome::Failed(FailureClass::CostBudgetExhausted),
                Some(Cost::ZERO),
                false
            ),
            (AttemptOutcome::Succeeded, Some(nanos(40_000)), false),
        ]
    );
    assert_eq!(res.attempts[0].next, NextStep::FailedOver);
    assert_eq!(res.attempts[0].attempt, 1, "a refusal is never retried");
    assert_eq!(&*res.attempts[0].provider, "expensive");
    assert_eq!(budget.spent(), nanos(40_000));
    assert_eq!(budget.held(), Cost::ZERO);
}

#[tokio::test(start_paused = true)]
async fn a_budget_no_link_fits_ends_the_call_with_cost_budget_exhausted_and_sends_nothing() {
    let big = Provider::new("expensive", &[ok(usual())]);
    let small = Provider::new("cheap", &[ok(usual())]);
    let svc = BudgetLayer::new(nanos(100_000)).layer(two_links(&big, &small, false));

    let err = svc.oneshot(req()).await.expect_err("nothing fits");

    assert_eq!(err.class(), FailureClass::CostBudgetExhausted);
    assert_eq!((big.calls(), small.calls()), (0, 0));
    let refused = AttemptOutcome::Failed(FailureClass::CostBudgetExhausted);
    assert_eq!(
        costs(err.attempts()),
        [
            (refused, Some(Cost::ZERO), false),
            (refused, Some(Cost::ZERO), false)
        ]
    );
    // The last refusal says what it asked and what was left.
    assert_eq!(
        err.message(),
        Some(
            "this attempt may cost up to 0.000229 dollars; 0.0001 of the call's budget of \
             0.0001 is left"
        )
    );
}

#[tokio::test(start_paused = true)]
async fn a_budget_no_link_fits_gets_the_degraded_answer_when_the_chain_has_one() {
    let big = Provider::new("expensive", &[ok(usual())]);
    let small = Provider::new("cheap", &[ok(usual())]);
    let svc = two_links(&big, &small, true);
    let mut r = req();
    let budget = Budget::new(nanos(100_000)).store(&mut r);

    let res = svc.oneshot(r).await.expect("the degraded answer");

    assert!(res.degraded);
    assert_eq!(res.text(), "we are over budget");
    assert_eq!((big.calls(), small.calls()), (0, 0));
    let refused = AttemptOutcome::Failed(FailureClass::CostBudgetExhausted);
    assert_eq!(
        res.attempts.iter().map(|r| r.outcome).collect::<Vec<_>>(),
        [refused, refused]
    );
    assert_eq!((budget.spent(), budget.held()), (Cost::ZERO, Cost::ZERO));
}

#[tokio::test(start_paused = true)]
async fn an_attempt_cut_by_the_retry_timeout_is_charged_its_input_estimate_flagged() {
    let hang = Provider::new("expensive", &[Step::Hang]);
    let svc = link(
        retry(2)
            .with_attempt_timeout(Duration::from_secs(1))
            .with_link(Link::new("expensive", "big")),
        expensive(),
        &hang,
    );
    let mut r = req();
    let budget = Budget::new(nanos(1_000_000_000)).store(&mut r);

    let err = svc.oneshot(r).await.expect_err("both attempts time out");

    assert_eq!(err.class(), FailureClass::Timeout);
    assert_eq!(hang.calls(), 2);
    // 29 input tokens × 10,000: the provider may have read the prompt.
    let timeout = AttemptOutcome::Failed(FailureClass::Timeout);
    let charge = Some(nanos(input_only(10)));
    assert_eq!(
        costs(err.attempts()),
        [(timeout, charge, true), (timeout, charge, true)]
    );
    assert_eq!(budget.spent(), nanos(2 * 290_000));
    assert_eq!(budget.held(), Cost::ZERO);
}

fn hedged(provider: &Provider) -> Svc {
    let hedge = HedgeLayer::new(HedgeConfig {
        delay_ms: 200,
        budget_ratio: 1.0,
        ..HedgeConfig::default()
    })
    .expect("a valid hedge");
    BoxCloneSyncService::new(hedge.layer(link(
        retry(1).with_link(Link::new("cheap", "small")),
        cheap(),
        provider,
    )))
}

#[tokio::test(start_paused = true)]
async fn a_hedge_holds_both_worst_cases_at_once_and_the_loser_pays_its_input_estimate() {
    // The first attempt answers at 300 ms; the hedge (sent at 200 ms)
    // would answer at 1,200 ms.
    let provider = Provider::new("cheap", &[ok_after(300, usual()), ok_after(1_000, usual())]);
    let svc = hedged(&provider);
    let mut r = req();
    let budget = Budget::new(nanos(1_000_000_000)).store(&mut r);

    let call = tokio::spawn(svc.oneshot(r));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(budget.held(), nanos(worst(1, 2)), "the first attempt alone");
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(provider.calls(), 2);
    assert_eq!(budget.held(), nanos(2 * worst(1, 2)), "both branches hold");
    assert_eq!(budget.spent(), Cost::ZERO);

    let res = call.await.expect("no panic").expect("the first answers");
    assert_eq!(res.id, "0", "the first attempt won");
    assert_eq!(
        costs(&res.attempts),
        [
            (AttemptOutcome::Succeeded, Some(nanos(40_000)), false),
            (
                AttemptOutcome::CancelledByHedge,
                Some(nanos(input_only(1))),
                true
            ),
        ]
    );
    assert!(res.attempts[1].hedge);
    assert_eq!(budget.spent(), nanos(40_000 + 29_000));
    assert_eq!(budget.held(), Cost::ZERO);
}

#[tokio::test(start_paused = true)]
async fn a_budget_for_one_worst_case_refuses_the_hedge_and_the_first_attempt_still_wins() {
    let provider = Provider::new("cheap", &[ok_after(300, usual()), ok_after(1_000, usual())]);
    let svc = hedged(&provider);
    let mut r = req();
    let budget = Budget::new(nanos(worst(1, 2) + 100_000)).store(&mut r);

    let call = tokio::spawn(svc.oneshot(r));
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(provider.calls(), 1, "the hedge was never sent");
    assert_eq!(budget.held(), nanos(worst(1, 2)));

    let res = call.await.expect("no panic").expect("the first answers");
    assert_eq!(res.id, "0");
    assert_eq!(
        costs(&res.attempts),
        [
            (AttemptOutcome::Succeeded, Some(nanos(40_000)), false),
            (
                AttemptOutcome::Failed(FailureClass::CostBudgetExhausted),
                Some(Cost::ZERO),
                false
            ),
        ]
    );
    assert!(res.attempts[1].hedge);
    assert_eq!(budget.spent(), nanos(40_000));
    assert_eq!(budget.held(), Cost::ZERO);
}
