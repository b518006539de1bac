//! `POST /v1/chat/completions` and `POST /v1/messages`: reading the body,
//! admitting the call, running the route's stack, answering in the
//! client's format.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;
use tower::ServiceExt;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::Gateway;
use crate::server::Connection;

use super::answer::{
    Held, Holding, MAX_REQUEST_BODY, failure_response, insert_answer_flags, insert_attempts,
    insert_cache, insert_cost, overloaded, too_large, unknown_route,
};
use super::inbound::Inbound;
use super::sse::sse;

/// The W3C trace context of an inbound request, if it carries one.
fn inbound_context(headers: &HeaderMap) -> Option<opentelemetry::Context> {
    struct Extract<'a>(&'a HeaderMap);
    impl opentelemetry::propagation::Extractor for Extract<'_> {
        fn get(&self, key: &str) -> Option<&str> {
            // W3C trace context is ASCII by its spec; anything else is no
            // context (it scopes no state).
            self.0.get(key).and_then(|v| v.to_str().ok())
        }
        fn keys(&self) -> Vec<&str> {
            self.0.keys().map(http::HeaderName::as_str).collect()
        }
    }
    headers.get("traceparent")?;
    Some(TraceContextPropagator::new().extract(&Extract(headers)))
}

/// Reads a request body within `server.body_read_timeout_ms` (408), the
/// 1 MiB cap (413) and the gateway-wide `server.max_body_bytes_in_flight`
/// (503): each chunk takes its bytes from that budget as it arrives, so a
/// client trickling a body holds only what it has sent.
pub(super) async fn read_body(
    gw: &Gateway,
    body: Body,
    inbound: Inbound,
) -> Result<(Bytes, Option<OwnedSemaphorePermit>), Response> {
    use http_body_util::BodyExt as _;
    let mut held: Option<OwnedSemaphorePermit> = None;
    let mut chunks: Vec<Bytes> = Vec::new();
    let mut len = 0_usize;
    let read = async {
        let mut body = body;
        while let Some(frame) = body.frame().await {
            let frame = match frame {
                Ok(frame) => frame,
                Err(e) if is_length_limit(&e) => return Err(too_large(inbound)),
                Err(_) => {
                    return Err(inbound.error(
                        StatusCode::BAD_REQUEST,
                        "the request body could not be read",
                        "invalid_request_error",
                        None,
                    ));
                }
            };
            let Ok(data) = frame.into_data() else {
                continue; // trailers
            };
            len += data.len();
            if len > MAX_REQUEST_BODY {
                return Err(too_large(inbound));
            }
            let n = u32::try_from(data.len()).unwrap_or(u32::MAX);
            let Ok(bytes) = gw.body_bytes.clone().try_acquire_many_owned(n) else {
                return Err(overloaded(inbound, "request bytes in flight"));
            };
            match &mut held {
                Some(h) => h.merge(bytes),
                None => held = Some(bytes),
            }
            chunks.push(data);
        }
        Ok(())
    };
    match tokio::time::timeout(gw.server.body_read_timeout(), read).await {
        Ok(Ok(())) => {}
        Ok(Err(res)) => return Err(res),
        Err(_) => {
            return Err(inbound.error(
                StatusCode::REQUEST_TIMEOUT,
                "the request body did not arrive in time",
                "invalid_request_error",
                Some("request_timeout"),
            ));
        }
    }
    // One chunk (the usual case) is used as it is; several are joined once.
    let body = if chunks.len() == 1 {
        chunks.pop().unwrap_or_default()
    } else {
        let mut joined = Vec::with_capacity(len);
        for chunk in chunks {
            joined.extend_from_slice(&chunk);
        }
        Bytes::from(joined)
    };
    Ok((body, held))
}

/// `POST /v1/chat/completions`: OpenAI's Chat Completions.
pub(super) async fn chat(
    State(gw): State<Arc<Gateway>>,
    conn: Option<axum::Extension<Connection>>,
    req: axum::extract::Request,
) -> Response {
    serve(gw, conn, req, Inbound::OpenAi).await
}

/// `POST /v1/messages`: Anthropic's Messages, routed like chat (the
/// `model` names a route), answered in Anthropic's format whatever
/// upstream served.
pub(super) async fn messages(
    State(gw): State<Arc<Gateway>>,
    conn: Option<axum::Extension<Connection>>,
    req: axum::extract::Request,
) -> Response {
    serve(gw, conn, req, Inbound::Anthropic).await
}

/// A chat call in the client's format (`inbound`).
///
/// The body is read within `server.body_read_timeout_ms` (408), the 1 MiB
/// cap (413) and the gateway-wide byte budget (503); the call then takes
/// one of `server.max_in_flight` slots (none free: 503) and holds it, with
/// its body's bytes, until its answer has been sent. No copy of the body is
/// kept once it is decoded.
async fn serve(
    gw: Arc<Gateway>,
    conn: Option<axum::Extension<Connection>>,
    req: axum::extract::Request,
    inbound: Inbound,
) -> Response {
    let (parts, body) = req.into_parts();
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
    let (req, include_usage) = match inbound.decode(&body) {
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
    let mut req = req;
    // In-flight calls keep the routes they started with.
    let routes = gw.routes.load_full();
    // `Idempotency-Key`: answered once, replayed after, with
    // `[idempotency]`; without it the header is ignored, whatever it holds.
    if routes.policy.idempotency.is_some() {
        if let Some(value) = parts.headers.get("idempotency-key") {
            let Ok(key) = value.to_str() else {
                return inbound.error(
                    StatusCode::BAD_REQUEST,
                    "the Idempotency-Key header is not printable ASCII",
                    "invalid_request_error",
                    Some("invalid_idempotency_key"),
                );
            };
            tower_llm::IdempotencyKey::new(key).store(&mut req);
        }
    }
    let parent = inbound_context(&parts.headers);
    // For the links' admission rules (`admit` in the policy file); moved,
    // not copied.
    req.extensions
        .insert(tower_llm::config::InboundHeaders(parts.headers));
    drop(body);
    let Some(info) = routes.info.get(&*req.model).cloned() else {
        return unknown_route(inbound, &req.model);
    };
    // A tenant id is counted (and kept) by the quota store: bounded.
    if routes.policy.quotas.is_some()
        && req
            .extensions
            .get::<tower_llm::config::InboundHeaders>()
            .and_then(|h| h.0.get(tower_llm::config::TENANT_HEADER))
            .is_some_and(|v| v.len() > MAX_TENANT_BYTES)
    {
        return inbound.error(
            StatusCode::BAD_REQUEST,
            "the x-tenant-id header is longer than 256 bytes",
            "invalid_request_error",
            Some("invalid_tenant"),
        );
    }
    // `x-llm-max-cost`: the caller's budget for this call, which can
    // lower the route's (`Budget::store` keeps the lower), never raise it.
    if let Some(value) = req
        .extensions
        .get::<tower_llm::config::InboundHeaders>()
        .and_then(|h| h.0.get(MAX_COST_HEADER))
    {
        match value
            .to_str()
            .ok()
            .and_then(|v| v.parse::<tower_llm::Cost>().ok())
        {
            Some(limit) if info.priced => {
                tower_llm::Budget::new(limit).store(&mut req);
            }
            Some(_) => {
                return inbound.error(
                    StatusCode::BAD_REQUEST,
                    "this route cannot hold a call to a budget: not every link it may call is priced ([prices]), or it has no max_output_tokens",
                    "invalid_request_error",
                    Some("invalid_max_cost"),
                );
            }
            None => {
                return inbound.error(
                    StatusCode::BAD_REQUEST,
                    "the x-llm-max-cost header is not an amount of dollars (like 0.05)",
                    "invalid_request_error",
                    Some("invalid_max_cost"),
                );
            }
        }
    }
    // The call's deadline, as the deadline layer counts it (from now).
    let deadline = Instant::now() + info.deadline;
    // A call with a trace context gets a span of its own target, for
    // `telemetry::TracedCallsOnly`.
    let span = match parent {
        Some(cx) => {
            let span = tracing::info_span!(
                target: crate::telemetry::TRACED_CALL_TARGET,
                "gateway.chat",
                route = %req.model,
                stream = req.stream
            );
            let _ = span.set_parent(cx);
            span
        }
        None => tracing::info_span!("gateway.chat", route = %req.model, stream = req.stream),
    };
    if req.stream {
        let Some(svc) = routes.stream.get(&*req.model).cloned() else {
            return unknown_route(inbound, &req.model);
        };
        drop(routes);
        let result = svc.oneshot(req).instrument(span).await;
        match &result {
            // A replay made no attempt: its records are the first call's.
            Ok(stream) if stream.is_idempotent_replay() => {}
            Ok(stream) => gw.status.observe(stream.attempts(), true),
            Err(f) => gw.status.observe(f.attempts(), true),
        }
        match result {
            Ok(stream) => sse(
                gw.clone(),
                stream,
                inbound,
                include_usage,
                deadline,
                conn.map(|c| c.0),
                held,
                &info,
            ),
            Err(f) => failure_response(inbound, &f),
        }
    } else {
        let Some(svc) = routes.unary.get(&*req.model).cloned() else {
            return unknown_route(inbound, &req.model);
        };
        drop(routes);
        let result = svc.oneshot(req).instrument(span).await;
        match &result {
            Ok(res) if res.idempotent_replayed => {}
            Ok(res) => gw.status.observe(&res.attempts, false),
            Err(f) => gw.status.observe(f.attempts(), false),
        }
        match result {
            Ok(res) => {
                let json = inbound.write(&res, &res.model);
                let mut out = Response::new(Body::new(Holding {
                    body: http_body_util::Full::new(Bytes::from(json)),
                    _held: held,
                }));
                out.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                );
                // A degraded answer was served by no link.
                let position = (!res.degraded).then_some(res.fallback_position);
                insert_attempts(out.headers_mut(), &res.attempts, position, Some(&info));
                insert_cost(out.headers_mut(), &res.attempts);
                insert_answer_flags(out.headers_mut(), &res.attempts, res.idempotent_replayed);
                insert_cache(out.headers_mut(), res.cache);
                if res.degraded {
                    out.headers_mut()
                        .insert("x-llm-degraded", HeaderValue::from_static("true"));
                }
                out
            }
            Err(f) => failure_response(inbound, &f),
        }
    }
}

/// The longest tenant id (`x-tenant-id`) a gateway with `[quotas]` takes.
pub(crate) const MAX_TENANT_BYTES: usize = 256;

/// The header with which a caller lowers a call's cost budget.
pub(crate) const MAX_COST_HEADER: &str = "x-llm-max-cost";

/// `true` when `e` is the body cap's error.
fn is_length_limit(e: &axum::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if err.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        source = err.source();
    }
    false
}
