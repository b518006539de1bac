//! What the cache can store and replay.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_core::Stream;
use tower_llm_core::{
    CacheOutcome, ChatChunk, ChatResponse, ChatStream, ChunkStream, Continued, Failure,
};
use tower_llm_idempotency::{Stored, StreamFrames, StreamFramesBuilder};

use crate::store::CacheStore;

/// An answer the cache layer can store, replay and mark: implemented for
/// [`ChatResponse`] and [`ChatStream`].
pub trait CacheAnswer: Sized + Send + 'static {
    /// `true` for an answer the fallback layer built because every link
    /// failed: never stored, and the stale-safe rung may replace it.
    fn is_degraded(&self) -> bool;

    /// The answer marked with what the cache did.
    fn with_cache_outcome(self, outcome: CacheOutcome) -> Self;

    /// Passes a provider's answer on, storing it through `sink` once it is
    /// whole (at once for a unary answer, at its clean end for a stream)
    /// unless it may not be stored.
    fn store(self, sink: Sink) -> Self;

    /// The answer rebuilt from `stored`, or `None` if `stored` is of
    /// another kind.
    fn from_cache(stored: &Stored, outcome: CacheOutcome) -> Option<Self>;
}

/// Where a provider's answer goes once it is whole (see
/// [`CacheAnswer::store`]).
pub struct Sink {
    pub(crate) store: Arc<dyn CacheStore>,
    pub(crate) key: Arc<str>,
    pub(crate) keep: Duration,
    pub(crate) max_entry_bytes: usize,
    pub(crate) store_tool_calls: bool,
    pub(crate) writes: Arc<tokio::sync::Semaphore>,
}

/// The most background writes to a shared store at once, per layer.
pub(crate) const MAX_WRITES: usize = 64;

impl std::fmt::Debug for Sink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sink")
            .field("keep", &self.keep)
            .field("max_entry_bytes", &self.max_entry_bytes)
            .finish_non_exhaustive()
    }
}

impl Sink {
    /// `true` when answers that call tools may be stored.
    pub fn stores_tool_calls(&self) -> bool {
        self.store_tool_calls
    }

    /// The largest answer stored, in bytes.
    pub fn max_entry_bytes(&self) -> usize {
        self.max_entry_bytes
    }

    /// Stores `stored` (unless it is over the per-answer bound). The
    /// in-process store is done at once; a shared store's write goes on in
    /// the background and never holds the call.
    pub fn put(self, stored: Stored) {
        let bytes = stored.held_bytes();
        if bytes > self.max_entry_bytes {
            return;
        }
        let mut fut = self.store.put(self.key, Arc::new(stored), bytes, self.keep);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        if fut.as_mut().poll(&mut cx).is_pending() {
            // A shared store's write goes on in the background, at most
            // `MAX_WRITES` at once (each holds its answer): past that, the
            // answer is served but not stored.
            let Ok(permit) = self.writes.try_acquire_owned() else {
                return;
            };
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                handle.spawn(async move {
                    let _ = fut.await;
                    drop(permit);
                });
            }
        }
    }
}

fn calls_tools(res: &ChatResponse) -> bool {
    res.choices.iter().any(|c| !c.tool_calls.is_empty())
}

impl CacheAnswer for ChatResponse {
    fn is_degraded(&self) -> bool {
        self.degraded
    }

    fn with_cache_outcome(mut self, outcome: CacheOutcome) -> Self {
        self.cache = Some(outcome);
        self
    }

    fn store(self, sink: Sink) -> Self {
        if self.degraded
            || self.idempotent_replayed
            || (calls_tools(&self) && !sink.store_tool_calls)
        {
            return self;
        }
        let mut stored = self.clone();
        stored.attempts = Vec::new();
        stored.cache = None;
        sink.put(Stored::Response(stored));
        self
    }

    fn from_cache(stored: &Stored, outcome: CacheOutcome) -> Option<Self> {
        match stored {
            Stored::Response(res) => {
                let mut res = res.clone();
                res.attempts = Vec::new();
                res.idempotent_replayed = false;
                res.cache = Some(outcome);
                Some(res)
            }
            Stored::Stream { .. } => None,
        }
    }
}

impl CacheAnswer for ChatStream {
    fn is_degraded(&self) -> bool {
        ChatStream::is_degraded(self)
    }

    fn with_cache_outcome(self, outcome: CacheOutcome) -> Self {
        ChatStream::with_cache_outcome(self, outcome)
    }

    fn store(self, sink: Sink) -> Self {
        if ChatStream::is_degraded(&self) || self.is_idempotent_replay() {
            return self;
        }
        let provider: Arc<str> = Arc::from(self.provider());
        let model = self.model().to_owned();
        let fallback_position = self.fallback_position();
        let continued = self.continuations();
        self.map_chunks(move |inner| {
            Box::pin(Collect {
                inner,
                frames: StreamFrames::builder(),
                meta: Some((provider, model, fallback_position)),
                continued,
                sink: Some(sink),
            })
        })
    }

    fn from_cache(stored: &Stored, outcome: CacheOutcome) -> Option<Self> {
        match stored {
            Stored::Stream {
                provider,
                model,
                chunks,
                ..
            } => Some(
                ChatStream::from_iter(provider.clone(), model.clone(), chunks.iter())
                    .with_cache_outcome(outcome),
            ),
            Stored::Response(_) => None,
        }
    }
}

/// A stream's chunks, appended to one buffer as they pass to the caller
/// and stored at its clean end.
struct Collect {
    inner: ChunkStream,
    frames: StreamFramesBuilder,
    meta: Option<(Arc<str>, String, u8)>,
    continued: Continued,
    sink: Option<Sink>,
}

impl Stream for Collect {
    type Item = Result<ChatChunk, Failure>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        let item = std::task::ready!(this.inner.as_mut().poll_next(cx));
        match &item {
            Some(Ok(chunk)) => {
                if let Some(sink) = &this.sink {
                    if chunk.tool_call.is_some() && !sink.store_tool_calls {
                        this.give_up();
                    } else {
                        this.frames.push(chunk);
                        if this.frames.len_bytes() > sink.max_entry_bytes {
                            // Too big to keep: stop collecting now.
                            this.give_up();
                        }
                    }
                }
            }
            // A stream that ends with an error is never stored.
            Some(Err(_)) => this.give_up(),
            None => {
                // A stream continued after it broke is two generations
                // stitched together: never stored.
                if this.continued.count() == 0 {
                    if let (Some(sink), Some((provider, model, fallback_position))) =
                        (this.sink.take(), this.meta.take())
                    {
                        let chunks = std::mem::take(&mut this.frames).finish();
                        sink.put(Stored::Stream {
                            provider,
                            model,
                            fallback_position,
                            chunks,
                            attempts: Vec::new(),
                        });
                    }
                }
                this.give_up();
            }
        }
        Poll::Ready(item)
    }
}

impl Collect {
    fn give_up(&mut self) {
        self.sink = None;
        self.frames = StreamFrames::builder();
    }
}
