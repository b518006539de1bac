//! The store: holds and spend in Redis (one script each), an in-process
//! [`MemoryQuota`] of each replica's share while Redis does not answer.

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry::metrics::{Meter, ObservableCounter, ObservableGauge};
use redis::aio::ConnectionManager;
use tokio::sync::{Notify, mpsc, oneshot};
use tower_llm_core::{Cost, Tenant};
use tower_llm_cost::{
    Ask, Exhausted, InvalidQuota, Limits, MemoryQuota, QuotaConfig, QuotaHold, QuotaRefusal,
    QuotaStore, Reserve,
};
use tower_llm_redis::{RedisSettings, Shutdown};

use crate::scripts::{Counted, Reserved, Scripts};
use crate::worker;

/// Holds of the in-process fallback have this bit set in their id, Redis
/// holds never do: [`QuotaStore::settle`] knows where a hold was taken.
const LOCAL: u64 = 1 << 63;

/// Amounts sent to Redis are cut to this (2^53, about 9 million dollars
/// in nano-dollars): Lua counts in doubles, exact up to it.
const MAX_AMOUNT: u64 = 1 << 53;

/// Tenant-windows of spend counted in-process and not yet pushed to
/// Redis, at most.
const MAX_UNPUSHED: usize = 65_536;

/// The store's name in errors.
const STORE: &str = "redis quota store";

/// Why a [`RedisQuota`] could not be made: its URL does not parse, there
/// is no tokio runtime, the quota settings or the local share are
/// invalid. It never quotes the URL.
#[derive(Debug, Clone)]
pub struct RedisQuotaError {
    kind: ErrorKind,
}

#[derive(Debug, Clone)]
enum ErrorKind {
    Redis(tower_llm_redis::Error),
    Quota(InvalidQuota),
    Share(f64),
}

impl RedisQuotaError {
    /// The URL does not parse as a Redis URL.
    pub fn is_invalid_url(&self) -> bool {
        matches!(&self.kind, ErrorKind::Redis(e) if e.is_invalid_url())
    }

    /// The store was built outside a tokio runtime.
    pub fn is_no_runtime(&self) -> bool {
        matches!(&self.kind, ErrorKind::Redis(e) if e.is_no_runtime())
    }

    /// The `redis` crate refused to make a connection manager.
    pub fn is_connection_manager(&self) -> bool {
        matches!(&self.kind, ErrorKind::Redis(e) if e.is_connection_manager())
    }

    /// The [`QuotaConfig`] does not validate.
    pub fn is_invalid_quota(&self) -> bool {
        matches!(self.kind, ErrorKind::Quota(_))
    }

    /// The local share is not above 0 and at most 1.
    pub fn is_invalid_share(&self) -> bool {
        matches!(self.kind, ErrorKind::Share(_))
    }
}

impl From<tower_llm_redis::Error> for RedisQuotaError {
    fn from(e: tower_llm_redis::Error) -> Self {
        RedisQuotaError {
            kind: ErrorKind::Redis(e),
        }
    }
}

impl fmt::Display for RedisQuotaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            ErrorKind::Redis(e) => write!(f, "{e}"),
            ErrorKind::Quota(e) => write!(f, "{STORE}: {e}"),
            ErrorKind::Share(s) => write!(
                f,
                "{STORE}: local_share = {s}: must be above 0 and at most 1"
            ),
        }
    }
}

impl std::error::Error for RedisQuotaError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            ErrorKind::Redis(e) => Some(e),
            ErrorKind::Quota(e) => Some(e),
            ErrorKind::Share(_) => None,
        }
    }
}

/// One write for the background worker. Every job counts once however
/// often it runs (a job whose reply was lost is run again).
#[derive(Debug, Clone)]
pub(crate) enum Job {
    /// Release Redis hold `id` and add `spent` to its window.
    Settle {
        tenant: Tenant,
        window: u64,
        id: u64,
        spent: Ask,
    },
    /// A reserve that got no reply may have held: release hold `id` in
    /// the windows around `window` (this replica's clock), if it is there.
    Forget {
        tenant: Tenant,
        window: u64,
        id: u64,
    },
    /// Add `spent`, counted in-process while Redis was down, to `window`;
    /// `id` makes it count once.
    Push {
        tenant: Tenant,
        window: u64,
        id: u64,
        spent: Ask,
    },
}

/// Why a command did not do its work.
#[derive(Debug)]
pub(crate) enum Fail {
    /// No answer (an error on the connection, or the command timeout):
    /// Redis counts as down; the command may have run.
    Down(String),
    /// The server answered with an error, or something unreadable: a bug,
    /// not an outage. Nothing is retried.
    Refused(String),
}

/// What the store, the reserve tasks and the worker share.
pub(crate) struct Inner {
    pub(crate) conn: ConnectionManager,
    pub(crate) scripts: Scripts,
    pub(crate) redis: RedisSettings,
    config: QuotaConfig,
    share: f64,
    /// The in-process fallback: the limits × the share.
    local: MemoryQuota,
    /// Redis answers (optimistic at start: the first command tells).
    up: AtomicBool,
    /// Wakes the worker: Redis went down, or spend waits to be pushed.
    pub(crate) wake: Notify,
    queue: mpsc::Sender<Job>,
    dropped: AtomicU64,
    unpushed: Mutex<HashMap<(Tenant, u64), Ask>>,
    lost_pushes: AtomicU64,
    base_id: u64,
    seq: AtomicU64,
    runtime: tokio::runtime::Handle,
}

impl Inner {
    pub(crate) fn is_up(&self) -> bool {
        self.up.load(Ordering::Acquire)
    }

    /// Logs once per outage; wakes the worker to watch for Redis.
    pub(crate) fn set_down(&self, error: &str) {
        if self.up.swap(false, Ordering::AcqRel) {
            tracing::warn!(
                addr = %self.redis.addr(),
                prefix = %self.redis.prefix(),
                error,
                local_share = self.share,
                "quota store: Redis unavailable; each replica enforces its share of the quotas in-process until it answers again"
            );
            self.wake.notify_one();
        }
    }

    /// Logs once per outage.
    pub(crate) fn set_up(&self) {
        if !self.up.swap(true, Ordering::AcqRel) {
            tracing::info!(
                addr = %self.redis.addr(),
                prefix = %self.redis.prefix(),
                "quota store: Redis answers again; quotas are shared"
            );
        }
    }

    /// A hold id no other hold of this replica has (random base plus a
    /// counter; 63 bits).
    fn next_id(&self) -> u64 {
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        self.base_id.wrapping_add(n) & !LOCAL
    }

    /// A fresh id for a push.
    pub(crate) fn next_push_id(&self) -> u64 {
        self.next_id()
    }

    /// The tenant's base key: `{prefix}{t<hex>}:` (the braces keep a
    /// tenant's keys in one cluster slot).
    pub(crate) fn base(&self, tenant: &Tenant) -> String {
        self.redis.key(&format!("{{t{}}}:", hex(tenant.as_bytes())))
    }

    pub(crate) fn config(&self) -> &QuotaConfig {
        &self.config
    }

    fn local_reserve(&self, tenant: &Tenant, ask: Ask) -> Result<QuotaHold, QuotaRefusal> {
        self.local.try_reserve(tenant, ask).map(|hold| {
            let tagged = QuotaHold::new(
                hold.tenant().clone(),
                hold.window(),
                hold.id() | LOCAL,
                hold.held(),
            );
            match hold.shadow_refusal() {
                Some(refusal) => tagged.over_limit(refusal.clone()),
                None => tagged,
            }
        })
    }

    async fn reserve(self: Arc<Self>, tenant: Tenant, ask: Ask) -> Result<QuotaHold, QuotaRefusal> {
        if !self.is_up() {
            return self.local_reserve(&tenant, ask);
        }
        let id = self.next_id();
        let limits = self.config.limits_of(tenant.as_bytes());
        // The script runs on a task of its own: if this future is dropped
        // (or times out) before the reply, the task still sees the reply
        // and releases what was held.
        let (tx, rx) = oneshot::channel();
        let task = self.clone();
        let task_tenant = tenant.clone();
        self.runtime.spawn(async move {
            let reply = task.invoke_reserve(&task_tenant, id, ask, &limits).await;
            let unseen = match tx.send(reply) {
                Ok(()) => return,
                Err(unseen) => unseen,
            };
            match unseen {
                Ok(r) if r.held => task.enqueue(Job::Settle {
                    tenant: task_tenant,
                    window: r.window,
                    id,
                    spent: Ask::default(),
                }),
                Ok(_) | Err(Fail::Refused(_)) => {}
                Err(Fail::Down(_)) => task.forget(task_tenant, id),
            }
        });
        let reply = tokio::time::timeout(self.redis.op_timeout(), rx).await;
        let reply = match reply {
            Ok(Ok(reply)) => reply,
            // The task is gone (the runtime shuts down).
            Ok(Err(_)) => return self.local_reserve(&tenant, ask),
            Err(_) => {
                self.set_down("command timed out");
                return self.local_reserve(&tenant, ask);
            }
        };
        let r = match reply {
            Ok(r) => r,
            Err(Fail::Down(error)) => {
                self.forget(tenant.clone(), id);
                self.set_down(&error);
                return self.local_reserve(&tenant, ask);
            }
            Err(Fail::Refused(error)) => {
                tracing::warn!(
                    prefix = %self.redis.prefix(),
                    error,
                    "quota store: reserve script failed; this call is counted in-process"
                );
                return self.local_reserve(&tenant, ask);
            }
        };
        let refusal = match r.exhausted {
            0 => None,
            e => {
                let used = Ask {
                    cost: Cost::from_nanos(r.used.0),
                    tokens: r.used.1,
                };
                Some(QuotaRefusal {
                    exhausted: if e == 1 {
                        Exhausted::Cost
                    } else {
                        Exhausted::Tokens
                    },
                    left: limits.left(used),
                    resets_in: Duration::from_millis(r.resets_in_ms),
                })
            }
        };
        let hold = QuotaHold::new(tenant, r.window, id, ask);
        match (r.held, refusal) {
            (true, None) => Ok(hold),
            (true, Some(refusal)) => Ok(hold.over_limit(refusal)),
            (false, Some(refusal)) => Err(refusal),
            // Refused without a reason: never sent by the script.
            (false, None) => Err(QuotaRefusal {
                exhausted: Exhausted::Cost,
                left: Ask::default(),
                resets_in: Duration::from_millis(r.resets_in_ms),
            }),
        }
    }

    /// Queues the release of a hold that may have been taken unseen.
    fn forget(&self, tenant: Tenant, id: u64) {
        let unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let (window, _) = self.config.window_at(unix);
        self.enqueue(Job::Forget { tenant, window, id });
    }

    async fn invoke_reserve(
        &self,
        tenant: &Tenant,
        id: u64,
        ask: Ask,
        limits: &Limits,
    ) -> Result<Reserved, Fail> {
        let limit = |l: Option<u64>| l.map(|l| l.min(MAX_AMOUNT).to_string()).unwrap_or_default();
        let mut call = self.scripts.reserve.key(self.base(tenant));
        call.arg(self.config.window_secs)
            .arg(self.config.hold_secs.saturating_mul(1000))
            .arg(id)
            .arg(ask.cost.nanos().min(MAX_AMOUNT))
            .arg(ask.tokens.min(MAX_AMOUNT))
            .arg(limit(limits.max_cost.map(Cost::nanos)))
            .arg(limit(limits.max_tokens))
            .arg(if self.config.shadow { "1" } else { "0" });
        let reply: Vec<i64> = self.invoke(&call).await?;
        Reserved::parse(&reply).ok_or_else(|| Fail::Refused(format!("malformed reply {reply:?}")))
    }

    /// Runs one script, bounded by the command timeout.
    pub(crate) async fn invoke<T: redis::FromRedisValue>(
        &self,
        call: &redis::ScriptInvocation<'_>,
    ) -> Result<T, Fail> {
        let mut conn = self.conn.clone();
        match tokio::time::timeout(self.redis.op_timeout(), call.invoke_async::<T>(&mut conn)).await
        {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(e)) if is_connection_error(&e) => Err(Fail::Down(e.to_string())),
            Ok(Err(e)) => Err(Fail::Refused(e.to_string())),
            Err(_) => Err(Fail::Down("command timed out".to_owned())),
        }
    }

    /// Queues a job for the worker; never waits. A full queue drops it.
    pub(crate) fn enqueue(&self, job: Job) {
        if let Err(mpsc::error::TrySendError::Full(job)) = self.queue.try_send(job) {
            let n = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            if n.is_power_of_two() {
                tracing::warn!(
                    prefix = %self.redis.prefix(),
                    dropped = n,
                    job = ?job,
                    "quota store: settle queue full; a settle is dropped (its hold expires after hold_secs, its spend is not counted)"
                );
            }
        }
    }

    fn settle(&self, hold: &QuotaHold, spent: Ask) {
        let spent = Ask {
            cost: spent.cost.min(hold.held().cost),
            tokens: spent.tokens.min(hold.held().tokens),
        };
        let (tenant, window) = (hold.tenant().clone(), hold.window());
        if hold.id() & LOCAL == 0 {
            self.enqueue(Job::Settle {
                tenant,
                window,
                id: hold.id(),
                spent,
            });
            return;
        }
        let local = QuotaHold::new(tenant.clone(), window, hold.id() & !LOCAL, hold.held());
        self.local.settle(local, spent);
        if spent == Ask::default() {
            return;
        }
        {
            let mut unpushed = self.unpushed();
            let full = unpushed.len() >= MAX_UNPUSHED;
            match unpushed.get_mut(&(tenant.clone(), window)) {
                Some(sum) => *sum = add(*sum, spent),
                None if !full => {
                    unpushed.insert((tenant, window), spent);
                }
                None => {
                    drop(unpushed);
                    let n = self.lost_pushes.fetch_add(1, Ordering::Relaxed) + 1;
                    if n.is_power_of_two() {
                        tracing::warn!(
                            prefix = %self.redis.prefix(),
                            lost = n,
                            "quota store: too many tenant-windows of in-process spend wait for Redis; this spend is counted in-process only"
                        );
                    }
                    return;
                }
            }
        }
        self.wake.notify_one();
    }

    fn unpushed(&self) -> std::sync::MutexGuard<'_, HashMap<(Tenant, u64), Ask>> {
        self.unpushed.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes the spend waiting to be pushed, as jobs.
    pub(crate) fn take_unpushed(&self) -> Vec<Job> {
        let taken = std::mem::take(&mut *self.unpushed());
        taken
            .into_iter()
            .map(|((tenant, window), spent)| Job::Push {
                tenant,
                window,
                id: self.next_push_id(),
                spent,
            })
            .collect()
    }

    pub(crate) fn has_unpushed(&self) -> bool {
        !self.unpushed().is_empty()
    }

    async fn usage(&self, tenant: &Tenant) -> Option<Usage> {
        let mut call = self.scripts.usage.key(self.base(tenant));
        call.arg(self.config.window_secs);
        let reply: Vec<i64> = self.invoke(&call).await.ok()?;
        let c = Counted::parse(&reply)?;
        let ask = |(cost, tokens): (u64, u64)| Ask {
            cost: Cost::from_nanos(cost),
            tokens,
        };
        Some(Usage {
            window: c.window,
            spent: ask(c.spent),
            held: ask(c.held),
        })
    }
}

/// An error on the connection (no answer), not one the server sent.
pub(crate) fn is_connection_error(e: &redis::RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
        || e.is_unrecoverable_error()
}

pub(crate) fn add(a: Ask, b: Ask) -> Ask {
    Ask {
        cost: a.cost.saturating_add(b.cost),
        tokens: a.tokens.saturating_add(b.tokens),
    }
}

/// An amount for a script: nanos or tokens, cut to [`MAX_AMOUNT`].
pub(crate) fn amount(n: u64) -> u64 {
    n.min(MAX_AMOUNT)
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// `limits` × `share`, rounded down (a limit not set stays unset).
fn scaled(limits: Limits, share: f64) -> Limits {
    #[allow(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss
    )]
    let scale = |n: u64| {
        if share >= 1.0 {
            n
        } else {
            (n as f64 * share).floor() as u64
        }
    };
    Limits {
        max_cost: limits.max_cost.map(|c| Cost::from_nanos(scale(c.nanos()))),
        max_tokens: limits.max_tokens.map(scale),
    }
}

/// The in-process fallback's settings: `config` with every limit × `share`.
fn local_config(config: &QuotaConfig, share: f64) -> QuotaConfig {
    let mut local = config.clone();
    local.limits = scaled(config.limits, share);
    for limits in local.tenants.values_mut() {
        *limits = scaled(*limits, share);
    }
    local
}

/// What a tenant has spent and holds in one window, as Redis counts it
/// ([`RedisQuota::shared_usage`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Usage {
    /// The window (by the server's clock; [`QuotaConfig::window_at`]).
    pub window: u64,
    /// Spend settled in the window (and pushed after an outage).
    pub spent: Ask,
    /// What open holds hold.
    pub held: Ask,
}

/// A [`QuotaStore`] shared by every replica using the same Redis (and
/// prefix): see the [crate docs](crate).
///
/// Made inside a tokio runtime (it spawns a worker that settles holds and
/// watches for Redis when it is down); the worker stops when the store
/// is dropped.
pub struct RedisQuota {
    inner: Arc<Inner>,
    /// Stops the worker when the store is dropped.
    _shutdown: Shutdown,
}

impl fmt::Debug for RedisQuota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The address only: never the URL (it may carry a password).
        f.debug_struct("RedisQuota")
            .field("redis", &self.inner.redis)
            .field("config", &self.inner.config)
            .field("local_share", &self.inner.share)
            .field("shared", &self.is_shared())
            .finish_non_exhaustive()
    }
}

impl RedisQuota {
    /// A store of `config`'s quotas on the Redis at `url`
    /// (`redis://[:password@]host[:port][/db]`), with the default
    /// settings: keys under `tower-llm:quota:`, a local share of 1 (see
    /// [`RedisQuotaBuilder::with_local_share`]).
    ///
    /// # Errors
    ///
    /// When the URL does not parse, `config` does not validate, or there
    /// is no tokio runtime. A server that does not answer is not an
    /// error: the first command finds out, and the store counts
    /// in-process until it answers.
    pub fn open(url: &str, config: QuotaConfig) -> Result<Self, RedisQuotaError> {
        RedisQuota::builder(url, config)?.build()
    }

    /// A builder for a store of `config`'s quotas on the Redis at `url`.
    ///
    /// # Errors
    ///
    /// When the URL does not parse.
    pub fn builder(url: &str, config: QuotaConfig) -> Result<RedisQuotaBuilder, RedisQuotaError> {
        let redis = RedisSettings::new(STORE, url, "tower-llm:quota:")?;
        Ok(RedisQuota::with_settings(redis, config))
    }

    /// A builder for a store of `config`'s quotas with Redis `settings`
    /// made by the caller (their prefix, command timeout and backoff are
    /// kept).
    pub fn with_settings(settings: RedisSettings, config: QuotaConfig) -> RedisQuotaBuilder {
        RedisQuotaBuilder {
            redis: settings,
            config,
            share: 1.0,
            queue: 65_536,
        }
    }

    /// `true` while Redis answers: quotas are shared and exact across
    /// replicas. `false`: this replica enforces its share of them
    /// in-process until Redis answers again.
    pub fn is_shared(&self) -> bool {
        self.inner.is_up()
    }

    /// The quota settings.
    pub fn config(&self) -> &QuotaConfig {
        &self.inner.config
    }

    /// This replica's share of every limit while Redis is down.
    pub fn local_share(&self) -> f64 {
        self.inner.share
    }

    /// The in-process store used while Redis is down (its limits are the
    /// config's × the local share).
    pub fn local(&self) -> &MemoryQuota {
        &self.inner.local
    }

    /// Settles dropped because the queue to Redis was full.
    pub fn dropped_settles(&self) -> u64 {
        self.inner.dropped.load(Ordering::Relaxed)
    }

    /// What `tenant` has spent and holds in the current window, as Redis
    /// counts it (expired holds purged first); `None` when Redis does not
    /// answer within the command timeout. For operators and tests: the
    /// request path never needs it.
    pub async fn shared_usage(&self, tenant: &Tenant) -> Option<Usage> {
        self.inner.usage(tenant).await
    }

    /// Registers the `ai_router_quota_shared_store_up` gauge (1 shared, 0
    /// in-process shares) and the `ai_router_quota_shared_store_dropped`
    /// counter (settles dropped, queue full) on `meter`, labelled with
    /// the prefix. Keep the returned instruments for as long as they
    /// should report.
    pub fn register_metrics(
        &self,
        meter: &Meter,
    ) -> (ObservableGauge<u64>, ObservableCounter<u64>) {
        let prefix = opentelemetry::KeyValue::new("prefix", self.inner.redis.prefix().to_owned());
        let inner = Arc::downgrade(&self.inner);
        let labels = [prefix.clone()];
        let gauge = meter
            .u64_observable_gauge("ai_router_quota_shared_store_up")
            .with_description(
                "1 while tenant quotas are shared through Redis, 0 while each replica enforces its share",
            )
            .with_callback(move |o| {
                if let Some(inner) = inner.upgrade() {
                    o.observe(u64::from(inner.is_up()), &labels);
                }
            })
            .build();
        let inner = Arc::downgrade(&self.inner);
        let labels = [prefix];
        let counter = meter
            .u64_observable_counter("ai_router_quota_shared_store_dropped")
            .with_description("Quota settles dropped because the queue to Redis was full")
            .with_callback(move |o| {
                if let Some(inner) = inner.upgrade() {
                    o.observe(inner.dropped.load(Ordering::Relaxed), &labels);
                }
            })
            .build();
        (gauge, counter)
    }
}

impl QuotaStore for RedisQuota {
    /// One script on the server (the command timeout at most); while
    /// Redis is down, in-process at once.
    fn reserve(&self, tenant: &Tenant, ask: Ask) -> Reserve {
        if !self.inner.is_up() {
            let held = self.inner.local_reserve(tenant, ask);
            return Box::pin(std::future::ready(held));
        }
        Box::pin(self.inner.clone().reserve(tenant.clone(), ask))
    }

    /// Queued for the worker (never waits): see the crate docs for what a
    /// full queue loses.
    fn settle(&self, hold: QuotaHold, spent: Ask) {
        self.inner.settle(&hold, spent);
    }
}

/// Settings of a [`RedisQuota`]: see [`RedisQuota::builder`].
pub struct RedisQuotaBuilder {
    redis: RedisSettings,
    config: QuotaConfig,
    share: f64,
    queue: usize,
}

impl fmt::Debug for RedisQuotaBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisQuotaBuilder")
            .field("redis", &self.redis)
            .field("config", &self.config)
            .field("local_share", &self.share)
            .field("queue", &self.queue)
            .finish()
    }
}

impl RedisQuotaBuilder {
    /// The prefix of every key (default `tower-llm:quota:`). Replicas
    /// share quotas when they share it.
    #[must_use]
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.redis = self.redis.with_prefix(prefix);
        self
    }

    /// How long one Redis command may take before Redis counts as down
    /// (default 250 ms): the most a reserve waits on Redis.
    #[must_use]
    pub fn with_op_timeout(mut self, timeout: Duration) -> Self {
        self.redis = self.redis.with_op_timeout(timeout);
        self
    }

    /// The longest wait between checks that Redis is back (default 2 s;
    /// they start at 25 ms and double).
    #[must_use]
    pub fn with_max_backoff(mut self, max: Duration) -> Self {
        self.redis = self.redis.with_max_backoff(max);
        self
    }

    /// The share of every limit this replica enforces in-process while
    /// Redis is down: above 0, at most 1 (default 1: right for one
    /// replica). With N replicas, `1 / N` keeps the fleet within the
    /// limits while Redis is down ([`with_replicas`](Self::with_replicas)).
    /// [`build`](Self::build) refuses a share out of range.
    #[must_use]
    pub fn with_local_share(mut self, share: f64) -> Self {
        self.share = share;
        self
    }

    /// The local share for a fleet of `replicas`: `1 / replicas` (at
    /// least one replica).
    #[must_use]
    pub fn with_replicas(self, replicas: u32) -> Self {
        self.with_local_share(1.0 / f64::from(replicas.max(1)))
    }

    /// The capacity of the queue of settles to Redis (default 65,536, at
    /// least 1). A settle arriving when it is full is dropped and
    /// counted ([`RedisQuota::dropped_settles`]): its hold counts until
    /// `hold_secs`, its spend is never counted.
    #[must_use]
    pub fn with_queue(mut self, queue: usize) -> Self {
        self.queue = queue.max(1);
        self
    }

    /// Makes the store and spawns its worker.
    ///
    /// # Errors
    ///
    /// When the quota settings do not validate, the local share is not
    /// above 0 and at most 1, the builder runs outside a tokio runtime,
    /// or the connection manager cannot be made.
    pub fn build(self) -> Result<RedisQuota, RedisQuotaError> {
        self.config.validate().map_err(|e| RedisQuotaError {
            kind: ErrorKind::Quota(e),
        })?;
        if !(self.share > 0.0 && self.share <= 1.0) {
            return Err(RedisQuotaError {
                kind: ErrorKind::Share(self.share),
            });
        }
        let runtime = self.redis.runtime()?;
        let conn = self.redis.connection_manager()?;
        let (queue, rx) = mpsc::channel(self.queue);
        let random = RandomState::new();
        let base_id = random.hash_one((
            std::process::id(),
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default(),
        ));
        let inner = Arc::new(Inner {
            conn,
            scripts: Scripts::new(),
            local: MemoryQuota::new(local_config(&self.config, self.share)),
            redis: self.redis,
            config: self.config,
            share: self.share,
            up: AtomicBool::new(true),
            wake: Notify::new(),
            queue,
            dropped: AtomicU64::new(0),
            unpushed: Mutex::new(HashMap::new()),
            lost_pushes: AtomicU64::new(0),
            base_id,
            seq: AtomicU64::new(0),
            runtime: runtime.clone(),
        });
        let shutdown = Shutdown::new();
        runtime.spawn(worker::run(inner.clone(), rx, shutdown.signal()));
        Ok(RedisQuota {
            inner,
            _shutdown: shutdown,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(dollars: f64, tokens: u64) -> QuotaConfig {
        QuotaConfig::new(
            Duration::from_secs(60),
            Limits {
                max_cost: Cost::from_dollars(dollars),
                max_tokens: Some(tokens),
            },
        )
    }

    #[tokio::test]
    async fn debug_and_errors_never_show_the_password() {
        let store =
            RedisQuota::open("redis://:hunter2@127.0.0.1:1/0", config(1.0, 10)).expect("parses");
        let shown = format!("{store:?}");
        assert!(
            shown.contains("127.0.0.1:1") && !shown.contains("hunter2"),
            "{shown}"
        );
        let builder =
            RedisQuota::builder("redis://u:hunter2@127.0.0.1:1", config(1.0, 10)).expect("parses");
        assert!(!format!("{builder:?}").contains("hunter2"));
        let err = RedisQuota::builder("http://:hunter2@x", config(1.0, 10)).expect_err("not redis");
        assert!(err.is_invalid_url());
        assert!(!err.to_string().contains("hunter2"));
    }

    #[tokio::test]
    async fn a_share_out_of_range_or_a_bad_config_is_refused() {
        for share in [0.0, -0.5, 1.5, f64::NAN, f64::INFINITY] {
            let err = RedisQuota::builder("redis://127.0.0.1:1", config(1.0, 10))
                .expect("parses")
                .with_local_share(share)
                .build()
                .expect_err("refused");
            assert!(err.is_invalid_share(), "{share}: {err}");
        }
        let mut bad = config(1.0, 10);
        bad.window_secs = 0;
        let err = RedisQuota::open("redis://127.0.0.1:1", bad).expect_err("refused");
        assert!(err.is_invalid_quota(), "{err}");
        assert!(err.to_string().starts_with("redis quota store: "), "{err}");
    }

    #[test]
    fn outside_a_runtime_is_an_error() {
        let err = RedisQuota::open("redis://127.0.0.1:1", config(1.0, 10)).expect_err("no rt");
        assert!(err.is_no_runtime());
    }

    #[test]
    fn the_local_limits_are_the_share_of_every_limit() {
        let c = config(1.0, 1_000).with_tenant(
            "big",
            Limits {
                max_cost: Cost::from_dollars(10.0),
                max_tokens: None,
            },
        );
        let local = local_config(&c, 0.25);
        assert_eq!(local.limits.max_cost, Cost::from_dollars(0.25));
        assert_eq!(local.limits.max_tokens, Some(250));
        assert_eq!(local.limits_of(b"big").max_cost, Cost::from_dollars(2.5));
        assert_eq!(local.limits_of(b"big").max_tokens, None);
        assert_eq!(local_config(&c, 1.0), c);
        let third = scaled(
            Limits {
                max_cost: None,
                max_tokens: Some(10),
            },
            1.0 / 3.0,
        );
        assert_eq!(third.max_tokens, Some(3));
    }

    #[tokio::test]
    async fn metrics_register_and_the_store_starts_shared() {
        let store = RedisQuota::open("redis://127.0.0.1:1", config(1.0, 10)).expect("parses");
        let meter = opentelemetry::global::meter("test");
        let (_gauge, _counter) = store.register_metrics(&meter);
        assert!(store.is_shared(), "optimistic until a command fails");
        assert_eq!(store.dropped_settles(), 0);
        assert!((store.local_share() - 1.0).abs() < f64::EPSILON);
        assert_eq!(store.local().config(), store.config());
    }

    #[test]
    fn tenant_keys_are_hex_and_tell_ids_apart() {
        assert_eq!(hex(b"\xff\x00a"), "ff0061");
        assert_eq!(hex(b""), "");
    }
}
