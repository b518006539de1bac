use std::sync::Arc;
use std::task::{Context, Poll};

use tower_llm_core::layer::Replay;
use tower_llm_core::{BoxError, Classify, Failure, LlmRequest, RecordsAttempts};
use tower_service::Service;

use crate::ResponseFuture;
use crate::layer::Chain;

/// The service built by [`FallbackLayer`](crate::FallbackLayer): the
/// primary link's service plus the chain's alternates.
pub struct Fallback<S, Req, Res, C> {
    primary: S,
    chain: Arc<Chain<Req, Res, C>>,
}

impl<S: Clone, Req, Res, C> Clone for Fallback<S, Req, Res, C> {
    fn clone(&self) -> Self {
        Fallback {
            primary: self.primary.clone(),
            chain: self.chain.clone(),
        }
    }
}

impl<S: std::fmt::Debug, Req, Res, C> std::fmt::Debug for Fallback<S, Req, Res, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fallback")
            .field("primary", &self.primary)
            .field("links", &self.chain.len())
            .finish()
    }
}

impl<S, Req, Res, C> Fallback<S, Req, Res, C> {
    pub(crate) fn new(primary: S, chain: Arc<Chain<Req, Res, C>>) -> Self {
        Fallback { primary, chain }
    }

    /// The primary link's service.
    pub fn get_ref(&self) -> &S {
        &self.primary
    }

    /// The primary link's service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.primary
    }

    /// Unwraps the primary link's service.
    pub fn into_inner(self) -> S {
        self.primary
    }
}

impl<S, Req, Res, C> Service<Req> for Fallback<S, Req, Res, C>
where
    S: Service<Req, Response = Res>,
    S::Error: Into<BoxError> + 'static,
    Req: Clone + LlmRequest + 'static,
    Res: RecordsAttempts + 'static,
    C: Classify<Res, Failure>,
{
    type Response = Res;
    type Error = Failure;
    type Future = ResponseFuture<S::Future, Req, Res, C>;

    /// The primary's readiness; alternates are made ready lazily, inside
    /// the response future, only when the call fails over to them.
    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.primary.poll_ready(cx).map_err(Failure::from_inner)
    }

    fn call(&mut self, mut req: Req) -> Self::Future {
        let chain = self.chain.clone();
        // Owns the call when no outer layer does (before the copy, so that
        // every link appends to the same log), and keeps a clean copy for
        // the alternates, unless the request cannot be sent twice.
        let (owned, pristine) =
            Replay::enter(&mut req, &chain.metrics, !chain.alternates.is_empty());
        let _span = owned.as_ref().map(|o| o.span().enter());
        if chain.primary.admits(&req) {
            chain.primary.prepare(&mut req);
            let fut = self.primary.call(req);
            drop(_span);
            ResponseFuture::primary(fut, chain, pristine, owned)
        } else {
            drop(_span);
            // The request is as the copy is (nothing was prepared).
            drop(pristine);
            let replayable = req.is_replayable();
            ResponseFuture::primary_skipped(chain, req, replayable, owned)
        }
    }
}
