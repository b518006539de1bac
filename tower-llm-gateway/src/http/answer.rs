//! Shaping answers: OpenAI's error JSON, the `x-llm-*` headers, and the
//! per-call resources an answer holds until it is sent.

use std::time::{SystemTime, UNIX_EPOCH};

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tokio::sync::OwnedSemaphorePermit;
use tower_llm::cache::{CacheOutcome, CacheStatus};
use tower_llm::providers::openai::server::encode_error;
use tower_llm::{AttemptOutcome, AttemptRecord, Failure};

use super::inbound::Inbound;
use crate::routes::RouteInfo;

/// An OpenAI-shaped error answer (for the operational endpoints).
pub(super) fn error(status: StatusCode, message: &str, kind: &str, code: Option<&str>) -> Response {
    (status, axum::Json(encode_error(message, kind, code))).into_response()
}

/// How a failed call is answered: the library's mapping for the client's
/// format ([`failure_response`](tower_llm::providers::openai::server::failure_response)
/// or Anthropic's), plus `x-llm-attempts` and `x-llm-cost`.
pub(super) fn failure_response(inbound: Inbound, f: &Failure) -> Response {
    let mut res = inbound.failure(f);
    insert_attempts(res.headers_mut(), f.attempts(), None, None);
    insert_cost(res.headers_mut(), f.attempts());
    res
}

/// `x-llm-cost`: what the call's priced attempts cost, in dollars, when
/// any attempt was priced (a unary answer, or a failure; a stream's last
/// attempt settles after its headers, so streams do not carry it).
pub(super) fn insert_cost(headers: &mut HeaderMap, attempts: &[AttemptRecord]) {
    let mut priced = attempts.iter().filter_map(|a| a.cost).peekable();
    if priced.peek().is_none() {
        return;
    }
    let total = priced.fold(tower_llm::Cost::ZERO, tower_llm::Cost::saturating_add);
    if let Ok(v) = HeaderValue::from_str(&total.to_string()) {
        headers.insert("x-llm-cost", v);
    }
}

/// `x-llm-attempts`, and for an answer `x-llm-provider` and
/// `x-llm-model-used`: the provider and model of the link that served it,
/// as the policy names them (never the upstream's own model name, which
/// stays in the body: header values come from configuration only); and
/// `x-llm-requires-verification: true` when that link is marked
/// `requires_verification`.
pub(super) fn insert_attempts(
    headers: &mut HeaderMap,
    attempts: &[AttemptRecord],
    position: Option<u8>,
    route: Option<&RouteInfo>,
) {
    headers.insert("x-llm-attempts", HeaderValue::from(attempts.len()));
    let Some(position) = position else {
        return;
    };
    // The attempt that served: the one that succeeded (a hedge onto
    // another link serves in its own name), else the last at the
    // answer's position.
    let Some(served) = attempts
        .iter()
        .rev()
        .find(|a| a.outcome == AttemptOutcome::Succeeded)
        .or_else(|| {
            attempts
                .iter()
                .rev()
                .find(|a| a.fallback_position == position)
        })
    else {
        return;
    };
    if let Ok(v) = HeaderValue::from_str(&served.provider) {
        headers.insert("x-llm-provider", v);
    }
    if let Ok(v) = HeaderValue::from_str(&served.model) {
        headers.insert("x-llm-model-used", v);
    }
    if route.is_some_and(|r| {
        r.verify
            .iter()
            .any(|(p, m)| **p == *served.provider && **m == *served.model)
    }) {
        headers.insert(
            "x-llm-requires-verification",
            HeaderValue::from_static("true"),
        );
    }
}

/// `x-llm-hedged: true` when a hedge attempt served the answer (a
/// succeeded attempt record marked `hedge`), and `Idempotent-Replayed:
/// true` for an answer replayed from the idempotency store.
pub(super) fn insert_answer_flags(
    headers: &mut HeaderMap,
    attempts: &[AttemptRecord],
    replayed: bool,
) {
    if attempts
        .iter()
        .any(|a| a.hedge && a.outcome == AttemptOutcome::Succeeded)
    {
        headers.insert("x-llm-hedged", HeaderValue::from_static("true"));
    }
    if replayed {
        headers.insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
}

/// What the route's response cache did: `x-llm-cache: hit | miss |
/// stale`, with `Age` (whole seconds since the answer was stored) on an
/// answer taken from the cache, and `x-llm-stale: true` on a stale one.
pub(super) fn insert_cache(headers: &mut HeaderMap, outcome: Option<CacheOutcome>) {
    let Some(outcome) = outcome else {
        return;
    };
    headers.insert(
        "x-llm-cache",
        HeaderValue::from_static(outcome.status.as_str()),
    );
    if outcome.is_from_cache() {
        headers.insert(header::AGE, HeaderValue::from(outcome.age_secs()));
    }
    if outcome.status == CacheStatus::Stale {
        headers.insert("x-llm-stale", HeaderValue::from_static("true"));
    }
}

pub(super) fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// What a call holds while it is served: its in-flight slot and the bytes
/// of its request body (released when its answer has been sent whole, or
/// dropped).
pub(super) struct Held {
    pub(super) _slot: OwnedSemaphorePermit,
    pub(super) _body: Option<OwnedSemaphorePermit>,
}

/// 503 with `Retry-After: 1`: a gateway-wide limit is reached.
pub(super) fn overloaded(inbound: Inbound, what: &str) -> Response {
    let mut res = inbound.error(
        StatusCode::SERVICE_UNAVAILABLE,
        &format!("the gateway is at its limit of {what}; retry shortly"),
        "service_unavailable",
        Some("overloaded"),
    );
    res.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    res
}

/// An answer's body that holds the call's [`Held`] until it has been sent
/// whole (or dropped).
pub(super) struct Holding<B> {
    pub(super) body: B,
    pub(super) _held: Held,
}

impl<B: http_body::Body + Unpin> http_body::Body for Holding<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// 404 (`model_not_found`): no route is named `alias`.
pub(super) fn unknown_route(inbound: Inbound, alias: &str) -> Response {
    inbound.error(
        StatusCode::NOT_FOUND,
        &format!("no route for model \"{alias}\""),
        "invalid_request_error",
        Some("model_not_found"),
    )
}

/// The largest request body accepted (1 MiB): larger ones get 413.
pub const MAX_REQUEST_BODY: usize = 1024 * 1024;

/// 413.
pub(super) fn too_large(inbound: Inbound) -> Response {
    inbound.error(
        StatusCode::PAYLOAD_TOO_LARGE,
        &format!("request body over {MAX_REQUEST_BODY} bytes"),
        "invalid_request_error",
        Some("request_too_large"),
    )
}
