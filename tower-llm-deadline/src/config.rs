//! The deadline layer's settings as data (`[deadline]` in a policy file).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::DeadlineLayer;

/// The deadline layer's settings: the same field names in Rust and in
/// TOML/JSON (milliseconds, `*_ms`).
///
/// `total_ms` is an `Option` so that a policy can tell a written value
/// (checked against the other values written) from the default.
///
/// ```
/// use std::time::Duration;
/// use tower_llm_deadline::{DeadlineConfig, DeadlineLayer};
///
/// let cfg: DeadlineConfig = serde_json::from_str(r#"{"total_ms": 1500}"#).unwrap();
/// assert_eq!(cfg.total(), Duration::from_millis(1500));
/// assert_eq!(DeadlineConfig::default().total(), Duration::from_secs(30));
/// let _layer = DeadlineLayer::from_config(&cfg).unwrap();
/// assert!(serde_json::from_str::<DeadlineConfig>(r#"{"total": 5}"#).is_err());
/// assert!(DeadlineConfig { total_ms: Some(0) }.validate().unwrap_err().contains("total_ms"));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DeadlineConfig {
    /// The whole call's budget, every retry and failover included (default
    /// 30,000).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total_ms: Option<u64>,
}

impl DeadlineConfig {
    /// The default `total_ms`.
    pub const DEFAULT_TOTAL_MS: u64 = 30_000;

    /// `total_ms`, or its default.
    pub fn total_ms(&self) -> u64 {
        self.total_ms.unwrap_or(Self::DEFAULT_TOTAL_MS)
    }

    /// The call's budget.
    pub fn total(&self) -> Duration {
        Duration::from_millis(self.total_ms())
    }

    /// Checks the settings.
    ///
    /// # Errors
    ///
    /// A message naming the field: a `total_ms` of 0.
    pub fn validate(&self) -> Result<(), String> {
        if self.total_ms == Some(0) {
            return Err("total_ms must be above 0".into());
        }
        Ok(())
    }
}

impl DeadlineLayer {
    /// A layer with `config`'s budget.
    ///
    /// # Errors
    ///
    /// What [`DeadlineConfig::validate`] finds.
    pub fn from_config(config: &DeadlineConfig) -> Result<Self, String> {
        config.validate()?;
        Ok(DeadlineLayer::new(config.total()))
    }
}
