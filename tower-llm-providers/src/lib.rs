//! OpenAI, Azure OpenAI, Anthropic, AWS Bedrock and Google Gemini chat
//! services for tower-llm: one request type
//! ([`ChatRequest`](tower_llm_core::ChatRequest)), one normalised answer
//! ([`ChatResponse`](tower_llm_core::ChatResponse)), and provider errors
//! classified from status, headers and body so that retry, breaker and
//! fallback decide correctly.
//!
//! Each provider is a `tower::Service<ChatRequest>` over any HTTP
//! transport: a `Service<http::Request<Full<Bytes>>>` such as a pooled
//! hyper-util client (put tower-http layers on it if you like; it must not
//! retry: the retry layer is the one retry owner).
//!
//! # One service, many dialects
//!
//! There is one provider service, [`Provider<D, T>`](Provider): a
//! [`Dialect`] `D` spoken over a transport `T`. The service does what every
//! provider shares (readiness, sending once, reading the body with a cap,
//! transport errors, trace context, GenAI metrics, and for
//! [`streaming`](Provider::streaming) the commit point, timeouts and
//! drain); the dialect does what is the provider's own: encoding a request
//! (and signing it), decoding an answer, an error answer and a streamed
//! answer, and classifying errors. Each provider's settings are its
//! dialect, and its service a name for `Provider`:
//!
//! | service | dialect (settings) | streams |
//! |---|---|---|
//! | [`OpenAi<T>`](OpenAi) | [`OpenAiConfig`] | server-sent events |
//! | [`Anthropic<T>`](Anthropic) | [`AnthropicConfig`] | server-sent events |
//! | [`Bedrock<T>`](Bedrock) | [`BedrockConfig`] (signs with SigV4) | AWS event stream |
//! | [`Gemini<T>`](Gemini) | [`GeminiConfig`] (the Gemini Developer API) | server-sent events |
//! | [`AzureOpenAi<T>`](AzureOpenAi) | [`AzureOpenAiConfig`] (a deployment per model) | server-sent events |
//!
//! A new provider (Mistral, Cohere, ...) is a new dialect; the
//! [`dialect`] module says how to write one, with a toy example. A gateway
//! serving a wire format to its own clients: [`openai::server`], [`anthropic::server`].
//!
//! ```
//! use tower_llm_providers::{openai, Anthropic, AnthropicConfig, ApiKey, OpenAi, OpenAiConfig};
//! use tower_llm_core::{ChatRequest, Message};
//!
//! // Any transport works; here a stand-in that never gets called.
//! let transport = tower::service_fn(|_req: http::Request<tower_llm_providers::RequestBody>| async {
//!     Ok::<_, std::io::Error>(http::Response::new(http_body_util::Full::new(bytes::Bytes::new())))
//! });
//! let gpt = OpenAi::new(transport.clone(), OpenAiConfig::new(ApiKey::new("sk-...")));
//! let claude = Anthropic::new(transport, AnthropicConfig::new(ApiKey::new("sk-ant-...")));
//!
//! let req = ChatRequest::new("gpt-4o-mini", vec![Message::system("Be brief."), Message::user("Hi")]);
//! let body = openai::encode(&req);
//! assert_eq!(body["messages"][0]["role"], "system");
//! # let _ = (gpt, claude);
//! ```
//!
//! # Normalisation
//!
//! Both shapes map onto the same `ChatResponse`: text and tool calls per
//! choice, finish reason in {stop, length, tool_calls, content_filter,
//! other}, usage with prompt, completion and cached-input tokens. Unknown
//! fields are ignored; a missing required field is an invalid-response
//! failure naming it. Response bodies are read with a cap (16 MiB by
//! default): a larger one is an invalid-response failure and memory stays
//! bounded.
//!
//! # Content filters
//!
//! A refusal *before* generation is an error answer, so a failure of class
//! [`ContentFiltered`](tower_llm_core::FailureClass::ContentFiltered): not
//! retried, not counted by a breaker, and failed over only, opt-in, to a
//! link marked `allows_filtered_content()` in the fallback layer. A filter
//! that *ends* a generation answers 200: the answer (possibly partial)
//! comes back with [`FinishReason::ContentFilter`](tower_llm_core::FinishReason::ContentFilter)
//! for the caller to judge.
//!
//! | provider | signal | becomes |
//! |---|---|---|
//! | OpenAI / Azure OpenAI | a 400 whose `code` or `type` is `content_filter` or `content_policy_violation` | failure `content_filtered` |
//! | OpenAI | `finish_reason: "content_filter"`, or a `message.refusal` | finish reason `ContentFilter` |
//! | Anthropic | `stop_reason: "refusal"` | finish reason `ContentFilter` |
//! | Bedrock | `stopReason: "guardrail_intervened"` or `"content_filtered"` | finish reason `ContentFilter` |
//! | Gemini | a 200 with `promptFeedback.blockReason` and no candidate | failure `content_filtered` |
//! | Gemini | `finishReason` `SAFETY`, `RECITATION`, `BLOCKLIST`, `PROHIBITED_CONTENT`, `SPII` or `IMAGE_*` | finish reason `ContentFilter` |
//!
//! Streams map the same stop reasons to the same finish reason.
//!
//! # Secrets
//!
//! Keys live in [`ApiKey`], whose `Debug` and `Display` print
//! `[redacted]`; they never appear in errors, logs or spans
//! ([`AwsCredentials`] redacts its access key id too). Upstream values are
//! never quoted verbatim in an error: a body that does not decode is
//! described by serde's error category, line and column (plus the name of a
//! missing field), and a provider's own message is kept with every
//! credential the provider sends replaced by `[redacted]`, before it is
//! bounded to [`MAX_MESSAGE`] bytes.
//!
//! # Embeddings
//!
//! OpenAI embeddings are [`OpenAiEmbeddings`] (`EmbeddingRequest` →
//! `EmbeddingResponse`, the same layers apply), with the same settings.
//! Azure OpenAI's are [`AzureOpenAiEmbeddings`]; both are [`Embeddings`]
//! over an [`EmbeddingDialect`].
//!
//! # Streaming
//!
//! `.streaming()` on a provider gives a [`Streaming`] service answering a
//! [`ChatStream`](tower_llm_core::ChatStream) at the stream's commit point,
//! the first content frame: failures before it are the call's `Err` (so
//! retry, breaker and fallback handle them), failures after it end the
//! stream with one terminal `Err` item. A stream is complete at its
//! terminator (`[DONE]`, `message_stop`, Bedrock's `metadata`), or when
//! its body ends cleanly after the finish reason (of every choice that
//! started) without one; a body that ends before the finish reason is
//! truncated, a transient failure. See [`streaming`] for the full
//! contract and [`stream`] for the incremental parsers underneath (SSE and
//! the OpenAI and Anthropic event decoders; Bedrock's event-stream framing
//! is decoded with `aws-smithy-eventstream`).
//!
//! # Feature flags
//!
//! - `https` (default): [`https::shared_client`], the default transport, a
//!   pooled hyper-util client over rustls (`ring`, webpki roots), and
//!   [`https::client_with_connect_timeout`] for a provider that needs its
//!   own connect timeout (at the cost of its own pool).
//! - `mock`: test doubles, `mock::ScriptedTransport` (in-process, virtual
//!   time) and `mock::MockServer` (real loopback HTTP with scripted
//!   faults). Off by default.

pub mod anthropic;
pub mod azure;
pub mod bedrock;
pub mod dialect;
mod failure;
pub mod gemini;
#[cfg(feature = "https")]
pub mod https;
#[cfg(feature = "mock")]
pub mod mock;
pub mod openai;
mod provider;
mod secret;
pub mod stream;
pub mod streaming;
mod transport;
mod wire;

pub use anthropic::{Anthropic, AnthropicConfig};
pub use azure::{AZURE_API_VERSION, AzureOpenAi, AzureOpenAiConfig, AzureOpenAiEmbeddings};
pub use bedrock::{AwsCredentials, Bedrock, BedrockConfig};
pub use dialect::Dialect;
pub use failure::MAX_MESSAGE;
pub use gemini::{Gemini, GeminiConfig};
pub use openai::{
    EmbeddingDialect, Embeddings, EmbeddingsFuture, OpenAi, OpenAiConfig, OpenAiEmbeddings,
};
pub use provider::{Provider, ProviderFuture};
pub use secret::ApiKey;
pub use streaming::{FirstTokenLimit, FirstTokenLimitConfig, MalformedChunks, SilenceGuards};
pub use streaming::{StreamFuture, StreamSource, StreamTimeouts, Streaming};
pub use transport::{DEFAULT_MAX_BODY, RequestBody};
