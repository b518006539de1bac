//! [`ChatStream`]: a streamed chat answer, as the streaming provider
//! services return it, and [`Continued`]: how often it was continued
//! after it broke.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::fmt;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_core::Stream;

use crate::{
    AttemptRecord, CacheOutcome, ChatChunk, ChatResponse, Choice, Failure, FailureClass,
    FinishReason, Link, RecordsAttempts, ToolCall, Usage,
};

/// The boxed chunk stream inside a [`ChatStream`].
pub type ChunkStream = Pin<Box<dyn Stream<Item = Result<ChatChunk, Failure>> + Send>>;

/// A streamed chat answer: a [`Stream`] of normalised [`ChatChunk`]s.
///
/// # The commit point
///
/// A streaming service returns its `ChatStream` only once the provider has
/// sent the first content frame (text or a tool-call fragment). Everything
/// that goes wrong before that (an HTTP error, an in-band error event, an
/// empty stream, no first frame within the first-token timeout) is an
/// ordinary `Err` from the service, which retry, breaker and fallback treat
/// exactly like a failed unary call. Once a `ChatStream` exists, the call
/// is committed: nothing retries it and no other link replaces it. That
/// is the default; recovery after the commit point is an explicit choice
/// (`tower-llm-resume`: a continuation spliced into the same stream,
/// counted by [`continuations`](Self::continuations)).
///
/// # Items
///
/// `Ok` chunks in the provider's order, then either the end of the stream
/// (the provider sent its terminator, or its body ended cleanly after the
/// finish reason) or **one** `Err` carrying the failure class (a
/// mid-stream error event, a connection that broke off, a stall longer
/// than the idle timeout, the call's deadline, a stream whose body ended
/// before its finish reason), after which the stream ends. Failures after
/// the commit point are never seen by the breaker.
///
/// Dropping a `ChatStream` drops the upstream response body, which closes
/// the upstream connection.
///
/// ```
/// use tower_llm_core::{ChatChunk, ChatStream};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let chunk = |t: &str| Ok(ChatChunk { text: Some(t.into()), ..ChatChunk::default() });
/// let stream = ChatStream::from_chunks("mock", "m", vec![chunk("Hel"), chunk("lo")]);
/// let answer = stream.collect_response().await.unwrap();
/// assert_eq!(answer.text(), "Hello");
/// # }
/// ```
pub struct ChatStream {
    inner: ChunkStream,
    provider: Arc<str>,
    model: String,
    time_to_first_chunk: Duration,
    fallback_position: u8,
    degraded: bool,
    idempotent_replayed: bool,
    attempts: Vec<AttemptRecord>,
    /// Set by a layer that may continue the stream after it breaks.
    continued: Option<Continued>,
    /// Set by a response cache.
    cache: Option<CacheOutcome>,
}

impl ChatStream {
    /// A stream of `chunks` from `provider`'s `model`.
    pub fn new<S>(provider: impl Into<Arc<str>>, model: impl Into<String>, chunks: S) -> Self
    where
        S: Stream<Item = Result<ChatChunk, Failure>> + Send + 'static,
    {
        ChatStream {
            inner: Box::pin(chunks),
            provider: provider.into(),
            model: model.into(),
            time_to_first_chunk: Duration::ZERO,
            fallback_position: 0,
            degraded: false,
            idempotent_replayed: false,
            attempts: Vec::new(),
            continued: None,
            cache: None,
        }
    }

    /// A stream replaying `chunks` stored from an earlier call (an
    /// idempotency layer's replay): it carries that call's `attempts` and
    /// fallback position, and says it is a replay. `chunks` is any
    /// iterator of chunk results (an `Err` ends the replay with that
    /// error), consumed one item at a time as the stream is polled, so a
    /// store can decode its compact form lazily; a `Vec<ChatChunk>` is
    /// `chunks.into_iter().map(Ok)`.
    pub fn replayed<I>(
        provider: impl Into<Arc<str>>,
        model: impl Into<String>,
        chunks: I,
        fallback_position: u8,
        attempts: Vec<AttemptRecord>,
    ) -> Self
    where
        I: IntoIterator<Item = Result<ChatChunk, Failure>>,
        I::IntoIter: Send + Unpin + 'static,
    {
        let mut stream = ChatStream::new(provider, model, Lazy(chunks.into_iter()));
        stream.fallback_position = fallback_position;
        stream.idempotent_replayed = true;
        stream.attempts = attempts;
        stream
    }

    /// A stream of `chunks` from `provider`'s `model`, consumed one item at
    /// a time as the stream is polled (a store decoding its compact form
    /// lazily, a response cache replaying a stored stream). An `Err` ends
    /// the stream with that error.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use tower_llm_core::{ChatChunk, ChatStream};
    ///
    /// let chunks = ["Hel", "lo"].map(|t| Ok(ChatChunk { text: Some(t.into()), ..ChatChunk::default() }));
    /// let stream = ChatStream::from_iter("openai", "m", chunks);
    /// assert!(!stream.is_idempotent_replay());
    /// assert_eq!(stream.collect_response().await.unwrap().text(), "Hello");
    /// # }
    /// ```
    pub fn from_iter<I>(provider: impl Into<Arc<str>>, model: impl Into<String>, chunks: I) -> Self
    where
        I: IntoIterator<Item = Result<ChatChunk, Failure>>,
        I::IntoIter: Send + Unpin + 'static,
    {
        ChatStream::new(provider, model, Lazy(chunks.into_iter()))
    }

    /// The same stream with its chunks passed through `f` (to observe or
    /// collect them as they pass); everything else is kept.
    #[must_use]
    pub fn map_chunks(mut self, f: impl FnOnce(ChunkStream) -> ChunkStream) -> Self {
        self.wrap_chunks(f);
        self
    }

    /// [`map_chunks`](Self::map_chunks) in place.
    pub fn wrap_chunks(&mut self, f: impl FnOnce(ChunkStream) -> ChunkStream) {
        let inner = std::mem::replace(&mut self.inner, Box::pin(Iter(Vec::new().into_iter())));
        self.inner = f(inner);
    }

    /// `true` when an idempotency layer replayed this stream from a stored
    /// one ([`ChatStream::replayed`]).
    pub fn is_idempotent_replay(&self) -> bool {
        self.idempotent_replayed
    }

    /// A stream playing `items` (for tests and degraded answers).
    pub fn from_chunks(
        provider: impl Into<Arc<str>>,
        model: impl Into<String>,
        items: Vec<Result<ChatChunk, Failure>>,
    ) -> Self {
        ChatStream::new(provider, model, Iter(items.into_iter()))
    }

    /// Sets the time from sending the request to the first content frame.
    #[must_use]
    pub fn with_time_to_first_chunk(mut self, ttfc: Duration) -> Self {
        self.time_to_first_chunk = ttfc;
        self
    }

    /// The provider that is streaming (for example `"anthropic"`).
    pub fn provider(&self) -> &str {
        &self.provider
    }

    /// The provider, shared.
    pub(crate) fn provider_arc(&self) -> &Arc<str> {
        &self.provider
    }

    /// The model that is streaming.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// Time from sending the request to the first content frame (the
    /// commit point).
    pub fn time_to_first_chunk(&self) -> Duration {
        self.time_to_first_chunk
    }

    /// Position in the fallback chain of the link that serves (0 = primary).
    pub fn fallback_position(&self) -> u8 {
        self.fallback_position
    }

    /// `true` when the fallback layer's degraded step built this answer.
    pub fn is_degraded(&self) -> bool {
        self.degraded
    }

    /// Every attempt the call made up to the commit point. For a stream
    /// that was continued after it broke, the first piece's: each
    /// continuation's are in its [`continuations`](Self::continuations).
    pub fn attempts(&self) -> &[AttemptRecord] {
        &self.attempts
    }

    /// How often this stream was continued after it broke, so far, and
    /// what served each continuation: a handle to read during or after
    /// the stream's consumption (keep a clone before handing the stream
    /// on). By default nothing continues a stream after its commit point
    /// and the handle reads 0; a layer that opts in to recovery
    /// (`tower-llm-resume`) attaches its own with
    /// [`with_continuations`](Self::with_continuations). See
    /// [`Continued`].
    ///
    /// ```
    /// use tower_llm_core::{ChatStream, Continued};
    ///
    /// let stream = ChatStream::from_chunks("openai", "m", vec![]);
    /// assert_eq!(stream.continuations().count(), 0);
    /// let stream = stream.with_continuations(Continued::new());
    /// assert!(stream.continuations().is_enabled());
    /// ```
    pub fn continuations(&self) -> Continued {
        self.continued.clone().unwrap_or(Continued::NONE)
    }

    /// Attaches the handle through which a layer that may continue this
    /// stream after it breaks reports each continuation (see
    /// [`continuations`](Self::continuations)).
    #[must_use]
    pub fn with_continuations(mut self, continued: Continued) -> Self {
        self.continued = Some(continued);
        self
    }

    /// What a response cache did for this stream (`None`: no cache on
    /// the route; see [`CacheOutcome`]).
    pub fn cache_outcome(&self) -> Option<CacheOutcome> {
        self.cache
    }

    /// Marks what a response cache did for this stream (the cache layer
    /// does).
    ///
    /// ```
    /// use tower_llm_core::{CacheOutcome, ChatStream};
    ///
    /// let stream = ChatStream::from_chunks("openai", "m", vec![]);
    /// assert_eq!(stream.cache_outcome(), None);
    /// let stream = stream.with_cache_outcome(CacheOutcome::MISS);
    /// assert_eq!(stream.cache_outcome(), Some(CacheOutcome::MISS));
    /// ```
    #[must_use]
    pub fn with_cache_outcome(mut self, outcome: CacheOutcome) -> Self {
        self.cache = Some(outcome);
        self
    }

    /// Reads the whole stream into one [`ChatResponse`]: text joined per
    /// choice, tool-call fragments joined by their index, the last finish
    /// reason and usage. (The response id is empty: streams carry none in
    /// a provider-neutral place.)
    ///
    /// # Errors
    ///
    /// The stream's terminal error, if it ends with one.
    pub async fn collect_response(mut self) -> Result<ChatResponse, Failure> {
        let started = tokio::time::Instant::now();
        let mut joined = Joined::default();
        while let Some(item) = std::future::poll_fn(|cx| Pin::new(&mut self).poll_next(cx)).await {
            joined.push(item?);
        }
        let Joined { choices, usage, .. } = joined;
        Ok(ChatResponse {
            id: String::new(),
            model: self.model.clone(),
            provider: self.provider.clone(),
            fallback_position: self.fallback_position,
            degraded: self.degraded,
            idempotent_replayed: self.idempotent_replayed,
            cache: self.cache,
            choices,
            usage,
            latency: self.time_to_first_chunk + started.elapsed(),
            attempts: std::mem::take(&mut self.attempts),
        })
    }
}

/// The chunks of a stream joined into choices: text per choice, tool-call
/// fragments by their index, the last finish reason, the usage.
///
/// Both lookups (a chunk's choice, a fragment's call) go through an index
/// map, so joining is linear in the number of chunks whatever indices the
/// provider sends (a linear search per fragment was O(fragments × calls)).
#[derive(Default)]
struct Joined {
    choices: Vec<Choice>,
    /// Choice index → position in `choices`.
    choice_at: Slots,
    /// Per choice (same positions), call index → position in its calls.
    call_at: Vec<Slots>,
    usage: Usage,
}

impl Joined {
    fn push(&mut self, chunk: ChatChunk) {
        let (at, new) = self.choice_at.find_or_add(chunk.index, self.choices.len());
        if new {
            self.choices.push(Choice {
                index: chunk.index,
                text: String::new(),
                tool_calls: Vec::new(),
                finish_reason: FinishReason::Other,
            });
            self.call_at.push(Slots::default());
        }
        let choice = &mut self.choices[at];
        if let Some(text) = &chunk.text {
            choice.text.push_str(text);
        }
        if let Some(delta) = chunk.tool_call {
            // Fragments join the call with their index.
            let (k, new) = self.call_at[at].find_or_add(delta.index, choice.tool_calls.len());
            if new {
                choice.tool_calls.push(ToolCall {
                    id: delta.id.unwrap_or_default(),
                    name: delta.name.unwrap_or_default(),
                    arguments: delta.arguments,
                });
            } else {
                let call = &mut choice.tool_calls[k];
                if call.id.is_empty() {
                    call.id = delta.id.unwrap_or_default();
                }
                if call.name.is_empty() {
                    call.name = delta.name.unwrap_or_default();
                }
                call.arguments.push_str(&delta.arguments);
            }
        }
        if let Some(reason) = chunk.finish_reason {
            choice.finish_reason = reason;
        }
        if let Some(u) = chunk.usage {
            merge_usage(&mut self.usage, u);
        }
    }
}

/// Where each index seen so far went.
#[derive(Default)]
struct Slots {
    at: HashMap<u32, usize>,
    /// Lookups made, one per chunk or fragment (tests count the work).
    #[cfg(test)]
    probes: usize,
}

impl Slots {
    /// The position of `index`, or `next` (recorded) when it is new; `true`
    /// when new.
    fn find_or_add(&mut self, index: u32, next: usize) -> (usize, bool) {
        #[cfg(test)]
        {
            self.probes += 1;
        }
        match self.at.entry(index) {
            Entry::Occupied(e) => (*e.get(), false),
            Entry::Vacant(e) => (*e.insert(next), true),
        }
    }
}

/// Keeps every count a provider reported (Anthropic sends the input tokens
/// at the start and the output tokens at the end).
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

impl Stream for ChatStream {
    type Item = Result<ChatChunk, Failure>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.as_mut().poll_next(cx)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.inner.size_hint()
    }
}

impl RecordsAttempts for ChatStream {
    /// A replayed stream keeps the records of the call that produced it
    /// when the replaying call made no attempt.
    fn record_attempts(&mut self, attempts: Vec<AttemptRecord>) {
        if self.idempotent_replayed && attempts.is_empty() {
            return;
        }
        self.attempts = attempts;
    }

    fn record_served_by(&mut self, link: &Link) {
        self.fallback_position = link.position();
    }

    fn mark_degraded(&mut self) {
        self.degraded = true;
    }
}

impl fmt::Debug for ChatStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChatStream")
            .field("provider", &self.provider)
            .field("model", &self.model)
            .field("time_to_first_chunk", &self.time_to_first_chunk)
            .field("fallback_position", &self.fallback_position)
            .field("degraded", &self.degraded)
            .field("idempotent_replayed", &self.idempotent_replayed)
            .field("cache", &self.cache)
            .field("attempts", &self.attempts.len())
            .field(
                "continued",
                &self.continued.as_ref().map_or(0, Continued::count),
            )
            .finish_non_exhaustive()
    }
}

/// How often a stream was continued after it broke, and what served each
/// continuation: a cheap, cloneable handle, read during or after the
/// stream's consumption ([`ChatStream::continuations`]).
///
/// A stream that no layer may continue has a handle that always reads 0.
/// A layer that continues streams makes one with [`Continued::new`],
/// attaches it ([`ChatStream::with_continuations`]) and
/// [`record`](Continued::record)s each continuation as it starts; a
/// gateway reads [`count`](Continued::count) when the stream ends (the
/// OpenAI and Anthropic SSE writers of `tower-llm-providers` then write a
/// `: continued N` comment line).
///
/// The stream's own [`attempts`](ChatStream::attempts) are those of its
/// first piece; [`pieces`](Continued::pieces) has the rest, one per
/// continuation.
///
/// ```
/// use tower_llm_core::{ChatStream, Continued, ContinuedPiece, FailureClass};
///
/// let handle = Continued::new();
/// let stream = ChatStream::from_chunks("openai", "m", vec![]).with_continuations(handle.clone());
/// assert_eq!(stream.continuations().count(), 0);
/// // The layer that continues the stream, when it does:
/// let piece = ChatStream::from_chunks("anthropic", "claude", vec![]);
/// handle.record(ContinuedPiece::of(&piece, FailureClass::Transient));
/// let seen = stream.continuations();
/// assert_eq!(seen.count(), 1);
/// assert_eq!(seen.pieces()[0].provider(), "anthropic");
/// assert_eq!(seen.pieces()[0].cause(), FailureClass::Transient);
/// // A stream nothing may continue reads 0.
/// assert_eq!(ChatStream::from_chunks("openai", "m", vec![]).continuations().count(), 0);
/// ```
#[derive(Clone)]
pub struct Continued {
    shared: Option<Arc<Shared>>,
}

#[derive(Default)]
struct Shared {
    count: AtomicU32,
    pieces: Mutex<Vec<ContinuedPiece>>,
}

impl Continued {
    /// The handle of a stream nothing may continue: reads 0, records
    /// nothing.
    pub(crate) const NONE: Continued = Continued { shared: None };

    /// A fresh handle, for a layer that may continue a stream.
    pub fn new() -> Self {
        Continued {
            shared: Some(Arc::default()),
        }
    }

    /// The continuations made so far.
    pub fn count(&self) -> u32 {
        self.shared
            .as_ref()
            .map_or(0, |s| s.count.load(Ordering::Acquire))
    }

    /// Records one continuation (the layer that continues the stream
    /// does, when the continuation's stream has committed). Ignored by the
    /// handle of a stream nothing may continue.
    pub fn record(&self, piece: ContinuedPiece) {
        if let Some(shared) = &self.shared {
            // The lock is never held across an `.await`.
            shared
                .pieces
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(piece);
            shared.count.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// A copy of every continuation's piece so far, in order.
    pub fn pieces(&self) -> Vec<ContinuedPiece> {
        self.shared.as_ref().map_or_else(Vec::new, |s| {
            s.pieces
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone()
        })
    }

    /// `true` when a layer may continue the stream (the handle was made by
    /// [`Continued::new`]).
    pub fn is_enabled(&self) -> bool {
        self.shared.is_some()
    }
}

impl Default for Continued {
    /// A fresh handle ([`Continued::new`]).
    fn default() -> Self {
        Continued::new()
    }
}

impl fmt::Debug for Continued {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Continued")
            .field("enabled", &self.is_enabled())
            .field("count", &self.count())
            .finish()
    }
}

/// One continuation of a stream: what served it, why it was needed, and
/// the attempts its call made (a continuation is a call of its own
/// through the route's chain).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContinuedPiece {
    provider: Arc<str>,
    model: String,
    fallback_position: u8,
    time_to_first_chunk: Duration,
    cause: FailureClass,
    attempts: Vec<AttemptRecord>,
}

impl ContinuedPiece {
    /// The piece served by `stream` (its provider, model, fallback
    /// position, time to first chunk and attempt records), continuing
    /// after a failure of class `cause`.
    pub fn of(stream: &ChatStream, cause: FailureClass) -> Self {
        ContinuedPiece {
            provider: stream.provider_arc().clone(),
            model: stream.model().to_owned(),
            fallback_position: stream.fallback_position(),
            time_to_first_chunk: stream.time_to_first_chunk(),
            cause,
            attempts: stream.attempts().to_vec(),
        }
    }

    /// The provider that served the continuation.
    pub fn provider(&self) -> &str {
        &self.provider
    }

    /// The model that served the continuation.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// Position in the fallback chain of the link that served it.
    pub fn fallback_position(&self) -> u8 {
        self.fallback_position
    }

    /// Time from sending the continuation request to its first content
    /// frame.
    pub fn time_to_first_chunk(&self) -> Duration {
        self.time_to_first_chunk
    }

    /// The class of the failure that broke the stream before this piece.
    pub fn cause(&self) -> FailureClass {
        self.cause
    }

    /// The attempts of the continuation's call.
    pub fn attempts(&self) -> &[AttemptRecord] {
        &self.attempts
    }
}

/// A stream over a vector's items.
struct Iter(std::vec::IntoIter<Result<ChatChunk, Failure>>);

/// A stream of an iterator's items, taken one per poll.
struct Lazy<I>(I);

impl<I> Stream for Lazy<I>
where
    I: Iterator<Item = Result<ChatChunk, Failure>> + Unpin,
{
    type Item = Result<ChatChunk, Failure>;

    fn poll_next(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Poll::Ready(self.0.next())
    }
}

impl Stream for Iter {
    type Item = Result<ChatChunk, Failure>;

    fn poll_next(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Poll::Ready(self.0.next())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AttemptOutcome, ToolCallDelta};

    fn text(t: &str) -> Result<ChatChunk, Failure> {
        Ok(ChatChunk {
            text: Some(t.into()),
            ..ChatChunk::default()
        })
    }

    #[tokio::test]
    async fn collects_text_tool_calls_finish_and_usage() {
        let tool = |id: Option<&str>, args: &str| {
            Ok(ChatChunk {
                tool_call: Some(ToolCallDelta {
                    index: 0,
                    id: id.map(Into::into),
                    name: id.map(|_| "get_weather".into()),
                    arguments: args.into(),
                }),
                ..ChatChunk::default()
            })
        };
        let s = ChatStream::from_chunks(
            "anthropic",
            "claude",
            vec![
                Ok(ChatChunk {
                    usage: Some(Usage {
                        prompt_tokens: 25,
                        completion_tokens: 1,
                        cached_input_tokens: 0,
                    }),
                    ..ChatChunk::default()
                }),
                text("Let me "),
                text("check."),
                tool(Some("toolu_1"), ""),
                tool(None, "{\"city\":"),
                tool(None, "\"Paris\"}"),
                Ok(ChatChunk {
                    finish_reason: Some(FinishReason::ToolCalls),
                    usage: Some(Usage {
                        prompt_tokens: 0,
                        completion_tokens: 15,
                        cached_input_tokens: 0,
                    }),
                    ..ChatChunk::default()
                }),
            ],
        );
        let r = s.collect_response().await.expect("complete");
        assert_eq!(r.text(), "Let me check.");
        assert_eq!(r.choices[0].tool_calls.len(), 1);
        assert_eq!(r.choices[0].tool_calls[0].id, "toolu_1");
        assert_eq!(r.choices[0].tool_calls[0].arguments, "{\"city\":\"Paris\"}");
        assert_eq!(r.finish_reason(), Some(FinishReason::ToolCalls));
        assert_eq!((r.usage.prompt_tokens, r.usage.completion_tokens), (25, 15));
        assert_eq!(&*r.provider, "anthropic");
    }

    #[tokio::test]
    async fn interleaved_tool_call_fragments_join_their_own_call() {
        let frag = |index: u32, id: Option<&str>, args: &str| {
            Ok(ChatChunk {
                tool_call: Some(ToolCallDelta {
                    index,
                    id: id.map(Into::into),
                    name: id.map(|i| format!("tool_{i}")),
                    arguments: args.into(),
                }),
                ..ChatChunk::default()
            })
        };
        let s = ChatStream::from_chunks(
            "openai",
            "m",
            vec![
                frag(0, Some("a"), ""),
                frag(1, Some("b"), ""),
                frag(0, None, "{\"x\":1}"),
                frag(1, None, "{\"y\":2}"),
            ],
        );
        let r = s.collect_response().await.expect("complete");
        let calls = &r.choices[0].tool_calls;
        assert_eq!(calls.len(), 2);
        assert_eq!(
            (calls[0].id.as_str(), calls[0].arguments.as_str()),
            ("a", "{\"x\":1}")
        );
        assert_eq!(
            (calls[1].id.as_str(), calls[1].arguments.as_str()),
            ("b", "{\"y\":2}")
        );
        assert_eq!(calls[1].name, "tool_b");
    }

    #[test]
    fn joining_fragments_costs_one_lookup_each_whatever_the_indices() {
        // 2,000 tool calls in one choice, each in two fragments (the second
        // round after all the first ones), plus 500 choices with one text
        // chunk each: a linear search per fragment examined about
        // 2,000 × 2,000 entries.
        let calls = 2_000u32;
        let mut joined = Joined::default();
        let frag = |index: u32, id: Option<String>, args: &str| ChatChunk {
            tool_call: Some(ToolCallDelta {
                index,
                id,
                name: None,
                arguments: args.into(),
            }),
            ..ChatChunk::default()
        };
        for i in 0..calls {
            joined.push(frag(i, Some(format!("c{i}")), "{"));
        }
        for i in 0..calls {
            joined.push(frag(i, None, "}"));
        }
        for choice in 1..=500u32 {
            joined.push(ChatChunk {
                index: choice,
                text: Some("t".into()),
                ..ChatChunk::default()
            });
        }
        let chunks = 2 * calls as usize + 500;
        assert_eq!(joined.choice_at.probes, chunks);
        assert_eq!(joined.call_at[0].probes, 2 * calls as usize);
        assert_eq!(joined.choices.len(), 501);
        let first = &joined.choices[0].tool_calls;
        assert_eq!(first.len(), calls as usize);
        assert_eq!(
            (first[7].id.as_str(), first[7].arguments.as_str()),
            ("c7", "{}")
        );
        assert_eq!(joined.choices[500].index, 500);
    }

    #[tokio::test]
    async fn a_terminal_error_is_the_collected_error() {
        let s = ChatStream::from_chunks(
            "openai",
            "m",
            vec![text("Hel"), Err(Failure::new(FailureClass::Transient))],
        );
        assert!(s.collect_response().await.unwrap_err().is_transient());
    }

    #[test]
    fn records_what_the_layers_attach() {
        let mut s = ChatStream::from_chunks("openai", "m", vec![]);
        s.record_served_by(&Link::new("openai", "m").with_position(2));
        s.mark_degraded();
        assert_eq!(s.fallback_position(), 2);
        assert!(s.is_degraded());
        assert!(format!("{s:?}").contains("ChatStream"));
    }

    #[test]
    fn a_handle_counts_and_keeps_each_pieces_records() {
        let handle = Continued::new();
        let mut piece = ChatStream::from_chunks("bedrock", "claude", vec![]);
        let record = AttemptRecord::new(
            &Link::new("bedrock", "claude").with_position(1),
            1,
            AttemptOutcome::Succeeded,
            Duration::from_millis(3),
        );
        piece.record_attempts(vec![record.clone()]);
        piece.record_served_by(&Link::new("bedrock", "claude").with_position(1));
        handle.record(ContinuedPiece::of(&piece, FailureClass::Timeout));
        handle.record(ContinuedPiece::of(&piece, FailureClass::Transient));
        let clone = handle.clone();
        assert_eq!(clone.count(), 2);
        let pieces = clone.pieces();
        assert_eq!(pieces.len(), 2);
        assert_eq!(pieces[0].attempts(), std::slice::from_ref(&record));
        assert_eq!(
            (pieces[0].cause(), pieces[1].cause()),
            (FailureClass::Timeout, FailureClass::Transient)
        );
        assert_eq!(
            (pieces[0].model(), pieces[0].fallback_position()),
            ("claude", 1)
        );
        assert_eq!(
            format!("{clone:?}"),
            "Continued { enabled: true, count: 2 }"
        );
    }

    #[test]
    fn the_handle_of_a_stream_nothing_continues_reads_zero() {
        let none = Continued::NONE;
        none.record(ContinuedPiece::of(
            &ChatStream::from_chunks("a", "b", vec![]),
            FailureClass::Transient,
        ));
        assert_eq!(
            (none.count(), none.pieces().len(), none.is_enabled()),
            (0, 0, false)
        );
    }
}
