//! Where cached answers are kept: the [`CacheStore`] contract and the
//! in-process [`MemoryCache`].

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;
use tower_llm_idempotency::{BoxFuture, Stored};

pub use tower_llm_idempotency::StoreError;

/// A stored answer as a [`CacheStore`] hands it back: the answer and how
/// long ago it was stored.
#[derive(Debug, Clone)]
pub struct CacheEntry {
    /// The answer (a whole response, or a stream's chunks).
    pub stored: Arc<Stored>,
    /// How long ago it was stored, by the store's clock (a shared store:
    /// its server's, so every replica computes the same age).
    pub age: Duration,
}

/// The store behind a [`CacheLayer`](crate::CacheLayer): in-process
/// ([`MemoryCache`], the default) or shared between replicas (the
/// `tower-llm-cache-redis` crate's `RedisCache`).
///
/// Keys come scoped by tenant and hashed (64 hex characters, nothing a
/// caller chose). A key holds at most one answer, the latest stored; the
/// store forgets it once it is older than the `keep` it was stored with
/// (an answer exactly `keep` old is still held: the layer may serve it).
pub trait CacheStore: Send + Sync + fmt::Debug + 'static {
    /// The answer under `key`, if one is held, with its age.
    fn get(&self, key: Arc<str>) -> BoxFuture<Result<Option<CacheEntry>, StoreError>>;

    /// Keeps `stored` under `key` for `keep` (replacing what was there);
    /// `bytes` is what it holds ([`Stored::held_bytes`]), for the store's
    /// memory bound. A store that cannot keep it (too big, server down)
    /// says so or drops it: either way the call it came from is served.
    fn put(
        &self,
        key: Arc<str>,
        stored: Arc<Stored>,
        bytes: usize,
        keep: Duration,
    ) -> BoxFuture<Result<(), StoreError>>;
}

struct Held {
    stored: Arc<Stored>,
    bytes: usize,
    at: Instant,
    expires: Instant,
    seq: u64,
}

#[derive(Default)]
struct Inner {
    map: HashMap<Arc<str>, Held>,
    /// Answers in the order they were stored, for eviction (an entry is
    /// stale when the key now holds a later answer).
    order: VecDeque<(Arc<str>, u64)>,
    bytes: usize,
    next_seq: u64,
}

/// The default, in-process store: answers bounded by the bytes they hold
/// (each counted as [`Stored::held_bytes`] plus its key), oldest stored
/// first out when full, each forgotten after its `keep`.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use tower_llm_cache::{CacheStore, MemoryCache};
/// use tower_llm_core::ChatResponse;
/// use tower_llm_idempotency::Stored;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let cache = MemoryCache::new(1 << 20);
/// let answer = Stored::Response(ChatResponse::default());
/// let bytes = answer.held_bytes();
/// cache.put("k".into(), Arc::new(answer), bytes, Duration::from_secs(60)).await.unwrap();
/// tokio::time::advance(Duration::from_secs(5)).await;
/// let entry = cache.get("k".into()).await.unwrap().unwrap();
/// assert_eq!(entry.age, Duration::from_secs(5));
/// // Held through exactly its `keep`, gone just after.
/// tokio::time::advance(Duration::from_secs(55)).await;
/// assert_eq!(cache.get("k".into()).await.unwrap().unwrap().age, Duration::from_secs(60));
/// tokio::time::advance(Duration::from_millis(1)).await;
/// assert!(cache.get("k".into()).await.unwrap().is_none());
/// # }
/// ```
pub struct MemoryCache {
    inner: Mutex<Inner>,
    max_bytes: usize,
}

impl MemoryCache {
    /// A store holding at most `max_bytes` of answers.
    pub fn new(max_bytes: usize) -> Self {
        MemoryCache {
            inner: Mutex::new(Inner::default()),
            max_bytes,
        }
    }

    /// Bytes of answers held now (expired ones included until they are
    /// looked up or pushed out).
    pub fn bytes(&self) -> usize {
        self.lock().bytes
    }

    /// Answers held now (expired ones included until they are looked up
    /// or pushed out).
    pub fn len(&self) -> usize {
        self.lock().map.len()
    }

    /// `true` when no answer is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The synchronous core of [`CacheStore::get`].
    pub fn get_now(&self, key: &str) -> Option<CacheEntry> {
        let mut inner = self.lock();
        let now = Instant::now();
        let held = inner.map.get(key)?;
        // Held through exactly `keep`: the layer serves an answer whose
        // age equals its ttl (or its ttl plus stale window), so the store
        // must not forget it at that instant.
        if held.expires < now {
            if let Some(gone) = inner.map.remove(key) {
                inner.bytes = inner.bytes.saturating_sub(gone.bytes);
            }
            return None;
        }
        Some(CacheEntry {
            stored: held.stored.clone(),
            age: now.saturating_duration_since(held.at),
        })
    }

    /// The synchronous core of [`CacheStore::put`]: `false` when the
    /// answer is larger than the whole store (it is not kept).
    pub fn put_now(
        &self,
        key: Arc<str>,
        stored: Arc<Stored>,
        bytes: usize,
        keep: Duration,
    ) -> bool {
        let bytes = bytes.saturating_add(key.len());
        if bytes > self.max_bytes {
            return false;
        }
        let now = Instant::now();
        let mut inner = self.lock();
        inner.next_seq += 1;
        let seq = inner.next_seq;
        let held = Held {
            stored,
            bytes,
            at: now,
            // A keep too long for the clock is "for ever" (a century).
            expires: now
                .checked_add(keep)
                .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 86_400)),
            seq,
        };
        if let Some(old) = inner.map.insert(key.clone(), held) {
            inner.bytes = inner.bytes.saturating_sub(old.bytes);
        }
        inner.bytes += bytes;
        inner.order.push_back((key, seq));
        // Oldest stored first out until within the bound.
        while inner.bytes > self.max_bytes {
            let Some((old, old_seq)) = inner.order.pop_front() else {
                break;
            };
            if inner.map.get(&old).is_some_and(|h| h.seq == old_seq) {
                if let Some(gone) = inner.map.remove(&old) {
                    inner.bytes = inner.bytes.saturating_sub(gone.bytes);
                }
            }
        }
        // The order queue never outgrows the answers held by much: drop
        // the entries of answers replaced or expired and removed.
        if inner.order.len() > 2 * inner.map.len() + 16 {
            let Inner { map, order, .. } = &mut *inner;
            order.retain(|(k, s)| map.get(k).is_some_and(|h| h.seq == *s));
        }
        true
    }
}

impl Default for MemoryCache {
    /// 64 MiB of answers.
    fn default() -> Self {
        MemoryCache::new(64 << 20)
    }
}

impl fmt::Debug for MemoryCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = self.lock();
        f.debug_struct("MemoryCache")
            .field("answers", &inner.map.len())
            .field("bytes", &inner.bytes)
            .field("max_bytes", &self.max_bytes)
            .finish()
    }
}

impl CacheStore for MemoryCache {
    fn get(&self, key: Arc<str>) -> BoxFuture<Result<Option<CacheEntry>, StoreError>> {
        Box::pin(std::future::ready(Ok(self.get_now(&key))))
    }

    fn put(
        &self,
        key: Arc<str>,
        stored: Arc<Stored>,
        bytes: usize,
        keep: Duration,
    ) -> BoxFuture<Result<(), StoreError>> {
        let kept = self.put_now(key, stored, bytes, keep);
        Box::pin(std::future::ready(if kept {
            Ok(())
        } else {
            Err(StoreError(format!(
                "an answer of {bytes} bytes is over the cache's {} bytes",
                self.max_bytes
            )))
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower_llm_core::ChatResponse;

    fn answer(id: &str) -> (Arc<Stored>, usize) {
        let stored = Stored::Response(ChatResponse {
            id: id.into(),
            ..ChatResponse::default()
        });
        let bytes = stored.held_bytes();
        (Arc::new(stored), bytes)
    }

    #[tokio::test(start_paused = true)]
    async fn oldest_stored_goes_first_when_full() {
        let (_, one) = answer("a");
        let cache = MemoryCache::new((one + 1) * 3);
        for id in ["a", "b", "c", "d"] {
            let (stored, bytes) = answer(id);
            assert!(cache.put_now(id.into(), stored, bytes, Duration::from_secs(60)));
        }
        assert_eq!(cache.len(), 3);
        assert!(cache.get_now("a").is_none());
        assert!(cache.get_now("d").is_some());
        assert!(cache.bytes() <= (one + 1) * 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_later_answer_replaces_the_earlier_and_counts_once() {
        let cache = MemoryCache::new(1 << 20);
        let (a, bytes) = answer("a");
        cache.put_now("k".into(), a, bytes, Duration::from_secs(60));
        tokio::time::advance(Duration::from_secs(10)).await;
        let (b, bytes_b) = answer("b");
        cache.put_now("k".into(), b, bytes_b, Duration::from_secs(60));
        let entry = cache.get_now("k").unwrap();
        assert_eq!(entry.age, Duration::ZERO);
        assert!(matches!(&*entry.stored, Stored::Response(r) if r.id == "b"));
        assert_eq!(cache.bytes(), bytes_b + 1);
        for _ in 0..1000 {
            let (s, n) = answer("x");
            cache.put_now("k".into(), s, n, Duration::from_secs(60));
        }
        let queued = cache.lock().order.len();
        assert!(queued <= 2 * cache.len() + 16, "{queued} queued");
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_over_the_whole_bound_is_refused() {
        let (stored, bytes) = answer("a");
        let cache = MemoryCache::new(bytes);
        let refused = cache
            .put("k".into(), stored, bytes, Duration::from_secs(1))
            .await;
        assert!(refused.is_err());
        assert!(cache.is_empty());
    }
}
