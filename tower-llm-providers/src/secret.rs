//! Credentials that never show.

use std::fmt;

/// An API key. `Debug` and `Display` print `[redacted]`, so the key never
/// reaches a log line, an error message or a span by accident; only
/// [`expose`](ApiKey::expose) gives it out, for the one header that needs it.
///
/// ```
/// use tower_llm_providers::ApiKey;
///
/// let key = ApiKey::new("sk-live-0123456789");
/// assert_eq!(format!("{key:?}"), "ApiKey([redacted])");
/// assert_eq!(key.to_string(), "[redacted]");
/// assert_eq!(key.expose(), "sk-live-0123456789");
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    /// Wraps a key.
    pub fn new(key: impl Into<String>) -> Self {
        ApiKey(key.into())
    }

    /// Reads a key from the environment variable `var`, if set and not
    /// empty.
    pub fn from_env(var: &str) -> Option<Self> {
        std::env::var(var)
            .ok()
            .map(|k| k.trim().to_owned())
            .filter(|k| !k.is_empty())
            .map(ApiKey)
    }

    /// The key itself.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey([redacted])")
    }
}

impl fmt::Display for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}
