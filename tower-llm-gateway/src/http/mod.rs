//! The gateway's HTTP application: the routes and the tower-http layers
//! around them.

mod answer;
mod chat;
mod embeddings;
mod inbound;
mod ops;
mod sse;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::http::{HeaderValue, StatusCode};
use axum::response::Response;
use axum::routing::{get, post};
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::request_id::{
    MakeRequestId, PropagateRequestIdLayer, RequestId, SetRequestIdLayer,
};
use tower_http::trace::TraceLayer;

use crate::Gateway;

pub use self::answer::MAX_REQUEST_BODY;
use self::answer::{error, too_large};
use self::chat::{chat, messages};
use self::embeddings::embeddings;
use self::inbound::Inbound;
use self::ops::{circuits, metrics, model, models, providers};

impl Gateway {
    /// The HTTP application: the routes and the tower-http layers
    /// (request ids, tracing, a body limit, panic catching).
    pub fn router(self: Arc<Self>) -> Router {
        Router::new()
            .route("/v1/chat/completions", post(chat))
            .route("/v1/messages", post(messages))
            .route("/v1/embeddings", post(embeddings))
            .route("/v1/models", get(models))
            .route("/v1/models/{*id}", get(model))
            .route("/metrics", get(metrics))
            .route(
                "/health",
                get(|| async { axum::Json(serde_json::json!({"status": "ok"})) }),
            )
            .route(
                "/health/circuits",
                get(circuits).post(crate::admin::control),
            )
            .route("/health/providers", get(providers))
            .route("/status", get(crate::status::page))
            .with_state(self)
            .layer(
                tower::ServiceBuilder::new()
                    .layer(SetRequestIdLayer::x_request_id(Counter::default()))
                    .layer(PropagateRequestIdLayer::x_request_id())
                    // A failed call is an outcome the metrics count
                    // (`ai_router_calls_total{outcome}`) and `/status`
                    // shows, not an error of the gateway: tower-http's
                    // default would log every 5xx at ERROR.
                    .layer(TraceLayer::new_for_http().on_failure(
                        tower_http::trace::DefaultOnFailure::new().level(tracing::Level::DEBUG),
                    ))
                    .layer(CatchPanicLayer::custom(|_panic| {
                        error(
                            StatusCode::INTERNAL_SERVER_ERROR,
                            "internal error",
                            "server_error",
                            None,
                        )
                    }))
                    .layer(axum::middleware::from_fn(shape_413))
                    .layer(RequestBodyLimitLayer::new(MAX_REQUEST_BODY)),
            )
    }
}

/// Request ids from a counter.
#[derive(Clone, Default)]
struct Counter(Arc<AtomicU64>);

impl MakeRequestId for Counter {
    fn make_request_id<B>(&mut self, _req: &http::Request<B>) -> Option<RequestId> {
        let n = self.0.fetch_add(1, Ordering::Relaxed);
        HeaderValue::from_str(&format!("req-{n}"))
            .ok()
            .map(RequestId::new)
    }
}

/// The body limit's 413 (from the layer, or from the handler's body
/// reader for a chunked body) in the error shape of the API the path
/// speaks (Anthropic's for `/v1/messages`, else OpenAI's).
async fn shape_413(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let inbound = Inbound::of_path(req.uri().path());
    let res = next.run(req).await;
    if res.status() != StatusCode::PAYLOAD_TOO_LARGE {
        return res;
    }
    too_large(inbound)
}
