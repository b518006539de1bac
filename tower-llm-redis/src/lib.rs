//! The Redis plumbing shared by tower-llm's Redis-backed stores
//! (`tower-llm-breaker-redis`, `tower-llm-idempotency-redis`): written
//! once, so every store connects, reconnects, listens and hides
//! passwords the same way.
//!
//! - [`RedisSettings`]: the server (from a URL that is never shown), the
//!   key prefix, the command timeout, the reconnection backoff; a store's
//!   builder forwards its common knobs to it. It makes the store's
//!   [connection manager](RedisSettings::connection_manager).
//! - [`Backoff`]: 25 ms doubling up to the maximum between reconnection
//!   attempts; [`ping`] to learn that Redis is back.
//! - [`listen`]: the pub/sub loop, generic over what a message does (a
//!   [`Subscriber`]).
//! - [`Shutdown`] and [`ShutdownSignal`]: a store's tasks stop when the
//!   store is dropped.
//! - [`LocalShare`]: what a replica enforces alone while Redis is down.
//! - [`redact_url`]: a Redis URL for logs; [`Error`]: why a store could
//!   not be made.
//!
//! Most users never name this crate: they use a store. It is for those
//! who write one.
//!
//! ```no_run
//! use std::ops::ControlFlow;
//! use tower_llm_redis::{RedisSettings, Shutdown, Subscriber, listen};
//!
//! /// Prints every message on the channel.
//! struct Print;
//!
//! impl Subscriber for Print {
//!     fn on_message(&mut self, payload: &[u8]) -> ControlFlow<()> {
//!         println!("{}", String::from_utf8_lossy(payload));
//!         ControlFlow::Continue(())
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let redis = RedisSettings::new("example store", "redis://127.0.0.1:6379", "app:")?;
//! let shutdown = Shutdown::new();
//! let channel = redis.key("events");
//! redis.runtime()?.spawn(listen(redis.clone(), channel, Print, shutdown.signal()));
//! // ... the store's work; dropping `shutdown` stops the listener.
//! # Ok(())
//! # }
//! ```
//!
//! # Feature flags
//!
//! None. It depends on `redis` with the features the stores need
//! (`tokio-comp`, `connection-manager`, `script`) and nothing else by
//! default.

mod backoff;
mod error;
mod pubsub;
mod settings;
mod share;
mod shutdown;
mod url;

pub use backoff::Backoff;
pub use error::Error;
pub use pubsub::{Subscriber, listen};
pub use settings::{RedisSettings, ping};
pub use share::{InvalidShare, LocalShare};
pub use shutdown::{Shutdown, ShutdownSignal};
pub use url::redact_url;
