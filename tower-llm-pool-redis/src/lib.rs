//! A deployment's rate-limit buckets shared by every replica through
//! Redis: the fleet together stays within a deployment's limits while
//! Redis answers, and a stated share per replica while it does not.
//!
//! [`RedisPacing`] is a [`SharedPacing`](tower_llm_pool::SharedPacing)
//! store for `tower-llm-pool`'s pacers: give every deployment's
//! [`Pacer`](tower_llm_pool::Pacer) the store and the deployment's name
//! ([`Pacer::with_shared`](tower_llm_pool::Pacer::with_shared)), and a
//! [`Pool`](tower_llm_pool::Pool) takes from the replica's own buckets
//! (what the provider's headers say) and then from the fleet's, and gives
//! back to both what a request did not use.
//!
//! ```no_run
//! use std::sync::Arc;
//! use tower_llm_pool::{PaceLimits, Pacer, SharedPacing};
//! use tower_llm_pool_redis::RedisPacing;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store: Arc<dyn SharedPacing> = Arc::new(
//!     RedisPacing::builder("redis://127.0.0.1:6379")?
//!         .with_replicas(4) // while Redis is down, each replica paces at a quarter
//!         .build()?,
//! );
//! let limits = PaceLimits { rpm: Some(500), tpm: Some(200_000), burst_ms: None };
//! let pacer = Arc::new(Pacer::new(limits).with_shared(store.clone(), "openai-key-1"));
//! match pacer.take(1_200).await {
//!     Ok(ticket) => {
//!         // ... the call; then what it used (the rest goes back):
//!         ticket.settle(800);
//!     }
//!     Err(room_at) => println!("no room before {room_at:?}"),
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # How it works
//!
//! Each deployment's buckets are one Redis hash, and each step is one Lua
//! script on it, atomic on the server and on the server's clock (`TIME`,
//! in ms), so replicas' clocks do not matter:
//!
//! - **take**: refills the request bucket and the token bucket
//!   continuously at their limit per 60 s (their capacity is the limit,
//!   as in a [`Pacer`](tower_llm_pool::Pacer); a limit of 0 counts as 1, a
//!   limit not set is not paced), then takes one request and the
//!   request's estimated tokens from both, or from neither, and answers
//!   what was taken or the milliseconds until both have room (a request
//!   larger than the token bucket goes when it is full). Levels are
//!   integers (units × 60,000; exact for any `u32` limit).
//! - **give-back**: refills, then adds the tokens a request did not use
//!   (never past the capacity). Sent on a task of its own when a ticket
//!   is settled: it never waits.
//!
//! The limits are the pacer's configured ones, sent with every call:
//! give every replica the same limits (and names) for a deployment.
//!
//! # What is exact
//!
//! While Redis answers, the fleet never exceeds a deployment's configured
//! rpm and tpm (over any span, the bucket's capacity plus its refill) by
//! more than the estimates of the requests in flight: a request takes its
//! estimate before it is sent, and what it did not use goes back when it
//! is settled, so the only slack is estimates that undercount (a request
//! without an estimate takes no tokens) and tokens in flight. The
//! provider's rate-limit headers are still read per replica: each
//! replica's own pacer, consulted first, lowers its buckets by what the
//! provider says (and a `Retry-After` holds that replica off), which can
//! only make the fleet send less.
//!
//! Not exact: a take whose reply has not come within the op timeout is
//! paced at the local share, that request alone (the store stays shared;
//! [`RedisPacing::late_takes`]), and if its script ran, what it took stays
//! taken until the bucket refills (errs on the side of sending less), as
//! does what a take dropped before its reply took. A give-back that fails
//! or is dropped (more than 4,096 in flight;
//! [`RedisPacing::dropped_give_backs`]) leaves its tokens taken until the
//! bucket refills (within 60 s). Give-backs are not sent while Redis is
//! down.
//!
//! # When Redis is down
//!
//! Slow is not down. Redis counts as down on an error on the connection
//! (refused, reset, closed), or when it does not answer a `PING` within
//! the **op timeout** (250 ms by default;
//! [`RedisPacingBuilder::with_op_timeout`]). The `PING`s are a
//! background task's, on a connection of its own: sent when a take's
//! reply is late (at most one every quarter of the op timeout). A take
//! waits for its reply, or for Redis to be declared down, at most the op
//! timeout: a frozen server costs a take one op timeout at most, and once
//! declared down (about two op timeouts after it froze) none at all.
//!
//! While Redis is down, every take is paced at once, in-process, by a
//! [`Pacer`](tower_llm_pool::Pacer) per deployment whose limits are the
//! configured ones × the **local share** `s`
//! ([`RedisPacingBuilder::with_local_share`], 0 < s ≤ 1, default 1;
//! [`with_replicas(n)`](RedisPacingBuilder::with_replicas) sets 1/n),
//! rounded down; made full on first use and kept across outages. Logged
//! once when it starts (warn) and once when it ends (info);
//! [`RedisPacing::is_shared`] and the `ai_router_pool_shared_store_up`
//! gauge ([`RedisPacing::register_metrics`]) read `false` / 0 meanwhile.
//!
//! **The bound**: with N replicas each holding share s, while Redis is
//! down the fleet may send up to N × s × a deployment's limits (each
//! replica's bucket starting full), on top of what Redis let through
//! before; with s = 1/N, the limits. The background task pings with
//! backoff (25 ms doubling to the max backoff, 2 s by default) on the
//! takes' connection, and shares again at the first `PONG`. A Redis that
//! lost its data (a restart without persistence) starts with full
//! buckets.
//!
//! # Keys
//!
//! One hash per deployment: `{prefix}{deployment}` (the prefix defaults
//! to `tower-llm:pace:`), fields `r` and `t` (the buckets' levels) and
//! `at` (their last refill, server ms). It expires 60 s after its last
//! write: a missing hash is full buckets, which is what 60 s untouched
//! makes them. Deployment names are the operator's: the keys are bounded
//! by the configuration. One key per call: a Redis Cluster works too.
//!
//! The URL handling, the reconnection backoff and the connections are
//! [`tower_llm_redis`]'s, shared with every Redis-backed store of
//! tower-llm: give it the breaker's and the quotas' server
//! ([`RedisPacing::with_settings`]) under a prefix of its own.
//!
//! # Feature flags
//!
//! None.

mod builder;
mod error;
mod inner;
mod liveness;
mod scripts;
mod store;

pub use builder::RedisPacingBuilder;
pub use error::RedisPacingError;
pub use store::RedisPacing;
