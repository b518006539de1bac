//! The retry layer's settings as data (`[retry]` in a policy file).

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tower_llm_core::MAX_ATTEMPTS_PER_CALL;

use crate::{Backoff, Jitter, RetryBudget, RetryLayer};

/// Everything a [`RetryLayer`] can be told, as data: the same field names
/// in Rust and in TOML/JSON (durations in milliseconds, `*_ms`).
///
/// A missing key takes its default. The keys that are checked against
/// others are `Option`s: unset, they take a default that fits what was
/// written (an unset `max_ms` is never below a written `base_ms`, an unset
/// `base_ms` never above a written `max_ms`), so a default never
/// contradicts a value the user wrote.
///
/// ```
/// use std::time::Duration;
/// use tower_llm_retry::{Jitter, RetryConfig, RetryLayer};
///
/// let cfg: RetryConfig = serde_json::from_str(r#"{
///     "max_attempts": 2,
///     "base_ms": 250, "max_ms": 3000, "jitter": "full",
///     "max_retry_after_ms": 10000,
///     "budget": {"ttl_ms": 10000, "min_per_sec": 2, "percent": 0.1}
/// }"#).unwrap();
/// assert_eq!(cfg.backoff().unwrap().jitter(), Jitter::Full);
/// let layer = RetryLayer::new().with_config(&cfg).unwrap();
/// # let _ = layer;
/// // Validation names the field.
/// let bad: RetryConfig = serde_json::from_str(r#"{"max_attempts": 0}"#).unwrap();
/// assert!(bad.validate().unwrap_err().to_string().contains("max_attempts"));
/// // An unknown key is refused.
/// assert!(serde_json::from_str::<RetryConfig>(r#"{"max_attempt": 2}"#).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetryConfig {
    /// Attempts per link, the first included: 1 to 16 (default 3).
    pub max_attempts: u8,
    /// One attempt's limit (default 30,000; never past the call's
    /// deadline).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempt_timeout_ms: Option<u64>,
    /// A retry starts only if its wait plus this much still fits before the
    /// deadline (default 1,000; see [`RetryLayer::with_min_attempt`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_attempt_ms: Option<u64>,
    /// A `Retry-After` longer than this is not waited for: the failure
    /// comes back at once (default 60,000).
    pub max_retry_after_ms: u64,
    /// The first backoff (default 200, or `max_ms` if that is set lower).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base_ms: Option<u64>,
    /// The backoff's growth per retry, ≥ 1 (default 4).
    pub factor: f64,
    /// The backoff cap (default 3,200, or `base_ms` if that is set higher).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_ms: Option<u64>,
    /// A fraction in `[0, 1]` (`0.2` is ±20 %), or `"equal"`, `"full"`,
    /// `"none"` (default 0.2).
    pub jitter: JitterSpec,
    /// The retry budget shared by every clone of the layer (default 10 s
    /// window, 1 retry per second, 20 % of first attempts).
    pub budget: BudgetConfig,
    /// When an attempt ends by its own timeout (or a stream's first-token
    /// timeout) and links follow this one in its fallback chain, fail over
    /// to the next link at once instead of retrying this one (default
    /// false: a timeout is retried like any transient failure, as seed 002
    /// asks). Turn it on when an upstream that accepts and never answers is
    /// a failure mode you expect (a wedged region, a silent load balancer):
    /// with 30 s attempts and 3 of them, it saves a minute per call.
    /// See [`RetryLayer::with_failover_on_timeout`].
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub failover_on_timeout: bool,
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig {
            max_attempts: 3,
            attempt_timeout_ms: None,
            min_attempt_ms: None,
            max_retry_after_ms: 60_000,
            base_ms: None,
            factor: 4.0,
            max_ms: None,
            jitter: JitterSpec::Fraction(0.2),
            budget: BudgetConfig::default(),
            failover_on_timeout: false,
        }
    }
}

/// The `jitter` key: a fraction or a named mode.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum JitterSpec {
    /// ± this fraction of the delay ([`Jitter::Proportional`]).
    Fraction(f64),
    /// `"equal"` (`[e/2, e]`), `"full"` (`[0, e]`) or `"none"`.
    Named(NamedJitter),
}

/// A named jitter mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NamedJitter {
    /// Uniform in `[e/2, e]` ([`Jitter::Equal`]).
    Equal,
    /// Uniform in `[0, e]` ([`Jitter::Full`]).
    Full,
    /// Exactly `e` ([`Jitter::None`]).
    None,
}

impl From<JitterSpec> for Jitter {
    fn from(spec: JitterSpec) -> Jitter {
        match spec {
            JitterSpec::Fraction(fraction) => Jitter::Proportional { fraction },
            JitterSpec::Named(NamedJitter::Equal) => Jitter::Equal,
            JitterSpec::Named(NamedJitter::Full) => Jitter::Full,
            JitterSpec::Named(NamedJitter::None) => Jitter::None,
        }
    }
}

/// The `budget` key: a [`RetryBudget`] as data.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BudgetConfig {
    /// The window deposits are remembered for, 1,000 to 60,000 (default
    /// 10,000).
    pub ttl_ms: u64,
    /// Retries always allowed per second, whatever the traffic (default 1).
    pub min_per_sec: u32,
    /// Retries allowed as a share of first attempts, in `[0, 10]` (default
    /// 0.2).
    pub percent: f64,
}

impl Default for BudgetConfig {
    fn default() -> Self {
        BudgetConfig {
            ttl_ms: 10_000,
            min_per_sec: 1,
            percent: 0.2,
        }
    }
}

impl BudgetConfig {
    /// The budget.
    ///
    /// # Errors
    ///
    /// As [`RetryBudget::new`].
    pub fn budget(&self) -> Result<RetryBudget, crate::InvalidBudget> {
        RetryBudget::new(
            Duration::from_millis(self.ttl_ms),
            self.min_per_sec,
            self.percent,
        )
    }
}

/// Why a [`RetryConfig`] was refused: every problem, each naming its field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidRetryConfig {
    problems: Vec<String>,
}

impl InvalidRetryConfig {
    /// The problems, one message each, each starting with its field.
    pub fn problems(&self) -> &[String] {
        &self.problems
    }
}

impl fmt::Display for InvalidRetryConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.problems.join("; "))
    }
}

impl std::error::Error for InvalidRetryConfig {}

impl RetryConfig {
    /// The default `attempt_timeout_ms`.
    pub const DEFAULT_ATTEMPT_TIMEOUT_MS: u64 = 30_000;
    /// The default `min_attempt_ms`.
    pub const DEFAULT_MIN_ATTEMPT_MS: u64 = 1_000;
    /// The default `base_ms`.
    pub const DEFAULT_BASE_MS: u64 = 200;
    /// The default `max_ms`.
    pub const DEFAULT_MAX_MS: u64 = 3_200;

    /// `attempt_timeout_ms`, or its default.
    pub fn attempt_timeout_ms(&self) -> u64 {
        self.attempt_timeout_ms
            .unwrap_or(Self::DEFAULT_ATTEMPT_TIMEOUT_MS)
    }

    /// `base_ms`, or its default (never above a written `max_ms`).
    pub fn base_ms(&self) -> u64 {
        self.base_ms.unwrap_or_else(|| {
            self.max_ms
                .map_or(Self::DEFAULT_BASE_MS, |max| max.min(Self::DEFAULT_BASE_MS))
        })
    }

    /// `max_ms`, or its default (never below a written `base_ms`).
    pub fn max_ms(&self) -> u64 {
        self.max_ms.unwrap_or_else(|| {
            self.base_ms
                .map_or(Self::DEFAULT_MAX_MS, |base| base.max(Self::DEFAULT_MAX_MS))
        })
    }

    /// The backoff schedule.
    ///
    /// # Errors
    ///
    /// `base_ms` above `max_ms`, a `factor` below 1 or not finite, a
    /// jitter fraction outside `[0, 1]`.
    pub fn backoff(&self) -> Result<Backoff, crate::InvalidBackoff> {
        Backoff::exponential(
            Duration::from_millis(self.base_ms()),
            self.factor,
            Duration::from_millis(self.max_ms()),
            self.jitter.into(),
        )
    }

    /// Checks every field.
    ///
    /// # Errors
    ///
    /// Every problem found, each message starting with its field's name.
    pub fn validate(&self) -> Result<(), InvalidRetryConfig> {
        let mut p = Vec::new();
        if self.max_attempts == 0 || usize::from(self.max_attempts) > MAX_ATTEMPTS_PER_CALL {
            p.push(format!(
                "max_attempts must be 1 to {MAX_ATTEMPTS_PER_CALL}, not {}",
                self.max_attempts
            ));
        }
        if self.attempt_timeout_ms == Some(0) {
            p.push("attempt_timeout_ms must be above 0".to_owned());
        }
        if self.base_ms() > self.max_ms() {
            p.push(format!(
                "base_ms ({}) is above max_ms ({})",
                self.base_ms(),
                self.max_ms()
            ));
        } else if let Err(e) = self.backoff() {
            p.push(format!("backoff: {e}"));
        }
        if let Err(e) = self.budget.budget() {
            p.push(format!("budget: {e}"));
        }
        if p.is_empty() {
            Ok(())
        } else {
            Err(InvalidRetryConfig { problems: p })
        }
    }
}

impl<C: Clone> RetryLayer<C> {
    /// This layer with every setting of `config` (a `min_attempt_ms` left
    /// unset keeps the layer's).
    ///
    /// # Errors
    ///
    /// What [`RetryConfig::validate`] finds.
    pub fn with_config(self, config: &RetryConfig) -> Result<Self, InvalidRetryConfig> {
        config.validate()?;
        let invalid = |problem: String| InvalidRetryConfig {
            problems: vec![problem],
        };
        let backoff = config
            .backoff()
            .map_err(|e| invalid(format!("backoff: {e}")))?;
        let budget = config
            .budget
            .budget()
            .map_err(|e| invalid(format!("budget: {e}")))?;
        let layer = self
            .with_max_attempts(config.max_attempts)
            .with_attempt_timeout(Duration::from_millis(config.attempt_timeout_ms()))
            .with_max_retry_after(Duration::from_millis(config.max_retry_after_ms))
            .with_backoff(backoff)
            .with_budget(budget)
            .with_failover_on_timeout(config.failover_on_timeout);
        Ok(match config.min_attempt_ms {
            Some(ms) => layer.with_min_attempt(Duration::from_millis(ms)),
            None => layer,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_layers() {
        let c = RetryConfig::default();
        assert!(c.validate().is_ok());
        assert_eq!(c.backoff().expect("backoff"), Backoff::seed_default());
    }

    #[test]
    fn every_problem_names_its_field() {
        let c = RetryConfig {
            max_attempts: 17,
            attempt_timeout_ms: Some(0),
            base_ms: Some(500),
            max_ms: Some(100),
            budget: BudgetConfig {
                ttl_ms: 1,
                ..BudgetConfig::default()
            },
            ..RetryConfig::default()
        };
        let e = c.validate().expect_err("invalid");
        let fields: Vec<&str> = e
            .problems()
            .iter()
            .map(|p| p.split(' ').next().unwrap_or_default())
            .collect();
        assert_eq!(
            fields,
            ["max_attempts", "attempt_timeout_ms", "base_ms", "budget:"]
        );
        let nan = RetryConfig {
            jitter: JitterSpec::Fraction(1.5),
            ..RetryConfig::default()
        };
        assert!(nan.validate().expect_err("jitter").problems()[0].starts_with("backoff"));
    }

    #[test]
    fn unset_bounds_follow_the_written_one() {
        let c = RetryConfig {
            base_ms: Some(5_000),
            ..RetryConfig::default()
        };
        assert_eq!((c.base_ms(), c.max_ms()), (5_000, 5_000));
        let c = RetryConfig {
            max_ms: Some(50),
            ..RetryConfig::default()
        };
        assert_eq!((c.base_ms(), c.max_ms()), (50, 50));
    }
}
