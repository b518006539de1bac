//! The hedge service.

use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::time::Instant;
use tower_llm_core::layer::Replay;
use tower_llm_core::{BoxError, Call, Deadline, Failure, Link, LlmRequest, RecordsAttempts};
use tower_service::Service;

use crate::ResponseFuture;
use crate::layer::Shared;

/// The service built by [`HedgeLayer`](crate::HedgeLayer) (`B = S`: the
/// hedge goes to a clone of the same service) or by
/// [`CrossHedgeLayer`](crate::CrossHedgeLayer) (the hedge goes to `B`): see
/// the [crate docs](crate).
#[derive(Debug)]
pub struct Hedge<S, B> {
    primary: S,
    backup: B,
    backup_link: Option<Link>,
    shared: Arc<Shared>,
}

impl<S: Clone, B: Clone> Clone for Hedge<S, B> {
    fn clone(&self) -> Self {
        Hedge {
            primary: self.primary.clone(),
            backup: self.backup.clone(),
            backup_link: self.backup_link.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S, B> Hedge<S, B> {
    pub(crate) fn new(
        primary: S,
        backup: B,
        backup_link: Option<Link>,
        shared: Arc<Shared>,
    ) -> Self {
        Hedge {
            primary,
            backup,
            backup_link,
            shared,
        }
    }

    /// The service the first attempt goes to.
    pub fn get_ref(&self) -> &S {
        &self.primary
    }

    /// The service the first attempt goes to, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.primary
    }

    /// Unwraps the service the first attempt goes to.
    pub fn into_inner(self) -> S {
        self.primary
    }
}

impl<S, B, Req> Service<Req> for Hedge<S, B>
where
    S: Service<Req>,
    S::Error: Into<BoxError> + 'static,
    S::Response: RecordsAttempts,
    B: Service<Req, Response = S::Response> + Clone,
    B::Error: Into<BoxError> + 'static,
    Req: LlmRequest + Clone,
{
    type Response = S::Response;
    type Error = Failure;
    type Future = ResponseFuture<S::Future, B, Req>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.primary.poll_ready(cx).map_err(Failure::from_inner)
    }

    fn call(&mut self, mut req: Req) -> Self::Future {
        let shared = &self.shared;
        let start = Instant::now();
        shared.budget.deposit();
        let (owner, copy) = Replay::enter(&mut req, &shared.metrics, true);
        let log = req.call().and_then(Call::log).cloned();
        // This call's records start here (a fallback's earlier links are
        // before).
        let first = log.as_ref().map_or(0, tower_llm_core::AttemptLog::len);
        // A hedge is armed only for a request that may be sent twice and
        // when a useful attempt still fits before the deadline at the hedge
        // time.
        let hedge_at = start + shared.delay();
        let fits = Deadline::of(&req).is_none_or(|d| {
            d.instant().saturating_duration_since(hedge_at) >= shared.config.min_useful()
        });
        let hedge = match copy {
            Some(copy) if fits => Some((copy, self.backup.clone(), hedge_at)),
            _ => None,
        };
        let primary = self.primary.call(req);
        ResponseFuture::new(
            primary,
            hedge,
            self.backup_link.clone(),
            shared.clone(),
            log,
            first,
            owner,
            start,
        )
    }
}
