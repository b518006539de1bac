//! The store: local circuits (a [`MemoryStore`]) mirrored to Redis.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use opentelemetry::metrics::{Meter, ObservableCounter, ObservableGauge};
use tokio::sync::{mpsc, watch};
use tower_llm_breaker::{
    BreakerConfig, BreakerKey, BreakerStore, Circuit, KeyView, MemoryStore, Observer, Transition,
};

use crate::entry::{Entry, Events};
use crate::inner::{Inner, Registry};
use crate::link::{Link, Op, Settings};
use crate::worker;

/// Why a [`RedisStore`] could not be made.
#[derive(Debug)]
pub struct RedisStoreError {
    message: String,
}

impl RedisStoreError {
    fn new(message: impl Into<String>) -> Self {
        RedisStoreError {
            message: message.into(),
        }
    }
}

impl fmt::Display for RedisStoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "redis breaker store: {}", self.message)
    }
}

impl std::error::Error for RedisStoreError {}

/// A [`BreakerStore`] whose circuits are shared by every replica using
/// the same Redis (and prefix): see the [crate docs](crate).
///
/// Each replica keeps its circuits locally (a [`MemoryStore`]) and the
/// request path reads only those; two background tasks write outcomes to
/// Redis and adopt what other replicas decide. Made inside a tokio
/// runtime (it spawns them); they stop when the store is dropped.
pub struct RedisStore {
    inner: Arc<Inner>,
    link: Arc<Link>,
    addr: String,
    shutdown: watch::Sender<bool>,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The address only: never the URL (it may carry a password).
        f.debug_struct("RedisStore")
            .field("addr", &self.addr)
            .field("prefix", &self.link.settings.prefix)
            .field("up", &self.is_up())
            .field("local", &self.inner.local)
            .finish_non_exhaustive()
    }
}

impl Drop for RedisStore {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
    }
}

impl RedisStore {
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
    pub fn open(url: &str, config: BreakerConfig) -> Result<Self, RedisStoreError> {
        RedisStore::builder(url)?
            .with_breaker_config(config)
            .build()
    }

    /// A builder for a store on the Redis at `url`.
    ///
    /// # Errors
    ///
    /// When the URL does not parse.
    pub fn builder(url: &str) -> Result<RedisStoreBuilder, RedisStoreError> {
        let client = redis::Client::open(url)
            // The error may quote the URL: do not pass it on.
            .map_err(|_| RedisStoreError::new("invalid Redis URL"))?;
        Ok(RedisStoreBuilder {
            client,
            prefix: "tower-llm:breaker:".to_owned(),
            breaker: BreakerConfig::default(),
            max_keys: 10_000,
            queue: 4096,
            op_timeout: Duration::from_millis(250),
            resync_every: Duration::from_secs(1),
            key_ttl: Duration::from_secs(3600),
            max_backoff: Duration::from_secs(2),
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
        let prefix = opentelemetry::KeyValue::new("prefix", self.link.settings.prefix.clone());
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

impl BreakerStore for RedisStore {
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

/// Settings of a [`RedisStore`]: see [`RedisStore::builder`].
pub struct RedisStoreBuilder {
    client: redis::Client,
    prefix: String,
    breaker: BreakerConfig,
    max_keys: usize,
    queue: usize,
    op_timeout: Duration,
    resync_every: Duration,
    key_ttl: Duration,
    max_backoff: Duration,
    observer: Option<Observer>,
}

impl fmt::Debug for RedisStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStoreBuilder")
            .field(
                "addr",
                &self.client.get_connection_info().addr().to_string(),
            )
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl RedisStoreBuilder {
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
        self.prefix = prefix.into();
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
        self.op_timeout = timeout;
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
        self.max_backoff = max.max(Duration::from_millis(25));
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
    /// When called outside a tokio runtime.
    pub fn build(self) -> Result<RedisStore, RedisStoreError> {
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| RedisStoreError::new("must be built inside a tokio runtime"))?;
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
            channel: format!("{}events", self.prefix),
            prefix: self.prefix,
            breaker: self.breaker,
            op_timeout: self.op_timeout,
            resync_every: self.resync_every,
            key_ttl: self.key_ttl,
            max_backoff: self.max_backoff,
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
        let (shutdown, watch_rx) = watch::channel(false);
        let (resync_tx, resync_rx) = mpsc::channel(1);
        let addr = self.client.get_connection_info().addr().to_string();
        runtime.spawn(worker::writer(
            Arc::downgrade(&inner),
            link.clone(),
            self.client.clone(),
            rx,
            watch_rx.clone(),
            resync_rx,
        ));
        runtime.spawn(worker::listener(
            Arc::downgrade(&inner),
            link.clone(),
            self.client,
            watch_rx,
            resync_tx,
        ));
        Ok(RedisStore {
            inner,
            link,
            addr,
            shutdown,
        })
    }
}
