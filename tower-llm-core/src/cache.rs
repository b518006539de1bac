//! How a response cache served an answer: what the cache layer
//! (`tower-llm-cache`) marks on the answers it passes and what a server
//! turns into `x-llm-cache`, `Age` and `x-llm-stale`.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Where an answer came from, as a response cache saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheStatus {
    /// Replayed from the cache, fresh: no provider was called.
    Hit,
    /// Not in the cache (or not taken from it): a provider answered.
    Miss,
    /// Every provider failed, and the cache answered with an answer
    /// stored earlier, older than the route keeps answers fresh: the
    /// stale-safe rung.
    Stale,
}

impl CacheStatus {
    /// `hit`, `miss` or `stale`: the value of the `x-llm-cache` header and
    /// of metric labels.
    pub const fn as_str(self) -> &'static str {
        match self {
            CacheStatus::Hit => "hit",
            CacheStatus::Miss => "miss",
            CacheStatus::Stale => "stale",
        }
    }
}

/// What a response cache did for one answer: its [`CacheStatus`] and, for
/// an answer taken from the cache, how long ago it was stored.
///
/// ```
/// use std::time::Duration;
/// use tower_llm_core::{CacheOutcome, CacheStatus};
///
/// let hit = CacheOutcome::new(CacheStatus::Hit, Duration::from_millis(61_900));
/// assert_eq!(hit.status.as_str(), "hit");
/// // The `Age` header: whole seconds, rounded down.
/// assert_eq!(hit.age_secs(), 61);
/// assert_eq!(CacheOutcome::MISS.age, Duration::ZERO);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CacheOutcome {
    /// Hit, miss or stale.
    pub status: CacheStatus,
    /// The stored answer's age (zero on a miss).
    #[serde(with = "crate::layer::serde_millis")]
    pub age: Duration,
}

impl CacheOutcome {
    /// An answer a provider made (nothing taken from the cache).
    pub const MISS: CacheOutcome = CacheOutcome {
        status: CacheStatus::Miss,
        age: Duration::ZERO,
    };

    /// `status` of an answer stored `age` ago.
    pub const fn new(status: CacheStatus, age: Duration) -> Self {
        CacheOutcome { status, age }
    }

    /// The age in whole seconds, rounded down: the `Age` header's value
    /// (RFC 9111 §5.1).
    pub const fn age_secs(&self) -> u64 {
        self.age.as_secs()
    }

    /// `true` for an answer taken from the cache (hit or stale).
    pub const fn is_from_cache(&self) -> bool {
        !matches!(self.status, CacheStatus::Miss)
    }
}
