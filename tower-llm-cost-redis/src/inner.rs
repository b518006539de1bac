//! What the store, its reserve tasks, its worker and its probe share: the
//! connection, the settings, whether Redis counts as up, the queue of
//! writes, hold ids.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::aio::ConnectionManager;
use tokio::sync::{Notify, mpsc, watch};
use tower_llm_core::{Cost, Tenant};
use tower_llm_cost::{Ask, MemoryQuota, OVERFLOW_TENANT, QuotaConfig};
use tower_llm_redis::RedisSettings;

use crate::scripts::{Counted, Scripts};
use crate::store::Usage;

/// Holds of the in-process fallback have this bit set in their id, Redis
/// holds never do: [`QuotaStore::settle`](tower_llm_cost::QuotaStore::settle)
/// knows where a hold was taken.
pub(crate) const LOCAL: u64 = 1 << 63;

/// Amounts sent to Redis are cut to this (2^53, about 9 million dollars
/// in nano-dollars): Lua counts in doubles, exact up to it.
pub(crate) const MAX_AMOUNT: u64 = 1 << 53;

/// The store's name in errors.
pub(crate) const STORE: &str = "redis quota store";

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
    /// An error on the connection: Redis counts as down; the command may
    /// have run.
    Down(String),
    /// No reply within the bound: slow, not down by itself (the probe
    /// tells); the command may still run.
    Late,
    /// The server answered with an error, or something unreadable: a bug,
    /// not an outage. Nothing is retried.
    Refused(String),
}

/// What the store, the reserve tasks, the worker and the probe share.
pub(crate) struct Inner {
    /// Reserves, settles and pushes (one multiplexed connection; no
    /// response timeout of its own: each caller bounds its wait).
    pub(crate) conn: ConnectionManager,
    pub(crate) scripts: Scripts,
    pub(crate) redis: RedisSettings,
    /// The longest a reserve waits for its reply.
    pub(crate) reserve_timeout: Duration,
    pub(crate) config: QuotaConfig,
    pub(crate) share: tower_llm_redis::LocalShare,
    /// The in-process fallback: the limits × the share.
    pub(crate) local: MemoryQuota,
    /// Redis counts as up (optimistic at start: the first command or
    /// PING tells). A watch: a reserve waiting for its reply also waits
    /// for the store to go down.
    pub(crate) up: watch::Sender<bool>,
    /// Wakes the worker: Redis went down, or spend waits to be pushed.
    pub(crate) wake: Notify,
    /// Wakes the probe: a command is in flight, or late.
    pub(crate) probe: Notify,
    pub(crate) queue: mpsc::Sender<Job>,
    pub(crate) dropped: AtomicU64,
    /// Reserves that waited the reserve timeout with Redis alive, and were
    /// counted in-process.
    pub(crate) late: AtomicU64,
    pub(crate) unpushed: Mutex<HashMap<(Tenant, u64), Ask>>,
    pub(crate) lost_pushes: AtomicU64,
    pub(crate) base_id: u64,
    pub(crate) seq: AtomicU64,
    pub(crate) runtime: tokio::runtime::Handle,
}

impl Inner {
    pub(crate) fn is_up(&self) -> bool {
        *self.up.borrow()
    }

    /// Logs once per outage; wakes the worker to watch for Redis, and
    /// every reserve waiting on Redis (they count in-process).
    pub(crate) fn set_down(&self, error: &str) {
        let went_down = self.up.send_if_modified(|up| std::mem::replace(up, false));
        if went_down {
            tracing::warn!(
                addr = %self.redis.addr(),
                prefix = %self.redis.prefix(),
                error,
                local_share = self.share.get(),
                "quota store: Redis unavailable; each replica enforces its share of the quotas in-process until it answers again"
            );
            self.wake.notify_one();
        }
    }

    /// Logs once per outage.
    pub(crate) fn set_up(&self) {
        let came_back = self.up.send_if_modified(|up| !std::mem::replace(up, true));
        if came_back {
            tracing::info!(
                addr = %self.redis.addr(),
                prefix = %self.redis.prefix(),
                "quota store: Redis answers again; quotas are shared"
            );
        }
    }

    /// Asks the probe to check that Redis answers (coalesced; the probe
    /// paces itself).
    pub(crate) fn kick_probe(&self) {
        self.probe.notify_one();
    }

    /// A hold id no other hold of this replica has (random base plus a
    /// counter; 63 bits).
    pub(crate) fn next_id(&self) -> u64 {
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        self.base_id.wrapping_add(n) & !LOCAL
    }

    /// The tenant's base key: `{prefix}{t<hex>}:` (the braces keep a
    /// tenant's keys in one cluster slot).
    pub(crate) fn base(&self, tenant: &Tenant) -> String {
        self.redis.key(&format!("{{t{}}}:", hex(tenant.as_bytes())))
    }

    /// The prefix of the windows' sets of tenants counted apart:
    /// `{prefix}tenants:` (the window index follows).
    pub(crate) fn tenants_key(&self) -> String {
        self.redis.key("tenants:")
    }

    /// The overflow tenant: where tenants past `max_tenants` are counted.
    pub(crate) fn overflow() -> Tenant {
        Tenant::new(OVERFLOW_TENANT)
    }

    /// `"1"` when `tenant` is named in the config (always counted apart).
    pub(crate) fn named(&self, tenant: &Tenant) -> &'static str {
        if self.config.is_named(tenant.as_bytes()) {
            "1"
        } else {
            "0"
        }
    }

    pub(crate) fn config(&self) -> &QuotaConfig {
        &self.config
    }

    /// The longest the worker waits for the reply to a write: as long as
    /// a reserve may wait, and at least the op timeout. Later is late,
    /// not down: the job is run again.
    pub(crate) fn write_timeout(&self) -> Duration {
        self.reserve_timeout.max(self.redis.op_timeout())
    }

    /// Runs one script, waiting `timeout` at most for its reply.
    pub(crate) async fn invoke<T: redis::FromRedisValue>(
        &self,
        call: &redis::ScriptInvocation<'_>,
        timeout: Duration,
    ) -> Result<T, Fail> {
        let mut conn = self.conn.clone();
        match tokio::time::timeout(timeout, call.invoke_async::<T>(&mut conn)).await {
            Ok(reply) => classify(reply),
            Err(_) => Err(Fail::Late),
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

    /// What Redis counts for `tenant` now; `None` without a reply within
    /// the op timeout.
    pub(crate) async fn usage(&self, tenant: &Tenant) -> Option<Usage> {
        let mut call = self.scripts.usage.key(self.base(tenant));
        call.arg(self.config.window_secs);
        let reply: Vec<i64> = self.invoke(&call, self.redis.op_timeout()).await.ok()?;
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

/// A reply, or why there is none: an error on the connection is
/// [`Fail::Down`], one the server sent is [`Fail::Refused`].
pub(crate) fn classify<T>(reply: redis::RedisResult<T>) -> Result<T, Fail> {
    match reply {
        Ok(reply) => Ok(reply),
        Err(e) if is_connection_error(&e) => Err(Fail::Down(e.to_string())),
        Err(e) => Err(Fail::Refused(e.to_string())),
    }
}

/// An error on the connection (no answer), not one the server sent. The
/// connection has no response timeout, so a timeout here is one of
/// connecting.
fn is_connection_error(e: &redis::RedisError) -> bool {
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

pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::hex;

    #[test]
    fn tenant_keys_are_hex_and_tell_ids_apart() {
        assert_eq!(hex(b"\xff\x00a"), "ff0061");
        assert_eq!(hex(b""), "");
    }
}
