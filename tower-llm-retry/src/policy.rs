//! The retry decisions, as a `tower::retry::Policy`.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Sleep;
use tower::retry::Policy;
use tower_llm_core::layer::{AttemptLogExt as _, CallExt as _, Replay};
use tower_llm_core::{
    Call, Classify, Failure, FailureClass, FailurePolicy, Link, LlmRequest, NextStep, Outcome,
    RetryStop,
};

use crate::{Backoff, Budget, RandomSource, RetryBudget, SplitMix64};

/// Tokio's timer resolution: sleeps end on a whole millisecond.
const TIMER_GRANULARITY: Duration = Duration::from_millis(1);

/// The default shortest time worth starting an attempt with (see
/// [`RetryLayer::with_min_attempt`](crate::RetryLayer::with_min_attempt)).
pub(crate) const DEFAULT_MIN_ATTEMPT: Duration = Duration::from_secs(1);

/// Settings shared by every clone of a retry layer (behind one `Arc`).
#[derive(Clone)]
pub(crate) struct Shared<C> {
    pub(crate) classifier: C,
    pub(crate) failures: FailurePolicy,
    pub(crate) max_attempts: u8,
    pub(crate) attempt_timeout: Duration,
    pub(crate) max_retry_after: Duration,
    pub(crate) min_attempt: Duration,
    pub(crate) failover_on_timeout: bool,
    pub(crate) backoff: Backoff,
    pub(crate) budget: Arc<dyn Budget + Send + Sync>,
    pub(crate) rng: Arc<dyn RandomSource>,
    pub(crate) link: Link,
    pub(crate) metrics: tower_llm_core::Metrics,
}

impl<C: std::fmt::Debug> std::fmt::Debug for Shared<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RetrySettings")
            .field("classifier", &self.classifier)
            .field("max_attempts", &self.max_attempts)
            .field("attempt_timeout", &self.attempt_timeout)
            .field("max_retry_after", &self.max_retry_after)
            .field("min_attempt", &self.min_attempt)
            .field("failover_on_timeout", &self.failover_on_timeout)
            .field("backoff", &self.backoff)
            .field("rng", &self.rng)
            .field("link", &self.link)
            .finish_non_exhaustive()
    }
}

impl<C> Shared<C> {
    pub(crate) fn new(classifier: C) -> Self {
        Shared {
            classifier,
            failures: FailurePolicy::default(),
            max_attempts: 3,
            attempt_timeout: Duration::from_secs(30),
            max_retry_after: Duration::from_secs(60),
            min_attempt: DEFAULT_MIN_ATTEMPT,
            failover_on_timeout: false,
            backoff: Backoff::seed_default(),
            budget: Arc::new(RetryBudget::seed_default()),
            rng: Arc::new(SplitMix64::from_entropy()),
            link: Link::new("default", ""),
            metrics: tower_llm_core::Metrics::global(),
        }
    }
}

/// The retry policy of [`RetryLayer`](crate::RetryLayer), usable on its own
/// inside `tower::retry::Retry`.
///
/// It decides, after each attempt, whether to try again and how long to
/// wait first; see the [crate docs](crate) for the rules. Used directly in
/// tower's `Retry`, put [`AttemptLayer`](crate::AttemptLayer) inside it
/// (per-attempt timeout and the attempt log) and a deadline layer outside
/// it (which owns the log); [`RetryLayer`](crate::RetryLayer) does exactly
/// that for you.
///
/// Cloning is one reference-count increment; tower clones the policy once
/// per call, and the clone counts that call's attempts.
#[derive(Debug)]
pub struct RetryPolicy<C> {
    pub(crate) shared: Arc<Shared<C>>,
    attempts: u8,
}

impl<C> Clone for RetryPolicy<C> {
    fn clone(&self) -> Self {
        RetryPolicy {
            shared: self.shared.clone(),
            attempts: 0,
        }
    }
}

impl<C> RetryPolicy<C> {
    pub(crate) fn new(shared: Arc<Shared<C>>) -> Self {
        RetryPolicy {
            shared,
            attempts: 0,
        }
    }

    /// Marks the record of the attempt just made: the one at `index` when
    /// the attempt said which (the retry layer's own loop), otherwise the
    /// latest one if it is this attempt's (an attempt refused by the
    /// attempts cap left no record). By index, a record stays this
    /// attempt's even while another branch of the call (a hedge) appends
    /// its own.
    fn mark(
        &self,
        call: Option<&Call>,
        index: Option<usize>,
        f: impl FnOnce(&mut tower_llm_core::AttemptRecord),
    ) {
        let Some(log) = call.and_then(Call::log) else {
            return;
        };
        if let Some(index) = index {
            log.finish(index, f);
            return;
        }
        let attempt = self.attempts;
        let position = call
            .and_then(Call::link)
            .unwrap_or(&self.shared.link)
            .position();
        log.update_last(|r| {
            if r.attempt == attempt && r.fallback_position == position {
                f(r);
            }
        });
    }

    fn stop(&self, call: Option<&Call>, index: Option<usize>, why: RetryStop) -> Option<Sleep> {
        self.mark(call, index, |r| r.retry_stop = Some(why));
        None
    }
}

/// The request copy a retry decision is about.
pub(crate) trait NextCopy {
    /// The copy's carrier, read without touching the copy.
    fn call(&self) -> Option<&Call>;
    /// The copy's carrier, to prepare it for the next attempt.
    fn call_mut(&mut self) -> &mut Call;
}

/// A request kept whole (tower's `Retry` keeps its copies so).
struct Whole<'a, Req>(&'a mut Req);

impl<Req: LlmRequest> NextCopy for Whole<'_, Req> {
    fn call(&self) -> Option<&Call> {
        self.0.call()
    }
    fn call_mut(&mut self) -> &mut Call {
        self.0.call_mut()
    }
}

impl<Req: LlmRequest + Clone> NextCopy for Replay<Req> {
    fn call(&self) -> Option<&Call> {
        Replay::call(self)
    }
    fn call_mut(&mut self) -> &mut Call {
        Replay::call_mut(self)
    }
}

impl<C> RetryPolicy<C> {
    /// The decision after an attempt: `None` to return `result`, or the
    /// wait before the next attempt. The copy for the next attempt is
    /// read only when the attempt failed, and made ready (its per-call
    /// state attached) only when it will be sent.
    /// `index` is the attempt's record in the call's log, when known.
    pub(crate) fn decide<Res>(
        &mut self,
        result: &mut Result<Res, Failure>,
        index: Option<usize>,
        copy: &mut impl NextCopy,
    ) -> Option<Sleep>
    where
        C: Classify<Res, Failure>,
    {
        let shared = &*self.shared;
        if self.attempts == 0 {
            shared.budget.deposit();
        }
        self.attempts = self.attempts.saturating_add(1);
        let failed = match shared.classifier.classify(result) {
            Outcome::Success { .. } => return None,
            Outcome::Failure(failed) => failed,
        };
        let call = copy.call();
        if !shared.failures.disposition(&failed).retry {
            return self.stop(call, index, RetryStop::NotRetryable);
        }
        if self.attempts >= shared.max_attempts {
            return self.stop(call, index, RetryStop::AttemptsExhausted);
        }
        if shared.failover_on_timeout
            && failed.class == FailureClass::Timeout
            && failed.http_status.is_none()
            && call
                .and_then(Call::link)
                .is_some_and(Link::has_alternates_after)
        {
            return self.stop(call, index, RetryStop::FailoverOnTimeout);
        }
        // Retry-After is a floor under the schedule, never a shortcut: a
        // `Retry-After: 0` or a past date still waits out the backoff.
        let backoff = shared
            .backoff
            .delay(u32::from(self.attempts - 1), shared.rng.next_fraction());
        let delay = match failed.retry_after {
            Some(wait) if wait > shared.max_retry_after => {
                return self.stop(call, index, RetryStop::RetryAfterTooLong);
            }
            Some(wait) => wait.max(backoff),
            None => backoff,
        };
        if let Some(deadline) = call.and_then(Call::deadline) {
            // The wait and then a useful attempt must fit; timers round up
            // to the next millisecond, so a wait leaves at least that much.
            let attempt = shared.min_attempt.min(shared.attempt_timeout);
            let needed = delay + attempt.max(TIMER_GRANULARITY);
            if needed > deadline.remaining() || delay + TIMER_GRANULARITY >= deadline.remaining() {
                return self.stop(call, index, RetryStop::PastDeadline);
            }
        }
        if !shared.budget.withdraw() {
            return self.stop(call, index, RetryStop::BudgetExhausted);
        }
        self.mark(call, index, |r| r.next = NextStep::Retried);
        let next = self.attempts.saturating_add(1);
        copy.call_mut().set_attempt(next);
        Some(tokio::time::sleep(delay))
    }
}

impl<C, Req, Res> Policy<Req, Res, Failure> for RetryPolicy<C>
where
    C: Classify<Res, Failure>,
    Req: Clone + LlmRequest,
{
    type Future = Sleep;

    fn retry(&mut self, req: &mut Req, result: &mut Result<Res, Failure>) -> Option<Sleep> {
        self.decide(result, None, &mut Whole(req))
    }

    fn clone_request(&mut self, req: &Req) -> Option<Req> {
        if !req.is_replayable() {
            return None;
        }
        Some(req.clone())
    }
}
