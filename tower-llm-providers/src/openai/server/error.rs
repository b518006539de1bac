//! Failed calls out: a [`Failure`] as an HTTP answer or a server-sent
//! event in OpenAI's error shape.

use serde_json::{Value, json};
use tower_llm_core::{Failure, FailureClass};

/// An OpenAI error body: `{"error": {"message", "type", "code"}}`.
pub fn encode_error(message: &str, kind: &str, code: Option<&str>) -> Value {
    json!({"error": {"message": message, "type": kind, "param": null, "code": code}})
}

/// The HTTP status and OpenAI error `type` a failed call is answered
/// with, by its class:
///
/// | failure | status | `type` |
/// |---|---|---|
/// | deadline exceeded | 504 | `timeout` |
/// | conflict (e.g. `idempotency_key_in_use`) | 409 | `conflict` |
/// | bad request raised by a layer (no provider) with its own status 422 (e.g. `idempotency_key_reused`) | 422 | `invalid_request_error` |
/// | bad request, context window exceeded, content filtered | 400 | `invalid_request_error` |
/// | auth, not found (our credentials or model names), invalid response, cancelled | 502 | `upstream_error` |
/// | cost budget exhausted (the call's `max_total_cost` cannot cover another attempt) | 402 | `budget_exceeded` |
/// | tenant quota exhausted (the tenant's spend or tokens for the window) | 429 | `quota_exceeded` |
/// | every other class (transient, rate limited, timeout, quota, circuit open) | 503 | `service_unavailable` |
///
/// When every link of a fallback chain failed
/// ([`Failure::is_all_links_failed`]) the answer is 503 whatever the
/// last class, except a deadline (504), a budget (402) or a quota (429):
/// the call ended because nothing left could be paid for.
///
/// ```
/// use tower_llm_core::{Failure, FailureClass};
/// use tower_llm_providers::openai::server::failure_status;
///
/// let (status, kind) = failure_status(&Failure::deadline_exceeded());
/// assert_eq!((status.as_u16(), kind), (504, "timeout"));
/// assert_eq!(failure_status(&Failure::new(FailureClass::Auth)).0, 502);
/// let reused = Failure::new(FailureClass::BadRequest)
///     .with_status(http::StatusCode::UNPROCESSABLE_ENTITY);
/// assert_eq!(failure_status(&reused).0, 422);
/// // An upstream's 422 stays a 400.
/// let upstream = Failure::new(FailureClass::BadRequest)
///     .with_status(http::StatusCode::UNPROCESSABLE_ENTITY)
///     .with_provider("openai");
/// assert_eq!(failure_status(&upstream).0, 400);
/// ```
pub fn failure_status(f: &Failure) -> (http::StatusCode, &'static str) {
    use http::StatusCode;
    let (status, kind) = match f.class() {
        // A request the gateway itself refused as unprocessable (no
        // provider: not an upstream's answer), such as the idempotency
        // layer's `idempotency_key_reused`: its own 422.
        FailureClass::BadRequest
            if f.provider().is_none()
                && f.http_status() == Some(StatusCode::UNPROCESSABLE_ENTITY) =>
        {
            (StatusCode::UNPROCESSABLE_ENTITY, "invalid_request_error")
        }
        FailureClass::DeadlineExceeded => (StatusCode::GATEWAY_TIMEOUT, "timeout"),
        FailureClass::Conflict => (StatusCode::CONFLICT, "conflict"),
        FailureClass::BadRequest
        | FailureClass::ContextWindowExceeded
        | FailureClass::ContentFiltered => (StatusCode::BAD_REQUEST, "invalid_request_error"),
        // Our credentials or our model names: the gateway's fault, not
        // the client's.
        FailureClass::Auth
        | FailureClass::NotFound
        | FailureClass::InvalidResponse
        | FailureClass::Cancelled => (StatusCode::BAD_GATEWAY, "upstream_error"),
        FailureClass::CostBudgetExhausted => (StatusCode::PAYMENT_REQUIRED, "budget_exceeded"),
        FailureClass::TenantQuotaExhausted => (StatusCode::TOO_MANY_REQUESTS, "quota_exceeded"),
        _ => (StatusCode::SERVICE_UNAVAILABLE, "service_unavailable"),
    };
    let ours = [
        StatusCode::GATEWAY_TIMEOUT,
        StatusCode::PAYMENT_REQUIRED,
        StatusCode::TOO_MANY_REQUESTS,
    ];
    if f.is_all_links_failed() && !ours.contains(&status) {
        (StatusCode::SERVICE_UNAVAILABLE, "service_unavailable")
    } else {
        (status, kind)
    }
}

/// A failed call as an HTTP answer in OpenAI's error shape: the status
/// and `type` of [`failure_status`], the failure's message, its class
/// label as the `code`, and on a 503 or 429 a `Retry-After` (whole
/// seconds, at least 1) when the failure knows one, and on a 502
/// `x-should-retry: false` (the SDKs' own retries would meet the same
/// refusal). Any server (axum, hyper) can send it as it is.
///
/// ```
/// use std::time::Duration;
/// use tower_llm_core::{Failure, FailureClass};
/// use tower_llm_providers::openai::server::failure_response;
///
/// let f = Failure::new(FailureClass::RateLimited).with_retry_after(Duration::from_millis(1500));
/// let res = failure_response(&f);
/// assert_eq!(res.status(), 503);
/// assert_eq!(res.headers()["retry-after"], "2");
/// assert_eq!(res.headers()["content-type"], "application/json");
///
/// // A 502 (our credentials or model names refused upstream) tells the
/// // client's SDK not to retry.
/// let f = Failure::new(FailureClass::Auth).with_provider("openai");
/// assert_eq!(failure_response(&f).headers()["x-should-retry"], "false");
/// ```
pub fn failure_response(f: &Failure) -> http::Response<http_body_util::Full<bytes::Bytes>> {
    let (status, kind) = failure_status(f);
    let body = encode_error(
        f.message().unwrap_or("the call failed"),
        kind,
        Some(f.class().as_metric_label()),
    );
    let mut res = http::Response::new(http_body_util::Full::new(bytes::Bytes::from(
        body.to_string(),
    )));
    *res.status_mut() = status;
    res.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    if status == http::StatusCode::SERVICE_UNAVAILABLE
        || status == http::StatusCode::TOO_MANY_REQUESTS
    {
        if let Some(wait) = f.retry_after() {
            let secs = (wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).max(1);
            res.headers_mut()
                .insert(http::header::RETRY_AFTER, http::HeaderValue::from(secs));
        }
    }
    // A 502 is our side's fault upstream (our credentials, our model
    // names): the SDKs' automatic retries cannot help.
    if status == http::StatusCode::BAD_GATEWAY {
        res.headers_mut()
            .insert("x-should-retry", http::HeaderValue::from_static("false"));
    }
    res
}

/// The server-sent event of a failure after a stream's commit point:
/// `data: {"error": {...}}` with the class label as its `code`.
pub fn sse_error_event(f: &Failure) -> bytes::Bytes {
    let body = encode_error(
        f.message().unwrap_or("the stream failed"),
        "stream_error",
        Some(f.class().as_metric_label()),
    );
    bytes::Bytes::from(format!("data: {body}\n\n"))
}
