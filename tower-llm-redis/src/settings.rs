//! Where and how a store talks to Redis: the settings every Redis-backed
//! store has, and its connection.

use std::fmt;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::backoff::Backoff;
use crate::error::Error;

/// The settings every Redis-backed store has: the server (from its URL),
/// the prefix of its keys and channel, how long one command may take, and
/// the longest wait between reconnection attempts.
///
/// A store's builder keeps one and forwards its `with_prefix`,
/// `with_op_timeout` and `with_max_backoff` to it. Its `Debug` shows the
/// server's address, never the URL (it may carry a password).
///
/// ```
/// use std::time::Duration;
/// use tower_llm_redis::RedisSettings;
///
/// let redis = RedisSettings::new("redis example store", "redis://:hunter2@127.0.0.1:6379/0", "app:")?
///     .with_op_timeout(Duration::from_millis(100));
/// assert_eq!(redis.addr(), "127.0.0.1:6379");
/// assert_eq!(redis.key("events"), "app:events");
/// assert!(!format!("{redis:?}").contains("hunter2"));
/// # Ok::<(), tower_llm_redis::Error>(())
/// ```
#[derive(Clone)]
pub struct RedisSettings {
    store: &'static str,
    client: redis::Client,
    addr: String,
    prefix: String,
    op_timeout: Duration,
    max_backoff: Duration,
}

impl fmt::Debug for RedisSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The address only: never the URL (it may carry a password).
        f.debug_struct("RedisSettings")
            .field("addr", &self.addr)
            .field("prefix", &self.prefix)
            .field("op_timeout", &self.op_timeout)
            .field("max_backoff", &self.max_backoff)
            .finish_non_exhaustive()
    }
}

impl RedisSettings {
    /// Settings for the Redis at `url` (`redis://[:password@]host[:port][/db]`):
    /// keys under `prefix`, commands bounded by 250 ms, reconnection
    /// attempts at most 2 s apart. `store` names the store in errors
    /// (`"redis breaker store"`).
    ///
    /// # Errors
    ///
    /// When the URL does not parse ([`Error::is_invalid_url`]); the error
    /// never quotes it.
    pub fn new(store: &'static str, url: &str, prefix: impl Into<String>) -> Result<Self, Error> {
        let client = redis::Client::open(url)
            // The error may quote the URL: do not pass it on.
            .map_err(|_| Error::invalid_url(store))?;
        Ok(RedisSettings {
            store,
            addr: client.get_connection_info().addr().to_string(),
            client,
            prefix: prefix.into(),
            op_timeout: Duration::from_millis(250),
            max_backoff: Duration::from_secs(2),
        })
    }

    /// The prefix of every key and of the channel. Replicas share a
    /// store's state when they share it.
    #[must_use]
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long one command (or connecting, or subscribing) may take
    /// before Redis counts as down (default 250 ms).
    #[must_use]
    pub fn with_op_timeout(mut self, timeout: Duration) -> Self {
        self.op_timeout = timeout;
        self
    }

    /// The longest wait between reconnection attempts (default 2 s, at
    /// least 25 ms; they start at 25 ms and double: [`Backoff`]).
    #[must_use]
    pub fn with_max_backoff(mut self, max: Duration) -> Self {
        self.max_backoff = max.max(Backoff::FIRST);
        self
    }

    /// The store's name in errors.
    pub fn store(&self) -> &'static str {
        self.store
    }

    /// The server's address (`host:port`, or a socket path): what logs
    /// and `Debug` show instead of the URL.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// The prefix of every key and of the channel.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// `name` under the prefix: a key or a channel.
    pub fn key(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    /// How long one command may take before Redis counts as down.
    pub fn op_timeout(&self) -> Duration {
        self.op_timeout
    }

    /// The longest wait between reconnection attempts.
    pub fn max_backoff(&self) -> Duration {
        self.max_backoff
    }

    /// A fresh [`Backoff`] up to [`max_backoff`](RedisSettings::max_backoff).
    pub fn backoff(&self) -> Backoff {
        Backoff::new(self.max_backoff)
    }

    /// The client, for pub/sub and for anything else a store opens.
    pub fn client(&self) -> &redis::Client {
        &self.client
    }

    /// The tokio runtime a store spawns its background tasks on: the
    /// current one.
    ///
    /// # Errors
    ///
    /// Outside a tokio runtime ([`Error::is_no_runtime`]).
    pub fn runtime(&self) -> Result<tokio::runtime::Handle, Error> {
        tokio::runtime::Handle::try_current().map_err(|_| Error::no_runtime(self.store))
    }

    /// A connection manager that connects on first use: connecting and
    /// each response bounded by the command timeout, one retry, then
    /// reconnection in the background with waits up to the maximum
    /// backoff. Clones share its connection.
    ///
    /// # Errors
    ///
    /// When the `redis` crate refuses to make it
    /// ([`Error::is_connection_manager`]).
    pub fn connection_manager(&self) -> Result<ConnectionManager, Error> {
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.op_timeout))
            .set_response_timeout(Some(self.op_timeout))
            .set_number_of_retries(1)
            .set_max_delay(self.max_backoff);
        ConnectionManager::new_lazy_with_config(self.client.clone(), config)
            .map_err(|_| Error::connection_manager(self.store))
    }
}

/// `true` if Redis answers `PING` on `conn` within `timeout`.
pub async fn ping(conn: &mut ConnectionManager, timeout: Duration) -> bool {
    let pong = tokio::time::timeout(timeout, redis::cmd("PING").query_async::<String>(conn)).await;
    matches!(pong, Ok(Ok(_)))
}

#[cfg(test)]
mod tests {
    use super::RedisSettings;

    #[test]
    fn errors_and_debug_never_show_the_password() {
        let redis = RedisSettings::new("test store", "redis://user:hunter2@127.0.0.1:1", "p:")
            .expect("parses");
        let shown = format!("{redis:?}");
        assert!(
            shown.contains("127.0.0.1:1") && !shown.contains("hunter2"),
            "{shown}"
        );
        let err =
            RedisSettings::new("test store", "http://:hunter2@x", "p:").expect_err("not redis");
        assert!(err.is_invalid_url());
        assert_eq!(err.to_string(), "test store: invalid Redis URL");
    }

    #[test]
    fn outside_a_runtime_is_an_error() {
        let redis = RedisSettings::new("test store", "redis://127.0.0.1:1", "p:").expect("parses");
        assert!(redis.runtime().expect_err("no runtime").is_no_runtime());
    }
}
