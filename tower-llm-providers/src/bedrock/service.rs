//! The [`Bedrock`] service.

use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::Body;
use tower_llm_core::{BoxError, ChatRequest, ChatResponse, Failure};
use tower_service::Service;

use super::config::{BedrockConfig, PROVIDER};
use super::converse::{decode, decode_error_scrubbed};
use super::event_stream::EventStreamWire;
use super::sign::signed;
use crate::ProviderFuture;
use crate::transport::{Answer, RequestBody, poll_transport, round_trip, take_ready};

/// AWS Bedrock Converse (`POST /model/{modelId}/converse`) as a
/// `Service<ChatRequest>`, signed with SigV4 by the `aws-sigv4` crate (not
/// the whole AWS SDK, which retries on its own).
///
/// Errors are classified by `x-amzn-ErrorType`: throttling is rate
/// limited, service unavailable / internal / model not ready are
/// transient, model timeout is a timeout, validation is a bad request (or
/// context window exceeded when the input is too long), access denied is
/// auth, resource not found is not found, service quota exceeded is quota
/// exhausted.
#[derive(Debug, Clone)]
pub struct Bedrock<T> {
    transport: T,
    config: Arc<BedrockConfig>,
    metrics: tower_llm_core::GenAiMetrics,
}

impl<T> Bedrock<T> {
    /// A service sending through `transport`.
    pub fn new(transport: T, config: BedrockConfig) -> Self {
        Bedrock {
            transport,
            config: Arc::new(config),
            metrics: tower_llm_core::GenAiMetrics::global(),
        }
    }

    /// Records the GenAI client metrics (`gen_ai.client.operation.duration`,
    /// `gen_ai.client.token.usage`) on `metrics`. Default:
    /// [`GenAiMetrics::global`](tower_llm_core::GenAiMetrics::global), a
    /// no-op until the host installs an OpenTelemetry SDK.
    #[must_use]
    pub fn with_metrics(mut self, metrics: tower_llm_core::GenAiMetrics) -> Self {
        self.metrics = metrics;
        self
    }
}

impl<T, B> Service<ChatRequest> for Bedrock<T>
where
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
        poll_transport(&mut self.transport, cx, PROVIDER)
    }

    fn call(&mut self, req: ChatRequest) -> Self::Future {
        let mut transport = take_ready(&mut self.transport);
        let config = self.config.clone();
        let metrics = self.metrics.clone();
        Box::pin(async move {
            let call = chat(&mut transport, &config, &req);
            let model = crate::transport::metric_model(&req);
            crate::transport::timed_chat(&metrics, PROVIDER, &model, call).await
        })
    }
}

/// One unary Converse call.
async fn chat<T, B>(
    transport: &mut T,
    config: &BedrockConfig,
    req: &ChatRequest,
) -> Result<ChatResponse, Failure>
where
    T: Service<http::Request<RequestBody>, Response = http::Response<B>>,
    T::Error: Into<BoxError>,
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let http_req = signed(config, req, "converse")?;
    let Answer {
        parts,
        body: bytes,
        latency,
    } = round_trip(transport, http_req, config.max_body, PROVIDER).await?;
    if !parts.status.is_success() {
        return Err(decode_error_scrubbed(
            parts.status,
            &parts.headers,
            &bytes,
            &config.scrub(),
        ));
    }
    let request_id = parts
        .headers
        .get("x-amzn-requestid")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    decode(&bytes, request_id, &req.model, latency).map_err(|f| f.with_status(parts.status))
}

impl<T> Bedrock<T> {
    /// This provider as a streaming service (ConverseStream, AWS
    /// event-stream framing); see [`Streaming`](crate::Streaming).
    pub fn streaming(self) -> crate::Streaming<Self> {
        crate::Streaming::new(self)
    }
}

impl<T> crate::streaming::private::Sealed for Bedrock<T> {}

impl<T, B> crate::StreamSource for Bedrock<T>
where
    T: Service<http::Request<RequestBody>, Response = http::Response<B>> + Clone + Send + 'static,
    T::Future: Send + 'static,
    T::Error: Into<BoxError>,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    fn poll_ready_stream(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Failure>> {
        poll_transport(&mut self.transport, cx, PROVIDER)
    }

    fn open_stream(
        &mut self,
        req: ChatRequest,
        timeouts: crate::StreamTimeouts,
    ) -> crate::StreamFuture {
        let transport = take_ready(&mut self.transport);
        let config = self.config.clone();
        let metrics = self.metrics.clone();
        Box::pin(async move {
            let http_req = signed(&config, &req, "converse-stream")?;
            let open = crate::streaming::Open {
                wire: EventStreamWire::new(config.scrub()),
                provider: PROVIDER,
                model: req.model.to_string(),
                metric_model: crate::transport::metric_model(&req),
                max_error_body: config.max_body,
                timeouts,
                deadline: tower_llm_core::Deadline::of(&req),
                metrics,
                error: |parts: &http::response::Parts, body: &[u8]| {
                    decode_error_scrubbed(parts.status, &parts.headers, body, &config.scrub())
                },
            };
            crate::streaming::open(transport, http_req, open).await
        })
    }
}
