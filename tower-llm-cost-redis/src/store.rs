//! The store: [`RedisQuota`], its accessors and metrics, and its
//! [`QuotaStore`] side (reserves in `reserve.rs`, the in-process share in
//! `local.rs`, settles run by the worker, liveness by the probe).

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use opentelemetry::metrics::{Meter, ObservableCounter, ObservableGauge};
use tower_llm_core::Tenant;
use tower_llm_cost::{Ask, MemoryQuota, QuotaConfig, QuotaHold, QuotaStore, Reserve};
use tower_llm_redis::{RedisSettings, Shutdown};

use crate::builder::RedisQuotaBuilder;
use crate::error::RedisQuotaError;
use crate::inner::{Inner, STORE};

/// What a tenant has spent and holds in one window, as Redis counts it
/// ([`RedisQuota::shared_usage`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Usage {
    /// The window (by the server's clock; [`QuotaConfig::window_at`]).
    pub window: u64,
    /// Spend settled in the window (and pushed after an outage).
    pub spent: Ask,
    /// What open holds hold.
    pub held: Ask,
}

/// A [`QuotaStore`] shared by every replica using the same Redis (and
/// prefix): see the [crate docs](crate).
///
/// Made inside a tokio runtime (it spawns a worker that settles holds and
/// watches for Redis when it is down); the worker stops when the store
/// is dropped.
pub struct RedisQuota {
    pub(crate) inner: Arc<Inner>,
    /// Stops the worker and the probe when the store is dropped.
    pub(crate) _shutdown: Shutdown,
}

impl fmt::Debug for RedisQuota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The address only: never the URL (it may carry a password).
        f.debug_struct("RedisQuota")
            .field("redis", &self.inner.redis)
            .field("config", &self.inner.config)
            .field("reserve_timeout", &self.inner.reserve_timeout)
            .field("local_share", &self.inner.share.get())
            .field("shared", &self.is_shared())
            .finish_non_exhaustive()
    }
}

impl RedisQuota {
    /// A store of `config`'s quotas on the Redis at `url`
    /// (`redis://[:password@]host[:port][/db]`), with the default
    /// settings: keys under `tower-llm:quota:`, a 250 ms op timeout, a
    /// 2 s reserve timeout, a local share of 1 (see
    /// [`RedisQuotaBuilder::with_local_share`]).
    ///
    /// # Errors
    ///
    /// When the URL does not parse, `config` does not validate, or there
    /// is no tokio runtime. A server that does not answer is not an
    /// error: the first command (or `PING`) finds out, and the store
    /// counts in-process until it answers.
    pub fn open(url: &str, config: QuotaConfig) -> Result<Self, RedisQuotaError> {
        RedisQuota::builder(url, config)?.build()
    }

    /// A builder for a store of `config`'s quotas on the Redis at `url`.
    ///
    /// # Errors
    ///
    /// When the URL does not parse.
    pub fn builder(url: &str, config: QuotaConfig) -> Result<RedisQuotaBuilder, RedisQuotaError> {
        let redis = RedisSettings::new(STORE, url, "tower-llm:quota:")?;
        Ok(RedisQuota::with_settings(redis, config))
    }

    /// A builder for a store of `config`'s quotas with Redis `settings`
    /// made by the caller (their prefix, op timeout and backoff are
    /// kept).
    pub fn with_settings(settings: RedisSettings, config: QuotaConfig) -> RedisQuotaBuilder {
        RedisQuotaBuilder::new(settings, config)
    }

    /// `true` while Redis answers: quotas are shared and exact across
    /// replicas (a reserve past the reserve timeout aside). `false`: this
    /// replica enforces its share of them in-process until Redis answers
    /// again.
    pub fn is_shared(&self) -> bool {
        self.inner.is_up()
    }

    /// The quota settings.
    pub fn config(&self) -> &QuotaConfig {
        &self.inner.config
    }

    /// This replica's share of every limit while Redis is down.
    pub fn local_share(&self) -> f64 {
        self.inner.share.get()
    }

    /// The in-process store used while Redis is down (its limits are the
    /// config's × the local share).
    pub fn local(&self) -> &MemoryQuota {
        &self.inner.local
    }

    /// Settles dropped because the queue to Redis was full.
    pub fn dropped_settles(&self) -> u64 {
        self.inner.dropped.load(Ordering::Relaxed)
    }

    /// The longest a reserve waits for Redis
    /// ([`RedisQuotaBuilder::with_reserve_timeout`]).
    pub fn reserve_timeout(&self) -> Duration {
        self.inner.reserve_timeout
    }

    /// Reserves that got no reply within the reserve timeout while Redis
    /// was not declared down: each was counted in-process at the local
    /// share, alone (the store stayed shared). Logged at 1, 2, 4, 8, …
    pub fn late_reserves(&self) -> u64 {
        self.inner.late.load(Ordering::Relaxed)
    }

    /// What `tenant` has spent and holds in the current window, as Redis
    /// counts it (expired holds purged first); `None` when Redis does not
    /// answer within the op timeout. A tenant counted with the others
    /// past `max_tenants` has nothing of its own: read
    /// `Tenant::new(OVERFLOW_TENANT)`'s. For operators and tests: the
    /// request path never needs it.
    pub async fn shared_usage(&self, tenant: &Tenant) -> Option<Usage> {
        self.inner.usage(tenant).await
    }

    /// Registers the `ai_router_quota_shared_store_up` gauge (1 shared, 0
    /// in-process shares) and the `ai_router_quota_shared_store_dropped`
    /// counter (settles dropped, queue full) on `meter`, labelled with
    /// the prefix. Keep the returned instruments for as long as they
    /// should report.
    pub fn register_metrics(
        &self,
        meter: &Meter,
    ) -> (ObservableGauge<u64>, ObservableCounter<u64>) {
        let prefix = opentelemetry::KeyValue::new("prefix", self.inner.redis.prefix().to_owned());
        let inner = Arc::downgrade(&self.inner);
        let labels = [prefix.clone()];
        let gauge = meter
            .u64_observable_gauge("ai_router_quota_shared_store_up")
            .with_description(
                "1 while tenant quotas are shared through Redis, 0 while each replica enforces its share",
            )
            .with_callback(move |o| {
                if let Some(inner) = inner.upgrade() {
                    o.observe(u64::from(inner.is_up()), &labels);
                }
            })
            .build();
        let inner = Arc::downgrade(&self.inner);
        let labels = [prefix];
        let counter = meter
            .u64_observable_counter("ai_router_quota_shared_store_dropped")
            .with_description("Quota settles dropped because the queue to Redis was full")
            .with_callback(move |o| {
                if let Some(inner) = inner.upgrade() {
                    o.observe(inner.dropped.load(Ordering::Relaxed), &labels);
                }
            })
            .build();
        (gauge, counter)
    }

    /// Registers the `ai_router_quota_shared_store_late` counter
    /// ([`late_reserves`](Self::late_reserves): reserves counted
    /// in-process because Redis, alive, did not reply within the reserve
    /// timeout) on `meter`, labelled with the prefix. Keep the returned
    /// instrument for as long as it should report.
    pub fn register_late_metric(&self, meter: &Meter) -> ObservableCounter<u64> {
        let labels = [opentelemetry::KeyValue::new(
            "prefix",
            self.inner.redis.prefix().to_owned(),
        )];
        let inner = Arc::downgrade(&self.inner);
        meter
            .u64_observable_counter("ai_router_quota_shared_store_late")
            .with_description(
                "Quota reserves counted in-process because Redis, alive, did not reply within the reserve timeout",
            )
            .with_callback(move |o| {
                if let Some(inner) = inner.upgrade() {
                    o.observe(inner.late.load(Ordering::Relaxed), &labels);
                }
            })
            .build()
    }
}

impl QuotaStore for RedisQuota {
    /// One script on the server (the reserve timeout at most; as soon as
    /// Redis is declared down, in-process); while Redis is down,
    /// in-process at once.
    fn reserve(&self, tenant: &Tenant, ask: Ask) -> Reserve {
        if !self.inner.is_up() {
            let held = self.inner.local_reserve(tenant, ask);
            return Box::pin(std::future::ready(held));
        }
        Box::pin(self.inner.clone().reserve(tenant.clone(), ask))
    }

    /// Queued for the worker (never waits): see the crate docs for what a
    /// full queue loses.
    fn settle(&self, hold: QuotaHold, spent: Ask) {
        self.inner.settle(&hold, spent);
    }
}
