//! The store: answers in Redis, an in-process [`MemoryCache`] while
//! Redis does not answer.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::{ErrorKind, RedisError, RetryMethod};
use tokio::sync::Notify;
use tower_llm_cache::{CacheEntry, CacheStore, MemoryCache, StoreError};
use tower_llm_idempotency::{BoxFuture, Stored};
use tower_llm_redis::{RedisSettings, Shutdown, ShutdownSignal};

use crate::scripts::{Found, Scripts};

/// Why a [`RedisCache`] could not be made: its URL does not parse, or
/// there is no tokio runtime (the shared Redis plumbing's
/// [`Error`](tower_llm_redis::Error), with its `is_*()` predicates).
pub type RedisCacheError = tower_llm_redis::Error;

/// The store's name in errors.
const STORE: &str = "redis cache store";

/// The default prefix of every key.
const DEFAULT_PREFIX: &str = "tower-llm:cache:";

/// The longest an answer is kept in Redis: a longer `keep` is cut to it
/// (a century; Redis refuses an expiry past its clock's range).
const LONGEST_KEEP_MS: u64 = 100 * 365 * 86_400 * 1000;

#[derive(Debug, Clone)]
struct Settings {
    redis: RedisSettings,
    fallback: bool,
}

/// What the store and its health task share.
struct Inner {
    conn: ConnectionManager,
    scripts: Scripts,
    settings: Settings,
    /// The in-process fallback while Redis is down.
    local: MemoryCache,
    /// Redis answers (optimistic at start: the first command tells).
    up: AtomicBool,
    /// Wakes the health task when Redis goes down.
    down: Arc<Notify>,
    /// An unreadable entry was logged (once per store).
    unreadable_logged: AtomicBool,
    /// A command Redis refused was logged (once per store).
    refused_logged: AtomicBool,
}

/// How a command failed.
#[derive(Debug, PartialEq, Eq)]
enum Failed {
    /// Redis is not answering (connection, timeout, loading, busy): the
    /// store switches to its fallback.
    Outage,
    /// Redis answered with an error that asking again will not change
    /// (out of memory, read-only, no permission): it is up, this command
    /// failed. The error's code, never its text.
    Refused(String),
}

fn classify(e: &RedisError) -> Failed {
    let answered = matches!(e.kind(), ErrorKind::Server(_) | ErrorKind::Extension)
        && matches!(e.retry_method(), RetryMethod::NoRetry)
        && e.code() != Some("BUSY");
    if answered {
        Failed::Refused(e.code().unwrap_or("error").to_owned())
    } else {
        Failed::Outage
    }
}

impl Inner {
    fn is_up(&self) -> bool {
        self.up.load(Ordering::Acquire)
    }

    /// Logs once per outage.
    fn set_down(&self, error: &str) {
        if self.up.swap(false, Ordering::AcqRel) {
            let meanwhile = if self.settings.fallback {
                "answers are cached in-process only until it answers again"
            } else {
                "nothing is cached until it answers again"
            };
            tracing::warn!(
                addr = %self.settings.redis.addr(),
                prefix = %self.settings.redis.prefix(),
                error,
                "cache store: Redis unavailable; {meanwhile}"
            );
            self.down.notify_one();
        }
    }

    fn set_up(&self) {
        if !self.up.swap(true, Ordering::AcqRel) {
            tracing::info!(
                addr = %self.settings.redis.addr(),
                prefix = %self.settings.redis.prefix(),
                "cache store: Redis answers again; answers are shared"
            );
        }
    }

    /// Logs the first entry that does not decode (never its key or
    /// value); the later ones are silent misses.
    fn unreadable(&self) {
        if !self.unreadable_logged.swap(true, Ordering::AcqRel) {
            tracing::warn!(
                addr = %self.settings.redis.addr(),
                prefix = %self.settings.redis.prefix(),
                "cache store: an entry in Redis does not decode (written by something else, \
                 or corrupted); it reads as a miss (logged once)"
            );
        }
    }

    /// Logs the first command Redis refused (its error code only); the
    /// later ones are silent.
    fn refused(&self, what: &str, code: &str) -> StoreError {
        if !self.refused_logged.swap(true, Ordering::AcqRel) {
            tracing::warn!(
                addr = %self.settings.redis.addr(),
                prefix = %self.settings.redis.prefix(),
                code,
                "cache store: Redis refused a {what} (logged once)"
            );
        }
        StoreError(format!("Redis refused the {what} ({code})"))
    }

    /// A command failed for want of Redis: down, and the fallback.
    fn outage(&self, e: &RedisError) {
        self.set_down(&e.to_string());
    }

    fn local_get(&self, key: &str) -> Result<Option<CacheEntry>, StoreError> {
        if !self.settings.fallback {
            return Err(StoreError("Redis unavailable".to_owned()));
        }
        Ok(self.local.get_now(key))
    }

    fn local_put(
        &self,
        key: Arc<str>,
        stored: Arc<Stored>,
        bytes: usize,
        keep: Duration,
    ) -> Result<(), StoreError> {
        if !self.settings.fallback {
            return Err(StoreError("Redis unavailable".to_owned()));
        }
        if self.local.put_now(key, stored, bytes, keep) {
            Ok(())
        } else {
            Err(StoreError(format!(
                "Redis unavailable, and an answer of {bytes} bytes is over the in-process cache's bound"
            )))
        }
    }

    async fn get(self: Arc<Self>, key: Arc<str>) -> Result<Option<CacheEntry>, StoreError> {
        if !self.is_up() {
            return self.local_get(&key);
        }
        let call = self.scripts.get.key(self.settings.redis.key(&key));
        let mut conn = self.conn.clone();
        let reply = tokio::time::timeout(
            self.settings.redis.op_timeout(),
            call.invoke_async::<redis::Value>(&mut conn),
        )
        .await;
        let reply = match reply {
            Ok(Ok(reply)) => reply,
            Ok(Err(e)) => match classify(&e) {
                Failed::Outage => {
                    self.outage(&e);
                    return self.local_get(&key);
                }
                Failed::Refused(code) => return Err(self.refused("read", &code)),
            },
            Err(_) => {
                self.set_down("command timed out");
                return self.local_get(&key);
            }
        };
        match Found::parse(reply) {
            Found::Miss => Ok(None),
            Found::Entry { age, answer } => match serde_json::from_slice::<Stored>(&answer) {
                Ok(stored) => Ok(Some(CacheEntry {
                    stored: Arc::new(stored),
                    age,
                })),
                Err(_) => {
                    self.unreadable();
                    Ok(None)
                }
            },
            Found::Unreadable => {
                self.unreadable();
                Ok(None)
            }
        }
    }

    async fn put(
        self: Arc<Self>,
        key: Arc<str>,
        stored: Arc<Stored>,
        bytes: usize,
        keep: Duration,
    ) -> Result<(), StoreError> {
        if !self.is_up() {
            return self.local_put(key, stored, bytes, keep);
        }
        let Ok(json) = serde_json::to_vec(&*stored) else {
            return Err(StoreError("the answer does not serialize".to_owned()));
        };
        let keep_ms = u64::try_from(keep.as_millis())
            .unwrap_or(u64::MAX)
            .min(LONGEST_KEEP_MS);
        let mut call = self.scripts.put.key(self.settings.redis.key(&key));
        call.arg(json).arg(keep_ms);
        let mut conn = self.conn.clone();
        let reply = tokio::time::timeout(
            self.settings.redis.op_timeout(),
            call.invoke_async::<redis::Value>(&mut conn),
        )
        .await;
        match reply {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => match classify(&e) {
                Failed::Outage => {
                    self.outage(&e);
                    self.local_put(key, stored, bytes, keep)
                }
                Failed::Refused(code) => Err(self.refused("write", &code)),
            },
            Err(_) => {
                self.set_down("command timed out");
                self.local_put(key, stored, bytes, keep)
            }
        }
    }
}

/// A [`CacheStore`] shared by every replica using the same Redis (and
/// prefix): see the [crate docs](crate).
///
/// Made inside a tokio runtime (it spawns one task, the health check that
/// notices Redis is back); the task stops when the store is dropped.
pub struct RedisCache {
    inner: Arc<Inner>,
    /// Stops the health task when the store is dropped.
    _shutdown: Shutdown,
}

impl fmt::Debug for RedisCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The address only: never the URL (it may carry a password).
        f.debug_struct("RedisCache")
            .field("redis", &self.inner.settings.redis)
            .field("fallback", &self.inner.settings.fallback)
            .field("up", &self.inner.is_up())
            .field("local", &self.inner.local)
            .finish_non_exhaustive()
    }
}

impl RedisCache {
    /// A store on the Redis at `url` (`redis://[:password@]host[:port][/db]`)
    /// with the default settings.
    ///
    /// # Errors
    ///
    /// When the URL does not parse, or there is no tokio runtime. A server
    /// that does not answer is not an error: the first command finds out,
    /// and the store works in-process until it answers.
    pub fn open(url: &str) -> Result<Self, RedisCacheError> {
        RedisCache::builder(url)?.build()
    }

    /// A builder for a store on the Redis at `url`.
    ///
    /// # Errors
    ///
    /// When the URL does not parse (the error never quotes it).
    pub fn builder(url: &str) -> Result<RedisCacheBuilder, RedisCacheError> {
        Ok(RedisCacheBuilder {
            redis: RedisSettings::new(STORE, url, DEFAULT_PREFIX)?,
            fallback: true,
            local_max_bytes: 16 << 20,
        })
    }

    /// `true` while Redis answers: answers are shared. `false`: this
    /// replica caches in-process (or not at all, with the fallback off)
    /// until Redis answers again.
    pub fn is_up(&self) -> bool {
        self.inner.is_up()
    }

    /// The in-process cache used while Redis is down.
    pub fn local(&self) -> &MemoryCache {
        &self.inner.local
    }
}

impl CacheStore for RedisCache {
    /// The entry under `key`, aged by the Redis server's clock (never
    /// negative). An entry that does not decode (another shape, corrupted
    /// JSON, a key written by something else) is a miss, logged once.
    ///
    /// While Redis is down (or when this command fails for want of it,
    /// or takes longer than the command timeout): the in-process
    /// fallback's answer, a hit only for what this replica put meanwhile;
    /// with the fallback off, `Err`. A command Redis answers with an
    /// error (no permission, say) is `Err`.
    fn get(&self, key: Arc<str>) -> BoxFuture<Result<Option<CacheEntry>, StoreError>> {
        Box::pin(self.inner.clone().get(key))
    }

    /// Replaces what `key` held with `stored`, kept for `keep` (cut to a
    /// century; under 1 ms removes the key), stamped with the server's
    /// clock. `bytes` bounds only the in-process fallback: in Redis,
    /// answers are bounded by `keep` (and the server's `maxmemory`).
    ///
    /// While Redis is down (or when this command fails for want of it,
    /// or takes longer than the command timeout): kept in-process, `Ok`
    /// (`Err` if over the fallback's bound); with the fallback off,
    /// `Err`. A write Redis refuses (out of memory, read-only) is `Err`.
    fn put(
        &self,
        key: Arc<str>,
        stored: Arc<Stored>,
        bytes: usize,
        keep: Duration,
    ) -> BoxFuture<Result<(), StoreError>> {
        Box::pin(self.inner.clone().put(key, stored, bytes, keep))
    }
}

/// Settings of a [`RedisCache`]: see [`RedisCache::builder`].
pub struct RedisCacheBuilder {
    redis: RedisSettings,
    fallback: bool,
    local_max_bytes: usize,
}

impl fmt::Debug for RedisCacheBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisCacheBuilder")
            .field("redis", &self.redis)
            .field("fallback", &self.fallback)
            .field("local_max_bytes", &self.local_max_bytes)
            .finish()
    }
}

impl RedisCacheBuilder {
    /// The prefix of every key (default `tower-llm:cache:`). Replicas
    /// share answers when they share it.
    #[must_use]
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.redis = self.redis.with_prefix(prefix);
        self
    }

    /// How long one Redis command may take before Redis counts as down
    /// (default 250 ms): the most a `get` or a `put` waits on Redis.
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

    /// While Redis is down, cache in-process (`true`, the default: an
    /// in-process [`MemoryCache`], so a replica still serves its own
    /// hits) or answer [`StoreError`] (`false`: the layer then serves
    /// calls uncached).
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

    /// Makes the store and spawns its health task.
    ///
    /// # Errors
    ///
    /// When called outside a tokio runtime, or the connection manager
    /// cannot be made.
    pub fn build(self) -> Result<RedisCache, RedisCacheError> {
        let runtime = self.redis.runtime()?;
        let conn = self.redis.connection_manager()?;
        let settings = Settings {
            redis: self.redis,
            fallback: self.fallback,
        };
        let down = Arc::new(Notify::new());
        let inner = Arc::new(Inner {
            conn,
            scripts: Scripts::new(),
            settings: settings.clone(),
            local: MemoryCache::new(self.local_max_bytes),
            up: AtomicBool::new(true),
            down: down.clone(),
            unreadable_logged: AtomicBool::new(false),
            refused_logged: AtomicBool::new(false),
        });
        let shutdown = Shutdown::new();
        runtime.spawn(health(
            Arc::downgrade(&inner),
            down,
            settings,
            shutdown.signal(),
        ));
        Ok(RedisCache {
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

#[cfg(test)]
mod tests {
    use super::*;
    use redis::ServerErrorKind;

    #[tokio::test]
    async fn debug_never_shows_the_password() {
        let store = RedisCache::open("redis://:hunter2@127.0.0.1:1/0").expect("parses");
        let shown = format!("{store:?}");
        assert!(shown.contains("127.0.0.1:1"), "{shown}");
        assert!(shown.contains("tower-llm:cache:"), "{shown}");
        assert!(!shown.contains("hunter2"), "{shown}");
        let builder = RedisCache::builder("redis://user:hunter2@127.0.0.1:1").expect("parses");
        let shown = format!("{builder:?}");
        assert!(shown.contains("127.0.0.1:1"), "{shown}");
        assert!(!shown.contains("hunter2"), "{shown}");
        let err = RedisCache::builder("http://:hunter2@x").expect_err("not redis");
        assert!(err.is_invalid_url());
        assert_eq!(err.to_string(), "redis cache store: invalid Redis URL");
    }

    #[test]
    fn outside_a_runtime_the_store_is_not_made() {
        let err = RedisCache::open("redis://127.0.0.1:1").expect_err("no runtime");
        assert!(err.is_no_runtime());
    }

    #[test]
    fn connection_failures_are_outages_and_refusals_are_not() {
        let io = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert_eq!(classify(&io), Failed::Outage);
        let loading = RedisError::from((ErrorKind::Server(ServerErrorKind::BusyLoading), "x"));
        assert_eq!(classify(&loading), Failed::Outage);
        let read_only = RedisError::from((ErrorKind::Server(ServerErrorKind::ReadOnly), "x"));
        assert_eq!(classify(&read_only), Failed::Refused("READONLY".to_owned()));
        let err = RedisError::from((ErrorKind::Server(ServerErrorKind::ResponseError), "x"));
        assert_eq!(classify(&err), Failed::Refused("ERR".to_owned()));
        let parse = RedisError::from((ErrorKind::Parse, "x"));
        assert_eq!(classify(&parse), Failed::Outage);
    }
}
