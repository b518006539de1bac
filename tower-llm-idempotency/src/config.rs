//! The idempotency layer's settings, as written in a policy file, and what
//! every clone of one layer shares.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tower_llm_core::Metrics;

use crate::store::IdempotencyStore;

/// The `Idempotency-Key` request header.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// What a call does when another call with its key is producing the
/// answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Concurrent {
    /// Wait for that answer (up to the call's own deadline) and return it;
    /// if that call fails or is dropped, one waiter goes ahead.
    #[default]
    Wait,
    /// Refuse at once: a `Conflict` failure (409,
    /// `idempotency_key_in_use`), the HTTP `Idempotency-Key` draft's
    /// behaviour.
    Reject,
}

/// The idempotency layer's settings. Field names are the policy file's.
///
/// ```
/// use tower_llm_idempotency::{Concurrent, IdempotencyConfig};
///
/// let config: IdempotencyConfig = toml::from_str("ttl_ms = 3600000\nconcurrent = \"reject\"").unwrap();
/// assert_eq!(config.concurrent, Concurrent::Reject);
/// config.validate().unwrap();
/// assert!(toml::from_str::<IdempotencyConfig>("ttl = 5").is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IdempotencyConfig {
    /// How long an answer is kept, in milliseconds, unless the call's
    /// [`IdempotencyKey`] says otherwise. Default 24 h.
    pub ttl_ms: u64,
    /// The in-process store's bound, in bytes of stored answers (oldest
    /// out first), counted as [`Stored::held_bytes`](crate::Stored::held_bytes):
    /// what the answers hold in memory, a stream's chunks as one compact
    /// buffer ([`StreamFrames`](crate::StreamFrames)). The process's
    /// resident memory grows by at most 2 × this (1.4 × measured with 96
    /// stored streams of 10,000 tokens against 16 MiB; the rest is the
    /// allocator's slack). Default 64 MiB.
    pub max_bytes: u64,
    /// The largest answer kept, in bytes (as `max_bytes` counts them); a
    /// larger one is returned but not stored. Default 1 MiB.
    pub max_entry_bytes: u64,
    /// Waiting for, or refusing, a concurrent duplicate. Default `wait`.
    pub concurrent: Concurrent,
    /// The longest key accepted, in bytes; a longer, empty or
    /// non-printable key is refused as a bad request. Default 255.
    pub max_key_bytes: usize,
}

impl Default for IdempotencyConfig {
    fn default() -> Self {
        IdempotencyConfig {
            ttl_ms: 24 * 3_600_000,
            max_bytes: 64 << 20,
            max_entry_bytes: 1 << 20,
            concurrent: Concurrent::Wait,
            max_key_bytes: 255,
        }
    }
}

impl IdempotencyConfig {
    /// Checks the settings.
    ///
    /// # Errors
    ///
    /// A zero `ttl_ms`, `max_bytes`, `max_entry_bytes` or `max_key_bytes`,
    /// or a `max_entry_bytes` over `max_bytes`; the error names the field.
    pub fn validate(&self) -> Result<(), InvalidIdempotencyConfig> {
        let invalid = |field, reason| Err(InvalidIdempotencyConfig { field, reason });
        if self.ttl_ms == 0 {
            return invalid("ttl_ms", "must be at least 1");
        }
        if self.max_bytes == 0 {
            return invalid("max_bytes", "must be at least 1");
        }
        if self.max_entry_bytes == 0 || self.max_entry_bytes > self.max_bytes {
            return invalid("max_entry_bytes", "must be between 1 and max_bytes");
        }
        if self.max_key_bytes == 0 {
            return invalid("max_key_bytes", "must be at least 1");
        }
        Ok(())
    }

    /// The default time to keep an answer.
    pub fn ttl(&self) -> Duration {
        Duration::from_millis(self.ttl_ms)
    }
}

/// An [`IdempotencyConfig`] that [`validate`](IdempotencyConfig::validate)
/// refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidIdempotencyConfig {
    field: &'static str,
    reason: &'static str,
}

impl InvalidIdempotencyConfig {
    /// The offending field, by its policy-file name.
    pub fn field(&self) -> &'static str {
        self.field
    }
}

impl fmt::Display for InvalidIdempotencyConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid idempotency config: `{}` {}",
            self.field, self.reason
        )
    }
}

impl std::error::Error for InvalidIdempotencyConfig {}

pub(crate) struct Shared {
    pub(crate) config: IdempotencyConfig,
    pub(crate) store: Arc<dyn IdempotencyStore>,
    pub(crate) metrics: Metrics,
}
