//! A 429 with a tiny `Retry-After` on a healthy single-link route, over
//! real loopback HTTP: the full stack (deadline → retry → breaker →
//! OpenAI provider) under virtual time.

use std::time::Duration;

use tower::{ServiceBuilder, ServiceExt};
use tower_llm::breaker::CircuitState;
use tower_llm::prelude::*;
use tower_llm::providers::https::client_with_connect_timeout;
use tower_llm::providers::{ApiKey, OpenAi, OpenAiConfig};
use tower_llm::retry::FixedFraction;
use tower_llm_providers::mock::{MockServer, Reply};

fn req() -> ChatRequest {
    ChatRequest::new("m", vec![Message::user("hi")])
}

/// deadline (30 s) → retry → breaker → OpenAI on `server`, and the
/// breaker's handle.
fn stack(
    server: &MockServer,
) -> (
    impl tower::Service<ChatRequest, Response = ChatResponse, Error = Failure, Future: Send>
    + Clone
    + Send
    + 'static,
    tower_llm::breaker::BreakerHandle,
) {
    let breaker = BreakerLayer::new();
    let handle = breaker.handle();
    let provider = OpenAi::new(
        client_with_connect_timeout(Duration::from_secs(5)),
        OpenAiConfig::new(ApiKey::new("k")).with_base_url(&server.url()),
    );
    let svc = ServiceBuilder::new()
        .llm_deadline(Duration::from_secs(30))
        .llm_retry(RetryLayer::new().with_rng(FixedFraction(0.5)))
        .llm_breaker(breaker)
        .service(provider);
    (svc, handle)
}

#[tokio::test(start_paused = true)]
async fn a_50_ms_429_hold_never_turns_a_healthy_link_into_a_one_probe_link() {
    // Every answer takes 1 s (an LLM call); the first request gets a 429
    // asking to wait 50 ms.
    let server = MockServer::start(Reply::openai_text("ok").after(Duration::from_secs(1)))
        .await
        .expect("server");
    server.push(
        Reply::openai_error(429, "requests", "Rate limit reached")
            .with_header("retry-after-ms", "50"),
    );
    let (svc, handle) = stack(&server);

    // The first call meets the 429; its retry goes out 50 ms later.
    let first = tokio::spawn(svc.clone().oneshot(req()));
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Nine more callers arrive while that retry is in flight.
    let rest: Vec<_> = (0..9)
        .map(|_| tokio::spawn(svc.clone().oneshot(req())))
        .collect();
    let answer = first.await.expect("task").expect("the first call succeeds");
    assert_eq!(answer.text(), "ok");
    for call in rest {
        let answer = call.await.expect("task").expect("every caller succeeds");
        assert_eq!(answer.text(), "ok");
    }
    // The 429, its retry, and the nine.
    assert_eq!(server.received().len(), 11);
    let circuits = handle.snapshot();
    assert_eq!(circuits.len(), 1);
    assert_eq!(circuits[0].state, CircuitState::Closed);
    assert_eq!(circuits[0].retry_after, None);
}

#[tokio::test(start_paused = true)]
async fn a_2_s_429_hold_delays_the_callers_on_a_single_link_route_and_fails_none() {
    // A hold above the 1 s threshold: callers that arrive during it wait
    // it out (their deadline allows) instead of failing fast.
    let server = MockServer::start(Reply::openai_text("ok").after(Duration::from_millis(500)))
        .await
        .expect("server");
    server.push(
        Reply::openai_error(429, "requests", "Rate limit reached").with_header("retry-after", "2"),
    );
    let (svc, handle) = stack(&server);
    let started = tokio::time::Instant::now();
    let first = tokio::spawn(svc.clone().oneshot(req()));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let rest: Vec<_> = (0..9)
        .map(|_| tokio::spawn(svc.clone().oneshot(req())))
        .collect();
    assert_eq!(first.await.expect("task").expect("first").text(), "ok");
    for call in rest {
        let answer = call.await.expect("task").expect("every caller succeeds");
        assert_eq!(answer.text(), "ok");
        // Held, then retried once the hold ended: two attempts, the first
        // refused by the hold without reaching the provider.
        assert_eq!(answer.attempts.len(), 2);
    }
    // Nobody reached the provider during the hold: the 429 and ten answers.
    assert_eq!(server.received().len(), 11);
    assert!(started.elapsed() >= Duration::from_millis(2_500));
    assert_eq!(handle.snapshot()[0].state, CircuitState::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_2_s_429_hold_on_a_primary_with_a_backup_sends_callers_to_the_backup_at_once() {
    // With a link after the held one, waiting out the hold would only add
    // latency: callers go to the backup without waiting.
    let primary = MockServer::start(Reply::openai_text("primary"))
        .await
        .expect("server");
    primary.push(
        Reply::openai_error(429, "requests", "Rate limit reached").with_header("retry-after", "2"),
    );
    let backup = MockServer::start(Reply::openai_text("backup"))
        .await
        .expect("server");
    let breaker = BreakerLayer::new();
    let link = |server: &MockServer| {
        ServiceBuilder::new()
            .llm_retry(RetryLayer::new().with_rng(FixedFraction(0.5)))
            .llm_breaker(breaker.clone())
            .service(OpenAi::new(
                client_with_connect_timeout(Duration::from_secs(5)),
                OpenAiConfig::new(ApiKey::new("k")).with_base_url(&server.url()),
            ))
    };
    let chain = FallbackLayer::builder(LinkSpec::new("primary", "m"))
        .or(LinkSpec::new("backup", "m"), link(&backup))
        .build()
        .expect("chain");
    let svc = ServiceBuilder::new()
        .llm_deadline(Duration::from_secs(30))
        .llm_fallback(chain)
        .service(link(&primary));
    // The first call meets the 429 and is held: it waits for its retry.
    let first = tokio::spawn(svc.clone().oneshot(req()));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = tokio::time::Instant::now();
    for _ in 0..9 {
        let answer = svc.clone().oneshot(req()).await.expect("served");
        assert_eq!(answer.text(), "backup");
    }
    assert_eq!(
        started.elapsed(),
        Duration::ZERO,
        "nobody waited out the hold"
    );
    assert_eq!(primary.received().len(), 1);
    assert_eq!(backup.received().len(), 9);
    first.await.expect("task").expect("first call served");
}
