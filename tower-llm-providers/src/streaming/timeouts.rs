//! The first-token and idle timeouts of a stream.

use std::time::Duration;

/// The default first-token timeout: 30 s.
pub const DEFAULT_FIRST_TOKEN_TIMEOUT: Duration = Duration::from_secs(30);

/// The default inter-chunk idle timeout: 30 s.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// The timeouts of a streaming service (`[stream]` in a policy file:
/// `first_token_timeout_ms`, `idle_timeout_ms`, default 30,000 each).
///
/// ```
/// use std::time::Duration;
/// use tower_llm_providers::StreamTimeouts;
///
/// let t: StreamTimeouts = serde_json::from_str(r#"{"idle_timeout_ms": 5000}"#).unwrap();
/// assert_eq!(t.idle, Duration::from_secs(5));
/// assert_eq!(t.first_token, StreamTimeouts::default().first_token);
/// assert!(StreamTimeouts { idle: Duration::ZERO, ..t }.validate().unwrap_err().contains("idle_timeout_ms"));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StreamTimeouts {
    /// From sending the request to the first content frame
    /// (`first_token_timeout_ms`).
    #[serde(
        rename = "first_token_timeout_ms",
        with = "tower_llm_core::layer::serde_millis"
    )]
    pub first_token: Duration,
    /// Between two chunks after the commit point; keep-alive pings do not
    /// count as chunks (`idle_timeout_ms`).
    #[serde(
        rename = "idle_timeout_ms",
        with = "tower_llm_core::layer::serde_millis"
    )]
    pub idle: Duration,
}

impl StreamTimeouts {
    /// Checks the timeouts.
    ///
    /// # Errors
    ///
    /// A message naming the field: a zero timeout.
    pub fn validate(&self) -> Result<(), String> {
        if self.first_token.is_zero() {
            return Err("first_token_timeout_ms must be above 0".into());
        }
        if self.idle.is_zero() {
            return Err("idle_timeout_ms must be above 0".into());
        }
        Ok(())
    }
}

impl Default for StreamTimeouts {
    fn default() -> Self {
        StreamTimeouts {
            first_token: DEFAULT_FIRST_TOKEN_TIMEOUT,
            idle: DEFAULT_IDLE_TIMEOUT,
        }
    }
}
