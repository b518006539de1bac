//! The stack inside an axum handler: a policy (TOML) names two providers
//! and a route; `Policy::build_route` turns the route into the stack
//! (deadline → fallback → retry → breaker → providers); the handler builds
//! a `ChatRequest`, calls it, and maps the outcome to HTTP (failures with
//! the library's `failure_status`).
//!
//! ```text
//! cargo run -p tower-llm-gateway --example axum_handler
//! ```
//!
//! It starts two mock providers (the primary answers 503 three times, so
//! the call fails over to the backup), serves the app
//! on loopback, calls it once as a client would, prints the answer, exits.
//! `tower-llm-gateway/tests/gateway/examples.rs` runs it and checks the answer.

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use tower::ServiceExt;
use tower_llm::config::{Policy, RouteService};
use tower_llm::prelude::*;
use tower_llm::providers::ApiKey;
use tower_llm::providers::https::client_with_connect_timeout;
use tower_llm::providers::openai::server::failure_status;
use tower_llm::{GenAiMetrics, Metrics};
use tower_llm_providers::mock::{MockServer, Reply};

/// The route's stack (boxed, so the handler's state has a nameable type).
type Llm = RouteService<ChatResponse>;

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
        Err(e) => (
            failure_status(&e).0,
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
/// (`tower-llm-gateway/tests/gateway/examples.rs` runs this and checks it).
pub async fn run() -> Result<Outcome, Box<dyn std::error::Error>> {
    let primary = MockServer::start(Reply::openai_text("Hello from the primary")).await?;
    primary.push(Reply::openai_error(503, "server_error", "busy"));
    primary.push(Reply::openai_error(503, "server_error", "busy"));
    primary.push(Reply::openai_error(503, "server_error", "busy"));
    let backup = MockServer::start(Reply::anthropic_text("Hello from the backup")).await?;

    let policy = Policy::from_toml(&format!(
        r#"
        [deadline]
        total_ms = 20000

        [[providers]]
        name = "openai"
        kind = "openai"
        base_url = "{}/v1"
        api_key_env = "OPENAI_API_KEY"

        [[providers]]
        name = "anthropic"
        kind = "anthropic"
        base_url = "{}"
        api_key_env = "ANTHROPIC_API_KEY"

        [[routes]]
        model = "smart"
        chain = [{{ provider = "openai", model = "gpt-4o-mini" }}, {{ provider = "anthropic", model = "claude-sonnet-4-5" }}]
        "#,
        primary.url(),
        backup.url()
    ))?;
    // Each provider's service (the mocks take any key), then the route.
    let client = client_with_connect_timeout(Duration::from_secs(5));
    let mut services = std::collections::HashMap::new();
    for provider in &policy.providers {
        let built = provider.services(
            Some(ApiKey::new("mock")),
            client.clone(),
            policy.stream,
            &GenAiMetrics::global(),
            None,
        )?;
        services.insert(provider.name.clone(), built.chat);
    }
    let route = policy.route("smart").ok_or("no route")?;
    let llm: Llm = policy.build_route(route, &BreakerLayer::new(), Metrics::global(), |p, _| {
        services[&p.name].clone()
    })?;

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
