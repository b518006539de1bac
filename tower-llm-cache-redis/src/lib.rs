//! A response cache shared between replicas through Redis: an answer
//! cached by one replica is a hit on every other, a stream chunk for
//! chunk, and every replica computes the same age for it.
//!
//! [`RedisCache`] is a [`CacheStore`](tower_llm_cache::CacheStore) for
//! `tower-llm-cache`. Every replica using the same Redis (and prefix)
//! sees the same entries.
//!
//! ```no_run
//! use std::sync::Arc;
//! use tower_llm_cache::{CacheConfig, CacheLayer};
//! use tower_llm_cache_redis::RedisCache;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let layer = CacheLayer::new(CacheConfig::default())?
//!     .with_store(Arc::new(RedisCache::open("redis://127.0.0.1:6379")?));
//! # let _ = layer;
//! # Ok(())
//! # }
//! ```
//!
//! The store on its own (what the layer does with it):
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//! use tower_llm_cache::CacheStore;
//! use tower_llm_cache_redis::RedisCache;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = RedisCache::builder("redis://127.0.0.1:6379")?
//!     .with_op_timeout(Duration::from_millis(100))
//!     .build()?;
//! // The layer's keys are scoped by tenant and hashed: 64 hex characters.
//! let key: Arc<str> = Arc::from("0f".repeat(32));
//! match store.get(key).await {
//!     Ok(Some(entry)) => println!("a hit, stored {:?} ago", entry.age),
//!     Ok(None) => println!("a miss"),
//!     Err(e) => println!("no cache for this call: {e}"),
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # How it works
//!
//! Each key is one Redis hash, `{prefix}{key}` (the layer's key is
//! already scoped and hashed), and each operation is one Lua script on
//! that one key (so it works on a Redis Cluster as it is):
//!
//! - **put**: reads the server's clock (`TIME`), replaces the key with
//!   `at` (that clock in ms) and `answer` (`serde_json` of `Stored`), and
//!   sets it to expire after `keep` (`PEXPIRE`; Redis forgets a key
//!   once it is past its expiry, so an answer exactly `keep` old, by the
//!   millisecond, is still held, as the `CacheStore` contract asks).
//! - **get**: replies the server's clock with the entry, so the age is
//!   `now - at` on one clock, the same on every replica (and zero, never
//!   negative, if the server's clock went back).
//!
//! An entry that does not decode (another shape, corrupted JSON, a key
//! of another type written by something else) is a miss, logged once per
//! store, never an error or a panic; the next put replaces it.
//!
//! # When Redis is down
//!
//! Every command is bounded by the command timeout (250 ms by default),
//! a frozen server included. A connection error or a timeout switches the
//! store to an in-process [`MemoryCache`](tower_llm_cache::MemoryCache)
//! at once, for that call too: `get` answers from it (a hit only for what
//! this replica put meanwhile), `put` keeps the answer there and returns
//! `Ok`. Logged once per outage. A background task pings Redis with
//! backoff (25 ms doubling to 2 s) and, when it answers, the store shares
//! again; what was kept in-process meanwhile stays there and is no longer
//! served. [`RedisCacheBuilder::with_local_fallback`]`(false)` makes
//! `get` and `put` return `StoreError` instead (quickly: once Redis is
//! known down, no command is sent until it answers a ping), and the layer
//! serves calls uncached.
//!
//! A command Redis answers with an error (a write refused for
//! `maxmemory`, a read-only replica) is a `StoreError` for that call,
//! logged once per store by its error code; the store stays up.
//!
//! Keys and answers are never logged, and the URL never shown (`Debug`
//! shows the server's address); the connection, the reconnection backoff
//! and the URL handling are [`tower_llm_redis`]'s, shared with every
//! Redis-backed store of tower-llm.
//!
//! # Keys
//!
//! `{prefix}{key}`, a hash with `at` and `answer`; the prefix defaults to
//! `tower-llm:cache:`. Every key expires after the `keep` it was put
//! with.
//!
//! # Feature flags
//!
//! None.

mod scripts;
mod store;

pub use store::{RedisCache, RedisCacheBuilder, RedisCacheError};
