//! Provider failures: classified from an error answer's status, headers
//! and body, or raised for an answer we cannot use; every upstream text
//! kept in one is scrubbed of the secrets sent and bounded.

use std::borrow::Cow;
use std::fmt;

use http::{HeaderMap, StatusCode};
use tower_llm_core::{Failure, FailureClass, Outcome, classify_status};

use crate::secret::ApiKey;

/// The longest provider message kept in a [`Failure`] (in bytes).
pub const MAX_MESSAGE: usize = 512;

/// Serialises a request body; a failure here is the caller's request.
pub(crate) fn to_json(
    provider: &'static str,
    body: &serde_json::Value,
) -> Result<Vec<u8>, Failure> {
    serde_json::to_vec(body).map_err(|e| {
        Failure::new(FailureClass::BadRequest)
            .with_provider(provider)
            .with_message(format!("cannot encode the request: {e}"))
    })
}

/// The failure for a request that `http` refused to build.
pub(crate) fn build_error(provider: &'static str) -> impl Fn(http::Error) -> Failure {
    move |e| {
        Failure::new(FailureClass::BadRequest)
            .with_provider(provider)
            .with_message(format!("cannot build the request: {e}"))
    }
}

/// Keeps at most [`MAX_MESSAGE`] bytes of a provider message, on a
/// character boundary.
pub(crate) fn bounded(message: &str) -> String {
    if message.len() <= MAX_MESSAGE {
        return message.to_owned();
    }
    let mut end = MAX_MESSAGE;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &message[..end])
}

/// What a provider's error answer said, as far as classification goes:
/// its error type, its code and its message. A
/// [`Dialect`](crate::Dialect) reads it from the answer
/// ([`Dialect::error_body`](crate::Dialect::error_body)) and sharpens the
/// status's class from it ([`Dialect::classify`](crate::Dialect::classify)).
/// Strings borrow from the body unless they hold JSON escapes.
///
/// ```
/// use tower_llm_providers::dialect::ErrorBody;
///
/// let body = br#"{"error": {"type": "rate_limit_error", "message": "slow down"}}"#;
/// let e = ErrorBody::envelope(body);
/// assert_eq!(e.kind(), Some("rate_limit_error"));
/// assert_eq!(e.code(), None);
/// assert_eq!(e.message(), "slow down");
/// assert_eq!(ErrorBody::envelope(b"<html>").message(), "");
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
pub struct ErrorBody<'a> {
    /// `error.type` (OpenAI, Anthropic) or the AWS error name.
    #[serde(borrow, default, rename = "type")]
    pub(crate) kind: Option<Cow<'a, str>>,
    /// `error.code` (OpenAI).
    #[serde(borrow, default)]
    pub(crate) code: Option<Cow<'a, str>>,
    /// The human message.
    #[serde(borrow, default)]
    pub(crate) message: Option<Cow<'a, str>>,
}

impl<'a> ErrorBody<'a> {
    /// An error of type `kind`, with `code` and `message`.
    pub fn new(
        kind: Option<Cow<'a, str>>,
        code: Option<Cow<'a, str>>,
        message: Option<Cow<'a, str>>,
    ) -> Self {
        ErrorBody {
            kind,
            code,
            message,
        }
    }

    /// The `{"error": {"type", "code", "message"}}` envelope of OpenAI
    /// and Anthropic error bodies (and of the servers that copy them),
    /// read leniently: garbage gives an empty body.
    pub fn envelope(body: &'a [u8]) -> Self {
        error_envelope(body)
    }

    /// The error's type (`error.type`, or the AWS error name).
    pub fn kind(&self) -> Option<&str> {
        self.kind.as_deref()
    }

    /// The error's code (`error.code`).
    pub fn code(&self) -> Option<&str> {
        self.code.as_deref()
    }

    /// The message, or `""`.
    pub fn message(&self) -> &str {
        self.message.as_deref().unwrap_or_default()
    }
}

#[derive(serde::Deserialize, Default)]
struct Envelope<'a> {
    #[serde(borrow, default)]
    error: Option<ErrorBody<'a>>,
}

/// The `{"error": {"type", "code", "message"}}` envelope of OpenAI and
/// Anthropic error bodies, read leniently: garbage gives an empty body.
pub(crate) fn error_envelope(body: &[u8]) -> ErrorBody<'_> {
    serde_json::from_slice::<Envelope<'_>>(body)
        .ok()
        .and_then(|e| e.error)
        .unwrap_or_default()
}

/// A failure for a non-2xx answer: the status and headers decide the class
/// (with `Retry-After` and `x-should-retry`), then `refine` may sharpen it
/// from the body (quota, context window, content filter). The provider's
/// message is kept with every secret of `scrub` removed, then bounded.
pub(crate) fn error_failure(
    provider: &'static str,
    status: StatusCode,
    headers: &HeaderMap,
    body: &ErrorBody<'_>,
    scrub: &Scrub,
    refine: impl FnOnce(FailureClass, &ErrorBody<'_>) -> FailureClass,
) -> Failure {
    let classified = match classify_status(status, headers) {
        Outcome::Failure(c) => c,
        // A 1xx/3xx where a 2xx was expected: not a usable answer.
        Outcome::Success { .. } => tower_llm_core::Classified::new(FailureClass::InvalidResponse),
    };
    let class = refine(classified.class, body);
    let mut failure = Failure::from_classified(tower_llm_core::Classified {
        class,
        ..classified
    })
    .with_status(status)
    .with_provider(provider);
    if let Some(message) = body.message.as_deref() {
        failure = failure.with_message(scrub.message(message));
    }
    failure
}

/// A failure for a 2xx answer whose body we cannot use. `what` is our own
/// text, never an upstream value.
pub(crate) fn invalid(provider: &'static str, what: impl std::fmt::Display) -> Failure {
    Failure::new(FailureClass::InvalidResponse)
        .with_provider(provider)
        .with_message(bounded(&format!("malformed {provider} response: {what}")))
}

/// A failure for a 2xx answer (or a streamed event) that is not the JSON we
/// expect. serde's own message quotes the offending value (`invalid type:
/// string "sk-..."`), and an upstream or proxy may echo a key there, so
/// only its category and position are kept, plus the name of a missing
/// field (the names are ours).
pub(crate) fn invalid_json(provider: &'static str, e: &serde_json::Error) -> Failure {
    invalid(provider, json_error(e))
}

/// What went wrong in a JSON document, without quoting any of it.
pub(crate) fn json_error(e: &serde_json::Error) -> String {
    use serde_json::error::Category;
    let (line, column) = (e.line(), e.column());
    match e.classify() {
        Category::Data => match missing_field(e) {
            Some(field) => format!("missing field `{field}` at line {line} column {column}"),
            None => format!("unexpected value at line {line} column {column}"),
        },
        Category::Eof => format!("truncated JSON at line {line} column {column}"),
        Category::Syntax => format!("invalid JSON at line {line} column {column}"),
        Category::Io => "unreadable JSON".to_owned(),
    }
}

/// The field named by serde's "missing field `name`" message: always one
/// of our own (derive-generated) field names, made only of identifier
/// characters.
fn missing_field(e: &serde_json::Error) -> Option<String> {
    let text = e.to_string();
    let rest = text.strip_prefix("missing field `")?;
    let name = &rest[..rest.find('`')?];
    (!name.is_empty()
        && name.len() <= 64
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'))
    .then(|| name.to_owned())
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
        bounded(owned.as_deref().unwrap_or(text))
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
    fn messages_are_bounded_on_char_boundaries() {
        let long = "é".repeat(MAX_MESSAGE);
        let b = bounded(&long);
        assert!(b.len() <= MAX_MESSAGE + '…'.len_utf8());
        assert!(b.ends_with('…'));
        assert_eq!(bounded("short"), "short");
    }

    #[test]
    fn a_secret_that_contains_another_is_removed_whole() {
        let scrub = Scrub::new(["sk-abc", "sk-abc-def-123"]);
        let text = scrub.message("echo: sk-abc-def-123 and sk-abc");
        assert_eq!(text, "echo: [redacted] and [redacted]");
    }
}
