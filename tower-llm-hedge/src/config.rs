//! The hedge layer's settings, as written in a policy file.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// When and how often to hedge. Field names are the policy file's.
///
/// ```
/// use tower_llm_hedge::HedgeConfig;
///
/// let config: HedgeConfig = toml::from_str(
///     "quantile = 0.95\nfloor_ms = 50\ndelay_ms = 400\nbudget_ratio = 0.05",
/// )
/// .unwrap();
/// config.validate().unwrap();
/// assert_eq!(config.min_useful_ms, 1_000); // the default
/// assert!(toml::from_str::<HedgeConfig>("delay = 400").is_err()); // misspelt
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HedgeConfig {
    /// The hedge delay in milliseconds: how long the first attempt may go
    /// without answering (or, streaming, without committing its first
    /// content frame) before a hedge starts. With `quantile` set, the delay
    /// used until `min_samples` latencies have been seen. Default 500.
    pub delay_ms: u64,
    /// Learn the delay instead: this quantile (strictly between 0 and 1,
    /// for example `0.95`) of the layer's recent times to answer (or to
    /// commit), over a sliding window of 10 to 20 s. Default: unset (the
    /// fixed `delay_ms`).
    pub quantile: Option<f64>,
    /// The least a learned delay may be, in milliseconds, so a run of fast
    /// answers cannot make every call hedge. Default 50.
    pub floor_ms: u64,
    /// Latencies to see before a learned delay replaces `delay_ms`.
    /// Default 20.
    pub min_samples: u32,
    /// The share of calls that may be hedged over a 10 s window (default
    /// `0.1`, 10 %): the hedge budget, so a slow-everything storm adds at
    /// most this much upstream load.
    pub budget_ratio: f64,
    /// Hedges allowed per second whatever the ratio (default 1), so a
    /// quiet service still hedges now and then: the budget allows
    /// `max(budget_ratio × calls, budget_min_per_sec × 10)` hedges over
    /// 10 s (the larger, not the sum).
    pub budget_min_per_sec: u32,
    /// No hedge starts when less than this is left before the call's
    /// deadline, in milliseconds (an attempt that cannot finish is only
    /// load). Default 1,000.
    pub min_useful_ms: u64,
}

impl Default for HedgeConfig {
    fn default() -> Self {
        HedgeConfig {
            delay_ms: 500,
            quantile: None,
            floor_ms: 50,
            min_samples: 20,
            budget_ratio: 0.1,
            budget_min_per_sec: 1,
            min_useful_ms: 1_000,
        }
    }
}

impl HedgeConfig {
    /// Checks the settings.
    ///
    /// # Errors
    ///
    /// A zero `delay_ms`, a `quantile` outside (0, 1), a `budget_ratio`
    /// outside [0, 1], a `min_samples` of 0, or a `floor_ms` over 60 s.
    /// Each error names its field.
    pub fn validate(&self) -> Result<(), InvalidHedgeConfig> {
        let invalid = |field, reason| Err(InvalidHedgeConfig { field, reason });
        if self.delay_ms == 0 {
            return invalid(
                "delay_ms",
                "must be at least 1 (a zero delay sends every call twice)",
            );
        }
        if let Some(q) = self.quantile {
            if !(q > 0.0 && q < 1.0) {
                return invalid("quantile", "must be strictly between 0 and 1");
            }
        }
        if !(0.0..=1.0).contains(&self.budget_ratio) {
            return invalid("budget_ratio", "must be within [0, 1]");
        }
        if self.min_samples == 0 {
            return invalid("min_samples", "must be at least 1");
        }
        if self.floor_ms > 60_000 {
            return invalid("floor_ms", "must be at most 60000");
        }
        Ok(())
    }

    /// The fixed delay (or the delay before enough samples are learned).
    pub fn delay(&self) -> Duration {
        Duration::from_millis(self.delay_ms)
    }

    /// The floor of a learned delay.
    pub fn floor(&self) -> Duration {
        Duration::from_millis(self.floor_ms)
    }

    /// The least time before the deadline for a hedge to start.
    pub fn min_useful(&self) -> Duration {
        Duration::from_millis(self.min_useful_ms)
    }

    /// A fresh hedge budget of these settings: `budget_ratio` of the calls
    /// over 10 s, at least `budget_min_per_sec` a second. What
    /// [`HedgeLayer::new`](crate::HedgeLayer::new) builds; make one
    /// yourself to share it between layers
    /// ([`HedgeLayer::with_budget`](crate::HedgeLayer::with_budget)), say
    /// the unary and the streaming stacks of one link.
    ///
    /// # Errors
    ///
    /// A `budget_ratio` the budget refuses (outside [0, 1]).
    pub fn budget(&self) -> Result<tower_llm_retry::RetryBudget, InvalidHedgeConfig> {
        tower_llm_retry::RetryBudget::new(
            Duration::from_secs(10),
            self.budget_min_per_sec,
            self.budget_ratio,
        )
        .map_err(|_| InvalidHedgeConfig::budget())
    }
}

/// A [`HedgeConfig`] that [`validate`](HedgeConfig::validate) refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidHedgeConfig {
    field: &'static str,
    reason: &'static str,
}

impl InvalidHedgeConfig {
    pub(crate) fn budget() -> Self {
        InvalidHedgeConfig {
            field: "budget_ratio",
            reason: "is not a valid budget",
        }
    }

    /// The offending field, by its policy-file name.
    pub fn field(&self) -> &'static str {
        self.field
    }
}

impl fmt::Display for InvalidHedgeConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid hedge config: `{}` {}", self.field, self.reason)
    }
}

impl std::error::Error for InvalidHedgeConfig {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_bad_field_is_named() {
        let bad = [
            (
                HedgeConfig {
                    delay_ms: 0,
                    ..HedgeConfig::default()
                },
                "delay_ms",
            ),
            (
                HedgeConfig {
                    quantile: Some(1.0),
                    ..HedgeConfig::default()
                },
                "quantile",
            ),
            (
                HedgeConfig {
                    quantile: Some(f64::NAN),
                    ..HedgeConfig::default()
                },
                "quantile",
            ),
            (
                HedgeConfig {
                    budget_ratio: 1.5,
                    ..HedgeConfig::default()
                },
                "budget_ratio",
            ),
            (
                HedgeConfig {
                    min_samples: 0,
                    ..HedgeConfig::default()
                },
                "min_samples",
            ),
            (
                HedgeConfig {
                    floor_ms: 60_001,
                    ..HedgeConfig::default()
                },
                "floor_ms",
            ),
        ];
        for (config, field) in bad {
            let err = config.validate().expect_err(field);
            assert_eq!(err.field(), field);
            assert!(err.to_string().contains(field), "{err}");
        }
        HedgeConfig::default()
            .validate()
            .expect("the default is valid");
    }
}
