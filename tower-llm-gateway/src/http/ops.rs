//! The model list and the operators' endpoints: `GET /v1/models`,
//! `/metrics`, `/health/circuits`, `/health/providers`.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::Gateway;

use super::answer::{error, unknown_route};

/// One entry of `GET /v1/models`: a route alias as an OpenAI model object.
fn model_object(id: &str) -> serde_json::Value {
    serde_json::json!({
        "id": id,
        "object": "model",
        "created": 0,
        "owned_by": "tower-llm",
    })
}

/// `GET /v1/models`: the running policy's route aliases (the `[[routes]]`
/// `model` names, which a reload changes), sorted by id, in OpenAI's list
/// shape.
pub(super) async fn models(State(gw): State<Arc<Gateway>>) -> Response {
    let routes = gw.routes.load();
    let mut ids: Vec<&str> = routes
        .policy
        .routes
        .iter()
        .map(|r| r.model.as_str())
        .collect();
    ids.sort_unstable();
    ids.dedup();
    let data: Vec<serde_json::Value> = ids.into_iter().map(model_object).collect();
    axum::Json(serde_json::json!({"object": "list", "data": data})).into_response()
}

/// `GET /v1/models/{id}`: the route alias `id` as an OpenAI model object,
/// or 404 (`model_not_found`) when the running policy has no such route.
/// The id may contain `/`.
pub(super) async fn model(
    State(gw): State<Arc<Gateway>>,
    id: Result<axum::extract::Path<String>, axum::extract::rejection::PathRejection>,
) -> Response {
    // A path that does not decode (not UTF-8) names no route either.
    let Ok(axum::extract::Path(id)) = id else {
        return error(
            StatusCode::NOT_FOUND,
            "no route for this model",
            "invalid_request_error",
            Some("model_not_found"),
        );
    };
    let routes = gw.routes.load();
    if routes.policy.routes.iter().any(|r| r.model == id) {
        axum::Json(model_object(&id)).into_response()
    } else {
        unknown_route(super::inbound::Inbound::OpenAi, &id)
    }
}

/// `GET /metrics`: the Prometheus text of every tower-llm metric.
pub(super) async fn metrics(State(gw): State<Arc<Gateway>>) -> Response {
    match prometheus::TextEncoder::new().encode_to_string(&gw.registry.gather()) {
        Ok(text) => ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// `GET /health/circuits`: every breaker key and its state.
pub(super) async fn circuits(State(gw): State<Arc<Gateway>>) -> Response {
    let circuits: Vec<serde_json::Value> = gw
        .breaker()
        .snapshot()
        .into_iter()
        .map(|c| {
            serde_json::json!({
                "provider": c.key.provider(),
                "model": c.key.model(),
                "scope": c.key.scope(),
                "state": c.state.as_metric_label(),
                "consecutive_failures": c.consecutive_failures,
                "retry_after_ms": c.retry_after.map(|d| d.as_millis()),
            })
        })
        .collect();
    axum::Json(circuits).into_response()
}

/// `GET /health/providers`: the last background probe of each provider.
pub(super) async fn providers(State(gw): State<Arc<Gateway>>) -> Response {
    axum::Json(gw.probes()).into_response()
}
