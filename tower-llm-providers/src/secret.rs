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

/// The secrets a provider sends upstream (API key; AWS access key id,
/// secret and session token), removed from every upstream text we keep in
/// a [`Failure`](tower_llm_core::Failure) message: an upstream or a proxy
/// that echoes what it was sent must not put a key in our errors.
#[derive(Clone, Default)]
pub(crate) struct Scrub(Vec<ApiKey>);

impl Scrub {
    /// Removes each of `secrets` (those of at least 4 bytes: shorter ones
    /// would mangle ordinary words).
    pub(crate) fn new<'a>(secrets: impl IntoIterator<Item = &'a str>) -> Self {
        let mut secrets: Vec<&str> = secrets.into_iter().filter(|s| s.len() >= 4).collect();
        // Longest first: a secret that contains another is removed whole.
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        Scrub(secrets.into_iter().map(ApiKey::new).collect())
    }

    /// Removes nothing.
    pub(crate) fn none() -> Self {
        Scrub(Vec::new())
    }

    /// `text` with every secret replaced by `[redacted]`, *then* bounded
    /// to [`MAX_MESSAGE`](crate::MAX_MESSAGE) bytes (in that order, so a
    /// secret straddling the cut cannot leave its first part behind).
    pub(crate) fn message(&self, text: &str) -> String {
        let mut owned = None::<String>;
        for secret in &self.0 {
            let current = owned.as_deref().unwrap_or(text);
            if current.contains(secret.expose()) {
                owned = Some(current.replace(secret.expose(), "[redacted]"));
            }
        }
        crate::transport::bounded(owned.as_deref().unwrap_or(text))
    }
}

impl fmt::Debug for Scrub {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Scrub([redacted; {}])", self.0.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_that_contains_another_is_removed_whole() {
        let scrub = Scrub::new(["sk-abc", "sk-abc-def-123"]);
        let text = scrub.message("echo: sk-abc-def-123 and sk-abc");
        assert_eq!(text, "echo: [redacted] and [redacted]");
    }
}
