//! [`CostFuture`]: one attempt, held before it is sent and settled after.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use pin_project_lite::pin_project;
use tower_llm_core::{Failure, FailureClass};
use tower_service::Service;

use crate::CostAnswer;
use crate::meter::Meter;
use crate::quota::Reserve;

pin_project! {
    /// The future of a [`CostService`](crate::CostService) call.
    pub struct CostFuture<S: Service<R>, R> {
        #[pin]
        state: State<S, R>,
    }
}

pin_project! {
    #[project = StateProj]
    pub(crate) enum State<S: Service<R>, R> {
        Failed { failure: Option<Failure> },
        Reserving {
            // Boxed: only calls held to a quota pay for its room.
            reserving: Option<Box<Reserving<S, R>>>,
        },
        Running {
            #[pin]
            future: S::Future,
            meter: Option<Meter>,
        },
    }
}

/// An attempt waiting for its quota hold.
pub(crate) struct Reserving<S, R> {
    pub(crate) reserve: Reserve,
    pub(crate) service: S,
    pub(crate) req: R,
    pub(crate) meter: Meter,
}

impl<S: Service<R>, R> CostFuture<S, R> {
    pub(crate) fn new(state: State<S, R>) -> Self {
        CostFuture { state }
    }

    pub(crate) fn failed(failure: Failure) -> Self {
        CostFuture {
            state: State::Failed {
                failure: Some(failure),
            },
        }
    }
}

impl<S: Service<R>, R> std::fmt::Debug for CostFuture<S, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CostFuture").finish_non_exhaustive()
    }
}

impl<S, R> Future for CostFuture<S, R>
where
    S: Service<R, Error = Failure>,
    S::Response: CostAnswer,
{
    type Output = Result<S::Response, Failure>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Failed { failure } => {
                    return Poll::Ready(Err(failure.take().unwrap_or_else(|| {
                        Failure::new(FailureClass::InvalidResponse)
                            .with_message("cost future polled after it ended")
                    })));
                }
                StateProj::Reserving { reserving } => {
                    let Some(waiting) = reserving.as_mut() else {
                        return Poll::Ready(Err(Failure::new(FailureClass::InvalidResponse)
                            .with_message("cost future polled after it ended")));
                    };
                    let reserved = ready!(waiting.reserve.as_mut().poll(cx));
                    let Some(waiting) = reserving.take() else {
                        return Poll::Ready(Err(Failure::new(FailureClass::InvalidResponse)
                            .with_message("cost future polled after it ended")));
                    };
                    let Reserving {
                        mut service,
                        req,
                        mut meter,
                        ..
                    } = *waiting;
                    match reserved {
                        Err(refusal) => {
                            // Releases the call budget's hold, charging nothing.
                            drop(meter);
                            let failure = Failure::new(FailureClass::TenantQuotaExhausted)
                                .with_retry_after(refusal.resets_in)
                                .with_message(refusal.to_string());
                            this.state.set(State::Failed {
                                failure: Some(failure),
                            });
                        }
                        Ok(hold) => {
                            if let Some(refusal) = hold.shadow_refusal() {
                                tracing::info!(
                                    tenant = ?hold.tenant(),
                                    refusal = %refusal,
                                    "tenant quota passed (shadow mode: not refused)"
                                );
                            }
                            meter.quota = Some(Box::new(hold));
                            meter.sent = true;
                            let future = service.call(req);
                            this.state.set(State::Running {
                                future,
                                meter: Some(meter),
                            });
                        }
                    }
                }
                StateProj::Running { future, meter } => {
                    let result = ready!(future.poll(cx));
                    let Some(meter) = meter.take() else {
                        return Poll::Ready(result);
                    };
                    return Poll::Ready(match result {
                        Ok(mut answer) => {
                            answer.charge(meter);
                            Ok(answer)
                        }
                        Err(failure) => {
                            meter.settle_failure(&failure);
                            Err(failure)
                        }
                    });
                }
            }
        }
    }
}
