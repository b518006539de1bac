//! [`DeploymentLoad`]: what a pool knows of one deployment's load and health.

use std::sync::atomic::{AtomicU32, Ordering};
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
#[derive(Debug, Default)]
pub struct DeploymentLoad {
    in_flight: AtomicU32,
    averages: Mutex<Averages>,
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
}

/// What [`Load::snapshot`] reads.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoadSnapshot {
    /// Calls in flight.
    pub in_flight: u32,
    /// Moving average of latency (time to an answer, or to a stream's
    /// first content), in milliseconds.
    pub latency_ms: f64,
    /// Moving average of failures (0 to 1).
    pub failure_rate: f64,
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

    /// The score power-of-two-choices compares (lower is better):
    /// latency × (in flight + 1) × the failure penalty, over `weight`.
    pub(crate) fn score(&self, weight: u32) -> f64 {
        let a = *self.averages();
        let in_flight = f64::from(self.in_flight.load(Ordering::Relaxed));
        (a.latency_ms + 1.0) * (in_flight + 1.0) * (1.0 + FAILURE_PENALTY * a.failures)
            / f64::from(weight.max(1))
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

    /// A call starts; the guard ends it.
    pub(crate) fn start(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(self.clone())
    }

    /// Records how a call went.
    pub(crate) fn record(&self, latency: Duration, failed: bool) {
        let mut a = self.averages();
        let ms = latency.as_secs_f64() * 1_000.0;
        a.latency_ms = if a.latency_ms == 0.0 {
            ms
        } else {
            a.latency_ms + ALPHA * (ms - a.latency_ms)
        };
        a.failures += ALPHA * (f64::from(u8::from(failed)) - a.failures);
    }

    /// What the pool knows now.
    pub fn snapshot(&self) -> LoadSnapshot {
        let a = *self.averages();
        LoadSnapshot {
            in_flight: self.in_flight.load(Ordering::Relaxed),
            latency_ms: a.latency_ms,
            failure_rate: a.failures,
        }
    }
}

/// A call in flight; dropping it ends the call's count.
#[derive(Debug)]
pub(crate) struct InFlight(Arc<DeploymentLoad>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}
