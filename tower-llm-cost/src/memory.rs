//! [`MemoryQuota`]: tenant quotas counted in this process.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;
#[cfg(test)]
use tower_llm_core::Cost;
use tower_llm_core::Tenant;

use crate::quota::{
    Ask, OVERFLOW_TENANT, QuotaConfig, QuotaHold, QuotaRefusal, QuotaStore, Reserve,
};

/// Tenant quotas counted in this process: exact for one replica (every
/// hold and settle is one short critical section), blind to others.
/// Behind several replicas use `tower_llm_cost_redis::RedisQuota`, or
/// give each replica its share of the limits.
///
/// Windows follow `tokio::time` from the Unix time at creation, so a test
/// with paused time moves them with `tokio::time::advance`. Buckets of
/// ended windows are dropped as new windows begin (a settle for an ended
/// window still counts there, then it is dropped too).
///
/// ```
/// use std::time::Duration;
/// use tower_llm_core::{Cost, Tenant};
/// use tower_llm_cost::{Ask, Limits, MemoryQuota, QuotaConfig, QuotaStore};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let limits = Limits { max_cost: Cost::from_dollars(1.0), max_tokens: None };
/// let quota = MemoryQuota::new(QuotaConfig::new(Duration::from_secs(86_400), limits));
/// let acme = Tenant::new(&b"acme"[..]);
/// let ask = Ask { cost: Cost::from_dollars(0.75).unwrap(), tokens: 1_000 };
/// let hold = quota.reserve(&acme, ask).await.unwrap();
/// assert!(quota.reserve(&acme, ask).await.is_err(), "0.25 left, 0.75 held");
/// quota.settle(hold, Ask { cost: Cost::from_dollars(0.25).unwrap(), tokens: 300 });
/// assert_eq!(quota.used(&acme).cost, Cost::from_dollars(0.25).unwrap());
/// # }
/// ```
#[derive(Clone)]
pub struct MemoryQuota {
    inner: Arc<Inner>,
}

struct Inner {
    config: QuotaConfig,
    unix_at_start: Duration,
    start: Instant,
    buckets: Mutex<Buckets>,
}

#[derive(Default)]
struct Buckets {
    next_id: u64,
    newest_window: u64,
    by_tenant: HashMap<(Tenant, u64), Bucket>,
}

#[derive(Default)]
struct Bucket {
    spent: Ask,
    /// Open holds: id → (amount, taken at).
    holds: HashMap<u64, (Ask, Instant)>,
}

impl Bucket {
    /// Spent plus held, dropping holds older than `ttl`.
    fn used(&mut self, now: Instant, ttl: Duration) -> Ask {
        self.holds
            .retain(|_, (_, at)| now.saturating_duration_since(*at) < ttl);
        let mut used = self.spent;
        for (held, _) in self.holds.values() {
            used = add(used, *held);
        }
        used
    }
}

fn add(a: Ask, b: Ask) -> Ask {
    Ask {
        cost: a.cost.saturating_add(b.cost),
        tokens: a.tokens.saturating_add(b.tokens),
    }
}

impl fmt::Debug for MemoryQuota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryQuota")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl MemoryQuota {
    /// Quotas of `config`, nothing spent.
    pub fn new(config: QuotaConfig) -> Self {
        let unix_at_start = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        MemoryQuota {
            inner: Arc::new(Inner {
                config,
                unix_at_start,
                start: Instant::now(),
                buckets: Mutex::new(Buckets::default()),
            }),
        }
    }

    /// The settings.
    pub fn config(&self) -> &QuotaConfig {
        &self.inner.config
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Buckets> {
        self.inner
            .buckets
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The current window and the time until it ends.
    fn window(&self) -> (u64, Duration) {
        let unix = self.inner.unix_at_start + self.inner.start.elapsed();
        self.inner.config.window_at(unix.as_secs())
    }

    /// What `tenant` has spent and holds in the current window.
    pub fn used(&self, tenant: &Tenant) -> Ask {
        let (window, _) = self.window();
        let ttl = self.inner.config.hold_ttl();
        let mut buckets = self.lock();
        buckets
            .by_tenant
            .get_mut(&(tenant.clone(), window))
            .map(|b| b.used(Instant::now(), ttl))
            .unwrap_or_default()
    }

    /// What `tenant` holds for attempts still running in the current window.
    pub fn held(&self, tenant: &Tenant) -> Ask {
        let (window, _) = self.window();
        let buckets = self.lock();
        let mut held = Ask::default();
        if let Some(b) = buckets.by_tenant.get(&(tenant.clone(), window)) {
            for (ask, _) in b.holds.values() {
                held = add(held, *ask);
            }
        }
        held
    }

    /// Holds `ask` for `tenant` now (the synchronous core of
    /// [`QuotaStore::reserve`]).
    ///
    /// # Errors
    ///
    /// The refusal, when `ask` does not fit (never in shadow mode).
    pub fn try_reserve(&self, tenant: &Tenant, ask: Ask) -> Result<QuotaHold, QuotaRefusal> {
        let config = &self.inner.config;
        let limits = config.limits_of(tenant.as_bytes());
        let (window, resets_in) = self.window();
        let now = Instant::now();
        let mut buckets = self.lock();
        if window > buckets.newest_window {
            buckets.newest_window = window;
            // Ended windows are done: keep only the current one.
            buckets.by_tenant.retain(|(_, w), _| *w >= window);
        }
        buckets.next_id += 1;
        let id = buckets.next_id;
        // Past `max_tenants` in this window, a tenant not yet counted is
        // counted with the others like it.
        let counted = buckets.by_tenant.contains_key(&(tenant.clone(), window))
            || config.is_named(tenant.as_bytes())
            || (buckets.by_tenant.len() as u64) < config.max_tenants;
        let overflow;
        let tenant = if counted {
            tenant
        } else {
            overflow = Tenant::new(OVERFLOW_TENANT);
            &overflow
        };
        let bucket = buckets
            .by_tenant
            .entry((tenant.clone(), window))
            .or_default();
        let used = bucket.used(now, config.hold_ttl());
        let refusal = QuotaRefusal::of(&limits, used, ask, resets_in);
        let hold = QuotaHold::new(tenant.clone(), window, id, ask);
        let hold = match refusal {
            None => hold,
            Some(refusal) if config.shadow => hold.over_limit(refusal),
            Some(refusal) => return Err(refusal),
        };
        bucket.holds.insert(id, (ask, now));
        Ok(hold)
    }
}

impl QuotaStore for MemoryQuota {
    fn reserve(&self, tenant: &Tenant, ask: Ask) -> Reserve {
        // Held when first polled, in the poll that hands the hold over: a
        // future dropped unpolled holds nothing.
        let this = self.clone();
        let tenant = tenant.clone();
        Box::pin(async move { this.try_reserve(&tenant, ask) })
    }

    fn settle(&self, hold: QuotaHold, spent: Ask) {
        let spent = Ask {
            cost: spent.cost.min(hold.held().cost),
            tokens: spent.tokens.min(hold.held().tokens),
        };
        let mut buckets = self.lock();
        let bucket = buckets
            .by_tenant
            .entry((hold.tenant().clone(), hold.window()))
            .or_default();
        bucket.holds.remove(&hold.id());
        bucket.spent = add(bucket.spent, spent);
    }
}

/// `Cost` of `dollars`, for tests.
#[cfg(test)]
fn usd(dollars: f64) -> Cost {
    Cost::from_dollars(dollars).unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::{Exhausted, Limits};

    fn quota(limits: Limits) -> MemoryQuota {
        MemoryQuota::new(QuotaConfig::new(Duration::from_secs(3_600), limits))
    }

    fn ask(dollars: f64, tokens: u64) -> Ask {
        Ask {
            cost: usd(dollars),
            tokens,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_token_limit_refuses_what_would_pass_it_and_says_what_is_left() {
        let q = quota(Limits {
            max_cost: None,
            max_tokens: Some(1_000),
        });
        let t = Tenant::new(&b"t"[..]);
        let hold = q.try_reserve(&t, ask(5.0, 900)).unwrap();
        let refused = q.try_reserve(&t, ask(0.0, 101)).unwrap_err();
        assert_eq!(
            (refused.exhausted, refused.left.tokens),
            (Exhausted::Tokens, 100)
        );
        q.settle(hold, ask(5.0, 10));
        assert_eq!(q.used(&t), ask(5.0, 10));
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_window_starts_whole_and_a_late_settle_counts_in_its_own_window() {
        let q = quota(Limits {
            max_cost: Some(usd(1.0)),
            max_tokens: None,
        });
        let t = Tenant::new(&b"t"[..]);
        let hold = q.try_reserve(&t, ask(1.0, 0)).unwrap();
        assert!(q.try_reserve(&t, ask(0.01, 0)).is_err());
        tokio::time::advance(Duration::from_secs(3_600)).await;
        q.settle(hold, ask(1.0, 0));
        assert_eq!(q.used(&t), Ask::default());
        assert!(q.try_reserve(&t, ask(1.0, 0)).is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn an_unsettled_hold_stops_counting_after_its_time() {
        let mut config = QuotaConfig::new(
            Duration::from_secs(86_400),
            Limits {
                max_cost: Some(usd(1.0)),
                max_tokens: None,
            },
        );
        config.hold_secs = 60;
        let q = MemoryQuota::new(config);
        let t = Tenant::new(&b"t"[..]);
        let _lost = q.try_reserve(&t, ask(1.0, 0)).unwrap();
        assert!(q.try_reserve(&t, ask(0.5, 0)).is_err());
        // Stay in the same day: the test clock starts anywhere in one.
        let (_, left) = q.window();
        if left > Duration::from_secs(61) {
            tokio::time::advance(Duration::from_secs(61)).await;
            assert!(q.try_reserve(&t, ask(0.5, 0)).is_ok());
        }
    }

    #[tokio::test(start_paused = true)]
    async fn shadow_mode_holds_everything_and_marks_what_it_would_refuse() {
        let q = MemoryQuota::new(
            QuotaConfig::new(
                Duration::from_secs(60),
                Limits {
                    max_cost: Some(usd(1.0)),
                    max_tokens: None,
                },
            )
            .shadow(true),
        );
        let t = Tenant::new(&b"t"[..]);
        let a = q.try_reserve(&t, ask(0.9, 0)).unwrap();
        assert!(a.shadow_refusal().is_none());
        let b = q.try_reserve(&t, ask(0.9, 0)).unwrap();
        assert_eq!(
            b.shadow_refusal().map(|r| r.exhausted),
            Some(Exhausted::Cost)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn tenants_past_max_tenants_are_counted_together_in_bounded_memory() {
        let mut config = QuotaConfig::new(
            Duration::from_secs(3_600),
            Limits {
                max_cost: Some(usd(1.0)),
                max_tokens: None,
            },
        )
        .with_tenant(
            "vip",
            Limits {
                max_cost: Some(usd(5.0)),
                max_tokens: None,
            },
        );
        config.max_tenants = 2;
        let q = MemoryQuota::new(config);
        let t = |id: &[u8]| Tenant::new(id);
        assert!(q.try_reserve(&t(b"a"), ask(0.6, 0)).is_ok());
        assert!(q.try_reserve(&t(b"b"), ask(0.6, 0)).is_ok());
        // Two tenants counted: the third and fourth share one bucket.
        assert!(q.try_reserve(&t(b"c"), ask(0.6, 0)).is_ok());
        assert!(q.try_reserve(&t(b"d"), ask(0.6, 0)).is_err());
        // Those already counted stay apart; a named one always is.
        assert!(q.try_reserve(&t(b"a"), ask(0.3, 0)).is_ok());
        assert!(q.try_reserve(&t(b"vip"), ask(4.0, 0)).is_ok());
        for i in 0..1_000u32 {
            let _ = q.try_reserve(&t(&i.to_be_bytes()), ask(0.0, 0));
        }
        assert!(q.lock().by_tenant.len() <= 4, "a, b, vip and the others");
    }

    #[tokio::test(start_paused = true)]
    async fn tenants_are_counted_apart_and_named_ones_get_their_own_limits() {
        let q = MemoryQuota::new(
            QuotaConfig::new(
                Duration::from_secs(60),
                Limits {
                    max_cost: Some(usd(1.0)),
                    max_tokens: None,
                },
            )
            .with_tenant(
                "big",
                Limits {
                    max_cost: Some(usd(10.0)),
                    max_tokens: None,
                },
            ),
        );
        assert!(
            q.try_reserve(&Tenant::new(&b"big"[..]), ask(5.0, 0))
                .is_ok()
        );
        assert!(
            q.try_reserve(&Tenant::new(&b"small"[..]), ask(5.0, 0))
                .is_err()
        );
        assert!(
            q.try_reserve(&Tenant::new(&b"\xff"[..]), ask(1.0, 0))
                .is_ok()
        );
    }
}
