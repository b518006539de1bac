//! The "used-by" examples run (the axum one in `tower-llm-gateway`, whose
//! dependencies it shares), not just compile: each example's `run()` is
//! called once (its servers on loopback) and its outcome checked, so a
//! regression in any of them fails the test suite.

#[allow(dead_code, unreachable_pub)]
#[path = "../../examples/hyper_client.rs"]
mod hyper_client;
#[allow(dead_code, unreachable_pub)]
#[path = "../../examples/tonic_service.rs"]
mod tonic_service;

use std::time::Duration;

use tower_llm::AttemptStatus;

#[tokio::test(start_paused = true)]
async fn the_hyper_example_retries_into_the_200() {
    let out = hyper_client::run().await.expect("the example runs");
    assert_eq!(out.status, 200);
    assert_eq!(&out.body[..], br#"{"ok": true}"#);
    let statuses: Vec<_> = out.attempts.iter().map(|a| a.status()).collect();
    assert_eq!(
        statuses,
        [
            AttemptStatus::RetriedAfter5xx,
            AttemptStatus::RetriedAfter429,
            AttemptStatus::Succeeded
        ]
    );
    let http: Vec<_> = out.attempts.iter().map(|a| a.http_status).collect();
    assert_eq!(http, [Some(503), Some(429), Some(200)]);
    // The `Retry-After: 1` was waited out.
    assert!(out.elapsed >= Duration::from_secs(1), "{:?}", out.elapsed);
}

#[tokio::test(start_paused = true)]
async fn the_tonic_example_answers_over_grpc() {
    let reply = tonic_service::run().await.expect("the example runs");
    assert_eq!(reply.text, "Hello over gRPC");
    assert_eq!(reply.provider, "openai");
    // One 503, then the answer.
    assert_eq!(reply.attempts, 2);
}
