//! Idempotency shared between replicas through Redis: a key is answered
//! once across the fleet, and concurrent duplicates on any replica make
//! one upstream call.
//!
//! [`RedisIdempotencyStore`] is an [`IdempotencyStore`](tower_llm_idempotency::IdempotencyStore)
//! for any [`IdempotencyLayer`](tower_llm_idempotency::IdempotencyLayer).
//! Every replica using the same Redis (and prefix) sees the same keys: an
//! answer stored by one is replayed by all (a stream chunk for chunk), the
//! same key with another request is refused on every replica, and of
//! concurrent duplicates spread over replicas exactly one leads.
//!
//! ```no_run
//! use std::sync::Arc;
//! use tower::{Layer, service_fn};
//! use tower_llm_core::{ChatRequest, ChatResponse, Failure, FailureClass};
//! use tower_llm_idempotency::{IdempotencyConfig, IdempotencyLayer};
//! use tower_llm_idempotency_redis::RedisIdempotencyStore;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = RedisIdempotencyStore::open("redis://127.0.0.1:6379")?;
//! let layer = IdempotencyLayer::new(IdempotencyConfig::default())?.with_store(Arc::new(store));
//! let provider = service_fn(|_: ChatRequest| async {
//!     Err::<ChatResponse, _>(Failure::new(FailureClass::Transient))
//! });
//! let svc = layer.layer(provider);
//! # let _ = svc;
//! # Ok(())
//! # }
//! ```
//!
//! # How it works
//!
//! Each key is one Redis hash, `{prefix}{key}` (the layer's key is
//! already scoped and hashed: 64 hex characters), and each step of its
//! life is one Lua script, atomic on the server:
//!
//! - **begin**: a stored answer with the same fingerprint is replayed,
//!   with another one refused (422); a reservation with the same
//!   fingerprint means wait, with another one refused; otherwise the
//!   script reserves the key (fingerprint + a random lease, expiring
//!   after the lease TTL) and the call leads.
//! - **complete**: stores the answer (`serde_json` of `Stored`) for its
//!   TTL only if the lease still holds, ends the reservation and
//!   publishes the key on `{prefix}notices`.
//! - **release** (the leader failed or was dropped): ends the reservation
//!   if the lease still holds and publishes; spawned, never waited for.
//!
//! A waiting duplicate asks again when the notice for its key arrives, or
//! after the poll interval (50 ms by default) at the latest, the safety
//! net under pub/sub. A leader lost with its replica holds the key until
//! its reservation expires (60 s by default, not refreshed: set it above
//! your longest call); then one waiter leads.
//!
//! # What is exact, and what is not
//!
//! Exact while Redis answers: one leader per key across all replicas
//! (the reservation is one script); an answer is stored only by the
//! lease holder; a replay is the stored answer, never another request's.
//! Not exact: a leader that outlives its reservation loses the key (a
//! second call may lead; the late answer is not stored); waiters learn of
//! an answer within one pub/sub delivery, or one poll interval.
//!
//! # When Redis is down
//!
//! A command error or timeout (250 ms by default) switches the store to
//! an in-process [`MemoryStore`](tower_llm_idempotency::MemoryStore) at
//! once, for that call too: no call fails because of Redis, and
//! duplicates within one replica are still answered once (across replicas
//! they are not). Logged once per outage. A background task pings Redis
//! with backoff (25 ms doubling to 2 s) and, when it answers, the store
//! shares again. Answers stored in-process during the outage stay
//! in-process; a call waiting on an in-process leader when Redis comes
//! back may lead in Redis (one extra upstream call at the switch).
//! [`RedisIdempotencyStoreBuilder::with_local_fallback`]`(false)` answers
//! `StoreError` instead, and the layer serves calls without idempotency.
//!
//! # Keys
//!
//! `{prefix}{key}` (a hash: `fp`, and `lease` or `answer`) and the
//! channel `{prefix}notices`; the prefix defaults to `tower-llm:idem:`.
//! Every key expires: a reservation after the lease TTL, an answer after
//! its TTL (the layer's `ttl_ms`, or the call's own).
//!
//! The connection, the reconnection backoff, the pub/sub listener and the
//! URL handling are [`tower_llm_redis`]'s, shared with every Redis-backed
//! store of tower-llm.
//!
//! # Feature flags
//!
//! None.

mod scripts;
mod store;

pub use store::{RedisIdempotencyStore, RedisIdempotencyStoreBuilder, RedisIdempotencyStoreError};

/// Renamed [`RedisIdempotencyStore`] (the breaker's store had the same
/// name); this alias goes in the next release.
#[deprecated(note = "renamed `RedisIdempotencyStore`")]
pub type RedisStore = RedisIdempotencyStore;

/// Renamed [`RedisIdempotencyStoreBuilder`]; this alias goes in the next
/// release.
#[deprecated(note = "renamed `RedisIdempotencyStoreBuilder`")]
pub type RedisStoreBuilder = RedisIdempotencyStoreBuilder;

/// Renamed [`RedisIdempotencyStoreError`]; this alias goes in the next
/// release.
#[deprecated(note = "renamed `RedisIdempotencyStoreError`")]
pub type RedisStoreError = RedisIdempotencyStoreError;
