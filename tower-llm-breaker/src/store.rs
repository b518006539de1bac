//! Where circuits live.

use std::collections::HashMap;
use std::fmt;
use std::hash::BuildHasher;

use foldhash::fast::RandomState;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use std::sync::{Arc, PoisonError, RwLock};
use tokio::time::Instant;

use crate::key::AsKey;
use crate::{BreakerKey, Circuit, KeyView};

/// The registry of circuits, one per [`BreakerKey`].
///
/// The layer reaches circuits only through this trait, so another store
/// (for example one that shares open circuits between replicas) can be
/// plugged in without touching the layer. A store is called on every
/// request (unless it declares its circuits stable): it must not block on
/// I/O.
pub trait BreakerStore: Send + Sync + fmt::Debug + 'static {
    /// The circuit of `key`, created closed if there is none.
    fn circuit(&self, key: BreakerKey) -> Arc<Circuit>;
    /// The circuit of a borrowed key, created closed if there is none. The
    /// default copies the key; a store that can look up by borrowed parts
    /// overrides it.
    fn circuit_for(&self, key: KeyView<'_>) -> Arc<Circuit> {
        self.circuit(key.to_key())
    }
    /// The circuit of `key`, if there is one.
    fn find(&self, key: &BreakerKey) -> Option<Arc<Circuit>>;
    /// Every circuit held.
    fn circuits(&self) -> Vec<Arc<Circuit>>;
    /// `true` lets each breaker service keep a weak reference to the
    /// circuit of the last key it served and reuse it for the next call
    /// with that key without asking the store. Return `true` only if the
    /// store never replaces the circuit of a key it holds, and
    /// [`retire`](Circuit::retire)s every circuit it forgets (as
    /// [`MemoryStore`] does). The default is `false`: the store is asked
    /// on every call.
    fn circuits_are_stable(&self) -> bool {
        false
    }
}

const SHARDS: usize = 16;

/// Keys are hashed with foldhash (keyed per process, as hashbrown's default
/// hasher is): several times cheaper than SipHash on short keys, and a
/// breaker service asks the store only when its key changes.
type Shard = RwLock<HashMap<BreakerKey, Arc<Circuit>, RandomState>>;

/// The default, in-process store: sixteen independently locked shards
/// (no global lock), bounded to `max_keys` circuits.
///
/// When full, idle circuits with no call in flight are evicted: closed
/// ones with no failure counted or none for `stale_after` (default 10
/// min), and open ones nobody has come back to probe for that long. A
/// sweep runs at most once a second. If nothing can go, a new key gets a
/// circuit that is not stored (it behaves as closed), so unbounded key
/// cardinality can never exhaust memory.
pub struct MemoryStore {
    shards: Box<[Shard]>,
    hasher: RandomState,
    len: AtomicUsize,
    max_keys: usize,
    stale_after: Duration,
    /// When the last eviction sweep ran (milliseconds after `origin`).
    last_sweep: AtomicU64,
    origin: Instant,
    make: Option<MakeCircuit>,
}

/// How a [`MemoryStore`] makes a new circuit (see
/// [`MemoryStore::with_circuits`]).
type MakeCircuit = Arc<dyn Fn(BreakerKey) -> Circuit + Send + Sync>;

impl MemoryStore {
    /// A store holding at most `max_keys` circuits (at least 1).
    pub fn new(max_keys: usize) -> Self {
        MemoryStore {
            shards: (0..SHARDS)
                .map(|_| RwLock::new(HashMap::default()))
                .collect(),
            hasher: RandomState::default(),
            len: AtomicUsize::new(0),
            max_keys: max_keys.max(1),
            stale_after: Duration::from_secs(600),
            last_sweep: AtomicU64::new(0),
            origin: Instant::now(),
            make: None,
        }
    }

    /// Makes each new circuit with `make` instead of [`Circuit::new`]: the
    /// hook of a store that keeps its local circuits here and attaches
    /// [`CircuitEvents`](crate::CircuitEvents) to each
    /// ([`Circuit::with_events`]). `make` must return a circuit for the key
    /// it is given; it runs only when a key is first seen, never on the
    /// hot path.
    #[must_use]
    pub fn with_circuits(
        mut self,
        make: impl Fn(BreakerKey) -> Circuit + Send + Sync + 'static,
    ) -> Self {
        self.make = Some(Arc::new(make));
        self
    }

    fn make(&self, key: BreakerKey) -> Arc<Circuit> {
        Arc::new(match &self.make {
            Some(make) => make(key),
            None => Circuit::new(key),
        })
    }

    /// How long a failure (or an ended cooldown) must lie in the past before
    /// its circuit may be evicted (default 10 minutes).
    #[must_use]
    pub fn with_stale_after(mut self, stale_after: Duration) -> Self {
        self.stale_after = stale_after;
        self
    }

    /// Circuits held now.
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// `true` when no circuit is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn shard(&self, key: KeyView<'_>) -> &Shard {
        let i = (self.hasher.hash_one(key) as usize) % SHARDS;
        &self.shards[i]
    }

    fn get_or_insert(&self, key: KeyView<'_>, owned: impl FnOnce() -> BreakerKey) -> Arc<Circuit> {
        let shard = self.shard(key);
        if let Some(c) = shard
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&key as &dyn AsKey)
        {
            return c.clone();
        }
        if self.len() >= self.max_keys {
            self.evict_idle();
            if self.len() >= self.max_keys {
                return self.make(owned());
            }
        }
        let mut map = shard.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(c) = map.get(&key as &dyn AsKey) {
            return c.clone();
        }
        let circuit = self.make(owned());
        map.insert(circuit.key().clone(), circuit.clone());
        self.len.fetch_add(1, Ordering::Relaxed);
        circuit
    }

    /// Drops idle circuits nobody is using, at most once a second.
    fn evict_idle(&self) {
        let now = u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX);
        let last = self.last_sweep.load(Ordering::Relaxed);
        if last != 0 && now.saturating_sub(last) < 1000 {
            return;
        }
        if self
            .last_sweep
            .compare_exchange(last, now.max(1), Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            return;
        }
        for shard in self.shards.iter() {
            let mut map = shard.write().unwrap_or_else(PoisonError::into_inner);
            let before = map.len();
            map.retain(|_, c| {
                let forget = c.is_idle(self.stale_after) && Arc::strong_count(c) == 1;
                if forget {
                    // Services holding it weakly ask the store again.
                    c.retire();
                }
                !forget
            });
            self.len.fetch_sub(before - map.len(), Ordering::Relaxed);
        }
    }
}

impl Default for MemoryStore {
    /// Up to 10,000 circuits.
    fn default() -> Self {
        MemoryStore::new(10_000)
    }
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("len", &self.len())
            .field("max_keys", &self.max_keys)
            .field("stale_after", &self.stale_after)
            .field("with_circuits", &self.make.is_some())
            .finish()
    }
}

impl BreakerStore for MemoryStore {
    fn circuit(&self, key: BreakerKey) -> Arc<Circuit> {
        let view = key.view();
        self.get_or_insert(view, || key.clone())
    }

    fn circuit_for(&self, key: KeyView<'_>) -> Arc<Circuit> {
        self.get_or_insert(key, || key.to_key())
    }

    fn find(&self, key: &BreakerKey) -> Option<Arc<Circuit>> {
        self.shard(key.view())
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
            .cloned()
    }

    /// A held circuit is never replaced, and a forgotten one is retired.
    fn circuits_are_stable(&self) -> bool {
        true
    }

    fn circuits(&self) -> Vec<Arc<Circuit>> {
        let mut all = Vec::with_capacity(self.len());
        for shard in self.shards.iter() {
            all.extend(
                shard
                    .read()
                    .unwrap_or_else(PoisonError::into_inner)
                    .values()
                    .cloned(),
            );
        }
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_key_same_circuit() {
        let store = MemoryStore::new(10);
        let a = store.circuit(BreakerKey::new("p", "m"));
        let b = store.circuit(BreakerKey::new("p", "m"));
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(store.len(), 1);
        assert!(store.find(&BreakerKey::new("p", "other")).is_none());
    }

    #[test]
    fn bounded_by_evicting_idle_circuits() {
        let store = MemoryStore::new(100);
        for i in 0..10_000 {
            drop(store.circuit(BreakerKey::new("p", format!("m{i}"))));
        }
        assert!(store.len() <= 100, "{}", store.len());
    }

    #[test]
    fn busy_circuits_are_kept_and_extra_keys_are_detached() {
        let store = MemoryStore::new(2);
        let held: Vec<_> = (0..2)
            .map(|i| store.circuit(BreakerKey::new("p", format!("m{i}"))))
            .collect();
        let extra = store.circuit(BreakerKey::new("p", "m-extra"));
        assert_eq!(store.len(), 2);
        assert!(store.find(extra.key()).is_none());
        assert!(store.find(held[0].key()).is_some());
    }
}
