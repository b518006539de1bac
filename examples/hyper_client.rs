//! The layers around a plain hyper-util client on raw `http::Request`s,
//! classified by status code (`RetryLayer::http()`, `BreakerLayer::http()`
//! with per-authority circuits): no typed chat service involved.
//!
//! ```text
//! cargo run --example hyper_client
//! ```
//!
//! A mock upstream answers 503, then 429 with `Retry-After: 1`, then 200:
//! the first call is retried into the 200 (honouring the Retry-After), and
//! every attempt is printed. `tests/http/examples.rs` runs it and checks the
//! attempts.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::time::Instant;
use tower::{ServiceBuilder, ServiceExt};
use tower_llm::breaker::AuthorityKey;
use tower_llm::prelude::*;
use tower_llm::{Attempts, KeepAttempts};
use tower_llm_providers::mock::{MockServer, Reply};

/// What the call came back with.
#[derive(Debug)]
pub struct Outcome {
    /// The final HTTP status.
    pub status: http::StatusCode,
    /// How long the call took.
    pub elapsed: Duration,
    /// Its attempt records.
    pub attempts: Vec<tower_llm::AttemptRecord>,
    /// The final body.
    pub body: Bytes,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = run().await?;
    println!("status {} after {:?}", out.status, out.elapsed);
    for a in &out.attempts {
        println!(
            "  attempt {} on {}: {:?} (HTTP {:?}) in {:?}",
            a.attempt,
            a.provider,
            a.status(),
            a.http_status,
            a.elapsed
        );
    }
    println!("body {}", String::from_utf8_lossy(&out.body));
    Ok(())
}

/// Starts the mock upstream, makes the call, returns what came back
/// (`tests/http/examples.rs` runs this and checks it).
pub async fn run() -> Result<Outcome, Box<dyn std::error::Error>> {
    let upstream = MockServer::start(Reply::json(200, r#"{"ok": true}"#)).await?;
    upstream.push(Reply::json(503, r#"{"error": "overloaded"}"#));
    upstream.push(Reply::json(429, r#"{"error": "slow down"}"#).with_header("retry-after", "1"));

    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let svc = ServiceBuilder::new()
        .llm_deadline(Duration::from_secs(10))
        .llm_retry(RetryLayer::http().with_max_attempts(3))
        .llm_breaker(BreakerLayer::http().with_key_fn(AuthorityKey))
        .service(client);

    let start = Instant::now();
    let mut req = http::Request::get(format!("{}/v1/models", upstream.url())).body(Empty::new())?;
    // Ask for the attempt records on the response (they cost an extension
    // map, so an `http::Response` gets them only when asked).
    req.extensions_mut().insert(KeepAttempts);
    let res = svc.oneshot(req).await?;
    let status = res.status();
    let elapsed = start.elapsed();
    let attempts = match res.extensions().get::<Attempts>() {
        Some(Attempts(attempts)) => attempts.clone(),
        None => Vec::new(),
    };
    let body = res.into_body().collect().await?.to_bytes();
    Ok(Outcome {
        status,
        elapsed,
        attempts,
        body,
    })
}
