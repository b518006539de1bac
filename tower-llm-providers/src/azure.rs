//! Azure OpenAI: the Azure OpenAI [`Dialect`] (Chat Completions on a
//! deployment, in OpenAI's wire format with Azure's content-filter
//! annotations and error shapes), the [`AzureOpenAi`] service, and
//! [`AzureOpenAiEmbeddings`].
//!
//! Azure OpenAI serves each model *deployment* at its own path,
//! `{endpoint}/openai/deployments/{deployment}/chat/completions?api-version={v}`,
//! with the resource key in an `api-key` header. The request's `model` (a
//! fallback link's model) names the deployment; it is percent-encoded into
//! one path segment, so no name reaches another path. Bodies are OpenAI's
//! ([`openai::encode_with`]), and so are the
//! answers, with Azure's extra fields ignored: `prompt_filter_results` at
//! the top, `content_filter_results` per choice, and in streams a first
//! chunk with no choices that only carries the prompt's annotations (not
//! content: it is not the commit point).
//!
//! | Azure answers | becomes |
//! |---|---|
//! | 400, `code: "content_filter"` or `innererror.code: "ResponsibleAIPolicyViolation"` | failure `content_filtered` |
//! | 200 with `finish_reason: "content_filter"` | the answer, finish reason `ContentFilter` |
//! | 429 (`code: "429"`), `retry-after-ms` / `retry-after`, else "retry after N seconds" in the message | failure `rate_limited` with that wait |
//! | `code: "context_length_exceeded"`, or "maximum context length" | failure `context_window_exceeded` |
//! | `code` or `type` `insufficient_quota` | failure `quota_exhausted` |
//! | 401 / 403 | failure `auth` |
//! | 404 (`DeploymentNotFound`) | failure `not_found` |
//! | 5xx | failure `transient` |

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderMap, StatusCode};
use serde::Deserialize;
use serde_json::{Value, json};
use tower_llm_core::{
    ChatRequest, ChatResponse, EmbeddingRequest, EmbeddingResponse, Failure, FailureClass,
};

use crate::dialect::{Dialect, ErrorBody, SseWire};
use crate::failure::{Scrub, build_error, error_failure, to_json};
use crate::openai::{self, EmbeddingDialect, Embeddings, decode_embeddings_of, encode_embeddings};
use crate::provider::Provider;
use crate::secret::ApiKey;
use crate::stream::{SseEvent, StreamItem, openai_event_scrubbed};
use crate::transport::DEFAULT_MAX_BODY;
use crate::wire::secret_header;

/// The provider name in failures and metrics.
const PROVIDER: &str = "azure";

/// The `api-version` sent by default: the current generally available
/// version of the Azure OpenAI data-plane API.
pub const AZURE_API_VERSION: &str = "2024-10-21";

/// Azure's inner error code for a prompt its content filter refused.
const FILTER_INNER_CODE: &str = "ResponsibleAIPolicyViolation";

/// Settings of an [`AzureOpenAi`] service (and of
/// [`AzureOpenAiEmbeddings`]), and the Azure OpenAI [`Dialect`]:
/// `AzureOpenAi::new(transport, config)` is [`Provider::new`] with this
/// dialect.
///
/// The request's `model` names the deployment. `Debug` shows the key as
/// `[redacted]`.
///
/// ```
/// use tower::ServiceExt;
/// use tower_llm_core::{ChatRequest, Message};
/// use tower_llm_providers::mock::{Reply, ScriptedTransport};
/// use tower_llm_providers::{ApiKey, AzureOpenAi, AzureOpenAiConfig};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let config = AzureOpenAiConfig::new(ApiKey::new("azure-key"), "https://my-resource.openai.azure.com/");
/// assert_eq!(config.endpoint(), "https://my-resource.openai.azure.com");
/// assert_eq!(config.api_version(), "2024-10-21");
/// assert!(!format!("{config:?}").contains("azure-key"));
///
/// let transport = ScriptedTransport::new(Reply::openai_text("Hello"));
/// let azure = AzureOpenAi::new(transport.clone(), config);
/// let answer = azure
///     .oneshot(ChatRequest::new("gpt-4o-prod", vec![Message::user("Hi")]))
///     .await
///     .unwrap();
/// assert_eq!(answer.text(), "Hello");
/// assert_eq!(answer.provider.as_ref(), "azure");
/// let sent = &transport.received()[0];
/// assert_eq!(
///     sent.path,
///     "/openai/deployments/gpt-4o-prod/chat/completions?api-version=2024-10-21"
/// );
/// assert_eq!(sent.headers["api-key"], "azure-key");
/// assert!(sent.headers.get("authorization").is_none());
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct AzureOpenAiConfig {
    api_key: ApiKey,
    endpoint: Arc<str>,
    api_version: Arc<str>,
    max_body: usize,
    max_completion_tokens: bool,
}

impl AzureOpenAiConfig {
    /// The Azure OpenAI resource at `endpoint` (for example
    /// `https://my-resource.openai.azure.com`; a trailing `/` is
    /// trimmed), with its key `api_key`, speaking
    /// [`AZURE_API_VERSION`].
    pub fn new(api_key: ApiKey, endpoint: &str) -> Self {
        AzureOpenAiConfig {
            api_key,
            endpoint: endpoint.trim_end_matches('/').into(),
            api_version: AZURE_API_VERSION.into(),
            max_body: DEFAULT_MAX_BODY,
            max_completion_tokens: false,
        }
    }

    /// The `api-version` query parameter (default [`AZURE_API_VERSION`];
    /// preview versions such as `2025-01-01-preview` work too).
    #[must_use]
    pub fn with_api_version(mut self, api_version: &str) -> Self {
        self.api_version = api_version.into();
        self
    }

    /// The largest response body read (default 16 MiB); a larger one is an
    /// invalid-response failure.
    #[must_use]
    pub fn with_max_body(mut self, max_body: usize) -> Self {
        self.max_body = max_body;
        self
    }

    /// Send `max_tokens` as `max_completion_tokens`, as Azure's o-series
    /// deployments require (with an API version that knows the field).
    #[must_use]
    pub fn with_max_completion_tokens(mut self, on: bool) -> Self {
        self.max_completion_tokens = on;
        self
    }

    /// The resource endpoint, without a trailing `/`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The `api-version` sent.
    pub fn api_version(&self) -> &str {
        &self.api_version
    }

    /// `{endpoint}/openai/deployments/{deployment}/{operation}?api-version={v}`,
    /// the deployment percent-encoded into one path segment.
    fn url(&self, deployment: &str, operation: &str) -> Result<String, Failure> {
        let deployment = deployment_segment(deployment)?;
        Ok(format!(
            "{}/openai/deployments/{deployment}/{operation}?api-version={}",
            self.endpoint,
            percent_encode(&self.api_version),
        ))
    }

    /// A JSON POST of `body` to `url` with the key in `api-key` (a
    /// sensitive header).
    fn post(&self, url: String, body: Vec<u8>) -> Result<http::Request<Bytes>, Failure> {
        http::Request::post(url)
            .header(CONTENT_TYPE, "application/json")
            .header("api-key", secret_header(PROVIDER, self.api_key.expose())?)
            .body(Bytes::from(body))
            .map_err(build_error(PROVIDER))
    }
}

/// Azure OpenAI Chat Completions as a `Service<ChatRequest>`, over any
/// HTTP transport: the [`Provider`] speaking the Azure OpenAI dialect,
/// [`AzureOpenAiConfig`]. The request's `model` names the deployment.
///
/// Errors are classified from the status, the headers and Azure's error
/// body (see the [module docs](self)): a prompt refused by the content
/// filter is `content_filtered` (never retried). Streams
/// ([`streaming`](Provider::streaming)) send `stream: true` with
/// `stream_options.include_usage`, and commit at the first content, never
/// at the prompt's filter annotations.
pub type AzureOpenAi<T> = Provider<AzureOpenAiConfig, T>;

/// Azure OpenAI Embeddings
/// (`POST {endpoint}/openai/deployments/{deployment}/embeddings?api-version={v}`)
/// as a `Service<EmbeddingRequest>`: [`Embeddings`] with the Azure OpenAI
/// dialect. The request's `model` names the deployment, and is the
/// answer's model when the answer names none.
pub type AzureOpenAiEmbeddings<T> = Embeddings<AzureOpenAiConfig, T>;

/// Azure OpenAI Chat Completions:
/// `POST {endpoint}/openai/deployments/{model}/chat/completions?api-version={v}`
/// with `api-key`.
impl Dialect for AzureOpenAiConfig {
    type Wire = SseWire;

    fn provider(&self) -> &'static str {
        PROVIDER
    }

    fn encode(&self, req: &ChatRequest, stream: bool) -> Result<http::Request<Bytes>, Failure> {
        let url = self.url(&req.model, "chat/completions")?;
        let mut body = openai::encode_with(req, self.max_completion_tokens);
        if let Some(obj) = body.as_object_mut() {
            // `encode_with` follows `req.stream`; the call decides here.
            obj.insert("stream".into(), Value::Bool(stream));
            if stream {
                obj.insert("stream_options".into(), json!({"include_usage": true}));
            } else {
                obj.remove("stream_options");
            }
        }
        self.post(url, to_json(PROVIDER, &body)?)
    }

    fn decode(
        &self,
        _req: &ChatRequest,
        answer: &http::Response<Bytes>,
        latency: Duration,
    ) -> Result<ChatResponse, Failure> {
        let mut response = openai::decode(answer.body(), latency).map_err(as_azure)?;
        response.provider = PROVIDER.into();
        Ok(response)
    }

    fn error_body<'a>(&self, _headers: &'a HeaderMap, body: &'a [u8]) -> ErrorBody<'a> {
        error_body(body)
    }

    fn classify(&self, class: FailureClass, error: &ErrorBody<'_>) -> FailureClass {
        classify(class, error)
    }

    fn secrets(&self) -> Vec<&str> {
        vec![self.api_key.expose()]
    }

    /// The default composition, plus one hint: a 429 without
    /// `retry-after-ms` or `Retry-After` takes its wait from the message's
    /// "retry after N seconds".
    fn decode_error(&self, status: StatusCode, headers: &HeaderMap, body: &[u8]) -> Failure {
        let error = self.error_body(headers, body);
        let scrub = Scrub::new(self.secrets());
        let failure = error_failure(PROVIDER, status, headers, &error, &scrub, classify);
        if failure.class() != FailureClass::RateLimited || failure.retry_after().is_some() {
            return failure;
        }
        match failure.message().and_then(message_retry_after) {
            Some(wait) => failure.with_retry_after(wait),
            None => failure,
        }
    }

    fn wire(&self) -> SseWire {
        let scrub = Scrub::new(self.secrets());
        SseWire::new(move |event| stream_event(event, &scrub))
    }

    fn max_body(&self) -> usize {
        self.max_body
    }
}

/// Azure OpenAI Embeddings:
/// `POST {endpoint}/openai/deployments/{model}/embeddings?api-version={v}`
/// with `api-key`, OpenAI's body and answer.
impl EmbeddingDialect for AzureOpenAiConfig {
    fn encode_embeddings(&self, req: &EmbeddingRequest) -> Result<http::Request<Bytes>, Failure> {
        let url = self.url(&req.model, "embeddings")?;
        self.post(url, to_json(PROVIDER, &encode_embeddings(req))?)
    }

    fn decode_embeddings(
        &self,
        req: &EmbeddingRequest,
        answer: &http::Response<Bytes>,
        latency: Duration,
    ) -> Result<EmbeddingResponse, Failure> {
        decode_embeddings_of(PROVIDER, answer.body(), latency, Some(&req.model))
    }
}

/// The deployment name as one path segment: every byte but the unreserved
/// ones (RFC 3986: letters, digits, `-`, `.`, `_`, `~`) percent-encoded,
/// so `/`, `?`, `#`, `%`, spaces and non-ASCII cannot leave the segment.
/// An empty name, `.` and `..` (which a server would resolve to another
/// path) are refused.
fn deployment_segment(name: &str) -> Result<Cow<'_, str>, Failure> {
    if name.is_empty() || name == "." || name == ".." {
        return Err(Failure::new(FailureClass::BadRequest)
            .with_provider(PROVIDER)
            .with_message(
                "the deployment (the request's `model`) is empty, `.` or `..`: not a deployment name",
            ));
    }
    Ok(percent_encode(name))
}

/// `text` with every byte but the unreserved ones percent-encoded
/// (borrowed when nothing needs encoding).
fn percent_encode(text: &str) -> Cow<'_, str> {
    let unreserved = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~');
    if text.bytes().all(unreserved) {
        return Cow::Borrowed(text);
    }
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = String::with_capacity(text.len() * 3);
    for b in text.bytes() {
        if unreserved(b) {
            out.push(char::from(b));
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0xF)]));
        }
    }
    Cow::Owned(out)
}

/// An Azure error answer: OpenAI's `{"error": {...}}` envelope with an
/// inner error (`innererror` in the answers, `inner_error` in the API
/// spec), or a gateway's own `{"statusCode", "message"}`.
#[derive(Deserialize)]
struct AzureErrorAnswer<'a> {
    #[serde(borrow, default)]
    error: Option<AzureError<'a>>,
    /// A gateway's answer has its message at the top.
    #[serde(borrow, default)]
    message: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct AzureError<'a> {
    #[serde(borrow, default, rename = "type")]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    code: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    message: Option<Cow<'a, str>>,
    #[serde(borrow, default, alias = "inner_error")]
    innererror: Option<InnerError<'a>>,
}

#[derive(Deserialize)]
struct InnerError<'a> {
    #[serde(borrow, default)]
    code: Option<Cow<'a, str>>,
}

/// What an Azure error answer says, read leniently (garbage gives an empty
/// body). The code is the inner one when it names the content filter (it
/// says more than the outer one), else the outer one, else the inner one.
fn error_body(body: &[u8]) -> ErrorBody<'_> {
    let Ok(answer) = serde_json::from_slice::<AzureErrorAnswer<'_>>(body) else {
        return ErrorBody::default();
    };
    let Some(error) = answer.error else {
        return ErrorBody::new(None, None, answer.message);
    };
    let inner = error.innererror.and_then(|i| i.code);
    let code = match inner {
        Some(inner) if inner == FILTER_INNER_CODE => Some(inner),
        inner => error.code.or(inner),
    };
    ErrorBody::new(error.kind, code, error.message)
}

/// Sharpens the status's class from an Azure error body.
fn classify(class: FailureClass, b: &ErrorBody<'_>) -> FailureClass {
    let is = |s: &str| b.code() == Some(s) || b.kind() == Some(s);
    if is("content_filter") || is("content_policy_violation") || is(FILTER_INNER_CODE) {
        FailureClass::ContentFiltered
    } else if is("context_length_exceeded") || b.message().contains("maximum context length") {
        FailureClass::ContextWindowExceeded
    } else if is("insufficient_quota") {
        FailureClass::QuotaExhausted
    } else {
        class
    }
}

/// The wait named by a rate-limit message ("Please retry after 6
/// seconds.", "Try again in 2 seconds."), at most 9 digits. `message` is
/// a failure's, already bounded.
fn message_retry_after(message: &str) -> Option<Duration> {
    let lower = message.to_ascii_lowercase();
    ["retry after ", "try again in "].iter().find_map(|phrase| {
        let rest = &lower[lower.find(phrase)? + phrase.len()..];
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 || digits > 9 || !rest[digits..].trim_start().starts_with("second") {
            return None;
        }
        rest[..digits].parse().ok().map(Duration::from_secs)
    })
}

/// One event of an Azure stream: OpenAI's chunks (the prompt-annotation
/// chunk with no choices is skipped by the OpenAI decoder), and an in-band
/// error naming the content filter as a `content_filtered` failure.
fn stream_event(event: &SseEvent, scrub: &Scrub) -> Result<StreamItem, Failure> {
    // Only an event with an `error` key can be an error: the others are
    // not parsed twice.
    if event.data.contains("\"error\"") {
        let error = error_body(event.data.as_bytes());
        if classify(FailureClass::Transient, &error) == FailureClass::ContentFiltered {
            let mut failure = Failure::new(FailureClass::ContentFiltered).with_provider(PROVIDER);
            if let Some(message) = error.message.as_deref() {
                failure = failure.with_message(scrub.message(message));
            }
            return Err(failure);
        }
    }
    openai_event_scrubbed(event, scrub).map_err(as_azure)
}

/// A failure of the OpenAI decoders, as Azure's.
fn as_azure(failure: Failure) -> Failure {
    let renamed = failure
        .message()
        .and_then(|m| m.strip_prefix("malformed openai response: "))
        .map(|rest| format!("malformed {PROVIDER} response: {rest}"));
    let failure = failure.with_provider(PROVIDER);
    match renamed {
        Some(message) => failure.with_message(message),
        None => failure,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_encoding_keeps_unreserved_bytes_only() {
        assert!(matches!(percent_encode("gpt-4o_v2.1~x"), Cow::Borrowed(_)));
        assert_eq!(percent_encode("a/b?c#d e%"), "a%2Fb%3Fc%23d%20e%25");
        assert_eq!(percent_encode("é"), "%C3%A9");
    }

    #[test]
    fn retry_hints_in_messages() {
        let hint = message_retry_after;
        assert_eq!(
            hint("Requests ... have exceeded token rate limit. Please retry after 6 seconds."),
            Some(Duration::from_secs(6))
        );
        assert_eq!(
            hint("Rate limit is exceeded. Try again in 2 seconds."),
            Some(Duration::from_secs(2))
        );
        assert_eq!(hint("Please retry after a while"), None);
        assert_eq!(hint("retry after 1234567890 seconds"), None);
        assert_eq!(hint("retry after 5 minutes"), None);
        assert_eq!(hint(""), None);
    }
}
