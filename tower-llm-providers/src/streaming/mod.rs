//! The streaming services: [`Streaming`] around a provider answers a
//! [`ChatRequest`](tower_llm_core::ChatRequest) with a
//! [`ChatStream`](tower_llm_core::ChatStream) at the stream's commit point.
//!
//! # The commit point: the first content frame
//!
//! The service's future resolves only when the provider has sent the first
//! content frame (a text delta or a tool-call fragment). Until then, a
//! failure is an ordinary `Err` of the service, so retry, breaker and
//! fallback treat it exactly like a failed unary call:
//!
//! | before the first content frame | failure class |
//! |---|---|
//! | an HTTP error answer | from status, headers and body, as for unary calls |
//! | an in-band error event (OpenAI `error` object, Anthropic `event: error`, a Bedrock exception message) | from the error's type (`overloaded_error` is transient, throttling is rate limited, ...) |
//! | a stream that ends, or sends its terminator, with neither content nor a finish reason | transient |
//! | no content frame within the first-token timeout | timeout (or deadline exceeded, when the call's deadline came first) |
//! | a malformed frame | invalid response |
//!
//! A stream that ends properly with a finish reason but no content (a
//! content filter's stop, an empty answer) is a complete answer: it
//! commits, and is not retried.
//!
//! The peek holds at most the first content frame (plus one merged
//! preamble chunk with any usage or finish reason sent before it) and hands
//! it on unchanged; after it the stream is passed through with no per-chunk
//! buffering.
//!
//! After the commit point nothing retries: a mid-stream error event, a
//! connection that breaks off, a stall longer than the idle timeout, the
//! call's deadline (it bounds the whole stream, checked before each chunk
//! is handed on), or a truncated stream (see below) ends the
//! [`ChatStream`](tower_llm_core::ChatStream) with one terminal `Err` item carrying the failure class.
//! The breaker counts only failures before the commit point (its call
//! future resolved `Ok` at the commit).
//!
//! # Complete or truncated: the end of a stream
//!
//! A stream is complete, and its [`ChatStream`](tower_llm_core::ChatStream) ends with no error, when
//!
//! - its terminator comes: OpenAI's `data: [DONE]`, Anthropic's
//!   `message_stop`, Bedrock's `metadata` event after `messageStop`; or
//! - its body ends cleanly without the terminator after the finish reason:
//!   OpenAI, a `finish_reason` for **every choice that started** (a choice
//!   starts with its first chunk that is not usage-only; `n > 1` streams
//!   are tracked per choice index); Anthropic, a `message_delta` with a
//!   `stop_reason`; Bedrock, a `messageStop` with its `stopReason`.
//!   Every chunk that came is handed on, the usage chunk after the finish
//!   reason included.
//!
//! A clean end of the body is the end the HTTP framing declares (the last
//! chunk of a chunked body, or its `Content-Length` reached), with no
//! partial event left over: the finish reason alone does not prove the
//! answer complete, since the usage may still follow it.
//!
//! A stream is truncated, and ends with a terminal `Err` of class
//! [`Transient`](tower_llm_core::FailureClass::Transient) ("the stream ended without its
//! terminator"), when its body ends cleanly before that finish reason
//! (for OpenAI, while a started choice has none), or in the middle of an
//! event. A body that breaks off (a connection reset, a chunked body
//! without its last chunk) is a transient failure ("the stream broke
//! off") even after the finish reason: the usage, or a part of the
//! answer, may be lost.
//!
//! The official SDKs read a stream to the end of its body and accept it
//! without the terminator; the finish reason asked for here in addition
//! keeps a stream cut between two events an error.
//!
//! The stream ends at the terminator: the consumer never waits on the rest
//! of the body. What is left of it (an upstream that sends its terminator
//! and lingers) is read in the background so the connection can return to
//! the pool: at most 64 KiB, within the idle timeout and the call's
//! deadline, on a task spawned on the current tokio runtime (the body is
//! dropped, closing the connection, when there is none or the limit is
//! reached).
//!
//! Put the layers around a `Streaming` service exactly as around the unary
//! one; the retry layer's attempt timeout then bounds the time to the first
//! content frame as well.
//!
//! # Opt-in guards against silence and garbled streams
//!
//! Off by default; together they are [`SilenceGuards`] in a policy file.
//!
//! - A response-head timeout,
//!   [`Provider::with_head_timeout`](crate::Provider::with_head_timeout):
//!   no status and headers within it is a timeout failure, for unary calls
//!   and streams; a slow body after a quick head is not cut by it.
//! - A first-token limit learned from the link's own times to first
//!   content frame, [`Streaming::with_learned_first_token`] with a
//!   [`FirstTokenLimit`]: `quantile × factor` of the recent ones (p99 × 2 by
//!   default) within a floor and a cap, so a silent upstream fails over
//!   after seconds rather than after the fixed 30 s.
//! - [`MalformedChunks::Skip`], [`Streaming::with_malformed_chunks`]: a
//!   malformed event after the commit point is skipped (logged once per
//!   stream, counted) instead of ending the stream; before it, it still
//!   fails the call.

pub(crate) mod guards;
pub(crate) mod learned;
pub(crate) mod live;
pub(crate) mod malformed;
pub(crate) mod service;
pub(crate) mod timeouts;
pub(crate) mod wire;

pub use guards::{InvalidSilenceGuards, SilenceGuards};
pub use learned::{
    FIRST_TOKEN_WINDOW, FirstTokenLimit, FirstTokenLimitConfig, InvalidFirstTokenLimit,
};
pub use malformed::MalformedChunks;
pub use service::{StreamFuture, StreamSource, Streaming};
pub use timeouts::{DEFAULT_FIRST_TOKEN_TIMEOUT, DEFAULT_IDLE_TIMEOUT, StreamTimeouts};
