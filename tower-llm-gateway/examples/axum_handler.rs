//! The stack inside an axum handler: the handler builds a `ChatRequest`,
//! calls the stack (deadline → fallback → retry → breaker → providers) and
//! maps the outcome to HTTP.
//!
//! ```text
//! cargo run -p tower-llm-gateway --example axum_handler
//! ```
//!
//! It starts two mock providers (the primary answers 503 three times, so
//! the call fails over to the backup), serves the app
//! on loopback, calls it once as a client would, prints the answer, exits.
//! `tower-llm-gateway/tests/examples.rs` runs it and checks the answer.

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use tower::util::BoxCloneSyncService;
use tower::{ServiceBuilder, ServiceExt};
use tower_llm::prelude::*;
use tower_llm::providers::https::client_with_connect_timeout;
use tower_llm::providers::{Anthropic, AnthropicConfig, ApiKey, OpenAi, OpenAiConfig};
use tower_llm_providers::mock::{MockServer, Reply};

/// The stack, boxed so the handler's state has a nameable type.
type Llm = BoxCloneSyncService<ChatRequest, ChatResponse, Failure>;

#[derive(serde::Deserialize)]
struct Ask {
    question: String,
}

/// `POST /ask {"question": "..."}` → `{"answer", "served_by", "attempts"}`.
async fn ask(
    State(llm): State<Llm>,
    Json(ask): Json<Ask>,
) -> (StatusCode, Json<serde_json::Value>) {
    let req = ChatRequest::new("smart", vec![Message::user(ask.question)]);
    match llm.oneshot(req).await {
        Ok(res) => (
            StatusCode::OK,
            Json(serde_json::json!({
                "answer": res.text(),
                "served_by": res.provider.to_string(),
                "attempts": res.attempts.len(),
            })),
        ),
        Err(e) if e.is_deadline_exceeded() => (
            StatusCode::GATEWAY_TIMEOUT,
            Json(serde_json::json!({"error": e.to_string()})),
        ),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(serde_json::json!({"error": e.to_string(), "class": e.class().as_metric_label()})),
        ),
    }
}

/// The answer the client got: status and JSON body.
#[derive(Debug)]
pub struct Outcome {
    /// The HTTP status of `POST /ask`.
    pub status: StatusCode,
    /// Its JSON body.
    pub body: serde_json::Value,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = run().await?;
    println!("POST /ask -> {}: {}", out.status, out.body);
    Ok(())
}

/// Starts the mock providers and the app, asks once, returns the answer
/// (`tower-llm-gateway/tests/examples.rs` runs this and checks it).
pub async fn run() -> Result<Outcome, Box<dyn std::error::Error>> {
    let primary = MockServer::start(Reply::openai_text("Hello from the primary")).await?;
    primary.push(Reply::openai_error(503, "server_error", "busy"));
    primary.push(Reply::openai_error(503, "server_error", "busy"));
    primary.push(Reply::openai_error(503, "server_error", "busy"));
    let backup = MockServer::start(Reply::anthropic_text("Hello from the backup")).await?;

    let client = client_with_connect_timeout(Duration::from_secs(5));
    let openai = OpenAi::new(
        client.clone(),
        OpenAiConfig::new(ApiKey::new("mock")).with_base_url(&format!("{}/v1", primary.url())),
    );
    let anthropic = Anthropic::new(
        client,
        AnthropicConfig::new(ApiKey::new("mock")).with_base_url(&backup.url()),
    );
    let breaker = BreakerLayer::new();
    let retry = RetryLayer::new().with_max_attempts(3);
    let backup_link = ServiceBuilder::new()
        .llm_retry(retry.clone())
        .llm_breaker(breaker.clone())
        .service(anthropic);
    let chain = FallbackLayer::builder(LinkSpec::new("openai", "gpt-4o-mini").rewrite_model())
        .or(
            LinkSpec::new("anthropic", "claude-sonnet-4-5").rewrite_model(),
            backup_link,
        )
        .build()?;
    let llm: Llm = BoxCloneSyncService::new(
        ServiceBuilder::new()
            .llm_deadline(Duration::from_secs(20))
            .llm_fallback(chain)
            .llm_retry(retry)
            .llm_breaker(breaker)
            .service(openai),
    );

    let app = axum::Router::new().route("/ask", post(ask)).with_state(llm);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });

    // A client asks once.
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Full<bytes::Bytes>>();
    let req = http::Request::post(format!("http://{addr}/ask"))
        .header("content-type", "application/json")
        .body(http_body_util::Full::from(r#"{"question": "Hi?"}"#))?;
    let res = client.request(req).await?;
    let status = res.status();
    let body = http_body_util::BodyExt::collect(res.into_body())
        .await?
        .to_bytes();
    Ok(Outcome {
        status,
        body: serde_json::from_slice(&body)?,
    })
}
