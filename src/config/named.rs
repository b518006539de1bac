//! Named policies, declared once and referenced by routes, in the shape of
//! seed 004's two JSON examples: an operation's retry policy and a
//! fallback policy (a ladder of steps). Named breaker policies are plain
//! [`BreakerConfig`](tower_llm_breaker::BreakerConfig)s.
//!
//! Every field of those documents has a meaning here (see each field), and
//! a field or value without one is refused naming it, never ignored.

use serde::{Deserialize, Serialize};
use tower_llm_core::{Cost, Disposition, FailureClass, FailurePolicy};

/// A failure class as seed 004 names it (`"TIMEOUT"`, `"UNAVAILABLE"`,
/// ...), for `retryable` and `trigger` lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum SeedClass {
    /// A per-attempt timeout or a 408 ([`FailureClass::Timeout`]).
    Timeout,
    /// 5xx, 529 overloaded, a connect error or reset
    /// ([`FailureClass::Transient`]).
    Unavailable,
    /// 429 ([`FailureClass::RateLimited`]).
    RateLimited,
    /// A breaker refusal, or a full bulkhead ([`FailureClass::CircuitOpen`]).
    BreakerOpen,
    /// 402 or a provider's quota error ([`FailureClass::QuotaExhausted`]).
    QuotaExhausted,
    /// An answer that does not decode ([`FailureClass::InvalidResponse`]).
    InvalidResponse,
    /// The prompt is too long for the model
    /// ([`FailureClass::ContextWindowExceeded`]).
    ContextWindowExceeded,
    /// A content filter refused the prompt
    /// ([`FailureClass::ContentFiltered`]).
    ContentFiltered,
}

impl SeedClass {
    /// The failure class it names.
    pub fn class(self) -> FailureClass {
        match self {
            SeedClass::Timeout => FailureClass::Timeout,
            SeedClass::Unavailable => FailureClass::Transient,
            SeedClass::RateLimited => FailureClass::RateLimited,
            SeedClass::BreakerOpen => FailureClass::CircuitOpen,
            SeedClass::QuotaExhausted => FailureClass::QuotaExhausted,
            SeedClass::InvalidResponse => FailureClass::InvalidResponse,
            SeedClass::ContextWindowExceeded => FailureClass::ContextWindowExceeded,
            SeedClass::ContentFiltered => FailureClass::ContentFiltered,
        }
    }

    /// The classes a `retryable` list may name: the others are never
    /// retried on the same link (a refusal, a quota, a bad answer, a
    /// prompt problem).
    pub const RETRYABLE: [SeedClass; 3] = [
        SeedClass::Timeout,
        SeedClass::Unavailable,
        SeedClass::RateLimited,
    ];

    /// The classes a `trigger` list may name.
    pub const TRIGGERS: [SeedClass; 6] = [
        SeedClass::Unavailable,
        SeedClass::RateLimited,
        SeedClass::Timeout,
        SeedClass::QuotaExhausted,
        SeedClass::InvalidResponse,
        SeedClass::BreakerOpen,
    ];
}

/// An operation's retry policy, seed 004's first example:
///
/// ```json
/// { "operation": "model.generate", "deadline_ms": 12000, "attempt_timeout_ms": 3500,
///   "max_attempts": 3, "retryable": ["TIMEOUT", "UNAVAILABLE", "RATE_LIMITED"],
///   "backoff": { "kind": "EXPONENTIAL_JITTER", "base_ms": 250, "max_ms": 3000 },
///   "idempotency": "REQUIRED_FOR_WRITE",
///   "fallback_policy": "model-primary-v2", "breaker_policy": "provider-A" }
/// ```
///
/// A route uses it with `retry_policy = "model.generate"`; what it does
/// not set comes from the file's `[retry]` and `[deadline]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OperationPolicy {
    /// `operation`: the policy's name, which routes give as
    /// `retry_policy`.
    pub operation: String,
    /// `deadline_ms`: the whole call's budget on the routes that use it
    /// (the smaller of this and the fallback policy's
    /// `max_total_latency_ms`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<u64>,
    /// `attempt_timeout_ms`: one attempt's limit (`[retry]
    /// attempt_timeout_ms`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt_timeout_ms: Option<u64>,
    /// `max_attempts`: attempts per link, the first included (`[retry]
    /// max_attempts`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u8>,
    /// `retryable`: the failure classes retried on the same link, among
    /// `TIMEOUT`, `UNAVAILABLE`, `RATE_LIMITED` (default: those three);
    /// the others are never retried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retryable: Option<Vec<SeedClass>>,
    /// `backoff`: the wait between attempts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff: Option<SeedBackoff>,
    /// `idempotency`: `"REQUIRED_FOR_WRITE"` (writes need an idempotency
    /// key before they are retried; a chat completion writes nothing, so
    /// its retries need none) or `"NOT_REQUIRED"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency: Option<Idempotency>,
    /// `fallback_policy`: the `fallback_id` of the ladder after the
    /// route's own links.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback_policy: Option<String>,
    /// `breaker_policy`: the name of a `[breaker_policies.NAME]` the
    /// route's links use instead of `[breaker]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub breaker_policy: Option<String>,
}

/// `backoff` of an [`OperationPolicy`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeedBackoff {
    /// `kind`: `"EXPONENTIAL_JITTER"` (wait uniform in `[0, base_ms ·
    /// 2^n]`, capped at `max_ms`: seed 004's "random(0, 250), random(0,
    /// 500), random(0, 1000)"), `"EXPONENTIAL"` (exactly `base_ms · 2^n`,
    /// capped) or `"FIXED"` (`base_ms` every time).
    pub kind: BackoffKind,
    /// `base_ms`: the first wait's bound.
    pub base_ms: u64,
    /// `max_ms`: the cap (default `base_ms`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_ms: Option<u64>,
}

/// `backoff.kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum BackoffKind {
    /// Doubling, full jitter.
    ExponentialJitter,
    /// Doubling, no jitter.
    Exponential,
    /// The same wait every time.
    Fixed,
}

/// `idempotency`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Idempotency {
    /// Writes need an idempotency key to be retried; chat completions are
    /// not writes.
    RequiredForWrite,
    /// No requirement.
    NotRequired,
}

/// A fallback policy, seed 004's second example:
///
/// ```json
/// { "fallback_id": "model-primary-v2", "trigger": ["UNAVAILABLE", "BREAKER_OPEN"],
///   "steps": [ { "target": "provider_B/model_X", "max_attempts": 1, "requires_verification": true },
///              { "target": "DEGRADED_TEMPLATE", "allowed_for_risk": ["LOW", "MEDIUM"] } ],
///   "max_total_latency_ms": 12000, "max_total_cost": "...",
///   "never_bypass": ["POLICY", "PERMISSION", "APPROVAL"] }
/// ```
///
/// A route uses it with `fallback_policy = "model-primary-v2"` (or
/// through its operation policy): its steps follow the route's own links.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FallbackPolicyDoc {
    /// `fallback_id`: the policy's name.
    pub fallback_id: String,
    /// `trigger`: the failure classes that move the call to the next step,
    /// among `UNAVAILABLE`, `RATE_LIMITED`, `TIMEOUT`, `QUOTA_EXHAUSTED`,
    /// `INVALID_RESPONSE` and `BREAKER_OPEN` (default: all of them, the
    /// fallback layer's default). `CONTEXT_WINDOW_EXCEEDED` and
    /// `CONTENT_FILTERED` are refused here: they fail over only to links
    /// marked `long_context` / `filtered_content`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<Vec<SeedClass>>,
    /// `steps`: the ladder, in order.
    pub steps: Vec<FallbackStep>,
    /// `max_total_latency_ms`: the whole call's budget, every step
    /// included (the route's deadline; the smaller of this and the
    /// operation's `deadline_ms`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_total_latency_ms: Option<u64>,
    /// `max_total_cost`: the most one call may spend, in dollars, every
    /// step included (a number, or a string holding one; seed 004's
    /// placeholder `"..."` means no limit). The route's own
    /// `max_total_cost`, if lower, stays; every link must be priced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_total_cost: Option<CostLimit>,
    /// `never_bypass`: what no step may get around, each one a guarantee of
    /// the fallback layer: `"POLICY"` (every link's admission rule is
    /// checked before it is called), `"PERMISSION"` (an auth failure,
    /// 401/403, never fails over), `"APPROVAL"` (no step skips a check:
    /// the ladder only calls the links written here). Other values are
    /// refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub never_bypass: Option<Vec<NeverBypass>>,
}

/// `max_total_cost`: a number of dollars, or text: a number, or seed
/// 004's placeholder `"..."` (no limit).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum CostLimit {
    /// A number of dollars.
    Amount(f64),
    /// Text: a number of dollars, or `"..."`.
    Text(String),
}

impl CostLimit {
    /// The limit (`None` for `"..."`).
    ///
    /// # Errors
    ///
    /// Anything that is not an amount of money [`Cost`] accepts, or zero.
    pub fn amount(&self) -> Result<Option<Cost>, String> {
        let cost = match self {
            CostLimit::Text(t) if t == "..." => return Ok(None),
            CostLimit::Text(t) => t.parse::<Cost>().map_err(|e| e.to_string())?,
            CostLimit::Amount(a) => Cost::from_dollars(*a).ok_or_else(|| {
                format!(
                    "{a} is not an amount of money (0 to {} dollars)",
                    Cost::MAX_DOLLARS
                )
            })?,
        };
        if cost == Cost::ZERO {
            return Err("0 would refuse every call (leave it out for no limit)".to_owned());
        }
        Ok(Some(cost))
    }
}

/// A `never_bypass` entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum NeverBypass {
    /// Admission rules hold on every step.
    Policy,
    /// Auth failures never fail over.
    Permission,
    /// No step skips a check.
    Approval,
}

/// One step of a [`FallbackPolicyDoc`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FallbackStep {
    /// `target`: `"provider/model"` (a provider's `name` and the model id
    /// sent to it), `"STALE_CACHE"`: the freshest answer the route's cache
    /// holds for the same request, flagged stale, after every provider
    /// step; or `"DEGRADED_TEMPLATE"`: the degraded answer, last.
    pub target: String,
    /// `max_attempts`: this step's attempts (a link's `max_attempts`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u8>,
    /// `requires_verification`: an answer from this step is flagged for the
    /// caller to verify (a link's `requires_verification`: the gateway
    /// answers with `x-llm-requires-verification: true`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub requires_verification: bool,
    /// `allowed_for_risk` (`DEGRADED_TEMPLATE` and `STALE_CACHE` only):
    /// the degraded (or stale) answer is given only to requests whose
    /// `x-llm-risk` header is one of these; the others get the failure (or
    /// the next step).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_for_risk: Option<Vec<String>>,
    /// `text` (`DEGRADED_TEMPLATE` only): the degraded answer (default
    /// [`DEFAULT_DEGRADED_TEXT`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// `max_stale_ms` (`STALE_CACHE` only, required): how long past its
    /// freshness a stored answer may still be given (the route cache's
    /// `stale_ms`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_stale_ms: Option<u64>,
}

/// The `target` of a stale-safe step: the route's cache answers with an
/// answer stored earlier when every provider step failed.
pub const STALE_CACHE: &str = "STALE_CACHE";

/// The `target` of a degraded step.
pub const DEGRADED_TEMPLATE: &str = "DEGRADED_TEMPLATE";

/// The header `allowed_for_risk` reads (`x-llm-risk`; the cache's
/// `stale_for_risk` reads it too).
pub use tower_llm_cache::RISK_HEADER;

/// A degraded step's answer when it sets no `text`.
pub const DEFAULT_DEGRADED_TEXT: &str =
    "The service is temporarily unavailable; please try again shortly.";

/// A failure policy where, among `eligible`, exactly the classes of `on`
/// have `set` switched on (the others off); classes outside `eligible`
/// keep their defaults.
pub(crate) fn policy_for(
    on: &[SeedClass],
    eligible: &[SeedClass],
    set: fn(&mut Disposition, bool),
) -> FailurePolicy {
    let mut policy = FailurePolicy::default();
    for seed in eligible {
        let class: FailureClass = seed.class();
        let mut d = policy.get(class);
        set(&mut d, on.contains(seed));
        policy = policy.with(class, d);
    }
    policy
}
