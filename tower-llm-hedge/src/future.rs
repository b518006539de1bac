//! The hedge response future.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tower_llm_core::layer::CallExt as _;
use tower_llm_core::layer::{AttemptLogExt as _, CallOwner, MetricsExt as _, Replay};
use tower_llm_core::telemetry::HedgeOutcome;
use tower_llm_core::{
    AttemptLog, BoxError, Failure, FailureClass, Link, LlmRequest, RecordsAttempts,
};
use tower_service::Service;

use crate::layer::Shared;

/// What a hedge needs until it starts: the request copy, the service to
/// send it to, and the timer.
struct Pending<B, Req> {
    copy: Replay<Req>,
    service: B,
}

pin_project! {
    /// Response future of [`Hedge`](crate::Hedge).
    ///
    /// Resolves to the first success (for a streaming service: the first
    /// stream to commit its first content frame) of the first attempt and
    /// its hedge; the other is dropped at that moment. When both fail, the
    /// failure that came last.
    pub struct ResponseFuture<F, B, Req>
    where
        B: Service<Req>,
    {
        #[pin]
        primary: Option<F>,
        #[pin]
        backup: Option<B::Future>,
        // Armed while a hedge may still start.
        #[pin]
        timer: Option<Sleep>,
        pending: Option<Pending<B, Req>>,
        backup_link: Option<Link>,
        shared: Arc<Shared>,
        log: Option<AttemptLog>,
        // The index of this call's first record in the log.
        first: usize,
        owner: Option<CallOwner>,
        start: Instant,
        backup_start: Option<Instant>,
        done: bool,
    }
}

impl<F, B: Service<Req>, Req> std::fmt::Debug for ResponseFuture<F, B, Req> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("primary", &self.primary.is_some())
            .field("hedged", &self.backup_start.is_some())
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

impl<F, B: Service<Req>, Req> ResponseFuture<F, B, Req> {
    #[allow(clippy::too_many_arguments)] // one private constructor, each part distinct
    pub(crate) fn new(
        primary: F,
        hedge: Option<(Replay<Req>, B, Instant)>,
        backup_link: Option<Link>,
        shared: Arc<Shared>,
        log: Option<AttemptLog>,
        first: usize,
        owner: Option<CallOwner>,
        start: Instant,
    ) -> Self {
        let (pending, timer) = match hedge {
            Some((copy, service, at)) => (
                Some(Pending { copy, service }),
                Some(tokio::time::sleep_until(at)),
            ),
            None => (None, None),
        };
        ResponseFuture {
            primary: Some(primary),
            backup: None,
            timer,
            pending,
            backup_link,
            shared,
            log,
            first,
            owner,
            start,
            backup_start: None,
            done: false,
        }
    }
}

/// Which attempt answered.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Winner {
    Primary,
    Backup,
}

impl<F, B, Req, Res, E> Future for ResponseFuture<F, B, Req>
where
    F: Future<Output = Result<Res, E>>,
    E: Into<BoxError> + 'static,
    B: Service<Req, Response = Res>,
    B::Error: Into<BoxError> + 'static,
    Req: LlmRequest + Clone,
    Res: RecordsAttempts,
{
    type Output = Result<Res, Failure>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        if *this.done {
            return Poll::Ready(Err(Failure::new(FailureClass::Cancelled)
                .with_message("hedge future polled after completion")));
        }
        loop {
            let mut ended: Option<(Result<Res, Failure>, Winner)> = None;
            if let Some(primary) = this.primary.as_mut().as_pin_mut() {
                if let Poll::Ready(result) = primary.poll(cx) {
                    this.primary.set(None);
                    ended = Some((result.map_err(Failure::from_inner), Winner::Primary));
                }
            }
            if ended.is_none() {
                if let Some(backup) = this.backup.as_mut().as_pin_mut() {
                    if let Poll::Ready(result) = backup.poll(cx) {
                        this.backup.set(None);
                        ended = Some((result.map_err(Failure::from_inner), Winner::Backup));
                    }
                }
            }
            match ended {
                Some((Ok(res), winner)) => {
                    // The winner: drop the other now, and say why in its
                    // records.
                    let running = match winner {
                        Winner::Primary => this.backup.is_some(),
                        Winner::Backup => this.primary.is_some(),
                    };
                    if running {
                        let mut drop_loser = || match winner {
                            Winner::Primary => this.backup.set(None),
                            Winner::Backup => this.primary.set(None),
                        };
                        match this.log.as_ref() {
                            Some(log) => log.drop_hedge_loser(drop_loser),
                            None => drop_loser(),
                        }
                    }
                    if this.backup_start.is_some() {
                        this.shared.metrics.record_hedge(match winner {
                            Winner::Primary => HedgeOutcome::Lost,
                            Winner::Backup => HedgeOutcome::Won,
                        });
                    }
                    if let Some(learned) = &this.shared.learned {
                        // The first attempt's time to answer: when the
                        // hedge won, a lower bound of it (the slow tail is
                        // what the quantile must see, or the delay would
                        // shrink call after call).
                        learned.record(this.start.elapsed());
                    }
                    return Poll::Ready(finish(this.done, this.owner, this.timer, Ok(res)));
                }
                Some((Err(failure), _)) => {
                    if this.primary.is_some() || this.backup.is_some() {
                        // The other may still answer (a hedge refused by an
                        // open circuit ends here, having called no one).
                        continue;
                    }
                    // No hedge after a failure: that is the retry and
                    // fallback layers' work.
                    *this.pending = None;
                    return Poll::Ready(finish(this.done, this.owner, this.timer, Err(failure)));
                }
                None => {}
            }
            // Both still running, or the first attempt still running with a
            // hedge to come.
            let Some(timer) = this.timer.as_mut().as_pin_mut() else {
                return Poll::Pending;
            };
            if timer.poll(cx).is_pending() {
                return Poll::Pending;
            }
            let Some(pending) = this.pending.as_mut() else {
                this.timer.set(None);
                return Poll::Pending;
            };
            match pending.service.poll_ready(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(_)) => {
                    // The hedge's service cannot take it: no hedge.
                    *this.pending = None;
                    this.timer.set(None);
                    return Poll::Pending;
                }
                Poll::Ready(Ok(())) => {}
            }
            this.timer.set(None);
            let Some(Pending { copy, mut service }) = this.pending.take() else {
                return Poll::Pending;
            };
            if this
                .log
                .as_ref()
                .is_some_and(|l| l.failed_since(*this.first))
            {
                // The first attempt failed and is being retried: no hedge.
                return Poll::Pending;
            }
            if !this.shared.budget.withdraw() {
                this.shared
                    .metrics
                    .record_hedge(HedgeOutcome::SkippedBudget);
                tracing::debug!("hedge skipped: the hedge budget is spent");
                return Poll::Pending;
            }
            let mut req = copy.into_request();
            let call = req.call_mut();
            call.set_hedge(true);
            if let Some(link) = this.backup_link.as_ref() {
                call.set_link(link.clone());
            }
            *this.backup_start = Some(Instant::now());
            this.backup.set(Some(service.call(req)));
            // Poll the hedge at once (its first poll may send it).
        }
    }
}

/// Ends the call: the owner attaches the records and records the metrics.
fn finish<Res: RecordsAttempts>(
    done: &mut bool,
    owner: &mut Option<CallOwner>,
    mut timer: Pin<&mut Option<Sleep>>,
    mut result: Result<Res, Failure>,
) -> Result<Res, Failure> {
    *done = true;
    timer.set(None);
    if let Some(owner) = owner.take() {
        owner.finish(&mut result);
    }
    result
}
