//! The store: local circuits (a [`MemoryStore`]) mirrored to Redis.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use opentelemetry::metrics::{Meter, ObservableCounter, ObservableGauge};
use tokio::sync::mpsc;
use tower_llm_breaker::{
    BreakerConfig, BreakerKey, BreakerStore, Circuit, KeyView, MemoryStore, Observer, Transition,
};
use tower_llm_redis::{RedisSettings, Shutdown};

use crate::entry::{Entry, Events};
use crate::inner::{Inner, Registry};
use crate::link::{Link, Op, Settings};
use crate::worker;

/// Why a [`RedisBreakerStore`] could not be made: its URL does not
/// parse, or there is no tokio runtime (the shared Redis plumbing's
/// [`Error`](tower_llm_redis::Error), with its `is_*()` predicates).
pub type RedisBreakerStoreError = tower_llm_redis::Error;

/// The store's name in errors.
const STORE: &str = "redis breaker store";

/// A [`BreakerStore`] whose circuits are shared by every replica using
/// the same Redis (and prefix): see the [crate docs](crate).
///
/// Each replica keeps its circuits locally (a [`MemoryStore`]) and the
/// request path reads only those; two background tasks write outcomes to
/// Redis and adopt what other replicas decide. Made inside a tokio
/// runtime (it spawns them); they stop when the store is dropped.
pub struct RedisBreakerStore {
    inner: Arc<Inner>,
    link: Arc<Link>,
    /// Stops the two tasks when the store is dropped.
    _shutdown: Shutdown,
}

impl fmt::Debug for RedisBreakerStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The address only: never the URL (it may carry a password).
        f.debug_struct("RedisBreakerStore")
            .field("redis", &self.link.settings.redis)
            .field("up", &self.is_up())
            .field("local", &self.inner.local)
            .finish_non_exhaustive()
    }
}

impl RedisBreakerStore {
    /// A store on the Redis at `url` (`redis://[:password@]host[:port][/db]`)
    /// with the default settings and the breaker's `config`, which must be
    /// the one the layers using the store have (it sets the shared
    /// threshold, window, cooldown and probe count).
    ///
    /// # Errors
    ///
    /// When the URL does not parse, or there is no tokio runtime. A server
    /// that does not answer is not an error: the store starts local-only
    /// and connects in the background.
    pub fn open(url: &str, config: BreakerConfig) -> Result<Self, RedisBreakerStoreError> {
        RedisBreakerStore::builder(url)?
            .with_breaker_config(config)
            .build()
    }

    /// A builder for a store on the Redis at `url`.
    ///
    /// # Errors
    ///
    /// When the URL does not parse.
    pub fn builder(url: &str) -> Result<RedisBreakerStoreBuilder, RedisBreakerStoreError> {
        Ok(RedisBreakerStoreBuilder {
            redis: RedisSettings::new(STORE, url, "tower-llm:breaker:")?,
            breaker: BreakerConfig::default(),
            max_keys: 10_000,
            queue: 4096,
            resync_every: Duration::from_secs(1),
            key_ttl: Duration::from_secs(3600),
            observer: None,
        })
    }

    /// `true` while Redis answers and the subscription is live: circuits
    /// are shared. `false`: each replica breaks on its own.
    pub fn is_up(&self) -> bool {
        self.link.is_up()
    }

    /// Outcome reports dropped because the queue to Redis was full.
    pub fn dropped_reports(&self) -> u64 {
        self.link.dropped.load(Ordering::Relaxed)
    }

    /// Registers the `llm_breaker_shared_store_up` gauge (1 shared, 0
    /// local-only) and the `llm_breaker_shared_store_dropped` counter
    /// (reports dropped, queue full) on `meter`, labelled with the prefix.
    /// Keep the returned instruments for as long as they should report.
    pub fn register_metrics(
        &self,
        meter: &Meter,
    ) -> (ObservableGauge<i64>, ObservableCounter<u64>) {
        let prefix =
            opentelemetry::KeyValue::new("prefix", self.link.settings.redis.prefix().to_owned());
        let link = Arc::downgrade(&self.link);
        let labels = [prefix.clone()];
        let gauge = meter
            .i64_observable_gauge("llm_breaker_shared_store_up")
            .with_description("1 while circuits are shared through Redis, 0 while local-only")
            .with_callback(move |o| {
                if let Some(link) = link.upgrade() {
                    o.observe(i64::from(link.is_up()), &labels);
                }
            })
            .build();
        let link = Arc::downgrade(&self.link);
        let labels = [prefix];
        let counter = meter
            .u64_observable_counter("llm_breaker_shared_store_dropped")
            .with_description("Outcome reports dropped because the queue to Redis was full")
            .with_callback(move |o| {
                if let Some(link) = link.upgrade() {
                    o.observe(link.dropped.load(Ordering::Relaxed), &labels);
                }
            })
            .build();
        (gauge, counter)
    }
}

impl BreakerStore for RedisBreakerStore {
    fn circuit(&self, key: BreakerKey) -> Arc<Circuit> {
        self.inner.local.circuit(key)
    }

    fn circuit_for(&self, key: KeyView<'_>) -> Arc<Circuit> {
        self.inner.local.circuit_for(key)
    }

    fn find(&self, key: &BreakerKey) -> Option<Arc<Circuit>> {
        self.inner.local.find(key)
    }

    fn circuits(&self) -> Vec<Arc<Circuit>> {
        self.inner.local.circuits()
    }

    /// As the [`MemoryStore`] it keeps its circuits in.
    fn circuits_are_stable(&self) -> bool {
        self.inner.local.circuits_are_stable()
    }
}

/// Settings of a [`RedisBreakerStore`]: see [`RedisBreakerStore::builder`].
pub struct RedisBreakerStoreBuilder {
    redis: RedisSettings,
    breaker: BreakerConfig,
    max_keys: usize,
    queue: usize,
    resync_every: Duration,
    key_ttl: Duration,
    observer: Option<Observer>,
}

impl fmt::Debug for RedisBreakerStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBreakerStoreBuilder")
            .field("redis", &self.redis)
            .finish_non_exhaustive()
    }
}

impl RedisBreakerStoreBuilder {
    /// The breaker settings the layers using this store have (default
    /// [`BreakerConfig::default`]): the shared threshold, ratio window,
    /// cooldown and probe count come from it.
    #[must_use]
    pub fn with_breaker_config(mut self, config: BreakerConfig) -> Self {
        self.breaker = config;
        self
    }

    /// The prefix of every key and of the channel (default
    /// `tower-llm:breaker:`). Replicas share circuits when they share it.
    #[must_use]
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.redis = self.redis.with_prefix(prefix);
        self
    }

    /// At most this many local circuits (default 10,000; see
    /// [`MemoryStore::new`]).
    #[must_use]
    pub fn with_max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys;
        self
    }

    /// The capacity of the queue of reports to Redis (default 4,096, at
    /// least 1): when full, a report is dropped and counted, never waited
    /// for.
    #[must_use]
    pub fn with_queue(mut self, queue: usize) -> Self {
        self.queue = queue.max(1);
        self
    }

    /// How long one Redis command may take before Redis counts as down
    /// (default 250 ms).
    #[must_use]
    pub fn with_op_timeout(mut self, timeout: Duration) -> Self {
        self.redis = self.redis.with_op_timeout(timeout);
        self
    }

    /// How often every circuit is read back from Redis, the safety net
    /// under pub/sub (default 1 s).
    #[must_use]
    pub fn with_resync_every(mut self, every: Duration) -> Self {
        self.resync_every = every.max(Duration::from_millis(10));
        self
    }

    /// How long a key outlives its last change (default 1 h; an open
    /// circuit's key, its cooldown plus this). A forgotten key reads closed.
    #[must_use]
    pub fn with_key_ttl(mut self, ttl: Duration) -> Self {
        self.key_ttl = ttl.max(Duration::from_secs(1));
        self
    }

    /// The longest wait between reconnection attempts (default 2 s; they
    /// start at 25 ms and double).
    #[must_use]
    pub fn with_max_backoff(mut self, max: Duration) -> Self {
        self.redis = self.redis.with_max_backoff(max);
        self
    }

    /// Calls `observer` on every state change this replica adopts from
    /// another one (an open, a close, an isolation decided elsewhere), from
    /// a background task. Changes decided here go to the layer's
    /// [`on_transition`](tower_llm_breaker::BreakerLayer::on_transition)
    /// as before; pass the same callback to both to see every change.
    #[must_use]
    pub fn on_adopted(mut self, observer: impl Fn(&Transition) + Send + Sync + 'static) -> Self {
        self.observer = Some(Arc::new(observer));
        self
    }

    /// Makes the store and spawns its two background tasks.
    ///
    /// # Errors
    ///
    /// When called outside a tokio runtime, or the connection manager
    /// cannot be made.
    pub fn build(self) -> Result<RedisBreakerStore, RedisBreakerStoreError> {
        let runtime = self.redis.runtime()?;
        let conn = self.redis.connection_manager()?;
        let (tx, rx) = mpsc::channel(self.queue);
        let replica = format!(
            "{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default()
        );
        let settings = Settings {
            channel: self.redis.key("events"),
            redis: self.redis,
            breaker: self.breaker,
            resync_every: self.resync_every,
            key_ttl: self.key_ttl,
            replica,
        };
        let link = Arc::new(Link::new(settings));
        let registry = Arc::new(Registry::default());
        let local = {
            let link = link.clone();
            let registry = registry.clone();
            MemoryStore::new(self.max_keys).with_circuits(move |key| {
                let entry = Arc::new(Entry::new(key.clone(), link.clone(), tx.clone()));
                registry.insert(&entry);
                // Learn the shared state of a key seen for the first time.
                entry.send(Op::Sync);
                Circuit::with_events(key, Arc::new(Events(entry)))
            })
        };
        let inner = Arc::new(Inner::new(local, link.clone(), registry, self.observer));
        let shutdown = Shutdown::new();
        let (resync_tx, resync_rx) = mpsc::channel(1);
        runtime.spawn(worker::writer(
            Arc::downgrade(&inner),
            link.clone(),
            conn,
            rx,
            shutdown.signal(),
            resync_rx,
        ));
        runtime.spawn(tower_llm_redis::listen(
            link.settings.redis.clone(),
            link.settings.channel.clone(),
            worker::Listener {
                inner: Arc::downgrade(&inner),
                link: link.clone(),
                resync: resync_tx,
            },
            shutdown.signal(),
        ));
        Ok(RedisBreakerStore {
            inner,
            link,
            _shutdown: shutdown,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(deprecated)]
    fn the_old_names_still_name_the_store() {
        let builder: fn(&str) -> Result<crate::RedisStoreBuilder, crate::RedisStoreError> =
            crate::RedisStore::builder;
        let err = builder("http://:hunter2@x").expect_err("not redis");
        assert!(err.is_invalid_url());
        assert_eq!(err.to_string(), "redis breaker store: invalid Redis URL");
    }

    #[test]
    fn the_builder_hides_the_password_and_needs_a_runtime() {
        let builder =
            RedisBreakerStore::builder("redis://user:hunter2@127.0.0.1:1").expect("parses");
        let shown = format!("{builder:?}");
        assert!(
            shown.contains("127.0.0.1:1") && !shown.contains("hunter2"),
            "{shown}"
        );
        assert!(builder.build().expect_err("no runtime").is_no_runtime());
    }
}
