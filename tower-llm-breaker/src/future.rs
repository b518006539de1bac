use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use pin_project_lite::pin_project;
use tokio::time::Instant;
use tower_llm_core::layer::AttemptLogExt as _;
use tower_llm_core::{
    AttemptLog, AttemptOutcome, BoxError, Classify, Failure, FailureClass, Outcome,
};

use crate::circuit::{Admission, Circuit, Verdict};
use crate::{BreakerCount, BreakerLayer};

/// The record of an attempt the breaker made itself (no retry layer
/// outside made one): finished when the call ends or is dropped.
#[derive(Debug)]
pub(crate) struct OwnRecord {
    pub(crate) log: AttemptLog,
    pub(crate) index: usize,
    pub(crate) start: Instant,
    pub(crate) deadline: Option<Instant>,
}

impl OwnRecord {
    /// Completes the record from the call's outcome, and names the
    /// provider and model in an error.
    fn finish<Res>(self, outcome: &Outcome, result: &mut Result<Res, Failure>) {
        self.log
            .complete(self.index, outcome, self.start.elapsed(), result);
    }

    /// Completes the record of a call dropped before it ended.
    fn abandon(self) {
        let now = Instant::now();
        let class = if self.deadline.is_some_and(|d| d <= now) {
            FailureClass::DeadlineExceeded
        } else {
            FailureClass::Cancelled
        };
        let elapsed = now.saturating_duration_since(self.start);
        self.log.finish(self.index, |r| {
            r.outcome = AttemptOutcome::Failed(class);
            r.elapsed = elapsed;
        });
    }
}

/// An admitted call's hold on its circuit: records the outcome when the
/// call ends, and on drop without an outcome releases a probe slot (or,
/// when the attempt log says the attempt timed out, counts the timeout).
///
/// It reads the layer's settings through the layer's shared pointer (one
/// reference count per call) rather than carrying copies of them: every
/// byte of a response future is copied again by each layer outside it.
pub(crate) struct Guard<K, C> {
    pub(crate) circuit: Arc<Circuit>,
    pub(crate) admission: Admission,
    pub(crate) shared: Arc<BreakerLayer<K, C>>,
    pub(crate) start: Option<Instant>,
    /// The call's attempt log and the record of the attempt this call
    /// belongs to (when a retry layer outside made one).
    pub(crate) attempt: Option<(AttemptLog, usize)>,
    /// The record this breaker made (when no retry layer did).
    pub(crate) own: Option<OwnRecord>,
    pub(crate) done: bool,
}

impl<K, C> std::fmt::Debug for Guard<K, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard")
            .field("circuit", &self.circuit)
            .field("admission", &self.admission)
            .finish_non_exhaustive()
    }
}

impl<K, C> Guard<K, C> {
    fn record(mut self, verdict: Verdict) {
        self.done = true;
        let shared = &*self.shared;
        let transition = self.circuit.record(self.admission, verdict, &shared.config);
        crate::layer::announce(shared.observer.as_ref(), transition.as_ref());
    }

    fn verdict(&self, outcome: &Outcome) -> Verdict {
        match *outcome {
            Outcome::Success { .. } => {
                let slow = match (self.shared.config.slow_call, self.start) {
                    (Some(limit), Some(start)) => start.elapsed() >= limit,
                    _ => false,
                };
                if slow {
                    Verdict::Failure
                } else {
                    Verdict::Success
                }
            }
            Outcome::Failure(c) => {
                if self.shared.failures.get(c.class).trip_breaker {
                    match c.class {
                        FailureClass::RateLimited => {
                            match self.shared.config.hold_for(c.retry_after) {
                                Some(hold) => Verdict::Hold(hold),
                                None => Verdict::Failure,
                            }
                        }
                        _ => Verdict::Failure,
                    }
                } else {
                    Verdict::Neutral
                }
            }
        }
    }

    /// Whether a failure of this attempt counts: always when counting
    /// attempts; when counting calls, only the call's first failure on
    /// this link actually counted (marked in the call's shared attempt
    /// log at the moment it is counted, so a held 429 or an outcome that
    /// counted nothing never mutes a later failure).
    fn counts_failure(&self) -> bool {
        if self.shared.config.count != BreakerCount::Calls {
            return true;
        }
        match &self.attempt {
            Some((log, index)) => log.count_failure_once(*index),
            None => true,
        }
    }
}

impl<K, C> Drop for Guard<K, C> {
    fn drop(&mut self) {
        if let Some(own) = self.own.take() {
            own.abandon();
        }
        if self.done {
            return;
        }
        // The call was dropped before it ended. If the retry layer's
        // attempt timeout did it, the attempt record already says so, and
        // a hung provider must count against its circuit.
        let timed_out = self.attempt.as_ref().is_some_and(|(log, index)| {
            log.outcome_at(*index) == Some(AttemptOutcome::Failed(FailureClass::Timeout))
                && self.counts_failure()
        });
        if timed_out {
            let shared = &*self.shared;
            let transition = self
                .circuit
                .record(self.admission, Verdict::Failure, &shared.config);
            crate::layer::announce(shared.observer.as_ref(), transition.as_ref());
        } else {
            self.circuit.release(self.admission);
        }
    }
}

pin_project! {
    /// Response future of [`Breaker`](crate::Breaker).
    #[derive(Debug)]
    pub struct ResponseFuture<F, K, C> {
        #[pin]
        state: State<F, K, C>,
    }
}

pin_project! {
    #[project = StateProj]
    #[project_replace = StateReplace]
    #[derive(Debug)]
    enum State<F, K, C> {
        // Admitted: the inner call, and what to record when it ends.
        Running {
            #[pin]
            inner: F,
            guard: Guard<K, C>,
        },
        // Refused by the circuit (or a hold): this failure, at once.
        Refused { failure: Failure },
        Done,
    }
}

impl<F, K, C> ResponseFuture<F, K, C> {
    pub(crate) fn refused(failure: Failure) -> Self {
        ResponseFuture {
            state: State::Refused { failure },
        }
    }

    pub(crate) fn running(inner: F, guard: Guard<K, C>) -> Self {
        ResponseFuture {
            state: State::Running { inner, guard },
        }
    }
}

impl<F, K, C, Res, E> Future for ResponseFuture<F, K, C>
where
    F: Future<Output = Result<Res, E>>,
    E: Into<BoxError> + 'static,
    C: Classify<Res, Failure>,
{
    type Output = Result<Res, Failure>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        let mut result = match state.as_mut().project() {
            StateProj::Running { inner, .. } => ready!(inner.poll(cx)).map_err(Failure::from_inner),
            StateProj::Refused { .. } => {
                return match state.project_replace(State::Done) {
                    StateReplace::Refused { failure } => Poll::Ready(Err(failure)),
                    _ => Poll::Ready(Err(polled_after_completion())),
                };
            }
            StateProj::Done => return Poll::Ready(Err(polled_after_completion())),
        };
        // The inner future is dropped here, before the outcome is recorded
        // (as when the call is cut short: see `Guard`'s drop).
        if let StateReplace::Running { mut guard, .. } = state.project_replace(State::Done) {
            let outcome = guard.shared.classifier.classify(&result);
            if let Some(own) = guard.own.take() {
                own.finish(&outcome, &mut result);
            }
            let mut verdict = guard.verdict(&outcome);
            if matches!(verdict, Verdict::Failure) && !guard.counts_failure() {
                verdict = Verdict::Neutral;
            }
            guard.record(verdict);
        }
        Poll::Ready(result)
    }
}

fn polled_after_completion() -> Failure {
    Failure::new(FailureClass::Cancelled).with_message("breaker future polled after completion")
}
