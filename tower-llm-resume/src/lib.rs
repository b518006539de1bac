//! Opt-in recovery for LLM streams that break after their first token.
//!
//! By default a tower-llm stream is committed at its first content frame:
//! a failure after it (a connection that breaks off, a stall, a malformed
//! chunk) ends the client's stream, and nothing retries it, because a
//! retry would send the client the same text twice. This crate makes
//! recovery an explicit choice, in two ways:
//!
//! - **Continue** ([`ResumeLayer`] over a route's fallback chain, with a
//!   [`ContinuationLayer`] on each link): when the stream breaks, a
//!   *continuation request* (the original request plus the text already
//!   sent, as a [`Continuation`](tower_llm_core::Continuation)) goes
//!   through the chain again, and the new stream's text is spliced into
//!   the same client stream, with whatever the model repeats of what was
//!   sent trimmed: no duplicated, no missing text.
//! - **Complete or fail** ([`CompleteLayer`] on a link): the link's stream
//!   is held until it is complete, so a cut is an ordinary `Err` of the
//!   call, retried or failed over like a failure before the first token;
//!   the client waits for the whole answer.
//!
//! ```
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use std::sync::Arc;
//! use std::time::Duration;
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//! use tower_llm_core::{ChatChunk, ChatRequest, ChatStream, Failure, FailureClass, Message, Role};
//! use tower_llm_deadline::DeadlineLayer;
//! use tower_llm_resume::{ContinuationLayer, Prefill, ResumeConfig, ResumeLayer};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let text = |t: &str| Ok(ChatChunk { text: Some(t.into()), ..ChatChunk::default() });
//! let calls = Arc::new(AtomicUsize::new(0));
//! let counter = calls.clone();
//! // A link whose first stream breaks after "Hello, wor"; asked to
//! // continue (its model accepts a prefill), it repeats "wor".
//! let provider = service_fn(move |req: ChatRequest| {
//!     let items = match counter.fetch_add(1, Ordering::SeqCst) {
//!         0 => vec![text("Hello, "), text("wor"), Err(Failure::new(FailureClass::Transient))],
//!         _ => {
//!             let last = req.messages.last().unwrap();
//!             assert_eq!((last.role, last.joined_text()), (Role::Assistant, "Hello, wor".into()));
//!             vec![text("world"), text("!")]
//!         }
//!     };
//!     async move { Ok::<_, Failure>(ChatStream::from_chunks("anthropic", "claude", items)) }
//! });
//! let link = ServiceBuilder::new()
//!     .layer(ContinuationLayer::new(Prefill::new(true)))
//!     .service(provider);
//! // deadline → resume → (the route's fallback chain; one link here)
//! let route = ServiceBuilder::new()
//!     .layer(DeadlineLayer::new(Duration::from_secs(30)))
//!     .layer(ResumeLayer::new(ResumeConfig::default()).unwrap())
//!     .service(link);
//!
//! let req = ChatRequest::new("claude", vec![Message::user("Say hello")]).with_stream(true);
//! let stream = route.oneshot(req).await.unwrap();
//! let continued = stream.continuations(); // read it after the stream is consumed
//! let answer = stream.collect_response().await.unwrap();
//! assert_eq!(answer.text(), "Hello, world!");
//! assert_eq!(continued.count(), 1);
//! assert_eq!(calls.load(Ordering::SeqCst), 2);
//! # }
//! ```
//!
//! # Continuing a stream
//!
//! [`ResumeLayer`] wraps the route's streaming service: the whole chain,
//! so a continuation may be served by the same link or the next. It
//! passes each chunk through while it keeps the first choice's text sent
//! so far. When the stream ends with its one terminal failure, it is
//! continued if, and only if:
//!
//! - the failure's class is [resumable](RESUMABLE) (a cut, an idle
//!   timeout, a malformed chunk, an in-band rate limit or quota: never a
//!   deadline, a cancellation, a content filter, a bad request or a
//!   spending limit);
//! - fewer than `max_continuations` continuations were made;
//! - the call's [`Deadline`](tower_llm_core::Deadline) has time left;
//! - the stream sent only the first choice's text: a stream that sent
//!   another choice or a tool-call fragment is never continued (a tool
//!   call cannot be stitched), nor one that sent more than
//!   `max_partial_bytes`, nor a request marked
//!   [`NotReplayable`](tower_llm_core::NotReplayable).
//!
//! Otherwise the failure passes through unchanged. A continuation that
//! fails before it commits ends the stream with *its* failure.
//!
//! **No duplicated, no missing text.** The continuation's text resumes
//! exactly after what was sent: the longest suffix of the sent text's last
//! [`OVERLAP_WINDOW`] bytes that is a prefix of the continuation's text,
//! and starts at a word boundary, is trimmed from its head (a model told
//! to continue often repeats a little, from the start of a word or
//! sentence), across the continuation's chunk boundaries. A match that
//! starts inside a word is a coincidence and is kept ("Hel" continued
//! with "lo" is "Hello", not "Helo"). The continuation's first chunks are
//! held only until that is decided (usually a few bytes), in time and
//! memory linear in the window.
//!
//! **Usage** adds up across pieces (each usage chunk after a continuation
//! carries the sum so far, so collecting the stream gives the total); the
//! finish reason is the last piece's. **Saying it was continued:**
//! [`ChatStream::continuations`](tower_llm_core::ChatStream::continuations)
//! counts the continuations and keeps each piece's link and attempt
//! records; the OpenAI and Anthropic SSE writers of `tower-llm-providers`
//! end a continued stream with a `: continued N` comment line.
//!
//! Each continuation is a call of its own through the chain: a fresh
//! carrier with the original call's deadline, cost budget and tenant (not
//! its idempotency key), owned by the chain, so its attempt records and
//! call metrics are its own.
//!
//! # How a link asks its model to continue
//!
//! [`ContinuationLayer`] turns the [`Continuation`](tower_llm_core::Continuation)
//! into messages for its link: with [`Prefill`], the partial answer as the
//! last, assistant message; without, the partial answer and then a user
//! message, [`CONTINUE_INSTRUCTION`]. A link configured to prefill that
//! refuses it (a bad request) learns not to, for good, and the
//! continuation is sent again at once without prefill. A link without the
//! layer receives the original request: its model starts over, and only
//! the repeat within the window is trimmed, so give every link of a
//! resumed route the layer.
//!
//! # Where they go
//!
//! ```text
//! deadline → [idempotency →] resume → fallback → per link: continuation → [hedge →] retry → [breaker →] complete → provider
//! ```
//!
//! - [`ResumeLayer`] inside the deadline (continuations share the call's
//!   one deadline) and outside the fallback (a continuation may fail over).
//! - [`ContinuationLayer`] inside the fallback (each link asks its own
//!   way), outside the retry (a retried attempt is asked the same way).
//! - [`CompleteLayer`] inside the retry (a cut is retried); directly over
//!   the provider, a cut also counts against the link's circuit.
//!
//! See the repository's `docs/recovery.md` (`tower_llm::guide::recovery`)
//! for the trade-offs.
//!
//! # Feature flags
//!
//! None.

mod class;
mod complete;
mod config;
mod continuation;
mod overlap;
mod resume;
mod splice;

pub use class::{RESUMABLE, is_resumable};
pub use complete::{CHUNK_OVERHEAD, Complete, CompleteFuture, CompleteLayer};
pub use config::{CompleteConfig, InvalidConfig, MAX_CONTINUATIONS, ResumeConfig};
pub use continuation::{
    CONTINUE_INSTRUCTION, ContinuationLayer, Continue, ContinueFuture, Prefill,
};
pub use overlap::OVERLAP_WINDOW;
pub use resume::{Resume, ResumeFuture, ResumeLayer};
