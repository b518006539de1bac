//! Hedging for LLM calls: cut the latency tail with a second attempt,
//! budgeted, and never duplicate a streamed token.
//!
//! [`HedgeLayer`] sends a call's request as usual; if the attempt has not
//! answered after the *hedge delay* (for a streaming service: has not
//! committed its first content frame, which is when a tower-llm streaming
//! provider's future resolves), it sends a copy too. The first to succeed
//! wins; the other is dropped at that moment (its connection closed, its
//! attempt records marked
//! [`CancelledByHedge`](tower_llm_core::AttemptOutcome::CancelledByHedge)).
//! A stream is returned only once it has committed, and only one stream is
//! ever returned, so a client never sees tokens from two attempts.
//!
//! ```
//! use std::time::Duration;
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//! use tower_llm_core::{ChatRequest, ChatResponse, Failure, Message};
//! use tower_llm_hedge::{HedgeConfig, HedgeLayer};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! // The first call hangs for 10 s; the second (the hedge) answers in 50 ms.
//! let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
//! let provider = service_fn(move |_req: ChatRequest| {
//!     let n = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
//!     async move {
//!         let wait = if n == 0 { 10_000 } else { 50 };
//!         tokio::time::sleep(Duration::from_millis(wait)).await;
//!         Ok::<_, Failure>(ChatResponse {
//!             id: n.to_string(), model: "m".into(), provider: "mock".into(),
//!             ..ChatResponse::default()
//!         })
//!     }
//! });
//! let svc = ServiceBuilder::new()
//!     .layer(HedgeLayer::new(HedgeConfig { delay_ms: 200, ..HedgeConfig::default() }).unwrap())
//!     .service(provider);
//! let start = tokio::time::Instant::now();
//! let res = svc.oneshot(ChatRequest::new("m", vec![Message::user("hi")])).await.unwrap();
//! assert_eq!(res.id, "1"); // the hedge's answer
//! assert_eq!(start.elapsed(), Duration::from_millis(250)); // 200 ms delay + 50 ms
//! assert_eq!(res.attempts.len(), 0); // records come from a retry layer or breaker inside
//! # }
//! ```
//!
//! # When a hedge starts
//!
//! - After the delay: fixed (`delay_ms`), or learned per layer as a
//!   quantile of recent times to answer (`quantile`, e.g. `0.95`, at least
//!   `floor_ms`; `delay_ms` until `min_samples` are seen), over a sliding
//!   window of 10 to 20 s.
//! - Only for a request that may be sent twice: never one marked
//!   [`NotReplayable`](tower_llm_core::NotReplayable).
//! - Only within the hedge budget: at most `budget_ratio` (default 10 %)
//!   of the calls over 10 s are hedged, or `budget_min_per_sec` × 10 if
//!   more (default 1 per second, so a quiet service still hedges; the
//!   lock-free [`RetryBudget`]): a slow-everything storm adds at most that
//!   much load.
//!   A refusal counts `ai_router_hedges_total{outcome="skipped_budget"}`.
//! - Only if `min_useful_ms` (default 1 s) is left before the call's
//!   deadline at the hedge time; otherwise no timer is even armed.
//! - Never after the first attempt failed: retrying and failing over are
//!   the retry and fallback layers' work.
//! - Never into an open circuit: with a breaker inside, a hedge to an
//!   open key is refused by the breaker at once, without a provider call,
//!   and the first attempt goes on alone.
//!
//! # Where it goes
//!
//! deadline → fallback → **hedge** → retry → breaker → provider, one hedge
//! layer per link:
//!
//! - inside the deadline, so both attempts share the call's one deadline
//!   and a hedge never starts when it cannot finish;
//! - inside the fallback, so a link whose attempts both fail still fails
//!   over, and the fallback's request copy is not hedged twice;
//! - outside the retry layer, so each branch retries on its own and a
//!   slow *first* attempt is hedged before a retry timer would even fire;
//! - outside the breaker, so the breaker sees each hedged attempt as an
//!   attempt: the loser's cancellation neither trips nor resets it (its
//!   half-open probe slot, if it held one, is released).
//!
//! [`HedgeLayer::to`] hedges to another service (the next link's stack, a
//! cross-provider hedge) instead of a second connection to the same link.
//!
//! # Why not `tower::hedge`
//!
//! tower's `Hedge` returns whichever attempt *finishes* first, error or
//! not (a fast failure of the hedge beats a slow success), has no budget,
//! knows no deadline and needs the `hdrhistogram` crate. This layer keeps
//! its shape (a latency percentile, a second request, the first answer
//! wins) with the rules above, and a 64-bucket lock-free histogram.

mod config;
mod future;
mod latency;
mod layer;
mod service;

pub use config::{HedgeConfig, InvalidHedgeConfig};
pub use future::ResponseFuture;
pub use layer::{CrossHedgeLayer, HedgeLayer};
pub use service::Hedge;
pub use tower_llm_retry::{Budget, RetryBudget};
