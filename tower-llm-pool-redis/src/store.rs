//! The store: [`RedisPacing`], its accessors and metrics, and its
//! [`SharedPacing`] side.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use opentelemetry::metrics::{Meter, ObservableGauge};
use tower_llm_pool::{PaceLimits, Pacer, SharedPacing, SharedTake};
use tower_llm_redis::{RedisSettings, Shutdown};

use crate::builder::RedisPacingBuilder;
use crate::error::RedisPacingError;
use crate::inner::{Inner, STORE};

/// Deployments' buckets shared by every replica using the same Redis
/// (and prefix): a [`SharedPacing`] for
/// [`Pacer::with_shared`](tower_llm_pool::Pacer::with_shared). See the
/// [crate docs](crate).
///
/// Made inside a tokio runtime (it spawns a task that watches Redis's
/// liveness); the task stops when the store is dropped.
pub struct RedisPacing {
    pub(crate) inner: Arc<Inner>,
    /// Stops the liveness task when the store is dropped.
    pub(crate) _shutdown: Shutdown,
}

impl fmt::Debug for RedisPacing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The address only: never the URL (it may carry a password).
        f.debug_struct("RedisPacing")
            .field("redis", &self.inner.redis)
            .field("local_share", &self.inner.share.get())
            .field("shared", &self.is_shared())
            .finish_non_exhaustive()
    }
}

impl RedisPacing {
    /// A store on the Redis at `url` (`redis://[:password@]host[:port][/db]`)
    /// with the default settings: keys under `tower-llm:pace:`, a 250 ms
    /// op timeout, a local share of 1 (see
    /// [`RedisPacingBuilder::with_local_share`]).
    ///
    /// # Errors
    ///
    /// When the URL does not parse, or there is no tokio runtime. A
    /// server that does not answer is not an error: the first take finds
    /// out, and the store paces in-process until it answers.
    pub fn open(url: &str) -> Result<Self, RedisPacingError> {
        RedisPacing::builder(url)?.build()
    }

    /// A builder for a store on the Redis at `url`.
    ///
    /// # Errors
    ///
    /// When the URL does not parse.
    pub fn builder(url: &str) -> Result<RedisPacingBuilder, RedisPacingError> {
        let redis = RedisSettings::new(STORE, url, "tower-llm:pace:")?;
        Ok(RedisPacing::with_settings(redis))
    }

    /// A builder for a store with Redis `settings` made by the caller
    /// (their prefix, op timeout and backoff are kept): the same server
    /// as the breaker's and the quotas', under a prefix of its own.
    pub fn with_settings(settings: RedisSettings) -> RedisPacingBuilder {
        RedisPacingBuilder::new(settings)
    }

    /// `true` while Redis answers: deployments' buckets are shared by the
    /// fleet (a late take aside). `false`: this replica paces every
    /// deployment at its local share in-process until Redis answers
    /// again.
    pub fn is_shared(&self) -> bool {
        self.inner.is_up()
    }

    /// This replica's share of every limit while Redis is down.
    pub fn local_share(&self) -> f64 {
        self.inner.share.get()
    }

    /// The in-process pacer of `deployment` used while Redis is down: its
    /// limits are `limits` × the local share (made on first use, full).
    pub fn local(&self, deployment: &str, limits: PaceLimits) -> Arc<Pacer> {
        self.inner.local_pacer(deployment, limits)
    }

    /// Takes that got no reply within the op timeout while Redis was not
    /// declared down: each was paced in-process at the local share, and
    /// what Redis took for it (if the script ran) stays taken until the
    /// bucket refills. Logged at 1, 2, 4, 8, …
    pub fn late_takes(&self) -> u64 {
        self.inner.late.load(Ordering::Relaxed)
    }

    /// Give-backs dropped because too many were in flight.
    pub fn dropped_give_backs(&self) -> u64 {
        self.inner.dropped.load(Ordering::Relaxed)
    }

    /// The settings of the Redis this store uses.
    pub fn settings(&self) -> &RedisSettings {
        &self.inner.redis
    }

    /// Registers the `ai_router_pool_shared_store_up` gauge (1 shared, 0
    /// each replica paces at its share in-process) on `meter`, labelled
    /// with the prefix. Keep the returned instrument for as long as it
    /// should report.
    pub fn register_metrics(&self, meter: &Meter) -> ObservableGauge<u64> {
        let labels = [opentelemetry::KeyValue::new(
            "prefix",
            self.inner.redis.prefix().to_owned(),
        )];
        let inner = Arc::downgrade(&self.inner);
        meter
            .u64_observable_gauge("ai_router_pool_shared_store_up")
            .with_description(
                "1 while deployments' rate-limit buckets are shared through Redis, 0 while each replica paces at its share",
            )
            .with_callback(move |o| {
                if let Some(inner) = inner.upgrade() {
                    o.observe(u64::from(inner.is_up()), &labels);
                }
            })
            .build()
    }
}

impl SharedPacing for RedisPacing {
    /// One script on the server (the op timeout at most; as soon as
    /// Redis is declared down, in-process); while Redis is down,
    /// in-process at once.
    fn take<'a>(&'a self, deployment: &'a str, limits: PaceLimits, tokens: u64) -> SharedTake<'a> {
        if !self.inner.is_up() {
            let taken = self.inner.local_take(deployment, limits, tokens);
            return Box::pin(std::future::ready(taken));
        }
        Box::pin(self.inner.take(deployment, limits, tokens))
    }

    /// On a task of its own (never waits); dropped while Redis is down.
    fn give_back(&self, deployment: &str, limits: PaceLimits, tokens: u64) {
        self.inner.give_back(deployment, limits, tokens);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn debug_and_errors_never_show_the_password() {
        let store = RedisPacing::open("redis://:hunter2@127.0.0.1:1/0").expect("parses");
        let shown = format!("{store:?}");
        assert!(
            shown.contains("127.0.0.1:1") && !shown.contains("hunter2"),
            "{shown}"
        );
        let builder = RedisPacing::builder("redis://u:hunter2@127.0.0.1:1").expect("parses");
        assert!(!format!("{builder:?}").contains("hunter2"));
        let err = RedisPacing::builder("http://:hunter2@x").expect_err("not redis");
        assert!(err.is_invalid_url());
        assert!(!err.to_string().contains("hunter2"));
    }

    #[tokio::test]
    async fn a_share_out_of_range_is_refused() {
        for share in [0.0, -0.5, 1.5, f64::NAN, f64::INFINITY] {
            let err = RedisPacing::builder("redis://127.0.0.1:1")
                .expect("parses")
                .with_local_share(share)
                .build()
                .expect_err("refused");
            assert!(err.is_invalid_share(), "{share}: {err}");
            assert!(err.to_string().starts_with("redis pacing store: "), "{err}");
        }
        let store = RedisPacing::builder("redis://127.0.0.1:1")
            .expect("parses")
            .with_replicas(4)
            .build()
            .expect("a quarter");
        assert!((store.local_share() - 0.25).abs() < f64::EPSILON);
    }

    #[test]
    fn outside_a_runtime_is_an_error() {
        let err = RedisPacing::open("redis://127.0.0.1:1").expect_err("no runtime");
        assert!(err.is_no_runtime());
    }

    #[tokio::test]
    async fn the_gauge_registers_and_the_store_starts_shared() {
        let store = RedisPacing::open("redis://127.0.0.1:1").expect("parses");
        let _gauge = store.register_metrics(&opentelemetry::global::meter("test"));
        assert!(store.is_shared(), "optimistic until a command fails");
        assert_eq!((store.late_takes(), store.dropped_give_backs()), (0, 0));
        assert_eq!(store.settings().prefix(), "tower-llm:pace:");
        let limits = PaceLimits {
            rpm: Some(10),
            tpm: None,
            burst_ms: None,
        };
        assert!(Arc::ptr_eq(
            &store.local("a", limits),
            &store.local("a", limits)
        ));
    }
}
