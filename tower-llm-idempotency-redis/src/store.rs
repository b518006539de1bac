//! The store: reservations and answers in Redis, an in-process
//! [`MemoryStore`] while Redis does not answer.

use std::fmt;
use std::hash::{BuildHasher, RandomState};
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use redis::aio::ConnectionManager;
use tokio::sync::{Notify, broadcast};
use tower_llm_idempotency::{
    Begin, BoxFuture, Fingerprint, IdempotencyStore, Lease, MemoryStore, StoreError, Stored,
};
use tower_llm_redis::{RedisSettings, Shutdown, ShutdownSignal, Subscriber};

use crate::scripts::{Reply, Scripts};

/// Leases of the in-process fallback have this bit set, Redis leases never
/// do: `complete` and `release` know where a lease was taken.
const LOCAL: u64 = 1 << 63;

/// Why a [`RedisIdempotencyStore`] could not be made: its URL does not
/// parse, or there is no tokio runtime (the shared Redis plumbing's
/// [`Error`](tower_llm_redis::Error), with its `is_*()` predicates).
pub type RedisIdempotencyStoreError = tower_llm_redis::Error;

/// The store's name in errors.
const STORE: &str = "redis idempotency store";

#[derive(Debug, Clone)]
struct Settings {
    redis: RedisSettings,
    channel: String,
    lease_ttl: Duration,
    poll: Duration,
    fallback: bool,
}

/// What the store and its two background tasks share.
struct Inner {
    conn: ConnectionManager,
    scripts: Scripts,
    settings: Settings,
    /// The in-process fallback while Redis is down.
    local: MemoryStore,
    /// Redis answers (optimistic at start: the first command tells).
    up: AtomicBool,
    /// Wakes the health task when Redis goes down.
    down: Arc<Notify>,
    /// Keys whose reservation ended, from the channel.
    notices: broadcast::Sender<Arc<str>>,
    /// The subscription to the channel is live.
    listening: Arc<AtomicBool>,
    random: RandomState,
    lease_seq: AtomicU64,
}

impl Inner {
    fn is_up(&self) -> bool {
        self.up.load(Ordering::Acquire)
    }

    /// Logs once per outage.
    fn set_down(&self, error: &str) {
        if self.up.swap(false, Ordering::AcqRel) {
            tracing::warn!(
                addr = %self.settings.redis.addr(),
                prefix = %self.settings.redis.prefix(),
                error,
                "idempotency store: Redis unavailable; idempotency is in-process only until it answers again"
            );
            self.down.notify_one();
        }
    }

    fn set_up(&self) {
        if !self.up.swap(true, Ordering::AcqRel) {
            tracing::info!(
                addr = %self.settings.redis.addr(),
                prefix = %self.settings.redis.prefix(),
                "idempotency store: Redis answers again; answers are shared"
            );
        }
    }

    fn redis_key(&self, key: &str) -> String {
        self.settings.redis.key(key)
    }

    /// A lease no other call on any replica holds (63 random bits, never
    /// zero).
    fn next_lease(&self) -> u64 {
        let n = self.lease_seq.fetch_add(1, Ordering::Relaxed);
        (self.random.hash_one(n) & !LOCAL).max(1)
    }

    fn local_begin(&self, key: Arc<str>, fingerprint: Fingerprint) -> Result<Begin, StoreError> {
        if !self.settings.fallback {
            return Err(StoreError("Redis unavailable".to_owned()));
        }
        Ok(match self.local.begin_now(key, fingerprint) {
            Begin::Lead(lease) => Begin::Lead(Lease(lease.0 | LOCAL)),
            other => other,
        })
    }

    async fn begin(
        self: Arc<Self>,
        key: Arc<str>,
        fingerprint: Fingerprint,
    ) -> Result<Begin, StoreError> {
        if !self.is_up() {
            return self.local_begin(key, fingerprint);
        }
        // Listening before asking: a notice sent between the reply and
        // the wait is not missed.
        let notices = self.notices.subscribe();
        let lease = self.next_lease();
        let mut call = self.scripts.begin.key(self.redis_key(&key));
        call.arg(hex(&fingerprint.0))
            .arg(lease)
            .arg(millis(self.settings.lease_ttl));
        let mut conn = self.conn.clone();
        let reply = tokio::time::timeout(
            self.settings.redis.op_timeout(),
            call.invoke_async::<Vec<String>>(&mut conn),
        )
        .await;
        let reply = match reply {
            Ok(Ok(reply)) => reply,
            Ok(Err(e)) => {
                self.set_down(&e.to_string());
                return self.local_begin(key, fingerprint);
            }
            Err(_) => {
                self.set_down("command timed out");
                return self.local_begin(key, fingerprint);
            }
        };
        match Reply::parse(reply) {
            Some(Reply::Lead) => Ok(Begin::Lead(Lease(lease))),
            Some(Reply::Replay(json)) => match serde_json::from_str::<Stored>(&json) {
                Ok(stored) => Ok(Begin::Replay(Arc::new(stored))),
                Err(e) => Err(StoreError(format!("stored answer unreadable: {e}"))),
            },
            Some(Reply::Mismatch) => Ok(Begin::Mismatch),
            Some(Reply::Busy) => Ok(Begin::Busy(Box::pin(wait(
                notices,
                key,
                self.settings.poll,
            )))),
            None => Err(StoreError("malformed reply from Redis".to_owned())),
        }
    }

    async fn complete(
        self: Arc<Self>,
        key: Arc<str>,
        lease: Lease,
        stored: Arc<Stored>,
        ttl: Duration,
    ) {
        let Ok(json) = serde_json::to_string(&*stored) else {
            self.release(key, lease).await;
            return;
        };
        let mut call = self.scripts.complete.key(self.redis_key(&key));
        call.arg(lease.0)
            .arg(json)
            .arg(millis(ttl))
            .arg(&self.settings.channel)
            .arg(&*key);
        self.run(call).await;
    }

    async fn release(self: Arc<Self>, key: Arc<str>, lease: Lease) {
        let mut call = self.scripts.release.key(self.redis_key(&key));
        call.arg(lease.0).arg(&self.settings.channel).arg(&*key);
        self.run(call).await;
    }

    /// Runs a write, bounded by the command timeout; a failure marks
    /// Redis down (the reservation then expires with its lease TTL).
    async fn run(&self, call: redis::ScriptInvocation<'_>) {
        let mut conn = self.conn.clone();
        match tokio::time::timeout(
            self.settings.redis.op_timeout(),
            call.invoke_async::<i64>(&mut conn),
        )
        .await
        {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => self.set_down(&e.to_string()),
            Err(_) => self.set_down("command timed out"),
        }
    }
}

/// Until a notice for `key` (or one possibly missed), or `poll` at the
/// latest: the safety net under pub/sub.
async fn wait(mut notices: broadcast::Receiver<Arc<str>>, key: Arc<str>, poll: Duration) {
    let notice = async {
        loop {
            match notices.recv().await {
                Ok(k) if k == key => return,
                Ok(_) => {}
                Err(broadcast::error::RecvError::Lagged(_)) => return,
                Err(broadcast::error::RecvError::Closed) => std::future::pending::<()>().await,
            }
        }
    };
    tokio::select! {
        () = notice => {}
        () = tokio::time::sleep(poll) => {}
    }
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// An [`IdempotencyStore`] shared by every replica using the same Redis
/// (and prefix): see the [crate docs](crate).
///
/// Made inside a tokio runtime (it spawns two tasks: the pub/sub listener
/// and the health check that notices Redis is back); they stop when the
/// store is dropped.
pub struct RedisIdempotencyStore {
    inner: Arc<Inner>,
    /// Stops the two tasks when the store is dropped.
    _shutdown: Shutdown,
}

impl fmt::Debug for RedisIdempotencyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The address only: never the URL (it may carry a password).
        f.debug_struct("RedisIdempotencyStore")
            .field("redis", &self.inner.settings.redis)
            .field("up", &self.inner.is_up())
            .field("local", &self.inner.local)
            .finish_non_exhaustive()
    }
}

impl RedisIdempotencyStore {
    /// A store on the Redis at `url` (`redis://[:password@]host[:port][/db]`)
    /// with the default settings.
    ///
    /// # Errors
    ///
    /// When the URL does not parse, or there is no tokio runtime. A server
    /// that does not answer is not an error: the first command finds out,
    /// and the store works in-process until it answers.
    pub fn open(url: &str) -> Result<Self, RedisIdempotencyStoreError> {
        RedisIdempotencyStore::builder(url)?.build()
    }

    /// A builder for a store on the Redis at `url`.
    ///
    /// # Errors
    ///
    /// When the URL does not parse.
    pub fn builder(url: &str) -> Result<RedisIdempotencyStoreBuilder, RedisIdempotencyStoreError> {
        Ok(RedisIdempotencyStoreBuilder {
            redis: RedisSettings::new(STORE, url, "tower-llm:idem:")?,
            lease_ttl: Duration::from_secs(60),
            poll: Duration::from_millis(50),
            fallback: true,
            local_max_bytes: 16 << 20,
        })
    }

    /// `true` while Redis answers: answers and reservations are shared.
    /// `false`: this replica works in-process (or without idempotency,
    /// with the fallback off) until Redis answers again.
    pub fn is_up(&self) -> bool {
        self.inner.is_up()
    }

    /// `true` while the subscription to the notices is live: a waiting
    /// duplicate is woken as soon as its answer is stored. `false`: it
    /// asks again every poll interval.
    pub fn is_listening(&self) -> bool {
        self.inner.listening.load(Ordering::Acquire)
    }

    /// The in-process store used while Redis is down.
    pub fn local(&self) -> &MemoryStore {
        &self.inner.local
    }
}

impl IdempotencyStore for RedisIdempotencyStore {
    fn begin(
        &self,
        key: Arc<str>,
        fingerprint: Fingerprint,
    ) -> BoxFuture<Result<Begin, StoreError>> {
        Box::pin(self.inner.clone().begin(key, fingerprint))
    }

    /// Stores the answer only while the lease holds (one script), then
    /// publishes a notice. `bytes` bounds only the in-process fallback:
    /// in Redis, answers are bounded by their TTL (and the server's
    /// `maxmemory`).
    fn complete(
        &self,
        key: Arc<str>,
        lease: Lease,
        stored: Arc<Stored>,
        bytes: usize,
        ttl: Duration,
    ) -> BoxFuture<()> {
        if lease.0 & LOCAL != 0 {
            self.inner
                .local
                .complete_now(key, Lease(lease.0 & !LOCAL), stored, bytes, ttl);
            return Box::pin(std::future::ready(()));
        }
        Box::pin(self.inner.clone().complete(key, lease, stored, ttl))
    }

    /// Spawned (fire-and-forget): never blocks. Without a runtime, the
    /// reservation expires with its lease TTL.
    fn release(&self, key: Arc<str>, lease: Lease) {
        if lease.0 & LOCAL != 0 {
            self.inner.local.release_now(&key, Lease(lease.0 & !LOCAL));
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(self.inner.clone().release(key, lease));
        }
    }
}

/// Settings of a [`RedisIdempotencyStore`]: see [`RedisIdempotencyStore::builder`].
pub struct RedisIdempotencyStoreBuilder {
    redis: RedisSettings,
    lease_ttl: Duration,
    poll: Duration,
    fallback: bool,
    local_max_bytes: usize,
}

impl fmt::Debug for RedisIdempotencyStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisIdempotencyStoreBuilder")
            .field("redis", &self.redis)
            .finish_non_exhaustive()
    }
}

impl RedisIdempotencyStoreBuilder {
    /// The prefix of every key and of the channel (default
    /// `tower-llm:idem:`). Replicas share answers when they share it.
    #[must_use]
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.redis = self.redis.with_prefix(prefix);
        self
    }

    /// How long a reservation holds without being completed or released
    /// (default 60 s, at least 1 ms): the longest a leader lost with its
    /// replica keeps the key from the others. It is not refreshed: set it
    /// above your longest call (its deadline); a leader still running
    /// when it expires loses the key (another call may lead, and the late
    /// answer is not stored).
    #[must_use]
    pub fn with_lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = ttl.max(Duration::from_millis(1));
        self
    }

    /// How long one Redis command may take before Redis counts as down
    /// (default 250 ms): the most a call waits on Redis.
    #[must_use]
    pub fn with_op_timeout(mut self, timeout: Duration) -> Self {
        self.redis = self.redis.with_op_timeout(timeout);
        self
    }

    /// How long a waiting duplicate waits at most before asking again
    /// (default 50 ms, at least 1 ms): the safety net under pub/sub,
    /// which normally wakes it as soon as the answer is stored.
    #[must_use]
    pub fn with_poll_interval(mut self, poll: Duration) -> Self {
        self.poll = poll.max(Duration::from_millis(1));
        self
    }

    /// The longest wait between checks that Redis is back, and between
    /// resubscriptions (default 2 s; they start at 25 ms and double).
    #[must_use]
    pub fn with_max_backoff(mut self, max: Duration) -> Self {
        self.redis = self.redis.with_max_backoff(max);
        self
    }

    /// While Redis is down, keep idempotency in-process (`true`, the
    /// default: an in-process [`MemoryStore`]) or answer
    /// [`StoreError`] (`false`: the layer then serves calls without
    /// idempotency).
    #[must_use]
    pub fn with_local_fallback(mut self, fallback: bool) -> Self {
        self.fallback = fallback;
        self
    }

    /// The in-process fallback's bound in bytes of answers (default
    /// 16 MiB).
    #[must_use]
    pub fn with_local_max_bytes(mut self, max_bytes: usize) -> Self {
        self.local_max_bytes = max_bytes;
        self
    }

    /// Makes the store and spawns its two background tasks.
    ///
    /// # Errors
    ///
    /// When called outside a tokio runtime, or the connection manager
    /// cannot be made.
    pub fn build(self) -> Result<RedisIdempotencyStore, RedisIdempotencyStoreError> {
        let runtime = self.redis.runtime()?;
        let conn = self.redis.connection_manager()?;
        let settings = Settings {
            channel: self.redis.key("notices"),
            redis: self.redis,
            lease_ttl: self.lease_ttl,
            poll: self.poll,
            fallback: self.fallback,
        };
        let (notices, _) = broadcast::channel(1024);
        let down = Arc::new(Notify::new());
        let listening = Arc::new(AtomicBool::new(false));
        let inner = Arc::new(Inner {
            conn,
            scripts: Scripts::new(),
            settings: settings.clone(),
            local: MemoryStore::new(self.local_max_bytes),
            up: AtomicBool::new(true),
            down: down.clone(),
            notices: notices.clone(),
            listening: listening.clone(),
            random: RandomState::new(),
            lease_seq: AtomicU64::new(0),
        });
        let shutdown = Shutdown::new();
        runtime.spawn(health(
            Arc::downgrade(&inner),
            down,
            settings.clone(),
            shutdown.signal(),
        ));
        runtime.spawn(tower_llm_redis::listen(
            settings.redis,
            settings.channel,
            Notices { notices, listening },
            shutdown.signal(),
        ));
        Ok(RedisIdempotencyStore {
            inner,
            _shutdown: shutdown,
        })
    }
}

/// While Redis is down, pings it with backoff; marks it up when it
/// answers.
async fn health(
    inner: Weak<Inner>,
    down: Arc<Notify>,
    settings: Settings,
    mut shutdown: ShutdownSignal,
) {
    loop {
        tokio::select! {
            () = shutdown.stopped() => return,
            () = down.notified() => {}
        }
        let mut backoff = settings.redis.backoff();
        loop {
            tokio::select! {
                () = shutdown.stopped() => return,
                () = tokio::time::sleep(backoff.next_wait()) => {}
            }
            let Some(inner) = inner.upgrade() else { return };
            let mut conn = inner.conn.clone();
            if tower_llm_redis::ping(&mut conn, settings.redis.op_timeout()).await {
                inner.set_up();
                break;
            }
        }
    }
}

/// The channel's side of the store: passes every notice to the waiters
/// (who poll while the subscription is down).
struct Notices {
    notices: broadcast::Sender<Arc<str>>,
    listening: Arc<AtomicBool>,
}

impl Subscriber for Notices {
    fn on_subscribed(&mut self) {
        self.listening.store(true, Ordering::Release);
    }

    fn on_message(&mut self, payload: &[u8]) -> ControlFlow<()> {
        if let Ok(key) = std::str::from_utf8(payload) {
            let _ = self.notices.send(Arc::from(key));
        }
        ControlFlow::Continue(())
    }

    fn on_unsubscribed(&mut self) {
        self.listening.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn debug_never_shows_the_password() {
        let store = RedisIdempotencyStore::open("redis://:hunter2@127.0.0.1:1/0").expect("parses");
        let shown = format!("{store:?}");
        assert!(shown.contains("127.0.0.1:1"), "{shown}");
        assert!(!shown.contains("hunter2"), "{shown}");
        let builder =
            RedisIdempotencyStore::builder("redis://user:hunter2@127.0.0.1:1").expect("parses");
        assert!(!format!("{builder:?}").contains("hunter2"));
        let err = RedisIdempotencyStore::builder("http://:hunter2@x").expect_err("not redis");
        assert!(!err.to_string().contains("hunter2"));
    }

    #[test]
    #[allow(deprecated)]
    fn the_old_names_still_name_the_store() {
        let builder: fn(&str) -> Result<crate::RedisStoreBuilder, crate::RedisStoreError> =
            crate::RedisStore::builder;
        let err = builder("http://x").expect_err("not redis");
        assert!(err.is_invalid_url());
        assert_eq!(
            err.to_string(),
            "redis idempotency store: invalid Redis URL"
        );
    }

    #[test]
    fn hex_is_lowercase_and_fixed_length() {
        assert_eq!(hex(&[0, 0xab, 0x10]), "00ab10");
        assert_eq!(hex(&[7; 32]).len(), 64);
    }
}
