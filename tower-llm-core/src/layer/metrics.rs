//! [`MetricsExt`] and [`FailureExt`]: what the layers record about a call
//! as it ends.

use std::time::Duration;

use super::sealed::Sealed;
use crate::telemetry::{HedgeOutcome, Metrics};
use crate::{AttemptRecord, Failure};

/// The layers' side of [`Metrics`]: recording (a program only chooses the
/// meter, or none). Sealed: implemented for [`Metrics`] only.
pub trait MetricsExt: Sealed {
    /// Records a finished logical call: `failure` is its error (`None` on
    /// success), `attempts` its attempt records (the call's owner, once;
    /// rule 1 of the [contract](super#the-cross-layer-contract)).
    fn record_call(&self, failure: Option<&Failure>, attempts: &[AttemptRecord]);

    /// Counts one hedge decision (`ai_router_hedges_total`).
    fn record_hedge(&self, outcome: HedgeOutcome);

    /// Counts one answer replayed by an idempotency layer
    /// (`ai_router_idempotent_replays_total`).
    fn record_idempotent_replay(&self);

    /// Counts one call a response cache saw, by what it did
    /// (`ai_router_cache_total`).
    fn record_cache(&self, status: crate::CacheStatus);

    /// Adds what one attempt on `link` cost (`ai_router_cost_total`).
    fn record_cost(&self, link: &crate::Link, cost: crate::Cost);

    /// Counts a call a pool moved away from deployment `from`, for
    /// `reason` (a failure class label, or `paced`)
    /// (`ai_router_pool_moves_total`).
    fn record_pool_move(&self, from: &std::sync::Arc<str>, reason: &'static str);
}

impl MetricsExt for Metrics {
    fn record_call(&self, failure: Option<&Failure>, attempts: &[AttemptRecord]) {
        self.count_call(failure, attempts);
    }

    fn record_hedge(&self, outcome: HedgeOutcome) {
        self.count_hedge(outcome);
    }

    fn record_idempotent_replay(&self) {
        self.count_idempotent_replay();
    }

    fn record_cache(&self, status: crate::CacheStatus) {
        self.count_cache(status);
    }

    fn record_cost(&self, link: &crate::Link, cost: crate::Cost) {
        self.count_cost(link, cost);
    }

    fn record_pool_move(&self, from: &std::sync::Arc<str>, reason: &'static str) {
        self.count_pool_move(from, reason);
    }
}

/// The layers' side of [`Failure`]: what the fallback layer marks on the
/// failure it returns. Sealed: implemented for [`Failure`] only.
pub trait FailureExt: Sealed {
    /// Marks this, the last link's failure, as the end of a fallback chain
    /// in which every link failed
    /// ([`is_all_links_failed`](Failure::is_all_links_failed)); `retry_after`
    /// becomes `earliest` (the soonest any link may serve again, when every
    /// link said).
    fn mark_all_links_failed(&mut self, earliest: Option<Duration>);
}

impl FailureExt for Failure {
    fn mark_all_links_failed(&mut self, earliest: Option<Duration>) {
        self.set_all_links_failed(earliest);
    }
}
