//! Embeddings: the [`Embeddings`] service over any [`EmbeddingDialect`],
//! the OpenAI one ([`OpenAiEmbeddings`]), and the OpenAI answer shape.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::Body;
use serde::Deserialize;
use serde_json::{Value, json};
use tower_llm_core::{BoxError, EmbeddingRequest, EmbeddingResponse, Failure, GenAiMetrics};
use tower_service::Service;

use super::config::{OpenAiConfig, PROVIDER};
use crate::dialect::{Dialect, finish};
use crate::failure::{invalid, invalid_json, to_json};
use crate::provider::exchange;
use crate::transport::{RequestBody, metric_model, poll_transport, take_ready};

/// A [`Dialect`] that also speaks its provider's embeddings API: how an
/// [`EmbeddingRequest`] becomes an HTTP request, and how the answer
/// becomes an [`EmbeddingResponse`]. Error answers, signing, the body cap
/// and the secrets are the [`Dialect`]'s own, shared with chat.
///
/// [`Embeddings<D, T>`](Embeddings) runs one over any HTTP transport `T`.
/// OpenAI ([`OpenAiConfig`]) and Azure OpenAI
/// ([`AzureOpenAiConfig`](crate::AzureOpenAiConfig)) implement it.
pub trait EmbeddingDialect: Dialect {
    /// The HTTP request for `req`: method, URL, headers and body. The
    /// service signs it ([`Dialect::sign`]) and adds the trace context.
    ///
    /// # Errors
    ///
    /// A request this provider cannot take: a bad-request failure, never
    /// sent.
    fn encode_embeddings(&self, req: &EmbeddingRequest) -> Result<http::Request<Bytes>, Failure>;

    /// Normalises a 2xx answer to `req`, which took `latency`: one vector
    /// per input, in input order. The service adds the answer's status to
    /// a failure.
    ///
    /// # Errors
    ///
    /// A body this dialect cannot read: an invalid-response failure naming
    /// what is missing, quoting nothing of the body.
    fn decode_embeddings(
        &self,
        req: &EmbeddingRequest,
        answer: &http::Response<Bytes>,
        latency: Duration,
    ) -> Result<EmbeddingResponse, Failure>;
}

/// The response future of [`Embeddings`]: boxed, one network round trip.
pub type EmbeddingsFuture =
    Pin<Box<dyn Future<Output = Result<EmbeddingResponse, Failure>> + Send>>;

/// A provider's embeddings API as a `Service<EmbeddingRequest>`: the
/// [`EmbeddingDialect`] `D` spoken over any HTTP transport `T`, with the
/// same transport, body cap and error classification as its chat service
/// ([`Provider<D, T>`](crate::Provider)).
///
/// A call encodes the request with the dialect, signs it, adds the trace
/// context, sends it once, reads the answer with the dialect's body cap
/// and decodes it (or classifies the error answer with
/// [`Dialect::decode_error`]). The transport never retries: the retry
/// layer is the one retry owner. `poll_ready` is the transport's; `call`
/// takes the transport that was made ready and leaves a clone in its
/// place. Cloning clones the transport and shares the dialect.
///
/// Each call records the GenAI client metrics of an `embeddings`
/// operation ([`GenAiMetrics::record_embeddings`](tower_llm_core::GenAiMetrics::record_embeddings))
/// on the metrics given by [`with_metrics`](Self::with_metrics) (default:
/// the global ones, a no-op until the host installs an SDK).
///
/// ```
/// use tower::ServiceExt;
/// use tower_llm_core::EmbeddingRequest;
/// use tower_llm_providers::mock::{Reply, ScriptedTransport};
/// use tower_llm_providers::{ApiKey, OpenAiConfig, OpenAiEmbeddings};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let transport = ScriptedTransport::new(Reply::json(
///     200,
///     r#"{"object": "list", "model": "text-embedding-3-small",
///         "data": [{"object": "embedding", "index": 0, "embedding": [0.5, -0.25]}],
///         "usage": {"prompt_tokens": 2, "total_tokens": 2}}"#,
/// ));
/// let embed = OpenAiEmbeddings::new(transport.clone(), OpenAiConfig::new(ApiKey::new("sk-...")));
/// let answer = embed
///     .oneshot(EmbeddingRequest::new("text-embedding-3-small", vec!["hi".into()]))
///     .await
///     .unwrap();
/// assert_eq!(answer.embeddings, vec![vec![0.5, -0.25]]);
/// assert_eq!(transport.received()[0].path, "/v1/embeddings");
/// # }
/// ```
#[derive(Debug)]
pub struct Embeddings<D, T> {
    transport: T,
    dialect: Arc<D>,
    metrics: GenAiMetrics,
}

/// OpenAI Embeddings (`POST {base_url}/embeddings`) as a
/// `Service<EmbeddingRequest>`: [`Embeddings`] with the OpenAI dialect,
/// [`OpenAiConfig`] (the same settings, transport and error classification
/// as [`OpenAi`](crate::OpenAi)).
pub type OpenAiEmbeddings<T> = Embeddings<OpenAiConfig, T>;

impl<D, T: Clone> Clone for Embeddings<D, T> {
    fn clone(&self) -> Self {
        Embeddings {
            transport: self.transport.clone(),
            dialect: self.dialect.clone(),
            metrics: self.metrics.clone(),
        }
    }
}

impl<D, T> Embeddings<D, T> {
    /// A service speaking `dialect` through `transport`.
    pub fn new(transport: T, dialect: D) -> Self {
        Embeddings {
            transport,
            dialect: Arc::new(dialect),
            metrics: GenAiMetrics::global(),
        }
    }

    /// Records the GenAI client metrics (`gen_ai.client.operation.duration`,
    /// `gen_ai.client.token.usage`, operation `embeddings`) on `metrics`.
    #[must_use]
    pub fn with_metrics(mut self, metrics: GenAiMetrics) -> Self {
        self.metrics = metrics;
        self
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

impl<D, T, B> Service<EmbeddingRequest> for Embeddings<D, T>
where
    D: EmbeddingDialect,
    T: Service<http::Request<RequestBody>, Response = http::Response<B>> + Clone + Send + 'static,
    T::Future: Send + 'static,
    T::Error: Into<BoxError>,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = EmbeddingResponse;
    type Error = Failure;
    type Future = EmbeddingsFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        poll_transport(&mut self.transport, cx, self.dialect.provider())
    }

    fn call(&mut self, req: EmbeddingRequest) -> Self::Future {
        let mut transport = take_ready(&mut self.transport);
        let dialect = self.dialect.clone();
        let metrics = self.metrics.clone();
        Box::pin(async move {
            let model = metric_model(&req);
            let started = tokio::time::Instant::now();
            let result = async {
                let http_req = finish(&*dialect, dialect.encode_embeddings(&req)?)?;
                let (answer, latency) = exchange(&mut transport, &*dialect, http_req).await?;
                dialect
                    .decode_embeddings(&req, &answer, latency)
                    .map_err(|f| f.with_status(answer.status()))
            }
            .await;
            metrics.record_embeddings(
                dialect.provider(),
                &model,
                started.elapsed(),
                result.as_ref().map(|r| r.prompt_tokens),
            );
            result
        })
    }
}

/// OpenAI Embeddings: `POST {base_url}/embeddings` with the bearer key.
impl EmbeddingDialect for OpenAiConfig {
    fn encode_embeddings(&self, req: &EmbeddingRequest) -> Result<http::Request<Bytes>, Failure> {
        self.post("embeddings", to_json(PROVIDER, &encode_embeddings(req))?)
    }

    fn decode_embeddings(
        &self,
        _req: &EmbeddingRequest,
        answer: &http::Response<Bytes>,
        latency: Duration,
    ) -> Result<EmbeddingResponse, Failure> {
        decode_embeddings(answer.body(), latency)
    }
}

/// The OpenAI Embeddings request body for `req` (float vectors).
pub(crate) fn encode_embeddings(req: &EmbeddingRequest) -> Value {
    let mut body = json!({"model": req.model, "input": req.input, "encoding_format": "float"});
    if let (Some(d), Some(obj)) = (req.dimensions, body.as_object_mut()) {
        obj.insert("dimensions".into(), json!(d));
    }
    body
}

#[derive(Deserialize)]
struct WireEmbeddings {
    #[serde(default)]
    model: Option<String>,
    data: Vec<WireEmbedding>,
    #[serde(default)]
    usage: Option<WireEmbeddingUsage>,
}

#[derive(Deserialize)]
struct WireEmbedding {
    index: usize,
    embedding: Vec<f32>,
}

#[derive(Deserialize)]
struct WireEmbeddingUsage {
    #[serde(default)]
    prompt_tokens: u32,
}

/// Normalises an Embeddings response body: vectors in input order (by
/// their `index`); a missing or duplicate index, or a missing `model`, is
/// an invalid response.
pub fn decode_embeddings(body: &[u8], latency: Duration) -> Result<EmbeddingResponse, Failure> {
    decode_embeddings_of(PROVIDER, body, latency, None)
}

/// Normalises an OpenAI-shaped Embeddings response body for `provider`.
/// Without a `model` in the body, `model` is taken (a provider that names
/// the model in the URL, not the answer); with neither, the answer is
/// invalid.
pub(crate) fn decode_embeddings_of(
    provider: &'static str,
    body: &[u8],
    latency: Duration,
    model: Option<&str>,
) -> Result<EmbeddingResponse, Failure> {
    let wire: WireEmbeddings =
        serde_json::from_slice(body).map_err(|e| invalid_json(provider, &e))?;
    let model = match (wire.model, model) {
        (Some(m), _) => m,
        (None, Some(m)) => m.to_owned(),
        (None, None) => return Err(invalid(provider, "missing field `model`")),
    };
    let n = wire.data.len();
    let mut embeddings: Vec<Option<Vec<f32>>> = vec![None; n];
    for item in wire.data {
        match embeddings.get_mut(item.index) {
            Some(slot @ None) => *slot = Some(item.embedding),
            _ => {
                return Err(invalid(
                    provider,
                    format!("bad or duplicate `index` {}", item.index),
                ));
            }
        }
    }
    Ok(EmbeddingResponse {
        model,
        provider: provider.into(),
        embeddings: embeddings.into_iter().flatten().collect(),
        prompt_tokens: wire.usage.map_or(0, |u| u.prompt_tokens),
        latency,
        attempts: Vec::new(),
    })
}
