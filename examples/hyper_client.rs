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
//! every attempt is printed.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::time::Instant;
use tower::{ServiceBuilder, ServiceExt};
use tower_llm::Attempts;
use tower_llm::breaker::AuthorityKey;
use tower_llm::prelude::*;
use tower_llm_providers::mock::{MockServer, Reply};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
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
    let req = http::Request::get(format!("{}/v1/models", upstream.url())).body(Empty::new())?;
    let res = svc.oneshot(req).await?;
    println!("status {} after {:?}", res.status(), start.elapsed());
    if let Some(Attempts(attempts)) = res.extensions().get::<Attempts>() {
        for a in attempts {
            println!(
                "  attempt {} on {}: {:?} (HTTP {:?}) in {:?}",
                a.attempt,
                a.provider,
                a.status(),
                a.http_status,
                a.elapsed
            );
        }
    }
    let body = res.into_body().collect().await?.to_bytes();
    println!("body {}", String::from_utf8_lossy(&body));
    Ok(())
}
