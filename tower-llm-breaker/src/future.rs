use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use pin_project_lite::pin_project;
use tokio::time::Instant;
use tower_llm_core::{
    AttemptLog, AttemptOutcome, BoxError, Classify, Failure, FailureClass, Outcome,
};

use crate::BreakerLayer;
use crate::circuit::{Admission, Circuit, Verdict};

/// An admitted call's hold on its circuit: records the outcome when the
/// call ends, and on drop without an outcome releases a probe slot (or,
/// when the attempt log says the attempt timed out, counts the timeout).
pub(crate) struct Guard<K, C> {
    pub(crate) circuit: Arc<Circuit>,
    pub(crate) admission: Admission,
    pub(crate) shared: Arc<BreakerLayer<K, C>>,
    pub(crate) start: Option<Instant>,
    pub(crate) log: Option<AttemptLog>,
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
        let transition = self
            .circuit
            .record(self.admission, verdict, &self.shared.config);
        if let (Some(observer), Some(t)) = (&self.shared.observer, &transition) {
            observer(t);
        }
    }

    fn verdict<Res>(&self, result: &Result<Res, Failure>) -> Verdict
    where
        C: Classify<Res, Failure>,
    {
        match self.shared.classifier.classify(result) {
            Outcome::Success { .. } => {
                let slow = match (self.shared.config.slow_call, self.start) {
                    (Some(limit), Some(start)) => start.elapsed() >= limit,
                    _ => false,
                };
                if slow {
                    Verdict::Failure { hold: None }
                } else {
                    Verdict::Success
                }
            }
            Outcome::Failure(c) => {
                if self.shared.failures.get(c.class).trip_breaker {
                    let hold = match c.class {
                        FailureClass::RateLimited => c.retry_after,
                        _ => None,
                    };
                    Verdict::Failure { hold }
                } else {
                    Verdict::Neutral
                }
            }
        }
    }
}

impl<K, C> Drop for Guard<K, C> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        // The call was dropped before it ended. If the retry layer's
        // attempt timeout did it, the attempt record already says so, and
        // a hung provider must count against its circuit.
        let timed_out = self.log.as_ref().is_some_and(|log| {
            log.last_outcome() == Some(AttemptOutcome::Failed(FailureClass::Timeout))
        });
        if timed_out {
            let transition = self.circuit.record(
                self.admission,
                Verdict::Failure { hold: None },
                &self.shared.config,
            );
            if let (Some(observer), Some(t)) = (&self.shared.observer, &transition) {
                observer(t);
            }
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
        inner: Option<F>,
        refused: Option<Failure>,
        guard: Option<Guard<K, C>>,
    }
}

impl<F, K, C> ResponseFuture<F, K, C> {
    pub(crate) fn refused(failure: Failure) -> Self {
        ResponseFuture {
            inner: None,
            refused: Some(failure),
            guard: None,
        }
    }

    pub(crate) fn running(inner: F, guard: Guard<K, C>) -> Self {
        ResponseFuture {
            inner: Some(inner),
            refused: None,
            guard: Some(guard),
        }
    }
}

impl<F, K, C, Res, E> Future for ResponseFuture<F, K, C>
where
    F: Future<Output = Result<Res, E>>,
    E: Into<BoxError>,
    C: Classify<Res, Failure>,
{
    type Output = Result<Res, Failure>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        if let Some(failure) = this.refused.take() {
            return Poll::Ready(Err(failure));
        }
        let Some(inner) = this.inner.as_mut().as_pin_mut() else {
            return Poll::Ready(Err(Failure::new(FailureClass::Cancelled)
                .with_message("breaker future polled after completion")));
        };
        let result = ready!(inner.poll(cx)).map_err(|e| Failure::from_error(e.into()));
        this.inner.set(None);
        if let Some(guard) = this.guard.take() {
            let verdict = guard.verdict(&result);
            guard.record(verdict);
        }
        Poll::Ready(result)
    }
}
