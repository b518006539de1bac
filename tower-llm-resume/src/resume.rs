//! [`ResumeLayer`]: continue a stream that broke after its commit point.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_llm_core::{BoxError, ChatRequest, ChatStream, Continued, Failure};
use tower_service::Service;

use crate::splice::{Pristine, Splice};
use crate::{InvalidConfig, ResumeConfig};

/// Continues a stream that broke after its first content frame: see the
/// [crate docs](crate). Put it over a route's fallback chain (inside the
/// deadline layer), with a [`ContinuationLayer`](crate::ContinuationLayer)
/// on each link.
///
/// ```
/// use tower_llm_resume::{ResumeConfig, ResumeLayer};
///
/// let layer = ResumeLayer::new(ResumeConfig { max_continuations: 2, ..ResumeConfig::default() })
///     .unwrap();
/// assert_eq!(layer.config().max_continuations, 2);
/// assert!(ResumeLayer::new(ResumeConfig { max_continuations: 9, ..ResumeConfig::default() }).is_err());
/// ```
#[derive(Debug, Clone)]
pub struct ResumeLayer {
    config: ResumeConfig,
}

impl ResumeLayer {
    /// A layer with `config`.
    ///
    /// # Errors
    ///
    /// When `config` does not [validate](ResumeConfig::validate).
    pub fn new(config: ResumeConfig) -> Result<Self, InvalidConfig> {
        config.validate()?;
        Ok(ResumeLayer { config })
    }

    /// The settings.
    pub fn config(&self) -> &ResumeConfig {
        &self.config
    }
}

impl Default for ResumeLayer {
    /// One continuation per stream ([`ResumeConfig::default`]).
    fn default() -> Self {
        ResumeLayer {
            config: ResumeConfig::default(),
        }
    }
}

impl<S> Layer<S> for ResumeLayer {
    type Service = Resume<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Resume {
            inner,
            config: self.config,
        }
    }
}

/// The service built by [`ResumeLayer`]: `S` is a route's streaming
/// service (its fallback chain), through which each continuation is sent
/// again.
#[derive(Debug, Clone)]
pub struct Resume<S> {
    inner: S,
    config: ResumeConfig,
}

impl<S> Resume<S> {
    /// `inner`, its broken streams continued per `config` (validated by
    /// [`ResumeLayer::new`]; use the layer to build one from a policy).
    ///
    /// # Errors
    ///
    /// When `config` does not [validate](ResumeConfig::validate).
    pub fn new(inner: S, config: ResumeConfig) -> Result<Self, InvalidConfig> {
        Ok(ResumeLayer::new(config)?.layer(inner))
    }

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

impl<S> Service<ChatRequest> for Resume<S>
where
    S: Service<ChatRequest, Response = ChatStream> + Clone + Send + 'static,
    S::Error: Into<BoxError> + 'static,
    S::Future: Send + 'static,
{
    type Response = ChatStream;
    type Error = Failure;
    type Future = ResumeFuture<S::Future, S>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Failure::from_inner)
    }

    fn call(&mut self, mut req: ChatRequest) -> Self::Future {
        // The continuation copy is kept before the call; a request that
        // may be sent only once is never continued.
        let setup = if self.config.max_continuations == 0 {
            None
        } else {
            Pristine::of(&mut req).map(|pristine| Setup {
                service: self.inner.clone(),
                pristine,
                config: self.config,
            })
        };
        // The ready service answers this call; a clone (made ready when
        // needed) sends the continuations.
        ResumeFuture {
            fut: self.inner.call(req),
            setup,
        }
    }
}

/// What a resumable call keeps for its continuations.
struct Setup<S> {
    service: S,
    pristine: Pristine,
    config: ResumeConfig,
}

pin_project! {
    /// Response future of [`Resume`]: the inner call's; its stream, once
    /// committed, is returned spliced (the first piece's chunks, then each
    /// continuation's).
    pub struct ResumeFuture<F, S> {
        #[pin]
        fut: F,
        setup: Option<Setup<S>>,
    }
}

impl<F, S> std::fmt::Debug for ResumeFuture<F, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResumeFuture")
            .field("resumable", &self.setup.is_some())
            .finish_non_exhaustive()
    }
}

impl<F, S, E> Future for ResumeFuture<F, S>
where
    F: Future<Output = Result<ChatStream, E>>,
    E: Into<BoxError> + 'static,
    S: Service<ChatRequest, Response = ChatStream> + Clone + Send + 'static,
    S::Error: Into<BoxError> + 'static,
    S::Future: Send + 'static,
{
    type Output = Result<ChatStream, Failure>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let stream = ready!(this.fut.poll(cx)).map_err(Failure::from_inner)?;
        let Some(Setup {
            service,
            pristine,
            config,
        }) = this.setup.take()
        else {
            return Poll::Ready(Ok(stream));
        };
        let continued = Continued::new();
        let handle = continued.clone();
        Poll::Ready(Ok(stream.with_continuations(handle).map_chunks(
            move |first| Box::pin(Splice::new(first, service, pristine, config, continued)),
        )))
    }
}
