//! The gateway's state: the running policy and its routes (swapped whole
//! on reload), the stores that outlive reloads, the metrics registry, the
//! bulkheads, the probes and the server-wide budgets.
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use arc_swap::ArcSwap;
use opentelemetry::metrics::MeterProvider as _;
use opentelemetry_sdk::metrics::SdkMeterProvider;
use tokio::sync::Semaphore;
use tower_llm::breaker::BreakerHandle;
use tower_llm::config::{ConfigError, HedgeBudgets, Policy, Pools, TenantHeader};
use tower_llm::idempotency::IdempotencyLayer;
use tower_llm::{GenAiMetrics, Metrics};

use crate::config::{GatewayConfig, ServerPolicy};
use crate::routes::{Bulkheads, FirstTokens, KeySource, Routes, build};
use crate::stores::{
    Breakers, IdempotencyKey, RunningCache, RunningPacing, RunningQuota, cache_of, circuit_gauge,
    idempotency_of, lock, pacing_of, quota_of,
};
use crate::transport::Transport;

/// The result of the last background probe of a provider.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Probe {
    /// `true` for a 2xx answer.
    pub ok: bool,
    /// The HTTP status, if an answer came.
    pub status: Option<u16>,
    /// Round-trip time.
    pub latency_ms: u64,
    /// The error, if no answer came.
    pub error: Option<String>,
}

/// The gateway: the routes of the running policy, the breaker store (one
/// for the gateway's life, so circuits survive reloads), the metrics, the
/// probes and the server-wide budgets.
///
/// Build it with [`Gateway::new`], serve [`Gateway::router`] with
/// [`serve`](crate::serve), reload with [`Gateway::reload`] or
/// [`reload_on_change`](crate::reload_on_change).
pub struct Gateway {
    pub(crate) routes: ArcSwap<Routes>,
    /// The breaker layer and its store: in memory, or shared on Redis
    /// (`[breaker_shared]`); replaced only when those settings change.
    pub(crate) breaker: Arc<Mutex<Breakers>>,
    /// The idempotency layer of `[idempotency]` and its settings; kept
    /// (with its stored answers) while they are unchanged.
    idempotency: Mutex<Option<(IdempotencyKey, IdempotencyLayer<TenantHeader>)>>,
    /// The routes' response cache store and what it was built from; kept
    /// (with its answers) while unchanged.
    cache: Mutex<Option<RunningCache>>,
    /// Each hedged link's budget, one for its unary and streaming stacks,
    /// carried across reloads while the link's hedge is unchanged.
    hedges: Mutex<HedgeBudgets>,
    /// The tenant quota store of `[quotas]` and what it was built from;
    /// kept across a reload while both are unchanged.
    quota: Mutex<Option<RunningQuota>>,
    pub(crate) metrics: Metrics,
    pub(crate) genai: GenAiMetrics,
    pub(crate) registry: prometheus::Registry,
    meter: opentelemetry::metrics::Meter,
    _meters: SdkMeterProvider,
    _gauges: [opentelemetry::metrics::ObservableGauge<i64>; 2],
    pub(crate) transport: Transport,
    pub(crate) keys: KeySource,
    pub(crate) probes: Arc<Mutex<HashMap<String, Probe>>>,
    /// The bearer token of the operator endpoints (none: read-only).
    pub(crate) admin_token: arc_swap::ArcSwapOption<crate::admin::AdminToken>,
    /// Each provider's bulkhead, kept across reloads while its limit is
    /// unchanged, so calls in flight keep counting.
    pub(crate) bulkheads: Bulkheads,
    /// Each provider's learned first-token limit (`silence`), kept across
    /// reloads while its settings are unchanged, so what it learned stays.
    pub(crate) first_tokens: FirstTokens,
    /// The providers' pacers (`[[pools]]`), kept across reloads while a
    /// provider's limits are unchanged.
    pub(crate) pacers: Pools,
    /// The fleet's pacing store of `[pools_shared]`, kept across reloads
    /// while unchanged.
    pacing: Mutex<Option<RunningPacing>>,
    /// The server limits the gateway started with (`[server]`; a reload
    /// keeps them).
    pub(crate) server: ServerPolicy,
    /// Chat calls in flight (`server.max_in_flight`).
    pub(crate) in_flight: Arc<Semaphore>,
    /// Bytes of request bodies held (`server.max_body_bytes_in_flight`).
    pub(crate) body_bytes: Arc<Semaphore>,
    /// Per-link counts of the last 15 minutes, for `GET /status`.
    pub(crate) status: crate::status::StatusBoard,
    /// Why the last reload from the policy file failed (cleared by one
    /// that succeeds), for `GET /status`.
    pub(crate) reload_error: arc_swap::ArcSwapOption<String>,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Routes and keys stay out: a key must never reach a log.
        f.debug_struct("Gateway")
            .field(
                "routes",
                &self.routes.load().unary.keys().collect::<Vec<_>>(),
            )
            .field("server", &self.server)
            .finish_non_exhaustive()
    }
}

impl Gateway {
    /// A gateway serving `policy` over `transport`. With
    /// `[breaker_shared]`, call it inside a tokio runtime (the Redis store
    /// spawns its tasks); a Redis that does not answer is not an error
    /// (circuits are local until it does).
    ///
    /// # Errors
    ///
    /// A provider that cannot be built (a missing key); with
    /// `[breaker_shared]`, no tokio runtime or a URL that does not parse.
    pub fn new(
        config: impl Into<GatewayConfig>,
        transport: impl Into<Transport>,
        keys: KeySource,
    ) -> Result<Arc<Self>, ConfigError> {
        let transport = transport.into();
        let config = config.into();
        config.validate()?;
        let GatewayConfig { policy, settings } = &config;
        let registry = prometheus::Registry::new();
        let exporter = opentelemetry_prometheus::exporter()
            .with_registry(registry.clone())
            .build()
            .map_err(|e| ConfigError::new(format!("metrics exporter: {e}")))?;
        let meters = SdkMeterProvider::builder().with_reader(exporter).build();
        let meter = meters.meter("tower-llm");
        let breaker = Breakers::new(&config, &meter, None)?
            .ok_or_else(|| ConfigError::new("the breaker could not be built"))?;
        let breaker = Arc::new(Mutex::new(breaker));
        let circuits = circuit_gauge(&meter, &breaker);
        let probes: Arc<Mutex<HashMap<String, Probe>>> = Arc::default();
        let up = provider_up_gauge(&meter, probes.clone());
        let metrics = Metrics::new(&meter);
        let genai = GenAiMetrics::new(&meter);
        let bulkheads = Bulkheads::default();
        let first_tokens = FirstTokens::default();
        let pacers = Pools::new();
        let pacing = pacing_of(&config, &meter, None)?;
        pacers.share(
            pacing
                .as_ref()
                .map(|(_, s, _)| s.clone() as Arc<dyn tower_llm::pool::SharedPacing>),
        );
        let idempotency = idempotency_of(&config, &metrics)?;
        let layer = lock(&breaker).layer.clone();
        let hedges = HedgeBudgets::new();
        let quota = quota_of(&config, &meter, None)?;
        let cache = cache_of(&config, None)?;
        let routes = build(
            policy,
            settings,
            &layer,
            idempotency.as_ref().map(|(_, l)| l),
            &hedges,
            quota.as_ref().map(|(_, q, _)| q),
            &metrics,
            &genai,
            &transport,
            &keys,
            &bulkheads,
            &first_tokens,
            &pacers,
            cache.as_ref().map(|(_, c)| c),
        )?;
        lock(&breaker).register_circuits(policy);
        let server = settings.server;
        Ok(Arc::new(Gateway {
            routes: ArcSwap::from_pointee(routes),
            breaker,
            idempotency: Mutex::new(idempotency),
            cache: Mutex::new(cache),
            hedges: Mutex::new(hedges),
            quota: Mutex::new(quota),
            metrics,
            genai,
            registry,
            meter,
            _meters: meters,
            _gauges: [circuits, up],
            transport,
            keys,
            probes,
            admin_token: arc_swap::ArcSwapOption::empty(),
            bulkheads,
            first_tokens,
            pacers,
            pacing: Mutex::new(pacing),
            in_flight: Arc::new(Semaphore::new(server.max_in_flight)),
            body_bytes: Arc::new(Semaphore::new(server.max_body_bytes_in_flight)),
            server,
            status: crate::status::StatusBoard::default(),
            reload_error: arc_swap::ArcSwapOption::empty(),
        }))
    }

    /// Validates `policy` and swaps it in: calls in flight finish on the
    /// policy they started with; circuits of keys that still exist keep
    /// their state. On error the running policy stays.
    ///
    /// # Errors
    ///
    /// Why `policy` cannot be served.
    pub fn reload(&self, config: impl Into<GatewayConfig>) -> Result<(), ConfigError> {
        let config = config.into();
        config.validate()?;
        let GatewayConfig { policy, settings } = &config;
        if settings.server != self.server {
            tracing::warn!(
                target: "gateway",
                "the [server] section changed: its limits take effect at the next start"
            );
        }
        // A changed `[breaker_shared]` (or `[breaker]` under it) gets a new
        // store; otherwise the running one (and its circuits) stays.
        let breakers = {
            let running = lock(&self.breaker);
            Breakers::new(&config, &self.meter, Some(&running))?
        };
        let layer = match &breakers {
            Some(b) => b.layer.clone(),
            None => lock(&self.breaker).layer.clone(),
        };
        // Unchanged `[idempotency]` and `[idempotency_shared]` keep the
        // layer and its stored answers.
        let idempotency = {
            let running = lock(&self.idempotency);
            let want = policy
                .idempotency
                .clone()
                .map(|c| (c, settings.idempotency_shared.clone()));
            match (&*running, want) {
                (Some((key, layer)), Some(want)) if *key == want => Some((want, layer.clone())),
                _ => {
                    drop(running);
                    idempotency_of(&config, &self.metrics)?
                }
            }
        };
        let hedges = lock(&self.hedges).for_reload();
        // A changed `[pools_shared]` gets a new store (pacers are made
        // again); otherwise the running one stays.
        let pacing = {
            let running = lock(&self.pacing);
            pacing_of(&config, &self.meter, running.as_ref())?
        };
        let changed = {
            let running = lock(&self.pacing);
            running.as_ref().map(|(s, _, _)| s) != pacing.as_ref().map(|(s, _, _)| s)
        };
        if changed {
            self.pacers.share(
                pacing
                    .as_ref()
                    .map(|(_, s, _)| s.clone() as Arc<dyn tower_llm::pool::SharedPacing>),
            );
        }
        // Unchanged `[quotas]` (and its shared store) keep the store and
        // what it counted.
        let quota = {
            let running = lock(&self.quota);
            quota_of(&config, &self.meter, running.as_ref())?
        };
        // An unchanged `[cache]` keeps the store and its answers.
        let cache = {
            let running = lock(&self.cache);
            cache_of(&config, running.as_ref())?
        };
        let routes = build(
            policy,
            settings,
            &layer,
            idempotency.as_ref().map(|(_, l)| l),
            &hedges,
            quota.as_ref().map(|(_, q, _)| q),
            &self.metrics,
            &self.genai,
            &self.transport,
            &self.keys,
            &self.bulkheads,
            &self.first_tokens,
            &self.pacers,
            cache.as_ref().map(|(_, c)| c),
        )?;
        let mut running = lock(&self.breaker);
        if let Some(b) = breakers {
            *running = b;
        }
        running.register_circuits(policy);
        drop(running);
        *lock(&self.idempotency) = idempotency;
        *lock(&self.cache) = cache;
        *lock(&self.hedges) = hedges;
        *lock(&self.quota) = quota;
        *lock(&self.pacing) = pacing;
        self.routes.store(Arc::new(routes));
        Ok(())
    }

    /// Reads, validates and swaps in the policy file at `path`, as the
    /// reload watcher does: the outcome is logged, and a failure is shown
    /// on `GET /status` until a reload succeeds (the running policy stays).
    ///
    /// # Errors
    ///
    /// Why the file cannot be served (unreadable, invalid, refused).
    pub fn reload_from_file(&self, path: &std::path::Path) -> Result<(), String> {
        let result = std::fs::read_to_string(path)
            .map_err(|e| e.to_string())
            .and_then(|text| GatewayConfig::from_toml(&text).map_err(|e| e.to_string()))
            .and_then(|config| self.reload(config).map_err(|e| e.to_string()));
        match &result {
            Ok(()) => {
                self.reload_error.store(None);
                tracing::info!(target: "gateway", path = %path.display(), "policy reloaded");
            }
            Err(e) => {
                tracing::error!(target: "gateway", path = %path.display(), error = %e, "reload refused; the running policy stays");
                self.reload_error.store(Some(Arc::new(e.clone())));
            }
        }
        result
    }

    /// The policy being served.
    pub fn policy(&self) -> Policy {
        self.routes.load().policy.clone()
    }

    /// The whole configuration being served: the policy and the
    /// gateway's settings.
    pub fn config(&self) -> GatewayConfig {
        let routes = self.routes.load();
        GatewayConfig {
            policy: routes.policy.clone(),
            settings: routes.settings.clone(),
        }
    }

    /// The server limits the gateway started with.
    pub fn server_limits(&self) -> ServerPolicy {
        self.server
    }

    /// The breaker's handle (circuit snapshots, manual control).
    pub fn breaker(&self) -> BreakerHandle {
        lock(&self.breaker).layer.handle()
    }

    /// `true` when circuits are shared through Redis (`[breaker_shared]`)
    /// and Redis answers; `false` when local-only (not configured, or
    /// Redis down).
    pub fn breaker_shared_up(&self) -> bool {
        lock(&self.breaker)
            .store
            .as_ref()
            .is_some_and(|s| s.is_up())
    }
}

/// `provider_up`: 1 when the provider's last probe answered 2xx, 0
/// otherwise (only providers with a `health_url`, once probed).
fn provider_up_gauge(
    meter: &opentelemetry::metrics::Meter,
    probes: Arc<Mutex<HashMap<String, Probe>>>,
) -> opentelemetry::metrics::ObservableGauge<i64> {
    meter
        .i64_observable_gauge("provider_up")
        .with_description("1 when the provider's last health probe answered 2xx, else 0")
        .with_callback(move |observer| {
            let probes = probes.lock().unwrap_or_else(PoisonError::into_inner);
            for (name, probe) in probes.iter() {
                observer.observe(
                    i64::from(probe.ok),
                    &[opentelemetry::KeyValue::new("provider", name.clone())],
                );
            }
        })
        .build()
}
