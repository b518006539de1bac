//! The shape of a provider's wire format: the [`Dialect`] trait, and the
//! pieces a dialect is made of ([`ErrorBody`], [`Wire`], [`SseWire`]).
//!
//! A dialect knows how one provider speaks: how a [`ChatRequest`] becomes
//! an HTTP request (URL, headers, body), how an answer becomes a
//! [`ChatResponse`], how an error answer becomes a classified
//! [`Failure`], and how a streamed answer's bytes become chunks. It knows
//! nothing of transports, readiness, timeouts, metrics or the commit point
//! of a stream: [`Provider`](crate::Provider) does all of that, once, for
//! every dialect. OpenAI ([`OpenAiConfig`](crate::OpenAiConfig)),
//! Anthropic ([`AnthropicConfig`](crate::AnthropicConfig)) and Bedrock
//! ([`BedrockConfig`](crate::BedrockConfig)) are dialects: a provider's
//! settings are its dialect, so `OpenAi::new(transport, config)` is
//! `Provider::new(transport, config)`.
//!
//! # Writing a dialect
//!
//! A new provider (Azure OpenAI, Gemini, ...) is a settings type that
//! implements [`Dialect`]; four methods are required, the rest have
//! defaults that fit most JSON APIs:
//!
//! | step | method | default |
//! |---|---|---|
//! | name in failures, attempt records and metrics | [`provider`](Dialect::provider) | (required) |
//! | `ChatRequest` → `http::Request<Bytes>` (URL, headers, JSON body) | [`encode`](Dialect::encode) | (required) |
//! | finish the built request from its final bytes (SigV4 signing) | [`sign`](Dialect::sign) | nothing |
//! | a 2xx answer → `ChatResponse` | [`decode`](Dialect::decode) | (required) |
//! | an error answer's type, code and message | [`error_body`](Dialect::error_body) | the `{"error": {...}}` envelope |
//! | sharpen the status's class from them (quota, context window, filter) | [`classify`](Dialect::classify) | the status's class |
//! | the secrets sent, removed from every upstream text kept | [`secrets`](Dialect::secrets) | none |
//! | an error answer → `Failure` | [`decode_error`](Dialect::decode_error) | the three above, composed |
//! | a streamed answer's bytes → chunks | [`wire`](Dialect::wire) | (required) |
//! | the response-body cap | [`max_body`](Dialect::max_body) | 16 MiB |
//!
//! What a dialect must keep to:
//!
//! - **Never retry, never wait.** Every method is a pure function of its
//!   inputs; the retry layer is the one retry owner, and the deadline is
//!   the carrier's.
//! - **Classify from the status first.** The default
//!   [`decode_error`](Dialect::decode_error) takes the class, and the
//!   `Retry-After` / `retry-after-ms` / `x-should-retry` hints, from the
//!   status and headers ([`classify_status`](tower_llm_core::classify_status)),
//!   then lets [`classify`](Dialect::classify) sharpen the class from the
//!   body. A 4xx must stay terminal unless the provider says otherwise.
//! - **Never quote a secret.** List what you send in
//!   [`secrets`](Dialect::secrets): the default error decoding removes it
//!   from the provider's message. A stream decoder that keeps a message
//!   must do the same. Mark credential headers sensitive
//!   ([`HeaderValue::set_sensitive`](http::HeaderValue::set_sensitive)).
//! - **Name what is missing, quote nothing.** A 2xx answer that does not
//!   decode is an [`InvalidResponse`](FailureClass::InvalidResponse)
//!   failure with the provider's name.
//! - **Streams commit at content.** The [`Wire`]'s first chunk with text
//!   or a tool-call fragment is the commit point; its
//!   [`StreamItem::Done`](crate::stream::StreamItem::Done) is the terminator; an `Err` ends the stream.
//!   Streams of server-sent events only need an event decoder
//!   ([`SseWire::new`]).
//!
//! # Example: a toy dialect
//!
//! A made-up API (`POST {base}/generate` with `{"model", "prompt"}`,
//! answering `{"text"}`, streaming `data: {"text"}` events up to
//! `data: {"done": true}`), served by a scripted transport:
//!
//! ```
//! use std::time::Duration;
//!
//! use bytes::Bytes;
//! use tower::ServiceExt;
//! use tower_llm_core::{
//!     ChatChunk, ChatRequest, ChatResponse, Choice, Failure, FailureClass, FinishReason, Message,
//! };
//! use tower_llm_providers::dialect::{Dialect, ErrorBody, SseWire};
//! use tower_llm_providers::mock::{Reply, ScriptedTransport, Step};
//! use tower_llm_providers::stream::StreamItem;
//! use tower_llm_providers::Provider;
//!
//! /// The toy API's settings: its dialect.
//! #[derive(Debug)]
//! struct Toy {
//!     base: String,
//!     key: String,
//! }
//!
//! fn invalid(what: &str) -> Failure {
//!     Failure::new(FailureClass::InvalidResponse)
//!         .with_provider("toy")
//!         .with_message(format!("malformed toy response: {what}"))
//! }
//!
//! impl Dialect for Toy {
//!     type Wire = SseWire;
//!
//!     fn provider(&self) -> &'static str {
//!         "toy"
//!     }
//!
//!     fn encode(&self, req: &ChatRequest, stream: bool) -> Result<http::Request<Bytes>, Failure> {
//!         let prompt: Vec<String> = req.messages.iter().map(Message::joined_text).collect();
//!         let body = serde_json::json!({"model": req.model, "prompt": prompt.join("\n"), "stream": stream});
//!         let mut key = http::HeaderValue::try_from(format!("Bearer {}", self.key))
//!             .map_err(|_| Failure::new(FailureClass::Auth).with_provider("toy"))?;
//!         key.set_sensitive(true);
//!         http::Request::post(format!("{}/generate", self.base))
//!             .header(http::header::AUTHORIZATION, key)
//!             .header(http::header::CONTENT_TYPE, "application/json")
//!             .body(Bytes::from(body.to_string()))
//!             .map_err(|e| Failure::new(FailureClass::BadRequest).with_provider("toy").with_message(e.to_string()))
//!     }
//!
//!     fn decode(
//!         &self,
//!         req: &ChatRequest,
//!         answer: &http::Response<Bytes>,
//!         latency: Duration,
//!     ) -> Result<ChatResponse, Failure> {
//!         let body: serde_json::Value =
//!             serde_json::from_slice(answer.body()).map_err(|_| invalid("not JSON"))?;
//!         let text = body["text"].as_str().ok_or_else(|| invalid("missing field `text`"))?;
//!         Ok(ChatResponse {
//!             model: req.model.to_string(),
//!             provider: "toy".into(),
//!             choices: vec![Choice {
//!                 index: 0,
//!                 text: text.to_owned(),
//!                 tool_calls: Vec::new(),
//!                 finish_reason: FinishReason::Stop,
//!             }],
//!             latency,
//!             ..ChatResponse::default()
//!         })
//!     }
//!
//!     fn classify(&self, class: FailureClass, error: &ErrorBody<'_>) -> FailureClass {
//!         match error.code() {
//!             Some("out_of_credit") => FailureClass::QuotaExhausted,
//!             _ => class,
//!         }
//!     }
//!
//!     fn secrets(&self) -> Vec<&str> {
//!         vec![&self.key]
//!     }
//!
//!     fn wire(&self) -> SseWire {
//!         SseWire::new(|event| {
//!             let v: serde_json::Value =
//!                 serde_json::from_str(&event.data).map_err(|_| invalid("an event is not JSON"))?;
//!             Ok(match v["text"].as_str() {
//!                 Some(text) => StreamItem::Chunk(ChatChunk {
//!                     text: Some(text.to_owned()),
//!                     ..ChatChunk::default()
//!                 }),
//!                 None if v["done"] == true => StreamItem::Done,
//!                 None => StreamItem::Skip,
//!             })
//!         })
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let transport = ScriptedTransport::new(Reply::json(200, r#"{"text": "Hello"}"#));
//! let toy = Provider::new(
//!     transport.clone(),
//!     Toy { base: "https://toy.example".into(), key: "toy-key-123".into() },
//! );
//! let hi = || ChatRequest::new("toy-1", vec![Message::user("Hi")]);
//!
//! // A unary call.
//! let answer = toy.clone().oneshot(hi()).await.unwrap();
//! assert_eq!(answer.text(), "Hello");
//! assert_eq!(transport.received()[0].path, "/generate");
//!
//! // An error answer: the status's class, sharpened by the body, the key
//! // scrubbed from the provider's message.
//! transport.push(Reply::json(
//!     429,
//!     r#"{"error": {"code": "out_of_credit", "message": "toy-key-123 has no credit"}}"#,
//! ));
//! let failure = toy.clone().oneshot(hi()).await.unwrap_err();
//! assert!(failure.is_quota_exhausted());
//! assert_eq!(failure.message(), Some("[redacted] has no credit"));
//!
//! // A stream, committed at its first content frame.
//! transport.push(Reply::sse_steps(vec![
//!     Step::sse(None, r#"{"text": "Hel"}"#),
//!     Step::sse(None, r#"{"text": "lo"}"#),
//!     Step::sse(None, r#"{"done": true}"#),
//! ]));
//! let stream = toy.streaming().oneshot(hi()).await.unwrap();
//! assert_eq!(stream.collect_response().await.unwrap().text(), "Hello");
//! # }
//! ```

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use tower_llm_core::{ChatRequest, ChatResponse, Failure, FailureClass};

use crate::failure::{Scrub, error_failure};
use crate::transport::{DEFAULT_MAX_BODY, RequestBody, inject_trace_context};

pub use crate::failure::ErrorBody;
pub use crate::streaming::wire::{SseWire, Wire};

/// How one provider speaks: the encoding of a request, the decoding of an
/// answer, of an error answer and of a streamed answer, and the
/// classification of its errors. See the [module docs](self) for how to
/// write one, with an example.
///
/// [`Provider<D, T>`](crate::Provider) runs a dialect over any HTTP
/// transport `T` as a `Service<ChatRequest>` (and, with
/// [`streaming`](crate::Provider::streaming), a streaming one). A dialect
/// is shared by every clone of its provider (behind an `Arc`) and used
/// from many calls at once: it holds settings, never per-call state.
pub trait Dialect: Send + Sync + 'static {
    /// The decoder of one streamed answer (framing and events):
    /// [`SseWire`] for server-sent events.
    type Wire: Wire;

    /// The provider's name in failures, attempt records and the GenAI
    /// metrics (`"openai"`, `"anthropic"`, `"bedrock"`).
    fn provider(&self) -> &'static str;

    /// The HTTP request for `req`: method, URL, headers and body. `stream`
    /// asks for a streamed answer (a provider that streams at another URL
    /// picks it here); the request's own `stream` flag is not looked at.
    /// The provider adds the trace context (`traceparent`) after
    /// [`sign`](Dialect::sign).
    ///
    /// # Errors
    ///
    /// A request this provider cannot take (for example an image by URL
    /// where only bytes are accepted): a bad-request failure, never sent.
    fn encode(&self, req: &ChatRequest, stream: bool) -> Result<http::Request<Bytes>, Failure>;

    /// The last step before the request is sent, on its final URL,
    /// headers and body: signs it (Bedrock's SigV4), or otherwise finishes
    /// it. Default: nothing.
    ///
    /// # Errors
    ///
    /// A request that cannot be signed: a failure, never sent.
    fn sign(&self, req: &mut http::Request<Bytes>) -> Result<(), Failure> {
        let _ = req;
        Ok(())
    }

    /// Normalises a 2xx answer to `req`, which took `latency`. The
    /// provider adds the answer's status to a failure.
    ///
    /// # Errors
    ///
    /// A body this dialect cannot read: an invalid-response failure naming
    /// what is missing, quoting nothing of the body.
    fn decode(
        &self,
        req: &ChatRequest,
        answer: &http::Response<Bytes>,
        latency: Duration,
    ) -> Result<ChatResponse, Failure>;

    /// What an error answer says: its error type, code and message.
    /// Default: the `{"error": {"type", "code", "message"}}` envelope of
    /// OpenAI and Anthropic ([`ErrorBody::envelope`]), read leniently.
    fn error_body<'a>(&self, headers: &'a HeaderMap, body: &'a [u8]) -> ErrorBody<'a> {
        let _ = headers;
        ErrorBody::envelope(body)
    }

    /// The class of an error answer: `class` is what its status and
    /// headers say; sharpen it from what its body says (quota exhausted,
    /// context window exceeded, content filtered, ...). Default: `class`.
    fn classify(&self, class: FailureClass, error: &ErrorBody<'_>) -> FailureClass {
        let _ = error;
        class
    }

    /// The secrets this dialect sends (keys, tokens, access key ids),
    /// removed from every provider message kept in a failure. Default:
    /// none.
    fn secrets(&self) -> Vec<&str> {
        Vec::new()
    }

    /// Classifies a non-2xx answer. Default: the class, `Retry-After` and
    /// retry hints from the status and headers, sharpened by
    /// [`classify`](Dialect::classify) from the [`error_body`](Dialect::error_body);
    /// the provider's message kept with the [`secrets`](Dialect::secrets)
    /// removed, then bounded to [`MAX_MESSAGE`](crate::MAX_MESSAGE) bytes;
    /// the status and the provider's name on the failure. Override it only
    /// for an error shape these pieces cannot express.
    fn decode_error(&self, status: StatusCode, headers: &HeaderMap, body: &[u8]) -> Failure {
        let error = self.error_body(headers, body);
        let scrub = Scrub::new(self.secrets());
        error_failure(
            self.provider(),
            status,
            headers,
            &error,
            &scrub,
            |class, e| self.classify(class, e),
        )
    }

    /// A decoder for one streamed answer, fed its body's bytes.
    fn wire(&self) -> Self::Wire;

    /// The largest response body read (default 16 MiB); a larger one is an
    /// invalid-response failure and memory stays bounded.
    fn max_body(&self) -> usize {
        DEFAULT_MAX_BODY
    }
}

/// The request to send for `req`: encoded, signed, with the trace context,
/// its body ready for the transport.
pub(crate) fn request<D: Dialect>(
    dialect: &D,
    req: &ChatRequest,
    stream: bool,
) -> Result<http::Request<RequestBody>, Failure> {
    finish(dialect, dialect.encode(req, stream)?)
}

/// A built request, signed, with the trace context, its body ready for the
/// transport.
pub(crate) fn finish<D: Dialect>(
    dialect: &D,
    mut req: http::Request<Bytes>,
) -> Result<http::Request<RequestBody>, Failure> {
    dialect.sign(&mut req)?;
    // Not signed: tracing headers may change without breaking a signature.
    inject_trace_context(req.headers_mut());
    Ok(req.map(RequestBody::new))
}
