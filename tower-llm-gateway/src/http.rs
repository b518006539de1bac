//! The gateway's HTTP application: the OpenAI-compatible chat endpoint,
//! server-sent events, the model list, and the metrics and health
//! endpoints.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;
use tower::ServiceExt;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::request_id::{
    MakeRequestId, PropagateRequestIdLayer, RequestId, SetRequestIdLayer,
};
use tower_http::trace::TraceLayer;
use tower_llm::providers::openai::server::{
    SseFrames, decode_request, encode_error, failure_response as openai_failure_response,
    sse_error_event, wants_usage, write_response,
};
use tower_llm::{AttemptOutcome, AttemptRecord, ChatStream, Failure};
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::Gateway;
use crate::server::Connection;
use crate::state::RouteInfo;

/// The largest request body accepted (1 MiB): larger ones get 413.
pub const MAX_REQUEST_BODY: usize = 1024 * 1024;

impl Gateway {
    /// The HTTP application: the routes and the tower-http layers
    /// (request ids, tracing, a body limit, panic catching).
    pub fn router(self: Arc<Self>) -> Router {
        Router::new()
            .route("/v1/chat/completions", post(chat))
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
                    .map_response(openai_413)
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
/// reader for a chunked body) in OpenAI's error shape.
fn openai_413<B>(res: http::Response<B>) -> Response
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    if res.status() != StatusCode::PAYLOAD_TOO_LARGE {
        return res.map(Body::new);
    }
    too_large()
}

/// 413 in OpenAI's error shape.
fn too_large() -> Response {
    error(
        StatusCode::PAYLOAD_TOO_LARGE,
        &format!("request body over {MAX_REQUEST_BODY} bytes"),
        "invalid_request_error",
        Some("request_too_large"),
    )
}

/// An OpenAI-shaped error answer.
fn error(status: StatusCode, message: &str, kind: &str, code: Option<&str>) -> Response {
    (status, axum::Json(encode_error(message, kind, code))).into_response()
}

/// How a failed call is answered: the library's mapping
/// ([`failure_response`](tower_llm::providers::openai::server::failure_response)),
/// plus `x-llm-attempts`.
fn failure_response(f: &Failure) -> Response {
    let mut res = openai_failure_response(f).map(Body::new);
    insert_attempts(res.headers_mut(), f.attempts(), None, None);
    res
}

/// `x-llm-attempts`, and for an answer `x-llm-provider` and
/// `x-llm-model-used`: the provider and model of the link that served it,
/// as the policy names them (never the upstream's own model name, which
/// stays in the body: header values come from configuration only); and
/// `x-llm-requires-verification: true` when that link is marked
/// `requires_verification`.
fn insert_attempts(
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
fn insert_answer_flags(headers: &mut HeaderMap, attempts: &[AttemptRecord], replayed: bool) {
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

/// The W3C trace context of an inbound request, if it carries one.
fn inbound_context(headers: &HeaderMap) -> Option<opentelemetry::Context> {
    struct Extract<'a>(&'a HeaderMap);
    impl opentelemetry::propagation::Extractor for Extract<'_> {
        fn get(&self, key: &str) -> Option<&str> {
            self.0.get(key).and_then(|v| v.to_str().ok())
        }
        fn keys(&self) -> Vec<&str> {
            self.0.keys().map(http::HeaderName::as_str).collect()
        }
    }
    headers.get("traceparent")?;
    Some(TraceContextPropagator::new().extract(&Extract(headers)))
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// What a call holds while it is served: its in-flight slot and the bytes
/// of its request body (released when its answer has been sent whole, or
/// dropped).
struct Held {
    _slot: OwnedSemaphorePermit,
    _body: Option<OwnedSemaphorePermit>,
}

/// 503 with `Retry-After: 1`: a gateway-wide limit is reached.
fn overloaded(what: &str) -> Response {
    let mut res = error(
        StatusCode::SERVICE_UNAVAILABLE,
        &format!("the gateway is at its limit of {what}; retry shortly"),
        "service_unavailable",
        Some("overloaded"),
    );
    res.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    res
}

/// Reads a request body within `server.body_read_timeout_ms` (408), the
/// 1 MiB cap (413) and the gateway-wide `server.max_body_bytes_in_flight`
/// (503): each chunk takes its bytes from that budget as it arrives, so a
/// client trickling a body holds only what it has sent.
async fn read_body(
    gw: &Gateway,
    body: Body,
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
                Err(e) if is_length_limit(&e) => return Err(too_large()),
                Err(_) => {
                    return Err(error(
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
                return Err(too_large());
            }
            let n = u32::try_from(data.len()).unwrap_or(u32::MAX);
            let Ok(bytes) = gw.body_bytes.clone().try_acquire_many_owned(n) else {
                return Err(overloaded("request bytes in flight"));
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
            return Err(error(
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

/// `POST /v1/chat/completions`.
///
/// The body is read within `server.body_read_timeout_ms` (408), the 1 MiB
/// cap (413) and the gateway-wide byte budget (503); the call then takes
/// one of `server.max_in_flight` slots (none free: 503) and holds it, with
/// its body's bytes, until its answer has been sent. No copy of the body is
/// kept once it is decoded.
async fn chat(
    State(gw): State<Arc<Gateway>>,
    conn: Option<axum::Extension<Connection>>,
    req: axum::extract::Request,
) -> Response {
    let (parts, body) = req.into_parts();
    let (body, body_bytes) = match read_body(&gw, body).await {
        Ok(read) => read,
        Err(res) => return res,
    };
    let Ok(slot) = gw.in_flight.clone().try_acquire_owned() else {
        return overloaded("calls in flight");
    };
    let held = Held {
        _slot: slot,
        _body: body_bytes,
    };
    let req = match decode_request(&body) {
        Ok(req) => req,
        Err(f) => {
            return error(
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
                return error(
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
    let include_usage = req.stream && wants_usage(&body);
    drop(body);
    let Some(info) = routes.info.get(&*req.model).cloned() else {
        return unknown_route(&req.model);
    };
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
            return unknown_route(&req.model);
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
                stream,
                include_usage,
                deadline,
                conn.map(|c| c.0),
                held,
                &info,
            ),
            Err(f) => failure_response(&f),
        }
    } else {
        let Some(svc) = routes.unary.get(&*req.model).cloned() else {
            return unknown_route(&req.model);
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
                let json = write_response(&res, &res.model, now_unix());
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
                insert_answer_flags(out.headers_mut(), &res.attempts, res.idempotent_replayed);
                if res.degraded {
                    out.headers_mut()
                        .insert("x-llm-degraded", HeaderValue::from_static("true"));
                }
                out
            }
            Err(f) => failure_response(&f),
        }
    }
}

/// An answer's body that holds the call's [`Held`] until it has been sent
/// whole (or dropped).
struct Holding<B> {
    body: B,
    _held: Held,
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

/// 404 in OpenAI's error shape (`model_not_found`): no route is named
/// `alias`.
fn unknown_route(alias: &str) -> Response {
    error(
        StatusCode::NOT_FOUND,
        &format!("no route for model \"{alias}\""),
        "invalid_request_error",
        Some("model_not_found"),
    )
}

/// Stream ids: unique per process.
static STREAMS: AtomicU64 = AtomicU64::new(0);

/// Frames a committed stream holds between the upstream and the client.
const SSE_BUFFER: usize = 16;

/// How long a client has to take the deadline's error event before its
/// connection is closed.
const CLOSE_GRACE: Duration = Duration::from_millis(100);

/// A committed stream as OpenAI server-sent events: one `data:` per chunk,
/// `data: [DONE]` at a clean end, or one `data: {"error": ...}` event for a
/// failure after the commit point (and no `[DONE]`).
///
/// A task moves the frames from the upstream to the client through a
/// small buffer, so the call's deadline ends the upstream side by itself,
/// whether or not the client reads: at the deadline the upstream stream is
/// dropped (its connection closed, its generation stopped), the client is
/// sent the deadline's error event, and a client that has not taken it
/// within [`CLOSE_GRACE`] has its connection closed.
fn sse(
    stream: ChatStream,
    include_usage: bool,
    deadline: Instant,
    conn: Option<Connection>,
    held: Held,
    route: &RouteInfo,
) -> Response {
    let position = stream.fallback_position();
    let mut res = Response::new(Body::empty());
    let headers = res.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if stream.is_degraded() {
        insert_attempts(headers, stream.attempts(), None, None);
        headers.insert("x-llm-degraded", HeaderValue::from_static("true"));
    } else {
        insert_attempts(headers, stream.attempts(), Some(position), Some(route));
    }
    insert_answer_flags(headers, stream.attempts(), stream.is_idempotent_replay());
    let id = format!(
        "chatcmpl-{}-{}",
        now_unix(),
        STREAMS.fetch_add(1, Ordering::Relaxed)
    );
    let frames = SseFrames::new(stream, include_usage, id, now_unix());
    let (tx, rx) = tokio::sync::mpsc::channel(SSE_BUFFER);
    let (taken, gone) = tokio::sync::oneshot::channel();
    tokio::spawn(pump(frames, tx, deadline, conn, gone, held));
    *res.body_mut() = Body::from_stream(Delivered { rx, _taken: taken });
    res
}

/// Moves `frames` to the client until they end, the client goes, or the
/// deadline passes (see [`sse`]).
async fn pump(
    mut frames: SseFrames,
    tx: tokio::sync::mpsc::Sender<Bytes>,
    deadline: Instant,
    conn: Option<Connection>,
    mut gone: tokio::sync::oneshot::Receiver<()>,
    _held: Held,
) {
    let forward = async {
        loop {
            let next = std::future::poll_fn(|cx| {
                futures_core::Stream::poll_next(std::pin::Pin::new(&mut frames), cx)
            });
            // A client that goes stops the upstream at once, even while the
            // upstream is silent.
            let frame = tokio::select! {
                biased;
                _ = tx.closed() => return,
                frame = next => frame,
            };
            let Some(frame) = frame else {
                return;
            };
            if tx.send(frame).await.is_err() {
                return; // the client is gone
            }
        }
    };
    if tokio::time::timeout_at(deadline, forward).await.is_ok() {
        return;
    }
    // The deadline: the upstream side ends now, read or not.
    drop(frames);
    let failure = Failure::deadline_exceeded().with_message("the call's deadline passed");
    let taken = tokio::time::timeout(CLOSE_GRACE, async {
        // Room for the last event comes only if the client reads.
        let _ = tx.send(sse_error_event(&failure)).await;
        drop(tx);
        let _ = (&mut gone).await;
    })
    .await
    .is_ok();
    if let Some(conn) = conn {
        if !taken || conn.write_pending() {
            tracing::debug!(target: "gateway", "closing a connection that stopped reading its stream");
            conn.close();
        }
    }
}

/// The client's side of a streamed answer: frames from [`pump`]; dropping
/// it (the answer was sent whole, or the client went) tells the pump.
struct Delivered {
    rx: tokio::sync::mpsc::Receiver<Bytes>,
    _taken: tokio::sync::oneshot::Sender<()>,
}

impl futures_core::Stream for Delivered {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx).map(|frame| frame.map(Ok))
    }
}

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
async fn models(State(gw): State<Arc<Gateway>>) -> Response {
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
async fn model(
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
        unknown_route(&id)
    }
}

/// `GET /metrics`: the Prometheus text of every tower-llm metric.
async fn metrics(State(gw): State<Arc<Gateway>>) -> Response {
    match prometheus::TextEncoder::new().encode_to_string(&gw.registry.gather()) {
        Ok(text) => ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// `GET /health/circuits`: every breaker key and its state.
async fn circuits(State(gw): State<Arc<Gateway>>) -> Response {
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
async fn providers(State(gw): State<Arc<Gateway>>) -> Response {
    axum::Json(gw.probes()).into_response()
}
