//! Usage that cannot be right is not believed: the attempt is charged its
//! whole estimate, flagged; usage that can be right, up to the bounds, is.

use std::sync::Arc;
use std::time::Duration;

use tower::{Layer, ServiceExt, service_fn};
use tower_llm_core::layer::{AttemptLogExt as _, AttemptRecordExt as _};
use tower_llm_core::{
    AttemptLog, AttemptRecord, Budget, ChatRequest, ChatResponse, Cost, Failure, Link,
    LlmRequest as _, Tenant, ToolCall, Usage,
};
use tower_llm_cost::{Ask, CostLayer, Limits, MemoryQuota, QuotaConfig};

mod common;
use common::*;

/// What one unary answer is charged (budget, quota and record agree), and
/// whether the charge is flagged as an estimate.
async fn charge_of(answer: ChatResponse) -> (Cost, u64, bool) {
    let quota = MemoryQuota::new(QuotaConfig::new(
        Duration::from_secs(86_400),
        Limits::default(),
    ));
    let mut r = req();
    let budget = Budget::new(nanos(1_000_000_000)).store(&mut r);
    let tenant = Tenant::new(&b"t"[..]);
    tenant.clone().store(&mut r);
    let owned = AttemptLog::install(&mut r).expect("a fresh log");
    let log = AttemptLog::of(&r).expect("installed");
    log.begin(AttemptRecord::begun(r.call(), &Link::new("p", "m")))
        .expect("room");
    let provider = service_fn(move |_: ChatRequest| {
        let answer = answer.clone();
        async move { Ok::<_, Failure>(answer) }
    });
    CostLayer::new(cheap())
        .with_max_output_tokens(CAP)
        .with_quota(Arc::new(quota.clone()))
        .layer(provider)
        .oneshot(r)
        .await
        .expect("answered");
    let record = owned.take().pop().expect("the record");
    let cost = record.cost.expect("priced");
    assert_eq!(budget.spent(), cost);
    assert_eq!(budget.held(), Cost::ZERO);
    assert_eq!(quota.held(&tenant), Ask::default());
    let used = quota.used(&tenant);
    assert_eq!(used.cost, cost);
    (cost, used.tokens, record.cost_estimated)
}

fn answer(text: &str, usage: Usage) -> ChatResponse {
    ChatResponse::builder("m").text(text).usage(usage).build()
}

/// The whole estimate: 29 input and 100 output tokens at the cheap price.
fn estimate() -> (Cost, u64, bool) {
    (nanos(worst(1, 2)), INPUT + u64::from(CAP), true)
}

#[tokio::test(start_paused = true)]
async fn usage_with_more_input_than_the_bound_is_charged_the_estimate() {
    assert_eq!(
        charge_of(answer("hi", usage(INPUT as u32 + 1, 10))).await,
        estimate()
    );
}

#[tokio::test(start_paused = true)]
async fn usage_with_more_output_than_the_cap_is_charged_the_estimate() {
    assert_eq!(
        charge_of(answer("hi", usage(20, CAP + 1))).await,
        estimate()
    );
}

#[tokio::test(start_paused = true)]
async fn usage_with_no_output_for_a_non_empty_answer_is_charged_the_estimate() {
    assert_eq!(charge_of(answer("hi", usage(20, 0))).await, estimate());
    let tool_only = ChatResponse::builder("m")
        .tool_call(ToolCall {
            id: "c1".into(),
            name: "f".into(),
            arguments: "{}".into(),
        })
        .usage(usage(20, 0))
        .build();
    assert_eq!(charge_of(tool_only).await, estimate());
}

#[tokio::test(start_paused = true)]
async fn all_zero_usage_is_no_usage_and_is_charged_the_estimate() {
    assert_eq!(charge_of(answer("hi", Usage::default())).await, estimate());
}

#[tokio::test(start_paused = true)]
async fn usage_at_exactly_the_bounds_is_believed() {
    // 29 × 1,000 + 100 × 2,000: the worst case, but the provider's word.
    assert_eq!(
        charge_of(answer("hi", usage(INPUT as u32, CAP))).await,
        (nanos(worst(1, 2)), INPUT + u64::from(CAP), false)
    );
}

#[tokio::test(start_paused = true)]
async fn usage_with_no_output_for_an_empty_answer_is_believed() {
    assert_eq!(
        charge_of(answer("", usage(20, 0))).await,
        (nanos(20_000), 20, false)
    );
}

#[tokio::test(start_paused = true)]
async fn cached_input_tokens_are_charged_the_cached_price() {
    let with_cache = cheap();
    let price = tower_llm_core::Price::new(
        with_cache.input,
        with_cache.output,
        Some(Cost::from_nanos(100_000_000)),
    )
    .expect("price");
    // 20 input tokens of which 15 cached: 5 × 1,000 + 15 × 100 + 10 × 2,000.
    let u = Usage {
        prompt_tokens: 20,
        completion_tokens: 10,
        cached_input_tokens: 15,
    };
    let mut r = req();
    let budget = Budget::new(nanos(1_000_000_000)).store(&mut r);
    let provider =
        service_fn(move |_: ChatRequest| async move { Ok::<_, Failure>(answer("hi", u)) });
    CostLayer::new(price)
        .with_max_output_tokens(CAP)
        .layer(provider)
        .oneshot(r)
        .await
        .expect("answered");
    assert_eq!(budget.spent(), nanos(5_000 + 1_500 + 20_000));
}
