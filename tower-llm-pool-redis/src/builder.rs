//! [`RedisPacingBuilder`]: the store's settings, and `build`, which
//! connects (lazily) and spawns the liveness task.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tower_llm_redis::LocalShare;
use tower_llm_redis::{RedisSettings, Shutdown};

use crate::error::RedisPacingError;
use crate::inner::Inner;
use crate::liveness;
use crate::scripts::Scripts;
use crate::store::RedisPacing;

/// Settings of a [`RedisPacing`]: see [`RedisPacing::builder`].
#[derive(Debug)]
pub struct RedisPacingBuilder {
    redis: RedisSettings,
    share: f64,
}

impl RedisPacingBuilder {
    pub(crate) fn new(redis: RedisSettings) -> Self {
        RedisPacingBuilder { redis, share: 1.0 }
    }

    /// The prefix of every key (default `tower-llm:pace:`). Replicas
    /// share a deployment's buckets when they share it (and the
    /// deployment's name).
    #[must_use]
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.redis = self.redis.with_prefix(prefix);
        self
    }

    /// The longest a take waits for Redis, and a `PING` for its `PONG`
    /// (default 250 ms): a take never waits longer (it is then paced at
    /// the local share), and Redis counts as down when it does not answer
    /// a `PING` in that time. See the [crate docs](crate#when-redis-is-down).
    #[must_use]
    pub fn with_op_timeout(mut self, timeout: Duration) -> Self {
        self.redis = self.redis.with_op_timeout(timeout);
        self
    }

    /// The longest wait between checks that Redis is back (default 2 s;
    /// they start at 25 ms and double).
    #[must_use]
    pub fn with_max_backoff(mut self, max: Duration) -> Self {
        self.redis = self.redis.with_max_backoff(max);
        self
    }

    /// The share of every deployment's limits this replica paces at
    /// in-process while Redis is down: above 0, at most 1 (default 1:
    /// right for one replica). With N replicas, `1 / N` keeps the fleet
    /// within the limits while Redis is down
    /// ([`with_replicas`](Self::with_replicas)). [`build`](Self::build)
    /// refuses a share out of range.
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

    /// Makes the store and spawns its liveness task (stopped when the
    /// store is dropped). Nothing is sent to Redis yet.
    ///
    /// # Errors
    ///
    /// When the local share is not above 0 and at most 1, the builder
    /// runs outside a tokio runtime, or a connection manager cannot be
    /// made.
    pub fn build(self) -> Result<RedisPacing, RedisPacingError> {
        let share = LocalShare::new(self.share).map_err(|e| RedisPacingError::share(e.0))?;
        let runtime = self.redis.runtime()?;
        let conn = self.redis.connection_manager()?;
        // The liveness task's own connection: its PING never waits behind
        // this replica's takes.
        let probe_conn = self.redis.connection_manager()?;
        let inner = Arc::new(Inner {
            conn,
            scripts: Scripts::new(),
            redis: self.redis,
            share,
            local: Mutex::new(HashMap::new()),
            up: watch::Sender::new(true),
            probe: Notify::new(),
            late: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            giving_back: AtomicUsize::new(0),
            dropped: AtomicU64::new(0),
            runtime: runtime.clone(),
        });
        let shutdown = Shutdown::new();
        runtime.spawn(liveness::run(inner.clone(), probe_conn, shutdown.signal()));
        Ok(RedisPacing {
            inner,
            _shutdown: shutdown,
        })
    }
}
