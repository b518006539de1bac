//! [`Streaming`]: a provider as a streaming service.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tower_llm_core::{ChatRequest, ChatStream, Failure};
use tower_service::Service;

use super::timeouts::StreamTimeouts;

/// The response future of the streaming services.
pub type StreamFuture = Pin<Box<dyn Future<Output = Result<ChatStream, Failure>> + Send>>;

/// A provider as a streaming `Service<ChatRequest, Response = ChatStream>`;
/// see the [module docs](crate::streaming) for the commit point. Build one with
/// [`Provider::streaming`](crate::Provider::streaming) (`OpenAi::streaming`,
/// `Anthropic::streaming`, `Bedrock::streaming`, or any dialect's).
///
/// ```
/// use std::time::Duration;
/// use tower::ServiceExt;
/// use tower_llm_core::{ChatRequest, Message};
/// use tower_llm_providers::mock::{Reply, ScriptedTransport};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let transport = ScriptedTransport::new(Reply::openai_stream(&["Hel", "lo"]));
/// let streaming = transport
///     .openai()
///     .streaming()
///     .with_first_token_timeout(Duration::from_secs(10))
///     .with_idle_timeout(Duration::from_secs(5));
/// let stream = streaming
///     .oneshot(ChatRequest::new("gpt-4o-mini", vec![Message::user("hi")]))
///     .await
///     .unwrap(); // committed: the first content frame arrived
/// assert_eq!(stream.collect_response().await.unwrap().text(), "Hello");
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Streaming<P> {
    provider: P,
    timeouts: StreamTimeouts,
}

impl<P> Streaming<P> {
    /// `provider` streaming with the default timeouts (30 s each).
    pub fn new(provider: P) -> Self {
        Streaming {
            provider,
            timeouts: StreamTimeouts::default(),
        }
    }

    /// Sets the first-token timeout (always also bounded by the call's
    /// deadline).
    #[must_use]
    pub fn with_first_token_timeout(mut self, timeout: Duration) -> Self {
        self.timeouts.first_token = timeout;
        self
    }

    /// Sets the inter-chunk idle timeout (always also bounded by the call's
    /// deadline).
    #[must_use]
    pub fn with_idle_timeout(mut self, timeout: Duration) -> Self {
        self.timeouts.idle = timeout;
        self
    }

    /// Sets both timeouts.
    #[must_use]
    pub fn with_timeouts(mut self, timeouts: StreamTimeouts) -> Self {
        self.timeouts = timeouts;
        self
    }

    /// The timeouts.
    pub fn timeouts(&self) -> StreamTimeouts {
        self.timeouts
    }

    /// The provider service.
    pub fn get_ref(&self) -> &P {
        &self.provider
    }
}

impl<P: StreamSource> Service<ChatRequest> for Streaming<P> {
    type Response = ChatStream;
    type Error = Failure;
    type Future = StreamFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Failure>> {
        self.provider.poll_ready_stream(cx)
    }

    fn call(&mut self, req: ChatRequest) -> StreamFuture {
        self.provider.open_stream(req, self.timeouts)
    }
}

pub(crate) mod private {
    use std::task::{Context, Poll};

    use tower_llm_core::{ChatRequest, Failure};

    use super::{StreamFuture, StreamTimeouts};

    /// Seals [`StreamSource`](super::StreamSource), and is how
    /// [`Streaming`](super::Streaming) drives its provider: a protocol
    /// inside this crate, not nameable outside it.
    pub trait Sealed {
        /// The transport's readiness.
        fn poll_ready_stream(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Failure>>;

        /// Opens a stream and peeks to its commit point.
        fn open_stream(&mut self, req: ChatRequest, timeouts: StreamTimeouts) -> StreamFuture;
    }
}

/// A provider service of this crate that can stream (sealed: every
/// [`Provider`](crate::Provider), whatever its [`Dialect`](crate::Dialect)).
/// [`Streaming`] over it is a `Service<ChatRequest>` answering a
/// [`ChatStream`].
pub trait StreamSource: private::Sealed {}
