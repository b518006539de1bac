//! [`RedisQuotaBuilder`]: the store's settings, and `build`, which
//! connects (lazily) and spawns the worker and the probe.

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::sync::{Notify, mpsc, watch};
use tower_llm_cost::{MemoryQuota, QuotaConfig};
use tower_llm_redis::LocalShare;
use tower_llm_redis::{RedisSettings, Shutdown};

use crate::error::RedisQuotaError;
use crate::inner::Inner;
use crate::local::local_config;
use crate::scripts::Scripts;
use crate::store::RedisQuota;
use crate::{probe, worker};

/// The longest a reserve waits for Redis, by default.
const DEFAULT_RESERVE_TIMEOUT: Duration = Duration::from_secs(2);

/// Settings of a [`RedisQuota`]: see [`RedisQuota::builder`].
pub struct RedisQuotaBuilder {
    redis: RedisSettings,
    config: QuotaConfig,
    share: f64,
    queue: usize,
    reserve_timeout: Duration,
}

impl fmt::Debug for RedisQuotaBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisQuotaBuilder")
            .field("redis", &self.redis)
            .field("config", &self.config)
            .field("local_share", &self.share)
            .field("queue", &self.queue)
            .field("reserve_timeout", &self.reserve_timeout)
            .finish()
    }
}

impl RedisQuotaBuilder {
    pub(crate) fn new(redis: RedisSettings, config: QuotaConfig) -> Self {
        RedisQuotaBuilder {
            redis,
            config,
            share: 1.0,
            queue: 65_536,
            reserve_timeout: DEFAULT_RESERVE_TIMEOUT,
        }
    }

    /// The prefix of every key (default `tower-llm:quota:`). Replicas
    /// share quotas when they share it.
    #[must_use]
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.redis = self.redis.with_prefix(prefix);
        self
    }

    /// How long Redis may take to answer a `PING` (and to connect)
    /// before it counts as down (default 250 ms). A reserve whose reply
    /// takes longer than this (from when it is sent) asks the probe
    /// whether Redis answers, and goes on waiting for its reply unless it
    /// does not: see the [crate docs](crate#when-redis-is-down).
    #[must_use]
    pub fn with_op_timeout(mut self, timeout: Duration) -> Self {
        self.redis = self.redis.with_op_timeout(timeout);
        self
    }

    /// The longest a reserve waits for Redis (default 2 s): a call never
    /// waits longer. A reply not come by then, with Redis answering
    /// `PING`, makes that one call count in-process at the local share
    /// (its late Redis hold is released), while the store stays shared
    /// ([`RedisQuota::late_reserves`]). Below the op timeout, a reserve
    /// stops waiting before the probe is asked.
    #[must_use]
    pub fn with_reserve_timeout(mut self, timeout: Duration) -> Self {
        self.reserve_timeout = timeout;
        self
    }

    /// The longest wait between checks that Redis is back (default 2 s;
    /// they start at 25 ms and double).
    #[must_use]
    pub fn with_max_backoff(mut self, max: Duration) -> Self {
        self.redis = self.redis.with_max_backoff(max);
        self
    }

    /// The share of every limit this replica enforces in-process while
    /// Redis is down: above 0, at most 1 (default 1: right for one
    /// replica). With N replicas, `1 / N` keeps the fleet within the
    /// limits while Redis is down ([`with_replicas`](Self::with_replicas)).
    /// [`build`](Self::build) refuses a share out of range.
    #[must_use]
    pub fn with_local_share(mut self, share: f64) -> Self {
        self.share = share;
        self
    }

    /// The local share for a fleet of `replicas`: `1 / replicas` (at
    /// least one replica).
    #[must_use]
    pub fn with_replicas(self, replicas: u32) -> Self {
        self.with_local_share(LocalShare::of_replicas(replicas).get())
    }

    /// The capacity of the queue of settles to Redis (default 65,536, at
    /// least 1). A settle arriving when it is full is dropped and
    /// counted ([`RedisQuota::dropped_settles`]): its hold counts until
    /// `hold_secs`, its spend is never counted.
    #[must_use]
    pub fn with_queue(mut self, queue: usize) -> Self {
        self.queue = queue.max(1);
        self
    }

    /// The connection of reserves and writes: connecting bounded by the op
    /// timeout, like every store's, but no response timeout of its own (a
    /// slow reply is not an error: each caller bounds its wait).
    fn commands_connection(&self) -> Result<ConnectionManager, RedisQuotaError> {
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.redis.op_timeout()))
            .set_response_timeout(None)
            .set_number_of_retries(1)
            .set_max_delay(self.redis.max_backoff());
        ConnectionManager::new_lazy_with_config(self.redis.client().clone(), config)
            .map_err(|_| RedisQuotaError::connection_manager())
    }

    /// Makes the store and spawns its worker and its probe.
    ///
    /// # Errors
    ///
    /// When the quota settings do not validate, the local share is not
    /// above 0 and at most 1, the builder runs outside a tokio runtime,
    /// or the connection manager cannot be made.
    pub fn build(self) -> Result<RedisQuota, RedisQuotaError> {
        self.config.validate().map_err(RedisQuotaError::quota)?;
        let share = LocalShare::new(self.share).map_err(|e| RedisQuotaError::share(e.0))?;
        let runtime = self.redis.runtime()?;
        let conn = self.commands_connection()?;
        // The probe's own connection: its PING never waits behind this
        // replica's commands.
        let probe_conn = self.redis.connection_manager()?;
        let (queue, rx) = mpsc::channel(self.queue);
        let random = RandomState::new();
        let base_id = random.hash_one((
            std::process::id(),
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default(),
        ));
        let inner = Arc::new(Inner {
            conn,
            scripts: Scripts::new(),
            local: MemoryQuota::new(local_config(&self.config, share)),
            redis: self.redis,
            reserve_timeout: self.reserve_timeout,
            config: self.config,
            share,
            up: watch::Sender::new(true),
            wake: Notify::new(),
            probe: Notify::new(),
            queue,
            dropped: AtomicU64::new(0),
            late: AtomicU64::new(0),
            unpushed: Mutex::new(HashMap::new()),
            lost_pushes: AtomicU64::new(0),
            base_id,
            seq: AtomicU64::new(0),
            runtime: runtime.clone(),
        });
        let shutdown = Shutdown::new();
        runtime.spawn(worker::run(inner.clone(), rx, shutdown.signal()));
        runtime.spawn(probe::run(inner.clone(), probe_conn, shutdown.signal()));
        Ok(RedisQuota {
            inner,
            _shutdown: shutdown,
        })
    }
}

#[cfg(test)]
mod tests {
    use tower_llm_core::Cost;
    use tower_llm_cost::Limits;

    use super::*;

    fn config(dollars: f64, tokens: u64) -> QuotaConfig {
        QuotaConfig::new(
            Duration::from_secs(60),
            Limits {
                max_cost: Cost::from_dollars(dollars),
                max_tokens: Some(tokens),
            },
        )
    }

    #[tokio::test]
    async fn debug_and_errors_never_show_the_password() {
        let store =
            RedisQuota::open("redis://:hunter2@127.0.0.1:1/0", config(1.0, 10)).expect("parses");
        let shown = format!("{store:?}");
        assert!(
            shown.contains("127.0.0.1:1") && !shown.contains("hunter2"),
            "{shown}"
        );
        let builder =
            RedisQuota::builder("redis://u:hunter2@127.0.0.1:1", config(1.0, 10)).expect("parses");
        assert!(!format!("{builder:?}").contains("hunter2"));
        let err = RedisQuota::builder("http://:hunter2@x", config(1.0, 10)).expect_err("not redis");
        assert!(err.is_invalid_url());
        assert!(!err.to_string().contains("hunter2"));
    }

    #[tokio::test]
    async fn a_share_out_of_range_or_a_bad_config_is_refused() {
        for share in [0.0, -0.5, 1.5, f64::NAN, f64::INFINITY] {
            let err = RedisQuota::builder("redis://127.0.0.1:1", config(1.0, 10))
                .expect("parses")
                .with_local_share(share)
                .build()
                .expect_err("refused");
            assert!(err.is_invalid_share(), "{share}: {err}");
        }
        let mut bad = config(1.0, 10);
        bad.window_secs = 0;
        let err = RedisQuota::open("redis://127.0.0.1:1", bad).expect_err("refused");
        assert!(err.is_invalid_quota(), "{err}");
        assert!(err.to_string().starts_with("redis quota store: "), "{err}");
    }

    #[test]
    fn outside_a_runtime_is_an_error() {
        let err = RedisQuota::open("redis://127.0.0.1:1", config(1.0, 10)).expect_err("no rt");
        assert!(err.is_no_runtime());
    }

    #[tokio::test]
    async fn metrics_register_and_the_store_starts_shared() {
        let store = RedisQuota::open("redis://127.0.0.1:1", config(1.0, 10)).expect("parses");
        let meter = opentelemetry::global::meter("test");
        let (_gauge, _counter) = store.register_metrics(&meter);
        assert!(store.is_shared(), "optimistic until a command fails");
        assert_eq!(store.dropped_settles(), 0);
        assert_eq!(store.late_reserves(), 0);
        let _late = store.register_late_metric(&meter);
        assert_eq!(store.reserve_timeout(), DEFAULT_RESERVE_TIMEOUT);
        assert!((store.local_share() - 1.0).abs() < f64::EPSILON);
        assert_eq!(store.local().config(), store.config());
    }
}
