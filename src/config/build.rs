//! Turning a policy into stacks: the layers, a route's whole stack, the
//! idempotency layer and the hedge budgets.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tower::Layer as _;
use tower::ServiceBuilder;
use tower::ServiceExt as _;
use tower::util::BoxCloneSyncService;
use tower_llm_breaker::BreakerLayer;
use tower_llm_cache::{CacheAnswer, CacheLayer, CacheStore};
use tower_llm_core::{
    ChatRequest, ChatResponse, ChatStream, Failure, FailureClass, Link, Metrics, RecordsAttempts,
    Tenant,
};
use tower_llm_cost::{BudgetLayer, CostAnswer, CostLayer, MemoryQuota, QuotaStore};
use tower_llm_deadline::DeadlineLayer;
use tower_llm_fallback::{FallbackLayer, LinkSpec};
use tower_llm_hedge::{HedgeConfig, HedgeLayer};
use tower_llm_idempotency::IdempotencyLayer;
use tower_llm_idempotency::IdempotentAnswer;
use tower_llm_resume::{CompleteLayer, ContinuationLayer, Prefill, ResumeConfig, ResumeLayer};
use tower_llm_retry::{RetryConfig, RetryLayer};

use crate::ServiceBuilderExt;

use super::{
    AdmitRule, ConfigError, HedgeTarget, InboundHeaders, LinkConfig, Policy, PoolConfig, Pools,
    ProviderConfig, RouteConfig, RouteService,
};

/// What a route's stack answers: a unary [`ChatResponse`] or a
/// [`ChatStream`]. [`degraded`](Self::degraded) builds a route's degraded
/// answer.
pub trait RouteAnswer: RecordsAttempts + Send + 'static {
    /// An answer of `text` in the name of `route` (the provider reads
    /// `degraded`).
    fn degraded(route: &str, text: &str) -> Self;

    /// `true` for a degraded answer.
    fn is_degraded(&self) -> bool;

    /// `svc` (a route's fallback chain) behind the resume layer of the
    /// route's `resume`: a stream broken after its first token is
    /// continued. Default: `svc` as it is (only streams are continued).
    ///
    /// # Errors
    ///
    /// Settings the resume layer refuses.
    fn resumed(
        svc: RouteService<Self>,
        config: ResumeConfig,
    ) -> Result<RouteService<Self>, ConfigError>
    where
        Self: Sized,
    {
        let _ = config;
        Ok(svc)
    }

    /// `svc` (a provider's service) held until complete by `layer`.
    /// Default: `svc` as it is (only streams are held).
    fn held(svc: RouteService<Self>, layer: &CompleteLayer) -> RouteService<Self>
    where
        Self: Sized,
    {
        let _ = layer;
        svc
    }
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
            cache: None,
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

    fn resumed(
        svc: RouteService<Self>,
        config: ResumeConfig,
    ) -> Result<RouteService<Self>, ConfigError> {
        let layer =
            ResumeLayer::new(config).map_err(|e| ConfigError::new(format!("resume: {e}")))?;
        Ok(BoxCloneSyncService::new(layer.layer(svc)))
    }

    fn held(svc: RouteService<Self>, layer: &CompleteLayer) -> RouteService<Self> {
        BoxCloneSyncService::new(layer.clone().layer(svc))
    }
}

/// The request header with which a client asks for its stream to be held
/// until complete (`x-llm-complete: true`), with `[complete]`.
pub const COMPLETE_HEADER: &str = "x-llm-complete";

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

impl Policy {
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
    /// (`Res = ChatStream`) provider services alike. With `[quotas]`, the
    /// route counts them in a [`MemoryQuota`] of its own: to share one
    /// among routes (or replicas), use
    /// [`build_route_with`](Self::build_route_with).
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
        Res: RouteAnswer + IdempotentAnswer + CacheAnswer + CostAnswer + tower_llm_pool::PoolAnswer,
    {
        let hedges = HedgeBudgets::new();
        let quota = self.memory_quota();
        let with = BuildContext {
            breaker,
            metrics: &metrics,
            idempotency: None,
            hedges: &hedges,
            quota: quota.as_ref(),
            pacers: None,
            cache: None,
        };
        self.build_route_with(route, with, provider)
    }
    /// As [`build_route`](Self::build_route), with what the route shares
    /// with others in `with` ([`BuildContext`]): its breaker layer, its
    /// metrics, an idempotency layer (if any) just inside the deadline and
    /// outside the fallback, the links' hedge budgets and the tenant quota
    /// store:
    ///
    /// deadline → idempotency → budget (`max_total_cost`) → fallback →
    /// per link hedge → retry → **cost** (priced links) → breaker →
    /// provider.
    ///
    /// Pass the same idempotency layer (or a clone) on every reload so that
    /// stored answers survive it; [`Policy::idempotency_layer`] makes one.
    /// The links' hedges take their budgets from `with.hedges`: pass the
    /// same one to every build of the route (its unary and its streaming
    /// stack) so a link has one hedge budget, and
    /// [`HedgeBudgets::for_reload`] of it on a reload. Pass one quota
    /// store to every route, so a tenant has one quota.
    ///
    /// # Errors
    ///
    /// As [`build_route`](Self::build_route).
    pub fn build_route_with<Res>(
        &self,
        route: &RouteConfig,
        with: BuildContext<'_>,
        mut provider: impl FnMut(&ProviderConfig, &LinkConfig) -> RouteService<Res>,
    ) -> Result<RouteService<Res>, ConfigError>
    where
        Res: RouteAnswer + IdempotentAnswer + CacheAnswer + CostAnswer + tower_llm_pool::PoolAnswer,
    {
        let BuildContext {
            breaker,
            metrics,
            idempotency,
            hedges,
            quota,
            pacers,
            cache,
        } = with;
        let fresh = Pools::new();
        let pacers = pacers.unwrap_or(&fresh);
        let r = self.resolve(route)?;
        // Complete-or-fail: every stream of the route, or those whose
        // request asks (`[complete]`), held at each provider service.
        let complete = match (route.complete, self.complete) {
            (Some(config), _) => Some(CompleteLayer::new(config).map_err(|e| {
                ConfigError::new(format!("route \"{}\": complete: {e}", route.model))
            })?),
            (None, Some(config)) => Some(
                CompleteLayer::new(config)
                    .map_err(|e| ConfigError::new(format!("complete: {e}")))?
                    .when(asks_complete),
            ),
            (None, None) => None,
        };
        let mut provider = |p: &ProviderConfig, link: &LinkConfig| {
            let svc = provider(p, link);
            match &complete {
                Some(layer) => Res::held(svc, layer),
                None => svc,
            }
        };
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
        // Hedge targets outside the chain, and pools' deployments, get
        // breaker keys too.
        let mut keyed: Vec<LinkConfig> = r
            .chain
            .iter()
            .flat_map(|l| {
                let mut all = self.deployments_of(l);
                all.push(l.clone());
                all
            })
            .collect();
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
            let mut link_retry = retry.clone();
            if let Some(n) = link.max_attempts {
                link_retry = link_retry.with_max_attempts(n);
            }
            if let Some(ms) = link.attempt_timeout_ms {
                link_retry = link_retry.with_attempt_timeout(Duration::from_millis(ms));
            }
            let cost = self.price(&link.provider, &link.model).map(|price| {
                let mut cost = CostLayer::new(price)
                    .with_metrics(metrics.clone())
                    .with_link(Link::new(link.provider.as_str(), link.model.as_str()));
                if let Some(cap) = route.max_output_tokens {
                    cost = cost.with_max_output_tokens(cap);
                }
                if let Some(store) = quota {
                    cost = cost.with_quota(store.clone());
                }
                cost
            });
            // retry → cost (a priced link) → a provider behind its circuit
            // breaker, or a pool (whose deployments each have their own).
            let Some(pool) = self.pool(&link.provider) else {
                let config = self
                    .provider(&link.provider)
                    .ok_or_else(|| unknown(&link.provider))?;
                let provider = provider(config, link);
                let with_retry = ServiceBuilder::new().llm_retry(link_retry);
                return Ok(match cost {
                    None => BoxCloneSyncService::new(
                        with_retry.llm_breaker(breaker.clone()).service(provider),
                    ),
                    Some(cost) => BoxCloneSyncService::new(
                        with_retry
                            .layer(cost)
                            .llm_breaker(breaker.clone())
                            .service(provider),
                    ),
                });
            };
            let pool = self.pool_stack(pool, link, &breaker, pacers, metrics, &mut provider)?;
            let with_retry = ServiceBuilder::new().llm_retry(link_retry);
            Ok(match cost {
                None => BoxCloneSyncService::new(with_retry.service(pool)),
                Some(cost) => BoxCloneSyncService::new(with_retry.layer(cost).service(pool)),
            })
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
            // A continued stream asks this link for the rest, with a
            // prefill where its model takes one.
            let svc = match route.resume {
                None => svc,
                Some(_) => {
                    let prefill = link.prefill.unwrap_or_else(|| {
                        self.provider(&link.provider)
                            .is_some_and(|p| p.kind == super::ProviderKind::Anthropic)
                    });
                    BoxCloneSyncService::new(
                        ContinuationLayer::new(Prefill::new(prefill)).layer(svc),
                    )
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
        let deadline =
            DeadlineLayer::new(Duration::from_millis(r.total_ms)).with_metrics(metrics.clone());
        let chain: RouteService<Res> = match r.max_total_cost {
            None => BoxCloneSyncService::new(fallback.layer(primary)),
            Some(limit) => BoxCloneSyncService::new(
                ServiceBuilder::new()
                    .layer(BudgetLayer::new(limit))
                    .llm_fallback(fallback)
                    .service(primary),
            ),
        };
        let chain = match route.resume {
            Some(config) => Res::resumed(chain, config)
                .map_err(|e| ConfigError::new(format!("route \"{}\": {e}", route.model)))?,
            None => chain,
        };
        let tenants = quota.is_some();
        let cache = match &r.cache {
            None => None,
            Some(config) => {
                let store = cache.cloned().unwrap_or_else(|| self.cache_store());
                let layer = CacheLayer::new(config.clone())
                    .map_err(|e| {
                        ConfigError::new(format!("route \"{}\": cache: {e}", route.model))
                    })?
                    .with_store(store)
                    .with_metrics(metrics.clone())
                    .with_tenant(CacheScope::of(&r.chain))
                    .with_headers(inbound_headers as InboundHeadersOf);
                Some(layer)
            }
        };
        let svc = BoxCloneSyncService::new(
            ServiceBuilder::new()
                .layer(deadline)
                .option_layer(idempotency.cloned())
                .option_layer(cache)
                .map_request(move |mut req: ChatRequest| {
                    if tenants {
                        let id = tenant_header(&req).unwrap_or_default();
                        Tenant::new(id).store(&mut req);
                    }
                    req
                })
                .service(chain),
        );
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

impl Policy {
    /// A link's pool: each deployment behind `breaker` (its own circuit:
    /// the deployment is the link its service sees), paced by its
    /// provider's pacer.
    fn pool_stack<Res>(
        &self,
        pool: &PoolConfig,
        link: &LinkConfig,
        breaker: &BreakerLayer<super::PolicyKey>,
        pacers: &Pools,
        metrics: &Metrics,
        provider: &mut impl FnMut(&ProviderConfig, &LinkConfig) -> RouteService<Res>,
    ) -> Result<RouteService<Res>, ConfigError>
    where
        Res: tower_llm_pool::PoolAnswer + Send + 'static,
    {
        let mut deployments = Vec::with_capacity(pool.deployments.len());
        for (d, dlink) in pool.deployments.iter().zip(self.deployments_of(link)) {
            let config = self.provider(&d.provider).ok_or_else(|| {
                ConfigError::new(format!(
                    "pool \"{}\": unknown provider \"{}\"",
                    pool.name, d.provider
                ))
            })?;
            let svc: RouteService<Res> = BoxCloneSyncService::new(
                ServiceBuilder::new()
                    .llm_breaker(breaker.clone())
                    .service(provider(config, &dlink)),
            );
            let mut deployment = tower_llm_pool::Deployment::new(d.provider.as_str(), svc)
                .with_weight(d.weight.unwrap_or(1))
                .with_pacer(pacers.of(config))
                .with_load(pacers.load_of(&d.provider));
            if let Some(model) = &d.model {
                deployment = deployment.with_model(model.as_str());
            }
            deployments.push(deployment);
        }
        let mut pool_svc = tower_llm_pool::Pool::new(deployments).with_metrics(metrics.clone());
        if let Some(header) = &pool.affinity_header {
            let header = header.clone();
            pool_svc = pool_svc.with_affinity(move |req: &ChatRequest| {
                let value = req
                    .extensions
                    .get::<InboundHeaders>()?
                    .0
                    .get(header.as_str())?;
                let mut h = std::hash::DefaultHasher::new();
                std::hash::Hash::hash(value.as_bytes(), &mut h);
                Some(std::hash::Hasher::finish(&h))
            });
        }
        pool_svc = pool_svc.with_queue(
            pool.max_waiting.unwrap_or(256),
            Duration::from_millis(pool.max_wait_ms.unwrap_or(60_000)),
        );
        if let Some(header) = &pool.priority_header {
            let header = header.clone();
            pool_svc = pool_svc.with_priority(move |req: &ChatRequest| {
                let low = req
                    .extensions
                    .get::<InboundHeaders>()
                    .and_then(|h| h.0.get(header.as_str()))
                    .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"low"));
                if low {
                    tower_llm_pool::Priority::Low
                } else {
                    tower_llm_pool::Priority::Normal
                }
            });
        }
        if let Some(max) = pool.adaptive_concurrency {
            pool_svc = pool_svc.with_adaptive_concurrency(max);
        }
        pacers.built(&pool.name, pool_svc.status_handle());
        Ok(BoxCloneSyncService::new(pool_svc))
    }
}

/// What a route's stack shares with others, for
/// [`Policy::build_route_with`].
#[derive(Debug, Clone, Copy)]
pub struct BuildContext<'a> {
    /// The breaker layer (pass the same one, or one sharing its store, so
    /// circuits survive a reload).
    pub breaker: &'a BreakerLayer,
    /// Where the per-call and per-attempt metrics go.
    pub metrics: &'a Metrics,
    /// The idempotency layer, if any ([`Policy::idempotency_layer`]).
    pub idempotency: Option<&'a IdempotencyLayer<TenantHeader>>,
    /// The links' hedge budgets.
    pub hedges: &'a HedgeBudgets,
    /// Where tenant quotas are counted, when `[quotas]` is set (every
    /// route the same store; [`Policy::memory_quota`] makes one for one
    /// process).
    pub quota: Option<&'a Arc<dyn QuotaStore>>,
    /// The pacers of the providers in `[[pools]]` (pass the same one to
    /// every build, so a provider has one pacer and what it learned from
    /// rate-limit headers survives a reload; none: fresh ones, paced by
    /// `rpm` and `tpm` only).
    pub pacers: Option<&'a Pools>,
    /// Where routes with a `cache` keep their answers (pass the same one
    /// to every build, and on a reload, so answers survive it; none: a
    /// store of `[cache]` for this build, [`Policy::cache_store`]).
    pub cache: Option<&'a Arc<dyn CacheStore>>,
}

impl Policy {
    /// An in-process store of `[cache]` (its defaults without it: 64
    /// MiB) for the routes' caches.
    pub fn cache_store(&self) -> Arc<dyn CacheStore> {
        Arc::new(self.cache.unwrap_or_default().memory())
    }

    /// A [`MemoryQuota`] of `[quotas]` (none without it): quotas counted
    /// in this process.
    pub fn memory_quota(&self) -> Option<Arc<dyn QuotaStore>> {
        let config = self.quotas.clone()?;
        Some(Arc::new(MemoryQuota::new(config)))
    }
}

/// The inbound header whose value scopes idempotency keys (two tenants
/// with the same key never share an answer; a request without it is in
/// the unscoped space) and names the tenant whose `[quotas]` a call
/// spends (none: the empty id).
pub const TENANT_HEADER: &str = "x-tenant-id";

/// The idempotency tenant of a request: the raw bytes of its inbound
/// [`TENANT_HEADER`] (from its [`InboundHeaders`]), whatever they are
/// (`café-lyon` in UTF-8, a Latin-1 byte): a tenant id is opaque, never
/// dropped for not being ASCII.
pub type TenantHeader = fn(&ChatRequest) -> Option<Vec<u8>>;

/// What a route's cached answers are scoped by: the tenant
/// ([`TENANT_HEADER`]) and, when links of the route admit requests by a
/// header (`admit`), that header's value, so a request never gets an
/// answer from a link it may not use.
#[derive(Debug, Clone)]
struct CacheScope {
    admit_headers: Arc<[String]>,
}

impl CacheScope {
    fn of(chain: &[LinkConfig]) -> Self {
        let mut headers: Vec<String> = chain
            .iter()
            .filter_map(|l| l.admit.as_ref().map(|a| a.header.to_ascii_lowercase()))
            .collect();
        headers.sort();
        headers.dedup();
        CacheScope {
            admit_headers: headers.into(),
        }
    }
}

impl tower_llm_idempotency::TenantFn<ChatRequest> for CacheScope {
    fn tenant(&self, req: &ChatRequest) -> Option<Vec<u8>> {
        let tenant = tenant_header(req);
        if self.admit_headers.is_empty() {
            return tenant;
        }
        // Each part length-prefixed, absent told from empty: no two
        // scopes encode alike.
        let mut scope = Vec::new();
        let mut part = |value: Option<&[u8]>| match value {
            Some(v) => {
                scope.push(1);
                scope.extend_from_slice(&(v.len() as u64).to_be_bytes());
                scope.extend_from_slice(v);
            }
            None => scope.push(0),
        };
        part(tenant.as_deref());
        let headers = req.extensions.get::<InboundHeaders>();
        for name in self.admit_headers.iter() {
            part(
                headers
                    .and_then(|h| h.0.get(name.as_str()))
                    .map(http::HeaderValue::as_bytes),
            );
        }
        Some(scope)
    }
}

/// Where the cache reads a typed request's `Cache-Control` and
/// `x-llm-risk`: its [`InboundHeaders`].
pub type InboundHeadersOf = for<'a> fn(&'a ChatRequest) -> Option<&'a http::HeaderMap>;

fn inbound_headers(req: &ChatRequest) -> Option<&http::HeaderMap> {
    req.extensions.get::<InboundHeaders>().map(|h| &h.0)
}

pub(super) fn tenant_header(req: &ChatRequest) -> Option<Vec<u8>> {
    Some(
        req.extensions
            .get::<InboundHeaders>()?
            .0
            .get(TENANT_HEADER)?
            .as_bytes()
            .to_vec(),
    )
}

/// `true` when the request's inbound headers ask for its stream to be
/// held until complete ([`COMPLETE_HEADER`]: `true`).
fn asks_complete(req: &ChatRequest) -> bool {
    req.extensions
        .get::<InboundHeaders>()
        .and_then(|h| h.0.get(COMPLETE_HEADER))
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"))
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
