//! Seed rules checked across the layers (issue 16): each test names the
//! rule it holds the stack to.

use std::time::Duration;

use tower::{ServiceBuilder, ServiceExt};
use tower_llm::breaker::{BreakerConfig, CircuitState};
use tower_llm::prelude::*;
use tower_llm::retry::FixedFraction;
use tower_llm::{AttemptOutcome, FailureClass};
use tower_llm_providers::mock::{Reply, ScriptedTransport};

fn req() -> ChatRequest {
    ChatRequest::new("gpt-4o-mini", vec![Message::user("hi")])
}

/// Seed 004: a 409 conflict needs a re-read, not the same request: it is
/// tried once, it does not trip the breaker (a threshold of 1 would open
/// on any tripping failure) and it does not fail over.
#[tokio::test(start_paused = true)]
async fn seed_004_a_409_is_not_retried_does_not_trip_and_does_not_fail_over() {
    let primary = ScriptedTransport::new(Reply::openai_error(
        409,
        "invalid_request_error",
        "conflict",
    ));
    let backup = ScriptedTransport::new(Reply::openai_text("backup"));
    let breaker = BreakerLayer::new()
        .with_config(BreakerConfig {
            consecutive_failures: 1,
            ..BreakerConfig::default()
        })
        .expect("config");
    let handle = breaker.handle();
    let link = |svc| {
        ServiceBuilder::new()
            .llm_retry(RetryLayer::new().with_rng(FixedFraction(0.5)))
            .llm_breaker(breaker.clone())
            .service(svc)
    };
    let chain = FallbackLayer::builder(LinkSpec::new("openai", "gpt-4o-mini"))
        .or(LinkSpec::new("backup", "gpt-4o"), link(backup.openai()))
        .build()
        .expect("chain");
    let svc = ServiceBuilder::new()
        .llm_deadline(Duration::from_secs(30))
        .llm_fallback(chain)
        .service(link(primary.openai()));

    for _ in 0..3 {
        let err = svc.clone().oneshot(req()).await.expect_err("conflict");
        assert!(err.is_conflict(), "{err:?}");
        assert_eq!(err.http_status().map(|s| s.as_u16()), Some(409));
        assert_eq!(err.attempts().len(), 1);
        assert_eq!(
            err.attempts()[0].outcome,
            AttemptOutcome::Failed(FailureClass::Conflict)
        );
    }
    assert_eq!(primary.received().len(), 3, "one attempt per call");
    assert_eq!(backup.received().len(), 0, "never failed over");
    let circuits = handle.snapshot();
    assert!(
        circuits
            .iter()
            .all(|c| c.state == CircuitState::Closed && c.consecutive_failures == 0),
        "{circuits:?}"
    );
}
