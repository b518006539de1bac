//! The shared vocabulary of [tower-llm]: how every layer and provider talks
//! about failure, time and attempts.
//!
//! - [`FailureClass`]: why a call failed (one class per failure), each with a
//!   [`Disposition`] (retry? trip the breaker? fail over?) that a
//!   [`FailurePolicy`] can override.
//! - [`Failure`]: the one structured error type, `hyper::Error`-style.
//! - [`Classify`]: maps `&Result<Res, E>` to an [`Outcome`], with defaults for
//!   typed chat calls ([`ChatClassifier`]) and raw HTTP ([`HttpClassifier`]:
//!   status, `Retry-After`, `retry-after-ms`, `x-should-retry`).
//! - [`Call`]: what one call carries between the layers (deadline, link,
//!   attempt number, attempt log), reached through [`LlmRequest`] on any
//!   request type; read it here.
//! - [`Deadline`]: the call's absolute deadline.
//! - [`Cost`] and [`Price`]: what calls cost; [`Budget`] and [`Tenant`]:
//!   what one call may spend and who it is for, in the carrier.
//! - [`AttemptLog`]: one [`AttemptRecord`] per attempt, at most
//!   [`MAX_ATTEMPTS_PER_CALL`], returned with the response and the error.
//! - [`ChatRequest`], [`ChatResponse`] (and its [builder](ChatResponse::builder)),
//!   [`ChatChunk`]: provider-neutral chat types;
//!   [`ChatStream`]: a streamed answer, returned at its commit point (the
//!   first content frame).
//! - [`Continuation`], [`Continued`]: opt-in recovery of a stream that
//!   broke after its commit point (a continuation request's marker; how
//!   often a stream was continued, and what served each piece).
//! - [`layer`]: for authors of layers, not for programs that use them:
//!   how the layers write the carrier and the attempt log (sealed
//!   extension traits), the cross-layer contract they follow, the call's
//!   owner, request copies for later, and the timer of every tower-llm
//!   timeout. Like `tracing_core::subscriber`, the API for those who
//!   extend the crate lives in a named module; the root is what every
//!   user touches.
//!
//! This crate depends on no other tower-llm crate and has no `tower`
//! dependency: it is vocabulary (and one small future) only.
//!
//! ```
//! use http::{HeaderMap, StatusCode};
//! use tower_llm_core::{classify_status, FailureClass, FailurePolicy, Outcome};
//!
//! let mut headers = HeaderMap::new();
//! headers.insert("retry-after", "5".parse().unwrap());
//! let Outcome::Failure(failed) = classify_status(StatusCode::TOO_MANY_REQUESTS, &headers) else {
//!     unreachable!()
//! };
//! assert_eq!(failed.class, FailureClass::RateLimited);
//! assert_eq!(failed.retry_after, Some(std::time::Duration::from_secs(5)));
//! let what_to_do = FailurePolicy::default().disposition(&failed);
//! assert!(what_to_do.retry && what_to_do.failover);
//! ```
//!
//! # Feature flags
//!
//! None yet; the crate is always `std`.
//!
//! [tower-llm]: https://docs.rs/tower-llm

mod bound;
mod cache;
mod call;
mod chat;
mod class;
mod classify;
mod continuation;
mod cost;
mod deadline;
mod embed;
mod error;
mod extensions;
pub mod layer;
mod link;
mod log;
mod record;
mod retry_after;
mod stream;
pub mod telemetry;

pub use bound::{
    IMAGE_TOKENS, MESSAGE_OVERHEAD_TOKENS, REQUEST_OVERHEAD_TOKENS, input_tokens_bound,
};
pub use cache::{CacheOutcome, CacheStatus};
pub use call::{Call, IdempotencyKey, LlmRequest};
pub use chat::{
    ChatChunk, ChatRequest, ChatResponse, ChatResponseBuilder, Choice, ContentPart, FinishReason,
    Message, Role, Tool, ToolCall, ToolCallDelta, ToolChoice, Usage,
};
pub use class::{Classified, Disposition, FailureClass, FailurePolicy};
pub use classify::{
    ChatClassifier, Classify, HttpClassifier, Outcome, X_SHOULD_RETRY, classify_status,
    should_retry,
};
pub use continuation::Continuation;
pub use cost::{Budget, BudgetHold, Cost, InvalidCost, InvalidPrice, Price, Tenant};
pub use deadline::Deadline;
pub use embed::{EmbeddingRequest, EmbeddingResponse};
pub use error::{BoxError, Failure};
pub use extensions::{Attempts, Degraded, KeepAttempts, NotReplayable, RecordsAttempts, ServedBy};
pub use link::Link;
pub use log::{AttemptLog, MAX_ATTEMPTS_PER_CALL};
pub use record::{AttemptOutcome, AttemptRecord, AttemptStatus, NextStep, RetryReason, RetryStop};
pub use retry_after::{
    MAX_RETRY_AFTER, RETRY_AFTER_MS, parse_retry_after, parse_retry_after_ms, retry_after,
    retry_after_at,
};
pub use stream::{ChatStream, ChunkStream, Continued, ContinuedPiece};
pub use telemetry::{GenAiMetrics, Metrics};
