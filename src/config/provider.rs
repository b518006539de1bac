//! `[[providers]]`: the upstreams, and the services built for them.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tower::ServiceBuilder;
use tower::util::BoxCloneSyncService;
use tower_llm_core::{
    BoxError, ChatRequest, ChatResponse, ChatStream, EmbeddingRequest, EmbeddingResponse, Failure,
    FailureClass, GenAiMetrics,
};
use tower_llm_providers::StreamTimeouts;
use tower_llm_providers::dialect::Dialect;
use tower_llm_providers::{
    Anthropic, AnthropicConfig, ApiKey, AwsCredentials, AzureOpenAi, AzureOpenAiConfig,
    AzureOpenAiEmbeddings, Bedrock, BedrockConfig, FirstTokenLimit, Gemini, GeminiConfig, OpenAi,
    OpenAiConfig, OpenAiEmbeddings, Provider, RequestBody, SilenceGuards,
};

use super::{ConfigError, LinkConfig};

/// The kind of a provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProviderKind {
    /// OpenAI Chat Completions (or any compatible server).
    Openai,
    /// Anthropic Messages.
    Anthropic,
    /// AWS Bedrock Converse.
    Bedrock,
    /// Azure OpenAI: a link's `model` names the deployment.
    Azure,
    /// Google Gemini (the Gemini Developer API).
    Gemini,
}

/// One `[[providers]]` entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderConfig {
    /// `name`: how chains refer to it, and its metric and breaker label.
    pub name: String,
    /// `kind`: `openai`, `anthropic`, `bedrock`, `azure` or `gemini`.
    pub kind: ProviderKind,
    /// `base_url`: the API root (OpenAI: `.../v1`; Anthropic: without
    /// `/v1`; Bedrock: the runtime endpoint; Azure: the resource's
    /// endpoint, `https://NAME.openai.azure.com`, required; Gemini:
    /// `.../v1beta`). Default: the official one.
    #[serde(default)]
    pub base_url: Option<String>,
    /// `api_key_env`: the environment variable holding the key (OpenAI,
    /// Anthropic, Azure, Gemini). Bedrock reads `AWS_ACCESS_KEY_ID`,
    /// `AWS_SECRET_ACCESS_KEY` and `AWS_SESSION_TOKEN`.
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// `api_version`: Azure's `api-version` query parameter (default
    /// [`AZURE_API_VERSION`](tower_llm_providers::AZURE_API_VERSION)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    /// `region`: Bedrock's region (default `us-east-1`).
    #[serde(default)]
    pub region: Option<String>,
    /// `max_concurrency`: a bulkhead; calls beyond it are shed at once
    /// and fail over (default: none).
    #[serde(default)]
    pub max_concurrency: Option<usize>,
    /// `health_url`: a cheap `GET` for the background probe (see
    /// `[health]`); optional.
    #[serde(default)]
    pub health_url: Option<String>,
    /// `connect_timeout_ms`: this provider's TCP + TLS connect timeout
    /// (default: the gateway's shared transport, 5,000). A provider with
    /// its own gets its own connection pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connect_timeout_ms: Option<u64>,
    /// `first_token_timeout_ms`: this provider's streaming first-token
    /// timeout (default: `[stream]`'s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_token_timeout_ms: Option<u64>,
    /// `idle_timeout_ms`: this provider's streaming idle timeout (default:
    /// `[stream]`'s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout_ms: Option<u64>,
    /// `max_completion_tokens`: send the token limit as
    /// `max_completion_tokens`, as OpenAI's o-series and gpt-5 models
    /// require (OpenAI and Azure; default false).
    #[serde(default)]
    pub max_completion_tokens: bool,
    /// `silence`: opt-in guards against a silent or garbled upstream
    /// ([`SilenceGuards`](tower_llm_providers::SilenceGuards):
    /// `head_timeout_ms`, the time to the response head; `learned_first_token`,
    /// a first-token limit learned from this provider's own time to first
    /// token; `malformed_chunks`, `"fail"` (default) or `"skip"` for an
    /// unreadable event after a stream's first token). Default: none, the
    /// fixed `first_token_timeout_ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub silence: Option<tower_llm_providers::SilenceGuards>,
    /// `rpm`: this provider's requests per minute (its key's or
    /// deployment's limit): calls through a `[[pools]]` entry are paced
    /// under it (default: none; a provider's own rate-limit headers still
    /// pace it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rpm: Option<u32>,
    /// `tpm`: this provider's tokens per minute (input and output), paced
    /// like `rpm`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tpm: Option<u32>,
    /// `burst_ms`: how much of `rpm` may go at once, in milliseconds of it
    /// (default 60000: the whole minute's). A provider that enforces its
    /// per-minute limit over shorter periods wants 1000 or less.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst_ms: Option<u32>,
}

/// A route's (or a provider's) service, boxed.
pub type RouteService<Res> = BoxCloneSyncService<ChatRequest, Res, Failure>;

/// A route's (or a provider's) embeddings service, boxed.
pub type EmbeddingService = BoxCloneSyncService<EmbeddingRequest, EmbeddingResponse, Failure>;

/// A provider's services, built once per policy and shared by every route
/// that names it.
#[derive(Debug, Clone)]
pub struct ProviderServices {
    /// Unary chat.
    pub chat: RouteService<ChatResponse>,
    /// Streaming chat.
    pub stream: RouteService<ChatStream>,
    /// Embeddings, for a kind of provider that has an embeddings API
    /// (OpenAI and Azure OpenAI).
    pub embeddings: Option<EmbeddingService>,
}

impl ProviderConfig {
    /// The API key named by `api_key_env`, read from the environment
    /// (`None` for Bedrock, whose credentials come from `AWS_*`).
    ///
    /// # Errors
    ///
    /// The variable is unset.
    pub fn api_key_from_env(&self) -> Result<Option<ApiKey>, ConfigError> {
        match &self.api_key_env {
            Some(var) => ApiKey::from_env(var).map(Some).ok_or_else(|| {
                ConfigError::new(format!(
                    "provider \"{}\": environment variable {var} is not set",
                    self.name
                ))
            }),
            None => Ok(None),
        }
    }

    /// `connect_timeout_ms`, if set.
    pub fn connect_timeout(&self) -> Option<Duration> {
        self.connect_timeout_ms.map(Duration::from_millis)
    }

    /// This provider as `link` uses it: the link's own connect, first-token
    /// and idle timeouts over the provider's.
    pub fn for_link(&self, link: &LinkConfig) -> ProviderConfig {
        ProviderConfig {
            connect_timeout_ms: link.connect_timeout_ms.or(self.connect_timeout_ms),
            first_token_timeout_ms: link.first_token_timeout_ms.or(self.first_token_timeout_ms),
            idle_timeout_ms: link.idle_timeout_ms.or(self.idle_timeout_ms),
            ..self.clone()
        }
    }

    /// A fresh bulkhead for this provider's `max_concurrency`, if it has one.
    /// Keep it across reloads (pass it to [`services`](Self::services)
    /// again) so calls in flight keep counting against the same limit.
    pub fn bulkhead(&self) -> Option<Arc<tokio::sync::Semaphore>> {
        self.max_concurrency
            .map(|n| Arc::new(tokio::sync::Semaphore::new(n)))
    }

    /// A fresh learned first-token limit of this provider's
    /// `silence.learned_first_token`, if it has one. Keep it across
    /// reloads (pass it to [`services_keeping`](Self::services_keeping)
    /// again) so what it learned survives them.
    ///
    /// # Errors
    ///
    /// Settings the limit refuses (never for a validated policy).
    pub fn first_token_limit(&self) -> Result<Option<FirstTokenLimit>, ConfigError> {
        match &self.silence {
            None => Ok(None),
            Some(guards) => guards
                .first_token_limit()
                .map_err(|e| ConfigError::new(format!("provider \"{}\": silence: {e}", self.name))),
        }
    }

    /// The provider's unary and streaming services over `transport`,
    /// behind `bulkhead` if given (see [`bulkhead`](Self::bulkhead)): a
    /// call that finds it full is shed at once with a circuit-open-class
    /// failure, which fails over without counting against the breaker. (A
    /// stream holds its permit up to its commit point.) A learned
    /// first-token limit (`silence.learned_first_token`) starts fresh: see
    /// [`services_keeping`](Self::services_keeping) to keep one.
    ///
    /// # Errors
    ///
    /// A missing key, or Bedrock credentials missing from the environment.
    pub fn services<T, B>(
        &self,
        key: Option<ApiKey>,
        transport: T,
        timeouts: StreamTimeouts,
        genai: &GenAiMetrics,
        bulkhead: Option<Arc<tokio::sync::Semaphore>>,
    ) -> Result<ProviderServices, ConfigError>
    where
        T: tower::Service<http::Request<RequestBody>, Response = http::Response<B>>
            + Clone
            + Send
            + Sync
            + 'static,
        T::Future: Send + 'static,
        T::Error: Into<BoxError>,
        B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let first_token = self.first_token_limit()?;
        self.services_keeping(key, transport, timeouts, genai, bulkhead, first_token)
    }

    /// As [`services`](Self::services), the stream's learned first-token
    /// limit being `first_token` (from
    /// [`first_token_limit`](Self::first_token_limit), kept across
    /// reloads) when the provider's `silence` asks for one.
    ///
    /// # Errors
    ///
    /// As [`services`](Self::services).
    pub fn services_keeping<T, B>(
        &self,
        key: Option<ApiKey>,
        transport: T,
        timeouts: StreamTimeouts,
        genai: &GenAiMetrics,
        bulkhead: Option<Arc<tokio::sync::Semaphore>>,
        first_token: Option<FirstTokenLimit>,
    ) -> Result<ProviderServices, ConfigError>
    where
        T: tower::Service<http::Request<RequestBody>, Response = http::Response<B>>
            + Clone
            + Send
            + Sync
            + 'static,
        T::Future: Send + 'static,
        T::Error: Into<BoxError>,
        B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let timeouts = StreamTimeouts {
            first_token: self
                .first_token_timeout_ms
                .map_or(timeouts.first_token, Duration::from_millis),
            idle: self
                .idle_timeout_ms
                .map_or(timeouts.idle, Duration::from_millis),
        };
        let guards = self.silence.clone().unwrap_or_default();
        let missing_key = || ConfigError::new(format!("provider \"{}\": no API key", self.name));
        let mut embeddings: Option<EmbeddingService> = None;
        let (chat, streaming): (RouteService<ChatResponse>, RouteService<ChatStream>) =
            match self.kind {
                ProviderKind::Openai => {
                    let mut config = OpenAiConfig::new(key.ok_or_else(missing_key)?)
                        .with_max_completion_tokens(self.max_completion_tokens);
                    if let Some(url) = &self.base_url {
                        config = config.with_base_url(url);
                    }
                    embeddings = Some(BoxCloneSyncService::new(
                        OpenAiEmbeddings::new(transport.clone(), config.clone())
                            .with_metrics(genai.clone()),
                    ));
                    let p = OpenAi::new(transport, config).with_metrics(genai.clone());
                    services_of(p, timeouts, &guards, first_token.clone())
                }
                ProviderKind::Anthropic => {
                    let mut config = AnthropicConfig::new(key.ok_or_else(missing_key)?);
                    if let Some(url) = &self.base_url {
                        config = config.with_base_url(url);
                    }
                    let p = Anthropic::new(transport, config).with_metrics(genai.clone());
                    services_of(p, timeouts, &guards, first_token.clone())
                }
                ProviderKind::Azure => {
                    // Validated: an Azure provider has its endpoint.
                    let endpoint = self.base_url.as_deref().unwrap_or_default();
                    let mut config = AzureOpenAiConfig::new(key.ok_or_else(missing_key)?, endpoint)
                        .with_max_completion_tokens(self.max_completion_tokens);
                    if let Some(version) = &self.api_version {
                        config = config.with_api_version(version);
                    }
                    embeddings = Some(BoxCloneSyncService::new(
                        AzureOpenAiEmbeddings::new(transport.clone(), config.clone())
                            .with_metrics(genai.clone()),
                    ));
                    let p = AzureOpenAi::new(transport, config).with_metrics(genai.clone());
                    services_of(p, timeouts, &guards, first_token.clone())
                }
                ProviderKind::Gemini => {
                    let mut config = GeminiConfig::new(key.ok_or_else(missing_key)?);
                    if let Some(url) = &self.base_url {
                        config = config.with_base_url(url);
                    }
                    let p = Gemini::new(transport, config).with_metrics(genai.clone());
                    services_of(p, timeouts, &guards, first_token.clone())
                }
                ProviderKind::Bedrock => {
                    let credentials = AwsCredentials::from_env().ok_or_else(|| {
                    ConfigError::new(format!(
                        "provider \"{}\": AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are not set",
                        self.name
                    ))
                })?;
                    let region = self.region.as_deref().unwrap_or("us-east-1");
                    let mut config = BedrockConfig::new(credentials, region);
                    if let Some(url) = &self.base_url {
                        config = config.with_endpoint(url);
                    }
                    let p = Bedrock::new(transport, config).with_metrics(genai.clone());
                    services_of(p, timeouts, &guards, first_token.clone())
                }
            };
        Ok(match bulkhead {
            None => ProviderServices {
                chat,
                stream: streaming,
                embeddings,
            },
            Some(permits) => ProviderServices {
                chat: shed_when_full(chat, &permits),
                stream: shed_when_full(streaming, &permits),
                embeddings: embeddings.map(|svc| shed_when_full(svc, &permits)),
            },
        })
    }
}

/// A provider's unary and streaming services, with its `silence` guards
/// (a head timeout on both; a learned first-token limit and the
/// malformed-chunk rule on the stream).
fn services_of<D, T, B>(
    p: Provider<D, T>,
    timeouts: StreamTimeouts,
    guards: &SilenceGuards,
    first_token: Option<FirstTokenLimit>,
) -> (RouteService<ChatResponse>, RouteService<ChatStream>)
where
    D: Dialect,
    T: tower::Service<http::Request<RequestBody>, Response = http::Response<B>>
        + Clone
        + Send
        + Sync
        + 'static,
    T::Future: Send + 'static,
    T::Error: Into<BoxError>,
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let p = match guards.head_timeout() {
        Some(limit) => p.with_head_timeout(limit),
        None => p,
    };
    let mut streaming = p
        .clone()
        .streaming()
        .with_timeouts(timeouts)
        .with_malformed_chunks(guards.malformed_chunks);
    if let Some(limit) = first_token.filter(|_| guards.learned_first_token.is_some()) {
        streaming = streaming.with_learned_first_token(limit);
    }
    (
        BoxCloneSyncService::new(p),
        BoxCloneSyncService::new(streaming),
    )
}

/// `svc` behind a shared semaphore, shedding calls that find it full.
fn shed_when_full<Req: Send + 'static, Res: Send + 'static>(
    svc: BoxCloneSyncService<Req, Res, Failure>,
    permits: &Arc<tokio::sync::Semaphore>,
) -> BoxCloneSyncService<Req, Res, Failure> {
    let svc = ServiceBuilder::new()
        .map_err(|e: BoxError| {
            if e.is::<tower::load_shed::error::Overloaded>() {
                Failure::new(FailureClass::CircuitOpen)
                    .with_message("bulkhead full: the call was shed")
            } else {
                Failure::from_error(e)
            }
        })
        .load_shed()
        .layer(tower::limit::GlobalConcurrencyLimitLayer::with_semaphore(
            permits.clone(),
        ))
        .service(svc);
    BoxCloneSyncService::new(svc)
}
