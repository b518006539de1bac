//! Route building: one stack per route of a policy, over each provider's
//! services (built once per policy and shared by the routes that name
//! it), behind the provider's bulkhead and with its own transport when it
//! has its own connect timeout.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tower_llm::breaker::BreakerLayer;
use tower_llm::config::{ConfigError, Policy, ProviderServices};
use tower_llm::{GenAiMetrics, Metrics};

use crate::state::{KeySource, RouteInfo, Routes, Transport};

/// Bulkheads by provider name, with their limit.
pub(crate) type Bulkheads = Mutex<HashMap<String, (usize, Arc<tokio::sync::Semaphore>)>>;

/// Builds every route of `policy`; each provider once, shared by routes.
pub(crate) fn build(
    policy: &Policy,
    breaker: &BreakerLayer,
    metrics: &Metrics,
    genai: &GenAiMetrics,
    transport: &Transport,
    keys: &KeySource,
    bulkheads: &Bulkheads,
) -> Result<Routes, ConfigError> {
    let mut services: HashMap<String, ProviderServices> = HashMap::new();
    for provider in &policy.providers {
        let key = keys(provider)?;
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
        // A provider with its own connect timeout gets its own pool.
        let transport = match provider.connect_timeout() {
            Some(limit) => connect_with(limit),
            None => transport.clone(),
        };
        let built = provider.services(key, transport, policy.stream.timeouts(), genai, bulkhead)?;
        services.insert(provider.name.clone(), built);
    }
    let mut unary = HashMap::new();
    let mut stream = HashMap::new();
    let mut info = HashMap::new();
    for route in &policy.routes {
        let u = policy.build_route(route, breaker, metrics.clone(), |p| {
            services[&p.name].chat.clone()
        })?;
        let s = policy.build_route(route, breaker, metrics.clone(), |p| {
            services[&p.name].stream.clone()
        })?;
        unary.insert(route.model.clone(), u);
        stream.insert(route.model.clone(), s);
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
            }),
        );
    }
    Ok(Routes {
        policy: policy.clone(),
        unary,
        stream,
        info,
    })
}

/// A transport with `limit` as its connect timeout.
fn connect_with(limit: Duration) -> Transport {
    tower_llm::providers::https::client_with_connect_timeout(limit)
}
