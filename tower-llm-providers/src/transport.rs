//! Talking to the HTTP transport: building requests, reading bodies with a
//! cap, and turning provider error answers into classified failures.

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use tower_llm_core::{BoxError, Failure, FailureClass, Outcome, classify_status};

use crate::secret::Scrub;

/// The request body type providers send.
pub type RequestBody = Full<Bytes>;

/// The default cap on a response body: 16 MiB.
pub const DEFAULT_MAX_BODY: usize = 16 * 1024 * 1024;

/// The longest provider message kept in a [`Failure`] (in bytes).
pub const MAX_MESSAGE: usize = 512;

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
    pub(crate) latency: std::time::Duration,
}

/// Sends `req` through `transport` and reads the whole answer, at most
/// `max_body` bytes; transport errors become classified failures.
pub(crate) async fn round_trip<T, B>(
    transport: &mut T,
    req: http::Request<RequestBody>,
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
    let res = transport
        .call(req)
        .await
        .map_err(|e| Failure::from_error(e.into()).with_provider(provider))?;
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
pub(crate) fn metric_model(req: &tower_llm_core::ChatRequest) -> std::sync::Arc<str> {
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

/// The failure for a request that `http` refused to build.
pub(crate) fn build_error(provider: &'static str) -> impl Fn(http::Error) -> Failure {
    move |e| {
        Failure::new(FailureClass::BadRequest)
            .with_provider(provider)
            .with_message(format!("cannot build the request: {e}"))
    }
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

/// Keeps at most [`MAX_MESSAGE`] bytes of a provider message, on a
/// character boundary.
pub(crate) fn bounded(message: &str) -> String {
    if message.len() <= MAX_MESSAGE {
        return message.to_owned();
    }
    let mut end = MAX_MESSAGE;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &message[..end])
}

/// What a provider's error body said, as far as classification goes.
/// Strings borrow from the body unless they hold JSON escapes.
#[derive(Debug, Default, serde::Deserialize)]
pub(crate) struct ErrorBody<'a> {
    /// `error.type` (OpenAI, Anthropic) or the AWS error name.
    #[serde(borrow, default, rename = "type")]
    pub(crate) kind: Option<std::borrow::Cow<'a, str>>,
    /// `error.code` (OpenAI).
    #[serde(borrow, default)]
    pub(crate) code: Option<std::borrow::Cow<'a, str>>,
    /// The human message.
    #[serde(borrow, default)]
    pub(crate) message: Option<std::borrow::Cow<'a, str>>,
}

impl ErrorBody<'_> {
    /// `error.type` as a string slice.
    pub(crate) fn kind(&self) -> Option<&str> {
        self.kind.as_deref()
    }

    /// `error.code` as a string slice.
    pub(crate) fn code(&self) -> Option<&str> {
        self.code.as_deref()
    }

    /// The message, or `""`.
    pub(crate) fn message(&self) -> &str {
        self.message.as_deref().unwrap_or_default()
    }
}

#[derive(serde::Deserialize, Default)]
struct Envelope<'a> {
    #[serde(borrow, default)]
    error: Option<ErrorBody<'a>>,
}

/// The `{"error": {"type", "code", "message"}}` envelope of OpenAI and
/// Anthropic error bodies, read leniently: garbage gives an empty body.
pub(crate) fn error_envelope(body: &[u8]) -> ErrorBody<'_> {
    serde_json::from_slice::<Envelope<'_>>(body)
        .ok()
        .and_then(|e| e.error)
        .unwrap_or_default()
}

/// A failure for a non-2xx answer: the status and headers decide the class
/// (with `Retry-After` and `x-should-retry`), then `refine` may sharpen it
/// from the body (quota, context window, content filter). The provider's
/// message is kept with every secret of `scrub` removed, then bounded.
pub(crate) fn error_failure(
    provider: &'static str,
    status: StatusCode,
    headers: &HeaderMap,
    body: &ErrorBody<'_>,
    scrub: &Scrub,
    refine: impl FnOnce(FailureClass, &ErrorBody<'_>) -> FailureClass,
) -> Failure {
    let classified = match classify_status(status, headers) {
        Outcome::Failure(c) => c,
        // A 1xx/3xx where a 2xx was expected: not a usable answer.
        Outcome::Success { .. } => tower_llm_core::Classified::new(FailureClass::InvalidResponse),
    };
    let class = refine(classified.class, body);
    let mut failure = Failure::from_classified(tower_llm_core::Classified {
        class,
        ..classified
    })
    .with_status(status)
    .with_provider(provider);
    if let Some(message) = body.message.as_deref() {
        failure = failure.with_message(scrub.message(message));
    }
    failure
}

/// A failure for a 2xx answer whose body we cannot use. `what` is our own
/// text, never an upstream value.
pub(crate) fn invalid(provider: &'static str, what: impl std::fmt::Display) -> Failure {
    Failure::new(FailureClass::InvalidResponse)
        .with_provider(provider)
        .with_message(bounded(&format!("malformed {provider} response: {what}")))
}

/// A failure for a 2xx answer (or a streamed event) that is not the JSON we
/// expect. serde's own message quotes the offending value (`invalid type:
/// string "sk-..."`), and an upstream or proxy may echo a key there, so
/// only its category and position are kept, plus the name of a missing
/// field (the names are ours).
pub(crate) fn invalid_json(provider: &'static str, e: &serde_json::Error) -> Failure {
    invalid(provider, json_error(e))
}

/// What went wrong in a JSON document, without quoting any of it.
pub(crate) fn json_error(e: &serde_json::Error) -> String {
    use serde_json::error::Category;
    let (line, column) = (e.line(), e.column());
    match e.classify() {
        Category::Data => match missing_field(e) {
            Some(field) => format!("missing field `{field}` at line {line} column {column}"),
            None => format!("unexpected value at line {line} column {column}"),
        },
        Category::Eof => format!("truncated JSON at line {line} column {column}"),
        Category::Syntax => format!("invalid JSON at line {line} column {column}"),
        Category::Io => "unreadable JSON".to_owned(),
    }
}

/// The field named by serde's "missing field `name`" message: always one
/// of our own (derive-generated) field names, made only of identifier
/// characters.
fn missing_field(e: &serde_json::Error) -> Option<String> {
    let text = e.to_string();
    let rest = text.strip_prefix("missing field `")?;
    let name = &rest[..rest.find('`')?];
    (!name.is_empty()
        && name.len() <= 64
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'))
    .then(|| name.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_bounded_on_char_boundaries() {
        let long = "é".repeat(MAX_MESSAGE);
        let b = bounded(&long);
        assert!(b.len() <= MAX_MESSAGE + '…'.len_utf8());
        assert!(b.ends_with('…'));
        assert_eq!(bounded("short"), "short");
    }

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
