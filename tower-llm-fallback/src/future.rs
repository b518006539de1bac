use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::Instant;
use tower::ServiceExt;
use tower::util::Oneshot;
use tower_llm_core::layer::{AttemptLogExt as _, CallOwner, FailureExt as _, Replay};
use tower_llm_core::{
    AttemptLog, AttemptOutcome, AttemptRecord, BoxError, Call, Classified, Classify, Deadline,
    Failure, FailureClass, LlmRequest, NextStep, Outcome, RecordsAttempts,
};

use crate::LinkService;
use crate::layer::{Chain, Order};

/// What the next link must offer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Need {
    Any,
    LongContext,
    Filtered,
}

/// What a call keeps once it has left its primary, from one link to the
/// next.
struct Failover<Req, Res> {
    // A clean copy of the request for the alternates (its carrier attached
    // when an admission rule must see it).
    pristine: Option<Replay<Req>>,
    // `false` for a request that may be sent only once: the copy is handed
    // to the first alternate rather than cloned.
    replayable: bool,
    // The link running now, or the last one tried.
    index: usize,
    need: Need,
    last: Option<Result<Res, Failure>>,
    // How the last failure was classified (for the degraded step when it
    // came as an HTTP answer).
    last_class: Option<Classified>,
    // The soonest a link that refused with a wait may serve again, and
    // whether every link so far refused that way.
    earliest: Option<Duration>,
    all_waiting: bool,
    // The alternates in the order to try them, computed at the first
    // failover, and how far along it the call is.
    order: Option<Order>,
    cursor: usize,
    // When the running alternate started (health-aware ordering only).
    started: Option<Instant>,
}

impl<Req, Res> Failover<Req, Res> {
    fn leaving_primary(pristine: Option<Replay<Req>>, replayable: bool) -> Self {
        Failover {
            pristine,
            replayable,
            index: 0,
            need: Need::Any,
            last: None,
            last_class: None,
            earliest: None,
            all_waiting: true,
            order: None,
            cursor: 0,
            started: None,
        }
    }
}

pin_project! {
    #[project = StateProj]
    #[project_replace = StateReplace]
    enum State<PF, AF, Req, Res> {
        // The primary runs; the copy for the alternates waits beside it.
        Primary {
            #[pin]
            fut: PF,
            pristine: Option<Replay<Req>>,
        },
        // An alternate runs.
        Alternate {
            #[pin]
            fut: AF,
            failover: Failover<Req, Res>,
        },
        // The last link failed: the next one is chosen on the next poll.
        Next { failover: Failover<Req, Res> },
        Done,
    }
}

/// The state of a [`ResponseFuture`].
type StateOf<PF, Req, Res> = State<PF, Oneshot<LinkService<Req, Res>, Req>, Req, Res>;

pin_project! {
    /// Response future of [`Fallback`](crate::Fallback): drives the primary,
    /// then each alternate it fails over to, lazily (`oneshot` on a clone).
    pub struct ResponseFuture<PF, Req, Res, C> {
        #[pin]
        state: StateOf<PF, Req, Res>,
        chain: Arc<Chain<Req, Res, C>>,
        // Set when this layer owns the call (attempt log, metrics, span).
        owned: Option<CallOwner>,
    }
}

impl<PF, Req, Res, C> std::fmt::Debug for ResponseFuture<PF, Req, Res, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &self.state {
            State::Primary { .. } => "primary",
            State::Alternate { .. } => "alternate",
            State::Next { .. } => "next",
            State::Done => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish_non_exhaustive()
    }
}

impl<PF, Req: LlmRequest + Clone, Res, C> ResponseFuture<PF, Req, Res, C> {
    pub(crate) fn primary(
        fut: PF,
        chain: Arc<Chain<Req, Res, C>>,
        pristine: Option<Replay<Req>>,
        owned: Option<CallOwner>,
    ) -> Self {
        ResponseFuture {
            state: State::Primary { fut, pristine },
            chain,
            owned,
        }
    }

    /// The primary's admission refused the request: it starts at the next
    /// link. A request that may be sent only once goes to that link alone.
    pub(crate) fn primary_skipped(
        chain: Arc<Chain<Req, Res, C>>,
        req: Req,
        replayable: bool,
        owned: Option<CallOwner>,
    ) -> Self {
        record_skip(AttemptLog::of(&req), &chain.primary.link);
        let failover = Failover::leaving_primary(Some(Replay::whole(req)), replayable);
        ResponseFuture {
            state: State::Next { failover },
            chain,
            owned,
        }
    }
}

fn record_skip(log: Option<&AttemptLog>, link: &tower_llm_core::Link) {
    if let Some(log) = log {
        // A full log refuses the record; the chain stops at its next step.
        let _ = log.push(AttemptRecord::new(
            link,
            0,
            AttemptOutcome::SkippedByPolicy,
            Duration::ZERO,
        ));
    }
}

impl<PF, Req, Res, C, E> Future for ResponseFuture<PF, Req, Res, C>
where
    PF: Future<Output = Result<Res, E>>,
    E: Into<BoxError> + 'static,
    Req: Clone + LlmRequest,
    Res: RecordsAttempts,
    C: Classify<Res, Failure>,
{
    type Output = Result<Res, Failure>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let span = this.owned.as_ref().map(|o| o.span().clone());
        let _span = span.as_ref().map(tracing::Span::enter);
        loop {
            let result = match this.state.as_mut().project() {
                StateProj::Primary { fut, .. } => ready!(fut.poll(cx)).map_err(Failure::from_inner),
                StateProj::Alternate { fut, .. } => ready!(fut.poll(cx)),
                StateProj::Done => return Poll::Ready(Err(polled_after_completion())),
                StateProj::Next { .. } => {
                    let StateReplace::Next { mut failover } =
                        this.state.as_mut().project_replace(State::Done)
                    else {
                        return Poll::Ready(Err(polled_after_completion()));
                    };
                    match next_alternate(this.chain, &mut failover) {
                        Ok(fut) => this.state.set(State::Alternate { fut, failover }),
                        Err(result) => return Poll::Ready(finish(this.owned, result)),
                    }
                    continue;
                }
            };
            // A link answered. Which one, and since when (health-aware
            // ordering), read in place: the success path builds nothing.
            let (index, started) = match this.state.as_mut().project() {
                StateProj::Alternate { failover, .. } => (failover.index, failover.started.take()),
                _ => (0, None),
            };
            let outcome = this.chain.classifier.classify(&result);
            if let (Some(health), Some(started)) = (&this.chain.health, started) {
                if let Some(h) = index.checked_sub(1).and_then(|i| health.get(i)) {
                    h.record(outcome.is_success(), started.elapsed());
                }
            }
            let failed = match outcome {
                Outcome::Success { .. } => {
                    this.state.set(State::Done);
                    let mut result = result;
                    // The primary serving is the common case: it is the
                    // default, noted at no cost.
                    if index > 0 {
                        if let (Ok(res), Some(spec)) = (&mut result, this.chain.spec(index)) {
                            res.record_served_by(&spec.link);
                        }
                    }
                    return Poll::Ready(finish(this.owned, result));
                }
                Outcome::Failure(failed) => failed,
            };
            // The running future is dropped here, and the call leaves the
            // primary if it was there.
            let mut failover = match this.state.as_mut().project_replace(State::Done) {
                StateReplace::Primary { pristine, .. } => Failover::leaving_primary(pristine, true),
                StateReplace::Alternate { failover, .. } => failover,
                StateReplace::Next { .. } | StateReplace::Done => {
                    return Poll::Ready(Err(polled_after_completion()));
                }
            };
            let disposition = this.chain.failures.disposition(&failed);
            let need = if disposition.failover {
                Need::Any
            } else if failed.class == FailureClass::ContextWindowExceeded {
                Need::LongContext
            } else if failed.class == FailureClass::ContentFiltered {
                Need::Filtered
            } else {
                return Poll::Ready(finish(this.owned, result));
            };
            match (failed.class, failed.retry_after) {
                (
                    FailureClass::CircuitOpen
                    | FailureClass::RateLimited
                    | FailureClass::TenantQuotaExhausted,
                    Some(wait),
                ) => {
                    failover.earliest = Some(failover.earliest.map_or(wait, |e| e.min(wait)));
                }
                _ => failover.all_waiting = false,
            }
            failover.need = need;
            failover.last = Some(result);
            failover.last_class = Some(failed);
            this.state.set(State::Next { failover });
        }
    }
}

/// The next link's call, started; or, when the chain must stop, the
/// call's final result.
fn next_alternate<Req, Res, C>(
    chain: &Chain<Req, Res, C>,
    failover: &mut Failover<Req, Res>,
) -> Result<Oneshot<LinkService<Req, Res>, Req>, Result<Res, Failure>>
where
    Req: Clone + LlmRequest,
    Res: RecordsAttempts,
{
    // An admission rule sees the request as the link would (with the
    // call's deadline, log and link); without one, the copy stays as it is
    // until a link takes it.
    if chain
        .alternates
        .iter()
        .any(|(spec, _)| spec.admit.is_some())
    {
        if let Some(p) = failover.pristine.as_mut() {
            p.attach();
        }
    }
    // The record of the link being left, found before any skip records
    // are added after it.
    let leaving = failover.pristine.as_ref().and_then(|p| {
        let log = p.call()?.log()?;
        let from = u8::try_from(failover.index).ok()?;
        log.last_index_for(from).map(|i| (log.clone(), i))
    });
    let order = failover.order.get_or_insert_with(|| chain.order());
    let next = next_link(
        chain,
        failover.pristine.as_ref(),
        order,
        &mut failover.cursor,
        failover.need,
    );
    let j = match next {
        Ok(Some(j)) => j,
        Ok(None) => {
            let last = failover.last.take();
            if failover.need != Need::Any {
                // No link can serve what failed (a context window, a
                // content filter): terminal, as is.
                return Err(last.unwrap_or_else(|| Err(no_link_allowed())));
            }
            let earliest = failover.all_waiting.then_some(failover.earliest).flatten();
            return Err(all_failed(
                last,
                failover.last_class.take(),
                earliest,
                chain.degrade.as_deref(),
            ));
        }
        Err(stop) => return Err(Err(stop)),
    };
    let (spec, service) = &chain.alternates[j - 1];
    let req = if failover.replayable {
        failover.pristine.as_ref().map(Replay::to_request)
    } else {
        failover.pristine.take().map(Replay::into_request)
    };
    let Some(mut req) = req else {
        // Never: a link is chosen only with a request to send.
        return Err(Err(polled_after_completion()));
    };
    if let Some((log, i)) = leaving {
        log.finish(i, |r| {
            if r.next == NextStep::Returned {
                r.next = NextStep::FailedOver;
            }
        });
    }
    spec.prepare(&mut req);
    tracing::info!(
        from = chain.spec(failover.index).map_or("", |s| s.link.provider()),
        to = spec.link.provider(),
        to_model = spec.link.model(),
        to_position = j,
        "failing over to the next link"
    );
    failover.index = j;
    if chain.health.is_some() {
        failover.started = Some(Instant::now());
    }
    Ok(service.clone().oneshot(req))
}

fn polled_after_completion() -> Failure {
    Failure::new(FailureClass::Cancelled).with_message("fallback future polled after completion")
}

/// The next link to try after `index`, skipping those the request's policy
/// forbids (recorded) and those that cannot serve what failed; or why the
/// chain must stop.
fn next_link<Req, Res, C>(
    chain: &Chain<Req, Res, C>,
    pristine: Option<&Replay<Req>>,
    order: &Order,
    cursor: &mut usize,
    need: Need,
) -> Result<Option<usize>, Failure>
where
    Req: LlmRequest + Clone,
{
    // A request that cannot be replayed goes nowhere else.
    let Some(copy) = pristine else {
        return Ok(None);
    };
    let call = copy.call();
    while let Some(j) = order.get(*cursor) {
        *cursor += 1;
        let Some(spec) = chain.spec(j) else {
            continue;
        };
        let fits = match need {
            Need::Any => true,
            Need::LongContext => spec.long_context,
            Need::Filtered => spec.allows_filtered,
        };
        if !fits {
            continue;
        }
        if !spec.admits(copy.request()) {
            record_skip(call.and_then(Call::log), &spec.link);
            continue;
        }
        if call
            .and_then(Call::deadline)
            .is_some_and(Deadline::is_expired)
        {
            return Err(Failure::deadline_exceeded());
        }
        if call.and_then(Call::log).is_some_and(AttemptLog::is_full) {
            return Err(Failure::attempts_cap_exceeded());
        }
        return Ok(Some(j));
    }
    Ok(None)
}

/// The end of the chain: the last failure, marked as such, or the
/// degraded answer when the chain has one.
fn all_failed<Res: RecordsAttempts>(
    last: Option<Result<Res, Failure>>,
    last_class: Option<Classified>,
    earliest: Option<Duration>,
    degrade: Option<&(dyn Fn(&Failure) -> Res + Send + Sync)>,
) -> Result<Res, Failure> {
    let degraded = |mut failure: Failure| {
        failure.mark_all_links_failed(earliest);
        match degrade {
            Some(degrade) => {
                let mut res = degrade(&failure);
                res.mark_degraded();
                Ok(res)
            }
            None => Err(failure),
        }
    };
    match last {
        Some(Err(failure)) => degraded(failure),
        // A failing HTTP answer goes back as it is, unless the chain has a
        // degraded step.
        Some(Ok(res)) => match (degrade, last_class) {
            (Some(_), Some(class)) => degraded(Failure::from_classified(class)),
            _ => Ok(res),
        },
        None => Err(no_link_allowed()),
    }
}

fn no_link_allowed() -> Failure {
    Failure::new(FailureClass::BadRequest)
        .with_message("no link of the fallback chain is allowed for this request")
}

/// Attaches the attempt log this layer owns, if it owns one.
fn finish<Res: RecordsAttempts>(
    owned: &mut Option<CallOwner>,
    mut result: Result<Res, Failure>,
) -> Result<Res, Failure> {
    if let Some(owner) = owned.take() {
        owner.finish(&mut result);
    }
    result
}
