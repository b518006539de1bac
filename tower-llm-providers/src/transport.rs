//! Talking to the HTTP transport: sending a request, reading its answer's
//! body with a cap, the transport's readiness, trace context and the
//! GenAI metrics of a call.

use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use http_body::Body;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use tower_llm_core::{BoxError, Failure, FailureClass};

/// The request body type providers send.
pub type RequestBody = Full<Bytes>;

/// The default cap on a response body: 16 MiB.
pub const DEFAULT_MAX_BODY: usize = 16 * 1024 * 1024;

/// Reads a whole response body, at most `limit` bytes.
///
/// A larger body is an invalid-response failure (memory stays bounded); a
/// body that breaks off (connection reset mid-body) is transient.
pub(crate) async fn read_body<B>(body: B, limit: usize) -> Result<Bytes, Failure>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<LengthLimitError>() => Err(Failure::new(FailureClass::InvalidResponse)
            .with_message(format!("response body over the {limit}-byte limit"))),
        Err(e) => Err(Failure::new(FailureClass::Transient)
            .with_message("response body broke off")
            .with_source(e)),
    }
}

/// A provider's answer: status and headers, the whole body (read with the
/// cap), and how long the round trip took.
pub(crate) struct Answer {
    pub(crate) parts: http::response::Parts,
    pub(crate) body: Bytes,
    pub(crate) latency: Duration,
}

/// Sends `req` through `transport` up to the answer's head (status and
/// headers), within `head` when given; transport errors become classified
/// failures, a head that does not come in time a timeout.
pub(crate) async fn send<T, B>(
    transport: &mut T,
    req: http::Request<RequestBody>,
    head: Option<Duration>,
    provider: &'static str,
) -> Result<http::Response<B>, Failure>
where
    T: tower_service::Service<http::Request<RequestBody>, Response = http::Response<B>>,
    T::Error: Into<BoxError>,
{
    let call = transport.call(req);
    let res = match head {
        None => call.await,
        Some(head) => match tokio::time::timeout(head, call).await {
            Ok(res) => res,
            Err(_) => {
                return Err(Failure::new(FailureClass::Timeout)
                    .with_provider(provider)
                    .with_message(format!("no response head within the {head:?} head timeout")));
            }
        },
    };
    res.map_err(|e| Failure::from_error(e.into()).with_provider(provider))
}

/// Sends `req` through `transport` (the head within `head` when given) and
/// reads the whole answer, at most `max_body` bytes; transport errors
/// become classified failures.
pub(crate) async fn round_trip<T, B>(
    transport: &mut T,
    req: http::Request<RequestBody>,
    head: Option<Duration>,
    max_body: usize,
    provider: &'static str,
) -> Result<Answer, Failure>
where
    T: tower_service::Service<http::Request<RequestBody>, Response = http::Response<B>>,
    T::Error: Into<BoxError>,
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let started = tokio::time::Instant::now();
    let res = send(transport, req, head, provider).await?;
    let (parts, body) = res.into_parts();
    let body = read_body(body, max_body)
        .await
        .map_err(|f| f.with_provider(provider))?;
    Ok(Answer {
        parts,
        body,
        latency: started.elapsed(),
    })
}

/// Adds the W3C `traceparent` (and `tracestate`) of the current span to an
/// outbound provider request, so the provider's side of the call joins the
/// caller's trace. The span context comes from the current `tracing` span
/// (bridged by `tracing-opentelemetry`: inside the stack, the `llm.attempt`
/// span), else from the current OpenTelemetry context; nothing is added
/// when neither carries a valid span context. Feature `otel` (default).
#[cfg(feature = "otel")]
pub(crate) fn inject_trace_context(headers: &mut HeaderMap) {
    use opentelemetry::trace::TraceContextExt;
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    let from_span = tracing::Span::current().context();
    let current;
    let cx = if from_span.span().span_context().is_valid() {
        &from_span
    } else {
        current = opentelemetry::Context::current();
        &current
    };
    let span = cx.span();
    let sc = span.span_context();
    if !sc.is_valid() {
        return;
    }
    let traceparent = format!(
        "00-{}-{}-{:02x}",
        sc.trace_id(),
        sc.span_id(),
        sc.trace_flags().to_u8()
    );
    if let Ok(v) = http::HeaderValue::from_str(&traceparent) {
        headers.insert("traceparent", v);
    }
    let state = sc.trace_state().header();
    if !state.is_empty() {
        if let Ok(v) = http::HeaderValue::from_str(&state) {
            headers.insert("tracestate", v);
        }
    }
}

/// Without the `otel` feature, requests carry no trace context.
#[cfg(not(feature = "otel"))]
pub(crate) fn inject_trace_context(_headers: &mut HeaderMap) {}

/// The `gen_ai.request.model` label of a call: the configured model of
/// the call's [`Link`](tower_llm_core::Link) (set by the fallback layer, or
/// stored by the caller), never the request's free-form `model` (a client
/// may have chosen it, and a label set must stay closed); `"unknown"`
/// without a link.
pub(crate) fn metric_model<R: tower_llm_core::LlmRequest>(req: &R) -> std::sync::Arc<str> {
    match tower_llm_core::Link::of(req) {
        Some(link) => link.model_arc().clone(),
        None => std::sync::Arc::from("unknown"),
    }
}

/// Times one chat call of `provider` and records its GenAI metrics.
pub(crate) async fn timed_chat<F>(
    metrics: &tower_llm_core::GenAiMetrics,
    provider: &'static str,
    model: &str,
    call: F,
) -> Result<tower_llm_core::ChatResponse, Failure>
where
    F: std::future::Future<Output = Result<tower_llm_core::ChatResponse, Failure>>,
{
    let started = tokio::time::Instant::now();
    let result = call.await;
    metrics.record_chat(
        provider,
        model,
        started.elapsed(),
        result.as_ref().map(|r| &r.usage),
    );
    result
}

/// The transport's readiness, its error classified as a failure of
/// `provider`.
pub(crate) fn poll_transport<T, B>(
    transport: &mut T,
    cx: &mut std::task::Context<'_>,
    provider: &'static str,
) -> std::task::Poll<Result<(), Failure>>
where
    T: tower_service::Service<http::Request<RequestBody>, Response = http::Response<B>>,
    T::Error: Into<BoxError>,
{
    transport
        .poll_ready(cx)
        .map_err(|e| Failure::from_error(e.into()).with_provider(provider))
}

/// Takes the service that `poll_ready` made ready, leaving a clone in its
/// place (tower's "be careful when cloning inner services").
pub(crate) fn take_ready<T: Clone>(slot: &mut T) -> T {
    let clone = slot.clone();
    std::mem::replace(slot, clone)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bodies_over_the_cap_are_refused() {
        let err = read_body(Full::new(Bytes::from(vec![b'x'; 2048])), 1024)
            .await
            .expect_err("too big");
        assert!(err.is_invalid_response());
        let ok = read_body(Full::new(Bytes::from_static(b"{}")), 1024)
            .await
            .expect("small");
        assert_eq!(&ok[..], b"{}");
    }
}
