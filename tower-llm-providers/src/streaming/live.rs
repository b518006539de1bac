//! An open stream: the peek to the commit point, the stream handed on
//! after it, its timeouts, and the drain of its body at the terminator.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use futures_core::Stream;
use http_body::Body;
use tokio::time::{Instant, Sleep};
use tower_llm_core::{
    BoxError, ChatChunk, ChatStream, Deadline, Failure, FailureClass, GenAiMetrics, Usage,
};
use tower_service::Service;

use super::learned::FirstTokenLimit;
use super::malformed::MalformedChunks;
use super::timeouts::StreamTimeouts;
use super::wire::Wire;
use crate::stream::StreamItem;
use crate::transport::{RequestBody, read_body};

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
    /// In skip mode (and when the wire can skip): the service's count of
    /// malformed events skipped.
    skipping: Option<Arc<AtomicU64>>,
    /// The wire's skip count already added to `skipping`.
    skipped: u64,
    /// Chunks handed on so far (where a skipped event is logged).
    handed: u64,
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
        mut wire: W,
        provider: &'static str,
        idle: Duration,
        deadline: Option<Instant>,
        skip: Option<Arc<AtomicU64>>,
    ) -> Self {
        let skipping = skip.filter(|_| wire.skip_malformed());
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
            skipping,
            skipped: 0,
            handed: 0,
        }
    }

    /// Counts the malformed events the wire skipped since the last look,
    /// logging the first of the stream.
    fn note_skipped(&mut self) {
        let Some(total) = self.skipping.as_ref() else {
            return;
        };
        let now = self.wire.skipped();
        if now <= self.skipped {
            return;
        }
        total.fetch_add(now - self.skipped, Ordering::Relaxed);
        if self.skipped == 0 {
            // Once per stream; never the event's text (it may echo
            // anything), only where it was.
            #[cfg(feature = "otel")]
            tracing::warn!(
                provider = self.provider,
                class = FailureClass::InvalidResponse.as_metric_label(),
                chunks_before = self.handed,
                "skipped a malformed stream event (logged once per stream)"
            );
        }
        self.skipped = now;
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
                        self.note_skipped();
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
    W: Wire,
{
    type Item = Result<ChatChunk, Failure>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if let Some(chunk) = this.preamble.take().or_else(|| this.first.take()) {
            this.note_usage(&chunk);
            this.handed += 1;
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
                    this.handed += 1;
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
    /// The learned first-token limit, if any.
    pub(crate) learned: Option<FirstTokenLimit>,
    /// The most time from sending to the response head, if limited.
    pub(crate) head_timeout: Option<Duration>,
    /// What a malformed event after the commit point does.
    pub(crate) malformed: MalformedChunks,
    /// The service's count of malformed events skipped.
    pub(crate) skipped: Arc<AtomicU64>,
    pub(crate) deadline: Option<Deadline>,
    /// Classifies a non-2xx answer from its parts and body.
    pub(crate) error: E,
    pub(crate) metrics: GenAiMetrics,
}

/// Sends `req` and peeks to the commit point, all within the first-token
/// limit (fixed or learned) and the call's deadline, the response head
/// within the head timeout.
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
    W: Wire,
    E: FnOnce(&http::response::Parts, &[u8]) -> Failure,
{
    let Open {
        wire,
        provider,
        model,
        metric_model,
        max_error_body,
        timeouts,
        learned,
        head_timeout,
        malformed,
        skipped,
        deadline,
        error,
        metrics,
    } = open;
    let started = Instant::now();
    let deadline = deadline.map(Deadline::instant);
    // The learned limit once it has learned enough, else the fixed one.
    let (first_token, is_learned) = match &learned {
        Some(l) if l.learned().is_some() => (l.limit(timeouts.first_token), true),
        _ => (timeouts.first_token, false),
    };
    let mut until = started
        .checked_add(first_token)
        .unwrap_or_else(|| far_future(started));
    if let Some(d) = deadline {
        until = until.min(d);
    }
    let skip = (malformed == MalformedChunks::Skip).then_some(skipped);
    let committed = tokio::time::timeout_at(until, async {
        let res = crate::transport::send(&mut transport, req, head_timeout, provider).await?;
        let (parts, body) = res.into_parts();
        if !parts.status.is_success() {
            let bytes = read_body(body, max_error_body)
                .await
                .map_err(|f| f.with_provider(provider))?;
            return Err(error(&parts, &bytes));
        }
        Live::new(body, wire, provider, timeouts.idle, deadline, skip)
            .peek()
            .await
    })
    .await;
    let failure = match committed {
        Ok(Ok(mut live)) => {
            let time_to_first_token = started.elapsed();
            if let (Some(limit), true) = (&learned, live.first.is_some()) {
                limit.record(time_to_first_token);
            }
            live.report = Some(Report {
                metrics,
                model: metric_model,
                started,
                usage: Usage::default(),
            });
            return Ok(ChatStream::new(provider, model, live)
                .with_time_to_first_chunk(time_to_first_token));
        }
        Ok(Err(f)) => f,
        Err(_) if deadline.is_some_and(|d| d <= until) => {
            Failure::deadline_exceeded().with_provider(provider)
        }
        Err(_) => {
            if let Some(limit) = &learned {
                // The stream would have taken at least this long: what
                // lets the learned limit grow back when the link slows.
                limit.record(first_token);
            }
            let which = if is_learned {
                "learned first-token limit"
            } else {
                "first-token timeout"
            };
            Failure::new(FailureClass::Timeout)
                .with_provider(provider)
                .with_message(format!(
                    "no first content frame within the {first_token:?} {which}"
                ))
        }
    };
    metrics.record_chat(provider, &metric_model, started.elapsed(), Err(&failure));
    Err(failure)
}
