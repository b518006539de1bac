//! `[[routes]]`: model aliases, their chains of links, and resolving a
//! route's named policies.

use std::fmt;

use serde::{Deserialize, Serialize};
use tower_llm_breaker::BreakerConfig;
use tower_llm_core::{ChatRequest, Cost, FailurePolicy};
use tower_llm_hedge::HedgeConfig;
use tower_llm_retry::{JitterSpec, NamedJitter, RetryConfig};

use super::named;
use super::{
    BackoffKind, ConfigError, CostLimit, DEFAULT_DEGRADED_TEXT, DEGRADED_TEMPLATE, Policy,
    RISK_HEADER, STALE_CACHE, SeedClass,
};

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
    /// `prefill`: this link's model accepts an assistant message as the
    /// last one (a prefill), so a continued stream (the route's `resume`)
    /// asks it to go on from the partial answer itself; without, the
    /// partial answer is followed by an instruction to continue. Default:
    /// true for `anthropic` providers, false for the others; a refusal is
    /// learned (the continuation is sent again without prefill).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill: Option<bool>,
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
            prefill: None,
            requires_verification: false,
            hedge: None,
            hedge_to: None,
        }
    }
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
    /// `max_total_cost`: the most one call may spend, in dollars, across
    /// all its attempts (retries, failovers, hedges); every link must be
    /// priced (`[prices]`). Each attempt holds its worst case first: one
    /// that does not fit what is left is not sent, and the call moves to
    /// the next (cheaper) link. A caller may lower it with the
    /// `x-llm-max-cost` header, never raise it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_total_cost: Option<Cost>,
    /// `max_output_tokens`: the most output tokens one attempt may
    /// generate, written into requests that ask for more or name no
    /// `max_tokens`, when the route is held to a budget or quota (the
    /// attempt's worst case is then known). Required with
    /// `max_total_cost` or `[quotas]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_tokens: Option<u32>,
    /// `resume`: continue a stream that breaks after its first token
    /// (cut, stall, malformed chunk) on the same or the next link, with no
    /// text duplicated or missing ([`ResumeConfig`](tower_llm_resume::ResumeConfig):
    /// `max_continuations`, `max_partial_bytes`; default: off, a broken
    /// stream ends with its error, as seed 000 says).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume: Option<tower_llm_resume::ResumeConfig>,
    /// `complete`: hold every stream of this route until it is complete
    /// ([`CompleteConfig`](tower_llm_resume::CompleteConfig): `max_bytes`,
    /// `max_ms`), so a stream that breaks is retried or failed over like
    /// a failure before its first token; past either cap it streams on.
    /// Default: off (the top-level `[complete]` holds only the streams of
    /// requests that ask, with `x-llm-complete: true`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub complete: Option<tower_llm_resume::CompleteConfig>,
    /// `cache`: answer the same request from the same tenant from a
    /// response cache, and keep answers for the stale-safe rung
    /// ([`CacheConfig`](tower_llm_cache::CacheConfig): `ttl_ms`,
    /// `stale_ms`, `stale_for_risk`, `store_tool_calls`,
    /// `max_entry_bytes`). The request's `Cache-Control` is honoured
    /// within these. Default: off. A fallback policy's `STALE_CACHE` step
    /// sets `stale_ms` and `stale_for_risk`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<tower_llm_cache::CacheConfig>,
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
            max_total_cost: None,
            max_output_tokens: None,
            resume: None,
            complete: None,
            cache: None,
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
    /// The call's cost budget: the smaller of the route's
    /// `max_total_cost` and its fallback policy's.
    pub max_total_cost: Option<Cost>,
    /// The route's cache: its `cache`, with a `STALE_CACHE` step's
    /// `max_stale_ms` and `allowed_for_risk` (a `STALE_CACHE` step
    /// without a route `cache` keeps answers for the stale rung only:
    /// `ttl_ms = 0`).
    pub cache: Option<tower_llm_cache::CacheConfig>,
}

impl Policy {
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
        let mut max_total_cost = route.max_total_cost;
        let mut cache = route.cache.clone();
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
            match doc.max_total_cost.as_ref().map(CostLimit::amount) {
                None | Some(Ok(None)) => {}
                Some(Ok(Some(limit))) => {
                    max_total_cost = Some(max_total_cost.map_or(limit, |c: Cost| c.min(limit)));
                }
                Some(Err(e)) => p.push(format!("{at}: max_total_cost: {e}")),
            }
            if doc.max_total_latency_ms == Some(0) {
                p.push(format!("{at}: max_total_latency_ms must be above 0"));
            }
            if doc.steps.is_empty() {
                p.push(format!("{at}: steps is empty"));
            }
            let mut stale_step = false;
            for (i, step) in doc.steps.iter().enumerate() {
                let at = format!("{at}: steps[{i}]");
                if step.target == STALE_CACHE {
                    let next = doc.steps.get(i + 1).map(|s| s.target.as_str());
                    if !matches!(next, None | Some(DEGRADED_TEMPLATE)) {
                        p.push(format!(
                            "{at}: STALE_CACHE comes after every provider step (and before DEGRADED_TEMPLATE)"
                        ));
                    }
                    if step.max_attempts.is_some()
                        || step.requires_verification
                        || step.text.is_some()
                    {
                        p.push(format!(
                            "{at}: max_attempts, requires_verification and text mean nothing on STALE_CACHE"
                        ));
                    }
                    let Some(max_stale_ms) = step.max_stale_ms else {
                        p.push(format!(
                            "{at}: STALE_CACHE needs max_stale_ms (how stale an answer may be)"
                        ));
                        continue;
                    };
                    if cache
                        .as_ref()
                        .is_some_and(|c| c.stale_ms > 0 || c.stale_for_risk.is_some())
                    {
                        p.push(format!(
                            "{at}: STALE_CACHE meets the route's own cache.stale_ms"
                        ));
                    }
                    let mut c = cache.take().unwrap_or(tower_llm_cache::CacheConfig {
                        ttl_ms: 0,
                        ..tower_llm_cache::CacheConfig::default()
                    });
                    c.stale_ms = max_stale_ms;
                    c.stale_for_risk = step.allowed_for_risk.clone();
                    if let Err(e) = c.validate() {
                        p.push(format!("{at}: {e}"));
                    }
                    cache = Some(c);
                    stale_step = true;
                    continue;
                }
                if step.max_stale_ms.is_some() {
                    p.push(format!(
                        "{at}: max_stale_ms belongs to a STALE_CACHE step only"
                    ));
                }
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
                        "{at}: allowed_for_risk and text belong to a DEGRADED_TEMPLATE or STALE_CACHE step only"
                    ));
                }
                if stale_step {
                    p.push(format!("{at}: a provider step after STALE_CACHE"));
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
        ConfigError::check(p)?;
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
            max_total_cost,
            cache,
        })
    }
    /// `retry.min_attempt_ms`, or its default: 1,000, or a quarter of the
    /// call's deadline if that is less.
    pub fn min_attempt_ms(&self) -> u64 {
        self.retry
            .min_attempt_ms
            .unwrap_or_else(|| 1_000.min(self.deadline.total_ms() / 4))
    }
}
