//! [`Streaming`]: a provider as a streaming service.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tower_llm_core::{ChatRequest, ChatStream, Failure};
use tower_service::Service;

use super::learned::FirstTokenLimit;
use super::malformed::MalformedChunks;
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
    settings: private::StreamSettings,
}

impl<P> Streaming<P> {
    /// `provider` streaming with the default timeouts (30 s each), a fixed
    /// first-token limit, and malformed events failing the stream.
    pub fn new(provider: P) -> Self {
        Streaming {
            provider,
            settings: private::StreamSettings {
                timeouts: StreamTimeouts::default(),
                learned: None,
                malformed: MalformedChunks::Fail,
                skipped: Arc::new(AtomicU64::new(0)),
            },
        }
    }

    /// Sets the first-token timeout (always also bounded by the call's
    /// deadline). With a [learned limit](Self::with_learned_first_token),
    /// the limit until enough was learned, and its default cap.
    #[must_use]
    pub fn with_first_token_timeout(mut self, timeout: Duration) -> Self {
        self.settings.timeouts.first_token = timeout;
        self
    }

    /// Sets the inter-chunk idle timeout (always also bounded by the call's
    /// deadline).
    #[must_use]
    pub fn with_idle_timeout(mut self, timeout: Duration) -> Self {
        self.settings.timeouts.idle = timeout;
        self
    }

    /// Sets both timeouts.
    #[must_use]
    pub fn with_timeouts(mut self, timeouts: StreamTimeouts) -> Self {
        self.settings.timeouts = timeouts;
        self
    }

    /// The timeouts.
    pub fn timeouts(&self) -> StreamTimeouts {
        self.settings.timeouts
    }

    /// Learns the first-token limit from this link's own times to first
    /// content frame (opt-in; see [`FirstTokenLimit`]): the fixed
    /// first-token timeout until `min_samples` streams committed, then
    /// `quantile × factor` of the recent ones within the floor and the cap
    /// (by default the fixed timeout). Every stream that commits records
    /// its time, every first-token timeout the limit it hit. A stream that
    /// sends no content within the limit fails before its commit point
    /// with a [`Timeout`](tower_llm_core::FailureClass::Timeout) failure,
    /// so the retry and fallback layers move on after seconds, not after
    /// the fixed 30 s.
    ///
    /// `limit` is a shared handle: give the same one to every streaming
    /// service of one link (its clones share it already), a different one
    /// to each link.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower::ServiceExt;
    /// use tower_llm_core::{ChatRequest, FailureClass, Message};
    /// use tower_llm_providers::mock::{Reply, ScriptedTransport, Step, openai_stream_steps};
    /// use tower_llm_providers::streaming::{FirstTokenLimit, FirstTokenLimitConfig};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let limit = FirstTokenLimit::new(FirstTokenLimitConfig::default()).unwrap();
    /// // 20 streams whose first token came after 1.5 s.
    /// let mut steps = vec![Step::Pause(Duration::from_millis(1_500))];
    /// steps.extend(openai_stream_steps(&["Hi"], true));
    /// let transport = ScriptedTransport::new(Reply::sse_steps(steps));
    /// let streaming = transport.openai().streaming().with_learned_first_token(limit.clone());
    /// let req = || ChatRequest::new("gpt-4o-mini", vec![Message::user("hi")]);
    /// for _ in 0..20 {
    ///     streaming.clone().oneshot(req()).await.unwrap();
    /// }
    /// assert_eq!(limit.limit(Duration::from_secs(30)), Duration::from_secs(3));
    ///
    /// // A silent upstream now fails after 3 s, not 30 s.
    /// transport.push(Reply::sse_steps(vec![Step::Stall]));
    /// let started = tokio::time::Instant::now();
    /// let err = streaming.oneshot(req()).await.unwrap_err();
    /// assert_eq!(err.class(), FailureClass::Timeout);
    /// assert_eq!(started.elapsed(), Duration::from_secs(3));
    /// # }
    /// ```
    #[must_use]
    pub fn with_learned_first_token(mut self, limit: FirstTokenLimit) -> Self {
        self.settings.learned = Some(limit);
        self
    }

    /// The learned first-token limit, if one is set.
    pub fn learned_first_token(&self) -> Option<&FirstTokenLimit> {
        self.settings.learned.as_ref()
    }

    /// What a malformed event after the commit point does (default
    /// [`MalformedChunks::Fail`]: it ends the stream; see
    /// [`MalformedChunks`] for why, and for
    /// [`Skip`](MalformedChunks::Skip)). Before the commit point a
    /// malformed event fails the call in both modes.
    ///
    /// ```
    /// use tower::ServiceExt;
    /// use tower_llm_core::{ChatRequest, Message};
    /// use tower_llm_providers::mock::{Reply, ScriptedTransport, Step};
    /// use tower_llm_providers::streaming::MalformedChunks;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let steps = vec![
    ///     Step::openai_text("Hel"),
    ///     Step::sse(None, "{\"choices\": 7}"), // not a chunk
    ///     Step::openai_text("lo"),
    ///     Step::sse(None, "[DONE]"),
    /// ];
    /// let transport = ScriptedTransport::new(Reply::sse_steps(steps));
    /// let streaming = transport
    ///     .openai()
    ///     .streaming()
    ///     .with_malformed_chunks(MalformedChunks::Skip);
    /// let req = ChatRequest::new("gpt-4o-mini", vec![Message::user("hi")]);
    /// let stream = streaming.clone().oneshot(req).await.unwrap();
    /// assert_eq!(stream.collect_response().await.unwrap().text(), "Hello");
    /// assert_eq!(streaming.malformed_skipped(), 1);
    /// # }
    /// ```
    #[must_use]
    pub fn with_malformed_chunks(mut self, malformed: MalformedChunks) -> Self {
        self.settings.malformed = malformed;
        self
    }

    /// What a malformed event after the commit point does.
    pub fn malformed_chunks(&self) -> MalformedChunks {
        self.settings.malformed
    }

    /// How many malformed events the streams of this service (and of its
    /// clones) have skipped, ever (always 0 with [`MalformedChunks::Fail`]).
    pub fn malformed_skipped(&self) -> u64 {
        self.settings.skipped.load(Ordering::Relaxed)
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
        self.provider.open_stream(req, self.settings.clone())
    }
}

pub(crate) mod private {
    use std::sync::Arc;
    use std::sync::atomic::AtomicU64;
    use std::task::{Context, Poll};

    use tower_llm_core::{ChatRequest, Failure};

    use super::{FirstTokenLimit, MalformedChunks, StreamFuture, StreamTimeouts};

    /// What a [`Streaming`](super::Streaming) service asks of each stream.
    #[derive(Debug, Clone)]
    pub struct StreamSettings {
        /// The fixed timeouts.
        pub timeouts: StreamTimeouts,
        /// The learned first-token limit, if any.
        pub learned: Option<FirstTokenLimit>,
        /// What a malformed event after the commit point does.
        pub malformed: MalformedChunks,
        /// Malformed events skipped, by every clone of the service.
        pub skipped: Arc<AtomicU64>,
    }

    /// Seals [`StreamSource`](super::StreamSource), and is how
    /// [`Streaming`](super::Streaming) drives its provider: a protocol
    /// inside this crate, not nameable outside it.
    pub trait Sealed {
        /// The transport's readiness.
        fn poll_ready_stream(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Failure>>;

        /// Opens a stream and peeks to its commit point.
        fn open_stream(&mut self, req: ChatRequest, settings: StreamSettings) -> StreamFuture;
    }
}

/// A provider service of this crate that can stream (sealed: every
/// [`Provider`](crate::Provider), whatever its [`Dialect`](crate::Dialect)).
/// [`Streaming`] over it is a `Service<ChatRequest>` answering a
/// [`ChatStream`].
pub trait StreamSource: private::Sealed {}
