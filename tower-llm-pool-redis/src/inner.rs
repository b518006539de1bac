//! What the store and its liveness task share: the connection, the
//! settings, whether Redis counts as up, the in-process pacers of the
//! local share; and the take and give-back on Redis.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use redis::aio::ConnectionManager;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tower_llm_pool::{PaceLimits, Pacer, SharedTicket};
use tower_llm_redis::{LocalShare, RedisSettings};

use crate::scripts::{Scripts, TTL_MS, Taken, amount, limit};

/// The store's name in errors and logs.
pub(crate) const STORE: &str = "redis pacing store";

/// Give-backs in flight at most; more are dropped (and counted): a
/// bucket short of what it was not given back refills within 60 s.
pub(crate) const MAX_GIVING_BACK: usize = 4_096;

/// The in-process pacers of the local share, by deployment: the limits
/// they were made for, and the pacer.
type LocalPacers = HashMap<String, (PaceLimits, Arc<Pacer>)>;

/// What the store and its liveness task share.
pub(crate) struct Inner {
    /// Takes and give-backs (one multiplexed connection; each reply
    /// awaited the op timeout at most).
    pub(crate) conn: ConnectionManager,
    pub(crate) scripts: Scripts,
    pub(crate) redis: RedisSettings,
    pub(crate) share: LocalShare,
    /// The in-process pacers used while Redis is down (limits × share).
    pub(crate) local: Mutex<LocalPacers>,
    /// Redis counts as up (optimistic at start: the first command or
    /// `PING` tells). A watch: a take waiting for its reply also waits
    /// for the store to go down.
    pub(crate) up: watch::Sender<bool>,
    /// Wakes the liveness task: a reply was late, or Redis went down.
    pub(crate) probe: Notify,
    /// Takes that got no reply within the op timeout (answered from the
    /// local share).
    pub(crate) late: AtomicU64,
    /// Takes whose script failed on the server (answered from the local
    /// share).
    pub(crate) refused: AtomicU64,
    pub(crate) giving_back: AtomicUsize,
    pub(crate) dropped: AtomicU64,
    pub(crate) runtime: tokio::runtime::Handle,
}

impl Inner {
    pub(crate) fn is_up(&self) -> bool {
        *self.up.borrow()
    }

    /// Logs once per outage; wakes the liveness task to watch for Redis
    /// and every take waiting on it (they pace in-process).
    pub(crate) fn set_down(&self, error: &str) {
        if self.up.send_if_modified(|up| std::mem::replace(up, false)) {
            tracing::warn!(
                addr = %self.redis.addr(),
                prefix = %self.redis.prefix(),
                error,
                local_share = self.share.get(),
                "pool pacing store: Redis unavailable; each replica paces every deployment at its share of the limits in-process until it answers again"
            );
            self.probe.notify_one();
        }
    }

    /// Logs once per outage.
    pub(crate) fn set_up(&self) {
        if self.up.send_if_modified(|up| !std::mem::replace(up, true)) {
            tracing::info!(
                addr = %self.redis.addr(),
                prefix = %self.redis.prefix(),
                "pool pacing store: Redis answers again; deployments' buckets are shared"
            );
        }
    }

    /// The key of `deployment`'s buckets.
    pub(crate) fn key(&self, deployment: &str) -> String {
        self.redis.key(deployment)
    }

    /// A take on Redis (the op timeout at most), or from the local share
    /// when Redis is down, is declared down meanwhile, is late, or fails.
    pub(crate) async fn take(
        &self,
        deployment: &str,
        limits: PaceLimits,
        tokens: u64,
    ) -> Result<SharedTicket, Instant> {
        let mut up = self.up.subscribe();
        if !*up.borrow_and_update() {
            return self.local_take(deployment, limits, tokens);
        }
        let mut call = self.scripts.take.key(self.key(deployment));
        call.arg(limit(limits.rpm))
            .arg(limit(limits.tpm))
            .arg(amount(tokens))
            .arg(limit(limits.burst_ms))
            .arg(TTL_MS);
        let mut conn = self.conn.clone();
        let op_timeout = self.redis.op_timeout();
        let reply = tokio::select! {
            biased;
            reply = tokio::time::timeout(op_timeout, call.invoke_async::<Vec<i64>>(&mut conn)) => reply,
            _ = up.wait_for(|up| !*up) => return self.local_take(deployment, limits, tokens),
        };
        let error = match reply {
            Ok(Ok(reply)) => match Taken::parse(&reply) {
                Some(Taken::Now(taken)) => return Ok(SharedTicket::shared(taken)),
                Some(Taken::In(ms)) => return Err(Instant::now() + Duration::from_millis(ms)),
                None => Some(format!("malformed reply {reply:?}")),
            },
            Ok(Err(e)) if !e.is_timeout() && is_connection_error(&e) => {
                self.set_down(&e.to_string());
                None
            }
            Ok(Err(e)) if !e.is_timeout() => Some(e.to_string()),
            // Slow is not down: the liveness task tells.
            Ok(Err(_)) | Err(_) => {
                self.count_late();
                None
            }
        };
        if let Some(error) = error {
            let n = self.refused.fetch_add(1, Ordering::Relaxed) + 1;
            if n.is_power_of_two() {
                tracing::warn!(
                    prefix = %self.redis.prefix(),
                    error,
                    refused = n,
                    "pool pacing store: take script failed; this request is paced in-process"
                );
            }
        }
        self.local_take(deployment, limits, tokens)
    }

    /// A take with no reply within the op timeout: answered from the
    /// local share; counted, logged at powers of two, and the liveness
    /// task asked whether Redis answers.
    fn count_late(&self) {
        self.probe.notify_one();
        let n = self.late.fetch_add(1, Ordering::Relaxed) + 1;
        if n.is_power_of_two() {
            tracing::warn!(
                prefix = %self.redis.prefix(),
                late = n,
                op_timeout = ?self.redis.op_timeout(),
                local_share = self.share.get(),
                "pool pacing store: a take got no reply within the op timeout; that request is paced in-process at the local share"
            );
        }
    }

    /// One request and `tokens` from this replica's share of
    /// `deployment`'s limits.
    pub(crate) fn local_take(
        &self,
        deployment: &str,
        limits: PaceLimits,
        tokens: u64,
    ) -> Result<SharedTicket, Instant> {
        self.local_pacer(deployment, limits)
            .try_take(tokens)
            .map(SharedTicket::local)
    }

    /// The in-process pacer of `deployment` at the local share of
    /// `limits` (made on first use, full; made again if the limits
    /// change).
    pub(crate) fn local_pacer(&self, deployment: &str, limits: PaceLimits) -> Arc<Pacer> {
        let mut local = self.local.lock().unwrap_or_else(PoisonError::into_inner);
        match local.get(deployment) {
            Some((made_for, pacer)) if *made_for == limits => pacer.clone(),
            _ => {
                let pacer = Arc::new(Pacer::new(scaled(limits, self.share)));
                local.insert(deployment.to_owned(), (limits, pacer.clone()));
                pacer
            }
        }
    }

    /// Gives `tokens` back to `deployment`'s token bucket on Redis, on a
    /// task of its own (the op timeout at most). Dropped while Redis is
    /// down, or when too many are in flight.
    pub(crate) fn give_back(self: &Arc<Self>, deployment: &str, limits: PaceLimits, tokens: u64) {
        if tokens == 0 || !self.is_up() {
            return;
        }
        if self.giving_back.fetch_add(1, Ordering::AcqRel) >= MAX_GIVING_BACK {
            self.giving_back.fetch_sub(1, Ordering::AcqRel);
            let n = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            if n.is_power_of_two() {
                tracing::warn!(
                    prefix = %self.redis.prefix(),
                    dropped = n,
                    "pool pacing store: too many give-backs in flight; one is dropped (the bucket refills within 60 s)"
                );
            }
            return;
        }
        let inner = self.clone();
        let key = self.key(deployment);
        self.runtime.spawn(async move {
            let mut call = inner.scripts.give_back.key(key);
            call.arg(limit(limits.rpm))
                .arg(limit(limits.tpm))
                .arg(0)
                .arg(amount(tokens))
                .arg(limit(limits.burst_ms))
                .arg(TTL_MS);
            let mut conn = inner.conn.clone();
            let reply = tokio::time::timeout(
                inner.redis.op_timeout(),
                call.invoke_async::<i64>(&mut conn),
            )
            .await;
            match reply {
                Ok(Err(e)) if !e.is_timeout() && is_connection_error(&e) => {
                    inner.set_down(&e.to_string());
                }
                Ok(Err(_)) | Err(_) => inner.probe.notify_one(),
                Ok(Ok(_)) => {}
            }
            inner.giving_back.fetch_sub(1, Ordering::AcqRel);
        });
    }
}

/// An error on the connection (no answer), not one the server sent.
fn is_connection_error(e: &redis::RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_unrecoverable_error()
}

/// `limits` × `share`, rounded down (a limit not set stays unset; the
/// pacer counts 0 as 1).
pub(crate) fn scaled(limits: PaceLimits, share: LocalShare) -> PaceLimits {
    let scale = |n: u32| u32::try_from(share.scale(u64::from(n))).unwrap_or(n);
    PaceLimits {
        rpm: limits.rpm.map(scale),
        tpm: limits.tpm.map(scale),
        burst_ms: limits.burst_ms,
    }
}

#[cfg(test)]
mod tests {
    use super::{LocalShare, scaled};
    use tower_llm_pool::PaceLimits;

    #[test]
    fn the_local_limits_are_the_share_of_each_limit() {
        let limits = PaceLimits {
            rpm: Some(60),
            tpm: Some(10_001),
            burst_ms: None,
        };
        assert_eq!(
            scaled(limits, LocalShare::new(0.5).unwrap()),
            PaceLimits {
                rpm: Some(30),
                tpm: Some(5_000),
                burst_ms: None
            }
        );
        assert_eq!(scaled(limits, LocalShare::WHOLE), limits);
        let tpm_only = PaceLimits {
            rpm: None,
            tpm: Some(u32::MAX),
            burst_ms: None,
        };
        assert_eq!(
            scaled(tpm_only, LocalShare::of_replicas(3)).tpm,
            Some(u32::MAX / 3)
        );
        assert_eq!(scaled(tpm_only, LocalShare::of_replicas(3)).rpm, None);
    }
}
