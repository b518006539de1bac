//! Embeddings: the [`OpenAiEmbeddings`] service and its answer.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::Body;
use serde::Deserialize;
use serde_json::json;
use tower_llm_core::{BoxError, EmbeddingRequest, EmbeddingResponse, Failure};
use tower_service::Service;

use super::config::{OpenAiConfig, PROVIDER};
use crate::dialect::finish;
use crate::failure::{invalid, invalid_json, to_json};
use crate::provider::exchange;
use crate::transport::{RequestBody, poll_transport, take_ready};

/// OpenAI Embeddings (`POST {base_url}/embeddings`) as a
/// `Service<EmbeddingRequest>`, with the same settings, transport and error
/// classification as [`OpenAi`](crate::OpenAi).
#[derive(Debug, Clone)]
pub struct OpenAiEmbeddings<T> {
    transport: T,
    config: Arc<OpenAiConfig>,
}

impl<T> OpenAiEmbeddings<T> {
    /// A service sending through `transport`.
    pub fn new(transport: T, config: OpenAiConfig) -> Self {
        OpenAiEmbeddings {
            transport,
            config: Arc::new(config),
        }
    }
}

impl<T, B> Service<EmbeddingRequest> for OpenAiEmbeddings<T>
where
    T: Service<http::Request<RequestBody>, Response = http::Response<B>> + Clone + Send + 'static,
    T::Future: Send + 'static,
    T::Error: Into<BoxError>,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = EmbeddingResponse;
    type Error = Failure;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<EmbeddingResponse, Failure>> + Send>,
    >;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        poll_transport(&mut self.transport, cx, PROVIDER)
    }

    fn call(&mut self, req: EmbeddingRequest) -> Self::Future {
        let mut transport = take_ready(&mut self.transport);
        let config = self.config.clone();
        Box::pin(async move {
            let mut body =
                json!({"model": req.model, "input": req.input, "encoding_format": "float"});
            if let (Some(d), Some(obj)) = (req.dimensions, body.as_object_mut()) {
                obj.insert("dimensions".into(), json!(d));
            }
            let body = to_json(PROVIDER, &body)?;
            let http_req = finish(&*config, config.post("embeddings", body)?)?;
            let (answer, latency) = exchange(&mut transport, &*config, http_req).await?;
            decode_embeddings(answer.body(), latency).map_err(|f| f.with_status(answer.status()))
        })
    }
}

#[derive(Deserialize)]
struct WireEmbeddings {
    model: String,
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
/// their `index`); a missing or duplicate index is an invalid response.
pub fn decode_embeddings(body: &[u8], latency: Duration) -> Result<EmbeddingResponse, Failure> {
    let wire: WireEmbeddings =
        serde_json::from_slice(body).map_err(|e| invalid_json(PROVIDER, &e))?;
    let n = wire.data.len();
    let mut embeddings: Vec<Option<Vec<f32>>> = vec![None; n];
    for item in wire.data {
        match embeddings.get_mut(item.index) {
            Some(slot @ None) => *slot = Some(item.embedding),
            _ => {
                return Err(invalid(
                    PROVIDER,
                    format!("bad or duplicate `index` {}", item.index),
                ));
            }
        }
    }
    Ok(EmbeddingResponse {
        model: wire.model,
        provider: PROVIDER.into(),
        embeddings: embeddings.into_iter().flatten().collect(),
        prompt_tokens: wire.usage.map_or(0, |u| u.prompt_tokens),
        latency,
        attempts: Vec::new(),
    })
}
