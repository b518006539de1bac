//! Idempotency for LLM calls: a repeated request with the same key gets
//! the stored answer, and concurrent duplicates make one upstream call.
//!
//! A client that times out and retries, a queue that redelivers, a user
//! who double-clicks: each would pay for a second generation and get a
//! different answer. With [`IdempotencyLayer`], a call carrying a key (an
//! [`IdempotencyKey`](tower_llm_core::IdempotencyKey) in its carrier, or an
//! `Idempotency-Key` header on an `http::Request`) is answered once:
//!
//! - **Stored**: successful, complete answers only, for `ttl_ms` (default
//!   24 h; per call with `IdempotencyKey::with_ttl`), in a store bounded in
//!   bytes. A failure is never stored. A stream is stored only once it has
//!   ended cleanly (collected as it passes to the caller) and is replayed
//!   as a stream of the same chunks.
//! - **Fingerprinted**: SHA-256 of the request (model, messages,
//!   parameters) is stored with the answer. The same key with another
//!   request is refused (`idempotency_key_reused`: a bad request, HTTP
//!   422), never answered with the other request's result.
//! - **Single flight**: the first call with a key leads; the others wait
//!   for its answer (up to their own deadline) and get the same one. If
//!   the leader fails or is dropped, its hold is released and one waiter
//!   goes ahead. With `concurrent = "reject"`, a duplicate is refused at
//!   once instead (`idempotency_key_in_use`, 409).
//! - **Scoped**: a tenant function ([`IdempotencyLayer::with_tenant`])
//!   separates keys, so two tenants with the same key never share.
//! - **Marked**: a replayed answer says so (`ChatResponse::idempotent_replayed`,
//!   `ChatStream::is_idempotent_replay`), carries the original call's
//!   attempt records, makes no upstream attempt and counts
//!   `ai_router_idempotent_replays_total`.
//! - **Free when unused**: a call without a key goes straight through.
//!
//! ```
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use std::time::Duration;
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//! use tower_llm_core::{ChatRequest, ChatResponse, Failure, IdempotencyKey, Message};
//! use tower_llm_idempotency::{IdempotencyConfig, IdempotencyLayer};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let calls = Arc::new(AtomicUsize::new(0));
//! let counted = calls.clone();
//! let provider = service_fn(move |_req: ChatRequest| {
//!     let n = counted.fetch_add(1, Ordering::SeqCst);
//!     async move {
//!         Ok::<_, Failure>(ChatResponse {
//!             id: format!("answer {n}"), model: "m".into(), provider: "mock".into(),
//!             ..ChatResponse::default()
//!         })
//!     }
//! });
//! let svc = ServiceBuilder::new()
//!     .layer(IdempotencyLayer::new(IdempotencyConfig::default()).unwrap())
//!     .service(provider);
//! let req = || {
//!     let mut req = ChatRequest::new("m", vec![Message::user("charge the card")]);
//!     IdempotencyKey::new("order-42").store(&mut req);
//!     req
//! };
//! let first = svc.clone().oneshot(req()).await.unwrap();
//! let again = svc.oneshot(req()).await.unwrap();
//! assert_eq!((first.id.as_str(), again.id.as_str()), ("answer 0", "answer 0"));
//! assert!(again.idempotent_replayed);
//! assert_eq!(calls.load(Ordering::SeqCst), 1);
//! # }
//! ```
//!
//! # Where it goes
//!
//! deadline → **idempotency** → fallback → retry → breaker: a replay
//! short-circuits retries and failover, is never charged again, and is
//! still observed by the deadline layer's telemetry; waiting for another
//! call's answer is bounded by this call's deadline. A waiting duplicate
//! keeps the inner service it was made ready with: a service that reserves
//! something in `poll_ready` (a concurrency permit) holds it while it
//! waits. A degraded answer (every link failed, the fallback built one)
//! is never stored.
//!
//! # Stores
//!
//! [`MemoryStore`] (the default) is in-process. Another store (shared
//! between replicas) implements [`IdempotencyStore`]: the
//! `tower-llm-idempotency-redis` crate's `RedisIdempotencyStore` shares answers and
//! reservations through Redis (and falls back to an in-process
//! `MemoryStore` while Redis is down). A store that cannot answer
//! ([`StoreError`]) makes the layer serve calls without idempotency rather
//! than fail them, and log it once.

mod answer;
mod config;
mod frames;
mod future;
mod layer;
mod store;

pub use answer::{Capture, IdempotentAnswer, IdempotentRequest};
pub use config::{Concurrent, IDEMPOTENCY_KEY, IdempotencyConfig, InvalidIdempotencyConfig};
pub use frames::{FramesIter, StreamFrames, StreamFramesBuilder};
pub use future::ResponseFuture;
pub use layer::{Idempotency, IdempotencyLayer, NoTenant, TenantFn};
pub use store::{
    Begin, BoxFuture, Fingerprint, IdempotencyStore, Lease, MemoryStore, StoreError, Stored,
};
