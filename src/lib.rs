//! Tower middleware that keeps calls to LLM providers alive when providers
//! are not.
//!
//! Each concern is its own [`tower::Layer`], so you stack them in your own
//! [`tower::ServiceBuilder`] around any provider service: a typed chat
//! service ([`ChatRequest`] → [`ChatResponse`]) or a plain HTTP client
//! (`http::Request<B>` → `http::Response<B>`).
//!
//! ```text
//! request ─► DeadlineLayer        one absolute deadline for the whole logical call
//!             └► FallbackLayer    ordered chain of links: primary, then alternates
//!                  └► RetryLayer  per link: bounded attempts, backoff + jitter, Retry-After
//!                       └► BreakerLayer   per link & key: fail fast while a provider is sick
//!                            └► provider Service
//! ```
//!
//! Available today: the shared vocabulary (re-exported at this crate's
//! root from [`tower_llm_core`]), the [`deadline`], [`fallback`], [`retry`]
//! and [`breaker`] layers, and the OpenAI, Anthropic and Bedrock
//! [`providers`] with a default rustls transport.
//!
//! ```
//! use std::time::Duration;
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//! use tower_llm::prelude::*;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let provider = service_fn(|req: ChatRequest| async move {
//!     tokio::time::sleep(Duration::from_secs(60)).await; // a hung provider
//!     Err::<ChatResponse, _>(Failure::new(FailureClass::Transient))
//! });
//! let svc = ServiceBuilder::new()
//!     .llm_deadline(Duration::from_secs(30))
//!     .service(provider);
//!
//! let req = ChatRequest::new("gpt-4o-mini", vec![Message::user("Hello")]);
//! let err = svc.oneshot(req).await.unwrap_err();
//! assert!(err.is_deadline_exceeded());
//! # }
//! ```
//!
//! # Crates
//!
//! | crate | what |
//! |---|---|
//! | [`tower_llm_core`] | failure classes, classifiers, deadline, attempt log, chat types |
//! | [`tower_llm_deadline`] | [`DeadlineLayer`](deadline::DeadlineLayer) |
//! | [`tower_llm_retry`] | [`RetryLayer`](retry::RetryLayer): backoff, `Retry-After`, per-attempt timeout, retry budget |
//! | [`tower_llm_breaker`] | [`BreakerLayer`](breaker::BreakerLayer): per-key circuit breaker with half-open probes |
//! | [`tower_llm_fallback`] | [`FallbackLayer`](fallback::FallbackLayer): an ordered chain of links within one deadline |
//! | [`tower_llm_providers`] | [`OpenAi`](providers::OpenAi), [`Anthropic`](providers::Anthropic), [`Bedrock`](providers::Bedrock): wire formats, normalisation, error classification |
//!
//! # Streaming
//!
//! `OpenAi::streaming()` (and the same on `Anthropic` and `Bedrock`) gives a
//! [`Streaming`](providers::Streaming) service answering a [`ChatStream`].
//! Its future resolves at the **commit point**, the first content frame:
//! every failure before it (HTTP error, in-band error event, empty stream,
//! first-token timeout) is an ordinary `Err` that the retry, breaker and
//! fallback layers handle exactly as for a unary call, so the same stack
//! works around it. After it nothing retries: a failure ends the stream
//! with one terminal `Err` item, and the breaker does not see it. See
//! [`providers::streaming`].
//!
//! # Policy as data
//!
//! [`config::Policy`] holds every layer's settings, the providers and the
//! routes; it loads from TOML or JSON, is validated at load (every problem
//! reported), and [`Policy::build_route`](config::Policy::build_route)
//! turns it into the stack. The `tower-llm-gateway` crate serves it and reloads it
//! without a restart.
//!
//! # Telemetry
//!
//! OpenTelemetry metrics through the `opentelemetry` API only (the host
//! installs the SDK; without one they are a no-op): the seed-002
//! `ai_router_*` metrics, recorded once per call from its attempt records
//! by the outermost layer ([`telemetry`]), the breaker's
//! `llm_circuit_state` gauge
//! ([`BreakerHandle::register_gauge`](breaker::BreakerHandle::register_gauge))
//! and the GenAI client metrics on the providers ([`GenAiMetrics`]).
//! `tracing` spans per call (`llm.call`) and per attempt (`llm.attempt`);
//! outbound provider requests carry the W3C `traceparent` of the current
//! span (feature `otel`).
//!
//! # Feature flags
//!
//! - `otel` (default): W3C trace context on outbound provider requests,
//!   from the current `tracing` span via `tracing-opentelemetry`.
//! - `https` (default): the default rustls transport,
//!   [`providers::https`].
//! - `mock`: the test doubles `providers::mock` (`ScriptedTransport`,
//!   `MockServer`).

mod builder;
pub mod config;
/// Guides and reference, one module per topic (the repository's `docs/`).
pub mod guide;

pub use builder::ServiceBuilderExt;
pub use tower_llm_core::*;

/// The deadline layer ([`tower_llm_deadline`]).
pub mod deadline {
    pub use tower_llm_deadline::{
        DeadlineConfig, DeadlineLayer, EnforceDeadline, GRPC_TIMEOUT, ResponseFuture,
        X_REQUEST_TIMEOUT_MS, header_timeout, parse_grpc_timeout, parse_request_timeout_ms,
    };
}

/// The retry layer ([`tower_llm_retry`]).
pub mod retry {
    pub use tower_llm_retry::{
        Attempt, AttemptFuture, AttemptLayer, Backoff, Budget, BudgetConfig, FixedFraction,
        InvalidBackoff, InvalidBudget, InvalidRetryConfig, Jitter, JitterSpec, NamedJitter,
        RandomSource, ResponseFuture, Retry, RetryBudget, RetryConfig, RetryLayer, RetryPolicy,
        SplitMix64,
    };
}

/// The circuit breaker layer ([`tower_llm_breaker`]).
pub mod breaker {
    pub use tower_llm_breaker::{
        AuthorityKey, Breaker, BreakerConfig, BreakerCount, BreakerHandle, BreakerKey,
        BreakerLayer, BreakerStore, Circuit, CircuitSnapshot, CircuitState, InvalidBreakerConfig,
        KeyFn, KeyView, LinkKey, MemoryStore, Observer, RatioTrigger, ResponseFuture, Transition,
        TransitionReason,
    };
}

/// The fallback layer ([`tower_llm_fallback`]).
pub mod fallback {
    pub use tower_llm_fallback::{
        Fallback, FallbackBuilder, FallbackLayer, InvalidChain, LinkService, LinkSpec,
        ResponseFuture,
    };
}

/// The hedge layer ([`tower_llm_hedge`]).
pub mod hedge {
    pub use tower_llm_hedge::{
        CrossHedgeLayer, Hedge, HedgeConfig, HedgeLayer, InvalidHedgeConfig, ResponseFuture,
    };
}

/// Streams rescued after their first token, and streams held until
/// complete ([`tower_llm_resume`]; see [`guide::recovery`]).
pub mod resume {
    pub use tower_llm_resume::*;
}

/// Cost budgets and tenant quotas ([`tower_llm_cost`]).
pub mod cost {
    pub use tower_llm_cost::{
        Ask, BudgetLayer, CallBudget, CostAnswer, CostFuture, CostLayer, CostRequest, CostService,
        Exhausted, IMAGE_TOKENS, InputBound, InvalidQuota, Limits, MESSAGE_OVERHEAD_TOKENS,
        MemoryQuota, Meter, QuotaConfig, QuotaHold, QuotaRefusal, QuotaStore,
        REQUEST_OVERHEAD_TOKENS, Reserve,
    };
}

/// Pools of deployments and their pacing ([`tower_llm_pool`]).
pub mod pool {
    pub use tower_llm_pool::{
        AffinityFn, Deployment, DeploymentLoad, DeploymentStatus, HeaderIssue, HeaderIssues,
        LimitHeaders, LoadSnapshot, MAX_HEADER_COUNT, MAX_HEADER_WAIT, ObserveFuture,
        ObserveRateLimits, ObserveRateLimitsLayer, PaceLimits, PaceSnapshot, PaceTicket, Pacer,
        Pool, PoolAnswer, PoolFuture, PoolRequest, PoolStatus, RateLimitHeaders, SharedPacing,
        SharedTake, SharedTicket,
    };
}

/// The idempotency layer ([`tower_llm_idempotency`]).
pub mod idempotency {
    pub use tower_llm_idempotency::{
        Begin, BoxFuture, Capture, Concurrent, Fingerprint, IDEMPOTENCY_KEY, Idempotency,
        IdempotencyConfig, IdempotencyLayer, IdempotencyStore, IdempotentAnswer, IdempotentRequest,
        InvalidIdempotencyConfig, Lease, MemoryStore, NoTenant, ResponseFuture, StoreError, Stored,
        TenantFn,
    };
}

/// The response cache and its stale-safe rung ([`tower_llm_cache`]).
pub mod cache {
    pub use tower_llm_cache::{
        CacheAnswer, CacheConfig, CacheControl, CacheEntry, CacheHeaders, CacheLayer, CacheStore,
        CacheStoreConfig, InvalidCacheConfig, MemoryCache, OwnHeaders, RISK_HEADER, ResponseFuture,
        Sink, StoreError,
    };
    pub use tower_llm_core::{CacheOutcome, CacheStatus};
}

/// Provider services ([`tower_llm_providers`]): OpenAI, Azure OpenAI,
/// Anthropic, AWS Bedrock, Google Gemini.
pub mod providers {
    #[cfg(feature = "https")]
    pub use tower_llm_providers::https;
    #[cfg(feature = "mock")]
    pub use tower_llm_providers::mock;
    pub use tower_llm_providers::{
        AZURE_API_VERSION, Anthropic, AnthropicConfig, ApiKey, AwsCredentials, AzureOpenAi,
        AzureOpenAiConfig, AzureOpenAiEmbeddings, Bedrock, BedrockConfig, DEFAULT_MAX_BODY,
        Dialect, EmbeddingDialect, Embeddings, EmbeddingsFuture, FirstTokenLimit,
        FirstTokenLimitConfig, Gemini, GeminiConfig, MAX_MESSAGE, MalformedChunks, OpenAi,
        OpenAiConfig, OpenAiEmbeddings, Provider, ProviderFuture, RequestBody, SilenceGuards,
        StreamFuture, StreamSource, StreamTimeouts, Streaming, anthropic, azure, bedrock, dialect,
        gemini, openai, stream, streaming,
    };
}

/// The names most programs need: `use tower_llm::prelude::*;`.
pub mod prelude {
    pub use crate::ServiceBuilderExt;
    pub use crate::breaker::{BreakerConfig, BreakerLayer};
    pub use crate::deadline::DeadlineLayer;
    pub use crate::fallback::{FallbackLayer, LinkSpec};
    pub use crate::hedge::{HedgeConfig, HedgeLayer};
    pub use crate::retry::{Backoff, RetryLayer};
    pub use tower_llm_core::{
        ChatRequest, ChatResponse, ChatStream, Deadline, Failure, FailureClass, LlmRequest, Message,
    };
}

/// Every Rust code block of `README.md`, compiled as a doctest
/// (`cargo test --doc`), so the README cannot drift from the API. Only
/// under `cfg(doctest)`: it is not part of the crate's docs.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
