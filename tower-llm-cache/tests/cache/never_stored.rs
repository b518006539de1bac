//! Unary answers the cache never keeps: failures, degraded answers,
//! answers calling tools (by default) and answers over the entry bound.

use tower::Layer;

use super::*;

#[tokio::test(start_paused = true)]
async fn an_answer_calling_a_tool_is_not_stored_by_default() {
    let provider = Provider::scripted(|_| Reply::ToolCall);
    let svc = cache(config(60_000, 0)).layer(provider.service());
    let first = call(&svc, ask()).await.expect("answers");
    assert_eq!(seen(&first), ("answer 0", MISS));
    assert_eq!(first.choices[0].tool_calls.len(), 1);
    let again = call(&svc, ask()).await.expect("answers");
    assert_eq!(seen(&again), ("answer 1", MISS));
    assert_eq!(provider.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn an_answer_calling_a_tool_is_stored_with_store_tool_calls() {
    let provider = Provider::scripted(|_| Reply::ToolCall);
    let svc = cache(CacheConfig {
        store_tool_calls: true,
        ..config(60_000, 0)
    })
    .layer(provider.service());
    call(&svc, ask()).await.expect("answers");
    advance(secs(2)).await;
    let again = call(&svc, ask()).await.expect("hit");
    assert_eq!(seen(&again), ("answer 0", hit(secs(2))));
    assert_eq!(again.choices[0].tool_calls[0].name, "send_email");
    assert_eq!(provider.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_failure_is_never_stored() {
    let provider = Provider::scripted(|n| {
        if n == 0 {
            Reply::Fail(FailureClass::Transient)
        } else {
            Reply::Answer
        }
    });
    let svc = cache(config(60_000, 0)).layer(provider.service());
    let failed = call(&svc, ask()).await.expect_err("fails");
    assert_eq!(failed.class(), FailureClass::Transient);
    let answered = call(&svc, ask()).await.expect("answers");
    assert_eq!(seen(&answered), ("answer 1", MISS));
    let again = call(&svc, ask()).await.expect("hit");
    assert_eq!(seen(&again), ("answer 1", hit(ms(0))));
    assert_eq!(provider.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_degraded_answer_is_never_stored() {
    let provider = Provider::scripted(|n| {
        if n == 0 {
            Reply::Degraded
        } else {
            Reply::Answer
        }
    });
    let svc = cache(config(60_000, 0)).layer(provider.service());
    let degraded = call(&svc, ask()).await.expect("answers");
    assert!(degraded.degraded);
    assert_eq!(seen(&degraded), ("degraded 0", MISS));
    let answered = call(&svc, ask()).await.expect("answers");
    assert_eq!(seen(&answered), ("answer 1", MISS));
    let again = call(&svc, ask()).await.expect("hit");
    assert_eq!(seen(&again), ("answer 1", hit(ms(0))));
    assert_eq!(provider.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn an_answer_over_max_entry_bytes_is_served_but_not_stored() {
    let provider = Provider::answering();
    let svc = cache(CacheConfig {
        max_entry_bytes: 16,
        ..config(60_000, 0)
    })
    .layer(provider.service());
    let first = call(&svc, ask()).await.expect("answers");
    assert_eq!(seen(&first), ("answer 0", MISS));
    let again = call(&svc, ask()).await.expect("answers");
    assert_eq!(seen(&again), ("answer 1", MISS));
    assert_eq!(provider.calls(), 2);
}
