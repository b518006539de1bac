//! The gateway's stores: the breaker layer and its store (in memory, or
//! shared on Redis), the idempotency layer (likewise), and their gauges.

use std::sync::{Arc, Mutex, PoisonError};

use tower_llm::breaker::KeyFn as _;
use tower_llm::breaker::{BreakerConfig, BreakerKey, BreakerLayer, BreakerStore};
use tower_llm::cache::CacheStore;
use tower_llm::config::{ConfigError, Policy, TenantHeader};
use tower_llm::cost::{MemoryQuota, QuotaConfig, QuotaStore};
use tower_llm::idempotency::{IdempotencyConfig, IdempotencyLayer};
use tower_llm::{ChatRequest, Link, Metrics};
use tower_llm_breaker_redis::RedisBreakerStore;
use tower_llm_cache_redis::RedisCache;
use tower_llm_idempotency_redis::RedisIdempotencyStore;

use crate::config::{
    GatewayConfig, SharedBreakerPolicy, SharedIdempotencyPolicy, SharedQuotas, SharedRedis,
};
use tower_llm_cost_redis::RedisQuota;
use tower_llm_pool_redis::RedisPacing;

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The gateway's breaker layer and its store.
pub(crate) struct Breakers {
    /// The layer every route's links are built with (its store shared).
    pub(crate) layer: BreakerLayer,
    /// The shared settings it was built with (none: in memory).
    shared: Option<(SharedBreakerPolicy, BreakerConfig)>,
    /// The Redis store, when shared.
    pub(crate) store: Option<Arc<RedisBreakerStore>>,
    /// `llm_breaker_shared_store_up` and `_dropped`, while this store is
    /// the gateway's.
    _metrics: Option<(
        opentelemetry::metrics::ObservableGauge<i64>,
        opentelemetry::metrics::ObservableCounter<u64>,
    )>,
}

impl Breakers {
    /// The breakers `policy` asks for, or `None` when `running` already
    /// is (the same `[breaker_shared]` and, under it, the same
    /// `[breaker]`: the store runs the shared threshold with it).
    pub(crate) fn new(
        config: &GatewayConfig,
        meter: &opentelemetry::metrics::Meter,
        running: Option<&Breakers>,
    ) -> Result<Option<Breakers>, ConfigError> {
        let want = config
            .settings
            .breaker_shared
            .clone()
            .map(|shared| (shared, config.policy.breaker));
        if let Some(running) = running {
            if running.shared == want {
                return Ok(None);
            }
        }
        let Some((shared, config)) = want else {
            return Ok(Some(Breakers {
                layer: BreakerLayer::new(),
                shared: None,
                store: None,
                _metrics: None,
            }));
        };
        let mut builder = RedisBreakerStore::builder(&shared.redis)
            .map_err(|e| ConfigError::new(format!("breaker_shared.redis: {e}")))?
            .with_breaker_config(config);
        if let Some(prefix) = &shared.prefix {
            builder = builder.with_prefix(prefix.clone());
        }
        let store = Arc::new(
            builder
                .build()
                .map_err(|e| ConfigError::new(format!("breaker_shared: {e}")))?,
        );
        tracing::info!(target: "gateway", redis = %shared.redacted(), "circuits shared through Redis");
        let metrics = store.register_metrics(meter);
        Ok(Some(Breakers {
            layer: BreakerLayer::new().with_store(store.clone()),
            shared: Some((shared, config)),
            store: Some(store),
            _metrics: Some(metrics),
        }))
    }

    /// With a shared store, makes the circuit of every link of every route
    /// now, so this replica reads the fleet's state of each (an open
    /// elsewhere is followed, and listed by `GET /health/circuits`) before
    /// its own first call.
    pub(crate) fn register_circuits(&self, policy: &Policy) {
        let Some(store) = &self.store else {
            return;
        };
        for route in &policy.routes {
            let Ok(resolved) = policy.resolve(route) else {
                continue;
            };
            let keys = policy.breaker_key_fn(&resolved.chain);
            let probe = ChatRequest::new(route.model.as_str(), Vec::new());
            for link in &resolved.chain {
                let key: BreakerKey = keys.key(
                    &probe,
                    &Link::new(link.provider.as_str(), link.model.as_str()),
                );
                let _ = store.circuit(key);
            }
        }
    }
}

/// `llm_circuit_state` (0 closed, 1 open, 2 half-open) of the gateway's
/// current breaker store (it follows a store replaced by a reload).
pub(crate) fn circuit_gauge(
    meter: &opentelemetry::metrics::Meter,
    breakers: &Arc<Mutex<Breakers>>,
) -> opentelemetry::metrics::ObservableGauge<i64> {
    let breakers = Arc::downgrade(breakers);
    meter
        .i64_observable_gauge("llm_circuit_state")
        .with_description("Circuit breaker state: 0 closed, 1 open, 2 half-open")
        .with_callback(move |observer| {
            let Some(breakers) = breakers.upgrade() else {
                return;
            };
            let handle = lock(&breakers).layer.handle();
            for circuit in handle.snapshot() {
                let provider =
                    opentelemetry::KeyValue::new("provider", circuit.key.provider().to_owned());
                let model = opentelemetry::KeyValue::new("model", circuit.key.model().to_owned());
                match circuit.key.scope() {
                    Some(scope) => observer.observe(
                        circuit.state.as_gauge(),
                        &[
                            provider,
                            model,
                            opentelemetry::KeyValue::new("scope", scope.to_owned()),
                        ],
                    ),
                    None => observer.observe(circuit.state.as_gauge(), &[provider, model]),
                }
            }
        })
        .build()
}

/// What an idempotency layer was built from: kept across a reload while
/// both are unchanged.
pub(crate) type IdempotencyKey = (IdempotencyConfig, Option<SharedIdempotencyPolicy>);

/// The idempotency layer of `policy` (none without `[idempotency]`), on
/// Redis when `[idempotency_shared]` says so (built inside the runtime).
pub(crate) fn idempotency_of(
    config: &GatewayConfig,
    metrics: &Metrics,
) -> Result<Option<(IdempotencyKey, IdempotencyLayer<TenantHeader>)>, ConfigError> {
    let (policy, shared) = (&config.policy, &config.settings.idempotency_shared);
    let (Some(layer), Some(config)) = (
        policy.idempotency_layer(metrics.clone())?,
        policy.idempotency.clone(),
    ) else {
        return Ok(None);
    };
    let layer = match shared {
        None => layer,
        Some(shared) => {
            let mut builder = RedisIdempotencyStore::builder(&shared.redis)
                .map_err(|e| ConfigError::new(format!("idempotency_shared: {e}")))?;
            if let Some(prefix) = &shared.prefix {
                builder = builder.with_prefix(prefix.clone());
            }
            let store = builder
                .build()
                .map_err(|e| ConfigError::new(format!("idempotency_shared: {e}")))?;
            tracing::info!(
                target: "gateway",
                redis = %shared.redacted(),
                "idempotent answers are shared on Redis"
            );
            layer.with_store(Arc::new(store))
        }
    };
    Ok(Some(((config, shared.clone()), layer)))
}

/// What a response cache store was built from: kept across a reload
/// (with its answers) while unchanged.
pub(crate) type CacheKey = (tower_llm::cache::CacheStoreConfig, Option<SharedRedis>);

/// The running response cache store and what it was built from.
pub(crate) type RunningCache = (CacheKey, Arc<dyn CacheStore>);

/// The response cache store of `config` (none when no route caches): one
/// for every route, on Redis when `[cache_shared]` says so (built inside
/// the runtime), the running one while its settings are unchanged.
pub(crate) fn cache_of(
    config: &GatewayConfig,
    running: Option<&RunningCache>,
) -> Result<Option<RunningCache>, ConfigError> {
    let policy = &config.policy;
    let caches = policy
        .routes
        .iter()
        .any(|r| policy.resolve(r).is_ok_and(|r| r.cache.is_some()));
    if !caches {
        return Ok(None);
    }
    let key = (
        policy.cache.unwrap_or_default(),
        config.settings.cache_shared.clone(),
    );
    if let Some((k, store)) = running {
        if *k == key {
            return Ok(Some((key, store.clone())));
        }
    }
    let store: Arc<dyn CacheStore> = match &key.1 {
        None => Arc::new(key.0.memory()),
        Some(shared) => {
            let mut builder = RedisCache::builder(&shared.redis)
                .map_err(|e| ConfigError::new(format!("cache_shared: {e}")))?
                .with_local_max_bytes(usize::try_from(key.0.max_bytes).unwrap_or(usize::MAX));
            if let Some(prefix) = &shared.prefix {
                builder = builder.with_prefix(prefix.clone());
            }
            let store = builder
                .build()
                .map_err(|e| ConfigError::new(format!("cache_shared: {e}")))?;
            tracing::info!(
                target: "gateway",
                redis = %shared.redacted(),
                "cached answers are shared on Redis"
            );
            Arc::new(store)
        }
    };
    Ok(Some((key, store)))
}

/// What a quota store was built from: kept across a reload while
/// unchanged.
pub(crate) type QuotaKey = (QuotaConfig, Option<SharedQuotas>);

/// The `ai_router_quota_shared_store_up` gauge, and the dropped-settles
/// and late-reserves counters of a shared quota store, while it is the
/// gateway's.
pub(crate) type QuotaGauges = (
    (
        opentelemetry::metrics::ObservableGauge<u64>,
        opentelemetry::metrics::ObservableCounter<u64>,
    ),
    opentelemetry::metrics::ObservableCounter<u64>,
);

/// The running quota store.
pub(crate) type RunningQuota = (QuotaKey, Arc<dyn QuotaStore>, Option<Arc<QuotaGauges>>);

/// The tenant quota store of `[quotas]` (none without it), on Redis when
/// `[quotas_shared]` says so: the running one when both are unchanged,
/// else a new one (built inside the runtime).
pub(crate) fn quota_of(
    config: &GatewayConfig,
    meter: &opentelemetry::metrics::Meter,
    running: Option<&RunningQuota>,
) -> Result<Option<RunningQuota>, ConfigError> {
    let Some(quotas) = config.policy.quotas.clone() else {
        return Ok(None);
    };
    let want = (quotas.clone(), config.settings.quotas_shared.clone());
    if let Some((key, store, gauges)) = running {
        if *key == want {
            return Ok(Some((want, store.clone(), gauges.clone())));
        }
    }
    let Some(shared) = &want.1 else {
        let store: Arc<dyn QuotaStore> = Arc::new(MemoryQuota::new(quotas));
        return Ok(Some((want, store, None)));
    };
    let mut builder = RedisQuota::builder(&shared.redis, quotas)
        .map_err(|e| ConfigError::new(format!("quotas_shared.redis: {e}")))?;
    if let Some(prefix) = &shared.prefix {
        builder = builder.with_prefix(prefix.clone());
    }
    if let Some(share) = shared.local_share {
        builder = builder.with_local_share(share);
    }
    let store = builder
        .build()
        .map_err(|e| ConfigError::new(format!("quotas_shared: {e}")))?;
    tracing::info!(
        target: "gateway",
        redis = %shared.redacted(),
        "tenant quotas are counted on Redis"
    );
    let gauges = Arc::new((
        store.register_metrics(meter),
        store.register_late_metric(meter),
    ));
    let store: Arc<dyn QuotaStore> = Arc::new(store);
    Ok(Some((want, store, Some(gauges))))
}

/// The fleet's pacing store of `[pools_shared]` (none without it), the
/// settings it was built from and its `ai_router_pool_shared_store_up`
/// gauge: the running one while the settings are unchanged, else a new
/// one (built inside the runtime).
pub(crate) type RunningPacing = (
    SharedQuotas,
    Arc<RedisPacing>,
    Arc<opentelemetry::metrics::ObservableGauge<u64>>,
);

/// The pacing store `[pools_shared]` asks for.
pub(crate) fn pacing_of(
    config: &GatewayConfig,
    meter: &opentelemetry::metrics::Meter,
    running: Option<&RunningPacing>,
) -> Result<Option<RunningPacing>, ConfigError> {
    let Some(shared) = config.settings.pools_shared.clone() else {
        return Ok(None);
    };
    if let Some(running) = running {
        if running.0 == shared {
            return Ok(Some(running.clone()));
        }
    }
    let mut builder = RedisPacing::builder(&shared.redis)
        .map_err(|e| ConfigError::new(format!("pools_shared.redis: {e}")))?;
    if let Some(prefix) = &shared.prefix {
        builder = builder.with_prefix(prefix.clone());
    }
    if let Some(share) = shared.local_share {
        builder = builder.with_local_share(share);
    }
    let store = Arc::new(
        builder
            .build()
            .map_err(|e| ConfigError::new(format!("pools_shared: {e}")))?,
    );
    tracing::info!(
        target: "gateway",
        redis = %shared.redacted(),
        "pools' deployments are paced on Redis"
    );
    let gauge = Arc::new(store.register_metrics(meter));
    Ok(Some((shared, store, gauge)))
}
