//! Circuits shared across replicas through Redis: one replica trips, all
//! are protected.
//!
//! [`RedisBreakerStore`] is a [`BreakerStore`](tower_llm_breaker::BreakerStore)
//! for any [`BreakerLayer`](tower_llm_breaker::BreakerLayer). Every
//! replica using the same Redis and prefix sees the same circuits: failures
//! from all of them add up toward one threshold (and one ratio window), an
//! open is adopted by every replica as soon as it is published, half-open
//! admits `half_open_probes` probes across the whole fleet, and a circuit
//! isolated or closed by hand on one replica is isolated or closed on all.
//!
//! ```no_run
//! use std::sync::Arc;
//! use tower::{Layer, service_fn};
//! use tower_llm_breaker::{BreakerConfig, BreakerLayer};
//! use tower_llm_breaker_redis::RedisBreakerStore;
//! use tower_llm_core::{ChatRequest, ChatResponse, Failure, FailureClass};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let config = BreakerConfig { consecutive_failures: 5, ..BreakerConfig::default() };
//! // The same config for the store and the layer: the store runs the
//! // shared threshold, cooldown and probe count with it.
//! let store = RedisBreakerStore::open("redis://127.0.0.1:6379", config)?;
//! let layer = BreakerLayer::new().with_config(config)?.with_store(Arc::new(store));
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
//! Each replica keeps its circuits locally (a
//! [`MemoryStore`](tower_llm_breaker::MemoryStore)) and the request path
//! reads only those: admission never waits on Redis, in any state. Each
//! local circuit reports what it counts through
//! [`CircuitEvents`](tower_llm_breaker::CircuitEvents) into a bounded
//! queue (full: the report is dropped and counted, never waited for); a
//! background task runs one atomic Lua script per report. Successes are
//! written only when failures are being counted somewhere (a `failing`
//! notice tells every replica), or in batches for a ratio trigger.
//!
//! When a script opens the shared circuit it publishes the open, with the
//! rest of its cooldown in the server's time; every replica adopts it from
//! the channel (and from the script's reply, for the replica that ran it).
//! Every second (by default) each replica reads its circuits back (one
//! pipelined round trip per 256 circuits), the safety net under pub/sub.
//! [`RedisBreakerStoreBuilder::on_adopted`] is told of every change adopted from
//! another replica.
//!
//! When the shared cooldown ends, each replica that knows the circuit asks
//! for one probe token with one script (at most `half_open_probes` live
//! across the fleet, each expiring one cooldown after its reservation, so
//! a probe lost with its replica frees its slot then). A half-open local
//! circuit admits a probe only against a token it holds; without one, the
//! call is refused as open (it would have been anyway) and more tokens
//! are asked for, in the background. No call waits for Redis, not even a
//! probe.
//!
//! # What is exact, and what is not
//!
//! Exact (one script, atomic on the server): the fleet's consecutive count
//! and ratio window, the open decision and its cooldown, the probe tokens
//! (never more than `half_open_probes` live), the close after that many
//! probe successes, isolate and close by hand. Not exact: a replica learns
//! an open within one pub/sub delivery (about a millisecond on a LAN), so
//! calls admitted in that moment still go out; a success on a replica
//! that has not yet heard the `failing` notice does not reset the shared
//! count; reports dropped from a full queue are lost.
//!
//! # When Redis is down
//!
//! A command error or timeout (250 ms by default), or the end of the
//! subscription, switches every circuit to local-only breaking at once
//! (logged once; the `llm_breaker_shared_store_up` gauge reads 0). Reports
//! are not queued while down. The store reconnects with backoff (25 ms
//! doubling to 2 s) and, when back, reads every circuit: a newer shared
//! state is adopted, and what a replica decided alone (an open, an
//! isolation, a close by hand) is pushed. No call fails or waits because
//! of Redis.
//!
//! # Keys
//!
//! `{prefix}{provider}/{model}[/{scope}]` (a hash), the same plus
//! `:probes` (a sorted set), and the channel `{prefix}events`; the prefix
//! defaults to `tower-llm:breaker:`. Every key expires an hour after its
//! last change (an open one, its cooldown plus that); a forgotten key
//! reads closed.
//!
//! The connection, the reconnection backoff, the pub/sub listener and the
//! URL handling are [`tower_llm_redis`]'s, shared with every Redis-backed
//! store of tower-llm.
//!
//! # Feature flags
//!
//! None.

mod entry;
mod fleet;
mod inner;
mod link;
mod scripts;
mod store;
mod worker;

pub use store::{RedisBreakerStore, RedisBreakerStoreBuilder, RedisBreakerStoreError};

/// Renamed [`RedisBreakerStore`] (the idempotency store had the same
/// name); this alias goes in the next release.
#[deprecated(note = "renamed `RedisBreakerStore`")]
pub type RedisStore = RedisBreakerStore;

/// Renamed [`RedisBreakerStoreBuilder`]; this alias goes in the next
/// release.
#[deprecated(note = "renamed `RedisBreakerStoreBuilder`")]
pub type RedisStoreBuilder = RedisBreakerStoreBuilder;

/// Renamed [`RedisBreakerStoreError`]; this alias goes in the next
/// release.
#[deprecated(note = "renamed `RedisBreakerStoreError`")]
pub type RedisStoreError = RedisBreakerStoreError;
