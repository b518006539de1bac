//! Provider-neutral embedding types.

use std::sync::Arc;
use std::time::Duration;

use http::Extensions;
use serde::{Deserialize, Serialize};

use crate::{AttemptRecord, RecordsAttempts};

/// A request to embed one or more texts.
///
/// ```
/// use tower_llm_core::EmbeddingRequest;
///
/// let req = EmbeddingRequest::new("text-embedding-3-small", vec!["hello".into(), "world".into()]);
/// assert_eq!(req.input.len(), 2);
/// ```
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct EmbeddingRequest {
    /// The embedding model.
    pub model: Arc<str>,
    /// The texts, one vector each; shared, so a copy of the request (for a
    /// retry or a failover) costs a reference count.
    pub input: Arc<Vec<String>>,
    /// Ask for shorter vectors (models that support it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dimensions: Option<u32>,
    /// What the call carries between the layers (see
    /// [`Call`](crate::Call)); set by the layers, not serialised.
    #[serde(skip)]
    pub call: Option<crate::Call>,
    /// Values of your own that travel with the request; not serialised.
    #[serde(skip)]
    pub extensions: Extensions,
}

impl EmbeddingRequest {
    /// A request for `model` over `input`.
    pub fn new(model: impl Into<Arc<str>>, input: Vec<String>) -> Self {
        EmbeddingRequest {
            model: model.into(),
            input: Arc::new(input),
            ..EmbeddingRequest::default()
        }
    }
}

crate::call::call_field!(EmbeddingRequest);

/// The vectors of an [`EmbeddingRequest`], in input order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EmbeddingResponse {
    /// The model that served.
    pub model: String,
    /// The provider that served.
    pub provider: Arc<str>,
    /// One vector per input text, in order.
    pub embeddings: Vec<Vec<f32>>,
    /// Input tokens.
    pub prompt_tokens: u32,
    /// Time from sending the request to having the whole answer.
    #[serde(with = "crate::layer::serde_millis")]
    pub latency: Duration,
    /// Every attempt the call made (attached by the outermost layer).
    #[serde(default)]
    pub attempts: Vec<AttemptRecord>,
}

impl RecordsAttempts for EmbeddingResponse {
    fn record_attempts(&mut self, attempts: Vec<AttemptRecord>) {
        self.attempts = attempts;
    }
}
