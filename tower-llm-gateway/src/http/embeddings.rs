//! `POST /v1/embeddings`: OpenAI's Embeddings, through the route's
//! embeddings stack (deadline, fallback, retry, breaker).

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use tower::ServiceExt;
use tower_llm::providers::openai::server::{decode_embedding_request, write_embeddings};
use tracing::Instrument;

use crate::Gateway;

use super::answer::{Held, Holding, failure_response, insert_attempts, overloaded, unknown_route};
use super::chat::read_body;
use super::inbound::Inbound;

/// `POST /v1/embeddings`: the `model` names a route; the route serves
/// embeddings when every link it may call is a provider with an
/// embeddings API (OpenAI, Azure OpenAI), else 400
/// (`embeddings_not_supported`). The body is read, and the call admitted,
/// as for chat.
pub(super) async fn embeddings(
    State(gw): State<Arc<Gateway>>,
    req: axum::extract::Request,
) -> Response {
    let inbound = Inbound::OpenAi;
    let body = req.into_body();
    let (body, body_bytes) = match read_body(&gw, body, inbound).await {
        Ok(read) => read,
        Err(res) => return res,
    };
    let Ok(slot) = gw.in_flight.clone().try_acquire_owned() else {
        return overloaded(inbound, "calls in flight");
    };
    let held = Held {
        _slot: slot,
        _body: body_bytes,
    };
    let (req, format) = match decode_embedding_request(&body) {
        Ok(read) => read,
        Err(f) => {
            return inbound.error(
                StatusCode::BAD_REQUEST,
                f.message().unwrap_or("invalid request"),
                "invalid_request_error",
                None,
            );
        }
    };
    drop(body);
    let routes = gw.routes.load_full();
    let Some(info) = routes.info.get(&*req.model).cloned() else {
        return unknown_route(inbound, &req.model);
    };
    let Some(svc) = routes.embeddings.get(&*req.model).cloned() else {
        return inbound.error(
            StatusCode::BAD_REQUEST,
            &format!(
                "route \"{}\" does not serve embeddings: every link it may call must be a provider with an embeddings API (openai, azure), and none a pool",
                req.model
            ),
            "invalid_request_error",
            Some("embeddings_not_supported"),
        );
    };
    drop(routes);
    let alias = req.model.clone();
    let span = tracing::info_span!("gateway.embeddings", route = %alias, inputs = req.input.len());
    let result = svc.oneshot(req).instrument(span).await;
    match &result {
        Ok(res) => gw.status.observe(&res.attempts, false),
        Err(f) => gw.status.observe(f.attempts(), false),
    }
    match result {
        Ok(res) => {
            let json = write_embeddings(&res, &alias, format);
            let mut out = Response::new(Body::new(Holding {
                body: http_body_util::Full::new(Bytes::from(json)),
                _held: held,
            }));
            out.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            let position = res
                .attempts
                .iter()
                .rev()
                .find(|a| a.outcome == tower_llm::AttemptOutcome::Succeeded)
                .map(|a| a.fallback_position);
            insert_attempts(out.headers_mut(), &res.attempts, position, Some(&info));
            out
        }
        Err(f) => failure_response(inbound, &f),
    }
}
