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

use std::collections::HashSet;
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use std::sync::Arc;
use tower::ServiceBuilder;
use tower::ServiceExt as _;
use tower::util::BoxCloneSyncService;
use tower_llm_breaker::{BreakerConfig, BreakerKey, BreakerLayer, KeyFn};

use tower_llm_core::{
    BoxError, ChatRequest, ChatResponse, ChatStream, Failure, FailureClass, FailurePolicy,
    GenAiMetrics, Link, Metrics, RecordsAttempts,
};
use tower_llm_deadline::{DeadlineConfig, DeadlineLayer};
use tower_llm_fallback::{FallbackLayer, LinkSpec};
use tower_llm_hedge::{HedgeConfig, HedgeLayer};
use tower_llm_idempotency::IdempotentAnswer;
use tower_llm_idempotency::{IdempotencyConfig, IdempotencyLayer};
use tower_llm_providers::StreamTimeouts;
use tower_llm_providers::{
    Anthropic, AnthropicConfig, ApiKey, AwsCredentials, Bedrock, BedrockConfig, OpenAi,
    OpenAiConfig, RequestBody,
};
use tower_llm_retry::{JitterSpec, NamedJitter, RetryConfig, RetryLayer};

use crate::ServiceBuilderExt;

mod named;

pub use named::{
    BackoffKind, CostLimit, DEFAULT_DEGRADED_TEXT, DEGRADED_TEMPLATE, FallbackPolicyDoc,
    FallbackStep, Idempotency, NeverBypass, OperationPolicy, RISK_HEADER, SeedBackoff, SeedClass,
};

/// A whole policy: the file's top level.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    /// Where a gateway listens (`host:port`); optional.
    #[serde(default)]
    pub listen: Option<String>,
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
    /// `[health]`: optional background probes of the providers.
    #[serde(default)]
    pub health: HealthPolicy,
    /// `[server]`: the limits of a gateway's HTTP server (ignored by a
    /// library stack).
    #[serde(default)]
    pub server: ServerPolicy,
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
    /// `[breaker_shared]`: share the circuits with every replica using the
    /// same Redis (a gateway builds its breaker on
    /// `tower_llm_breaker_redis::RedisBreakerStore`; ignored by a library stack).
    /// Default: none, each process keeps its own circuits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub breaker_shared: Option<SharedBreakerPolicy>,
    /// `[idempotency]`: the idempotency layer's own settings
    /// ([`IdempotencyConfig`]: the same field names). Present (even empty),
    /// a call carrying an idempotency key is answered once and replayed;
    /// absent (the default), no idempotency layer is built.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency: Option<IdempotencyConfig>,
    /// `[idempotency_shared]`: keep `[idempotency]`'s answers and
    /// reservations in Redis, shared by every replica (a gateway builds
    /// the layer on `tower_llm_idempotency_redis::RedisIdempotencyStore`; ignored by
    /// a library stack). Needs `[idempotency]`. Default: none, in-process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_shared: Option<SharedIdempotencyPolicy>,
}

/// `[breaker_shared]` and `[idempotency_shared]`: the Redis a gateway
/// shares its circuits or its idempotent answers on.
///
/// Its `Debug` never shows the URL's password.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SharedRedis {
    /// `redis`: the Redis URL, `redis://[:password@]host[:port][/db]`
    /// (required). For circuits, the shared threshold, window, cooldown
    /// and probe count are `[breaker]`'s (a route's `breaker_policy`
    /// judges its calls locally but the fleet's decisions follow
    /// `[breaker]`); for idempotent answers, each replica answers
    /// duplicates in-process while Redis is down.
    pub redis: String,
    /// `prefix`: the prefix of the Redis keys and channel (default
    /// `tower-llm:breaker:` for circuits, `tower-llm:idem:` for answers);
    /// replicas share when they share it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
}

/// `[breaker_shared]`: where the circuits are shared.
pub type SharedBreakerPolicy = SharedRedis;

/// `[idempotency_shared]`: where idempotent answers are shared.
pub type SharedIdempotencyPolicy = SharedRedis;

impl SharedRedis {
    /// The Redis URL with any password replaced by `***`, for logs.
    pub fn redacted(&self) -> String {
        redact_url(&self.redis)
    }

    /// Refuses a URL that is not Redis's, naming `table`.
    fn check(&self, table: &str, problems: &mut Vec<String>) {
        if !["redis://", "rediss://", "redis+unix://", "unix://"]
            .iter()
            .any(|s| self.redis.starts_with(s))
        {
            problems.push(format!(
                "{table}.redis {:?} is not a redis:// URL",
                self.redacted()
            ));
        }
    }
}

impl fmt::Debug for SharedRedis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedRedis")
            .field("redis", &self.redacted())
            .field("prefix", &self.prefix)
            .finish()
    }
}

/// `url` with the user-info part (`user:password@`) replaced by `***@`.
fn redact_url(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}://***@{}", &rest[at + 1..]),
        None => url.to_owned(),
    }
}

/// `[health]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HealthPolicy {
    /// `probe_interval_ms`: how often each provider with a `health_url` is
    /// probed (all at once); 0 (the default) turns probes off. A reload
    /// changes it.
    pub probe_interval_ms: u64,
    /// `probe_timeout_ms`: how long one probe may take before it counts as
    /// down (default 5,000).
    pub probe_timeout_ms: u64,
}

impl Default for HealthPolicy {
    fn default() -> Self {
        HealthPolicy {
            probe_interval_ms: 0,
            probe_timeout_ms: 5_000,
        }
    }
}

/// `[server]`: the limits of a gateway's HTTP server.
///
/// Each limit answers one way a client can hold the gateway's resources:
/// a slow request head (slowloris), an idle kept-alive connection, a slow
/// request body, a client that stops reading its answer, too many
/// connections, too many calls in flight. They take effect when the server
/// starts; a reload keeps the running server's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerPolicy {
    /// `header_read_timeout_ms`: the longest a client may take to send a
    /// request's head: a new connection's first, from when it is accepted;
    /// a kept-alive connection's next, from its first byte (default
    /// 10,000). A connection that takes longer is closed.
    pub header_read_timeout_ms: u64,
    /// `idle_timeout_ms`: how long a kept-alive connection may sit, after
    /// its last answer was sent, with no request in progress and no byte
    /// received or sent, before it is closed (default 60,000).
    pub idle_timeout_ms: u64,
    /// `body_read_timeout_ms`: the longest a client may take to send a
    /// whole request body; a slower one gets 408 (default 30,000).
    pub body_read_timeout_ms: u64,
    /// `send_timeout_ms`: how long the server may wait, with an answer to
    /// write, for a client that reads nothing; the connection is then
    /// closed (default 30,000).
    pub send_timeout_ms: u64,
    /// `max_connections`: open connections at most; beyond it new
    /// connections wait in the listen queue (the kernel's backlog) until
    /// one closes (default 4,096).
    pub max_connections: usize,
    /// `max_in_flight`: chat calls served at once, from when their body
    /// has been read until their answer has been sent whole (a stream until
    /// it ends); beyond it a call is answered 503 with `Retry-After: 1`
    /// (default 4,096, as `max_connections`: a call in flight holds about
    /// 50 KiB besides its body, measured over plain HTTP with
    /// `examples/deadline_lateness.rs`, so 4,096 of them hold about
    /// 200 MiB, beside the body bound's 256 MiB; minute-long streams make a
    /// thousand concurrent calls ordinary).
    pub max_in_flight: usize,
    /// `max_body_bytes_in_flight`: the bytes of request bodies the gateway
    /// holds at once, being read or being served; a chunk that would go
    /// past it gets 503 with `Retry-After: 1` (default 268,435,456:
    /// 256 MiB). Each chunk counts as it arrives, so a client trickling a
    /// body holds only what it has sent.
    pub max_body_bytes_in_flight: usize,
    /// `reload_settle_ms`: on a file change, how long the policy file must
    /// stay unchanged before it is read (a writer that truncates and then
    /// rewrites is never caught half-way; default 500).
    pub reload_settle_ms: u64,
}

impl Default for ServerPolicy {
    fn default() -> Self {
        ServerPolicy {
            header_read_timeout_ms: 10_000,
            idle_timeout_ms: 60_000,
            body_read_timeout_ms: 30_000,
            send_timeout_ms: 30_000,
            max_connections: 4_096,
            max_in_flight: 4_096,
            max_body_bytes_in_flight: 256 * 1024 * 1024,
            reload_settle_ms: 500,
        }
    }
}

impl ServerPolicy {
    /// The largest `max_connections` and `max_in_flight`.
    pub const MAX_LIMIT: usize = 1 << 20;
    /// The largest `max_body_bytes_in_flight` (the most a tokio semaphore
    /// counts).
    pub const MAX_BODY_BYTES: usize = tokio::sync::Semaphore::MAX_PERMITS;

    /// Checks every limit is above 0 and the counts within
    /// [`MAX_LIMIT`](Self::MAX_LIMIT) and
    /// [`MAX_BODY_BYTES`](Self::MAX_BODY_BYTES).
    ///
    /// # Errors
    ///
    /// One problem per limit at 0.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut p = Vec::new();
        for (key, value) in [
            ("header_read_timeout_ms", self.header_read_timeout_ms),
            ("idle_timeout_ms", self.idle_timeout_ms),
            ("body_read_timeout_ms", self.body_read_timeout_ms),
            ("send_timeout_ms", self.send_timeout_ms),
            (
                "max_connections",
                u64::try_from(self.max_connections).unwrap_or(u64::MAX),
            ),
            (
                "max_in_flight",
                u64::try_from(self.max_in_flight).unwrap_or(u64::MAX),
            ),
            (
                "max_body_bytes_in_flight",
                u64::try_from(self.max_body_bytes_in_flight).unwrap_or(u64::MAX),
            ),
        ] {
            if value == 0 {
                p.push(format!("server.{key} must be above 0"));
            }
        }
        for (key, value, max) in [
            ("max_connections", self.max_connections, Self::MAX_LIMIT),
            ("max_in_flight", self.max_in_flight, Self::MAX_LIMIT),
            (
                "max_body_bytes_in_flight",
                self.max_body_bytes_in_flight,
                Self::MAX_BODY_BYTES,
            ),
        ] {
            if value > max {
                p.push(format!("server.{key} must be at most {max}, not {value}"));
            }
        }
        if p.is_empty() {
            Ok(())
        } else {
            Err(ConfigError { problems: p })
        }
    }

    /// `header_read_timeout_ms`.
    pub fn header_read_timeout(&self) -> Duration {
        Duration::from_millis(self.header_read_timeout_ms)
    }

    /// `idle_timeout_ms`.
    pub fn idle_timeout(&self) -> Duration {
        Duration::from_millis(self.idle_timeout_ms)
    }

    /// `body_read_timeout_ms`.
    pub fn body_read_timeout(&self) -> Duration {
        Duration::from_millis(self.body_read_timeout_ms)
    }

    /// `send_timeout_ms`.
    pub fn send_timeout(&self) -> Duration {
        Duration::from_millis(self.send_timeout_ms)
    }

    /// `reload_settle_ms`.
    pub fn reload_settle(&self) -> Duration {
        Duration::from_millis(self.reload_settle_ms)
    }
}

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
}

/// One `[[providers]]` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderConfig {
    /// `name`: how chains refer to it, and its metric and breaker label.
    pub name: String,
    /// `kind`: `openai`, `anthropic` or `bedrock`.
    pub kind: ProviderKind,
    /// `base_url`: the API root (OpenAI: `.../v1`; Anthropic: without
    /// `/v1`; Bedrock: the runtime endpoint). Default: the official one.
    #[serde(default)]
    pub base_url: Option<String>,
    /// `api_key_env`: the environment variable holding the key (OpenAI,
    /// Anthropic). Bedrock reads `AWS_ACCESS_KEY_ID`,
    /// `AWS_SECRET_ACCESS_KEY` and `AWS_SESSION_TOKEN`.
    #[serde(default)]
    pub api_key_env: Option<String>,
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
    /// require (OpenAI only; default false).
    #[serde(default)]
    pub max_completion_tokens: bool,
}

/// One link of a chain: `{ provider = "a", model = "gpt-4o-mini" }`,
/// optionally with its own attempts and attempt timeout, the fallback
/// layer's opt-in roles, an admission rule and hedging.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkConfig {
    /// `provider`: a provider's `name`.
    pub provider: String,
    /// `model`: the model id sent to that provider.
    pub model: String,
    /// `max_attempts`: this link's attempts, 1 to 16 (default: the
    /// route's retry policy's). The retry budget stays the route's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u8>,
    /// `attempt_timeout_ms`: this link's attempt timeout (default: the
    /// route's retry policy's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt_timeout_ms: Option<u64>,
    /// `connect_timeout_ms`: this link's connect timeout (default: its
    /// provider's). A link with its own gets its own connection pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connect_timeout_ms: Option<u64>,
    /// `first_token_timeout_ms`: this link's streaming first-token timeout
    /// (default: its provider's, else `[stream]`'s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_token_timeout_ms: Option<u64>,
    /// `idle_timeout_ms`: this link's streaming idle timeout (default: its
    /// provider's, else `[stream]`'s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout_ms: Option<u64>,
    /// `long_context`: a context-window failure of an earlier link fails
    /// over to this one (`LinkSpec::serves_long_context`; default false).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub long_context: bool,
    /// `filtered_content`: a content-filter refusal of an earlier link
    /// fails over to this one (`LinkSpec::allows_filtered_content`;
    /// default false).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub filtered_content: bool,
    /// `admit`: only requests that pass this rule may use the link (data
    /// residency, tenant rules); others skip it without calling it
    /// (`skipped_by_policy` in the attempt log). Default: every request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admit: Option<AdmitRule>,
    /// `requires_verification`: an answer served by this link is flagged
    /// for the caller to verify (the gateway sends
    /// `x-llm-requires-verification: true`; default false).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub requires_verification: bool,
    /// `hedge`: the hedge layer's own settings ([`HedgeConfig`]) for this
    /// link: a slow attempt gets a second one to the same link, the first
    /// success wins (default: the route's `hedge`, else no hedging).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hedge: Option<HedgeConfig>,
    /// `hedge_to`: where this link's hedge goes ([`HedgeTarget`]: `"same"`,
    /// `"next"`, or `{ provider = "…", model = "…" }`; default: the
    /// route's `hedge_to`, else `"same"`). Needs a `hedge` here or on the
    /// route.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hedge_to: Option<HedgeTarget>,
}

/// Where a link's hedge goes: `hedge_to` in the policy file.
///
/// A slow primary can be hedged onto a healthy backup rather than onto
/// itself: with `hedge_to = "next"`, once the hedge delay passes without an
/// answer, a second attempt goes to the next link of the chain, and the
/// first success wins (the other is cancelled). The hedge's request names
/// its target, so its attempt record, breaker circuit and metrics are the
/// target's; its model is the target's.
///
/// ```
/// use tower_llm::config::{HedgeTarget, Policy};
///
/// let policy = Policy::from_toml(r#"
///     [[providers]]
///     name = "openai"
///     kind = "openai"
///     api_key_env = "OPENAI_API_KEY"
///     [[providers]]
///     name = "anthropic"
///     kind = "anthropic"
///     api_key_env = "ANTHROPIC_API_KEY"
///     [[routes]]
///     model = "smart"
///     hedge = { delay_ms = 800 }
///     hedge_to = "next"
///     chain = [
///         { provider = "openai", model = "gpt-4o-mini" },
///         { provider = "anthropic", model = "claude-haiku-4-5",
///           hedge_to = { provider = "openai", model = "gpt-4o-mini" } },
///     ]
/// "#).unwrap();
/// assert_eq!(policy.routes[0].hedge_to, Some(HedgeTarget::Next));
/// assert_eq!(
///     policy.routes[0].chain[1].hedge_to,
///     Some(HedgeTarget::Link { provider: "openai".into(), model: "gpt-4o-mini".into() }),
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "HedgeTargetRepr", into = "HedgeTargetRepr")]
#[non_exhaustive]
pub enum HedgeTarget {
    /// `"same"`: a second connection to the same link (the default).
    Same,
    /// `"next"`: the next link of the chain. Written on a route, the last
    /// link (which has none) hedges to itself; written on the last link,
    /// the policy is refused.
    Next,
    /// `{ provider = "…", model = "…" }`: that provider (one of
    /// `[[providers]]`) and model, with the route's retry settings.
    Link {
        /// The provider's `name`.
        provider: String,
        /// The model to ask it for.
        model: String,
    },
}

#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum HedgeTargetRepr {
    Word(String),
    Link(HedgeTargetLink),
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct HedgeTargetLink {
    provider: String,
    model: String,
}

impl TryFrom<HedgeTargetRepr> for HedgeTarget {
    type Error = String;

    fn try_from(repr: HedgeTargetRepr) -> Result<Self, String> {
        match repr {
            HedgeTargetRepr::Word(w) if w == "same" => Ok(HedgeTarget::Same),
            HedgeTargetRepr::Word(w) if w == "next" => Ok(HedgeTarget::Next),
            HedgeTargetRepr::Word(w) => Err(format!(
                "hedge_to must be \"same\", \"next\" or {{ provider, model }}, not {w:?}"
            )),
            HedgeTargetRepr::Link(l) => Ok(HedgeTarget::Link {
                provider: l.provider,
                model: l.model,
            }),
        }
    }
}

impl From<HedgeTarget> for HedgeTargetRepr {
    fn from(target: HedgeTarget) -> Self {
        match target {
            HedgeTarget::Same => HedgeTargetRepr::Word("same".into()),
            HedgeTarget::Next => HedgeTargetRepr::Word("next".into()),
            HedgeTarget::Link { provider, model } => {
                HedgeTargetRepr::Link(HedgeTargetLink { provider, model })
            }
        }
    }
}

/// The hedge budgets of a policy's links, so each link has one budget
/// whatever builds it.
///
/// A route is built twice (its unary and its streaming stack): both
/// builds of a link take their hedge budget from here, so the link's
/// `budget_ratio` holds for its calls of both kinds together. Across a
/// reload, [`for_reload`](Self::for_reload) carries each budget over while
/// its route, link, target and hedge settings are unchanged (its spent
/// hedges still count); a budget nothing asks for again is dropped.
/// Cloning shares the budgets.
#[derive(Clone, Default)]
pub struct HedgeBudgets {
    inner: Arc<std::sync::Mutex<KeptBudgets>>,
}

type SharedBudget = Arc<dyn tower_llm_retry::Budget + Send + Sync>;

#[derive(Default)]
struct KeptBudgets {
    now: std::collections::HashMap<String, SharedBudget>,
    before: std::collections::HashMap<String, SharedBudget>,
}

impl fmt::Debug for HedgeBudgets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HedgeBudgets")
            .field("links", &self.lock().now.len())
            .finish()
    }
}

impl HedgeBudgets {
    /// No budgets yet.
    pub fn new() -> Self {
        HedgeBudgets::default()
    }

    /// The budgets for the next build of a policy: each of these that the
    /// build asks for again (same route, link, target and settings) is
    /// handed over as it is; the others are dropped with this one.
    pub fn for_reload(&self) -> HedgeBudgets {
        let before = self.lock().now.clone();
        HedgeBudgets {
            inner: Arc::new(std::sync::Mutex::new(KeptBudgets {
                now: std::collections::HashMap::new(),
                before,
            })),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, KeptBudgets> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The budget of `key`, made from `config` the first time.
    fn budget(
        &self,
        key: String,
        config: &HedgeConfig,
    ) -> Result<SharedBudget, tower_llm_hedge::InvalidHedgeConfig> {
        let mut kept = self.lock();
        if let Some(budget) = kept.now.get(&key) {
            return Ok(budget.clone());
        }
        let budget = match kept.before.remove(&key) {
            Some(budget) => budget,
            None => Arc::new(config.budget()?),
        };
        kept.now.insert(key, budget.clone());
        Ok(budget)
    }
}

impl LinkConfig {
    /// A link to `model` at `provider`, with no overrides.
    pub fn new(provider: impl Into<String>, model: impl Into<String>) -> Self {
        LinkConfig {
            provider: provider.into(),
            model: model.into(),
            max_attempts: None,
            attempt_timeout_ms: None,
            connect_timeout_ms: None,
            first_token_timeout_ms: None,
            idle_timeout_ms: None,
            long_context: false,
            filtered_content: false,
            admit: None,
            requires_verification: false,
            hedge: None,
            hedge_to: None,
        }
    }
}

/// An admission rule on request metadata: `admit = { header =
/// "x-tenant-region", any_of = ["eu-west-1", "eu-central-1"] }` lets a
/// request use the link only when its inbound header `header` is one of
/// `any_of` (exactly, byte for byte: a UTF-8 value such as `"zürich"` in
/// the policy matches the same UTF-8 bytes in the header; header names are
/// case-insensitive). A request without the header, or without
/// [`InboundHeaders`], is not admitted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdmitRule {
    /// `header`: the request header to read.
    pub header: String,
    /// `any_of`: the values that admit the request (at least one).
    pub any_of: Vec<String>,
}

impl AdmitRule {
    /// `true` when `req`'s [`InboundHeaders`] carry `header` with one of
    /// `any_of`.
    pub fn admits(&self, req: &ChatRequest) -> bool {
        req.extensions
            .get::<InboundHeaders>()
            .and_then(|h| h.0.get(self.header.as_str()))
            .is_some_and(|v| self.any_of.iter().any(|a| a.as_bytes() == v.as_bytes()))
    }
}

/// The inbound HTTP headers of a request, in a [`ChatRequest`]'s
/// extensions, for [`AdmitRule`]s. A server puts them there (the gateway
/// does for every call); retry and fallback copies keep them. Its `Debug`
/// shows the header names only (an `authorization` value must never reach
/// a log).
#[derive(Clone, Default)]
pub struct InboundHeaders(pub http::HeaderMap);

impl fmt::Debug for InboundHeaders {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("InboundHeaders")
            .field(
                &self
                    .0
                    .keys()
                    .map(http::HeaderName::as_str)
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// One `[[routes]]` entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    /// `model`: the alias clients ask for.
    pub model: String,
    /// `chain`: the links, primary first.
    pub chain: Vec<LinkConfig>,
    /// `health_ordering_ms`: when failing over, try the alternates
    /// healthiest first by their success rate and latency over this window
    /// (`FallbackBuilder::with_health_ordering`; default off: the written
    /// order).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_ordering_ms: Option<u64>,
    /// `degraded`: when every link failed (not on a deadline or a terminal
    /// failure), answer with this text instead, flagged as degraded
    /// (`FallbackBuilder::with_degraded`; default none: the failure).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub degraded: Option<String>,
    /// `degraded_admit`: only requests that pass this rule get the
    /// degraded answer; the others get the failure (default: every
    /// request).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub degraded_admit: Option<AdmitRule>,
    /// `deadline_ms`: this route's call budget (default `[deadline]
    /// total_ms`; with a retry or fallback policy, the smallest written).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<u64>,
    /// `retry_policy`: the `operation` of a `[[retry_policies]]` entry,
    /// whose settings replace `[retry]`'s (and `[deadline]`'s) on this
    /// route, and whose `fallback_policy` and `breaker_policy` it uses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_policy: Option<String>,
    /// `fallback_policy`: the `fallback_id` of a `[[fallback_policies]]`
    /// ladder whose steps follow `chain`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback_policy: Option<String>,
    /// `breaker_policy`: a `[breaker_policies.NAME]` used instead of
    /// `[breaker]` on this route's links. A circuit shared by two routes is
    /// judged, on each call, by the settings of the route it came through.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub breaker_policy: Option<String>,
    /// `hedge`: the hedge layer's own settings ([`HedgeConfig`]) for every
    /// link of the route without its own `hedge`; one hedge layer per link
    /// (each learns its own delay), between the fallback and the link's
    /// retry. Default: no hedging.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hedge: Option<HedgeConfig>,
    /// `hedge_to`: where the hedges of the route's links go, for links
    /// without their own ([`HedgeTarget`]; default `"same"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hedge_to: Option<HedgeTarget>,
}

impl RouteConfig {
    /// A route `model` over `chain`, with nothing else set.
    pub fn new(model: impl Into<String>, chain: Vec<LinkConfig>) -> Self {
        RouteConfig {
            model: model.into(),
            chain,
            health_ordering_ms: None,
            degraded: None,
            degraded_admit: None,
            deadline_ms: None,
            retry_policy: None,
            fallback_policy: None,
            breaker_policy: None,
            hedge: None,
            hedge_to: None,
        }
    }
}

/// A route with its named policies applied: what
/// [`Policy::build_route`] builds. See [`Policy::resolve`].
#[derive(Debug, Clone)]
pub struct ResolvedRoute {
    /// The links: the route's `chain`, then its fallback policy's steps.
    pub chain: Vec<LinkConfig>,
    /// The retry settings: `[retry]`, or the route's retry policy over it.
    pub retry: RetryConfig,
    /// Which classes are retried, when a retry policy says (`retryable`).
    pub retry_failures: Option<FailurePolicy>,
    /// Which classes fail over, when a fallback policy says (`trigger`).
    pub fallback_failures: Option<FailurePolicy>,
    /// The breaker settings: `[breaker]`, or the route's breaker policy.
    pub breaker: BreakerConfig,
    /// The call's budget.
    pub total_ms: u64,
    /// Whether a deadline was written for the route (anywhere), so its
    /// links' attempt timeouts are checked against it.
    pub deadline_written: bool,
    /// The degraded answer, if any.
    pub degraded: Option<String>,
    /// Who may get it (default everyone).
    pub degraded_admit: Option<AdmitRule>,
}

/// What a route's stack answers: a unary [`ChatResponse`] or a
/// [`ChatStream`]. [`degraded`](Self::degraded) builds a route's degraded
/// answer.
pub trait RouteAnswer: RecordsAttempts + Send + 'static {
    /// An answer of `text` in the name of `route` (the provider reads
    /// `degraded`).
    fn degraded(route: &str, text: &str) -> Self;

    /// `true` for a degraded answer.
    fn is_degraded(&self) -> bool;
}

impl RouteAnswer for ChatResponse {
    fn degraded(route: &str, text: &str) -> Self {
        ChatResponse {
            id: String::from("degraded"),
            model: route.to_owned(),
            provider: Arc::from("degraded"),
            fallback_position: 0,
            degraded: true,
            idempotent_replayed: false,
            choices: vec![tower_llm_core::Choice {
                index: 0,
                text: text.to_owned(),
                tool_calls: Vec::new(),
                finish_reason: tower_llm_core::FinishReason::Stop,
            }],
            usage: tower_llm_core::Usage::default(),
            latency: Duration::ZERO,
            attempts: Vec::new(),
        }
    }

    fn is_degraded(&self) -> bool {
        self.degraded
    }
}

impl RouteAnswer for ChatStream {
    fn degraded(route: &str, text: &str) -> Self {
        let chunk = tower_llm_core::ChatChunk {
            text: Some(text.to_owned()),
            finish_reason: Some(tower_llm_core::FinishReason::Stop),
            ..tower_llm_core::ChatChunk::default()
        };
        ChatStream::from_chunks("degraded", route, vec![Ok(chunk)])
    }

    fn is_degraded(&self) -> bool {
        ChatStream::is_degraded(self)
    }
}

/// One part of a circuit's key (`breaker_key`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyPart {
    /// The provider's `name`.
    Provider,
    /// The link's model.
    Model,
    /// The provider's credential: its `api_key_env` (Bedrock:
    /// `AWS_ACCESS_KEY_ID`).
    Credential,
    /// The provider's `region` (none for a provider without one).
    Region,
}

impl KeyPart {
    /// The default `breaker_key`: provider and model.
    pub fn default_key() -> Vec<KeyPart> {
        vec![KeyPart::Provider, KeyPart::Model]
    }
}

/// The breaker key function of a policy's route: the default
/// [`LinkKey`](tower_llm_breaker::LinkKey) (provider and model), or one
/// made from `breaker_key` for each of the route's links.
#[derive(Debug, Clone)]
pub struct PolicyKey {
    keys: Option<Arc<[LinkKeyEntry]>>,
}

/// A link (provider, model) and its circuit's key.
type LinkKeyEntry = (Arc<str>, Arc<str>, BreakerKey);

impl PolicyKey {
    fn of(&self, link: &Link) -> Option<&BreakerKey> {
        self.keys
            .as_deref()?
            .iter()
            .find_map(|(p, m, k)| (**p == *link.provider() && **m == *link.model()).then_some(k))
    }
}

impl KeyFn<ChatRequest> for PolicyKey {
    fn key(&self, req: &ChatRequest, default: &Link) -> BreakerKey {
        let link = Link::of(req).unwrap_or(default);
        self.of(link)
            .cloned()
            .unwrap_or_else(|| BreakerKey::from_link(link))
    }

    fn with_key<R>(
        &self,
        req: &ChatRequest,
        default: &Link,
        f: impl FnOnce(tower_llm_breaker::KeyView<'_>) -> R,
    ) -> R {
        let link = Link::of(req).unwrap_or(default);
        match self.of(link) {
            Some(key) => f(key.view()),
            None => tower_llm_breaker::LinkKey.with_key(req, default, f),
        }
    }
}

/// Why a policy was refused: every problem found, one per line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    problems: Vec<String>,
}

impl ConfigError {
    /// An error with one problem.
    pub fn new(problem: impl Into<String>) -> Self {
        ConfigError {
            problems: vec![problem.into()],
        }
    }

    /// The problems, one message each.
    pub fn problems(&self) -> &[String] {
        &self.problems
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("invalid policy: ")?;
        f.write_str(&self.problems.join("; "))
    }
}

impl std::error::Error for ConfigError {}

impl Policy {
    /// Reads and validates a TOML policy.
    ///
    /// # Errors
    ///
    /// A syntax error (with its line), an unknown key or a value of the
    /// wrong type (with its dotted path, `routes[0].chain[1].admit`, and
    /// its line), or every problem [`validate`](Self::validate) finds.
    pub fn from_toml(text: &str) -> Result<Policy, ConfigError> {
        let de = toml::Deserializer::parse(text).map_err(|e| ConfigError::new(e.to_string()))?;
        let policy: Policy = serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            ConfigError::new(format!("at {path}: {}", e.into_inner()))
        })?;
        policy.validate()?;
        Ok(policy)
    }

    /// Reads and validates a JSON policy (the same shape).
    ///
    /// # Errors
    ///
    /// As [`from_toml`](Self::from_toml).
    pub fn from_json(text: &str) -> Result<Policy, ConfigError> {
        let mut de = serde_json::Deserializer::from_str(text);
        let policy: Policy = serde_path_to_error::deserialize(&mut de).map_err(|e| {
            let path = e.path().to_string();
            ConfigError::new(format!("at {path}: {}", e.into_inner()))
        })?;
        de.end().map_err(|e| ConfigError::new(e.to_string()))?;
        policy.validate()?;
        Ok(policy)
    }

    /// Checks everything a policy promises: timeouts non-zero and in
    /// order, attempts within the cap, a valid backoff, unique provider
    /// and route names, chains that are non-empty, name known providers
    /// and repeat no link.
    ///
    /// # Errors
    ///
    /// Every problem found, not just the first.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut p = Vec::new();
        if let Err(e) = self.deadline.validate() {
            p.push(format!("deadline.{e}"));
        }
        let r = &self.retry;
        if let Err(e) = r.validate() {
            p.extend(e.problems().iter().map(|e| format!("retry.{e}")));
        }
        // Only values written in the file are checked against each other:
        // an unset key's default always fits (see `RetryConfig`).
        if let (Some(attempt), Some(total)) = (r.attempt_timeout_ms, self.deadline.total_ms) {
            if attempt > 0 && total > 0 && attempt > total {
                p.push(format!(
                    "retry.attempt_timeout_ms ({attempt}) is longer than deadline.total_ms ({total})"
                ));
            }
        }
        if let (Some(min), Some(total)) = (r.min_attempt_ms, self.deadline.total_ms) {
            if min >= total {
                p.push(format!(
                    "retry.min_attempt_ms ({min}) leaves no room for a retry within deadline.total_ms ({total})"
                ));
            }
        }
        if let Err(e) = self.breaker.validate() {
            p.push(format!("breaker.{e}"));
        }
        if self.health.probe_timeout_ms == 0 {
            p.push("health.probe_timeout_ms must be above 0".to_owned());
        }
        if let Err(e) = self.stream.validate() {
            p.push(format!("stream.{e}"));
        }
        let mut names = HashSet::new();
        for provider in &self.providers {
            if provider.name.is_empty() {
                p.push("a provider has an empty name".to_owned());
            }
            if !names.insert(provider.name.as_str()) {
                p.push(format!("duplicate provider \"{}\"", provider.name));
            }
            for (key, value) in [
                ("connect_timeout_ms", provider.connect_timeout_ms),
                ("first_token_timeout_ms", provider.first_token_timeout_ms),
                ("idle_timeout_ms", provider.idle_timeout_ms),
            ] {
                if value == Some(0) {
                    p.push(format!(
                        "provider \"{}\": {key} must be above 0",
                        provider.name
                    ));
                }
            }
            if provider.max_concurrency == Some(0) {
                p.push(format!(
                    "provider \"{}\": max_concurrency must be above 0",
                    provider.name
                ));
            }
            for (key, url) in [
                ("base_url", &provider.base_url),
                ("health_url", &provider.health_url),
            ] {
                if let Some(url) = url {
                    if !is_http_url(url) {
                        p.push(format!(
                            "provider \"{}\": {key} {url:?} is not an http(s) URL",
                            provider.name
                        ));
                    }
                }
            }
            if provider.kind != ProviderKind::Bedrock && provider.api_key_env.is_none() {
                p.push(format!(
                    "provider \"{}\": api_key_env is required for {:?}",
                    provider.name, provider.kind
                ));
            }
        }
        if let Err(e) = self.server.validate() {
            p.extend(e.problems);
        }
        // A policy without routes answers every model with 404: refused, so
        // that an empty or truncated file never replaces a working one.
        if self.routes.is_empty() {
            p.push("the policy has no routes ([[routes]])".to_owned());
        }
        if self.breaker_key.is_empty() {
            p.push("breaker_key is empty (a circuit needs a key)".to_owned());
        }
        let mut parts = HashSet::new();
        for part in &self.breaker_key {
            if !parts.insert(part) {
                p.push(format!("breaker_key names {part:?} twice"));
            }
        }
        let mut seen = HashSet::new();
        for op in &self.retry_policies {
            if !seen.insert(op.operation.as_str()) {
                p.push(format!("duplicate retry policy \"{}\"", op.operation));
            }
        }
        let mut seen = HashSet::new();
        for doc in &self.fallback_policies {
            if !seen.insert(doc.fallback_id.as_str()) {
                p.push(format!("duplicate fallback policy \"{}\"", doc.fallback_id));
            }
        }
        for (name, breaker) in &self.breaker_policies {
            if let Err(e) = breaker.validate() {
                p.push(format!("breaker_policies.{name}.{e}"));
            }
        }
        if let Some(shared) = &self.breaker_shared {
            shared.check("breaker_shared", &mut p);
        }
        if let Some(idempotency) = &self.idempotency {
            if let Err(e) = idempotency.validate() {
                p.push(format!("idempotency: {e}"));
            }
        }
        if let Some(shared) = &self.idempotency_shared {
            if self.idempotency.is_none() {
                p.push("idempotency_shared needs an [idempotency] table".to_owned());
            }
            shared.check("idempotency_shared", &mut p);
        }
        let mut routes = HashSet::new();
        for route in &self.routes {
            if !routes.insert(route.model.as_str()) {
                p.push(format!("duplicate route \"{}\"", route.model));
            }
            if route.chain.is_empty() {
                p.push(format!("route \"{}\" has an empty chain", route.model));
            }
            if route.health_ordering_ms == Some(0) {
                p.push(format!(
                    "route \"{}\": health_ordering_ms must be above 0",
                    route.model
                ));
            }
            if route.deadline_ms == Some(0) {
                p.push(format!(
                    "route \"{}\": deadline_ms must be above 0",
                    route.model
                ));
            }
            if let Some(Err(e)) = route.hedge.as_ref().map(HedgeConfig::validate) {
                p.push(format!("route \"{}\": hedge: {e}", route.model));
            }
            if route.hedge_to.is_some() && route.hedge.is_none() {
                let hedged_link = route.chain.iter().any(|l| l.hedge.is_some());
                if !hedged_link {
                    p.push(format!(
                        "route \"{}\": hedge_to needs a hedge (on the route or a link)",
                        route.model
                    ));
                }
            }
            if let Some(rule) = &route.degraded_admit {
                check_rule(
                    rule,
                    &format!("route \"{}\": degraded_admit", route.model),
                    &mut p,
                );
            }
            let resolved = match self.resolve(route) {
                Ok(r) => r,
                Err(e) => {
                    p.extend(e.problems);
                    continue;
                }
            };
            if route.retry_policy.is_some() {
                if let Err(e) = resolved.retry.validate() {
                    p.extend(
                        e.problems()
                            .iter()
                            .map(|e| format!("route \"{}\": retry policy: {e}", route.model)),
                    );
                }
            }
            let mut links = HashSet::new();
            let last = resolved.chain.len().saturating_sub(1);
            for (i, link) in resolved.chain.iter().enumerate() {
                let at = format!(
                    "route \"{}\": link {}/{}",
                    route.model, link.provider, link.model
                );
                if let Some(n) = link.max_attempts {
                    if n == 0 || usize::from(n) > tower_llm_core::MAX_ATTEMPTS_PER_CALL {
                        p.push(format!(
                            "{at}: max_attempts must be 1 to {}, not {n}",
                            tower_llm_core::MAX_ATTEMPTS_PER_CALL
                        ));
                    }
                }
                match link.attempt_timeout_ms {
                    Some(0) => p.push(format!("{at}: attempt_timeout_ms must be above 0")),
                    Some(attempt) if resolved.deadline_written && attempt > resolved.total_ms => {
                        p.push(format!(
                            "{at}: attempt_timeout_ms ({attempt}) is longer than the route's deadline ({})",
                            resolved.total_ms
                        ));
                    }
                    _ => {}
                }
                for (key, value) in [
                    ("connect_timeout_ms", link.connect_timeout_ms),
                    ("first_token_timeout_ms", link.first_token_timeout_ms),
                    ("idle_timeout_ms", link.idle_timeout_ms),
                ] {
                    if value == Some(0) {
                        p.push(format!("{at}: {key} must be above 0"));
                    }
                }
                if let Some(rule) = &link.admit {
                    check_rule(rule, &format!("{at}: admit"), &mut p);
                }
                if let Some(Err(e)) = link.hedge.as_ref().map(HedgeConfig::validate) {
                    p.push(format!("{at}: hedge: {e}"));
                }
                let hedged = link.hedge.is_some() || route.hedge.is_some();
                match (&link.hedge_to, hedged) {
                    (Some(_), false) => p.push(format!(
                        "{at}: hedge_to needs a hedge (on the link or its route)"
                    )),
                    (Some(HedgeTarget::Next), true) if i == last => p.push(format!(
                        "{at}: hedge_to = \"next\" on the last link (no link follows it)"
                    )),
                    _ => {}
                }
                if let Some(HedgeTarget::Link { provider, model }) =
                    link.hedge_to.as_ref().or(route.hedge_to.as_ref())
                {
                    if !names.contains(provider.as_str()) {
                        p.push(format!("{at}: hedge_to: unknown provider \"{provider}\""));
                    }
                    if model.is_empty() {
                        p.push(format!("{at}: hedge_to: the model is empty"));
                    }
                }
                if !names.contains(link.provider.as_str()) {
                    p.push(format!(
                        "route \"{}\": unknown provider \"{}\"",
                        route.model, link.provider
                    ));
                }
                if !links.insert((link.provider.as_str(), link.model.as_str())) {
                    p.push(format!(
                        "route \"{}\": duplicate link {}/{}",
                        route.model, link.provider, link.model
                    ));
                }
            }
        }
        if p.is_empty() {
            Ok(())
        } else {
            Err(ConfigError { problems: p })
        }
    }

    /// The breaker key function for `chain` under `breaker_key`.
    pub fn breaker_key_fn(&self, chain: &[LinkConfig]) -> PolicyKey {
        if self.breaker_key == KeyPart::default_key() {
            return PolicyKey { keys: None };
        }
        let keys = chain
            .iter()
            .map(|link| {
                let provider = self.provider(&link.provider);
                let has = |part| self.breaker_key.contains(&part);
                let mut scope = Vec::new();
                if has(KeyPart::Credential) {
                    let credential = provider.and_then(|p| match p.kind {
                        ProviderKind::Bedrock => Some("AWS_ACCESS_KEY_ID"),
                        _ => p.api_key_env.as_deref(),
                    });
                    scope.push(format!("credential={}", credential.unwrap_or("")));
                }
                if has(KeyPart::Region) {
                    let region = provider.and_then(|p| p.region.as_deref());
                    scope.push(format!("region={}", region.unwrap_or("")));
                }
                let key = BreakerKey::new(
                    if has(KeyPart::Provider) {
                        link.provider.as_str()
                    } else {
                        "*"
                    },
                    if has(KeyPart::Model) {
                        link.model.as_str()
                    } else {
                        "*"
                    },
                );
                let key = if scope.is_empty() {
                    key
                } else {
                    key.with_scope(scope.join(","))
                };
                (
                    Arc::from(link.provider.as_str()),
                    Arc::from(link.model.as_str()),
                    key,
                )
            })
            .collect();
        PolicyKey { keys: Some(keys) }
    }

    /// `route` with its named policies applied: its retry policy's settings
    /// over `[retry]` (and its `deadline_ms`), its fallback policy's steps
    /// after its `chain` (a `DEGRADED_TEMPLATE` step as its degraded
    /// answer, `allowed_for_risk` as a rule on the `x-llm-risk` header),
    /// its breaker policy instead of `[breaker]`, and its deadline: the
    /// smallest of the route's `deadline_ms`, the retry policy's
    /// `deadline_ms` and the fallback policy's `max_total_latency_ms`, or
    /// `[deadline] total_ms`.
    ///
    /// # Errors
    ///
    /// A named policy that does not exist, a route and its retry policy
    /// naming different fallback or breaker policies, a step target that
    /// is not `provider/model`, a degraded step that is not last or that
    /// meets a route `degraded`, a class a list may not name, a
    /// `max_total_cost` other than `"..."`.
    pub fn resolve(&self, route: &RouteConfig) -> Result<ResolvedRoute, ConfigError> {
        let at = format!("route \"{}\"", route.model);
        let mut p = Vec::new();
        let op = match &route.retry_policy {
            None => None,
            Some(name) => {
                let op = self.retry_policies.iter().find(|o| &o.operation == name);
                if op.is_none() {
                    p.push(format!("{at}: unknown retry_policy \"{name}\""));
                }
                op
            }
        };
        let mut pick = |key: &str, own: &Option<String>, via: Option<&Option<String>>| match (
            own,
            via.and_then(Option::as_ref),
        ) {
            (Some(a), Some(b)) if a != b => {
                p.push(format!(
                    "{at}: {key} \"{a}\" contradicts its retry policy's \"{b}\""
                ));
                None
            }
            (Some(a), _) => Some(a.clone()),
            (None, b) => b.cloned(),
        };
        let fallback_name = pick(
            "fallback_policy",
            &route.fallback_policy,
            op.map(|o| &o.fallback_policy),
        );
        let breaker_name = pick(
            "breaker_policy",
            &route.breaker_policy,
            op.map(|o| &o.breaker_policy),
        );
        let doc = fallback_name.as_ref().and_then(|name| {
            let doc = self
                .fallback_policies
                .iter()
                .find(|d| &d.fallback_id == name);
            if doc.is_none() {
                p.push(format!("{at}: unknown fallback_policy \"{name}\""));
            }
            doc
        });
        let breaker = match &breaker_name {
            None => self.breaker,
            Some(name) => match self.breaker_policies.get(name) {
                Some(b) => *b,
                None => {
                    p.push(format!("{at}: unknown breaker_policy \"{name}\""));
                    self.breaker
                }
            },
        };

        let mut retry = self.retry;
        let mut retry_failures = None;
        if let Some(op) = op {
            let at = format!("retry policy \"{}\"", op.operation);
            if let Some(n) = op.max_attempts {
                retry.max_attempts = n;
            }
            if let Some(ms) = op.attempt_timeout_ms {
                retry.attempt_timeout_ms = Some(ms);
            }
            if let Some(b) = op.backoff {
                retry.base_ms = Some(b.base_ms);
                retry.max_ms = Some(b.max_ms.unwrap_or(b.base_ms));
                let (factor, jitter) = match b.kind {
                    BackoffKind::ExponentialJitter => (2.0, NamedJitter::Full),
                    BackoffKind::Exponential => (2.0, NamedJitter::None),
                    BackoffKind::Fixed => (1.0, NamedJitter::None),
                };
                retry.factor = factor;
                retry.jitter = JitterSpec::Named(jitter);
            }
            if let Some(list) = &op.retryable {
                for class in list {
                    if !SeedClass::RETRYABLE.contains(class) {
                        p.push(format!(
                            "{at}: retryable: {class:?} is never retried on the same link (TIMEOUT, UNAVAILABLE and RATE_LIMITED can be)"
                        ));
                    }
                }
                retry_failures = Some(named::policy_for(list, &SeedClass::RETRYABLE, |d, on| {
                    d.retry = on;
                }));
            }
            if op.deadline_ms == Some(0) {
                p.push(format!("{at}: deadline_ms must be above 0"));
            }
        }

        let mut chain = route.chain.clone();
        let mut degraded = route.degraded.clone();
        let mut degraded_admit = route.degraded_admit.clone();
        let mut fallback_failures = None;
        if let Some(doc) = doc {
            let at = format!("fallback policy \"{}\"", doc.fallback_id);
            if let Some(list) = &doc.trigger {
                for class in list {
                    if !SeedClass::TRIGGERS.contains(class) {
                        p.push(format!(
                            "{at}: trigger: {class:?} cannot be a trigger (mark a link long_context or filtered_content instead)"
                        ));
                    }
                }
                fallback_failures = Some(named::policy_for(list, &SeedClass::TRIGGERS, |d, on| {
                    d.failover = on;
                }));
            }
            match &doc.max_total_cost {
                None => {}
                Some(CostLimit::Text(t)) if t == "..." => {}
                Some(other) => p.push(format!(
                    "{at}: max_total_cost {other:?} is not supported: tower-llm does not price calls (leave it out, or \"...\")"
                )),
            }
            if doc.max_total_latency_ms == Some(0) {
                p.push(format!("{at}: max_total_latency_ms must be above 0"));
            }
            if doc.steps.is_empty() {
                p.push(format!("{at}: steps is empty"));
            }
            for (i, step) in doc.steps.iter().enumerate() {
                let at = format!("{at}: steps[{i}]");
                if step.target == DEGRADED_TEMPLATE {
                    if i + 1 != doc.steps.len() {
                        p.push(format!("{at}: DEGRADED_TEMPLATE must be the last step"));
                    }
                    if degraded.is_some() {
                        p.push(format!(
                            "{at}: DEGRADED_TEMPLATE meets the route's own `degraded`"
                        ));
                    }
                    if step.max_attempts.is_some() || step.requires_verification {
                        p.push(format!(
                            "{at}: max_attempts and requires_verification mean nothing on DEGRADED_TEMPLATE"
                        ));
                    }
                    degraded = Some(
                        step.text
                            .clone()
                            .unwrap_or_else(|| DEFAULT_DEGRADED_TEXT.to_owned()),
                    );
                    if let Some(risks) = &step.allowed_for_risk {
                        if degraded_admit.is_some() {
                            p.push(format!(
                                "{at}: allowed_for_risk meets the route's own `degraded_admit`"
                            ));
                        }
                        degraded_admit = Some(AdmitRule {
                            header: RISK_HEADER.to_owned(),
                            any_of: risks.clone(),
                        });
                    }
                    continue;
                }
                if step.allowed_for_risk.is_some() || step.text.is_some() {
                    p.push(format!(
                        "{at}: allowed_for_risk and text belong to a DEGRADED_TEMPLATE step only"
                    ));
                }
                match step.target.split_once('/') {
                    Some((provider, model)) if !provider.is_empty() && !model.is_empty() => {
                        chain.push(LinkConfig {
                            max_attempts: step.max_attempts,
                            requires_verification: step.requires_verification,
                            ..LinkConfig::new(provider, model)
                        });
                    }
                    _ => p.push(format!(
                        "{at}: target {:?} is neither \"provider/model\" nor DEGRADED_TEMPLATE",
                        step.target
                    )),
                }
            }
        }

        let written = [
            route.deadline_ms,
            op.and_then(|o| o.deadline_ms),
            doc.and_then(|d| d.max_total_latency_ms),
        ];
        let deadline_written =
            self.deadline.total_ms.is_some() || written.iter().any(Option::is_some);
        let total_ms = written
            .into_iter()
            .flatten()
            .min()
            .unwrap_or_else(|| self.deadline.total_ms());
        if p.is_empty() {
            Ok(ResolvedRoute {
                chain,
                retry,
                retry_failures,
                fallback_failures,
                breaker,
                total_ms,
                deadline_written,
                degraded,
                degraded_admit,
            })
        } else {
            Err(ConfigError { problems: p })
        }
    }

    /// `retry.min_attempt_ms`, or its default: 1,000, or a quarter of the
    /// call's deadline if that is less.
    pub fn min_attempt_ms(&self) -> u64 {
        self.retry
            .min_attempt_ms
            .unwrap_or_else(|| 1_000.min(self.deadline.total_ms() / 4))
    }

    /// The route for the alias `model`.
    pub fn route(&self, model: &str) -> Option<&RouteConfig> {
        self.routes.iter().find(|r| r.model == model)
    }

    /// The provider named `name`.
    pub fn provider(&self, name: &str) -> Option<&ProviderConfig> {
        self.providers.iter().find(|p| p.name == name)
    }

    /// The deadline layer, recording its per-call metrics on `metrics`.
    pub fn deadline_layer(&self, metrics: Metrics) -> DeadlineLayer {
        DeadlineLayer::new(self.deadline.total()).with_metrics(metrics)
    }

    /// The per-link retry layer (chat classifier).
    ///
    /// # Errors
    ///
    /// An invalid backoff (never for a validated policy).
    pub fn retry_layer(&self) -> Result<RetryLayer, ConfigError> {
        let retry = RetryConfig {
            min_attempt_ms: Some(self.min_attempt_ms()),
            ..self.retry
        };
        RetryLayer::new()
            .with_config(&retry)
            .map_err(|e| ConfigError::new(format!("retry: {e}")))
    }

    /// `breaker` with this policy's breaker settings (keep passing the same
    /// layer, or one sharing its store, so circuits survive a reload).
    ///
    /// # Errors
    ///
    /// Settings the breaker refuses.
    pub fn breaker_layer(&self, breaker: BreakerLayer) -> Result<BreakerLayer, ConfigError> {
        breaker
            .with_config(self.breaker)
            .map_err(|e| ConfigError::new(e.to_string()))
    }

    /// The stack of `route` as [`resolve`](Self::resolve) makes it:
    /// deadline → fallback along its chain → per link retry → breaker →
    /// the provider service `provider` gives for the link's provider and
    /// the link (called once per link; the model is rewritten to the
    /// link's; [`ProviderConfig::for_link`] gives the provider with the
    /// link's own timeouts).
    ///
    /// Works for unary (`Res = ChatResponse`) and streaming
    /// (`Res = ChatStream`) provider services alike.
    ///
    /// # Errors
    ///
    /// An unknown provider (never for a validated policy) or a chain the
    /// fallback layer refuses.
    pub fn build_route<Res>(
        &self,
        route: &RouteConfig,
        breaker: &BreakerLayer,
        metrics: Metrics,
        provider: impl FnMut(&ProviderConfig, &LinkConfig) -> RouteService<Res>,
    ) -> Result<RouteService<Res>, ConfigError>
    where
        Res: RouteAnswer + IdempotentAnswer,
    {
        let hedges = HedgeBudgets::new();
        self.build_route_with(route, breaker, metrics, None, &hedges, provider)
    }

    /// As [`build_route`](Self::build_route), with `idempotency` (if any)
    /// just inside the deadline and outside the fallback: deadline →
    /// **idempotency** → fallback → per link hedge → retry → breaker →
    /// provider. Pass the same layer (or a clone) on every reload so that
    /// stored answers survive it. [`Policy::idempotency_layer`] makes one.
    ///
    /// The links' hedges take their budgets from `hedges`: pass the same
    /// one to every build of the route (its unary and its streaming stack)
    /// so a link has one hedge budget, and
    /// [`HedgeBudgets::for_reload`] of it on a reload.
    ///
    /// # Errors
    ///
    /// As [`build_route`](Self::build_route).
    pub fn build_route_with<Res>(
        &self,
        route: &RouteConfig,
        breaker: &BreakerLayer,
        metrics: Metrics,
        idempotency: Option<&IdempotencyLayer<TenantHeader>>,
        hedges: &HedgeBudgets,
        mut provider: impl FnMut(&ProviderConfig, &LinkConfig) -> RouteService<Res>,
    ) -> Result<RouteService<Res>, ConfigError>
    where
        Res: RouteAnswer + IdempotentAnswer,
    {
        let r = self.resolve(route)?;
        let min_attempt = r
            .retry
            .min_attempt_ms
            .unwrap_or_else(|| 1_000.min(r.total_ms / 4));
        let mut retry = RetryLayer::new()
            .with_config(&RetryConfig {
                min_attempt_ms: Some(min_attempt),
                ..r.retry
            })
            .map_err(|e| ConfigError::new(format!("route \"{}\": retry: {e}", route.model)))?;
        if let Some(failures) = r.retry_failures {
            retry = retry.with_failure_policy(failures);
        }
        // Hedge targets outside the chain get breaker keys too.
        let mut keyed = r.chain.clone();
        for link in &r.chain {
            if let Some(HedgeTarget::Link { provider, model }) =
                link.hedge_to.as_ref().or(route.hedge_to.as_ref())
            {
                if !keyed
                    .iter()
                    .any(|l| &l.provider == provider && &l.model == model)
                {
                    keyed.push(LinkConfig::new(provider.as_str(), model.as_str()));
                }
            }
        }
        let breaker = breaker
            .clone()
            .with_config(r.breaker)
            .map_err(|e| ConfigError::new(format!("route \"{}\": {e}", route.model)))?
            .with_key_fn(self.breaker_key_fn(&keyed));
        let mut links = Vec::with_capacity(r.chain.len());
        let unknown = |name: &str| ConfigError::new(format!("unknown provider \"{name}\""));
        // A link's retry → breaker → provider (its overrides keep the
        // route's retry budget: a clone shares it).
        let mut link_stack = |link: &LinkConfig| -> Result<RouteService<Res>, ConfigError> {
            let config = self
                .provider(&link.provider)
                .ok_or_else(|| unknown(&link.provider))?;
            let mut link_retry = retry.clone();
            if let Some(n) = link.max_attempts {
                link_retry = link_retry.with_max_attempts(n);
            }
            if let Some(ms) = link.attempt_timeout_ms {
                link_retry = link_retry.with_attempt_timeout(Duration::from_millis(ms));
            }
            Ok(BoxCloneSyncService::new(
                ServiceBuilder::new()
                    .llm_retry(link_retry)
                    .llm_breaker(breaker.clone())
                    .service(provider(config, link)),
            ))
        };
        for (i, link) in r.chain.iter().enumerate() {
            let inner = link_stack(link)?;
            // One hedge layer per link, so each learns its own delay; its
            // budget is the link's, shared by the route's builds.
            let svc = match link.hedge.as_ref().or(route.hedge.as_ref()) {
                None => inner,
                Some(hedge) => {
                    let at = format!(
                        "route \"{}\": link {}/{}: hedge",
                        route.model, link.provider, link.model
                    );
                    let target = link
                        .hedge_to
                        .as_ref()
                        .or(route.hedge_to.as_ref())
                        .unwrap_or(&HedgeTarget::Same);
                    let target = match target {
                        HedgeTarget::Next => r.chain.get(i + 1).map(|l| (i + 1, l.clone())),
                        HedgeTarget::Link { provider, model }
                            if provider != &link.provider || model != &link.model =>
                        {
                            let at = r
                                .chain
                                .iter()
                                .position(|l| &l.provider == provider && &l.model == model);
                            Some(match at {
                                Some(at) => (at, r.chain[at].clone()),
                                None => (i, LinkConfig::new(provider.as_str(), model.as_str())),
                            })
                        }
                        _ => None,
                    };
                    let key = format!(
                        "{}\u{0}{i}\u{0}{}\u{0}{}\u{0}{:?}\u{0}{hedge:?}",
                        route.model,
                        link.provider,
                        link.model,
                        target.as_ref().map(|(_, l)| (&l.provider, &l.model)),
                    );
                    let budget = hedges
                        .budget(key, hedge)
                        .map_err(|e| ConfigError::new(format!("{at}: {e}")))?;
                    let layer = HedgeLayer::new(hedge.clone())
                        .map_err(|e| ConfigError::new(format!("{at}: {e}")))?
                        .with_budget(budget)
                        .with_metrics(metrics.clone());
                    match target {
                        None => BoxCloneSyncService::new(
                            ServiceBuilder::new().llm_hedge(layer).service(inner),
                        ),
                        Some((position, to)) => {
                            let model: Arc<str> = Arc::from(to.model.as_str());
                            let backup = ServiceBuilder::new()
                                .map_request(move |mut req: ChatRequest| {
                                    req.model = model.clone();
                                    req
                                })
                                .service(link_stack(&to)?);
                            let position = u8::try_from(position).unwrap_or(u8::MAX);
                            let to = Link::new(to.provider.as_str(), to.model.as_str())
                                .with_position(position);
                            BoxCloneSyncService::new(
                                ServiceBuilder::new()
                                    .layer(layer.to(to, backup))
                                    .service(inner),
                            )
                        }
                    }
                }
            };
            let mut spec =
                LinkSpec::new(link.provider.as_str(), link.model.as_str()).rewrite_model();
            if link.long_context {
                spec = spec.serves_long_context();
            }
            if link.filtered_content {
                spec = spec.allows_filtered_content();
            }
            if let Some(rule) = link.admit.clone() {
                spec = spec.with_admission(move |req: &ChatRequest| rule.admits(req));
            }
            links.push((spec, svc));
        }
        let mut links = links.into_iter();
        let Some((primary_spec, primary)) = links.next() else {
            return Err(ConfigError::new(format!(
                "route \"{}\" has an empty chain",
                route.model
            )));
        };
        let mut chain = FallbackLayer::builder(primary_spec);
        for (spec, svc) in links {
            chain = chain.or(spec, svc);
        }
        if let Some(failures) = r.fallback_failures {
            chain = chain.with_failure_policy(failures);
        }
        if let Some(ms) = route.health_ordering_ms {
            chain = chain.with_health_ordering(Duration::from_millis(ms));
        }
        if let Some(text) = r.degraded.clone() {
            let alias = route.model.clone();
            chain = chain.with_degraded(move |_| Res::degraded(&alias, &text));
        }
        let fallback = chain
            .build()
            .map_err(|e| ConfigError::new(format!("route \"{}\": {e}", route.model)))?;
        let deadline = DeadlineLayer::new(Duration::from_millis(r.total_ms)).with_metrics(metrics);
        let svc = match idempotency {
            None => BoxCloneSyncService::new(
                ServiceBuilder::new()
                    .layer(deadline)
                    .llm_fallback(fallback)
                    .service(primary),
            ),
            Some(idempotency) => BoxCloneSyncService::new(
                ServiceBuilder::new()
                    .layer(deadline)
                    .layer(idempotency.clone())
                    .llm_fallback(fallback)
                    .service(primary),
            ),
        };
        Ok(match r.degraded_admit {
            None => svc,
            Some(rule) => degraded_only_for(svc, rule),
        })
    }

    /// The idempotency layer of `[idempotency]` (none when the table is
    /// absent), its keys scoped by the [`TENANT_HEADER`] inbound header
    /// and its replays counted on `metrics`.
    ///
    /// # Errors
    ///
    /// Settings the layer refuses (never for a validated policy).
    pub fn idempotency_layer(
        &self,
        metrics: Metrics,
    ) -> Result<Option<IdempotencyLayer<TenantHeader>>, ConfigError> {
        let Some(config) = &self.idempotency else {
            return Ok(None);
        };
        let layer = IdempotencyLayer::new(config.clone())
            .map_err(|e| ConfigError::new(format!("idempotency: {e}")))?
            .with_metrics(metrics)
            .with_tenant(tenant_header as TenantHeader);
        Ok(Some(layer))
    }
}

/// The inbound header whose value scopes idempotency keys: two tenants
/// with the same key never share an answer (a request without it is in
/// the unscoped space).
pub const TENANT_HEADER: &str = "x-tenant-id";

/// The idempotency tenant of a request: the raw bytes of its inbound
/// [`TENANT_HEADER`] (from its [`InboundHeaders`]), whatever they are
/// (`café-lyon` in UTF-8, a Latin-1 byte): a tenant id is opaque, never
/// dropped for not being ASCII.
pub type TenantHeader = fn(&ChatRequest) -> Option<Vec<u8>>;

fn tenant_header(req: &ChatRequest) -> Option<Vec<u8>> {
    Some(
        req.extensions
            .get::<InboundHeaders>()?
            .0
            .get(TENANT_HEADER)?
            .as_bytes()
            .to_vec(),
    )
}

/// `svc`, whose degraded answers go only to requests `rule` admits; the
/// others get a failure (`transient`: every link failed) instead.
fn degraded_only_for<Res: RouteAnswer>(
    svc: RouteService<Res>,
    rule: AdmitRule,
) -> RouteService<Res> {
    let rule = Arc::new(rule);
    BoxCloneSyncService::new(tower::service_fn(move |req: ChatRequest| {
        let allowed = rule.admits(&req);
        let svc = svc.clone();
        async move {
            let res = svc.oneshot(req).await?;
            if res.is_degraded() && !allowed {
                return Err(Failure::new(FailureClass::Transient).with_message(
                    "every link failed, and this request may not get the degraded answer",
                ));
            }
            Ok(res)
        }
    }))
}

/// Checks an admission rule.
fn check_rule(rule: &AdmitRule, at: &str, p: &mut Vec<String>) {
    if http::HeaderName::from_bytes(rule.header.as_bytes()).is_err() {
        p.push(format!(
            "{at}.header {:?} is not a header name",
            rule.header
        ));
    }
    if rule.any_of.is_empty() {
        p.push(format!("{at}.any_of is empty (no request could pass)"));
    }
}

/// `true` for an absolute `http://` or `https://` URL that `http` accepts.
fn is_http_url(url: &str) -> bool {
    url.parse::<http::Uri>()
        .is_ok_and(|u| matches!(u.scheme_str(), Some("http" | "https")) && u.authority().is_some())
}

/// A route's (or a provider's) service, boxed.
pub type RouteService<Res> = BoxCloneSyncService<ChatRequest, Res, Failure>;

/// A provider's services, built once per policy and shared by every route
/// that names it.
#[derive(Debug, Clone)]
pub struct ProviderServices {
    /// Unary chat.
    pub chat: RouteService<ChatResponse>,
    /// Streaming chat.
    pub stream: RouteService<ChatStream>,
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

    /// The provider's unary and streaming services over `transport`,
    /// behind `bulkhead` if given (see [`bulkhead`](Self::bulkhead)): a
    /// call that finds it full is shed at once with a circuit-open-class
    /// failure, which fails over without counting against the breaker. (A
    /// stream holds its permit up to its commit point.)
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
        let timeouts = StreamTimeouts {
            first_token: self
                .first_token_timeout_ms
                .map_or(timeouts.first_token, Duration::from_millis),
            idle: self
                .idle_timeout_ms
                .map_or(timeouts.idle, Duration::from_millis),
        };
        let missing_key = || ConfigError::new(format!("provider \"{}\": no API key", self.name));
        let (chat, streaming): (RouteService<ChatResponse>, RouteService<ChatStream>) =
            match self.kind {
                ProviderKind::Openai => {
                    let mut config = OpenAiConfig::new(key.ok_or_else(missing_key)?)
                        .with_max_completion_tokens(self.max_completion_tokens);
                    if let Some(url) = &self.base_url {
                        config = config.with_base_url(url);
                    }
                    let p = OpenAi::new(transport, config).with_metrics(genai.clone());
                    (
                        BoxCloneSyncService::new(p.clone()),
                        BoxCloneSyncService::new(p.streaming().with_timeouts(timeouts)),
                    )
                }
                ProviderKind::Anthropic => {
                    let mut config = AnthropicConfig::new(key.ok_or_else(missing_key)?);
                    if let Some(url) = &self.base_url {
                        config = config.with_base_url(url);
                    }
                    let p = Anthropic::new(transport, config).with_metrics(genai.clone());
                    (
                        BoxCloneSyncService::new(p.clone()),
                        BoxCloneSyncService::new(p.streaming().with_timeouts(timeouts)),
                    )
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
                    (
                        BoxCloneSyncService::new(p.clone()),
                        BoxCloneSyncService::new(p.streaming().with_timeouts(timeouts)),
                    )
                }
            };
        Ok(match bulkhead {
            None => ProviderServices {
                chat,
                stream: streaming,
            },
            Some(permits) => ProviderServices {
                chat: shed_when_full(chat, &permits),
                stream: shed_when_full(streaming, &permits),
            },
        })
    }
}

/// `svc` behind a shared semaphore, shedding calls that find it full.
fn shed_when_full<Res: Send + 'static>(
    svc: RouteService<Res>,
    permits: &Arc<tokio::sync::Semaphore>,
) -> RouteService<Res> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use tower_llm_breaker::BreakerCount;
    use tower_llm_retry::{Jitter, JitterSpec};

    #[test]
    fn an_admission_rule_compares_header_bytes_so_utf8_values_match() {
        let rule = AdmitRule {
            header: "x-tenant-region".into(),
            any_of: vec!["zürich".into()],
        };
        let with = |value: &[u8]| {
            let mut headers = http::HeaderMap::new();
            headers.insert(
                "x-tenant-region",
                http::HeaderValue::from_bytes(value).expect("a header value"),
            );
            let mut req = ChatRequest::new("m", vec![]);
            req.extensions.insert(InboundHeaders(headers));
            rule.admits(&req)
        };
        assert!(with("zürich".as_bytes()));
        // The same word in Latin-1 is other bytes: not admitted.
        assert!(!with(b"z\xfcrich"));
        assert!(!with(b"zurich"));
    }

    #[test]
    fn the_tenant_of_a_request_is_its_header_s_raw_bytes() {
        let with = |value: Option<&[u8]>| {
            let mut headers = http::HeaderMap::new();
            if let Some(value) = value {
                headers.insert(
                    TENANT_HEADER,
                    http::HeaderValue::from_bytes(value).expect("a header value"),
                );
            }
            let mut req = ChatRequest::new("m", vec![]);
            req.extensions.insert(InboundHeaders(headers));
            tenant_header(&req)
        };
        assert_eq!(
            with(Some("café-lyon".as_bytes())),
            Some("café-lyon".as_bytes().to_vec())
        );
        assert_eq!(with(Some(b"caf\xe9")), Some(b"caf\xe9".to_vec()));
        assert_eq!(with(None), None);
    }

    const GOOD: &str = r#"
        [[providers]]
        name = "a"
        kind = "openai"
        api_key_env = "A"

        [[providers]]
        name = "b"
        kind = "bedrock"

        [[routes]]
        model = "smart"
        chain = [{ provider = "a", model = "x" }, { provider = "b", model = "y" }]
    "#;

    fn problems(text: &str) -> Vec<String> {
        Policy::from_toml(text).unwrap_err().problems().to_vec()
    }

    #[test]
    fn a_good_policy_loads_with_defaults_and_round_trips_through_json() {
        let p = Policy::from_toml(GOOD).expect("valid");
        assert_eq!(p.deadline.total_ms(), 30_000);
        assert_eq!(p.retry.attempt_timeout_ms(), 30_000);
        assert_eq!(p.server, ServerPolicy::default());
        assert_eq!(p.retry.max_attempts, 3);
        assert_eq!(p.retry.jitter, JitterSpec::Fraction(0.2));
        let json = serde_json::to_string(&p).expect("json");
        assert_eq!(Policy::from_json(&json).expect("valid"), p);
        assert!(p.retry_layer().is_ok());
        assert_eq!(p.breaker.consecutive_failures, 5);
    }

    #[test]
    fn breaker_count_and_min_attempt_load_from_the_file() {
        let p = Policy::from_toml(&format!(
            "[retry]\nmin_attempt_ms = 500\n[breaker]\ncount = \"calls\"\n{GOOD}"
        ))
        .expect("valid");
        assert_eq!(p.retry.min_attempt_ms, Some(500));
        assert_eq!(p.min_attempt_ms(), 500);
        assert_eq!(p.breaker.count, BreakerCount::Calls);
        let defaults = Policy::from_toml(GOOD).expect("valid");
        assert_eq!(defaults.min_attempt_ms(), 1_000);
        // A short deadline scales the default down.
        let short =
            Policy::from_toml(&format!("[deadline]\ntotal_ms = 1200\n{GOOD}")).expect("valid");
        assert_eq!(short.min_attempt_ms(), 300);
        assert_eq!(
            problems(&format!(
                "[deadline]\ntotal_ms = 1000\n[retry]\nmin_attempt_ms = 1000\n{GOOD}"
            )),
            [
                "retry.min_attempt_ms (1000) leaves no room for a retry within deadline.total_ms (1000)"
            ]
        );
        assert_eq!(defaults.breaker.count, BreakerCount::Attempts);
        assert!(!problems(&format!("[breaker]\ncount = \"tries\"\n{GOOD}")).is_empty());
    }

    #[test]
    fn each_validation_error_is_named() {
        let unknown = GOOD.replace("provider = \"b\"", "provider = \"c\"");
        assert_eq!(
            problems(&unknown),
            ["route \"smart\": unknown provider \"c\""]
        );
        let dup = format!("{GOOD}\n[[providers]]\nname = \"a\"\nkind = \"bedrock\"\n");
        assert_eq!(problems(&dup), ["duplicate provider \"a\""]);
        let dup_route = format!(
            "{GOOD}\n[[routes]]\nmodel = \"smart\"\nchain = [{{ provider = \"a\", model = \"z\" }}]\n"
        );
        assert_eq!(problems(&dup_route), ["duplicate route \"smart\""]);
        let empty = format!("{GOOD}\n[[routes]]\nmodel = \"none\"\nchain = []\n");
        assert_eq!(problems(&empty), ["route \"none\" has an empty chain"]);
        let twice = GOOD.replace(
            "provider = \"b\", model = \"y\"",
            "provider = \"a\", model = \"x\"",
        );
        assert_eq!(problems(&twice), ["route \"smart\": duplicate link a/x"]);
        let zero = format!("[deadline]\ntotal_ms = 0\n{GOOD}");
        assert_eq!(problems(&zero), ["deadline.total_ms must be above 0"]);
        let inverted = format!(
            "[retry]\nmax_attempts = 3\nattempt_timeout_ms = 1000\nbase_ms = 500\nfactor = 2\nmax_ms = 100\njitter = \"full\"\n{GOOD}"
        );
        assert_eq!(
            problems(&inverted),
            ["retry.base_ms (500) is above max_ms (100)"]
        );
        let long_attempt = format!(
            "[deadline]\ntotal_ms = 1000\n[retry]\nmax_attempts = 3\nattempt_timeout_ms = 5000\nbase_ms = 1\nfactor = 2\nmax_ms = 10\njitter = 0.1\n{GOOD}"
        );
        assert_eq!(
            problems(&long_attempt),
            ["retry.attempt_timeout_ms (5000) is longer than deadline.total_ms (1000)"]
        );
        let too_many = format!(
            "[retry]\nmax_attempts = 17\nattempt_timeout_ms = 1000\nbase_ms = 1\nfactor = 2\nmax_ms = 10\njitter = 0.1\n{GOOD}"
        );
        assert_eq!(
            problems(&too_many),
            ["retry.max_attempts must be 1 to 16, not 17"]
        );
        let no_key = GOOD.replace("api_key_env = \"A\"", "");
        assert_eq!(
            problems(&no_key),
            ["provider \"a\": api_key_env is required for Openai"]
        );
        let breaker = format!(
            "[breaker]\nconsecutive_failures = 0\ncooldown_ms = 0\nhalf_open_probes = 1\n{GOOD}"
        );
        assert_eq!(
            problems(&breaker),
            ["breaker.cooldown_ms must be above zero"]
        );
        let bulkhead = GOOD.replace(
            "api_key_env = \"A\"",
            "api_key_env = \"A\"\nmax_concurrency = 0",
        );
        assert_eq!(
            problems(&bulkhead),
            ["provider \"a\": max_concurrency must be above 0"]
        );
    }

    #[test]
    fn syntax_errors_unknown_keys_and_kinds_are_refused_with_their_place() {
        let typo = GOOD.replace("api_key_env", "api_key_envv");
        let err = Policy::from_toml(&typo).unwrap_err().to_string();
        assert!(err.contains("api_key_envv"), "{err}");
        let kind = GOOD.replace("kind = \"bedrock\"", "kind = \"gemini\"");
        let err = Policy::from_toml(&kind).unwrap_err().to_string();
        assert!(err.contains("gemini"), "{err}");
        let err = Policy::from_toml("[[routes]\n").unwrap_err().to_string();
        assert!(err.contains("line 1"), "{err}");
        assert!(Policy::from_json("{\"routes\": 7}").is_err());
    }

    #[test]
    fn jitter_names_and_fractions() {
        for (text, jitter) in [
            ("0.5", Jitter::Proportional { fraction: 0.5 }),
            ("\"equal\"", Jitter::Equal),
            ("\"full\"", Jitter::Full),
            ("\"none\"", Jitter::None),
        ] {
            let t = format!(
                "[retry]\nmax_attempts = 2\nattempt_timeout_ms = 100\nbase_ms = 1\nfactor = 2\nmax_ms = 10\njitter = {text}\n{GOOD}"
            );
            let p = Policy::from_toml(&t).expect("valid");
            assert_eq!(p.retry.backoff().expect("backoff").jitter(), jitter);
        }
        let t = format!(
            "[retry]\nmax_attempts = 2\nattempt_timeout_ms = 100\nbase_ms = 1\nfactor = 2\nmax_ms = 10\njitter = 1.5\n{GOOD}"
        );
        assert!(Policy::from_toml(&t).is_err());
    }

    /// Any one key set alone, to a small or a large value, is accepted: a
    /// default never contradicts what a user wrote.
    #[test]
    fn no_single_key_is_refused_because_of_a_default() {
        let keys = [
            ("deadline", "total_ms"),
            ("retry", "attempt_timeout_ms"),
            ("retry", "base_ms"),
            ("retry", "max_ms"),
            ("retry", "min_attempt_ms"),
            ("breaker", "cooldown_ms"),
            ("stream", "first_token_timeout_ms"),
            ("stream", "idle_timeout_ms"),
            ("health", "probe_interval_ms"),
            ("server", "header_read_timeout_ms"),
            ("server", "idle_timeout_ms"),
            ("server", "body_read_timeout_ms"),
            ("server", "send_timeout_ms"),
            ("server", "reload_settle_ms"),
        ];
        for (section, key) in keys {
            for value in [1_u64, 1_500, 10_000_000] {
                let text = format!("[{section}]\n{key} = {value}\n{GOOD}");
                if let Err(e) = Policy::from_toml(&text) {
                    panic!("[{section}] {key} = {value} alone is refused: {e}");
                }
            }
        }
        // The case the issue names, and what the defaults become.
        let p = Policy::from_toml(&format!("[deadline]\ntotal_ms = 1500\n{GOOD}")).expect("valid");
        assert_eq!(p.deadline.total_ms(), 1_500);
        let p = Policy::from_toml(&format!("[retry]\nbase_ms = 5000\n{GOOD}")).expect("valid");
        assert_eq!((p.retry.base_ms(), p.retry.max_ms()), (5_000, 5_000));
        let p = Policy::from_toml(&format!("[retry]\nmax_ms = 50\n{GOOD}")).expect("valid");
        assert_eq!((p.retry.base_ms(), p.retry.max_ms()), (50, 50));
        // A contradiction the user wrote is still refused.
        let both =
            format!("[deadline]\ntotal_ms = 1500\n[retry]\nattempt_timeout_ms = 5000\n{GOOD}");
        assert_eq!(
            problems(&both),
            ["retry.attempt_timeout_ms (5000) is longer than deadline.total_ms (1500)"]
        );
    }

    #[test]
    fn inbound_headers_never_show_their_values() {
        let mut h = http::HeaderMap::new();
        h.insert(
            "authorization",
            http::HeaderValue::from_static("Bearer sk-secret"),
        );
        let shown = format!("{:?}", InboundHeaders(h));
        assert_eq!(shown, r#"InboundHeaders(["authorization"])"#);
    }

    #[test]
    fn a_policy_without_routes_is_refused() {
        assert_eq!(problems(""), ["the policy has no routes ([[routes]])"]);
        let no_routes = GOOD.split("[[routes]]").next().expect("text");
        assert_eq!(
            problems(no_routes),
            ["the policy has no routes ([[routes]])"]
        );
        let zero = format!("[server]\nmax_in_flight = 0\n{GOOD}");
        assert_eq!(problems(&zero), ["server.max_in_flight must be above 0"]);
    }
}
