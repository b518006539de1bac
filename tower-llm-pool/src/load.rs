//! [`DeploymentLoad`]: what a pool knows of one deployment's load and health.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

/// Weight of a new sample in the moving averages.
const ALPHA: f64 = 0.2;

/// How much a deployment's recent failure rate weighs on its score: a
/// deployment failing every call scores as five times as loaded.
const FAILURE_PENALTY: f64 = 4.0;

/// One deployment's load: calls in flight, and moving averages of its
/// latency and failure rate. Share one between the pools (and the unary
/// and streaming stacks) that send to the same deployment
/// ([`Deployment::with_load`](crate::Deployment::with_load)), so each
/// sees all its calls.
#[derive(Debug)]
pub struct DeploymentLoad {
    averages: Mutex<Averages>,
    /// What in-flight start times are measured from.
    epoch: Instant,
}

impl Default for DeploymentLoad {
    fn default() -> Self {
        DeploymentLoad {
            averages: Mutex::default(),
            epoch: Instant::now(),
        }
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct Averages {
    /// Latency, in milliseconds (0 until the first sample).
    latency_ms: f64,
    /// Failures among recent calls, 0 to 1.
    failures: f64,
    /// No call may go here before this (a 429's `Retry-After`, or the
    /// pacer's).
    cooling_until: Option<Instant>,
    /// A successful call's latency has been seen.
    sampled: bool,
    /// The calls in flight, and the sum of their start times (ms since
    /// `epoch`): their mean age, in O(1).
    running: u32,
    started_sum_ms: f64,
    /// The adaptive concurrency limit (AIMD), when on: calls in flight
    /// at or over it make the deployment full.
    limit: Option<f64>,
    limit_max: f64,
}

/// What [`DeploymentLoad::snapshot`] reads.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoadSnapshot {
    /// Calls in flight.
    pub in_flight: u32,
    /// Moving average of latency (time to an answer, or to a stream's
    /// first content), in milliseconds.
    pub latency_ms: f64,
    /// Moving average of failures (0 to 1).
    pub failure_rate: f64,
    /// The adaptive concurrency limit, when on.
    pub concurrency_limit: Option<f64>,
}

impl DeploymentLoad {
    /// A deployment with no calls yet.
    pub fn new() -> Self {
        DeploymentLoad::default()
    }

    fn averages(&self) -> std::sync::MutexGuard<'_, Averages> {
        self.averages
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The score power-of-two-choices compares (lower is better): the
    /// latency × (in flight + 1) × the failure penalty. The latency is the
    /// moving average of successful calls (`prior_ms`, the pool's mean,
    /// before the first), or the mean age of the calls in flight when that
    /// is longer (a deployment that has gone slow shows it before its
    /// calls end). Weights act in the draw, not here.
    pub(crate) fn score(&self, prior_ms: f64, now: Instant) -> f64 {
        let a = *self.averages();
        let known = if a.sampled { a.latency_ms } else { prior_ms };
        let age = if a.running == 0 {
            0.0
        } else {
            let now_ms = now.saturating_duration_since(self.epoch).as_secs_f64() * 1_000.0;
            now_ms - a.started_sum_ms / f64::from(a.running)
        };
        (known.max(age) + 1.0) * (f64::from(a.running) + 1.0) * (1.0 + FAILURE_PENALTY * a.failures)
    }

    /// The moving average of successful calls' latency, once there is one.
    pub(crate) fn latency(&self) -> Option<f64> {
        let a = *self.averages();
        a.sampled.then_some(a.latency_ms)
    }

    /// `true` while no call may go to the deployment.
    pub(crate) fn cooling(&self, now: Instant) -> Option<Instant> {
        self.averages().cooling_until.filter(|t| *t > now)
    }

    /// No call before `until` (the later of this and an earlier one).
    pub(crate) fn cool_until(&self, until: Instant) {
        let mut a = self.averages();
        a.cooling_until = Some(a.cooling_until.map_or(until, |t| t.max(until)));
    }

    /// Turns on adaptive concurrency (AIMD): the deployment takes at most
    /// `limit` calls at once, starting at `max`; each fault of its own
    /// (a 429, a 5xx, an overloaded answer) cuts the limit by 30 %, each
    /// success raises it by one over the limit (one per limit's worth of
    /// successes), from 1 up to `max`. Keeps a limit already running.
    pub fn adaptive(&self, max: u32) {
        let mut a = self.averages();
        let max = f64::from(max.max(1));
        a.limit = Some(a.limit.map_or(max, |l| l.min(max)));
        a.limit_max = max;
    }

    /// `true` when adaptive concurrency is on and the deployment has as
    /// many calls in flight as its limit allows.
    pub(crate) fn full(&self) -> bool {
        let a = self.averages();
        a.limit
            .is_some_and(|l| f64::from(a.running) >= l.floor().max(1.0))
    }

    /// A call starts; the guard ends it.
    pub(crate) fn start(self: &Arc<Self>) -> InFlight {
        let at = Instant::now()
            .saturating_duration_since(self.epoch)
            .as_secs_f64()
            * 1_000.0;
        let mut a = self.averages();
        a.running += 1;
        a.started_sum_ms += at;
        drop(a);
        InFlight(self.clone(), at)
    }

    /// Records how a call went: a failure counts in the failure rate
    /// only (a deployment that fails fast must not look fast).
    pub(crate) fn record(&self, latency: Duration, failed: bool) {
        let mut a = self.averages();
        a.failures += ALPHA * (f64::from(u8::from(failed)) - a.failures);
        let ceiling = a.limit_max;
        if let Some(limit) = a.limit.as_mut() {
            *limit = if failed {
                (*limit * 0.7).max(1.0)
            } else {
                (*limit + 1.0 / *limit).min(ceiling)
            };
        }
        if failed {
            return;
        }
        let ms = latency.as_secs_f64() * 1_000.0;
        a.latency_ms = if a.sampled {
            a.latency_ms + ALPHA * (ms - a.latency_ms)
        } else {
            ms
        };
        a.sampled = true;
    }

    /// What the pool knows now.
    pub fn snapshot(&self) -> LoadSnapshot {
        let a = *self.averages();
        LoadSnapshot {
            in_flight: a.running,
            concurrency_limit: a.limit,
            latency_ms: a.latency_ms,
            failure_rate: a.failures,
        }
    }
}

/// A call in flight; dropping it ends the call's count.
#[derive(Debug)]
pub(crate) struct InFlight(Arc<DeploymentLoad>, f64);

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut a = self.0.averages();
        a.running = a.running.saturating_sub(1);
        a.started_sum_ms = if a.running == 0 {
            0.0
        } else {
            a.started_sum_ms - self.1
        };
    }
}
