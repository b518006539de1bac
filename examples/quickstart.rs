//! Deadline, retry and circuit breaker over in-process mock providers.
//!
//! ```text
//! cargo run --example quickstart
//! ```
//!
//! No network, no API keys. Each scenario sends calls through one stack,
//! `deadline (2 s) → retry (3 attempts, 1 s each) → breaker (opens after 3
//! failures)`, and prints what happened, attempt by attempt.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use tower::{ServiceBuilder, ServiceExt, service_fn};
use tower_llm::breaker::BreakerConfig;
use tower_llm::prelude::*;
use tower_llm::{Choice, FinishReason, Link, Usage};

/// How a mock provider behaves on its `n`-th call (0-based).
type Script = fn(usize) -> Behaviour;

#[derive(Clone, Copy)]
enum Behaviour {
    Answer,
    Overloaded,
    Hang,
}

fn answer(req: &ChatRequest, provider: &str) -> ChatResponse {
    ChatResponse {
        id: "mock-1".into(),
        model: req.model.to_string(),
        provider: provider.into(),
        fallback_position: 0,
        degraded: false,
        idempotent_replayed: false,
        cache: None,
        choices: vec![Choice {
            index: 0,
            text: "Hello from the mock provider".into(),
            tool_calls: vec![],
            finish_reason: FinishReason::Stop,
        }],
        usage: Usage::default(),
        latency: Duration::ZERO,
        attempts: vec![],
    }
}

async fn scenario(title: &str, provider: &'static str, script: Script, calls: usize) {
    println!("== {title}");
    let count = Arc::new(AtomicUsize::new(0));
    let counter = count.clone();
    let mock = service_fn(move |req: ChatRequest| {
        let n = counter.fetch_add(1, Ordering::SeqCst);
        async move {
            match script(n) {
                Behaviour::Answer => Ok(answer(&req, provider)),
                Behaviour::Overloaded => Err(Failure::new(FailureClass::Transient)
                    .with_status(http::StatusCode::SERVICE_UNAVAILABLE)
                    .with_message("model is currently overloaded")),
                Behaviour::Hang => std::future::pending().await,
            }
        }
    });
    let breaker = BreakerLayer::new()
        .with_config(BreakerConfig {
            consecutive_failures: 3,
            ..BreakerConfig::default()
        })
        .expect("valid breaker config");
    let svc = ServiceBuilder::new()
        .llm_deadline(Duration::from_secs(2))
        .llm_retry(
            RetryLayer::new()
                .with_attempt_timeout(Duration::from_secs(1))
                .with_backoff(Backoff::seed_default()),
        )
        .llm_breaker(breaker)
        .service(mock);

    for call in 1..=calls {
        let mut req = ChatRequest::new("mock-model", vec![Message::user("Say hello")]);
        Link::new(provider, "mock-model").store(&mut req);
        let started = Instant::now();
        let result = svc.clone().oneshot(req).await;
        let took = started.elapsed().as_millis();
        let attempts = match &result {
            Ok(res) => {
                println!("  call {call}: ok in {took} ms: {:?}", res.text());
                res.attempts.clone()
            }
            Err(err) => {
                println!("  call {call}: failed in {took} ms: {err}");
                err.attempts().to_vec()
            }
        };
        for a in attempts {
            println!(
                "    attempt {} on {}/{}: {} after {} ms",
                a.attempt,
                a.provider,
                a.model,
                a.status().as_metric_label(),
                a.elapsed.as_millis()
            );
        }
    }
    println!(
        "  the provider was called {} times\n",
        count.load(Ordering::SeqCst)
    );
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    println!("tower-llm quickstart: deadline → retry → breaker over mock providers\n");
    scenario("a healthy provider", "steady", |_| Behaviour::Answer, 1).await;
    scenario(
        "a provider overloaded once: retried after ~200 ms",
        "flaky",
        |n| {
            if n == 0 {
                Behaviour::Overloaded
            } else {
                Behaviour::Answer
            }
        },
        1,
    )
    .await;
    scenario(
        "a hung provider: the attempt cut at 1 s, then no retry (the backoff and \
         another 1 s attempt would not fit the 1 s left of the 2 s deadline)",
        "hung",
        |_| Behaviour::Hang,
        1,
    )
    .await;
    scenario(
        "a provider that is down: 3 failures open its circuit, then calls fail fast",
        "down",
        |_| Behaviour::Overloaded,
        3,
    )
    .await;
}
