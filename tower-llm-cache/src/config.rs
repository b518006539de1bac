//! The cache's settings, as written in a policy file.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The request header that [`CacheConfig::stale_for_risk`] reads (the
/// same one a fallback policy's `allowed_for_risk` reads).
pub const RISK_HEADER: &str = "x-llm-risk";

/// A route's cache. Field names are the policy file's.
///
/// An answer is **fresh** for `ttl_ms` after it was stored: a request
/// asking the same thing (same tenant) gets it without a provider call.
/// It is then kept `stale_ms` longer for the **stale-safe rung**: when
/// every provider fails, the request gets it, flagged stale. A client's
/// `Cache-Control` can shorten both (`max-age`, `stale-if-error`), never
/// lengthen them.
///
/// ```
/// use std::time::Duration;
/// use tower_llm_cache::CacheConfig;
///
/// let config: CacheConfig = toml::from_str(r#"
/// ttl_ms = 600000
/// stale_ms = 86400000
/// stale_for_risk = ["LOW", "MEDIUM"]
/// "#).unwrap();
/// config.validate().unwrap();
/// assert_eq!(config.keep(), Duration::from_secs(600 + 86_400));
/// assert!(toml::from_str::<CacheConfig>("ttl = 5").is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CacheConfig {
    /// How long an answer is served as a hit, in milliseconds. `0`:
    /// answers are kept for the stale-safe rung only, never served
    /// fresh. Default 5 minutes.
    pub ttl_ms: u64,
    /// How long past `ttl_ms` an answer is kept for the stale-safe rung,
    /// in milliseconds. `0` (the default): no stale answers.
    pub stale_ms: u64,
    /// The `x-llm-risk` values (byte for byte) whose requests may get a
    /// stale answer; absent: every request may.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stale_for_risk: Option<Vec<String>>,
    /// Store answers that call tools. Default `false`: a tool call acts
    /// on the world, and replaying one repeats the act.
    pub store_tool_calls: bool,
    /// The largest answer stored, in bytes (as
    /// [`Stored::held_bytes`](tower_llm_idempotency::Stored::held_bytes)
    /// counts them); a larger one is returned but not stored. Default
    /// 1 MiB.
    pub max_entry_bytes: u64,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            ttl_ms: 300_000,
            stale_ms: 0,
            stale_for_risk: None,
            store_tool_calls: false,
            max_entry_bytes: 1 << 20,
        }
    }
}

/// The longest `ttl_ms + stale_ms` accepted: a year.
const MAX_KEEP_MS: u64 = 365 * 86_400_000;

impl CacheConfig {
    /// Checks the settings.
    ///
    /// # Errors
    ///
    /// `ttl_ms` and `stale_ms` both zero (nothing would ever be served),
    /// their sum over a year, a zero `max_entry_bytes`, an empty
    /// `stale_for_risk` (no request could get a stale answer: leave
    /// `stale_ms` out instead) or one without `stale_ms`; the error names
    /// the field.
    pub fn validate(&self) -> Result<(), InvalidCacheConfig> {
        let invalid = |field, reason| Err(InvalidCacheConfig { field, reason });
        if self.ttl_ms == 0 && self.stale_ms == 0 {
            return invalid("ttl_ms", "and stale_ms are both 0: nothing would be served");
        }
        if self.ttl_ms.saturating_add(self.stale_ms) > MAX_KEEP_MS {
            return invalid("stale_ms", "plus ttl_ms must be at most a year");
        }
        if self.max_entry_bytes == 0 {
            return invalid("max_entry_bytes", "must be at least 1");
        }
        match &self.stale_for_risk {
            Some(list) if list.is_empty() => {
                return invalid(
                    "stale_for_risk",
                    "is empty: no request could get a stale answer",
                );
            }
            Some(_) if self.stale_ms == 0 => {
                return invalid("stale_for_risk", "means nothing without stale_ms");
            }
            _ => {}
        }
        Ok(())
    }

    /// How long an answer is served fresh.
    pub fn ttl(&self) -> Duration {
        Duration::from_millis(self.ttl_ms)
    }

    /// How long past its freshness an answer is kept for the stale rung.
    pub fn stale(&self) -> Duration {
        Duration::from_millis(self.stale_ms)
    }

    /// How long a store keeps an answer: `ttl_ms + stale_ms`.
    pub fn keep(&self) -> Duration {
        Duration::from_millis(self.ttl_ms.saturating_add(self.stale_ms))
    }
}

/// A [`CacheConfig`] that [`validate`](CacheConfig::validate) refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidCacheConfig {
    field: &'static str,
    reason: &'static str,
}

impl InvalidCacheConfig {
    /// The offending field, by its policy-file name.
    pub fn field(&self) -> &'static str {
        self.field
    }
}

impl fmt::Display for InvalidCacheConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid cache config: `{}` {}", self.field, self.reason)
    }
}

impl std::error::Error for InvalidCacheConfig {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_that_could_never_serve_are_refused_by_field() {
        let field = |c: CacheConfig| c.validate().unwrap_err().field();
        let base = CacheConfig::default();
        assert_eq!(
            field(CacheConfig {
                ttl_ms: 0,
                ..base.clone()
            }),
            "ttl_ms"
        );
        assert_eq!(
            field(CacheConfig {
                stale_ms: u64::MAX,
                ..base.clone()
            }),
            "stale_ms"
        );
        assert_eq!(
            field(CacheConfig {
                max_entry_bytes: 0,
                ..base.clone()
            }),
            "max_entry_bytes"
        );
        assert_eq!(
            field(CacheConfig {
                stale_for_risk: Some(vec![]),
                stale_ms: 1,
                ..base.clone()
            }),
            "stale_for_risk"
        );
        assert_eq!(
            field(CacheConfig {
                stale_for_risk: Some(vec!["LOW".into()]),
                ..base.clone()
            }),
            "stale_for_risk"
        );
        CacheConfig {
            ttl_ms: 0,
            stale_ms: 1,
            ..base
        }
        .validate()
        .unwrap();
    }
}

/// The in-process store's settings (a policy file's top-level `[cache]`):
/// one [`MemoryCache`](crate::MemoryCache) for every route of a server.
///
/// ```
/// use tower_llm_cache::CacheStoreConfig;
///
/// let config: CacheStoreConfig = toml::from_str("max_bytes = 1048576").unwrap();
/// config.validate().unwrap();
/// assert_eq!(CacheStoreConfig::default().max_bytes, 64 << 20);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CacheStoreConfig {
    /// The bytes of answers held at most (oldest stored out first),
    /// counted as [`Stored::held_bytes`](tower_llm_idempotency::Stored::held_bytes)
    /// plus each key: what the answers hold in memory, a stream's chunks
    /// as one compact buffer. Default 64 MiB.
    pub max_bytes: u64,
}

impl Default for CacheStoreConfig {
    fn default() -> Self {
        CacheStoreConfig {
            max_bytes: 64 << 20,
        }
    }
}

impl CacheStoreConfig {
    /// Checks the settings.
    ///
    /// # Errors
    ///
    /// A zero `max_bytes`.
    pub fn validate(&self) -> Result<(), InvalidCacheConfig> {
        if self.max_bytes == 0 {
            return Err(InvalidCacheConfig {
                field: "max_bytes",
                reason: "must be at least 1",
            });
        }
        Ok(())
    }

    /// The in-process store of these settings.
    pub fn memory(&self) -> crate::MemoryCache {
        crate::MemoryCache::new(usize::try_from(self.max_bytes).unwrap_or(usize::MAX))
    }
}
