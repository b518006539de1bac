//! Where answers are kept, and how a key is reserved.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, PoisonError};

// Model-checked with loom (`tests/loom.rs`, `--cfg tower_llm_loom`): the
// single-flight table's lock is loom's there.
#[cfg(tower_llm_loom)]
use loom::sync::{Mutex, MutexGuard};
#[cfg(not(tower_llm_loom))]
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::Instant;
use tower_llm_core::{AttemptRecord, ChatResponse};

use crate::StreamFrames;

/// A boxed, sendable future (what a store's operations return).
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// A stored answer: a whole response, or a stream's chunks in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Stored {
    /// A unary answer, with the records of the call that produced it.
    Response(ChatResponse),
    /// A stream that completed cleanly.
    Stream {
        /// The provider that streamed it.
        provider: Arc<str>,
        /// The model that streamed it.
        model: String,
        /// The fallback position of the link that served it.
        fallback_position: u8,
        /// Its chunks, in order, kept compactly (serialized as a sequence
        /// of chunks).
        chunks: StreamFrames,
        /// The records of the call that produced it.
        attempts: Vec<AttemptRecord>,
    },
}

impl Stored {
    /// What a store counts for this answer against its memory bound: close
    /// to what it holds in memory. A stream is its frames' buffer (the
    /// chunks' JSON, [`StreamFrames`]) plus its names and records; a unary
    /// answer, its JSON size. Both plus the entry's fixed part
    /// ([`Stored::ENTRY_OVERHEAD`]). Linear in the answer, no allocation.
    pub fn held_bytes(&self) -> usize {
        let variable = match self {
            Stored::Response(res) => json_len(res),
            Stored::Stream {
                provider,
                model,
                chunks,
                attempts,
                ..
            } => chunks
                .len_bytes()
                .saturating_add(provider.len())
                .saturating_add(model.len())
                .saturating_add(attempts.len().saturating_mul(RECORD_BYTES)),
        };
        variable.saturating_add(Self::ENTRY_OVERHEAD)
    }

    /// The fixed part of a stored entry counted by
    /// [`held_bytes`](Self::held_bytes): the entry, its key and the
    /// allocations' bookkeeping.
    pub const ENTRY_OVERHEAD: usize = 256;
}

/// What an attempt record holds (its names are shared with the link).
const RECORD_BYTES: usize = std::mem::size_of::<AttemptRecord>();

/// The length of `value`'s JSON, counted without building it.
fn json_len<T: Serialize>(value: &T) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 = self.0.saturating_add(buf.len());
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    match serde_json::to_writer(&mut count, value) {
        Ok(()) => count.0,
        // Nothing serializable is never stored.
        Err(_) => usize::MAX,
    }
}

/// A request's fingerprint: SHA-256 of what it asks (model, messages,
/// parameters), stored with its answer so the same key with another
/// request is refused rather than answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Fingerprint(pub [u8; 32]);

/// The hold of the one call that may produce a key's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Lease(pub u64);

/// What [`IdempotencyStore::begin`] found.
pub enum Begin {
    /// Nothing stored and nobody producing it: this call holds the key
    /// and produces the answer (then [`complete`](IdempotencyStore::complete)
    /// or [`release`](IdempotencyStore::release)).
    Lead(Lease),
    /// The stored answer of an earlier call with this key and fingerprint.
    Replay(Arc<Stored>),
    /// The key holds (or is producing) another request's answer.
    Mismatch,
    /// Another call with this key and fingerprint is producing the answer:
    /// the future resolves when that may have changed (completed,
    /// released, expired); ask again then.
    Busy(BoxFuture<()>),
}

impl fmt::Debug for Begin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Begin::Lead(lease) => f.debug_tuple("Lead").field(lease).finish(),
            Begin::Replay(_) => f.write_str("Replay"),
            Begin::Mismatch => f.write_str("Mismatch"),
            Begin::Busy(_) => f.write_str("Busy"),
        }
    }
}

/// A store that could not answer (a shared store's server down, say). The
/// layer then serves the call without idempotency rather than fail it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreError(pub String);

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "idempotency store unavailable: {}", self.0)
    }
}

impl std::error::Error for StoreError {}

/// The store behind an [`IdempotencyLayer`](crate::IdempotencyLayer):
/// in-process ([`MemoryStore`], the default) or shared between replicas.
///
/// Keys come scoped and hashed (fixed length, no caller-controlled
/// characters). A store reserves a key atomically (one leader per key),
/// keeps an answer for its time to live, and wakes waiters when a key's
/// state changes.
pub trait IdempotencyStore: Send + Sync + fmt::Debug + 'static {
    /// Looks `key` up and, if nothing is there, reserves it for this call.
    fn begin(
        &self,
        key: Arc<str>,
        fingerprint: Fingerprint,
    ) -> BoxFuture<Result<Begin, StoreError>>;

    /// Stores the answer of the call holding `lease` for `ttl` (`bytes`:
    /// its serialized size, for the store's memory bound) and wakes the
    /// waiters. Nothing happens if the lease is no longer held.
    fn complete(
        &self,
        key: Arc<str>,
        lease: Lease,
        stored: Arc<Stored>,
        bytes: usize,
        ttl: Duration,
    ) -> BoxFuture<()>;

    /// Gives the key up (the leader failed or was dropped): one waiter
    /// goes ahead. Must not block.
    fn release(&self, key: Arc<str>, lease: Lease);
}

enum Entry {
    Running {
        fingerprint: Fingerprint,
        lease: Lease,
        // Dropped when the entry changes: every waiter wakes.
        _changed: watch::Sender<()>,
        waiters: watch::Receiver<()>,
    },
    Done {
        fingerprint: Fingerprint,
        stored: Arc<Stored>,
        bytes: usize,
        expires: Instant,
        seq: u64,
    },
}

#[derive(Default)]
struct Inner {
    map: HashMap<Arc<str>, Entry>,
    /// Stored answers in the order they were stored, for eviction.
    order: VecDeque<(Arc<str>, u64)>,
    bytes: usize,
    next_lease: u64,
    next_seq: u64,
}

/// The default, in-process store: a single-flight table (one leader per
/// key, the others wait for its answer) and the stored answers, bounded in
/// bytes (oldest first out when full; each answer counted by its
/// serialized size plus its key).
pub struct MemoryStore {
    inner: Mutex<Inner>,
    max_bytes: usize,
}

impl MemoryStore {
    /// A store keeping at most `max_bytes` of answers.
    pub fn new(max_bytes: usize) -> Self {
        MemoryStore {
            inner: Mutex::new(Inner::default()),
            max_bytes,
        }
    }

    /// Bytes of answers held now.
    pub fn bytes(&self) -> usize {
        self.lock().bytes
    }

    /// Answers held now.
    pub fn len(&self) -> usize {
        self.lock()
            .map
            .values()
            .filter(|e| matches!(e, Entry::Done { .. }))
            .count()
    }

    /// `true` when no answer is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The synchronous core of [`IdempotencyStore::begin`].
    pub fn begin_now(&self, key: Arc<str>, fingerprint: Fingerprint) -> Begin {
        let mut inner = self.lock();
        let now = Instant::now();
        match inner.map.get(&key) {
            Some(Entry::Done {
                fingerprint: stored_fp,
                stored,
                expires,
                ..
            }) if *expires > now => {
                return if *stored_fp == fingerprint {
                    Begin::Replay(stored.clone())
                } else {
                    Begin::Mismatch
                };
            }
            Some(Entry::Running {
                fingerprint: running_fp,
                waiters,
                ..
            }) => {
                if *running_fp != fingerprint {
                    return Begin::Mismatch;
                }
                let mut waiters = waiters.clone();
                return Begin::Busy(Box::pin(async move {
                    // Resolves when the sender is dropped (the entry
                    // changed).
                    let _ = waiters.changed().await;
                }));
            }
            _ => {}
        }
        // Nothing there, or an expired answer: this call leads.
        if let Some(Entry::Done { bytes, .. }) = inner.map.remove(&key) {
            inner.bytes = inner.bytes.saturating_sub(bytes);
        }
        inner.next_lease += 1;
        let lease = Lease(inner.next_lease);
        let (tx, rx) = watch::channel(());
        inner.map.insert(
            key,
            Entry::Running {
                fingerprint,
                lease,
                _changed: tx,
                waiters: rx,
            },
        );
        Begin::Lead(lease)
    }

    /// The synchronous core of [`IdempotencyStore::complete`].
    pub fn complete_now(
        &self,
        key: Arc<str>,
        lease: Lease,
        stored: Arc<Stored>,
        bytes: usize,
        ttl: Duration,
    ) {
        let mut inner = self.lock();
        let fingerprint = match inner.map.get(&key) {
            Some(Entry::Running {
                fingerprint,
                lease: held,
                ..
            }) if *held == lease => *fingerprint,
            _ => return,
        };
        let bytes = bytes.saturating_add(key.len());
        if bytes > self.max_bytes {
            // Too big to keep at all: give the key up.
            inner.map.remove(&key);
            return;
        }
        inner.next_seq += 1;
        let seq = inner.next_seq;
        inner.bytes += bytes;
        inner.order.push_back((key.clone(), seq));
        inner.map.insert(
            key,
            Entry::Done {
                fingerprint,
                stored,
                bytes,
                // A huge caller-given TTL keeps the answer "for ever" (a century)
                // rather than overflow.
                expires: Instant::now()
                    .checked_add(ttl)
                    .unwrap_or_else(|| Instant::now() + Duration::from_secs(100 * 365 * 86_400)),
                seq,
            },
        );
        // Oldest first out until within the bound.
        while inner.bytes > self.max_bytes {
            let Some((old, old_seq)) = inner.order.pop_front() else {
                break;
            };
            if matches!(inner.map.get(&old), Some(Entry::Done { seq, .. }) if *seq == old_seq) {
                if let Some(Entry::Done { bytes, .. }) = inner.map.remove(&old) {
                    inner.bytes = inner.bytes.saturating_sub(bytes);
                }
            }
        }
        // The order queue never outgrows the answers held by much: drop
        // entries of answers replaced or expired and removed.
        if inner.order.len() > 2 * inner.map.len() + 16 {
            let Inner { map, order, .. } = &mut *inner;
            order.retain(|(k, s)| matches!(map.get(k), Some(Entry::Done { seq, .. }) if seq == s));
        }
    }

    /// The synchronous core of [`IdempotencyStore::release`].
    pub fn release_now(&self, key: &Arc<str>, lease: Lease) {
        let mut inner = self.lock();
        if matches!(inner.map.get(key), Some(Entry::Running { lease: held, .. }) if *held == lease)
        {
            inner.map.remove(key);
        }
    }
}

impl Default for MemoryStore {
    /// 64 MiB of answers.
    fn default() -> Self {
        MemoryStore::new(64 << 20)
    }
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = self.lock();
        f.debug_struct("MemoryStore")
            .field("keys", &inner.map.len())
            .field("bytes", &inner.bytes)
            .field("max_bytes", &self.max_bytes)
            .finish()
    }
}

impl IdempotencyStore for MemoryStore {
    fn begin(
        &self,
        key: Arc<str>,
        fingerprint: Fingerprint,
    ) -> BoxFuture<Result<Begin, StoreError>> {
        let begun = self.begin_now(key, fingerprint);
        Box::pin(std::future::ready(Ok(begun)))
    }

    fn complete(
        &self,
        key: Arc<str>,
        lease: Lease,
        stored: Arc<Stored>,
        bytes: usize,
        ttl: Duration,
    ) -> BoxFuture<()> {
        self.complete_now(key, lease, stored, bytes, ttl);
        Box::pin(std::future::ready(()))
    }

    fn release(&self, key: Arc<str>, lease: Lease) {
        self.release_now(&key, lease);
    }
}
