//! The gateway's application: an OpenAI-compatible HTTP front over the
//! tower-llm stack, built from a [`Policy`] and swapped atomically on
//! reload. Used by `main.rs` and by the root `tests/gateway.rs`.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use opentelemetry::metrics::MeterProvider as _;
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tower::ServiceExt;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::request_id::{
    MakeRequestId, PropagateRequestIdLayer, RequestId, SetRequestIdLayer,
};
use tower_http::trace::TraceLayer;
use tower_llm::breaker::{BreakerHandle, BreakerLayer};
use tower_llm::config::{
    ConfigError, Policy, ProviderConfig, ProviderServices, RouteService, ServerPolicy,
};
use tower_llm::providers::RequestBody;
use tower_llm::providers::openai::server::{
    decode_request, encode_chunk, encode_error, encode_first_chunk, encode_response,
};
use tower_llm::{
    AttemptRecord, ChatResponse, ChatStream, Failure, FailureClass, GenAiMetrics, Metrics,
};
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use super::server::Connection;

/// The largest request body accepted (1 MiB): larger ones get 413.
pub(crate) const MAX_REQUEST_BODY: usize = 1024 * 1024;

/// How a provider's API key is found (the environment, or a fixed key for
/// the embedded mock providers).
pub(crate) type KeySource = Arc<
    dyn Fn(&ProviderConfig) -> Result<Option<tower_llm::providers::ApiKey>, ConfigError>
        + Send
        + Sync,
>;

/// What the HTTP transport must be.
pub(crate) type Transport = tower_llm::providers::https::HttpsClient;

/// The routes of one policy: swapped whole on reload.
pub(crate) struct Routes {
    /// The policy they were built from.
    pub(crate) policy: Policy,
    unary: HashMap<String, RouteService<ChatResponse>>,
    stream: HashMap<String, RouteService<ChatStream>>,
}

/// The result of the last background probe of a provider.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Probe {
    /// `true` for a 2xx answer.
    pub(crate) ok: bool,
    /// The HTTP status, if an answer came.
    pub(crate) status: Option<u16>,
    /// Round-trip time.
    pub(crate) latency_ms: u64,
    /// The error, if no answer came.
    pub(crate) error: Option<String>,
}

/// The gateway's state.
pub(crate) struct Gateway {
    routes: ArcSwap<Routes>,
    breaker: BreakerLayer,
    metrics: Metrics,
    genai: GenAiMetrics,
    registry: prometheus::Registry,
    _meters: SdkMeterProvider,
    _gauge: opentelemetry::metrics::ObservableGauge<i64>,
    transport: Transport,
    keys: KeySource,
    probes: Mutex<HashMap<String, Probe>>,
    /// Each provider's bulkhead, kept across reloads while its limit is
    /// unchanged, so calls in flight keep counting.
    bulkheads: Bulkheads,
    /// The server limits the gateway started with (`[server]`; a reload
    /// keeps them).
    server: ServerPolicy,
    /// Chat calls in flight (`server.max_in_flight`).
    in_flight: Arc<Semaphore>,
    /// Bytes of request bodies held (`server.max_body_bytes_in_flight`).
    body_bytes: Arc<Semaphore>,
}

/// Bulkheads by provider name, with their limit.
type Bulkheads = Mutex<HashMap<String, (usize, Arc<tokio::sync::Semaphore>)>>;

impl Gateway {
    /// A gateway serving `policy` over `transport`.
    ///
    /// # Errors
    ///
    /// A provider that cannot be built (a missing key).
    pub(crate) fn new(
        policy: Policy,
        transport: Transport,
        keys: KeySource,
    ) -> Result<Arc<Self>, ConfigError> {
        policy.validate()?;
        let registry = prometheus::Registry::new();
        let exporter = opentelemetry_prometheus::exporter()
            .with_registry(registry.clone())
            .build()
            .map_err(|e| ConfigError::new(format!("metrics exporter: {e}")))?;
        let meters = SdkMeterProvider::builder().with_reader(exporter).build();
        let meter = meters.meter("tower-llm");
        let breaker = BreakerLayer::new();
        let gauge = breaker.handle().register_gauge(&meter);
        let metrics = Metrics::new(&meter);
        let genai = GenAiMetrics::new(&meter);
        let bulkheads = Bulkheads::default();
        let routes = build(
            &policy, &breaker, &metrics, &genai, &transport, &keys, &bulkheads,
        )?;
        let server = routes.policy.server;
        Ok(Arc::new(Gateway {
            routes: ArcSwap::from_pointee(routes),
            breaker,
            metrics,
            genai,
            registry,
            _meters: meters,
            _gauge: gauge,
            transport,
            keys,
            probes: Mutex::new(HashMap::new()),
            bulkheads,
            in_flight: Arc::new(Semaphore::new(server.max_in_flight)),
            body_bytes: Arc::new(Semaphore::new(server.max_body_bytes_in_flight)),
            server,
        }))
    }

    /// Validates `policy` and swaps it in: calls in flight finish on the
    /// policy they started with; circuits of keys that still exist keep
    /// their state. On error the running policy stays.
    ///
    /// # Errors
    ///
    /// Why `policy` cannot be served.
    pub(crate) fn reload(&self, policy: Policy) -> Result<(), ConfigError> {
        policy.validate()?;
        if policy.server != self.server {
            tracing::warn!(
                target: "gateway",
                "the [server] section changed: its limits take effect at the next start"
            );
        }
        let routes = build(
            &policy,
            &self.breaker,
            &self.metrics,
            &self.genai,
            &self.transport,
            &self.keys,
            &self.bulkheads,
        )?;
        self.routes.store(Arc::new(routes));
        Ok(())
    }

    /// The policy being served.
    pub(crate) fn policy(&self) -> Policy {
        self.routes.load().policy.clone()
    }

    /// The server limits the gateway started with.
    pub(crate) fn server_limits(&self) -> ServerPolicy {
        self.server
    }

    /// The breaker's handle (circuit snapshots, manual control).
    pub(crate) fn breaker(&self) -> BreakerHandle {
        self.breaker.handle()
    }

    /// Probes every provider with a `health_url` once; results at
    /// `GET /health/providers`.
    pub(crate) async fn probe_once(&self) {
        let providers = self.routes.load().policy.providers.clone();
        for provider in providers {
            let Some(url) = provider.health_url.clone() else {
                continue;
            };
            let started = tokio::time::Instant::now();
            let req = http::Request::get(&url).body(RequestBody::new(Bytes::new()));
            let probe = match req {
                Err(e) => Probe {
                    ok: false,
                    status: None,
                    latency_ms: 0,
                    error: Some(e.to_string()),
                },
                Ok(req) => {
                    let answer = tokio::time::timeout(
                        Duration::from_secs(5),
                        self.transport.clone().oneshot(req),
                    )
                    .await;
                    let latency_ms =
                        u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
                    match answer {
                        Ok(Ok(res)) => Probe {
                            ok: res.status().is_success(),
                            status: Some(res.status().as_u16()),
                            latency_ms,
                            error: None,
                        },
                        Ok(Err(e)) => Probe {
                            ok: false,
                            status: None,
                            latency_ms,
                            error: Some(e.to_string()),
                        },
                        Err(_) => Probe {
                            ok: false,
                            status: None,
                            latency_ms,
                            error: Some("timed out after 5 s".into()),
                        },
                    }
                }
            };
            self.probes
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(provider.name, probe);
        }
    }

    /// The HTTP application: the routes and the tower-http layers
    /// (request ids, tracing, a body limit, panic catching).
    pub(crate) fn router(self: Arc<Self>) -> Router {
        Router::new()
            .route("/v1/chat/completions", post(chat))
            .route("/metrics", get(metrics))
            .route(
                "/health",
                get(|| async { axum::Json(serde_json::json!({"status": "ok"})) }),
            )
            .route("/health/circuits", get(circuits))
            .route("/health/providers", get(providers))
            .with_state(self)
            .layer(
                tower::ServiceBuilder::new()
                    .layer(SetRequestIdLayer::x_request_id(Counter::default()))
                    .layer(PropagateRequestIdLayer::x_request_id())
                    .layer(TraceLayer::new_for_http())
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

/// Builds every route of `policy`; each provider once, shared by routes.
fn build(
    policy: &Policy,
    breaker: &BreakerLayer,
    metrics: &Metrics,
    genai: &GenAiMetrics,
    transport: &Transport,
    keys: &KeySource,
    bulkheads: &Bulkheads,
) -> Result<Routes, ConfigError> {
    let mut services: HashMap<String, ProviderServices> = HashMap::new();
    for provider in &policy.providers {
        let key = keys(provider)?;
        let bulkhead = provider.max_concurrency.map(|limit| {
            let mut kept = bulkheads.lock().unwrap_or_else(PoisonError::into_inner);
            match kept.get(&provider.name) {
                Some((l, permits)) if *l == limit => permits.clone(),
                _ => {
                    let permits = Arc::new(tokio::sync::Semaphore::new(limit));
                    kept.insert(provider.name.clone(), (limit, permits.clone()));
                    permits
                }
            }
        });
        let built = provider.services(
            key,
            transport.clone(),
            policy.stream.timeouts(),
            genai,
            bulkhead,
        )?;
        services.insert(provider.name.clone(), built);
    }
    let mut unary = HashMap::new();
    let mut stream = HashMap::new();
    for route in &policy.routes {
        let u = policy.build_route(route, breaker, metrics.clone(), |p| {
            services[&p.name].chat.clone()
        })?;
        let s = policy.build_route(route, breaker, metrics.clone(), |p| {
            services[&p.name].stream.clone()
        })?;
        unary.insert(route.model.clone(), u);
        stream.insert(route.model.clone(), s);
    }
    Ok(Routes {
        policy: policy.clone(),
        unary,
        stream,
    })
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

/// How a failed call is answered.
fn failure_response(f: &Failure) -> Response {
    let message = f.message().unwrap_or("the call failed").to_owned();
    let label = f.class().as_metric_label();
    let (status, kind) = match f.class() {
        FailureClass::DeadlineExceeded => (StatusCode::GATEWAY_TIMEOUT, "timeout"),
        FailureClass::Conflict => (StatusCode::CONFLICT, "conflict"),
        FailureClass::BadRequest
        | FailureClass::ContextWindowExceeded
        | FailureClass::ContentFiltered => (StatusCode::BAD_REQUEST, "invalid_request_error"),
        // Our credentials or our model names: the gateway's fault, not the
        // client's.
        FailureClass::Auth | FailureClass::NotFound => (StatusCode::BAD_GATEWAY, "upstream_error"),
        FailureClass::InvalidResponse | FailureClass::Cancelled => {
            (StatusCode::BAD_GATEWAY, "upstream_error")
        }
        _ => (StatusCode::SERVICE_UNAVAILABLE, "service_unavailable"),
    };
    let status = if f.is_all_links_failed() && status != StatusCode::GATEWAY_TIMEOUT {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        status
    };
    let mut res = error(status, &message, kind, Some(label));
    if status == StatusCode::SERVICE_UNAVAILABLE {
        if let Some(wait) = f.retry_after() {
            let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
            if let Ok(v) = HeaderValue::from_str(&secs.max(1).to_string()) {
                res.headers_mut().insert(header::RETRY_AFTER, v);
            }
        }
    }
    insert_attempts(res.headers_mut(), f.attempts(), None);
    res
}

/// `x-llm-attempts`, and for an answer `x-llm-provider` and
/// `x-llm-model-used`: the provider and model of the link that served it,
/// as the policy names them (never the upstream's own model name, which
/// stays in the body: header values come from configuration only).
fn insert_attempts(headers: &mut HeaderMap, attempts: &[AttemptRecord], position: Option<u8>) {
    headers.insert("x-llm-attempts", HeaderValue::from(attempts.len()));
    let Some(position) = position else {
        return;
    };
    let Some(served) = attempts
        .iter()
        .rev()
        .find(|a| a.fallback_position == position)
    else {
        return;
    };
    if let Ok(v) = HeaderValue::from_str(&served.provider) {
        headers.insert("x-llm-provider", v);
    }
    if let Ok(v) = HeaderValue::from_str(&served.model) {
        headers.insert("x-llm-model-used", v);
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
    let include_usage = req.stream && wants_usage(&body);
    drop(body);
    // In-flight calls keep the routes they started with.
    let routes = gw.routes.load_full();
    // The call's deadline, as the deadline layer counts it (from now).
    let deadline = Instant::now() + routes.policy.deadline.total();
    let span = tracing::info_span!("gateway.chat", route = %req.model, stream = req.stream);
    if let Some(cx) = inbound_context(&parts.headers) {
        let _ = span.set_parent(cx);
    }
    if req.stream {
        let Some(svc) = routes.stream.get(&*req.model).cloned() else {
            return unknown_route(&req.model);
        };
        drop(routes);
        match svc.oneshot(req).instrument(span).await {
            Ok(stream) => sse(stream, include_usage, deadline, conn.map(|c| c.0), held),
            Err(f) => failure_response(&f),
        }
    } else {
        let Some(svc) = routes.unary.get(&*req.model).cloned() else {
            return unknown_route(&req.model);
        };
        drop(routes);
        match svc.oneshot(req).instrument(span).await {
            Ok(res) => {
                let json = match serde_json::to_vec(&encode_response(&res, &res.model, now_unix()))
                {
                    Ok(json) => json,
                    Err(_) => {
                        return error(
                            StatusCode::INTERNAL_SERVER_ERROR,
                            "the answer could not be encoded",
                            "server_error",
                            None,
                        );
                    }
                };
                let mut out = Response::new(Body::new(Holding {
                    body: http_body_util::Full::new(Bytes::from(json)),
                    _held: held,
                }));
                out.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                );
                insert_attempts(
                    out.headers_mut(),
                    &res.attempts,
                    Some(res.fallback_position),
                );
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

fn unknown_route(alias: &str) -> Response {
    error(
        StatusCode::NOT_FOUND,
        &format!("no route for model \"{alias}\""),
        "invalid_request_error",
        Some("model_not_found"),
    )
}

/// `stream_options.include_usage` in a request body (read without
/// building a copy of the rest of it).
fn wants_usage(body: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct Body {
        #[serde(default)]
        stream_options: Option<StreamOptions>,
    }
    #[derive(serde::Deserialize)]
    struct StreamOptions {
        #[serde(default)]
        include_usage: Option<bool>,
    }
    serde_json::from_slice::<Body>(body)
        .ok()
        .and_then(|b| b.stream_options?.include_usage)
        .unwrap_or(false)
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
) -> Response {
    let position = stream.fallback_position();
    let mut res = Response::new(Body::empty());
    let headers = res.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    insert_attempts(headers, stream.attempts(), Some(position));
    let model = stream.model().to_owned();
    let frames = Frames {
        stream,
        done: false,
        id: format!(
            "chatcmpl-{}-{}",
            now_unix(),
            STREAMS.fetch_add(1, Ordering::Relaxed)
        ),
        first: true,
        include_usage,
        usage: tower_llm::Usage::default(),
        model,
        created: now_unix(),
    };
    let (tx, rx) = tokio::sync::mpsc::channel(SSE_BUFFER);
    let (taken, gone) = tokio::sync::oneshot::channel();
    tokio::spawn(pump(frames, tx, deadline, conn, gone, held));
    *res.body_mut() = Body::from_stream(Delivered { rx, _taken: taken });
    res
}

/// Moves `frames` to the client until they end, the client goes, or the
/// deadline passes (see [`sse`]).
async fn pump(
    mut frames: Frames,
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
            let Some(Ok(frame)) = frame else {
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
        let _ = tx.send(error_frame(&failure)).await;
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

/// The `data:` event of a failure after the commit point.
fn error_frame(f: &Failure) -> Bytes {
    let body = encode_error(
        f.message().unwrap_or("the stream failed"),
        "stream_error",
        Some(f.class().as_metric_label()),
    );
    Bytes::from(format!("data: {body}\n\n"))
}

/// The SSE frames of a committed stream: the first carries the role;
/// usage is summed and sent once at the end, and only when the client
/// asked for it (`stream_options.include_usage`), as OpenAI does.
struct Frames {
    stream: ChatStream,
    done: bool,
    id: String,
    model: String,
    created: u64,
    first: bool,
    include_usage: bool,
    usage: tower_llm::Usage,
}

impl futures_core::Stream for Frames {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        use std::task::Poll;
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        let frame = loop {
            match std::task::ready!(std::pin::Pin::new(&mut this.stream).poll_next(cx)) {
                Some(Ok(mut chunk)) => {
                    if let Some(u) = chunk.usage.take() {
                        // Providers report usage in parts (Anthropic: input
                        // first, output last): keep every count.
                        if u.prompt_tokens > 0 {
                            this.usage.prompt_tokens = u.prompt_tokens;
                        }
                        if u.completion_tokens > 0 {
                            this.usage.completion_tokens = u.completion_tokens;
                        }
                        if u.cached_input_tokens > 0 {
                            this.usage.cached_input_tokens = u.cached_input_tokens;
                        }
                    }
                    if chunk.text.is_none()
                        && chunk.tool_call.is_none()
                        && chunk.finish_reason.is_none()
                    {
                        continue; // usage only
                    }
                    let body = if std::mem::take(&mut this.first) {
                        encode_first_chunk(&chunk, &this.id, &this.model, this.created)
                    } else {
                        encode_chunk(&chunk, &this.id, &this.model, this.created)
                    };
                    break format!("data: {body}\n\n");
                }
                Some(Err(f)) => {
                    this.done = true;
                    return Poll::Ready(Some(Ok(error_frame(&f))));
                }
                None => {
                    this.done = true;
                    let mut out = String::new();
                    if this.include_usage {
                        let usage = tower_llm::ChatChunk {
                            usage: Some(this.usage),
                            ..tower_llm::ChatChunk::default()
                        };
                        let body = encode_chunk(&usage, &this.id, &this.model, this.created);
                        out.push_str(&format!("data: {body}\n\n"));
                    }
                    out.push_str("data: [DONE]\n\n");
                    break out;
                }
            }
        };
        Poll::Ready(Some(Ok(Bytes::from(frame))))
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
    let probes = gw
        .probes
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    axum::Json(probes).into_response()
}

/// What the reload watcher compares: a file's modification time and size.
type Seen = Option<(SystemTime, u64)>;

fn seen(path: &std::path::Path) -> Seen {
    std::fs::metadata(path)
        .ok()
        .and_then(|m| Some((m.modified().ok()?, m.len())))
}

/// Reloads the policy on SIGHUP and when the file changes (checked every
/// second). A changed file is read once it has stayed unchanged for
/// `server.reload_settle_ms` (so a writer that truncates and then rewrites
/// is never caught half-way); a file that does not parse or validate (an
/// empty one, one without routes) is logged and refused, and the running
/// policy stays. Calls in flight are never dropped: each keeps the routes
/// it started with.
pub(crate) async fn reload_on_change(gateway: Arc<Gateway>, path: std::path::PathBuf) {
    let settle = gateway.server.reload_settle();
    let mut last = seen(&path);
    #[cfg(unix)]
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        #[cfg(unix)]
        let signalled = async {
            match hup.as_mut() {
                Some(h) => h.recv().await.is_some(),
                None => std::future::pending().await,
            }
        };
        #[cfg(not(unix))]
        let signalled = std::future::pending::<bool>();
        let forced = tokio::select! {
            _ = tick.tick() => false,
            s = signalled => s,
        };
        let mut now = seen(&path);
        if !forced && now == last {
            continue;
        }
        // Wait for the writer to finish: unchanged for a whole settle time.
        loop {
            tokio::time::sleep(settle).await;
            let again = seen(&path);
            if again == now {
                break;
            }
            now = again;
        }
        last = now;
        let result = std::fs::read_to_string(&path)
            .map_err(|e| e.to_string())
            .and_then(|text| Policy::from_toml(&text).map_err(|e| e.to_string()))
            .and_then(|policy| gateway.reload(policy).map_err(|e| e.to_string()));
        match result {
            Ok(()) => tracing::info!(target: "gateway", path = %path.display(), "policy reloaded"),
            Err(e) => {
                tracing::error!(target: "gateway", path = %path.display(), error = %e, "reload refused; the running policy stays")
            }
        }
    }
}
