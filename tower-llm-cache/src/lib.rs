//! A response cache for LLM calls: the same request from the same tenant
//! gets the stored answer, and when every provider is down, a known-good
//! answer stored earlier (the stale-safe rung).
//!
//! [`CacheLayer`] sits outside a route's fallback chain, inside its
//! deadline: deadline → idempotency → **cache** → resume → budget →
//! fallback → retry → breaker → provider.
//!
//! - **Exact.** Keyed by the request's fingerprint (SHA-256 of its model,
//!   messages, tools, sampling parameters and whether it streams: the
//!   idempotency layer's [`IdempotentRequest`](tower_llm_idempotency::IdempotentRequest))
//!   and its tenant (opaque bytes, [`TenantFn`](tower_llm_idempotency::TenantFn)):
//!   two tenants asking the same thing never share an answer.
//! - **Fresh while younger than `ttl_ms`** (RFC 9111 §4.2). A hit makes no provider call, costs no
//!   budget, and is marked ([`CacheOutcome`](tower_llm_core::CacheOutcome)
//!   on [`ChatResponse::cache`](tower_llm_core::ChatResponse::cache) and
//!   [`ChatStream::cache_outcome`](tower_llm_core::ChatStream::cache_outcome):
//!   hit, miss or stale, with its age). A stream is stored at its clean
//!   end and replayed chunk for chunk.
//! - **The request's `Cache-Control`** ([`CacheControl`]): `no-cache`
//!   (ask a provider, store its answer), `no-store` (do not store this
//!   answer), `max-age` (take no older answer), `stale-if-error` (take no
//!   staler answer on failure). The route's settings cap them: a client
//!   can shorten what it accepts, never make the cache keep answers
//!   longer. A malformed header is ignored.
//! - **The stale-safe rung.** With `stale_ms`, an answer is kept that
//!   much past its freshness; when every provider fails (the chain's
//!   failure is an outage: transient, rate limited, provider quota,
//!   timeout, circuit open, invalid response, the deadline; or the
//!   fallback built its degraded answer after the last link failed so),
//!   the call gets the answer found when it began, marked stale, if it is
//!   young enough when served and the request is admitted
//!   (`stale_for_risk` on the `x-llm-risk` header; a `max-age` without
//!   `stale-if-error` refuses stale answers). At the call's deadline, a call holding a stale
//!   answer gets it rather than the deadline's error.
//! - **Never stored:** failures, degraded answers, streams that end with
//!   an error or were continued after they broke, answers that call
//!   tools (unless `store_tool_calls`), answers to `no-store` requests,
//!   answers over `max_entry_bytes`.
//! - **Bounded.** [`MemoryCache`] holds at most its bytes of answers
//!   (oldest out first); a store shared between replicas
//!   (`tower-llm-cache-redis`) implements [`CacheStore`]. A store that
//!   cannot answer makes the call a miss, logged once per outage.
//!
//! ```
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//! use tower_llm_cache::{CacheConfig, CacheLayer};
//! use tower_llm_core::{CacheStatus, ChatRequest, ChatResponse, Failure, Message};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let calls = Arc::new(AtomicUsize::new(0));
//! let counted = calls.clone();
//! let provider = service_fn(move |_req: ChatRequest| {
//!     counted.fetch_add(1, Ordering::SeqCst);
//!     async { Ok::<_, Failure>(ChatResponse::builder("m").text("Paris").build()) }
//! });
//! let svc = ServiceBuilder::new()
//!     .layer(CacheLayer::new(CacheConfig::default()).unwrap())
//!     .service(provider);
//! let ask = || ChatRequest::new("m", vec![Message::user("Capital of France?")]);
//! let first = svc.clone().oneshot(ask()).await.unwrap();
//! let again = svc.oneshot(ask()).await.unwrap();
//! assert_eq!(first.cache.unwrap().status, CacheStatus::Miss);
//! assert_eq!(again.cache.unwrap().status, CacheStatus::Hit);
//! assert_eq!(again.text(), "Paris");
//! assert_eq!(calls.load(Ordering::SeqCst), 1);
//! # }
//! ```

mod answer;
mod config;
mod control;
mod layer;
mod store;

pub use answer::{CacheAnswer, Sink};
pub use config::{CacheConfig, CacheStoreConfig, InvalidCacheConfig, RISK_HEADER};
pub use control::CacheControl;
pub use layer::{Cache, CacheHeaders, CacheLayer, OwnHeaders, ResponseFuture};
pub use store::{CacheEntry, CacheStore, MemoryCache, StoreError};
