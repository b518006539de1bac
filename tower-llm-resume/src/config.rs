//! The settings of [`ResumeLayer`](crate::ResumeLayer) and
//! [`CompleteLayer`](crate::CompleteLayer), as written in a policy file.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The most continuations one stream may be given
/// ([`ResumeConfig::max_continuations`]).
pub const MAX_CONTINUATIONS: u8 = 4;

/// How a broken stream is continued. Field names are the policy file's.
///
/// ```
/// use tower_llm_resume::ResumeConfig;
///
/// let config: ResumeConfig = toml::from_str("max_continuations = 2").unwrap();
/// config.validate().unwrap();
/// assert_eq!(config.max_partial_bytes, 1 << 20); // the default
/// assert!(toml::from_str::<ResumeConfig>("max_continuation = 2").is_err()); // misspelt
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ResumeConfig {
    /// The most continuations one stream is given (each is a call through
    /// the route's chain). Default 1, at most [`MAX_CONTINUATIONS`] (4);
    /// 0 turns continuation off.
    pub max_continuations: u8,
    /// The most text (bytes of the first choice) a stream may have sent and
    /// still be continued: the layer keeps that text to send it back in the
    /// continuation request. Past it, the text is no longer kept and a
    /// failure passes through as it is. Default 1 MiB (1,048,576), at most
    /// 16 MiB.
    pub max_partial_bytes: usize,
}

impl Default for ResumeConfig {
    fn default() -> Self {
        ResumeConfig {
            max_continuations: 1,
            max_partial_bytes: 1 << 20,
        }
    }
}

impl ResumeConfig {
    /// Checks the settings.
    ///
    /// # Errors
    ///
    /// A `max_continuations` over [`MAX_CONTINUATIONS`], or a
    /// `max_partial_bytes` of 0 or over 16 MiB. Each error names its field.
    pub fn validate(&self) -> Result<(), InvalidConfig> {
        if self.max_continuations > MAX_CONTINUATIONS {
            return Err(InvalidConfig::new(
                "max_continuations",
                "must be at most 4 (each continuation is another call)",
            ));
        }
        if self.max_partial_bytes == 0 || self.max_partial_bytes > 16 << 20 {
            return Err(InvalidConfig::new(
                "max_partial_bytes",
                "must be within 1 ..= 16777216 (16 MiB)",
            ));
        }
        Ok(())
    }
}

/// How long and how much of a stream [`CompleteLayer`](crate::CompleteLayer)
/// holds before it gives up holding and streams on. Field names are the
/// policy file's.
///
/// ```
/// use std::time::Duration;
/// use tower_llm_resume::CompleteConfig;
///
/// let config: CompleteConfig = toml::from_str("max_bytes = 65536\nmax_ms = 5000").unwrap();
/// config.validate().unwrap();
/// assert_eq!(config.max_time(), Duration::from_secs(5));
/// assert!(toml::from_str::<CompleteConfig>("max_seconds = 5").is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CompleteConfig {
    /// The most a stream may hold, in bytes: its chunks' text and
    /// tool-call bytes, plus [`CHUNK_OVERHEAD`](crate::CHUNK_OVERHEAD) per
    /// chunk (so a flood of empty chunks is bounded too). Default 262,144
    /// (256 KiB), at most 64 MiB.
    pub max_bytes: usize,
    /// The longest a stream is held, in milliseconds from its commit
    /// point (its first content frame). Keep it below the link's
    /// per-attempt timeout: the layer sits inside the retry layer, whose
    /// attempt timeout now runs until the stream is complete. Default
    /// 10,000, at most 600,000.
    pub max_ms: u64,
}

impl Default for CompleteConfig {
    fn default() -> Self {
        CompleteConfig {
            max_bytes: 256 << 10,
            max_ms: 10_000,
        }
    }
}

impl CompleteConfig {
    /// Checks the settings.
    ///
    /// # Errors
    ///
    /// A `max_bytes` of 0 or over 64 MiB, or a `max_ms` of 0 or over
    /// 600,000. Each error names its field.
    pub fn validate(&self) -> Result<(), InvalidConfig> {
        if self.max_bytes == 0 || self.max_bytes > 64 << 20 {
            return Err(InvalidConfig::new(
                "max_bytes",
                "must be within 1 ..= 67108864 (64 MiB)",
            ));
        }
        if self.max_ms == 0 || self.max_ms > 600_000 {
            return Err(InvalidConfig::new("max_ms", "must be within 1 ..= 600000"));
        }
        Ok(())
    }

    /// `max_ms` as a duration.
    pub fn max_time(&self) -> Duration {
        Duration::from_millis(self.max_ms)
    }
}

/// A [`ResumeConfig`] or [`CompleteConfig`] that `validate` refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidConfig {
    field: &'static str,
    reason: &'static str,
}

impl InvalidConfig {
    fn new(field: &'static str, reason: &'static str) -> Self {
        InvalidConfig { field, reason }
    }

    /// The offending field, by its policy-file name.
    pub fn field(&self) -> &'static str {
        self.field
    }
}

impl fmt::Display for InvalidConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid config: `{}` {}", self.field, self.reason)
    }
}

impl std::error::Error for InvalidConfig {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_bad_field_is_named() {
        let resume = [
            (
                ResumeConfig {
                    max_continuations: 5,
                    ..ResumeConfig::default()
                },
                "max_continuations",
            ),
            (
                ResumeConfig {
                    max_partial_bytes: 0,
                    ..ResumeConfig::default()
                },
                "max_partial_bytes",
            ),
            (
                ResumeConfig {
                    max_partial_bytes: (16 << 20) + 1,
                    ..ResumeConfig::default()
                },
                "max_partial_bytes",
            ),
        ];
        for (config, field) in resume {
            let err = config.validate().expect_err(field);
            assert_eq!(err.field(), field);
            assert!(err.to_string().contains(field), "{err}");
        }
        let complete = [
            (
                CompleteConfig {
                    max_bytes: 0,
                    ..CompleteConfig::default()
                },
                "max_bytes",
            ),
            (
                CompleteConfig {
                    max_ms: 0,
                    ..CompleteConfig::default()
                },
                "max_ms",
            ),
            (
                CompleteConfig {
                    max_ms: 600_001,
                    ..CompleteConfig::default()
                },
                "max_ms",
            ),
        ];
        for (config, field) in complete {
            assert_eq!(config.validate().expect_err(field).field(), field);
        }
        ResumeConfig::default().validate().expect("valid");
        CompleteConfig::default().validate().expect("valid");
        ResumeConfig {
            max_continuations: MAX_CONTINUATIONS,
            ..ResumeConfig::default()
        }
        .validate()
        .expect("the most is allowed");
    }
}
