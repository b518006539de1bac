//! The idempotency response future.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use pin_project_lite::pin_project;
use tower_llm_core::layer::{CallOwner, MetricsExt as _};
use tower_llm_core::{Call, Failure, FailureClass, LlmRequest, RecordsAttempts};
use tower_service::Service;

use crate::answer::{Capture, IdempotentAnswer};
use crate::config::{Concurrent, Shared};
use crate::store::{Begin, BoxFuture, Fingerprint, StoreError};

/// What a keyed call needs until it leads (or replays).
struct Keyed<S, Req> {
    service: S,
    req: Req,
    shared: Arc<Shared>,
    key: Arc<str>,
    fingerprint: Fingerprint,
    ttl: Duration,
}

pin_project! {
    #[project = StateProj]
    #[project_replace = StateReplace]
    enum State<S, Req>
    where
        S: Service<Req>,
    {
        // No key: the inner call as it is.
        Plain { #[pin] fut: S::Future },
        // Refused before anything (a malformed key).
        Failed { failure: Failure },
        // Asking the store.
        Begin { begin: BoxFuture<Result<Begin, StoreError>>, keyed: Option<Keyed<S, Req>> },
        // Another call with this key is producing the answer.
        Waiting { wait: BoxFuture<()>, keyed: Option<Keyed<S, Req>> },
        // This call leads (or the store is down): the inner call, and the
        // hold on the key.
        Leading { #[pin] fut: S::Future, capture: Option<Capture> },
        Done,
    }
}

pin_project! {
    /// Response future of [`Idempotency`](crate::Idempotency).
    pub struct ResponseFuture<S, Req>
    where
        S: Service<Req>,
    {
        #[pin]
        state: State<S, Req>,
        owner: Option<CallOwner>,
    }
}

impl<S: Service<Req>, Req> std::fmt::Debug for ResponseFuture<S, Req> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<S: Service<Req>, Req> ResponseFuture<S, Req> {
    pub(crate) fn plain(fut: S::Future) -> Self {
        ResponseFuture {
            state: State::Plain { fut },
            owner: None,
        }
    }

    pub(crate) fn failed(failure: Failure) -> Self {
        ResponseFuture {
            state: State::Failed { failure },
            owner: None,
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn keyed(
        begin: BoxFuture<Result<Begin, StoreError>>,
        service: S,
        req: Req,
        shared: Arc<Shared>,
        key: Arc<str>,
        fingerprint: Fingerprint,
        ttl: Duration,
        owner: Option<CallOwner>,
    ) -> Self {
        ResponseFuture {
            state: State::Begin {
                begin,
                keyed: Some(Keyed {
                    service,
                    req,
                    shared,
                    key,
                    fingerprint,
                    ttl,
                }),
            },
            owner,
        }
    }
}

/// Logged once per process: the store is down and calls go through
/// without idempotency.
static STORE_DOWN_LOGGED: AtomicBool = AtomicBool::new(false);

fn reused() -> Failure {
    Failure::new(FailureClass::BadRequest)
        .with_status(http::StatusCode::UNPROCESSABLE_ENTITY)
        .with_message("idempotency_key_reused: this key was used for another request")
}

fn in_use() -> Failure {
    Failure::new(FailureClass::Conflict)
        .with_status(http::StatusCode::CONFLICT)
        .with_message("idempotency_key_in_use: a request with this key is in progress")
}

impl<S, Req> Future for ResponseFuture<S, Req>
where
    S: Service<Req, Error = Failure>,
    S::Response: IdempotentAnswer + RecordsAttempts,
    Req: LlmRequest,
{
    type Output = Result<S::Response, Failure>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let mut result = loop {
            match this.state.as_mut().project() {
                StateProj::Plain { fut } => break ready!(fut.poll(cx)),
                StateProj::Failed { .. } => {
                    match this.state.as_mut().project_replace(State::Done) {
                        StateReplace::Failed { failure } => break Err(failure),
                        _ => break Err(polled_after_completion()),
                    }
                }
                StateProj::Begin { begin, keyed } => {
                    let begun = ready!(begin.as_mut().poll(cx));
                    let Some(mut k) = keyed.take() else {
                        break Err(polled_after_completion());
                    };
                    match begun {
                        Ok(Begin::Lead(lease)) => {
                            let capture = Capture {
                                store: k.shared.store.clone(),
                                key: k.key,
                                lease,
                                ttl: k.ttl,
                                max_entry_bytes: usize::try_from(k.shared.config.max_entry_bytes)
                                    .unwrap_or(usize::MAX),
                                log: k.req.call().and_then(Call::log).cloned(),
                                done: false,
                            };
                            let fut = k.service.call(k.req);
                            this.state.set(State::Leading {
                                fut,
                                capture: Some(capture),
                            });
                        }
                        Ok(Begin::Replay(stored)) => match S::Response::replay(&stored) {
                            Some(res) => {
                                k.shared.metrics.record_idempotent_replay();
                                this.state.set(State::Done);
                                break Ok(res);
                            }
                            None => {
                                this.state.set(State::Done);
                                break Err(reused());
                            }
                        },
                        Ok(Begin::Mismatch) => {
                            this.state.set(State::Done);
                            break Err(reused());
                        }
                        Ok(Begin::Busy(wait)) => {
                            if k.shared.config.concurrent == Concurrent::Reject {
                                this.state.set(State::Done);
                                break Err(in_use());
                            }
                            this.state.set(State::Waiting {
                                wait,
                                keyed: Some(k),
                            });
                        }
                        Err(e) => {
                            if !STORE_DOWN_LOGGED.swap(true, Ordering::Relaxed) {
                                tracing::warn!(
                                    error = %e,
                                    "idempotency store unavailable: calls go through without idempotency"
                                );
                            }
                            let fut = k.service.call(k.req);
                            this.state.set(State::Leading { fut, capture: None });
                        }
                    }
                }
                StateProj::Waiting { wait, keyed } => {
                    ready!(wait.as_mut().poll(cx));
                    let Some(k) = keyed.take() else {
                        break Err(polled_after_completion());
                    };
                    let begin = k.shared.store.begin(k.key.clone(), k.fingerprint);
                    this.state.set(State::Begin {
                        begin,
                        keyed: Some(k),
                    });
                }
                StateProj::Leading { fut, capture } => {
                    let result = ready!(fut.poll(cx));
                    let capture = capture.take();
                    this.state.set(State::Done);
                    // Failures are never stored: dropping the hold gives
                    // the key up, and a waiter goes ahead.
                    break match (result, capture) {
                        (Ok(res), Some(capture)) => Ok(res.capture(capture)),
                        (result, _) => result,
                    };
                }
                StateProj::Done => break Err(polled_after_completion()),
            }
        };
        if let Some(owner) = this.owner.take() {
            owner.finish(&mut result);
        }
        Poll::Ready(result)
    }
}

fn polled_after_completion() -> Failure {
    Failure::new(FailureClass::Cancelled).with_message("idempotency future polled after completion")
}
