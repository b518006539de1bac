//! [`SilenceGuards`]: the opt-in guards against an upstream that goes
//! silent or garbles its stream, as written in a policy file.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::learned::{FirstTokenLimit, FirstTokenLimitConfig, InvalidFirstTokenLimit};
use super::malformed::MalformedChunks;

/// The opt-in guards of one link against an upstream that goes silent or
/// garbles its stream; every one is off by default, leaving the fixed
/// first-token timeout (30 s) and the stream failing at a malformed event.
/// The field names are the policy file's.
///
/// | field | applies to | set with |
/// |---|---|---|
/// | `head_timeout_ms` | the provider (unary calls and streams) | [`Provider::with_head_timeout`](crate::Provider::with_head_timeout) |
/// | `learned_first_token` | the streaming service | [`Streaming::with_learned_first_token`](crate::Streaming::with_learned_first_token) |
/// | `malformed_chunks` | the streaming service | [`Streaming::with_malformed_chunks`](crate::Streaming::with_malformed_chunks) |
///
/// ```
/// use std::time::Duration;
/// use tower_llm_providers::streaming::{MalformedChunks, SilenceGuards};
///
/// let guards: SilenceGuards = serde_json::from_str(r#"{
///     "head_timeout_ms": 5000,
///     "learned_first_token": {"quantile": 0.95},
///     "malformed_chunks": "skip"
/// }"#).unwrap();
/// guards.validate().unwrap();
/// assert_eq!(guards.head_timeout(), Some(Duration::from_secs(5)));
/// assert_eq!(guards.malformed_chunks, MalformedChunks::Skip);
/// let limit = guards.first_token_limit().unwrap().expect("learned");
/// assert_eq!(limit.config().factor, 2.0); // the default
///
/// let off = SilenceGuards::default();
/// assert_eq!(off.head_timeout(), None);
/// assert!(off.first_token_limit().unwrap().is_none());
/// let bad = SilenceGuards { head_timeout_ms: Some(0), ..off };
/// assert_eq!(bad.validate().unwrap_err().field(), "head_timeout_ms");
/// ```
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SilenceGuards {
    /// The most time from sending a request to its answer's head (status
    /// and headers), in milliseconds, for unary calls and streams; more is
    /// a timeout failure. Default: unset (no head limit; the retry layer's
    /// attempt timeout still bounds a whole attempt).
    pub head_timeout_ms: Option<u64>,
    /// Learn the first-token limit from the link's own streams
    /// ([`FirstTokenLimitConfig`]: `quantile`, `factor`, `floor_ms`,
    /// `cap_ms`, `min_samples`). Default: unset (the fixed first-token
    /// timeout).
    pub learned_first_token: Option<FirstTokenLimitConfig>,
    /// What a malformed event after a stream's commit point does: `"fail"`
    /// (the default) or `"skip"` ([`MalformedChunks`]).
    pub malformed_chunks: MalformedChunks,
}

impl SilenceGuards {
    /// Checks the settings.
    ///
    /// # Errors
    ///
    /// A `head_timeout_ms` of 0, or `learned_first_token` settings that
    /// [`FirstTokenLimitConfig::validate`] refuses.
    pub fn validate(&self) -> Result<(), InvalidSilenceGuards> {
        if self.head_timeout_ms == Some(0) {
            return Err(InvalidSilenceGuards {
                field: "head_timeout_ms",
                learned: None,
            });
        }
        if let Some(config) = &self.learned_first_token {
            config.validate().map_err(|e| InvalidSilenceGuards {
                field: "learned_first_token",
                learned: Some(e),
            })?;
        }
        Ok(())
    }

    /// The response-head timeout, when set.
    pub fn head_timeout(&self) -> Option<Duration> {
        self.head_timeout_ms.map(Duration::from_millis)
    }

    /// A fresh learned first-token limit of these settings (one per link;
    /// keep it across reloads to keep what it learned), or `None` when
    /// `learned_first_token` is unset.
    ///
    /// # Errors
    ///
    /// Settings that [`FirstTokenLimitConfig::validate`] refuses.
    pub fn first_token_limit(&self) -> Result<Option<FirstTokenLimit>, InvalidFirstTokenLimit> {
        self.learned_first_token
            .clone()
            .map(FirstTokenLimit::new)
            .transpose()
    }
}

/// [`SilenceGuards`] that [`validate`](SilenceGuards::validate) refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidSilenceGuards {
    field: &'static str,
    learned: Option<InvalidFirstTokenLimit>,
}

impl InvalidSilenceGuards {
    /// The offending field, by its policy-file name: `head_timeout_ms` or
    /// `learned_first_token`.
    pub fn field(&self) -> &'static str {
        self.field
    }

    /// What is wrong inside `learned_first_token`, if that is the field.
    pub fn learned_first_token(&self) -> Option<&InvalidFirstTokenLimit> {
        self.learned.as_ref()
    }
}

impl fmt::Display for InvalidSilenceGuards {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.learned {
            Some(e) => write!(f, "invalid silence guards: `{}`: {e}", self.field),
            None => write!(
                f,
                "invalid silence guards: `{}` must be above 0",
                self.field
            ),
        }
    }
}

impl std::error::Error for InvalidSilenceGuards {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.learned
            .as_ref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_learned_limit_names_both_fields() {
        let guards = SilenceGuards {
            learned_first_token: Some(FirstTokenLimitConfig {
                min_samples: 0,
                ..FirstTokenLimitConfig::default()
            }),
            ..SilenceGuards::default()
        };
        let err = guards.validate().expect_err("invalid");
        assert_eq!(err.field(), "learned_first_token");
        assert_eq!(
            err.learned_first_token().map(InvalidFirstTokenLimit::field),
            Some("min_samples")
        );
        assert_eq!(
            err.to_string(),
            "invalid silence guards: `learned_first_token`: invalid learned first-token limit: `min_samples` must be from 1 to 256"
        );
        assert!(guards.first_token_limit().is_err());
    }
}
