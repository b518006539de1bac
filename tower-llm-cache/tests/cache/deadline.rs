//! The call's deadline (the deadline layer outside the cache) and the
//! stale-safe rung.

use tokio::time::Instant;
use tower::ServiceBuilder;
use tower_llm_deadline::DeadlineLayer;

use super::*;

/// Answers the first call, then never answers.
fn answers_then_hangs() -> Provider {
    Provider::scripted(|n| if n == 0 { Reply::Answer } else { Reply::Hang })
}

#[tokio::test(start_paused = true)]
async fn a_call_holding_a_stale_answer_gets_it_at_exactly_the_deadline() {
    let provider = answers_then_hangs();
    let svc = ServiceBuilder::new()
        .layer(DeadlineLayer::new(secs(5)))
        .layer(cache(config(60_000, 600_000)))
        .service(provider.service());
    call(&svc, ask()).await.expect("answers");
    advance(secs(90)).await;
    let start = Instant::now();
    let served = call(&svc, ask()).await.expect("stale at the deadline");
    assert_eq!(start.elapsed(), secs(5));
    // Aged when the call found it, at its start.
    assert_eq!(seen(&served), ("answer 0", stale(secs(90))));
    assert_eq!(provider.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_call_without_a_stale_answer_gets_the_deadline_error() {
    let provider = Provider::scripted(|_| Reply::Hang);
    let svc = ServiceBuilder::new()
        .layer(DeadlineLayer::new(secs(5)))
        .layer(cache(config(60_000, 600_000)))
        .service(provider.service());
    let start = Instant::now();
    let failed = call(&svc, ask()).await.expect_err("deadline");
    assert_eq!(start.elapsed(), secs(5));
    assert_eq!(failed.class(), FailureClass::DeadlineExceeded);
    assert_eq!(provider.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_call_whose_answer_is_past_the_stale_window_gets_the_deadline_error() {
    let provider = answers_then_hangs();
    // The store keeps it 10 minutes stale; the request takes 1.
    let svc = ServiceBuilder::new()
        .layer(DeadlineLayer::new(secs(5)))
        .layer(cache(config(60_000, 600_000)))
        .service(provider.service());
    call(&svc, ask()).await.expect("answers");
    advance(ms(120_001)).await;
    let start = Instant::now();
    let failed = call(&svc, ask_with(&[("cache-control", "stale-if-error=60")]))
        .await
        .expect_err("deadline");
    assert_eq!(start.elapsed(), secs(5));
    assert_eq!(failed.class(), FailureClass::DeadlineExceeded);
    assert_eq!(provider.calls(), 2);
}
