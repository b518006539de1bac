//! What the store and its background tasks share: the local circuits and
//! the registry of their shared sides.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use tower_llm_breaker::{MemoryStore, Observer};

use crate::entry::Entry;
use crate::link::Link;

/// What the store and its tasks share.
pub(crate) struct Inner {
    pub(crate) local: MemoryStore,
    link: Arc<Link>,
    registry: Arc<Registry>,
    /// Told of every state change adopted from another replica.
    pub(crate) observer: Option<Observer>,
}

/// The entries of live circuits, by their Redis name (cold paths only:
/// a new circuit, a message, a resync).
#[derive(Default)]
pub(crate) struct Registry {
    entries: Mutex<HashMap<String, Weak<Entry>>>,
}

impl Registry {
    /// Registers a new circuit's entry under its Redis name.
    pub(crate) fn insert(&self, entry: &Arc<Entry>) {
        self.entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(entry.id.clone(), Arc::downgrade(entry));
    }
}

impl Inner {
    pub(crate) fn new(
        local: MemoryStore,
        link: Arc<Link>,
        registry: Arc<Registry>,
        observer: Option<Observer>,
    ) -> Self {
        Inner {
            local,
            link,
            registry,
            observer,
        }
    }

    /// The link (settings, up flags).
    pub(crate) fn link(&self) -> &Link {
        &self.link
    }

    pub(crate) fn entry(&self, id: &str) -> Option<Arc<Entry>> {
        self.registry
            .entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(id)
            .and_then(Weak::upgrade)
    }

    /// Every live entry (and forgets dead ones).
    pub(crate) fn entries(&self) -> Vec<Arc<Entry>> {
        let mut map = self
            .registry
            .entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        map.retain(|_, e| e.strong_count() > 0);
        map.values().filter_map(Weak::upgrade).collect()
    }
}
