//! The gateway's state: the running policy and its routes (swapped whole
//! on reload), the breaker store that outlives reloads, the metrics
//! registry, the bulkheads and the server-wide budgets; and the file
//! watcher that reloads the policy.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use opentelemetry::metrics::MeterProvider as _;
use opentelemetry_sdk::metrics::SdkMeterProvider;
use tokio::sync::Semaphore;
use tower_llm::breaker::KeyFn as _;
use tower_llm::breaker::{BreakerConfig, BreakerHandle, BreakerKey, BreakerLayer, BreakerStore};
use tower_llm::config::{
    ConfigError, HedgeBudgets, Policy, ProviderConfig, RouteService, ServerPolicy,
    SharedBreakerPolicy, SharedIdempotencyPolicy, TenantHeader,
};
use tower_llm::idempotency::{IdempotencyConfig, IdempotencyLayer};
use tower_llm::{ChatRequest, ChatResponse, ChatStream, GenAiMetrics, Link, Metrics};
use tower_llm_breaker_redis::RedisBreakerStore;
use tower_llm_idempotency_redis::RedisIdempotencyStore;

use crate::health::Probe;
use crate::routes::{Bulkheads, build};

/// How a provider's API key is found (the environment, or a fixed key for
/// the embedded mock providers).
pub type KeySource = Arc<
    dyn Fn(&ProviderConfig) -> Result<Option<tower_llm::providers::ApiKey>, ConfigError>
        + Send
        + Sync,
>;

pub use crate::transport::Transport;

/// The routes of one policy: swapped whole on reload.
pub(crate) struct Routes {
    /// The policy they were built from.
    pub(crate) policy: Policy,
    pub(crate) unary: HashMap<String, RouteService<ChatResponse>>,
    pub(crate) stream: HashMap<String, RouteService<ChatStream>>,
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
}

/// The gateway: the routes of the running policy, the breaker store (one
/// for the gateway's life, so circuits survive reloads), the metrics, the
/// probes and the server-wide budgets.
///
/// Build it with [`Gateway::new`], serve [`Gateway::router`] with
/// [`serve`](crate::serve), reload with [`Gateway::reload`] or
/// [`reload_on_change`].
pub struct Gateway {
    pub(crate) routes: ArcSwap<Routes>,
    /// The breaker layer and its store: in memory, or shared on Redis
    /// (`[breaker_shared]`); replaced only when those settings change.
    pub(crate) breaker: Arc<Mutex<Breakers>>,
    /// The idempotency layer of `[idempotency]` and its settings; kept
    /// (with its stored answers) while they are unchanged.
    idempotency: Mutex<Option<(IdempotencyKey, IdempotencyLayer<TenantHeader>)>>,
    /// Each hedged link's budget, one for its unary and streaming stacks,
    /// carried across reloads while the link's hedge is unchanged.
    hedges: Mutex<HedgeBudgets>,
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
        policy: Policy,
        transport: impl Into<Transport>,
        keys: KeySource,
    ) -> Result<Arc<Self>, ConfigError> {
        let transport = transport.into();
        policy.validate()?;
        let registry = prometheus::Registry::new();
        let exporter = opentelemetry_prometheus::exporter()
            .with_registry(registry.clone())
            .build()
            .map_err(|e| ConfigError::new(format!("metrics exporter: {e}")))?;
        let meters = SdkMeterProvider::builder().with_reader(exporter).build();
        let meter = meters.meter("tower-llm");
        let breaker = Breakers::new(&policy, &meter, None)?
            .ok_or_else(|| ConfigError::new("the breaker could not be built"))?;
        let breaker = Arc::new(Mutex::new(breaker));
        let circuits = circuit_gauge(&meter, &breaker);
        let probes: Arc<Mutex<HashMap<String, Probe>>> = Arc::default();
        let up = provider_up_gauge(&meter, probes.clone());
        let metrics = Metrics::new(&meter);
        let genai = GenAiMetrics::new(&meter);
        let bulkheads = Bulkheads::default();
        let idempotency = idempotency_of(&policy, &metrics)?;
        let layer = lock(&breaker).layer.clone();
        let hedges = HedgeBudgets::new();
        let routes = build(
            &policy,
            &layer,
            idempotency.as_ref().map(|(_, l)| l),
            &hedges,
            &metrics,
            &genai,
            &transport,
            &keys,
            &bulkheads,
        )?;
        lock(&breaker).register_circuits(&policy);
        let server = routes.policy.server;
        Ok(Arc::new(Gateway {
            routes: ArcSwap::from_pointee(routes),
            breaker,
            idempotency: Mutex::new(idempotency),
            hedges: Mutex::new(hedges),
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
    pub fn reload(&self, policy: Policy) -> Result<(), ConfigError> {
        policy.validate()?;
        if policy.server != self.server {
            tracing::warn!(
                target: "gateway",
                "the [server] section changed: its limits take effect at the next start"
            );
        }
        // A changed `[breaker_shared]` (or `[breaker]` under it) gets a new
        // store; otherwise the running one (and its circuits) stays.
        let breakers = {
            let running = lock(&self.breaker);
            Breakers::new(&policy, &self.meter, Some(&running))?
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
                .map(|c| (c, policy.idempotency_shared.clone()));
            match (&*running, want) {
                (Some((key, layer)), Some(want)) if *key == want => Some((want, layer.clone())),
                _ => {
                    drop(running);
                    idempotency_of(&policy, &self.metrics)?
                }
            }
        };
        let hedges = lock(&self.hedges).for_reload();
        let routes = build(
            &policy,
            &layer,
            idempotency.as_ref().map(|(_, l)| l),
            &hedges,
            &self.metrics,
            &self.genai,
            &self.transport,
            &self.keys,
            &self.bulkheads,
        )?;
        let mut running = lock(&self.breaker);
        if let Some(b) = breakers {
            *running = b;
        }
        running.register_circuits(&policy);
        drop(running);
        *lock(&self.idempotency) = idempotency;
        *lock(&self.hedges) = hedges;
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
            .and_then(|text| Policy::from_toml(&text).map_err(|e| e.to_string()))
            .and_then(|policy| self.reload(policy).map_err(|e| e.to_string()));
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

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The gateway's breaker layer and its store.
pub(crate) struct Breakers {
    /// The layer every route's links are built with (its store shared).
    pub(crate) layer: BreakerLayer,
    /// The shared settings it was built with (none: in memory).
    shared: Option<(SharedBreakerPolicy, BreakerConfig)>,
    /// The Redis store, when shared.
    store: Option<Arc<RedisBreakerStore>>,
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
    fn new(
        policy: &Policy,
        meter: &opentelemetry::metrics::Meter,
        running: Option<&Breakers>,
    ) -> Result<Option<Breakers>, ConfigError> {
        let want = policy
            .breaker_shared
            .clone()
            .map(|shared| (shared, policy.breaker));
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
    fn register_circuits(&self, policy: &Policy) {
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
fn circuit_gauge(
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
type IdempotencyKey = (IdempotencyConfig, Option<SharedIdempotencyPolicy>);

/// The idempotency layer of `policy` (none without `[idempotency]`), on
/// Redis when `[idempotency_shared]` says so (built inside the runtime).
fn idempotency_of(
    policy: &Policy,
    metrics: &Metrics,
) -> Result<Option<(IdempotencyKey, IdempotencyLayer<TenantHeader>)>, ConfigError> {
    let (Some(layer), Some(config)) = (
        policy.idempotency_layer(metrics.clone())?,
        policy.idempotency.clone(),
    ) else {
        return Ok(None);
    };
    let layer = match &policy.idempotency_shared {
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
    Ok(Some(((config, policy.idempotency_shared.clone()), layer)))
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

/// What the reload watcher compares: a file's modification time and size.
type Seen = Option<(SystemTime, u64)>;

fn seen(path: &std::path::Path) -> Seen {
    std::fs::metadata(path)
        .ok()
        .and_then(|m| Some((m.modified().ok()?, m.len())))
}

/// Reloads the policy on SIGHUP and when the file changes (checked every
/// second). A changed file is read once it has stayed unchanged for
/// `server.reload_settle_ms` (so a writer that truncates and then rewrites
/// is never caught half-way); a file that does not parse or validate (an
/// empty one, one without routes) is logged and refused, and the running
/// policy stays. Calls in flight are never dropped: each keeps the routes
/// it started with.
pub async fn reload_on_change(gateway: Arc<Gateway>, path: std::path::PathBuf) {
    let settle = gateway.server.reload_settle();
    let mut last = seen(&path);
    #[cfg(unix)]
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        #[cfg(unix)]
        let signalled = async {
            match hup.as_mut() {
                Some(h) => h.recv().await.is_some(),
                None => std::future::pending().await,
            }
        };
        #[cfg(not(unix))]
        let signalled = std::future::pending::<bool>();
        let forced = tokio::select! {
            _ = tick.tick() => false,
            s = signalled => s,
        };
        let mut now = seen(&path);
        if !forced && now == last {
            continue;
        }
        // Wait for the writer to finish: unchanged for a whole settle time.
        loop {
            tokio::time::sleep(settle).await;
            let again = seen(&path);
            if again == now {
                break;
            }
            now = again;
        }
        last = now;
        // Logged and shown on `GET /status` by `reload_from_file`.
        let _ = gateway.reload_from_file(&path);
    }
}
