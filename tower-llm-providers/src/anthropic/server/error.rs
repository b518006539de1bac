//! Failed calls out: a [`Failure`] as an HTTP answer or a server-sent
//! event in Anthropic's error shape.

use http::StatusCode;
use serde::Serialize;
use serde_json::{Value, json};
use tower_llm_core::{Failure, FailureClass};

/// Anthropic's status for an overloaded API (not in `http`'s list).
const OVERLOADED: u16 = 529;

/// An Anthropic error body: `{"type": "error", "error": {"type": kind,
/// "message": message}}`.
///
/// ```
/// use tower_llm_providers::anthropic::server::encode_error;
///
/// let body = encode_error("rate_limit_error", "slow down");
/// assert_eq!(body["type"], "error");
/// assert_eq!(body["error"]["type"], "rate_limit_error");
/// assert_eq!(body["error"]["message"], "slow down");
/// ```
pub fn encode_error(kind: &str, message: &str) -> Value {
    json!({"type": "error", "error": {"type": kind, "message": message}})
}

/// The HTTP status and Anthropic error `type` a failed call is answered
/// with, by its class (the same statuses as
/// [`openai::server::failure_status`](crate::openai::server::failure_status),
/// with Anthropic's type names):
///
/// | failure | status | `type` |
/// |---|---|---|
/// | deadline exceeded | 504 | `timeout_error` |
/// | conflict (e.g. `idempotency_key_in_use`) | 409 | `invalid_request_error` |
/// | bad request raised by a layer (no provider) with its own status 422 (e.g. `idempotency_key_reused`) | 422 | `invalid_request_error` |
/// | bad request, context window exceeded, content filtered | 400 | `invalid_request_error` |
/// | auth, not found (our credentials or model names), invalid response, cancelled | 502 | `api_error` |
/// | cost budget exhausted (the call's `max_total_cost` cannot cover another attempt) | 402 | `billing_error` |
/// | tenant quota exhausted (the tenant's spend or tokens for the window) | 429 | `rate_limit_error` |
/// | every other class (transient, rate limited, timeout, quota, circuit open) | 503 | `overloaded_error` |
///
/// When every link of a fallback chain failed
/// ([`Failure::is_all_links_failed`]) the answer is 503
/// `overloaded_error` whatever the last class, except a deadline (504), a
/// budget (402) or a quota (429): the call ended because nothing left
/// could be paid for.
///
/// Anthropic's own error types are `invalid_request_error` (400, and
/// "other 4XX status codes"), `authentication_error` (401),
/// `billing_error` (402), `permission_error` (403), `not_found_error`
/// (404), `request_too_large` (413), `rate_limit_error` (429),
/// `api_error` (500), `timeout_error` (504) and `overloaded_error` (529);
/// there is no `conflict_error`, so a 409 is an `invalid_request_error`.
/// An upstream's 401, 403 or 404 concerns the gateway's credentials and
/// model names, not the client's, so it is never passed on as such: it
/// is a 502 `api_error`. The gateway's "try again later" is a 503 rather
/// than Anthropic's 529: a standard status every HTTP client and proxy
/// understands. Anthropic's SDKs retry either (they retry 408, 409, 429
/// and every 5xx by default), and `overloaded_error` names it as 529
/// would.
///
/// ```
/// use tower_llm_core::{Failure, FailureClass};
/// use tower_llm_providers::anthropic::server::failure_status;
///
/// let (status, kind) = failure_status(&Failure::deadline_exceeded());
/// assert_eq!((status.as_u16(), kind), (504, "timeout_error"));
/// assert_eq!(failure_status(&Failure::new(FailureClass::Auth)).1, "api_error");
/// let reused = Failure::new(FailureClass::BadRequest)
///     .with_status(http::StatusCode::UNPROCESSABLE_ENTITY);
/// assert_eq!(failure_status(&reused).0, 422);
/// ```
pub fn failure_status(f: &Failure) -> (StatusCode, &'static str) {
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
        FailureClass::DeadlineExceeded => (StatusCode::GATEWAY_TIMEOUT, "timeout_error"),
        FailureClass::Conflict => (StatusCode::CONFLICT, "invalid_request_error"),
        FailureClass::BadRequest
        | FailureClass::ContextWindowExceeded
        | FailureClass::ContentFiltered => (StatusCode::BAD_REQUEST, "invalid_request_error"),
        // Our credentials or our model names: the gateway's fault, not
        // the client's.
        FailureClass::Auth
        | FailureClass::NotFound
        | FailureClass::InvalidResponse
        | FailureClass::Cancelled => (StatusCode::BAD_GATEWAY, "api_error"),
        FailureClass::CostBudgetExhausted => (StatusCode::PAYMENT_REQUIRED, "billing_error"),
        FailureClass::TenantQuotaExhausted => (StatusCode::TOO_MANY_REQUESTS, "rate_limit_error"),
        _ => (StatusCode::SERVICE_UNAVAILABLE, "overloaded_error"),
    };
    let ours = [
        StatusCode::GATEWAY_TIMEOUT,
        StatusCode::PAYMENT_REQUIRED,
        StatusCode::TOO_MANY_REQUESTS,
    ];
    if f.is_all_links_failed() && !ours.contains(&status) {
        (StatusCode::SERVICE_UNAVAILABLE, "overloaded_error")
    } else {
        (status, kind)
    }
}

/// A failed call as an HTTP answer in Anthropic's error shape: the status
/// and `type` of [`failure_status`], the failure's message; on a 502
/// `x-should-retry: false` (the SDKs' own retries would meet the same
/// refusal), and on a 429, 503 or 529 a `retry-after` (whole seconds, at
/// least 1) when the failure knows one. Any server (axum, hyper) can send
/// it as it is.
///
/// ```
/// use std::time::Duration;
/// use tower_llm_core::{Failure, FailureClass};
/// use tower_llm_providers::anthropic::server::failure_response;
///
/// let f = Failure::new(FailureClass::RateLimited).with_retry_after(Duration::from_millis(1500));
/// let res = failure_response(&f);
/// assert_eq!(res.status(), 503);
/// assert_eq!(res.headers()["retry-after"], "2");
/// assert_eq!(res.headers()["content-type"], "application/json");
/// ```
pub fn failure_response(f: &Failure) -> http::Response<http_body_util::Full<bytes::Bytes>> {
    let (status, kind) = failure_status(f);
    let body = error_bytes(kind, f.message().unwrap_or("the call failed"));
    let mut res = http::Response::new(http_body_util::Full::new(bytes::Bytes::from(body)));
    *res.status_mut() = status;
    res.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    if matches!(status.as_u16(), 429 | 503 | OVERLOADED) {
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

/// The server-sent event of a failure after a stream's commit point, as
/// Anthropic sends one: `event: error` with the error body of
/// [`encode_error`] (its `type` from [`failure_status`]). The stream ends
/// after it, without `message_stop`.
///
/// ```
/// use tower_llm_core::Failure;
/// use tower_llm_providers::anthropic::server::sse_error_event;
///
/// let event = sse_error_event(&Failure::deadline_exceeded().with_message("too slow"));
/// assert_eq!(
///     &event[..],
///     br#"event: error
/// data: {"type":"error","error":{"type":"timeout_error","message":"too slow"}}
///
/// "#
/// );
/// ```
pub fn sse_error_event(f: &Failure) -> bytes::Bytes {
    let (_, kind) = failure_status(f);
    let mut out = b"event: error\ndata: ".to_vec();
    out.extend_from_slice(&error_bytes(
        kind,
        f.message().unwrap_or("the stream failed"),
    ));
    out.extend_from_slice(b"\n\n");
    bytes::Bytes::from(out)
}

/// [`encode_error`]'s body as bytes, its keys in Anthropic's order
/// (`type` first), whatever features `serde_json` was built with.
fn error_bytes(kind: &str, message: &str) -> Vec<u8> {
    #[derive(Serialize)]
    struct Body<'a> {
        #[serde(rename = "type")]
        kind: &'static str,
        error: Inner<'a>,
    }
    #[derive(Serialize)]
    struct Inner<'a> {
        #[serde(rename = "type")]
        kind: &'a str,
        message: &'a str,
    }
    let body = Body {
        kind: "error",
        error: Inner { kind, message },
    };
    // Writing borrowed strings to a Vec cannot fail.
    serde_json::to_vec(&body).unwrap_or_default()
}
