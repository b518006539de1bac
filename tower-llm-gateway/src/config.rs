//! The gateway's own settings, in the same policy file as the library's
//! [`Policy`]: `listen`, `[server]`, `[health]`, `[breaker_shared]` and
//! `[idempotency_shared]` ([`GatewaySettings`]). [`GatewayConfig`] reads
//! both parts from one file, validates both, and refuses an unknown key
//! anywhere with its path.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tower_llm::config::{ConfigError, HostSettings, Policy};

/// A gateway's whole file: the library's [`Policy`] (providers, routes,
/// the layers' own settings) and the gateway's [`GatewaySettings`].
///
/// ```
/// use tower_llm_gateway::GatewayConfig;
///
/// let config = GatewayConfig::from_toml(r#"
///     listen = "127.0.0.1:8080"
///     [server]
///     max_in_flight = 512
///     [[providers]]
///     name = "a"
///     kind = "openai"
///     api_key_env = "A_KEY"
///     [[routes]]
///     model = "smart"
///     chain = [{ provider = "a", model = "gpt-4o-mini" }]
/// "#).unwrap();
/// assert_eq!(config.settings.server.max_in_flight, 512);
/// assert_eq!(config.policy.routes[0].model, "smart");
/// let err = GatewayConfig::from_toml("[server]\nmax_in_fligt = 1").unwrap_err();
/// assert!(err.to_string().contains("at server.max_in_fligt"));
/// ```
///
/// It serializes as one file again (both parts at the top level).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GatewayConfig {
    /// The providers, routes and layers' settings.
    #[serde(flatten)]
    pub policy: Policy,
    /// The gateway's own settings.
    #[serde(flatten)]
    pub settings: GatewaySettings,
}

impl GatewayConfig {
    /// Reads and validates a gateway's TOML file.
    ///
    /// # Errors
    ///
    /// As [`Policy::from_toml`], for the policy and the gateway's settings.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        let (policy, settings) = Policy::from_toml_with::<GatewaySettings>(text)?;
        let config = GatewayConfig { policy, settings };
        config.validate()?;
        Ok(config)
    }

    /// Reads and validates a gateway's JSON file (the same shape).
    ///
    /// # Errors
    ///
    /// As [`from_toml`](Self::from_toml).
    pub fn from_json(text: &str) -> Result<Self, ConfigError> {
        let (policy, settings) = Policy::from_json_with::<GatewaySettings>(text)?;
        let config = GatewayConfig { policy, settings };
        config.validate()?;
        Ok(config)
    }

    /// Checks the policy and the gateway's settings together (a shared
    /// idempotency store needs `[idempotency]`).
    ///
    /// # Errors
    ///
    /// Every problem found.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let s = &self.settings;
        let mut p = Vec::new();
        if s.health.probe_timeout_ms == 0 {
            p.push("health.probe_timeout_ms must be above 0".to_owned());
        }
        if let Some(shared) = &s.breaker_shared {
            shared.check("breaker_shared", &mut p);
        }
        if let Some(shared) = &s.idempotency_shared {
            if self.policy.idempotency.is_none() {
                p.push("idempotency_shared needs an [idempotency] table".to_owned());
            }
            shared.check("idempotency_shared", &mut p);
        }
        if let Some(shared) = &s.cache_shared {
            let policy = &self.policy;
            let caches = policy
                .routes
                .iter()
                .any(|r| policy.resolve(r).is_ok_and(|r| r.cache.is_some()));
            if !caches {
                p.push("cache_shared needs a route with a cache".to_owned());
            }
            shared.check("cache_shared", &mut p);
        }
        if let Some(shared) = &s.quotas_shared {
            if self.policy.quotas.is_none() {
                p.push("quotas_shared needs a [quotas] table".to_owned());
            }
            shared.check("quotas_shared", &mut p);
        }
        if let Some(shared) = &s.pools_shared {
            shared.check("pools_shared", &mut p);
        }
        ConfigError::all([
            self.policy.validate(),
            s.server.validate(),
            ConfigError::check(p),
        ])
    }
}

/// A policy with the gateway's default settings.
impl From<Policy> for GatewayConfig {
    fn from(policy: Policy) -> Self {
        GatewayConfig {
            policy,
            settings: GatewaySettings::default(),
        }
    }
}

/// The gateway's part of the file. Each key is optional.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GatewaySettings {
    /// `listen`: where the gateway listens (`host:port`); `--listen` wins.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
    /// `[server]`: the limits of the HTTP server.
    pub server: ServerPolicy,
    /// `[health]`: background probes of the providers.
    pub health: HealthPolicy,
    /// `[breaker_shared]`: share the circuits with every replica on the
    /// same Redis (the breaker's store is then
    /// `tower_llm_breaker_redis`'s). Default: none, each process keeps its
    /// own circuits.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub breaker_shared: Option<SharedBreakerPolicy>,
    /// `[idempotency_shared]`: keep `[idempotency]`'s answers and
    /// reservations in Redis, shared by every replica. Needs
    /// `[idempotency]`. Default: none, in-process.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idempotency_shared: Option<SharedIdempotencyPolicy>,
    /// `[cache_shared]`: keep the routes' cached answers in Redis, shared
    /// by every replica (the store is `tower_llm_cache_redis`'s; while
    /// Redis is down each replica caches in-process). Needs a route with a
    /// `cache` (or a `STALE_CACHE` step). Default: none, in-process.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_shared: Option<SharedRedis>,
    /// `[quotas_shared]`: count `[quotas]` in Redis, exactly, for every
    /// replica at once (the store is `tower_llm_cost_redis`'s). Needs
    /// `[quotas]`. Default: none, each process counts its own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quotas_shared: Option<SharedQuotas>,
    /// `[pools_shared]`: pace `[[pools]]`' deployments with buckets in
    /// Redis, one per provider for the whole fleet (the store is
    /// `tower_llm_pool_redis`'s; the same keys as [`SharedQuotas`]).
    /// Default: none, each process paces on its own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pools_shared: Option<SharedQuotas>,
}

/// `[quotas_shared]` and `[pools_shared]`: the Redis every replica counts
/// tenant quotas (or paces pools' deployments) on, and what each does
/// alone while Redis is down.
///
/// Its `Debug` never shows the URL's password.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SharedQuotas {
    /// `redis`: the Redis URL, `redis://[:password@]host[:port][/db]`
    /// (required; the breaker's, to keep one Redis).
    pub redis: String,
    /// `prefix`: the prefix of the Redis keys (default
    /// `tower-llm:quota:` for quotas, `tower-llm:pace:` for pacing);
    /// replicas share when they share it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// `local_share`: while Redis is down or frozen, each replica admits
    /// against this share of every limit, counted in-process (0 < share ≤
    /// 1; default 1, one replica; give `1 / replicas`). What it spends
    /// meanwhile is added to Redis when it is back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_share: Option<f64>,
}

impl SharedQuotas {
    /// The Redis URL with any password replaced by `***`, for logs.
    pub fn redacted(&self) -> String {
        tower_llm_redis::redact_url(&self.redis)
    }

    fn check(&self, table: &str, problems: &mut Vec<String>) {
        SharedRedis {
            redis: self.redis.clone(),
            prefix: None,
        }
        .check(table, problems);
        if let Some(Err(e)) = self.local_share.map(tower_llm_redis::LocalShare::new) {
            problems.push(format!("{table}.{e}"));
        }
    }
}

impl fmt::Debug for SharedQuotas {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedQuotas")
            .field("redis", &self.redacted())
            .field("prefix", &self.prefix)
            .field("local_share", &self.local_share)
            .finish()
    }
}

impl HostSettings for GatewaySettings {
    const KEYS: &'static [&'static str] = &[
        "listen",
        "server",
        "health",
        "breaker_shared",
        "idempotency_shared",
        "cache_shared",
        "quotas_shared",
        "pools_shared",
    ];
}

/// `[breaker_shared]` and `[idempotency_shared]`: the Redis a gateway
/// shares its circuits or its idempotent answers on.
///
/// Its `Debug` never shows the URL's password.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SharedRedis {
    /// `redis`: the Redis URL, `redis://[:password@]host[:port][/db]`
    /// (required). For circuits, the shared threshold, window, cooldown
    /// and probe count are `[breaker]`'s (a route's `breaker_policy`
    /// judges its calls locally but the fleet's decisions follow
    /// `[breaker]`); for idempotent answers, each replica answers
    /// duplicates in-process while Redis is down.
    pub redis: String,
    /// `prefix`: the prefix of the Redis keys and channel (default
    /// `tower-llm:breaker:` for circuits, `tower-llm:idem:` for answers);
    /// replicas share when they share it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
}

/// `[breaker_shared]`: where the circuits are shared.
pub type SharedBreakerPolicy = SharedRedis;

/// `[idempotency_shared]`: where idempotent answers are shared.
pub type SharedIdempotencyPolicy = SharedRedis;

impl SharedRedis {
    /// The Redis URL with any password replaced by `***`, for logs.
    pub fn redacted(&self) -> String {
        tower_llm_redis::redact_url(&self.redis)
    }

    /// Refuses a URL that is not Redis's, naming `table`.
    fn check(&self, table: &str, problems: &mut Vec<String>) {
        if !["redis://", "rediss://", "redis+unix://", "unix://"]
            .iter()
            .any(|s| self.redis.starts_with(s))
        {
            problems.push(format!(
                "{table}.redis {:?} is not a redis:// URL",
                self.redacted()
            ));
        }
    }
}

impl fmt::Debug for SharedRedis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedRedis")
            .field("redis", &self.redacted())
            .field("prefix", &self.prefix)
            .finish()
    }
}

/// `[health]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HealthPolicy {
    /// `probe_interval_ms`: how often each provider with a `health_url` is
    /// probed (all at once); 0 (the default) turns probes off. A reload
    /// changes it.
    pub probe_interval_ms: u64,
    /// `probe_timeout_ms`: how long one probe may take before it counts as
    /// down (default 5,000).
    pub probe_timeout_ms: u64,
}

impl Default for HealthPolicy {
    fn default() -> Self {
        HealthPolicy {
            probe_interval_ms: 0,
            probe_timeout_ms: 5_000,
        }
    }
}

/// `[server]`: the limits of a gateway's HTTP server.
///
/// Each limit answers one way a client can hold the gateway's resources:
/// a slow request head (slowloris), an idle kept-alive connection, a slow
/// request body, a client that stops reading its answer, too many
/// connections, too many calls in flight. They take effect when the server
/// starts; a reload keeps the running server's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerPolicy {
    /// `header_read_timeout_ms`: the longest a client may take to send a
    /// request's head: a new connection's first, from when it is accepted;
    /// a kept-alive connection's next, from its first byte (default
    /// 10,000). A connection that takes longer is closed.
    pub header_read_timeout_ms: u64,
    /// `idle_timeout_ms`: how long a kept-alive connection may sit, after
    /// its last answer was sent, with no request in progress and no byte
    /// received or sent, before it is closed (default 60,000).
    pub idle_timeout_ms: u64,
    /// `body_read_timeout_ms`: the longest a client may take to send a
    /// whole request body; a slower one gets 408 (default 30,000).
    pub body_read_timeout_ms: u64,
    /// `send_timeout_ms`: how long the server may wait, with an answer to
    /// write, for a client that reads nothing; the connection is then
    /// closed (default 30,000).
    pub send_timeout_ms: u64,
    /// `max_connections`: open connections at most; beyond it new
    /// connections wait in the listen queue (the kernel's backlog) until
    /// one closes (default 4,096).
    pub max_connections: usize,
    /// `max_in_flight`: chat calls served at once, from when their body
    /// has been read until their answer has been sent whole (a stream until
    /// it ends); beyond it a call is answered 503 with `Retry-After: 1`
    /// (default 4,096, as `max_connections`: a call in flight holds about
    /// 50 KiB besides its body, measured over plain HTTP with
    /// `examples/deadline_lateness.rs`, so 4,096 of them hold about
    /// 200 MiB, beside the body bound's 256 MiB; minute-long streams make a
    /// thousand concurrent calls ordinary).
    pub max_in_flight: usize,
    /// `max_body_bytes_in_flight`: the bytes of request bodies the gateway
    /// holds at once, being read or being served; a chunk that would go
    /// past it gets 503 with `Retry-After: 1` (default 268,435,456:
    /// 256 MiB). Each chunk counts as it arrives, so a client trickling a
    /// body holds only what it has sent.
    pub max_body_bytes_in_flight: usize,
    /// `reload_settle_ms`: on a file change, how long the policy file must
    /// stay unchanged before it is read (a writer that truncates and then
    /// rewrites is never caught half-way; default 500).
    pub reload_settle_ms: u64,
}

impl Default for ServerPolicy {
    fn default() -> Self {
        ServerPolicy {
            header_read_timeout_ms: 10_000,
            idle_timeout_ms: 60_000,
            body_read_timeout_ms: 30_000,
            send_timeout_ms: 30_000,
            max_connections: 4_096,
            max_in_flight: 4_096,
            max_body_bytes_in_flight: 256 * 1024 * 1024,
            reload_settle_ms: 500,
        }
    }
}

impl ServerPolicy {
    /// The largest `max_connections` and `max_in_flight`.
    pub const MAX_LIMIT: usize = 1 << 20;
    /// The largest `max_body_bytes_in_flight` (the most a tokio semaphore
    /// counts).
    pub const MAX_BODY_BYTES: usize = tokio::sync::Semaphore::MAX_PERMITS;

    /// Checks every limit is above 0 and the counts within
    /// [`MAX_LIMIT`](Self::MAX_LIMIT) and
    /// [`MAX_BODY_BYTES`](Self::MAX_BODY_BYTES).
    ///
    /// # Errors
    ///
    /// One problem per limit at 0.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut p = Vec::new();
        for (key, value) in [
            ("header_read_timeout_ms", self.header_read_timeout_ms),
            ("idle_timeout_ms", self.idle_timeout_ms),
            ("body_read_timeout_ms", self.body_read_timeout_ms),
            ("send_timeout_ms", self.send_timeout_ms),
            (
                "max_connections",
                u64::try_from(self.max_connections).unwrap_or(u64::MAX),
            ),
            (
                "max_in_flight",
                u64::try_from(self.max_in_flight).unwrap_or(u64::MAX),
            ),
            (
                "max_body_bytes_in_flight",
                u64::try_from(self.max_body_bytes_in_flight).unwrap_or(u64::MAX),
            ),
        ] {
            if value == 0 {
                p.push(format!("server.{key} must be above 0"));
            }
        }
        for (key, value, max) in [
            ("max_connections", self.max_connections, Self::MAX_LIMIT),
            ("max_in_flight", self.max_in_flight, Self::MAX_LIMIT),
            (
                "max_body_bytes_in_flight",
                self.max_body_bytes_in_flight,
                Self::MAX_BODY_BYTES,
            ),
        ] {
            if value > max {
                p.push(format!("server.{key} must be at most {max}, not {value}"));
            }
        }
        ConfigError::check(p)
    }

    /// `header_read_timeout_ms`.
    pub fn header_read_timeout(&self) -> Duration {
        Duration::from_millis(self.header_read_timeout_ms)
    }

    /// `idle_timeout_ms`.
    pub fn idle_timeout(&self) -> Duration {
        Duration::from_millis(self.idle_timeout_ms)
    }

    /// `body_read_timeout_ms`.
    pub fn body_read_timeout(&self) -> Duration {
        Duration::from_millis(self.body_read_timeout_ms)
    }

    /// `send_timeout_ms`.
    pub fn send_timeout(&self) -> Duration {
        Duration::from_millis(self.send_timeout_ms)
    }

    /// `reload_settle_ms`.
    pub fn reload_settle(&self) -> Duration {
        Duration::from_millis(self.reload_settle_ms)
    }
}
