//! An ordered chain of LLM providers that fails over within one deadline,
//! and never around policy.
//!
//! [`FallbackLayer`] wraps the primary link's service; alternates are added
//! in order with [`FallbackBuilder::or`], each usually its own `retry →
//! breaker → provider` stack, and may be of different types (they are boxed
//! as [`LinkService`]s). A call moves to the next link only when the last
//! one failed in a way another provider can fix.
//!
//! ```
//! use std::time::Duration;
//! use tower::{service_fn, Layer, ServiceExt};
//! use tower_llm_core::{ChatRequest, ChatResponse, Failure, FailureClass, Message, Usage};
//! use tower_llm_fallback::{FallbackLayer, LinkSpec};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let down = service_fn(|_: ChatRequest| async {
//!     Err::<ChatResponse, _>(Failure::new(FailureClass::Transient))
//! });
//! let backup = service_fn(|req: ChatRequest| async move {
//!     Ok::<_, Failure>(ChatResponse {
//!         id: "1".into(), model: req.model.to_string(), provider: "anthropic".into(), fallback_position: 0, degraded: false, idempotent_replayed: false, cache: None,
//!         choices: vec![], usage: Usage::default(), latency: Duration::ZERO, attempts: vec![],
//!     })
//! });
//! let layer = FallbackLayer::builder(LinkSpec::new("openai", "gpt-4o").rewrite_model())
//!     .or(LinkSpec::new("anthropic", "claude-sonnet-4-5").rewrite_model(), backup)
//!     .build()
//!     .unwrap();
//! let res = layer
//!     .layer(down)
//!     .oneshot(ChatRequest::new("gpt-4o", vec![Message::user("hi")]))
//!     .await
//!     .unwrap();
//! assert_eq!(res.model, "claude-sonnet-4-5"); // the link's model id was sent
//! assert_eq!(res.fallback_position, 1);
//! # }
//! ```
//!
//! # When it moves on
//!
//! On the classes the [`FailurePolicy`](tower_llm_core::FailurePolicy) marks
//! *fail over*: by default transient (5xx, 529, connect errors), rate
//! limited and timeout (after that link's own retries), quota exhausted,
//! invalid response, and circuit open (at once: an open breaker costs no
//! time). Never on a bad request, auth (401/403), not found (404),
//! cancelled or deadline exceeded: those fail the same everywhere, or are
//! the caller's. Opt-in: a context-window-exceeded failure moves to the
//! next link marked [`LinkSpec::serves_long_context`], a content-filtered
//! one to the next marked [`LinkSpec::allows_filtered_content`].
//!
//! Before each failover it checks the call's deadline (nothing starts after
//! it) and the attempt log's cap of 16 records.
//!
//! # Policy comes first
//!
//! A link's [admission predicate](LinkSpec::with_admission) sees the request
//! (its extensions carry, say, a data-residency region or tenant): a link it
//! forbids is skipped, never called, and the attempt log records it as
//! `skipped_by_policy`. A request marked
//! [`NotReplayable`](tower_llm_core::NotReplayable) is never sent to a second
//! link.
//!
//! # Where it goes, and why the breaker sits inside it
//!
//! `deadline → fallback → retry → breaker → provider`. An open circuit
//! inside the fallback makes the fallback skip to the next link; outside, it
//! would fail the whole call before any alternate ran.
//!
//! # What comes back
//!
//! The served response, with the link noted: `ChatResponse::fallback_position`
//! (and its own `provider` and `model`), or, when an alternate served, a
//! [`ServedBy`](tower_llm_core::ServedBy) extension on an `http::Response`
//! (none means the primary served: the common case costs nothing).
//! When every link failed: the last failure, marked
//! [`is_all_links_failed`](tower_llm_core::Failure::is_all_links_failed),
//! with the full attempt log, and a `retry_after` (the earliest) when every
//! link refused with one (open circuits, 429s).
//!
//! # Options
//!
//! - [`FallbackBuilder::with_health_ordering`] (off by default): when failing
//!   over, try the alternates healthiest first (success rate weighted 4:1
//!   over latency, over a rolling window; stable; no data scores neutral;
//!   no link dropped). The primary stays first.
//! - [`FallbackBuilder::with_degraded`] (off by default): when every link
//!   failed, answer with a response the closure builds, flagged degraded.
//! - An auth failure (401/403) is never failed over and is logged with
//!   `tracing::error!` and `severity = "sev-1"`: it is a configuration
//!   error that pages someone.
//!
//! # Feature flags
//!
//! None.

mod chain;
mod future;
mod health;
mod layer;
mod service;

pub use chain::{InvalidChain, LinkService, LinkSpec};
pub use future::ResponseFuture;
pub use layer::{FallbackBuilder, FallbackLayer};
pub use service::Fallback;
