//! [`Provider`]: one terminal service for every [`Dialect`].

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::Body;
use tower_llm_core::{BoxError, ChatRequest, ChatResponse, Deadline, Failure, GenAiMetrics};
use tower_service::Service;

use crate::dialect::{self, Dialect};
use crate::streaming::live::{Open, open};
use crate::streaming::service::{StreamFuture, StreamSource, Streaming, private};
use crate::transport::{
    Answer, RequestBody, metric_model, poll_transport, round_trip, take_ready, timed_chat,
};

/// The response future of the provider services: boxed, since a provider
/// call is one network round trip (a layer's hot path is never boxed).
pub type ProviderFuture = Pin<Box<dyn Future<Output = Result<ChatResponse, Failure>> + Send>>;

/// A provider as a `Service<ChatRequest>`: the [`Dialect`] `D` spoken over
/// any HTTP transport `T` (a `Service<http::Request<RequestBody>>`, such
/// as a pooled hyper-util client or a test double).
///
/// [`OpenAi`](crate::OpenAi), [`Anthropic`](crate::Anthropic) and
/// [`Bedrock`](crate::Bedrock) are this service with their dialect; a new
/// provider is a new dialect, not a new service. A call encodes the
/// request with the dialect ([`encode`](Dialect::encode), then
/// [`sign`](Dialect::sign)), adds the trace context (`traceparent`),
/// sends it once, reads the answer with the dialect's body cap, and
/// decodes it ([`decode`](Dialect::decode), or
/// [`decode_error`](Dialect::decode_error) for a non-2xx status); transport
/// errors become classified failures. The GenAI client metrics of each
/// call are recorded on the [`GenAiMetrics`] given.
///
/// The transport never retries: the retry layer is the one retry owner.
/// `poll_ready` is the transport's; `call` takes the transport that was
/// made ready and leaves a clone in its place. Cloning a provider clones
/// its transport and shares its dialect.
///
/// Opt-in, [`with_head_timeout`](Self::with_head_timeout) bounds the time
/// to the answer's head (status and headers), for unary calls and streams.
#[derive(Debug)]
pub struct Provider<D, T> {
    transport: T,
    dialect: Arc<D>,
    metrics: GenAiMetrics,
    head_timeout: Option<Duration>,
}

impl<D, T: Clone> Clone for Provider<D, T> {
    fn clone(&self) -> Self {
        Provider {
            transport: self.transport.clone(),
            dialect: self.dialect.clone(),
            metrics: self.metrics.clone(),
            head_timeout: self.head_timeout,
        }
    }
}

impl<D, T> Provider<D, T> {
    /// A service speaking `dialect` through `transport`.
    pub fn new(transport: T, dialect: D) -> Self {
        Provider {
            transport,
            dialect: Arc::new(dialect),
            metrics: GenAiMetrics::global(),
            head_timeout: None,
        }
    }

    /// Bounds the time from sending a request to its answer's head (the
    /// status and headers): an upstream that accepted the connection but
    /// does not answer fails after `timeout` with a
    /// [`Timeout`](tower_llm_core::FailureClass::Timeout) failure ("no
    /// response head within ..."), which the retry and fallback layers
    /// move on from. The body is not bounded by it: a slow body after a
    /// quick head is the business of the retry layer's attempt timeout
    /// (for unary calls) and of the first-token and idle timeouts (for
    /// streams, where it applies too: a stream's head comes before its
    /// first token, so the head limit can be far below a first-token
    /// timeout that allows for long thinking). Default: none.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower::ServiceExt;
    /// use tower_llm_core::{ChatRequest, FailureClass, Message};
    /// use tower_llm_providers::mock::{Reply, ScriptedTransport};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let transport = ScriptedTransport::new(Reply::openai_text("hi").after(Duration::from_secs(60)));
    /// let provider = transport.openai().with_head_timeout(Duration::from_secs(5));
    /// let started = tokio::time::Instant::now();
    /// let err = provider
    ///     .oneshot(ChatRequest::new("gpt-4o-mini", vec![Message::user("hi")]))
    ///     .await
    ///     .unwrap_err();
    /// assert_eq!(err.class(), FailureClass::Timeout);
    /// assert_eq!(started.elapsed(), Duration::from_secs(5));
    /// # }
    /// ```
    #[must_use]
    pub fn with_head_timeout(mut self, timeout: Duration) -> Self {
        self.head_timeout = Some(timeout);
        self
    }

    /// The response-head timeout, if set.
    pub fn head_timeout(&self) -> Option<Duration> {
        self.head_timeout
    }

    /// Records the GenAI client metrics (`gen_ai.client.operation.duration`,
    /// `gen_ai.client.token.usage`) on `metrics`. Default:
    /// [`GenAiMetrics::global`], a no-op until the host installs an
    /// OpenTelemetry SDK.
    #[must_use]
    pub fn with_metrics(mut self, metrics: GenAiMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// This provider as a streaming service: the dialect's streamed answer
    /// (OpenAI `stream: true` with `stream_options.include_usage`,
    /// Anthropic `stream: true`, Bedrock ConverseStream), answered at its
    /// commit point; see [`Streaming`].
    pub fn streaming(self) -> Streaming<Self> {
        Streaming::new(self)
    }

    /// The dialect (for a built-in provider, its settings).
    pub fn dialect(&self) -> &D {
        &self.dialect
    }

    /// The transport.
    pub fn get_ref(&self) -> &T {
        &self.transport
    }

    /// The transport, mutably.
    pub fn get_mut(&mut self) -> &mut T {
        &mut self.transport
    }

    /// The transport, consuming the service.
    pub fn into_inner(self) -> T {
        self.transport
    }
}

impl<D, T, B> Service<ChatRequest> for Provider<D, T>
where
    D: Dialect,
    T: Service<http::Request<RequestBody>, Response = http::Response<B>> + Clone + Send + 'static,
    T::Future: Send + 'static,
    T::Error: Into<BoxError>,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = ChatResponse;
    type Error = Failure;
    type Future = ProviderFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        poll_transport(&mut self.transport, cx, self.dialect.provider())
    }

    fn call(&mut self, req: ChatRequest) -> Self::Future {
        let mut transport = take_ready(&mut self.transport);
        let dialect = self.dialect.clone();
        let metrics = self.metrics.clone();
        let head = self.head_timeout;
        Box::pin(async move {
            let call = chat(&mut transport, &*dialect, &req, head);
            let model = metric_model(&req);
            timed_chat(&metrics, dialect.provider(), &model, call).await
        })
    }
}

/// One unary call.
async fn chat<D, T, B>(
    transport: &mut T,
    dialect: &D,
    req: &ChatRequest,
    head: Option<Duration>,
) -> Result<ChatResponse, Failure>
where
    D: Dialect,
    T: Service<http::Request<RequestBody>, Response = http::Response<B>>,
    T::Error: Into<BoxError>,
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let http_req = dialect::request(dialect, req, false)?;
    let (answer, latency) = exchange_within(transport, dialect, http_req, head).await?;
    let status = answer.status();
    dialect
        .decode(req, &answer, latency)
        .map_err(|f| f.with_status(status))
}

/// Sends `http_req` and reads the whole answer with the dialect's body
/// cap: a 2xx answer with its round-trip time, or the dialect's failure
/// for an error answer.
pub(crate) async fn exchange<D, T, B>(
    transport: &mut T,
    dialect: &D,
    http_req: http::Request<RequestBody>,
) -> Result<(http::Response<Bytes>, Duration), Failure>
where
    D: Dialect,
    T: Service<http::Request<RequestBody>, Response = http::Response<B>>,
    T::Error: Into<BoxError>,
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    exchange_within(transport, dialect, http_req, None).await
}

/// [`exchange`], the answer's head within `head` when given.
async fn exchange_within<D, T, B>(
    transport: &mut T,
    dialect: &D,
    http_req: http::Request<RequestBody>,
    head: Option<Duration>,
) -> Result<(http::Response<Bytes>, Duration), Failure>
where
    D: Dialect,
    T: Service<http::Request<RequestBody>, Response = http::Response<B>>,
    T::Error: Into<BoxError>,
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let Answer {
        parts,
        body,
        latency,
    } = round_trip(
        transport,
        http_req,
        head,
        dialect.max_body(),
        dialect.provider(),
    )
    .await?;
    if !parts.status.is_success() {
        return Err(dialect.decode_error(parts.status, &parts.headers, &body));
    }
    Ok((http::Response::from_parts(parts, body), latency))
}

impl<D, T, B> StreamSource for Provider<D, T>
where
    D: Dialect,
    T: Service<http::Request<RequestBody>, Response = http::Response<B>> + Clone + Send + 'static,
    T::Future: Send + 'static,
    T::Error: Into<BoxError>,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
}

impl<D, T, B> private::Sealed for Provider<D, T>
where
    D: Dialect,
    T: Service<http::Request<RequestBody>, Response = http::Response<B>> + Clone + Send + 'static,
    T::Future: Send + 'static,
    T::Error: Into<BoxError>,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    fn poll_ready_stream(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Failure>> {
        poll_transport(&mut self.transport, cx, self.dialect.provider())
    }

    fn open_stream(&mut self, req: ChatRequest, settings: private::StreamSettings) -> StreamFuture {
        let transport = take_ready(&mut self.transport);
        let dialect = self.dialect.clone();
        let metrics = self.metrics.clone();
        let head_timeout = self.head_timeout;
        let private::StreamSettings {
            timeouts,
            learned,
            malformed,
            skipped,
        } = settings;
        Box::pin(async move {
            let http_req = dialect::request(&*dialect, &req, true)?;
            let settings = Open {
                wire: dialect.wire(),
                provider: dialect.provider(),
                model: req.model.to_string(),
                metric_model: metric_model(&req),
                max_error_body: dialect.max_body(),
                timeouts,
                learned,
                head_timeout,
                malformed,
                skipped,
                deadline: Deadline::of(&req),
                metrics,
                error: |parts: &http::response::Parts, body: &[u8]| {
                    dialect.decode_error(parts.status, &parts.headers, body)
                },
            };
            open(transport, http_req, settings).await
        })
    }
}
