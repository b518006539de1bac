use std::sync::{Arc, Weak};
use std::task::{Context, Poll};

use tokio::time::Instant;
use tower_llm_core::layer::{AttemptLogExt as _, AttemptRecordExt as _};
use tower_llm_core::{
    AttemptOutcome, AttemptRecord, BoxError, Call, Classify, Failure, FailureClass, LlmRequest,
};
use tower_service::Service;

use crate::circuit::Refusal;
use crate::future::{Guard, OwnRecord};
use crate::{BreakerLayer, Circuit, KeyFn, ResponseFuture};

/// The service built by [`BreakerLayer`]: see the [crate docs](crate).
#[derive(Debug)]
pub struct Breaker<S, K, C> {
    inner: S,
    shared: Arc<BreakerLayer<K, C>>,
    /// The circuit of the last key this service served, when the store
    /// declares its circuits stable: a call with the same key (the usual
    /// case, one breaker per link) skips the store's hashing and shard
    /// lock. Weak, so it never keeps the store from forgetting an idle
    /// circuit; a retired circuit, or one the store handed out without
    /// keeping it (it was full), is never reused.
    last: Option<Weak<Circuit>>,
}

impl<S: Clone, K, C> Clone for Breaker<S, K, C> {
    fn clone(&self) -> Self {
        Breaker {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
            last: self.last.clone(),
        }
    }
}

impl<S, K, C> Breaker<S, K, C> {
    pub(crate) fn new(inner: S, shared: Arc<BreakerLayer<K, C>>) -> Self {
        Breaker {
            inner,
            shared,
            last: None,
        }
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The wrapped service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, K, C, Req> Service<Req> for Breaker<S, K, C>
where
    S: Service<Req>,
    S::Error: Into<BoxError> + 'static,
    K: KeyFn<Req>,
    C: Classify<S::Response, Failure> + Clone,
    Req: LlmRequest,
{
    type Response = S::Response;
    type Error = Failure;
    type Future = ResponseFuture<S::Future, K, C>;

    /// Passes the inner service's readiness through: an open circuit is
    /// refused in `call`, never by `poll_ready` (the load-shed pattern; the
    /// key is not known before the request).
    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Failure::from_inner)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let shared = &self.shared;
        // The attempt's record: a retry layer outside has made it (the
        // breaker reads it); without one, the breaker makes it, so a stack
        // without a retry layer still records every attempt.
        let view = req.call();
        let alternates_after = view
            .and_then(Call::link)
            .is_some_and(tower_llm_core::Link::has_alternates_after);
        let mut attempt = None;
        let mut own = None;
        if let Some(log) = view.and_then(Call::log) {
            match log.in_flight() {
                Some(index) => attempt = Some((log.clone(), index)),
                None => {
                    match log.begin(AttemptRecord::begun(view, &shared.link)) {
                        Ok(index) => {
                            own = Some(OwnRecord {
                                log: log.clone(),
                                index,
                                start: Instant::now(),
                                deadline: view.and_then(Call::deadline).map(|d| d.instant()),
                            });
                        }
                        // The attempts cap: this attempt must not be made.
                        Err(cap) => return ResponseFuture::refused(cap),
                    }
                }
            }
        }
        let last = &mut self.last;
        let circuit = shared.key_fn.with_key(&req, &shared.link, |key| {
            if let Some(c) = last.as_ref().and_then(Weak::upgrade) {
                if c.key().view() == key && !c.is_retired() {
                    return c;
                }
            }
            let c = shared.store.circuit_for(key);
            // Held by the store too (it was not handed out unstored).
            *last = (Arc::strong_count(&c) > 1 && shared.store.circuits_are_stable())
                .then(|| Arc::downgrade(&c));
            c
        });
        let (admission, transition) = circuit.admit(&shared.config);
        crate::layer::announce(shared.observer.as_ref(), transition.as_ref());
        match admission {
            Err(refusal) => {
                let key = circuit.key();
                let failure = match refusal {
                    Refusal::Open(retry_after) => {
                        tracing::debug!(
                            provider = key.provider(),
                            model = key.model(),
                            retry_after_ms = retry_after.map(|d| d.as_millis()),
                            "circuit open: call refused"
                        );
                        Failure::circuit_open(retry_after)
                    }
                    // A hold only delays this key. With links after this
                    // one, the call goes to the next link now (refused as
                    // open: not retried here); on the last link, a
                    // rate-limited failure with the rest of the hold, which
                    // the retry layer waits out when the deadline allows.
                    Refusal::Held(rest) if alternates_after => Failure::circuit_open(Some(rest)),
                    Refusal::Held(rest) => Failure::new(FailureClass::RateLimited)
                        .with_retry_after(rest)
                        .with_message("held by the provider's Retry-After"),
                };
                let failure = failure
                    .with_provider(key.provider_arc().clone())
                    .with_model(key.model_arc().clone());
                let class = failure.class();
                if let Some(own) = own {
                    own.log.finish(own.index, |r| {
                        r.outcome = AttemptOutcome::Failed(class);
                    });
                }
                ResponseFuture::refused(failure)
            }
            Ok(admission) => {
                let guard = Guard {
                    circuit,
                    admission,
                    shared: shared.clone(),
                    start: shared.config.slow_call.map(|_| Instant::now()),
                    attempt,
                    own,
                    done: false,
                };
                ResponseFuture::running(self.inner.call(req), guard)
            }
        }
    }
}
