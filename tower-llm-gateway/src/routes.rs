//! Route building: one stack per route of a policy, over each provider's
//! services (built once per policy and shared by the routes that name
//! it), behind the provider's bulkhead and with its own transport when it
//! has its own connect timeout.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tower::util::BoxCloneSyncService;
use tower_llm::breaker::BreakerLayer;
use tower_llm::cache::{CacheAnswer, CacheStore};
use tower_llm::config::{
    BuildContext, ConfigError, EmbeddingService, HedgeBudgets, LinkConfig, Policy, Pools,
    ProviderConfig, ProviderServices, RouteAnswer, RouteConfig, RouteService, TenantHeader,
};
use tower_llm::cost::{CostAnswer, QuotaStore};
use tower_llm::idempotency::{IdempotencyLayer, IdempotentAnswer};
use tower_llm::pool::{ObserveRateLimitsLayer, PoolAnswer};
use tower_llm::providers::{FirstTokenLimit, FirstTokenLimitConfig};
use tower_llm::{
    ChatRequest, ChatResponse, ChatStream, Failure, FailureClass, GenAiMetrics, Metrics,
};

use crate::config::GatewaySettings;
use crate::transport::Transport;

/// How a provider's API key is found (the environment, or a fixed key for
/// the embedded mock providers).
pub type KeySource = Arc<
    dyn Fn(&ProviderConfig) -> Result<Option<tower_llm::providers::ApiKey>, ConfigError>
        + Send
        + Sync,
>;

/// The routes of one policy: swapped whole on reload.
pub(crate) struct Routes {
    /// The policy they were built from.
    pub(crate) policy: Policy,
    /// The gateway's settings read with it.
    pub(crate) settings: GatewaySettings,
    pub(crate) unary: HashMap<String, RouteService<ChatResponse>>,
    pub(crate) stream: HashMap<String, RouteService<ChatStream>>,
    /// The routes that serve embeddings (every link's provider has an
    /// embeddings API).
    pub(crate) embeddings: HashMap<String, EmbeddingService>,
    /// What the handler needs to know of each route.
    pub(crate) info: HashMap<String, Arc<RouteInfo>>,
}

/// What the HTTP handler needs to know of a route.
#[derive(Debug)]
pub(crate) struct RouteInfo {
    /// The call's budget (the route's resolved deadline).
    pub(crate) deadline: Duration,
    /// The links whose answers need verification: (provider, model).
    pub(crate) verify: Vec<(String, String)>,
    /// Every link is priced: a call may be held to a budget
    /// (`x-llm-max-cost`).
    pub(crate) priced: bool,
}

/// Bulkheads by provider name, with their limit.
pub(crate) type Bulkheads = Mutex<HashMap<String, (usize, Arc<tokio::sync::Semaphore>)>>;

/// Learned first-token limits by provider name, with their settings.
pub(crate) type FirstTokens = Mutex<HashMap<String, (FirstTokenLimitConfig, FirstTokenLimit)>>;

/// Builds every route of `policy`; each provider once, shared by routes.
#[allow(clippy::too_many_arguments)]
pub(crate) fn build(
    policy: &Policy,
    settings: &GatewaySettings,
    breaker: &BreakerLayer,
    idempotency: Option<&IdempotencyLayer<TenantHeader>>,
    hedges: &HedgeBudgets,
    quota: Option<&Arc<dyn QuotaStore>>,
    metrics: &Metrics,
    genai: &GenAiMetrics,
    transport: &Transport,
    keys: &KeySource,
    bulkheads: &Bulkheads,
    first_tokens: &FirstTokens,
    pacers: &Pools,
    cache: Option<&Arc<dyn CacheStore>>,
) -> Result<Routes, ConfigError> {
    // Each provider once, and once more for each distinct set of link
    // overrides (connect, first-token, idle timeouts) a route asks for.
    let mut variants: Vec<ProviderConfig> = policy.providers.clone();
    for route in &policy.routes {
        for link in policy.resolve(route)?.chain {
            if let Some(p) = policy.provider(&link.provider) {
                let v = p.for_link(&link);
                if !variants.contains(&v) {
                    variants.push(v);
                }
            }
        }
    }
    let mut services: Vec<(ProviderConfig, ProviderServices)> = Vec::new();
    for provider in variants {
        let key = keys(&provider)?;
        let bulkhead = provider.max_concurrency.map(|limit| {
            let mut kept = bulkheads.lock().unwrap_or_else(PoisonError::into_inner);
            match kept.get(&provider.name) {
                Some((l, permits)) if *l == limit => permits.clone(),
                _ => {
                    let permits = Arc::new(tokio::sync::Semaphore::new(limit));
                    kept.insert(provider.name.clone(), (limit, permits.clone()));
                    permits
                }
            }
        });
        // What a learned first-token limit learned survives a reload
        // while its settings are unchanged.
        let first_token = match provider
            .silence
            .as_ref()
            .and_then(|g| g.learned_first_token.clone())
        {
            None => None,
            Some(config) => {
                let mut kept = first_tokens.lock().unwrap_or_else(PoisonError::into_inner);
                match kept.get(&provider.name) {
                    Some((c, limit)) if *c == config => Some(limit.clone()),
                    _ => {
                        let limit = provider.first_token_limit()?;
                        if let Some(limit) = &limit {
                            kept.insert(provider.name.clone(), (config, limit.clone()));
                        }
                        limit
                    }
                }
            }
        };
        // A provider or link with its own connect timeout gets its own pool.
        let transport = match provider.connect_timeout() {
            Some(limit) => connect_with(limit),
            None => transport.clone(),
        };
        // A deployment of a pool: its pacer reads every answer's
        // rate-limit headers.
        let pooled = policy
            .pools
            .iter()
            .any(|pool| pool.deployments.iter().any(|d| d.provider == provider.name));
        let built = if pooled {
            let observed = tower::Layer::layer(
                &ObserveRateLimitsLayer::new(pacers.of(&provider)),
                transport,
            );
            provider.services_keeping(key, observed, policy.stream, genai, bulkhead, first_token)?
        } else {
            provider.services_keeping(
                key,
                transport,
                policy.stream,
                genai,
                bulkhead,
                first_token,
            )?
        };
        services.push((provider, built));
    }
    let find = |p: &ProviderConfig, link: &LinkConfig| {
        let want = p.for_link(link);
        services
            .iter()
            .find(|(v, _)| *v == want)
            .map(|(_, s)| s.clone())
    };
    let mut unary = HashMap::new();
    let mut stream = HashMap::new();
    let mut embeddings = HashMap::new();
    let mut info = HashMap::new();
    for route in &policy.routes {
        let with = BuildContext {
            breaker,
            metrics,
            idempotency,
            hedges,
            quota,
            pacers: Some(pacers),
            cache,
        };
        let u = route_stack(policy, route, with, &find, |s| s.chat)?;
        let s = route_stack(policy, route, with, &find, |s| s.stream)?;
        unary.insert(route.model.clone(), u);
        stream.insert(route.model.clone(), s);
        if let Some(e) =
            policy.build_embedding_route(route, breaker, metrics.clone(), |p, link| {
                find(p, link).and_then(|s| s.embeddings)
            })?
        {
            embeddings.insert(route.model.clone(), e);
        }
        let resolved = policy.resolve(route)?;
        let verify = resolved
            .chain
            .iter()
            .filter(|l| l.requires_verification)
            .map(|l| (l.provider.clone(), l.model.clone()))
            .collect();
        info.insert(
            route.model.clone(),
            Arc::new(RouteInfo {
                deadline: Duration::from_millis(resolved.total_ms),
                verify,
                priced: policy.holds_budgets(route, &resolved),
            }),
        );
    }
    Ok(Routes {
        policy: policy.clone(),
        settings: settings.clone(),
        unary,
        stream,
        embeddings,
        info,
    })
}

/// One route's stack over the services `find` gives for its links, the
/// unary or streaming one (`pick`).
fn route_stack<Res: RouteAnswer + IdempotentAnswer + CacheAnswer + CostAnswer + PoolAnswer>(
    policy: &Policy,
    route: &RouteConfig,
    with: BuildContext<'_>,
    find: &dyn Fn(&ProviderConfig, &LinkConfig) -> Option<ProviderServices>,
    pick: fn(ProviderServices) -> RouteService<Res>,
) -> Result<RouteService<Res>, ConfigError> {
    let mut missing = false;
    let svc = policy.build_route_with(route, with, |p, link| match find(p, link) {
        Some(services) => pick(services),
        None => {
            missing = true;
            unavailable(&p.name)
        }
    })?;
    if missing {
        return Err(ConfigError::new(format!(
            "route \"{}\": a link's provider was not built",
            route.model
        )));
    }
    Ok(svc)
}

/// A stand-in for a provider that could not be built (never served: the
/// build fails first).
fn unavailable<Res: Send + 'static>(name: &str) -> RouteService<Res> {
    let message = format!("provider \"{name}\" was not built");
    BoxCloneSyncService::new(tower::service_fn(move |_req: ChatRequest| {
        let message = message.clone();
        async move { Err(Failure::new(FailureClass::InvalidResponse).with_message(message)) }
    }))
}

/// A transport with `limit` as its connect timeout.
fn connect_with(limit: Duration) -> Transport {
    Transport::per_thread(limit)
}
