//! The request's `Cache-Control`, read from the inbound headers a typed
//! request carries in its extensions.

use tower::Layer;

use super::*;

#[tokio::test(start_paused = true)]
async fn no_cache_asks_the_provider_and_stores_its_answer() {
    let provider = Provider::answering();
    let svc = cache(config(60_000, 0)).layer(provider.service());
    call(&svc, ask()).await.expect("answers");
    advance(secs(10)).await;
    let forced = call(&svc, ask_with(&[("cache-control", "no-cache")]))
        .await
        .expect("answers");
    assert_eq!(seen(&forced), ("answer 1", MISS));
    assert_eq!(provider.calls(), 2);
    advance(secs(5)).await;
    // The next plain request hits the new answer, aged from its storing.
    let plain = call(&svc, ask()).await.expect("hit");
    assert_eq!(seen(&plain), ("answer 1", hit(secs(5))));
    assert_eq!(provider.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn no_store_answers_without_keeping_the_answer() {
    let provider = Provider::answering();
    let svc = cache(config(60_000, 0)).layer(provider.service());
    let first = call(&svc, ask_with(&[("cache-control", "no-store")]))
        .await
        .expect("answers");
    assert_eq!(seen(&first), ("answer 0", MISS));
    let plain = call(&svc, ask()).await.expect("answers");
    assert_eq!(seen(&plain), ("answer 1", MISS));
    assert_eq!(provider.calls(), 2);
    advance(secs(3)).await;
    // `no-store` only stops storing: a held answer still serves it.
    let held = call(&svc, ask_with(&[("cache-control", "no-store")]))
        .await
        .expect("hit");
    assert_eq!(seen(&held), ("answer 1", hit(secs(3))));
    assert_eq!(provider.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn max_age_shortens_what_the_request_takes() {
    let provider = Provider::answering();
    let svc = cache(config(60_000, 0)).layer(provider.service());
    call(&svc, ask()).await.expect("answers");
    advance(secs(5)).await;
    let young = call(&svc, ask_with(&[("cache-control", "max-age=5")]))
        .await
        .expect("hit");
    assert_eq!(seen(&young), ("answer 0", hit(secs(5))));
    advance(secs(1)).await;
    let old = call(&svc, ask_with(&[("cache-control", "max-age=5")]))
        .await
        .expect("answers");
    assert_eq!(seen(&old), ("answer 1", MISS));
    assert_eq!(provider.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn max_age_cannot_lengthen_freshness_past_ttl() {
    let provider = Provider::answering();
    // The store keeps the answer 10 minutes past its freshness, so only
    // the ttl cap can make the request miss.
    let svc = cache(config(60_000, 600_000)).layer(provider.service());
    call(&svc, ask()).await.expect("answers");
    advance(secs(60)).await;
    let at_ttl = call(&svc, ask_with(&[("cache-control", "max-age=9999")]))
        .await
        .expect("hit");
    assert_eq!(seen(&at_ttl), ("answer 0", hit(secs(60))));
    advance(ms(1)).await;
    let past = call(&svc, ask_with(&[("cache-control", "max-age=9999")]))
        .await
        .expect("answers");
    assert_eq!(seen(&past), ("answer 1", MISS));
    assert_eq!(provider.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_malformed_cache_control_acts_as_absent() {
    let provider = Provider::answering();
    let svc = cache(config(60_000, 0)).layer(provider.service());
    call(&svc, ask()).await.expect("answers");
    advance(secs(30)).await;
    let soon = call(&svc, ask_with(&[("cache-control", "max-age=soon")]))
        .await
        .expect("hit");
    assert_eq!(seen(&soon), ("answer 0", hit(secs(30))));
    // The whole header is void: its well-formed `no-cache` included.
    let voided = call(
        &svc,
        ask_with(&[("cache-control", "no-cache, max-age=soon")]),
    )
    .await
    .expect("hit");
    assert_eq!(seen(&voided), ("answer 0", hit(secs(30))));
    assert_eq!(provider.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn stale_if_error_zero_refuses_a_stale_answer() {
    let provider = Provider::scripted(|n| {
        if n == 0 {
            Reply::Answer
        } else {
            Reply::Fail(FailureClass::Transient)
        }
    });
    let svc = cache(config(60_000, 600_000)).layer(provider.service());
    call(&svc, ask()).await.expect("answers");
    advance(secs(90)).await;
    let refused = call(&svc, ask_with(&[("cache-control", "stale-if-error=0")]))
        .await
        .expect_err("no stale answer");
    assert_eq!(refused.class(), FailureClass::Transient);
    // Without the directive the same request gets it.
    let plain = call(&svc, ask()).await.expect("stale");
    assert_eq!(seen(&plain), ("answer 0", stale(secs(90))));
    assert_eq!(provider.calls(), 3);
}

#[tokio::test(start_paused = true)]
async fn stale_if_error_shortens_the_stale_window() {
    let provider = Provider::scripted(|n| {
        if n == 0 {
            Reply::Answer
        } else {
            Reply::Fail(FailureClass::Transient)
        }
    });
    let svc = cache(config(60_000, 600_000)).layer(provider.service());
    call(&svc, ask()).await.expect("answers");
    advance(secs(90)).await;
    let within = call(&svc, ask_with(&[("cache-control", "stale-if-error=30")]))
        .await
        .expect("stale");
    assert_eq!(seen(&within), ("answer 0", stale(secs(90))));
    advance(ms(1)).await;
    let past = call(&svc, ask_with(&[("cache-control", "stale-if-error=30")]))
        .await
        .expect_err("too stale");
    assert_eq!(past.class(), FailureClass::Transient);
    assert_eq!(provider.calls(), 3);
}

#[tokio::test(start_paused = true)]
async fn stale_if_error_cannot_lengthen_the_stale_window_past_stale_ms() {
    let provider = Provider::scripted(|n| {
        if n == 0 {
            Reply::Answer
        } else {
            Reply::Fail(FailureClass::Transient)
        }
    });
    // One store, written by a route keeping answers 10 minutes stale and
    // read by a route allowing 1 minute: only the cap can refuse.
    let store = Arc::new(tower_llm_cache::MemoryCache::default());
    let long = cache(config(60_000, 600_000))
        .with_store(store.clone())
        .layer(provider.service());
    let short = cache(config(60_000, 60_000))
        .with_store(store)
        .layer(provider.service());
    call(&long, ask()).await.expect("answers");
    advance(secs(120)).await;
    let at_cap = call(
        &short,
        ask_with(&[("cache-control", "stale-if-error=9999")]),
    )
    .await
    .expect("stale");
    assert_eq!(seen(&at_cap), ("answer 0", stale(secs(120))));
    advance(ms(1)).await;
    let past = call(
        &short,
        ask_with(&[("cache-control", "stale-if-error=9999")]),
    )
    .await
    .expect_err("capped");
    assert_eq!(past.class(), FailureClass::Transient);
    // The long route still has it.
    let long_stale = call(&long, ask()).await.expect("stale");
    assert_eq!(seen(&long_stale), ("answer 0", stale(ms(120_001))));
    assert_eq!(provider.calls(), 4);
}
