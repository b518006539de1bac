//! One attempt's record and the closed sets that describe it.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::{FailureClass, Link};

/// How one attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum AttemptOutcome {
    /// The attempt succeeded.
    Succeeded,
    /// The attempt failed with this class.
    Failed(FailureClass),
    /// The link was never called: the request's policy forbids it (for
    /// example a data-residency rule).
    SkippedByPolicy,
    /// The attempt has started and not ended yet (never seen once the call
    /// is over: an attempt dropped early is marked cancelled or deadline
    /// exceeded).
    InFlight,
    /// The attempt was dropped because another attempt of the same call (a
    /// hedge, or the attempt a hedge raced) answered first. Not a failure
    /// of its link: it neither trips nor resets a circuit.
    CancelledByHedge,
}

/// What the layers did after an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum NextStep {
    /// The result (success or final failure) went back to the caller.
    #[default]
    Returned,
    /// The same link was tried again.
    Retried,
    /// The next link of the fallback chain was tried.
    FailedOver,
}

/// Why the retry layer did not try a failed attempt again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum RetryStop {
    /// The failure class is not retryable under the failure policy, or the
    /// provider said `x-should-retry: false`.
    NotRetryable,
    /// The link's `max_attempts` were used up.
    AttemptsExhausted,
    /// The retry budget shared by the layer's clones was spent (a failure
    /// storm): the failure was returned without another attempt.
    BudgetExhausted,
    /// The backoff or `Retry-After` wait, plus the shortest useful attempt
    /// (the retry layer's `min_attempt`), would not fit before the call's
    /// deadline.
    PastDeadline,
    /// The provider's `Retry-After` is longer than the layer will wait
    /// (`max_retry_after`).
    RetryAfterTooLong,
    /// The attempt ended by its own timeout and links follow this one: the
    /// retry layer's `failover_on_timeout` sends the call to the next link
    /// at once.
    FailoverOnTimeout,
}

impl RetryStop {
    /// A stable label for metrics and logs.
    pub const fn as_metric_label(self) -> &'static str {
        match self {
            RetryStop::NotRetryable => "not_retryable",
            RetryStop::AttemptsExhausted => "attempts_exhausted",
            RetryStop::BudgetExhausted => "budget_exhausted",
            RetryStop::PastDeadline => "past_deadline",
            RetryStop::RetryAfterTooLong => "retry_after_too_long",
            RetryStop::FailoverOnTimeout => "failover_on_timeout",
        }
    }
}

/// The seed-002 status of one attempt, derived from an [`AttemptRecord`]
/// by [`AttemptRecord::status`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum AttemptStatus {
    /// The attempt succeeded.
    Succeeded,
    /// Retried after a 5xx answer (or another HTTP answer a policy made
    /// retryable, such as a 409).
    RetriedAfter5xx,
    /// Retried after a 429.
    RetriedAfter429,
    /// Retried after the per-attempt timeout fired.
    RetriedAfterTimeout,
    /// Retried after a connect error or connection reset (no HTTP answer).
    RetriedAfterConnReset,
    /// The next link of the fallback chain was tried.
    FailedOver,
    /// Bad request (400-class, context window, 409 conflict, content
    /// filter): no retry, no failover.
    Terminal400,
    /// Model or endpoint not found: no retry, no failover.
    Terminal404,
    /// 401/403: no retry, no failover.
    TerminalAuth,
    /// The call's deadline passed during this attempt.
    DeadlineExceededMidCall,
    /// Any other final failure (retries exhausted, budget spent, quota,
    /// open circuit with nothing left, invalid response, cancelled).
    Failed,
    /// The link was skipped: the request's policy forbids it.
    SkippedByPolicy,
    /// Dropped because a racing attempt of the same call answered first.
    CancelledByHedge,
}

impl AttemptStatus {
    /// A stable label for metrics and logs.
    pub const fn as_metric_label(self) -> &'static str {
        match self {
            AttemptStatus::Succeeded => "succeeded",
            AttemptStatus::RetriedAfter5xx => "retried_after_5xx",
            AttemptStatus::RetriedAfter429 => "retried_after_429",
            AttemptStatus::RetriedAfterTimeout => "retried_after_timeout",
            AttemptStatus::RetriedAfterConnReset => "retried_after_conn_reset",
            AttemptStatus::FailedOver => "failed_over",
            AttemptStatus::Terminal400 => "terminal_400",
            AttemptStatus::Terminal404 => "terminal_404",
            AttemptStatus::TerminalAuth => "terminal_auth",
            AttemptStatus::DeadlineExceededMidCall => "deadline_exceeded_mid_call",
            AttemptStatus::Failed => "failed",
            AttemptStatus::SkippedByPolicy => "skipped_by_policy",
            AttemptStatus::CancelledByHedge => "cancelled_by_hedge",
        }
    }
}

/// Why a retry happened: the closed `reason` label set of
/// `ai_router_retries_total` (seed 002 §1 item 14).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RetryReason {
    /// An HTTP 5xx-class answer.
    #[serde(rename = "5xx")]
    Status5xx,
    /// An HTTP 429 / throttling answer.
    #[serde(rename = "429")]
    Status429,
    /// The per-attempt timeout.
    #[serde(rename = "timeout")]
    Timeout,
    /// A connect error or reset: no HTTP answer at all.
    #[serde(rename = "conn_reset")]
    ConnReset,
}

impl RetryReason {
    /// The label: `5xx`, `429`, `timeout` or `conn_reset`.
    pub const fn as_metric_label(self) -> &'static str {
        match self {
            RetryReason::Status5xx => "5xx",
            RetryReason::Status429 => "429",
            RetryReason::Timeout => "timeout",
            RetryReason::ConnReset => "conn_reset",
        }
    }
}

/// One attempt of a logical call (seed 002 `AttemptRecord`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptRecord {
    /// Provider name (for example `"bedrock"`).
    pub provider: Arc<str>,
    /// Model id sent to the provider.
    pub model: Arc<str>,
    /// 1-based attempt number on this link.
    pub attempt: u8,
    /// Position of the link in the fallback chain (0 = primary).
    pub fallback_position: u8,
    /// How the attempt ended.
    pub outcome: AttemptOutcome,
    /// What happened next.
    pub next: NextStep,
    /// Wall time of the attempt (milliseconds on the wire).
    #[serde(with = "crate::layer::serde_millis")]
    pub elapsed: Duration,
    /// HTTP status of the answer; `None` when no answer came (timeout,
    /// connect error, open circuit).
    pub http_status: Option<u16>,
    /// For a failed attempt the retry layer did not repeat: why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_stop: Option<RetryStop>,
    /// The attempt was a hedge: started by a hedge layer while an earlier
    /// attempt of the same call was still running.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hedge: bool,
    /// What the attempt cost, when a cost layer priced it: its usage at
    /// the link's price, or what the provider bills for a failed attempt
    /// (see the cost layer's docs). `None` when nothing priced it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<crate::Cost>,
    /// The cost is the attempt's estimate, not its usage: the answer had
    /// no usage, or usage that cannot be right (more than was reserved,
    /// less than was streamed).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cost_estimated: bool,
}

impl AttemptRecord {
    /// A record for attempt `attempt` on `link`.
    pub fn new(link: &Link, attempt: u8, outcome: AttemptOutcome, elapsed: Duration) -> Self {
        AttemptRecord {
            provider: link.provider_arc().clone(),
            model: link.model_arc().clone(),
            attempt,
            fallback_position: link.position(),
            outcome,
            next: NextStep::Returned,
            elapsed,
            http_status: None,
            retry_stop: None,
            hedge: false,
            cost: None,
            cost_estimated: false,
        }
    }

    /// The seed-002 status of this attempt.
    pub fn status(&self) -> AttemptStatus {
        let class = match self.outcome {
            AttemptOutcome::Succeeded => return AttemptStatus::Succeeded,
            AttemptOutcome::SkippedByPolicy => return AttemptStatus::SkippedByPolicy,
            AttemptOutcome::InFlight => return AttemptStatus::Failed,
            AttemptOutcome::CancelledByHedge => return AttemptStatus::CancelledByHedge,
            AttemptOutcome::Failed(class) => class,
        };
        match self.next {
            NextStep::Retried => match self.retry_reason() {
                Some(RetryReason::Status429) => AttemptStatus::RetriedAfter429,
                Some(RetryReason::Timeout) => AttemptStatus::RetriedAfterTimeout,
                Some(RetryReason::ConnReset) => AttemptStatus::RetriedAfterConnReset,
                Some(RetryReason::Status5xx) | None => AttemptStatus::RetriedAfter5xx,
            },
            NextStep::FailedOver => AttemptStatus::FailedOver,
            NextStep::Returned => match class {
                FailureClass::BadRequest
                | FailureClass::ContextWindowExceeded
                | FailureClass::Conflict
                | FailureClass::ContentFiltered => AttemptStatus::Terminal400,
                FailureClass::NotFound => AttemptStatus::Terminal404,
                FailureClass::Auth => AttemptStatus::TerminalAuth,
                FailureClass::DeadlineExceeded => AttemptStatus::DeadlineExceededMidCall,
                _ => AttemptStatus::Failed,
            },
        }
    }

    /// The `ai_router_retries_total` reason of a failed attempt, by its
    /// class and whether an HTTP answer came: `None` for a success or a
    /// class that is never a retry reason.
    pub fn retry_reason(&self) -> Option<RetryReason> {
        match self.outcome {
            AttemptOutcome::Succeeded
            | AttemptOutcome::SkippedByPolicy
            | AttemptOutcome::InFlight
            | AttemptOutcome::CancelledByHedge => None,
            AttemptOutcome::Failed(FailureClass::RateLimited) => Some(RetryReason::Status429),
            AttemptOutcome::Failed(FailureClass::Timeout) => Some(RetryReason::Timeout),
            AttemptOutcome::Failed(FailureClass::Transient) => Some(match self.http_status {
                Some(_) => RetryReason::Status5xx,
                None => RetryReason::ConnReset,
            }),
            AttemptOutcome::Failed(_) => None,
        }
    }

    /// Sets the HTTP status.
    #[must_use]
    pub fn with_http_status(mut self, status: Option<u16>) -> Self {
        self.http_status = status;
        self
    }

    /// Sets what happened next.
    #[must_use]
    pub fn with_next(mut self, next: NextStep) -> Self {
        self.next = next;
        self
    }
}

/// A failed attempt record (number `n`) for tests.
#[cfg(test)]
pub(crate) fn test_record(n: u8) -> AttemptRecord {
    AttemptRecord::new(
        &Link::new("bedrock", "m").with_position(2),
        n,
        AttemptOutcome::Failed(FailureClass::Transient),
        Duration::from_millis(8),
    )
    .with_http_status(Some(503))
}

#[cfg(test)]
mod tests {
    use super::*;

    use test_record as rec;

    #[test]
    fn record_serializes_with_millis() {
        let json = serde_json::to_value(rec(1)).expect("json");
        assert_eq!(json["elapsed"], 8);
        assert_eq!(json["outcome"]["failed"], "transient");
        assert_eq!(json["next"], "returned");
        let back: AttemptRecord = serde_json::from_value(json).expect("back");
        assert_eq!(back, rec(1));
    }

    #[test]
    fn seed_statuses_are_derived() {
        use AttemptStatus::*;
        let link = Link::new("p", "m");
        let r = |outcome, next, status: Option<u16>| {
            AttemptRecord::new(&link, 1, outcome, Duration::ZERO)
                .with_next(next)
                .with_http_status(status)
                .status()
        };
        let f = AttemptOutcome::Failed;
        assert_eq!(
            r(AttemptOutcome::Succeeded, NextStep::Returned, Some(200)),
            Succeeded
        );
        assert_eq!(
            r(f(FailureClass::Transient), NextStep::Retried, Some(503)),
            RetriedAfter5xx
        );
        assert_eq!(
            r(f(FailureClass::Transient), NextStep::Retried, None),
            RetriedAfterConnReset
        );
        assert_eq!(
            r(f(FailureClass::RateLimited), NextStep::Retried, Some(429)),
            RetriedAfter429
        );
        assert_eq!(
            r(f(FailureClass::Timeout), NextStep::Retried, None),
            RetriedAfterTimeout
        );
        assert_eq!(
            r(f(FailureClass::Transient), NextStep::FailedOver, Some(503)),
            FailedOver
        );
        assert_eq!(
            r(f(FailureClass::BadRequest), NextStep::Returned, Some(400)),
            Terminal400
        );
        assert_eq!(
            r(f(FailureClass::NotFound), NextStep::Returned, Some(404)),
            Terminal404
        );
        assert_eq!(
            r(f(FailureClass::Auth), NextStep::Returned, Some(401)),
            TerminalAuth
        );
        assert_eq!(
            r(f(FailureClass::DeadlineExceeded), NextStep::Returned, None),
            DeadlineExceededMidCall
        );
        assert_eq!(
            r(f(FailureClass::Transient), NextStep::Returned, Some(503)),
            Failed
        );
    }
}
