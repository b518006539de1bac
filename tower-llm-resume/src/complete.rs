//! [`CompleteLayer`]: hold a stream until it is complete, so that a cut
//! is an ordinary failure of the call.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use futures_core::Stream;
use pin_project_lite::pin_project;
use tokio::time::{Sleep, sleep};
use tower_layer::Layer;
use tower_llm_core::{
    BoxError, ChatChunk, ChatRequest, ChatStream, ChunkStream, Failure, FailureClass,
};
use tower_service::Service;

use crate::{CompleteConfig, InvalidConfig};

/// What a held chunk counts for besides its text and tool-call bytes
/// (see [`CompleteConfig::max_bytes`]).
pub const CHUNK_OVERHEAD: usize = 32;

/// Which requests a [`CompleteLayer`] holds.
type Predicate = Arc<dyn Fn(&ChatRequest) -> bool + Send + Sync>;

/// Complete-or-fail: holds a link's stream until it is complete, and only
/// then answers (with a stream replaying the chunks), so a stream that
/// breaks is an `Err` of the call, which the retry and fallback layers
/// treat like any failure before the first token.
///
/// Per link, inside the retry layer: retry → (breaker →) **complete** →
/// provider. Directly over the provider, inside the breaker, a stream that
/// breaks also counts against the link's circuit (a committed stream's
/// failure never does).
///
/// The client gets nothing until the whole answer is in: the latency of a
/// held stream is its full generation time, and the retry layer's
/// per-attempt timeout now bounds the generation (keep `max_ms` below
/// it). So holding is bounded: past `max_bytes` held, or `max_ms` after
/// the stream committed, the layer gives up holding and answers with what
/// it holds followed by the live rest: an ordinary committed stream,
/// whose later failure ends it as any stream's does.
///
/// Opt-in per request with [`when`](CompleteLayer::when) (a gateway reads
/// a request header); without a predicate every stream is held.
///
/// ```
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// use std::sync::Arc;
/// use tower::{service_fn, ServiceBuilder, ServiceExt};
/// use tower_llm_core::{ChatChunk, ChatRequest, ChatStream, Failure, FailureClass, Message};
/// use tower_llm_resume::{CompleteConfig, CompleteLayer};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let text = |t: &str| Ok(ChatChunk { text: Some(t.into()), ..ChatChunk::default() });
/// let calls = Arc::new(AtomicUsize::new(0));
/// let counter = calls.clone();
/// // The first stream breaks after one token; the second is complete.
/// let provider = service_fn(move |_req: ChatRequest| {
///     let n = counter.fetch_add(1, Ordering::SeqCst);
///     let items = match n {
///         0 => vec![text("Hel"), Err(Failure::new(FailureClass::Transient))],
///         _ => vec![text("Hel"), text("lo")],
///     };
///     async move { Ok::<_, Failure>(ChatStream::from_chunks("mock", "m", items)) }
/// });
/// let link = ServiceBuilder::new()
///     .layer(CompleteLayer::new(CompleteConfig::default()).unwrap())
///     .service(provider);
/// let req = ChatRequest::new("m", vec![Message::user("hi")]);
/// // The cut is the call's error: a retry layer outside would retry it.
/// let err = link.clone().oneshot(req.clone()).await.unwrap_err();
/// assert!(err.is_transient());
/// let answer = link.oneshot(req).await.unwrap().collect_response().await.unwrap();
/// assert_eq!(answer.text(), "Hello");
/// # }
/// ```
#[derive(Clone)]
pub struct CompleteLayer {
    config: CompleteConfig,
    when: Option<Predicate>,
}

impl CompleteLayer {
    /// A layer holding every stream, within `config`'s caps.
    ///
    /// # Errors
    ///
    /// When `config` does not [validate](CompleteConfig::validate).
    pub fn new(config: CompleteConfig) -> Result<Self, InvalidConfig> {
        config.validate()?;
        Ok(CompleteLayer { config, when: None })
    }

    /// Holds only the streams of requests for which `predicate` is `true`
    /// (say, those that carry a header asking for it); the others pass as
    /// they are.
    #[must_use]
    pub fn when(
        mut self,
        predicate: impl Fn(&ChatRequest) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.when = Some(Arc::new(predicate));
        self
    }

    /// The settings.
    pub fn config(&self) -> &CompleteConfig {
        &self.config
    }
}

impl fmt::Debug for CompleteLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompleteLayer")
            .field("config", &self.config)
            .field("predicate", &self.when.is_some())
            .finish()
    }
}

impl<S> Layer<S> for CompleteLayer {
    type Service = Complete<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Complete {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service built by [`CompleteLayer`].
#[derive(Debug, Clone)]
pub struct Complete<S> {
    inner: S,
    layer: CompleteLayer,
}

impl<S> Complete<S> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S> Service<ChatRequest> for Complete<S>
where
    S: Service<ChatRequest, Response = ChatStream>,
    S::Error: Into<BoxError> + 'static,
{
    type Response = ChatStream;
    type Error = Failure;
    type Future = CompleteFuture<S::Future>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Failure::from_inner)
    }

    fn call(&mut self, req: ChatRequest) -> Self::Future {
        let hold = self.layer.when.as_ref().is_none_or(|when| when(&req));
        CompleteFuture {
            fut: self.inner.call(req),
            hold: hold.then_some(self.layer.config),
            held: None,
            timer: None,
            done: false,
        }
    }
}

/// A stream being held.
struct Held {
    stream: ChatStream,
    chunks: Vec<ChatChunk>,
    bytes: usize,
}

pin_project! {
    /// Response future of [`Complete`]: the inner call's, then, for a held
    /// request, its stream read to the end (or to a cap).
    pub struct CompleteFuture<F> {
        #[pin]
        fut: F,
        hold: Option<CompleteConfig>,
        held: Option<Held>,
        #[pin]
        timer: Option<Sleep>,
        done: bool,
    }
}

impl<F> fmt::Debug for CompleteFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompleteFuture")
            .field("hold", &self.hold)
            .field("holding", &self.held.as_ref().map(|h| h.chunks.len()))
            .finish_non_exhaustive()
    }
}

impl<F, E> Future for CompleteFuture<F>
where
    F: Future<Output = Result<ChatStream, E>>,
    E: Into<BoxError> + 'static,
{
    type Output = Result<ChatStream, Failure>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        if *this.done {
            return Poll::Ready(Err(polled_after_completion()));
        }
        let Some(config) = *this.hold else {
            let result = ready!(this.fut.poll(cx)).map_err(Failure::from_inner);
            *this.done = true;
            return Poll::Ready(result);
        };
        if this.held.is_none() {
            let result = ready!(this.fut.poll(cx)).map_err(Failure::from_inner);
            let stream = match result {
                Ok(stream) => stream,
                Err(failure) => {
                    *this.done = true;
                    return Poll::Ready(Err(failure));
                }
            };
            *this.held = Some(Held {
                stream,
                chunks: Vec::new(),
                bytes: 0,
            });
            this.timer.set(Some(sleep(config.max_time())));
        }
        let Some(held) = this.held.as_mut() else {
            *this.done = true;
            return Poll::Ready(Err(polled_after_completion()));
        };
        loop {
            match Pin::new(&mut held.stream).poll_next(cx) {
                Poll::Ready(Some(Ok(chunk))) => {
                    held.bytes = held.bytes.saturating_add(size(&chunk));
                    held.chunks.push(chunk);
                    if held.bytes > config.max_bytes {
                        break;
                    }
                }
                Poll::Ready(Some(Err(failure))) => {
                    *this.done = true;
                    *this.held = None;
                    return Poll::Ready(Err(failure));
                }
                Poll::Ready(None) => {
                    *this.done = true;
                    let held = this.held.take();
                    return Poll::Ready(
                        held.map(|h| answer(h, false))
                            .ok_or_else(polled_after_completion),
                    );
                }
                Poll::Pending => {
                    let expired = this
                        .timer
                        .as_mut()
                        .as_pin_mut()
                        .is_some_and(|t| t.poll(cx).is_ready());
                    if expired {
                        break;
                    }
                    return Poll::Pending;
                }
            }
        }
        // A cap was reached: what is held, then the live rest.
        *this.done = true;
        let held = this.held.take();
        Poll::Ready(
            held.map(|h| answer(h, true))
                .ok_or_else(polled_after_completion),
        )
    }
}

fn polled_after_completion() -> Failure {
    Failure::new(FailureClass::Cancelled)
        .with_message("complete-or-fail future polled after completion")
}

/// What a chunk counts for against `max_bytes`.
fn size(chunk: &ChatChunk) -> usize {
    let text = chunk.text.as_ref().map_or(0, String::len);
    let call = chunk.tool_call.as_ref().map_or(0, |c| {
        c.arguments.len()
            + c.id.as_ref().map_or(0, String::len)
            + c.name.as_ref().map_or(0, String::len)
    });
    CHUNK_OVERHEAD + text + call
}

/// The held stream as the answer: its chunks, then (`live`) the rest of
/// the stream; its provider, model, attempts and the rest are kept.
fn answer(held: Held, live: bool) -> ChatStream {
    let Held { stream, chunks, .. } = held;
    stream.map_chunks(move |rest| {
        Box::pin(Replay {
            held: chunks.into_iter(),
            rest: live.then_some(rest),
        }) as ChunkStream
    })
}

/// The held chunks, then the live rest (if any).
struct Replay {
    held: std::vec::IntoIter<ChatChunk>,
    rest: Option<ChunkStream>,
}

impl Stream for Replay {
    type Item = Result<ChatChunk, Failure>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if let Some(chunk) = self.held.next() {
            return Poll::Ready(Some(Ok(chunk)));
        }
        match self.rest.as_mut() {
            Some(rest) => rest.as_mut().poll_next(cx),
            None => Poll::Ready(None),
        }
    }
}
