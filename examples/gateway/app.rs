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
use tower::ServiceExt;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::request_id::{
    MakeRequestId, PropagateRequestIdLayer, RequestId, SetRequestIdLayer,
};
use tower_http::trace::TraceLayer;
use tower_llm::breaker::{BreakerHandle, BreakerLayer};
use tower_llm::config::{ConfigError, Policy, ProviderConfig, ProviderServices, RouteService};
use tower_llm::providers::RequestBody;
use tower_llm::providers::openai::server::{
    decode_request, encode_chunk, encode_error, encode_first_chunk, encode_response,
};
use tower_llm::{ChatResponse, ChatStream, Failure, FailureClass, GenAiMetrics, Metrics};
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;

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
    insert_attempts(res.headers_mut(), f.attempts().len(), None);
    res
}

fn insert_attempts(headers: &mut HeaderMap, attempts: usize, served: Option<(&str, &str)>) {
    if let Ok(v) = HeaderValue::from_str(&attempts.to_string()) {
        headers.insert("x-llm-attempts", v);
    }
    if let Some((provider, model)) = served {
        if let Ok(v) = HeaderValue::from_str(provider) {
            headers.insert("x-llm-provider", v);
        }
        if let Ok(v) = HeaderValue::from_str(model) {
            headers.insert("x-llm-model-used", v);
        }
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

/// `POST /v1/chat/completions`.
async fn chat(State(gw): State<Arc<Gateway>>, headers: HeaderMap, body: Bytes) -> Response {
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
    // In-flight calls keep the routes they started with.
    let routes = gw.routes.load_full();
    let span = tracing::info_span!("gateway.chat", route = %req.model, stream = req.stream);
    if let Some(cx) = inbound_context(&headers) {
        let _ = span.set_parent(cx);
    }
    let alias = req.model.clone();
    let include_usage = req.stream && wants_usage(&body);
    if req.stream {
        let Some(svc) = routes.stream.get(&alias).cloned() else {
            return unknown_route(&alias);
        };
        match svc.oneshot(req).instrument(span).await {
            Ok(stream) => sse(stream, include_usage),
            Err(f) => failure_response(&f),
        }
    } else {
        let Some(svc) = routes.unary.get(&alias).cloned() else {
            return unknown_route(&alias);
        };
        match svc.oneshot(req).instrument(span).await {
            Ok(res) => {
                let served = res
                    .attempts
                    .iter()
                    .rev()
                    .find(|a| a.fallback_position == res.fallback_position);
                let provider = served.map_or(res.provider.to_string(), |a| a.provider.to_string());
                let mut out =
                    axum::Json(encode_response(&res, &res.model, now_unix())).into_response();
                insert_attempts(
                    out.headers_mut(),
                    res.attempts.len(),
                    Some((&provider, &res.model)),
                );
                out
            }
            Err(f) => failure_response(&f),
        }
    }
}

fn unknown_route(alias: &str) -> Response {
    error(
        StatusCode::NOT_FOUND,
        &format!("no route for model \"{alias}\""),
        "invalid_request_error",
        Some("model_not_found"),
    )
}

/// A committed stream as OpenAI server-sent events: one `data:` per chunk,
/// `data: [DONE]` at a clean end, or one `data: {"error": ...}` event for a
/// failure after the commit point (and no `[DONE]`).
/// `stream_options.include_usage` in a request body.
fn wants_usage(body: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|b| {
            b.pointer("/stream_options/include_usage")
                .and_then(serde_json::Value::as_bool)
        })
        .unwrap_or(false)
}

/// Stream ids: unique per process.
static STREAMS: AtomicU64 = AtomicU64::new(0);

fn sse(stream: ChatStream, include_usage: bool) -> Response {
    let served = stream
        .attempts()
        .iter()
        .rev()
        .find(|a| a.fallback_position == stream.fallback_position())
        .map(|a| a.provider.to_string())
        .unwrap_or_else(|| stream.provider().to_owned());
    let model = stream.model().to_owned();
    let attempts = stream.attempts().len();
    let events = Frames {
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
        model: model.clone(),
        created: now_unix(),
    };
    let mut res = Response::new(Body::from_stream(events));
    let headers = res.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    insert_attempts(headers, attempts, Some((&served, &model)));
    res
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
                    let body = encode_error(
                        f.message().unwrap_or("the stream failed"),
                        "stream_error",
                        Some(f.class().as_metric_label()),
                    );
                    break format!("data: {body}\n\n");
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

/// Reloads the policy on SIGHUP and when the file's modification time
/// changes (checked every second). An invalid file is logged and ignored.
pub(crate) async fn reload_on_change(gateway: Arc<Gateway>, path: std::path::PathBuf) {
    let modified = |p: &std::path::PathBuf| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let mut seen = modified(&path);
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
        let now = modified(&path);
        if !forced && now == seen {
            continue;
        }
        seen = now;
        let result = std::fs::read_to_string(&path)
            .map_err(|e| e.to_string())
            .and_then(|text| Policy::from_toml(&text).map_err(|e| e.to_string()))
            .and_then(|policy| gateway.reload(policy).map_err(|e| e.to_string()));
        match result {
            Ok(()) => tracing::info!(path = %path.display(), "policy reloaded"),
            Err(e) => {
                tracing::error!(path = %path.display(), error = %e, "reload refused; the running policy stays")
            }
        }
    }
}
