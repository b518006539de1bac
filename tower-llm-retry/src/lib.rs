//! Bounded retries for LLM calls that respect the deadline and the provider.
//!
//! [`RetryLayer`] retries a failed attempt on the same link when, and only
//! when, time can fix it, without ever amplifying load or sleeping past the
//! caller's deadline.
//!
//! ```
//! use std::time::Duration;
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//! use tower_llm_core::{AttemptStatus, ChatRequest, ChatResponse, Failure, FailureClass, Message, Usage};
//! use tower_llm_deadline::DeadlineLayer;
//! use tower_llm_retry::RetryLayer;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! static CALLS: AtomicUsize = AtomicUsize::new(0);
//! // A provider that is overloaded once, then answers.
//! let provider = service_fn(|req: ChatRequest| async move {
//!     if CALLS.fetch_add(1, Ordering::SeqCst) == 0 {
//!         return Err(Failure::new(FailureClass::Transient));
//!     }
//!     Ok(ChatResponse {
//!         id: "1".into(), model: req.model.to_string(), provider: "mock".into(), fallback_position: 0, degraded: false, idempotent_replayed: false, cache: None, choices: vec![],
//!         usage: Usage::default(), latency: Duration::ZERO, attempts: vec![],
//!     })
//! });
//! let svc = ServiceBuilder::new()
//!     .layer(DeadlineLayer::new(Duration::from_secs(30)))
//!     .layer(RetryLayer::new())
//!     .service(provider);
//!
//! let res = svc.oneshot(ChatRequest::new("m", vec![Message::user("hi")])).await.unwrap();
//! let statuses: Vec<_> = res.attempts.iter().map(|a| a.status()).collect();
//! assert_eq!(statuses, [AttemptStatus::RetriedAfterConnReset, AttemptStatus::Succeeded]);
//! # }
//! ```
//!
//! # What is retried
//!
//! The [failure class](tower_llm_core::FailureClass) decides, through the
//! layer's [`FailurePolicy`](tower_llm_core::FailurePolicy): by default only
//! *transient* failures (5xx, 529 overloaded, connect error, reset),
//! *rate limited* (429) and *timeout* (the per-attempt timeout, 408). Never
//! a bad request (400), auth (401/403), not found (404), quota exhausted,
//! content filtered, context window exceeded, an open circuit (that goes to
//! the fallback layer at once), cancelled or deadline exceeded. A provider's
//! `x-should-retry: false` vetoes a retry.
//!
//! # How long it waits
//!
//! - At most `max_attempts` per link (default 3); the first is immediate.
//! - Before retry `n`, the [`Backoff`] schedule: by default 200 ms then
//!   800 ms, ±20 % uniform jitter, from a lock-free [`SplitMix64`].
//! - A `Retry-After` / `retry-after-ms` hint is a floor: the wait is
//!   `max(backoff, Retry-After)`, so a `Retry-After: 0` or a date in the
//!   past still waits out the backoff (no retry storm). A hint over
//!   `max_retry_after` (default 60 s) returns the failure at once,
//!   deadline or not.
//! - A retry starts only if the wait plus a minimum useful attempt
//!   ([`RetryLayer::with_min_attempt`], default 1 s, never more than the
//!   attempt timeout) fits before the call's [`Deadline`](tower_llm_core::Deadline);
//!   otherwise it does not wait at all: the last failure is returned at
//!   once (retry stop `PastDeadline`) so the fallback layer can use the
//!   time. Nothing starts after the deadline.
//! - Each attempt is bounded by `min(attempt_timeout, remaining deadline)`
//!   (default 30 s). An attempt that hits its own timeout is a retryable
//!   *timeout*; one that hits the call's deadline is *deadline exceeded*.
//!
//! # Why a budget, not only max attempts
//!
//! "3 attempts" bounds one call, not the system: in a 429 storm every call
//! makes all 3, tripling load on a provider that is already refusing it
//! (the amplification behind LiteLLM's 1 → 6 → (1+N)² call bugs). A
//! [`RetryBudget`] shared by every clone of the layer caps retries at a
//! share of recent first attempts (default 20 %, with a floor of one retry
//! per second so quiet services still recover from blips). Once spent,
//! failures are returned without retry and the attempt record says
//! [`BudgetExhausted`](tower_llm_core::RetryStop::BudgetExhausted). Under a
//! sustained storm, upstream attempts stay at or below 1.2 per call once
//! traffic is above the floor's share (with the defaults, 5 calls a second);
//! below it the floor dominates and a quiet service may retry every call.
//!
//! # The attempt log
//!
//! Every attempt appends an [`AttemptRecord`](tower_llm_core::AttemptRecord)
//! (provider and model from the request's [`Link`](tower_llm_core::Link) or
//! [`RetryLayer::with_link`], attempt number, outcome, elapsed, HTTP
//! status); the retry decision marks it *retried* or says why it stopped.
//! [`AttemptRecord::status`](tower_llm_core::AttemptRecord::status) gives the
//! seed-002 status (`RetriedAfter5xx`, `RetriedAfter429`, ...). The layer
//! owns the log when no outer tower-llm layer does.
//!
//! A request carrying [`NotReplayable`](tower_llm_core::NotReplayable) in its
//! extensions is sent once and never retried.
//!
//! # Errors, not responses
//!
//! Errors are [`Failure`](tower_llm_core::Failure)s, with provider and
//! model filled in from the link. With [`RetryLayer::http`], a final
//! failing HTTP answer (say, the third 503) is returned as the `Ok`
//! response it is.
//!
//! # How it differs from `tower::retry`
//!
//! It runs the loop of `tower::retry::Retry` (call, ask the policy, wait,
//! call the service again once ready), driven by [`RetryPolicy`] (a
//! `tower::retry::Policy`, usable in tower's own `Retry`), with one
//! change: the copy kept for the next attempt is a
//! [`Replay`](tower_llm_core::layer::Replay), made without the request's
//! [`Call`](tower_llm_core::Call), which is put back only if the copy is
//! sent, so a call that succeeds at once copies nothing but reference
//! counts (for an `http::Request` whose only extension is the call, no
//! extension map either: three allocations in `http` 1.x). Plus what
//! tower's leaves to you: an [`Attempt`] layer inside for per-attempt timeouts,
//! the deadline check and attempt records, failure classification,
//! `Retry-After`, jitter, and a budget whose floor does not add to its
//! percentage. Tower's `Retry` retries as soon as the policy says so; this
//! one never sleeps into a deadline.
//!
//! # Settings as data
//!
//! [`RetryConfig`] holds every setting of the layer with serde (the same
//! field names in Rust, TOML and JSON, durations in `*_ms`), validates
//! them naming the field, and applies them with
//! [`RetryLayer::with_config`]; it is the `[retry]` section of a
//! `tower-llm` policy file.
//!
//! # Feature flags
//!
//! None.

mod attempt;
mod backoff;
mod budget;
mod config;
mod future;
mod layer;
mod policy;
mod rng;
mod service;

pub use attempt::{Attempt, AttemptFuture, AttemptLayer};
pub use backoff::{Backoff, InvalidBackoff, Jitter};
pub use budget::{Budget, InvalidBudget, RetryBudget};
pub use config::{BudgetConfig, InvalidRetryConfig, JitterSpec, NamedJitter, RetryConfig};
pub use future::ResponseFuture;
pub use layer::RetryLayer;
pub use policy::RetryPolicy;
pub use rng::{FixedFraction, RandomSource, SplitMix64};
pub use service::Retry;
