//! The client stream of a resumable call: the first piece's chunks, then
//! each continuation's, spliced with no duplicated and no missing text.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use futures_core::Stream;
use tower_llm_core::layer::Bounded;
use tower_llm_core::{
    Budget, ChatChunk, ChatRequest, ChatStream, ChunkStream, Continuation, Continued,
    ContinuedPiece, Deadline, Failure, FailureClass, LlmRequest, Tenant, Usage,
};
use tower_service::Service;

use crate::ResumeConfig;
use crate::class::is_resumable;
use crate::overlap::Overlap;

/// What a continuation request is made from: a copy of the original
/// request without its carrier, and the carrier's values a continuation
/// keeps.
///
/// A continuation is a call of its own through the chain: it gets a
/// fresh carrier with the original call's deadline (it never extends
/// it), cost budget and tenant, and no attempt log, so the chain inside
/// owns it and its records come back on its own stream (the original
/// call's owner has finished by then: it ended at the commit point). Its
/// idempotency key is not kept: a continuation is a different request,
/// which must not be answered with the stored answer of the first.
#[derive(Debug)]
pub(crate) struct Pristine {
    request: ChatRequest,
    deadline: Option<Deadline>,
    budget: Option<Budget>,
    tenant: Option<Tenant>,
}

impl Pristine {
    /// The copy of `req`, unless it may be sent only once.
    pub(crate) fn of(req: &mut ChatRequest) -> Option<Self> {
        if !req.is_replayable() {
            return None;
        }
        Some(Pristine {
            deadline: Deadline::of(req),
            budget: Budget::of(req).cloned(),
            tenant: Tenant::of(req).cloned(),
            request: req.copy_without_call(),
        })
    }

    /// `true` while the call's deadline has time left (or it has none).
    fn has_time(&self) -> bool {
        self.deadline.is_none_or(|d| !d.is_expired())
    }

    /// The continuation request after `sent`.
    fn continuation(&self, sent: &str) -> ChatRequest {
        let mut req = self.request.clone();
        Continuation::new(sent).store(&mut req);
        if let Some(deadline) = self.deadline {
            deadline.store(&mut req);
        }
        if let Some(budget) = &self.budget {
            budget.clone().store(&mut req);
        }
        if let Some(tenant) = &self.tenant {
            tenant.clone().store(&mut req);
        }
        req
    }
}

/// The most chunks of a continuation's head held while its repeat is
/// decided (text-less chunks do not bring the decision closer).
const MAX_HELD_CHUNKS: usize = 256;

/// The call that makes a continuation's stream.
type Next = Pin<Box<dyn Future<Output = Result<ChatStream, Failure>> + Send>>;

/// The spliced stream (see [`ResumeLayer`](crate::ResumeLayer)).
pub(crate) struct Splice<S> {
    /// The piece being read.
    piece: ChunkStream,
    /// A continuation being made (its stream not committed yet).
    next: Option<Next>,
    service: S,
    pristine: Pristine,
    config: ResumeConfig,
    continued: Continued,
    /// Continuations made.
    made: u8,
    /// The first choice's text sent to the client (while resumable).
    sent: String,
    /// `false` once the stream cannot be continued: it sent another
    /// choice or a tool-call fragment, or more text than
    /// `max_partial_bytes`.
    resumable: bool,
    /// Deciding how much of a continuation's head repeats what was sent.
    overlap: Option<Overlap>,
    /// The continuation's chunks held while that is decided.
    held: VecDeque<ChatChunk>,
    /// Chunks decided and not yet handed out.
    out: VecDeque<ChatChunk>,
    /// The usage of the pieces before this one, and this one's so far.
    before: Usage,
    usage: Usage,
    /// The class of the failure the current continuation follows.
    cause: FailureClass,
    done: bool,
}

impl<S> Splice<S>
where
    S: Service<ChatRequest, Response = ChatStream> + Clone + Send + 'static,
    S::Error: Into<tower_llm_core::BoxError> + 'static,
    S::Future: Send + 'static,
{
    pub(crate) fn new(
        first: ChunkStream,
        service: S,
        pristine: Pristine,
        config: ResumeConfig,
        continued: Continued,
    ) -> Self {
        Splice {
            piece: first,
            next: None,
            service,
            pristine,
            config,
            continued,
            made: 0,
            sent: String::new(),
            resumable: true,
            overlap: None,
            held: VecDeque::new(),
            out: VecDeque::new(),
            before: Usage::default(),
            usage: Usage::default(),
            cause: FailureClass::Transient,
            done: false,
        }
    }

    /// Whether the stream that just failed with `failure` is continued.
    fn continues_after(&self, failure: &Failure) -> bool {
        self.resumable
            && is_resumable(failure.class())
            && self.made < self.config.max_continuations
            && self.pristine.has_time()
    }

    /// Sends the continuation request through a clone of the service.
    fn start_next(&mut self, cause: FailureClass) {
        self.made += 1;
        self.cause = cause;
        self.before = add(self.before, self.usage);
        self.usage = Usage::default();
        let req = self.pristine.continuation(&self.sent);
        let mut service = self.service.clone();
        let deadline = self.pristine.deadline;
        self.next = Some(Box::pin(async move {
            let call = async move {
                std::future::poll_fn(|cx| service.poll_ready(cx))
                    .await
                    .map_err(Failure::from_inner)?;
                service.call(req).await.map_err(Failure::from_inner)
            };
            match deadline {
                Some(d) => Bounded::new(call, d.instant())
                    .await
                    .unwrap_or_else(|| Err(Failure::deadline_exceeded())),
                None => call.await,
            }
        }));
    }

    /// Moves the held chunks out, without the first `repeat` bytes of
    /// their text.
    fn release(&mut self, mut repeat: usize) {
        while let Some(mut chunk) = self.held.pop_front() {
            if repeat > 0 && chunk.index == 0 {
                if let Some(text) = chunk.text.as_mut() {
                    let cut = repeat.min(text.len());
                    // The repeat ends at a character boundary (it is a
                    // whole suffix of valid text); keep the text if not.
                    if text.is_char_boundary(cut) {
                        text.drain(..cut);
                        repeat -= cut;
                    } else {
                        repeat = 0;
                    }
                }
                if chunk.text.as_deref() == Some("") {
                    chunk.text = None;
                    if chunk.tool_call.is_none()
                        && chunk.finish_reason.is_none()
                        && chunk.usage.is_none()
                    {
                        continue;
                    }
                }
            }
            self.out.push_back(chunk);
        }
    }

    /// A chunk on its way to the client: its text is noted and its usage
    /// made the sum of the pieces'.
    fn emit(&mut self, mut chunk: ChatChunk) -> ChatChunk {
        if chunk.index != 0 || chunk.tool_call.is_some() {
            self.stop_tracking();
        } else if let Some(text) = &chunk.text {
            if self.resumable {
                if self.sent.len() + text.len() > self.config.max_partial_bytes {
                    self.stop_tracking();
                } else {
                    self.sent.push_str(text);
                }
            }
        }
        if let Some(u) = chunk.usage {
            merge_usage(&mut self.usage, u);
            if self.made > 0 {
                chunk.usage = Some(add(self.before, self.usage));
            }
        }
        chunk
    }

    fn stop_tracking(&mut self) {
        self.resumable = false;
        self.sent = String::new();
    }
}

// The service is never pinned: it is only cloned.
impl<S> Unpin for Splice<S> {}

impl<S> Stream for Splice<S>
where
    S: Service<ChatRequest, Response = ChatStream> + Clone + Send + 'static,
    S::Error: Into<tower_llm_core::BoxError> + 'static,
    S::Future: Send + 'static,
{
    type Item = Result<ChatChunk, Failure>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            if let Some(chunk) = this.out.pop_front() {
                return Poll::Ready(Some(Ok(this.emit(chunk))));
            }
            if this.done {
                return Poll::Ready(None);
            }
            if let Some(next) = this.next.as_mut() {
                match ready!(next.as_mut().poll(cx)) {
                    Ok(stream) => {
                        this.next = None;
                        this.continued
                            .record(ContinuedPiece::of(&stream, this.cause));
                        this.piece = Box::pin(stream);
                        this.overlap = Some(Overlap::new(&this.sent));
                    }
                    Err(failure) => {
                        this.next = None;
                        this.done = true;
                        return Poll::Ready(Some(Err(failure)));
                    }
                }
            }
            match ready!(this.piece.as_mut().poll_next(cx)) {
                Some(Ok(chunk)) => {
                    let Some(overlap) = this.overlap.as_mut() else {
                        return Poll::Ready(Some(Ok(this.emit(chunk))));
                    };
                    let text = chunk.text.as_deref().filter(|_| chunk.index == 0);
                    let decided = text.and_then(|t| overlap.feed(t));
                    // Anything but the first choice's text ends its head.
                    let ends_head = chunk.index != 0
                        || chunk.tool_call.is_some()
                        || chunk.finish_reason.is_some();
                    // Chunks that carry no text (usage, empty deltas) are
                    // held too, up to a count: then it is decided with the
                    // text so far.
                    let decided = match decided {
                        None if ends_head || this.held.len() + 1 >= MAX_HELD_CHUNKS => {
                            Some(overlap.finish())
                        }
                        d => d,
                    };
                    this.held.push_back(chunk);
                    if let Some(repeat) = decided {
                        this.overlap = None;
                        this.release(repeat);
                    }
                }
                Some(Err(failure)) => {
                    // Held chunks were never sent: the next continuation
                    // starts after the same text.
                    this.held.clear();
                    this.overlap = None;
                    if this.continues_after(&failure) {
                        this.start_next(failure.class());
                        continue;
                    }
                    this.done = true;
                    return Poll::Ready(Some(Err(failure)));
                }
                None => {
                    if let Some(overlap) = this.overlap.take() {
                        let repeat = overlap.finish();
                        this.release(repeat);
                    }
                    this.done = true;
                }
            }
        }
    }
}

/// Keeps every count a provider reported (Anthropic sends the input tokens
/// first and the output tokens last), as [`ChatStream`] does when it
/// collects.
fn merge_usage(into: &mut Usage, u: Usage) {
    if u.prompt_tokens > 0 {
        into.prompt_tokens = u.prompt_tokens;
    }
    if u.completion_tokens > 0 {
        into.completion_tokens = u.completion_tokens;
    }
    if u.cached_input_tokens > 0 {
        into.cached_input_tokens = u.cached_input_tokens;
    }
}

/// `a + b`, field by field, saturating.
fn add(a: Usage, b: Usage) -> Usage {
    Usage {
        prompt_tokens: a.prompt_tokens.saturating_add(b.prompt_tokens),
        completion_tokens: a.completion_tokens.saturating_add(b.completion_tokens),
        cached_input_tokens: a.cached_input_tokens.saturating_add(b.cached_input_tokens),
    }
}
