//! The deadline layer over an in-process mock provider.
//!
//! ```text
//! cargo run --example quickstart
//! ```
//!
//! Three calls go through one stack with a 300 ms budget: a fast answer,
//! a hung provider cut off at the deadline, and a request whose caller
//! brought its own, tighter deadline. No network, no API keys.

use std::time::Duration;

use tokio::time::Instant;
use tower::{ServiceBuilder, ServiceExt, service_fn};
use tower_llm::prelude::*;
use tower_llm::{Choice, FinishReason, Usage};

/// A provider that takes as many milliseconds as the prompt says.
async fn mock_provider(req: ChatRequest) -> Result<ChatResponse, Failure> {
    let prompt = req
        .messages
        .last()
        .map(Message::joined_text)
        .unwrap_or_default();
    let delay_ms: u64 = prompt
        .split_whitespace()
        .find_map(|w| w.strip_suffix("ms").and_then(|n| n.parse().ok()))
        .unwrap_or(0);
    let left = Deadline::remaining_in(&req.extensions).unwrap_or(Duration::MAX);
    println!(
        "  provider: asked to take {delay_ms} ms, deadline leaves {} ms",
        left.as_millis()
    );
    let started = Instant::now();
    tokio::time::sleep(Duration::from_millis(delay_ms)).await;
    Ok(ChatResponse {
        id: "mock-1".into(),
        model: req.model,
        provider: "mock".into(),
        choices: vec![Choice {
            index: 0,
            text: format!("answered after {delay_ms} ms"),
            tool_calls: vec![],
            finish_reason: FinishReason::Stop,
        }],
        usage: Usage::default(),
        latency: started.elapsed(),
        attempts: vec![],
    })
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let budget = Duration::from_millis(300);
    let svc = ServiceBuilder::new()
        .llm_deadline(budget)
        .service(service_fn(mock_provider));
    println!(
        "tower-llm quickstart: DeadlineLayer with a {} ms budget\n",
        budget.as_millis()
    );

    let cases: [(&str, &str, Option<Duration>); 3] = [
        ("fast provider", "reply in 20ms", None),
        ("hung provider", "reply in 5000ms", None),
        (
            "caller deadline 100 ms",
            "reply in 200ms",
            Some(Duration::from_millis(100)),
        ),
    ];
    for (name, prompt, caller_deadline) in cases {
        println!("{name}:");
        let mut req = ChatRequest::new("mock-model", vec![Message::user(prompt)]);
        if let Some(d) = caller_deadline {
            req.extensions.insert(Deadline::after(d));
        }
        let started = Instant::now();
        let result = svc.clone().oneshot(req).await;
        let took = started.elapsed().as_millis();
        match result {
            Ok(res) => println!("  ok in {took} ms: {:?}\n", res.text()),
            Err(err) => println!(
                "  error in {took} ms: {err} (class {})\n",
                err.class().as_metric_label()
            ),
        }
    }
}
