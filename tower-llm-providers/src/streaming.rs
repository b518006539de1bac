//! The streaming services: [`Streaming`] around a provider answers a
//! [`ChatRequest`] with a [`ChatStream`] at the stream's commit point.
//!
//! # The commit point: the first content frame
//!
//! The service's future resolves only when the provider has sent the first
//! content frame (a text delta or a tool-call fragment). Until then, a
//! failure is an ordinary `Err` of the service, so retry, breaker and
//! fallback treat it exactly like a failed unary call:
//!
//! | before the first content frame | failure class |
//! |---|---|
//! | an HTTP error answer | from status, headers and body, as for unary calls |
//! | an in-band error event (OpenAI `error` object, Anthropic `event: error`, a Bedrock exception message) | from the error's type (`overloaded_error` is transient, throttling is rate limited, ...) |
//! | a stream that ends, or sends its terminator, with neither content nor a finish reason | transient |
//! | no content frame within the first-token timeout | timeout (or deadline exceeded, when the call's deadline came first) |
//! | a malformed frame | invalid response |
//!
//! A stream that ends properly with a finish reason but no content (a
//! content filter's stop, an empty answer) is a complete answer: it
//! commits, and is not retried.
//!
//! The peek holds at most the first content frame (plus one merged
//! preamble chunk with any usage or finish reason sent before it) and hands
//! it on unchanged; after it the stream is passed through with no per-chunk
//! buffering.
//!
//! After the commit point nothing retries: a mid-stream error event, a
//! connection that breaks off, a stall longer than the idle timeout, the
//! call's deadline (it bounds the whole stream, checked before each chunk
//! is handed on), or a truncated stream (see below) ends the
//! [`ChatStream`] with one terminal `Err` item carrying the failure class.
//! The breaker counts only failures before the commit point (its call
//! future resolved `Ok` at the commit).
//!
//! # Complete or truncated: the end of a stream
//!
//! A stream is complete, and its [`ChatStream`] ends with no error, when
//!
//! - its terminator comes: OpenAI's `data: [DONE]`, Anthropic's
//!   `message_stop`, Bedrock's `metadata` event after `messageStop`; or
//! - its body ends cleanly without the terminator after the finish reason:
//!   OpenAI, a `finish_reason` for **every choice that started** (a choice
//!   starts with its first chunk that is not usage-only; `n > 1` streams
//!   are tracked per choice index); Anthropic, a `message_delta` with a
//!   `stop_reason`; Bedrock, a `messageStop` with its `stopReason`.
//!   Every chunk that came is handed on, the usage chunk after the finish
//!   reason included.
//!
//! A clean end of the body is the end the HTTP framing declares (the last
//! chunk of a chunked body, or its `Content-Length` reached), with no
//! partial event left over: the finish reason alone does not prove the
//! answer complete, since the usage may still follow it.
//!
//! A stream is truncated, and ends with a terminal `Err` of class
//! [`Transient`](FailureClass::Transient) ("the stream ended without its
//! terminator"), when its body ends cleanly before that finish reason
//! (for OpenAI, while a started choice has none), or in the middle of an
//! event. A body that breaks off (a connection reset, a chunked body
//! without its last chunk) is a transient failure ("the stream broke
//! off") even after the finish reason: the usage, or a part of the
//! answer, may be lost.
//!
//! The official SDKs read a stream to the end of its body and accept it
//! without the terminator; the finish reason asked for here in addition
//! keeps a stream cut between two events an error.
//!
//! The stream ends at the terminator: the consumer never waits on the rest
//! of the body. What is left of it (an upstream that sends its terminator
//! and lingers) is read in the background so the connection can return to
//! the pool: at most 64 KiB, within the idle timeout and the call's
//! deadline, on a task spawned on the current tokio runtime (the body is
//! dropped, closing the connection, when there is none or the limit is
//! reached).
//!
//! Put the layers around a `Streaming` service exactly as around the unary
//! one; the retry layer's attempt timeout then bounds the time to the first
//! content frame as well.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use futures_core::Stream;
use http_body::Body;
use tokio::time::{Instant, Sleep};
use tower_llm_core::{
    BoxError, ChatChunk, ChatRequest, ChatStream, Deadline, Failure, FailureClass, GenAiMetrics,
    Usage,
};
use tower_service::Service;

use crate::RequestBody;
use crate::failure::Scrub;
use crate::stream::{SseEvent, SseParser, StreamItem};
use crate::transport::read_body;

/// The default first-token timeout: 30 s.
pub const DEFAULT_FIRST_TOKEN_TIMEOUT: Duration = Duration::from_secs(30);

/// The default inter-chunk idle timeout: 30 s.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// The response future of the streaming services.
pub type StreamFuture = Pin<Box<dyn Future<Output = Result<ChatStream, Failure>> + Send>>;

/// The timeouts of a streaming service (`[stream]` in a policy file:
/// `first_token_timeout_ms`, `idle_timeout_ms`, default 30,000 each).
///
/// ```
/// use std::time::Duration;
/// use tower_llm_providers::StreamTimeouts;
///
/// let t: StreamTimeouts = serde_json::from_str(r#"{"idle_timeout_ms": 5000}"#).unwrap();
/// assert_eq!(t.idle, Duration::from_secs(5));
/// assert_eq!(t.first_token, StreamTimeouts::default().first_token);
/// assert!(StreamTimeouts { idle: Duration::ZERO, ..t }.validate().unwrap_err().contains("idle_timeout_ms"));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StreamTimeouts {
    /// From sending the request to the first content frame
    /// (`first_token_timeout_ms`).
    #[serde(
        rename = "first_token_timeout_ms",
        with = "tower_llm_core::serde_millis"
    )]
    pub first_token: Duration,
    /// Between two chunks after the commit point; keep-alive pings do not
    /// count as chunks (`idle_timeout_ms`).
    #[serde(rename = "idle_timeout_ms", with = "tower_llm_core::serde_millis")]
    pub idle: Duration,
}

impl StreamTimeouts {
    /// Checks the timeouts.
    ///
    /// # Errors
    ///
    /// A message naming the field: a zero timeout.
    pub fn validate(&self) -> Result<(), String> {
        if self.first_token.is_zero() {
            return Err("first_token_timeout_ms must be above 0".into());
        }
        if self.idle.is_zero() {
            return Err("idle_timeout_ms must be above 0".into());
        }
        Ok(())
    }
}

impl Default for StreamTimeouts {
    fn default() -> Self {
        StreamTimeouts {
            first_token: DEFAULT_FIRST_TOKEN_TIMEOUT,
            idle: DEFAULT_IDLE_TIMEOUT,
        }
    }
}

/// A provider as a streaming `Service<ChatRequest, Response = ChatStream>`;
/// see the [module docs](self) for the commit point. Build one with
/// `OpenAi::streaming`, `Anthropic::streaming` or `Bedrock::streaming`.
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
    /// Seals [`StreamSource`](super::StreamSource).
    pub trait Sealed {}
}

/// A provider of this crate that can stream (sealed: OpenAI, Anthropic and
/// Bedrock).
pub trait StreamSource: private::Sealed {
    /// The transport's readiness.
    #[doc(hidden)]
    fn poll_ready_stream(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Failure>>;

    /// Opens a stream and peeks to its commit point.
    #[doc(hidden)]
    fn open_stream(&mut self, req: ChatRequest, timeouts: StreamTimeouts) -> StreamFuture;
}

/// How a provider's stream bytes become [`StreamItem`]s.
pub(crate) trait Wire: Send + 'static {
    /// Feeds the next bytes; decoded items (or one failure) go to `out`.
    fn feed(&mut self, bytes: &[u8], out: &mut VecDeque<Result<StreamItem, Failure>>);

    /// At a clean end of the body, when no terminator came: `true` when
    /// the stream is complete anyway (the finish reason came and no event
    /// is cut), `false` when it was truncated.
    fn ended_cleanly(&mut self) -> bool {
        false
    }
}

/// Server-sent events decoded by one of the event functions of
/// [`stream`](crate::stream).
pub(crate) struct SseWire {
    parser: SseParser,
    decode: fn(&SseEvent, &Scrub) -> Result<StreamItem, Failure>,
    failed: bool,
    /// The choices seen so far, and which of them sent a finish reason.
    finishes: Finishes,
    /// The secrets sent, removed from in-band error messages that echo
    /// them (before the message is bounded).
    scrub: Scrub,
}

impl SseWire {
    pub(crate) fn new(
        decode: fn(&SseEvent, &Scrub) -> Result<StreamItem, Failure>,
        scrub: Scrub,
    ) -> Self {
        SseWire {
            parser: SseParser::new(),
            decode,
            failed: false,
            finishes: Finishes::default(),
            scrub,
        }
    }
}

impl Wire for SseWire {
    fn feed(&mut self, bytes: &[u8], out: &mut VecDeque<Result<StreamItem, Failure>>) {
        if self.failed {
            return;
        }
        let decode = self.decode;
        let mut failed = false;
        let scrub = &self.scrub;
        let finishes = &mut self.finishes;
        let parsed = self.parser.push_with(bytes, |event| {
            if failed {
                return;
            }
            match decode(&event, scrub) {
                Ok(StreamItem::Chunks(chunks)) => {
                    for c in &chunks {
                        finishes.note(c);
                    }
                    out.extend(chunks.into_iter().map(|c| Ok(StreamItem::Chunk(c))));
                }
                Ok(item) => {
                    if let StreamItem::Chunk(c) = &item {
                        finishes.note(c);
                    }
                    out.push_back(Ok(item));
                }
                Err(f) => {
                    failed = true;
                    out.push_back(Err(f));
                }
            }
        });
        if let Err(f) = parsed {
            out.push_back(Err(f));
            failed = true;
        }
        self.failed = failed;
    }

    fn ended_cleanly(&mut self) -> bool {
        // No terminator (`[DONE]`, `message_stop`) came, but the body
        // ended at an event's end after every choice that started sent
        // its finish reason: the answer is complete.
        !self.failed && self.parser.is_between_events() && self.finishes.all_finished()
    }
}

/// Which choices of a stream have started, and which of them have sent
/// their finish reason: the proof that a stream whose body ends cleanly
/// without its terminator is complete.
#[derive(Debug, Default)]
struct Finishes {
    /// Choice index → finished.
    choices: std::collections::BTreeMap<u32, bool>,
    /// How many started choices have no finish reason yet.
    open: usize,
}

impl Finishes {
    /// Notes a decoded chunk: any chunk but a usage-only one (a choice
    /// index of 0 by default) starts its choice; a finish reason ends it.
    fn note(&mut self, chunk: &ChatChunk) {
        let finished = chunk.finish_reason.is_some();
        if !finished && chunk.text.is_none() && chunk.tool_call.is_none() {
            return;
        }
        match self.choices.entry(chunk.index) {
            std::collections::btree_map::Entry::Vacant(v) => {
                v.insert(finished);
                self.open += usize::from(!finished);
            }
            std::collections::btree_map::Entry::Occupied(mut o) => {
                if finished && !*o.get() {
                    o.insert(true);
                    self.open -= 1;
                }
            }
        }
    }

    /// `true` when at least one choice started and every one that did has
    /// sent its finish reason.
    fn all_finished(&self) -> bool {
        !self.choices.is_empty() && self.open == 0
    }
}

/// What a committed stream is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Chunks flow.
    Open,
    /// The terminator came: the stream ends at the next poll.
    Terminated,
    /// Ended (cleanly or with the terminal error).
    Finished,
}

/// An open provider stream: the body, its decoder, and after the commit
/// point the idle timer.
pub(crate) struct Live<B, W> {
    body: Option<Pin<Box<B>>>,
    wire: W,
    queue: VecDeque<Result<StreamItem, Failure>>,
    preamble: Option<ChatChunk>,
    first: Option<ChatChunk>,
    phase: Phase,
    provider: &'static str,
    idle: Duration,
    deadline: Option<Instant>,
    timer: Option<Pin<Box<Sleep>>>,
    armed: bool,
    report: Option<Report>,
}

/// The GenAI metrics of a committed stream, recorded once when it ends.
struct Report {
    metrics: GenAiMetrics,
    model: std::sync::Arc<str>,
    started: Instant,
    usage: Usage,
}

impl Report {
    fn record(self, provider: &'static str, result: Result<(), &Failure>) {
        let duration = self.started.elapsed();
        let result = result.map(|()| &self.usage);
        self.metrics
            .record_chat(provider, &self.model, duration, result);
    }
}

impl<B, W> Live<B, W>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    W: Wire,
{
    fn new(
        body: B,
        wire: W,
        provider: &'static str,
        idle: Duration,
        deadline: Option<Instant>,
    ) -> Self {
        Live {
            body: Some(Box::pin(body)),
            wire,
            queue: VecDeque::new(),
            preamble: None,
            first: None,
            phase: Phase::Open,
            provider,
            idle,
            deadline,
            timer: None,
            armed: false,
            report: None,
        }
    }

    /// Records the stream's metrics (once) as it ends.
    fn report(&mut self, result: Result<(), &Failure>) {
        if let Some(report) = self.report.take() {
            report.record(self.provider, result);
        }
    }

    /// The next decoded item; `None` at the end of the body without a
    /// clean end.
    fn poll_raw(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<StreamItem, Failure>>> {
        loop {
            match self.queue.pop_front() {
                Some(Ok(StreamItem::Chunks(chunks))) => {
                    for chunk in chunks.into_iter().rev() {
                        self.queue.push_front(Ok(StreamItem::Chunk(chunk)));
                    }
                    continue;
                }
                Some(item) => {
                    return Poll::Ready(Some(item.map_err(|f| f.with_provider(self.provider))));
                }
                None => {}
            }
            let Some(body) = self.body.as_mut() else {
                return Poll::Ready(None);
            };
            match ready!(body.as_mut().poll_frame(cx)) {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.wire.feed(&data, &mut self.queue);
                    }
                }
                Some(Err(e)) => {
                    self.body = None;
                    return Poll::Ready(Some(Err(Failure::new(FailureClass::Transient)
                        .with_provider(self.provider)
                        .with_message("the stream broke off")
                        .with_source(e))));
                }
                None => {
                    self.body = None;
                    if self.wire.ended_cleanly() {
                        return Poll::Ready(Some(Ok(StreamItem::Done)));
                    }
                    return Poll::Ready(None);
                }
            }
        }
    }

    /// Reads up to the first content frame (the commit point).
    async fn peek(mut self) -> Result<Self, Failure> {
        loop {
            let item = std::future::poll_fn(|cx| self.poll_raw(cx)).await;
            match item {
                Some(Ok(StreamItem::Chunk(chunk))) => {
                    if is_content(&chunk) {
                        self.first = Some(chunk);
                        return Ok(self);
                    }
                    if chunk.finish_reason.is_some() || chunk.usage.is_some() {
                        merge(&mut self.preamble, chunk);
                    }
                }
                // (`Chunks` never leaves `poll_raw`.)
                Some(Ok(StreamItem::Skip | StreamItem::Chunks(_))) => {}
                Some(Ok(StreamItem::Done)) => {
                    // A complete answer with no content (for example a
                    // content filter's stop) is still an answer.
                    if self
                        .preamble
                        .as_ref()
                        .is_some_and(|p| p.finish_reason.is_some())
                    {
                        self.phase = Phase::Terminated;
                        return Ok(self);
                    }
                    return Err(self.empty("the stream ended before any content"));
                }
                Some(Err(f)) => return Err(f),
                None => return Err(self.empty("the stream ended before any content")),
            }
        }
    }

    /// Keeps the usage counts a chunk reports, for the metrics.
    fn note_usage(&mut self, chunk: &ChatChunk) {
        if let (Some(report), Some(u)) = (self.report.as_mut(), chunk.usage) {
            let total = &mut report.usage;
            if u.prompt_tokens > 0 {
                total.prompt_tokens = u.prompt_tokens;
            }
            if u.completion_tokens > 0 {
                total.completion_tokens = u.completion_tokens;
            }
            if u.cached_input_tokens > 0 {
                total.cached_input_tokens = u.cached_input_tokens;
            }
        }
    }

    fn empty(&self, message: &'static str) -> Failure {
        Failure::new(FailureClass::Transient)
            .with_provider(self.provider)
            .with_message(message)
    }

    /// Ends the stream with `failure`.
    fn fail(&mut self, failure: Failure) -> Poll<Option<Result<ChatChunk, Failure>>> {
        self.report(Err(&failure));
        self.phase = Phase::Finished;
        self.body = None;
        self.timer = None;
        Poll::Ready(Some(Err(failure)))
    }
}

impl<B, W> Stream for Live<B, W>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    W: Wire + Unpin,
{
    type Item = Result<ChatChunk, Failure>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if let Some(chunk) = this.preamble.take().or_else(|| this.first.take()) {
            this.note_usage(&chunk);
            return Poll::Ready(Some(Ok(chunk)));
        }
        match this.phase {
            Phase::Finished => return Poll::Ready(None),
            Phase::Terminated => return this.end_at_terminator(cx),
            Phase::Open => {}
        }
        // The deadline ends the stream even while chunks keep coming.
        if this.deadline.is_some_and(|d| Instant::now() >= d) {
            let failure = Failure::deadline_exceeded().with_provider(this.provider);
            return this.fail(failure);
        }
        loop {
            match this.poll_raw(cx) {
                Poll::Ready(Some(Ok(StreamItem::Chunk(chunk)))) => {
                    this.armed = false;
                    this.note_usage(&chunk);
                    return Poll::Ready(Some(Ok(chunk)));
                }
                Poll::Ready(Some(Ok(StreamItem::Skip | StreamItem::Chunks(_)))) => {}
                Poll::Ready(Some(Ok(StreamItem::Done))) => {
                    this.report(Ok(()));
                    return this.end_at_terminator(cx);
                }
                Poll::Ready(Some(Err(f))) => return this.fail(f),
                Poll::Ready(None) => {
                    let f = Failure::new(FailureClass::Transient)
                        .with_provider(this.provider)
                        .with_message("the stream ended without its terminator");
                    return this.fail(f);
                }
                Poll::Pending => break,
            }
        }
        // Nothing to hand on: the idle window runs from here (a caller
        // that reads slowly is not a stalled upstream).
        ready!(this.poll_idle(cx));
        let at_deadline = this
            .deadline
            .is_some_and(|d| this.timer.as_ref().is_some_and(|t| d <= t.deadline()));
        let failure = if at_deadline {
            Failure::deadline_exceeded().with_provider(this.provider)
        } else {
            Failure::new(FailureClass::Timeout)
                .with_provider(this.provider)
                .with_message(format!("no chunk within the {:?} idle timeout", this.idle))
        };
        this.fail(failure)
    }
}

impl<B, W> Live<B, W>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    W: Wire,
{
    /// Arms the idle timer (once per quiet spell: `min(now + idle,
    /// deadline)`) and polls it; ready when it fires.
    fn poll_idle(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if !self.armed {
            self.armed = true;
            let now = Instant::now();
            let mut until = now
                .checked_add(self.idle)
                .unwrap_or_else(|| far_future(now));
            if let Some(deadline) = self.deadline {
                until = until.min(deadline);
            }
            match self.timer.as_mut() {
                Some(timer) => timer.as_mut().reset(until),
                None => self.timer = Some(Box::pin(tokio::time::sleep_until(until))),
            }
        }
        match self.timer.as_mut() {
            Some(timer) => timer.as_mut().poll(cx),
            None => Poll::Pending,
        }
    }

    /// At the terminator: ends the stream now, handing what is left of
    /// the body to [`release`].
    fn end_at_terminator(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<ChatChunk, Failure>>> {
        if let Some(body) = self.body.take() {
            let now = Instant::now();
            // The drain never outlives the idle timeout, the deadline, or
            // DRAIN_TIME, whichever comes first.
            let mut until = now
                .checked_add(self.idle.min(DRAIN_TIME))
                .unwrap_or_else(|| far_future(now));
            if let Some(deadline) = self.deadline {
                until = until.min(deadline);
            }
            release(body, cx, until);
        }
        self.phase = Phase::Finished;
        self.timer = None;
        self.report(Ok(()));
        Poll::Ready(None)
    }
}

/// The rest of a body after its stream's terminator, read so that the
/// connection can go back to the pool (at most [`DRAIN_LIMIT`] bytes, until
/// `until`) without the consumer waiting for it: what is already there is
/// read now; if the body is not at its end yet, it is read on a task
/// spawned on the current tokio runtime, or dropped (closing the
/// connection) when there is none.
fn release<B>(mut body: Pin<Box<B>>, cx: &mut Context<'_>, until: Instant)
where
    B: Body<Data = Bytes> + Send + 'static,
{
    let mut budget = DRAIN_LIMIT;
    loop {
        if body.is_end_stream() {
            return;
        }
        match body.as_mut().poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                let len = frame.data_ref().map_or(0, Bytes::len);
                match budget.checked_sub(len) {
                    Some(left) => budget = left,
                    None => return,
                }
            }
            Poll::Ready(Some(Err(_)) | None) => return,
            Poll::Pending => break,
        }
    }
    if Instant::now() >= until {
        return;
    }
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(Drain {
            body,
            budget,
            timer: Box::pin(tokio::time::sleep_until(until)),
        });
    }
}

/// The background read of [`release`]: ends at the body's end, its error,
/// over the byte budget, or at the timer (dropping the body then closes the
/// connection).
struct Drain<B> {
    body: Pin<Box<B>>,
    budget: usize,
    timer: Pin<Box<Sleep>>,
}

impl<B: Body<Data = Bytes>> Future for Drain<B> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        loop {
            match this.body.as_mut().poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    let len = frame.data_ref().map_or(0, Bytes::len);
                    match this.budget.checked_sub(len) {
                        Some(left) => this.budget = left,
                        None => return Poll::Ready(()),
                    }
                }
                Poll::Ready(Some(Err(_)) | None) => return Poll::Ready(()),
                Poll::Pending => return this.timer.as_mut().poll(cx),
            }
        }
    }
}

/// The most read after a stream's terminator to let its connection be
/// reused (64 KiB); more, and the connection is closed instead.
const DRAIN_LIMIT: usize = 64 * 1024;

/// The longest the rest of a finished stream's body is read for.
const DRAIN_TIME: Duration = Duration::from_secs(5);

/// "Never" for a timeout too large for the clock: about 30 years.
fn far_future(now: Instant) -> Instant {
    now + Duration::from_secs(30 * 365 * 24 * 3600)
}

/// `true` for a chunk carrying content: text or a tool-call fragment.
fn is_content(chunk: &ChatChunk) -> bool {
    chunk.text.as_deref().is_some_and(|t| !t.is_empty()) || chunk.tool_call.is_some()
}

/// Folds a content-free chunk into the preamble (later fields win).
fn merge(preamble: &mut Option<ChatChunk>, chunk: ChatChunk) {
    match preamble {
        None => *preamble = Some(chunk),
        Some(p) => {
            p.index = chunk.index;
            if chunk.finish_reason.is_some() {
                p.finish_reason = chunk.finish_reason;
            }
            if chunk.usage.is_some() {
                p.usage = chunk.usage;
            }
        }
    }
}

/// What [`open`] needs besides the transport and the request.
pub(crate) struct Open<W, E> {
    pub(crate) wire: W,
    pub(crate) provider: &'static str,
    pub(crate) model: String,
    /// The `gen_ai.request.model` label (the link's configured model).
    pub(crate) metric_model: std::sync::Arc<str>,
    pub(crate) max_error_body: usize,
    pub(crate) timeouts: StreamTimeouts,
    pub(crate) deadline: Option<Deadline>,
    /// Classifies a non-2xx answer from its parts and body.
    pub(crate) error: E,
    pub(crate) metrics: GenAiMetrics,
}

/// Sends `req` and peeks to the commit point, all within the first-token
/// timeout and the call's deadline.
pub(crate) async fn open<T, B, W, E>(
    mut transport: T,
    req: http::Request<RequestBody>,
    open: Open<W, E>,
) -> Result<ChatStream, Failure>
where
    T: Service<http::Request<RequestBody>, Response = http::Response<B>>,
    T::Error: Into<BoxError>,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    W: Wire + Unpin,
    E: FnOnce(&http::response::Parts, &[u8]) -> Failure,
{
    let Open {
        wire,
        provider,
        model,
        metric_model,
        max_error_body,
        timeouts,
        deadline,
        error,
        metrics,
    } = open;
    let started = Instant::now();
    let deadline = deadline.map(Deadline::instant);
    let mut until = started
        .checked_add(timeouts.first_token)
        .unwrap_or_else(|| far_future(started));
    if let Some(d) = deadline {
        until = until.min(d);
    }
    let committed = tokio::time::timeout_at(until, async {
        let res = transport
            .call(req)
            .await
            .map_err(|e| Failure::from_error(e.into()).with_provider(provider))?;
        let (parts, body) = res.into_parts();
        if !parts.status.is_success() {
            let bytes = read_body(body, max_error_body)
                .await
                .map_err(|f| f.with_provider(provider))?;
            return Err(error(&parts, &bytes));
        }
        Live::new(body, wire, provider, timeouts.idle, deadline)
            .peek()
            .await
    })
    .await;
    let failure = match committed {
        Ok(Ok(mut live)) => {
            live.report = Some(Report {
                metrics,
                model: metric_model,
                started,
                usage: Usage::default(),
            });
            return Ok(
                ChatStream::new(provider, model, live).with_time_to_first_chunk(started.elapsed())
            );
        }
        Ok(Err(f)) => f,
        Err(_) if deadline.is_some_and(|d| d <= until) => {
            Failure::deadline_exceeded().with_provider(provider)
        }
        Err(_) => Failure::new(FailureClass::Timeout)
            .with_provider(provider)
            .with_message(format!(
                "no first content frame within the {:?} first-token timeout",
                timeouts.first_token
            )),
    };
    metrics.record_chat(provider, &metric_model, started.elapsed(), Err(&failure));
    Err(failure)
}
