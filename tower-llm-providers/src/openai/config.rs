//! The settings of the OpenAI services, and the request they all send.

use std::sync::Arc;

use bytes::Bytes;
use http::header::{AUTHORIZATION, CONTENT_TYPE};
use tower_llm_core::Failure;

use crate::failure::build_error;
use crate::secret::ApiKey;
use crate::transport::DEFAULT_MAX_BODY;
use crate::wire::secret_header;

/// The provider name in failures and metrics.
pub(crate) const PROVIDER: &str = "openai";

/// Settings of an [`OpenAi`](crate::OpenAi) service (and of
/// [`OpenAiEmbeddings`](crate::OpenAiEmbeddings)), and the OpenAI
/// [`Dialect`](crate::Dialect): `OpenAi::new(transport, config)` is
/// [`Provider::new`](crate::Provider::new) with this dialect.
///
/// `base_url` makes any OpenAI-compatible server work (vLLM, Ollama,
/// Groq, ...): the service posts to `{base_url}/chat/completions`. Azure
/// OpenAI (deployment paths, the `api-key` header) is
/// [`AzureOpenAiConfig`](crate::AzureOpenAiConfig).
///
/// ```
/// use tower_llm_providers::{ApiKey, OpenAiConfig};
///
/// let official = OpenAiConfig::new(ApiKey::new("sk-..."));
/// assert_eq!(official.base_url(), "https://api.openai.com/v1");
/// let local = OpenAiConfig::new(ApiKey::new("unused"))
///     .with_base_url("http://127.0.0.1:11434/v1"); // Ollama
/// assert!(format!("{local:?}").contains("[redacted]"));
/// ```
#[derive(Debug, Clone)]
pub struct OpenAiConfig {
    pub(crate) api_key: ApiKey,
    base_url: Arc<str>,
    pub(crate) max_body: usize,
    pub(crate) max_completion_tokens: bool,
}

impl OpenAiConfig {
    /// The official API with `api_key`.
    pub fn new(api_key: ApiKey) -> Self {
        OpenAiConfig {
            api_key,
            base_url: "https://api.openai.com/v1".into(),
            max_body: DEFAULT_MAX_BODY,
            max_completion_tokens: false,
        }
    }

    /// Send `max_tokens` as `max_completion_tokens`, as OpenAI's o-series
    /// and gpt-5 models require (compatible servers mostly want
    /// `max_tokens`, the default).
    #[must_use]
    pub fn with_max_completion_tokens(mut self, on: bool) -> Self {
        self.max_completion_tokens = on;
        self
    }

    /// Another OpenAI-compatible server (no trailing slash needed).
    #[must_use]
    pub fn with_base_url(mut self, base_url: &str) -> Self {
        self.base_url = base_url.trim_end_matches('/').into();
        self
    }

    /// The largest response body read (default 16 MiB); a larger one is an
    /// invalid-response failure.
    #[must_use]
    pub fn with_max_body(mut self, max_body: usize) -> Self {
        self.max_body = max_body;
        self
    }

    /// The base URL.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }
}

impl OpenAiConfig {
    /// A JSON POST of `body` to `{base_url}/{path}` with the bearer key
    /// (a sensitive header).
    pub(crate) fn post(&self, path: &str, body: Vec<u8>) -> Result<http::Request<Bytes>, Failure> {
        http::Request::post(format!("{}/{path}", self.base_url))
            .header(CONTENT_TYPE, "application/json")
            .header(
                AUTHORIZATION,
                secret_header(PROVIDER, &format!("Bearer {}", self.api_key.expose()))?,
            )
            .body(Bytes::from(body))
            .map_err(build_error(PROVIDER))
    }
}
