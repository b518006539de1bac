//! Google Gemini (the Gemini Developer API, `generativelanguage.googleapis.com`):
//! the Gemini [`Dialect`] ([`GeminiConfig`]) and the [`Gemini`] service.
//!
//! | | |
//! |---|---|
//! | unary | `POST {base}/models/{model}:generateContent` |
//! | streaming | `POST {base}/models/{model}:streamGenerateContent?alt=sse` |
//! | key | the `x-goog-api-key` header (sensitive), never in the URL |
//!
//! The model name must be a plain path segment (ASCII letters, digits,
//! `-`, `_`, `.`, as `gemini-2.5-flash`): any other (a `/`, `?`, `#`, `:`,
//! `..`, a space, a non-ASCII character) is a bad-request failure, never
//! sent.
//!
//! # Request
//!
//! System messages become `systemInstruction`; user and tool turns are
//! `user`, assistant turns `model`, and neighbouring turns of the same role
//! are merged. Text is a `text` part, an image `data:` URL an `inlineData`
//! part, an `http(s)` image URL a `fileData` part (Gemini fetches it; its
//! `mimeType` is guessed from the extension for PNG, JPEG, WebP, HEIC and
//! HEIF, else left out). Assistant tool calls are `functionCall` parts;
//! a tool result is a `functionResponse` part named after the earlier
//! assistant tool call with its id (a result whose call is not in the
//! conversation is a bad-request failure): its `response` is the result
//! when it is a JSON object, else `{"output": "<the text>"}`. Tools are
//! `functionDeclarations` with their JSON Schema cut down to the subset
//! Gemini takes (unsupported keywords such as `additionalProperties`,
//! `$schema`, `$ref` are dropped, `oneOf` is read as `anyOf`, a `type`
//! list with `"null"` becomes `nullable`); the tool choice is
//! `toolConfig.functionCallingConfig` (`AUTO`, `NONE`, `ANY`, or `ANY`
//! with `allowedFunctionNames` for a named tool); sampling settings go to
//! `generationConfig`.
//!
//! # Answer
//!
//! The text of each candidate's parts (thought summaries left out),
//! `functionCall` parts as tool calls (with Gemini's `id` when it sends
//! one, else `call_0`, `call_1`, ... in the order of the answer), and
//! `finishReason`: `STOP` is stop (tool calls when the candidate called a
//! function), `MAX_TOKENS` length, `SAFETY`, `RECITATION`, `BLOCKLIST`,
//! `PROHIBITED_CONTENT`, `SPII` and the `IMAGE_*` filters content filter,
//! others other. Usage: `promptTokenCount` as prompt tokens,
//! `candidatesTokenCount` plus `thoughtsTokenCount` as completion tokens,
//! `cachedContentTokenCount` as cached input. A prompt Gemini blocked
//! (`promptFeedback.blockReason`, no candidates) is a
//! [`ContentFiltered`](tower_llm_core::FailureClass::ContentFiltered) failure.
//!
//! # Errors
//!
//! Gemini's error body is `{"error": {"code", "message", "status",
//! "details"}}`: `status` (`RESOURCE_EXHAUSTED`, ...) is the error's type,
//! and the reason of its `ErrorInfo` detail (`API_KEY_INVALID`), or else
//! the `quotaId` of its `QuotaFailure` detail, its code. Classes, after
//! the status's:
//!
//! | Gemini says | class |
//! |---|---|
//! | `RESOURCE_EXHAUSTED` | rate limited, the `RetryInfo.retryDelay` detail as `retry_after` (unless `Retry-After` says otherwise) |
//! | `RESOURCE_EXHAUSTED` for a daily quota (`quotaId` with `PerDay`) or a quota of `limit: 0` | quota exhausted (no wait of seconds helps) |
//! | `INVALID_ARGUMENT` "The input token count (..) exceeds the maximum number of tokens allowed" | context window exceeded |
//! | a reason `API_KEY_*` (Gemini answers a wrong key with 400 `API_KEY_INVALID`), `UNAUTHENTICATED`, `PERMISSION_DENIED` | auth |
//! | `UNAVAILABLE`, `INTERNAL`, `DEADLINE_EXCEEDED` | transient |
//!
//! # Streams
//!
//! Each server-sent event is a whole `GenerateContentResponse` with the
//! next piece of the answer. There is no terminator: a stream is complete
//! when its body ends cleanly after the finish reason, and truncated
//! otherwise. An `{"error": ...}` event is a failure classified as above,
//! its message scrubbed of the key.
//!
//! ```
//! use tower::ServiceExt;
//! use tower_llm_core::{ChatRequest, Message};
//! use tower_llm_providers::mock::{Reply, ScriptedTransport};
//! use tower_llm_providers::{ApiKey, Gemini, GeminiConfig};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let transport = ScriptedTransport::new(Reply::gemini_text("Hello!"));
//! let gemini = Gemini::new(transport.clone(), GeminiConfig::new(ApiKey::new("AIza-example")));
//! let req = ChatRequest::new("gemini-2.5-flash", vec![Message::user("Hi")]);
//! let answer = gemini.oneshot(req).await.unwrap();
//! assert_eq!(answer.text(), "Hello!");
//! let sent = &transport.received()[0];
//! assert_eq!(sent.path, "/v1beta/models/gemini-2.5-flash:generateContent");
//! assert!(sent.headers["x-goog-api-key"].is_sensitive());
//! # }
//! ```

mod decode;
mod encode;
mod stream;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderMap, StatusCode};
use tower_llm_core::{ChatRequest, ChatResponse, Failure, FailureClass};

use crate::dialect::{Dialect, ErrorBody, SseWire};
use crate::failure::{Scrub, build_error, to_json};
use crate::provider::Provider;
use crate::secret::ApiKey;
use crate::transport::DEFAULT_MAX_BODY;
use crate::wire::secret_header;

pub use decode::{decode, decode_error};
pub use encode::{UNSIGNED_CALL, encode};

/// The provider name in failures and metrics.
const PROVIDER: &str = "gemini";

/// The Gemini Developer API's base URL, the default.
pub const DEFAULT_BASE_URL: &str = "https://generativelanguage.googleapis.com/v1beta";

/// Settings of a [`Gemini`] service, and the Gemini [`Dialect`]:
/// `Gemini::new(transport, config)` is [`Provider::new`] with this dialect.
///
/// ```
/// use tower_llm_providers::{ApiKey, GeminiConfig};
///
/// let cfg = GeminiConfig::new(ApiKey::new("AIza-secret"));
/// assert_eq!(cfg.base_url(), "https://generativelanguage.googleapis.com/v1beta");
/// assert!(!format!("{cfg:?}").contains("AIza"));
/// let proxy = cfg.with_base_url("http://127.0.0.1:8080/v1beta/");
/// assert_eq!(proxy.base_url(), "http://127.0.0.1:8080/v1beta");
/// ```
#[derive(Debug, Clone)]
pub struct GeminiConfig {
    api_key: ApiKey,
    base_url: Arc<str>,
    max_body: usize,
}

impl GeminiConfig {
    /// The Gemini Developer API ([`DEFAULT_BASE_URL`]) with `api_key`.
    pub fn new(api_key: ApiKey) -> Self {
        GeminiConfig {
            api_key,
            base_url: DEFAULT_BASE_URL.into(),
            max_body: DEFAULT_MAX_BODY,
        }
    }

    /// Another base URL (a proxy, a test server; trailing `/` trimmed):
    /// the service posts to `{base_url}/models/{model}:generateContent`.
    #[must_use]
    pub fn with_base_url(mut self, base_url: &str) -> Self {
        self.base_url = base_url.trim_end_matches('/').into();
        self
    }

    /// The largest response body read (default 16 MiB); a larger one is an
    /// invalid-response failure.
    #[must_use]
    pub fn with_max_body(mut self, max_body: usize) -> Self {
        self.max_body = max_body;
        self
    }

    /// The base URL.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }
}

/// Google Gemini as a `Service<ChatRequest>`, over any HTTP transport: the
/// [`Provider`] speaking the Gemini dialect, [`GeminiConfig`]. See the
/// [module docs](self) for the mapping of requests, answers and errors.
pub type Gemini<T> = Provider<GeminiConfig, T>;

/// The Gemini Developer API: `POST {base_url}/models/{model}:generateContent`
/// (`:streamGenerateContent?alt=sse` for a stream) with `x-goog-api-key`.
impl Dialect for GeminiConfig {
    type Wire = SseWire;

    fn provider(&self) -> &'static str {
        PROVIDER
    }

    fn encode(&self, req: &ChatRequest, stream: bool) -> Result<http::Request<Bytes>, Failure> {
        let model = encode::model_segment(&req.model)?;
        let body = to_json(PROVIDER, &encode(req)?)?;
        let action = if stream {
            "streamGenerateContent?alt=sse"
        } else {
            "generateContent"
        };
        http::Request::post(format!("{}/models/{model}:{action}", self.base_url))
            .header(CONTENT_TYPE, "application/json")
            .header(
                "x-goog-api-key",
                secret_header(PROVIDER, self.api_key.expose())?,
            )
            .body(Bytes::from(body))
            .map_err(build_error(PROVIDER))
    }

    fn decode(
        &self,
        req: &ChatRequest,
        answer: &http::Response<Bytes>,
        latency: Duration,
    ) -> Result<ChatResponse, Failure> {
        decode(answer.body(), &req.model, latency)
    }

    fn error_body<'a>(&self, _headers: &'a HeaderMap, body: &'a [u8]) -> ErrorBody<'a> {
        decode::read_error(body).0
    }

    fn classify(&self, class: FailureClass, error: &ErrorBody<'_>) -> FailureClass {
        decode::classify(class, error)
    }

    fn secrets(&self) -> Vec<&str> {
        vec![self.api_key.expose()]
    }

    /// As the default, plus the `RetryInfo.retryDelay` detail as the
    /// failure's `retry_after` when no header gave one.
    fn decode_error(&self, status: StatusCode, headers: &HeaderMap, body: &[u8]) -> Failure {
        decode::error_answer(status, headers, body, &Scrub::new(self.secrets()))
    }

    fn wire(&self) -> SseWire {
        let mut events = stream::Events::new(Scrub::new(self.secrets()));
        SseWire::new(move |event| events.decode(event))
    }

    fn max_body(&self) -> usize {
        self.max_body
    }
}
