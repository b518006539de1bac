//! Fresh hits: what they cost, their exact age and where freshness ends.

use tower::Layer;

use super::*;

#[tokio::test(start_paused = true)]
async fn a_repeated_request_is_a_hit_aged_by_the_time_since_it_was_stored() {
    let provider = Provider::answering();
    let svc = cache(config(60_000, 0)).layer(provider.service());
    let first = call(&svc, ask()).await.expect("answers");
    assert_eq!(seen(&first), ("answer 0", MISS));
    advance(ms(42_500)).await;
    let again = call(&svc, ask()).await.expect("hit");
    assert_eq!(seen(&again), ("answer 0", hit(ms(42_500))));
    assert_eq!(again.text(), "answer 0");
    assert_eq!(provider.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_different_request_is_a_miss() {
    let provider = Provider::answering();
    let svc = cache(config(60_000, 0)).layer(provider.service());
    call(&svc, ask()).await.expect("answers");
    let warmer = ask().with_temperature(0.9);
    let other = call(&svc, warmer.clone()).await.expect("answers");
    assert_eq!(seen(&other), ("answer 1", MISS));
    let streamed = call(&svc, ask().with_stream(true)).await.expect("answers");
    assert_eq!(seen(&streamed), ("answer 2", MISS));
    // Each is now held under its own key.
    assert_eq!(
        seen(&call(&svc, warmer).await.expect("hit")),
        ("answer 1", hit(ms(0)))
    );
    assert_eq!(
        seen(&call(&svc, ask()).await.expect("hit")),
        ("answer 0", hit(ms(0)))
    );
    assert_eq!(provider.calls(), 3);
}

/// The layer serves an answer while `age <= ttl`: at exactly `ttl_ms` it
/// is a hit, one millisecond later a miss, whether or not the store keeps
/// it longer for the stale-safe rung.
#[tokio::test(start_paused = true)]
async fn an_answer_is_a_hit_through_exactly_ttl_and_a_miss_one_millisecond_later() {
    for stale_ms in [0, 600_000] {
        let provider = Provider::answering();
        let svc = cache(config(60_000, stale_ms)).layer(provider.service());
        call(&svc, ask()).await.expect("answers");
        advance(ms(60_000)).await;
        let at_ttl = call(&svc, ask()).await.expect("hit");
        assert_eq!(
            seen(&at_ttl),
            ("answer 0", hit(ms(60_000))),
            "stale_ms {stale_ms}"
        );
        advance(ms(1)).await;
        let past = call(&svc, ask()).await.expect("answers");
        assert_eq!(seen(&past), ("answer 1", MISS), "stale_ms {stale_ms}");
        assert_eq!(provider.calls(), 2, "stale_ms {stale_ms}");
        // The new answer is fresh again.
        let again = call(&svc, ask()).await.expect("hit");
        assert_eq!(
            seen(&again),
            ("answer 1", hit(ms(0))),
            "stale_ms {stale_ms}"
        );
    }
}
