//! Policy as data: every layer's settings, the providers and the routes,
//! loaded from TOML or JSON, validated at load, and turned into stacks.
//!
//! ```
//! use tower_llm::config::Policy;
//!
//! let policy = Policy::from_toml(r#"
//!     [deadline]
//!     total_ms = 30000
//!
//!     [retry]
//!     max_attempts = 3
//!     attempt_timeout_ms = 10000
//!     base_ms = 200
//!     factor = 4
//!     max_ms = 3200
//!     jitter = 0.2
//!
//!     [breaker]
//!     consecutive_failures = 5
//!     cooldown_ms = 30000
//!
//!     [[providers]]
//!     name = "a"
//!     kind = "openai"
//!     base_url = "http://127.0.0.1:9001/v1"
//!     api_key_env = "A_KEY"
//!
//!     [[providers]]
//!     name = "b"
//!     kind = "anthropic"
//!     api_key_env = "B_KEY"
//!
//!     [[routes]]
//!     model = "smart"
//!     chain = [{ provider = "a", model = "gpt-4o-mini" }, { provider = "b", model = "claude-x" }]
//! "#).unwrap();
//! assert_eq!(policy.route("smart").unwrap().chain.len(), 2);
//!
//! let err = Policy::from_toml(r#"
//!     [[routes]]
//!     model = "smart"
//!     chain = [{ provider = "nobody", model = "m" }]
//! "#).unwrap_err();
//! assert!(err.to_string().contains("unknown provider \"nobody\""));
//! ```
//!
//! `[deadline]` is the deadline layer's own [`DeadlineConfig`], `[retry]`
//! the retry layer's [`RetryConfig`], `[breaker]` the breaker's
//! [`BreakerConfig`] and `[stream]` the providers' [`StreamTimeouts`]: one
//! name per setting in Rust, TOML and JSON, one validation (theirs).
//! Retry, fallback and breaker policies can also be named once and used by
//! routes, in seed 004's shape ([`OperationPolicy`], [`FallbackPolicyDoc`]). Routes add health-aware ordering and a
//! degraded answer, links their own attempts and attempt timeout, the
//! long-context and filtered-content roles and an [`AdmitRule`] on the
//! request's [`InboundHeaders`]; providers their own connect and streaming
//! timeouts.
//!
//! Every key is documented on the struct that holds it; a missing key takes
//! its default, an unknown key is refused with its dotted path and line (a
//! typo must not silently fall back to a default).

use serde::{Deserialize, Serialize};
use tower_llm_breaker::BreakerConfig;
use tower_llm_core::Price;
use tower_llm_cost::QuotaConfig;
use tower_llm_deadline::DeadlineConfig;
use tower_llm_idempotency::IdempotencyConfig;
use tower_llm_providers::StreamTimeouts;
use tower_llm_retry::RetryConfig;

mod build;
mod embed;
mod error;
mod keys;
mod load;
mod named;
mod pool;
mod provider;
mod route;
#[cfg(test)]
mod tests;
mod validate;

pub use build::{
    BuildContext, COMPLETE_HEADER, HedgeBudgets, InboundHeadersOf, RouteAnswer, TENANT_HEADER,
    TenantHeader,
};
pub use error::ConfigError;
pub use keys::{KeyPart, PolicyKey};
pub use load::HostSettings;
pub use named::{
    BackoffKind, CostLimit, DEFAULT_DEGRADED_TEXT, DEGRADED_TEMPLATE, FallbackPolicyDoc,
    FallbackStep, Idempotency, NeverBypass, OperationPolicy, RISK_HEADER, STALE_CACHE, SeedBackoff,
    SeedClass,
};
pub use pool::{DeploymentConfig, PoolConfig, Pools};
pub use provider::{
    EmbeddingService, ProviderConfig, ProviderKind, ProviderServices, RouteService,
};
pub use route::{AdmitRule, HedgeTarget, InboundHeaders, LinkConfig, ResolvedRoute, RouteConfig};

/// A whole policy: the file's top level.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    /// `[deadline]`: the deadline layer's own settings ([`DeadlineConfig`]):
    /// the call's total budget.
    #[serde(default)]
    pub deadline: DeadlineConfig,
    /// `[retry]`: the retry layer's own settings ([`RetryConfig`]: the
    /// same field names): attempts per link, their timeout, the backoff
    /// and its jitter, the retry budget, `max_retry_after_ms`.
    #[serde(default)]
    pub retry: RetryConfig,
    /// `[breaker]`: the breaker's own settings ([`BreakerConfig`]: the
    /// same field names): consecutive, ratio-window and slow-call
    /// triggers, cooldown and its growth, half-open probes, rate-limit
    /// holds, what counts. One circuit per provider and model.
    #[serde(default)]
    pub breaker: BreakerConfig,
    /// `[stream]`: the providers' own streaming timeouts
    /// ([`StreamTimeouts`]: `first_token_timeout_ms`, `idle_timeout_ms`).
    #[serde(default)]
    pub stream: StreamTimeouts,
    /// `[[providers]]`: the upstreams, by name.
    #[serde(default)]
    pub providers: Vec<ProviderConfig>,
    /// `[[routes]]`: model aliases and their fallback chains.
    #[serde(default)]
    pub routes: Vec<RouteConfig>,
    /// `[[retry_policies]]`: named operation retry policies (seed 004's
    /// first example), which routes name with `retry_policy`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retry_policies: Vec<OperationPolicy>,
    /// `[[fallback_policies]]`: named fallback ladders (seed 004's second
    /// example), which routes name with `fallback_policy`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fallback_policies: Vec<FallbackPolicyDoc>,
    /// `breaker_key`: what a circuit is keyed by, any of `"provider"`,
    /// `"model"`, `"credential"` (the provider's `api_key_env`; AWS keys
    /// for Bedrock), `"region"` (the provider's `region`). Default
    /// `["provider", "model"]`: one circuit per provider and model.
    /// `["provider"]` shares one circuit among a provider's models;
    /// `["credential"]` makes providers that share a key share a circuit
    /// (a revoked key opens them all); `["region"]` opens a whole region.
    #[serde(default = "KeyPart::default_key")]
    pub breaker_key: Vec<KeyPart>,
    /// `[breaker_policies.NAME]`: named breaker settings (each a
    /// [`BreakerConfig`]), which routes name with `breaker_policy`.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub breaker_policies: std::collections::BTreeMap<String, BreakerConfig>,
    /// `[idempotency]`: the idempotency layer's own settings
    /// ([`IdempotencyConfig`]: the same field names). Present (even empty),
    /// a call carrying an idempotency key is answered once and replayed;
    /// absent (the default), no idempotency layer is built.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency: Option<IdempotencyConfig>,
    /// `[cache]`: the in-process store of every route's `cache`
    /// ([`CacheStoreConfig`](tower_llm_cache::CacheStoreConfig):
    /// `max_bytes`, default 64 MiB). Routes cache only with their own
    /// `cache` (or a `STALE_CACHE` step).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<tower_llm_cache::CacheStoreConfig>,
    /// `[complete]`: hold the streams of requests that carry
    /// `x-llm-complete: true` until complete, on every route
    /// ([`CompleteConfig`](tower_llm_resume::CompleteConfig): `max_bytes`,
    /// `max_ms`); a route's own `complete` holds all of its streams.
    /// Absent (the default): the header is ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub complete: Option<tower_llm_resume::CompleteConfig>,
    /// `[prices.PROVIDER."MODEL"]`: what a provider's model costs, in
    /// dollars per million tokens (a [`Price`]: `input`, `output`,
    /// `cached_input`). A priced link reports each attempt's cost (on its
    /// attempt record, `x-llm-cost`, `ai_router_cost_total`); a route held
    /// to `max_total_cost` or `[quotas]` must have every link priced.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub prices: std::collections::BTreeMap<String, std::collections::BTreeMap<String, Price>>,
    /// `[quotas]`: every tenant's spend and token limits over a window
    /// (the cost layer's own [`QuotaConfig`]: `window_secs`, `max_cost`,
    /// `max_tokens`, `[quotas.tenants.NAME]`, `shadow`, `hold_secs`). The
    /// tenant is the raw bytes of the `x-tenant-id` header (none: the
    /// empty id). Present, every route is held to it, so every link must
    /// be priced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quotas: Option<QuotaConfig>,
    /// `[[pools]]`: one model over several providers' deployments
    /// ([`PoolConfig`]), named by chains as a link's `provider`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pools: Vec<PoolConfig>,
}

impl Policy {
    /// The route for the alias `model`.
    pub fn route(&self, model: &str) -> Option<&RouteConfig> {
        self.routes.iter().find(|r| r.model == model)
    }
    /// The provider named `name`.
    pub fn provider(&self, name: &str) -> Option<&ProviderConfig> {
        self.providers.iter().find(|p| p.name == name)
    }
    /// The price of `provider`'s `model`, if `[prices]` has one.
    pub fn price(&self, provider: &str, model: &str) -> Option<Price> {
        self.prices.get(provider)?.get(model).copied()
    }
}
