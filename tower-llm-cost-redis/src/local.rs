//! The in-process side: holds taken at the local share (Redis down, or a
//! reserve that waited its longest), settles, and the spend waiting to be
//! pushed to Redis.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{MutexGuard, PoisonError};

use tower_llm_core::{Cost, Tenant};
use tower_llm_cost::{Ask, Limits, QuotaConfig, QuotaHold, QuotaRefusal, QuotaStore};
use tower_llm_redis::LocalShare;

use crate::inner::{Inner, Job, LOCAL, add};

/// Tenant-windows of spend counted in-process and not yet pushed to
/// Redis, at most.
const MAX_UNPUSHED: usize = 65_536;

impl Inner {
    /// A hold of the in-process fallback (limits × share), its id tagged
    /// [`LOCAL`].
    pub(crate) fn local_reserve(
        &self,
        tenant: &Tenant,
        ask: Ask,
    ) -> Result<QuotaHold, QuotaRefusal> {
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

    /// A Redis hold: queued for the worker. A local one: settled
    /// in-process, its spend kept to push to Redis.
    pub(crate) fn settle(&self, hold: &QuotaHold, spent: Ask) {
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

    fn unpushed(&self) -> MutexGuard<'_, HashMap<(Tenant, u64), Ask>> {
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
                id: self.next_id(),
                spent,
            })
            .collect()
    }

    pub(crate) fn has_unpushed(&self) -> bool {
        !self.unpushed().is_empty()
    }
}

/// `limits` × `share`, rounded down (a limit not set stays unset).
pub(crate) fn scaled(limits: Limits, share: LocalShare) -> Limits {
    Limits {
        max_cost: limits
            .max_cost
            .map(|c| Cost::from_nanos(share.scale(c.nanos()))),
        max_tokens: limits.max_tokens.map(|t| share.scale(t)),
    }
}

/// The in-process fallback's settings: `config` with every limit × `share`.
pub(crate) fn local_config(config: &QuotaConfig, share: LocalShare) -> QuotaConfig {
    let mut local = config.clone();
    local.limits = scaled(config.limits, share);
    for limits in local.tenants.values_mut() {
        *limits = scaled(*limits, share);
    }
    local
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_local_limits_are_the_share_of_every_limit() {
        let c = QuotaConfig::new(
            Duration::from_secs(60),
            Limits {
                max_cost: Cost::from_dollars(1.0),
                max_tokens: Some(1_000),
            },
        )
        .with_tenant(
            "big",
            Limits {
                max_cost: Cost::from_dollars(10.0),
                max_tokens: None,
            },
        );
        let local = local_config(&c, LocalShare::of_replicas(4));
        assert_eq!(local.limits.max_cost, Cost::from_dollars(0.25));
        assert_eq!(local.limits.max_tokens, Some(250));
        assert_eq!(local.limits_of(b"big").max_cost, Cost::from_dollars(2.5));
        assert_eq!(local.limits_of(b"big").max_tokens, None);
        assert_eq!(local_config(&c, LocalShare::WHOLE), c);
        let third = scaled(
            Limits {
                max_cost: None,
                max_tokens: Some(10),
            },
            LocalShare::of_replicas(3),
        );
        assert_eq!(third.max_tokens, Some(3));
    }
}
