//! What can be fingerprinted, stored and replayed.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_core::Stream;
use sha2::{Digest, Sha256};
use tower_llm_core::{
    AttemptLog, AttemptRecord, ChatChunk, ChatRequest, ChatResponse, ChatStream, ChunkStream,
    Failure, LlmRequest,
};

use crate::frames::{StreamFrames, StreamFramesBuilder};
use crate::store::{Fingerprint, IdempotencyStore, Lease, Stored};

/// A request the idempotency layer can fingerprint: what it asks, without
/// its per-call carrier or your own extensions.
pub trait IdempotentRequest: LlmRequest {
    /// SHA-256 of the request's model, messages and parameters.
    fn fingerprint(&self) -> Fingerprint;
}

impl IdempotentRequest for ChatRequest {
    /// Over the request's JSON (its `call` and `extensions` are not
    /// serialized): the model, messages, tools, sampling parameters and
    /// whether it streams.
    fn fingerprint(&self) -> Fingerprint {
        let mut hasher = Sha256::new();
        // Serializing a ChatRequest cannot fail (no maps with non-string
        // keys); an error would still give a fingerprint of its own.
        match serde_json::to_writer(HashWriter(&mut hasher), self) {
            Ok(()) => {}
            Err(e) => hasher.update(e.to_string().as_bytes()),
        }
        Fingerprint(hasher.finalize().into())
    }
}

/// Feeds serialized bytes to the hash without building them in memory.
struct HashWriter<'a>(&'a mut Sha256);

impl std::io::Write for HashWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// An answer the idempotency layer can store and replay.
pub trait IdempotentAnswer: Sized {
    /// Passes the leader's answer on, storing it through `capture` once it
    /// is whole: at once for a unary answer, at its clean end for a stream
    /// (dropping `capture` unused gives the key up).
    fn capture(self, capture: Capture) -> Self;

    /// The answer replayed from `stored`, or `None` if `stored` is of
    /// another kind (a stream stored for a unary request, say).
    fn replay(stored: &Stored) -> Option<Self>;
}

impl IdempotentAnswer for ChatResponse {
    fn capture(self, capture: Capture) -> Self {
        let stale = self
            .cache
            .is_some_and(|c| c.status == tower_llm_core::CacheStatus::Stale);
        if self.degraded || stale {
            // Built by the fallback layer because every link failed, or a
            // cache's stale answer for the same reason: a failure in
            // disguise, never stored (the key is given up).
            drop(capture);
            return self;
        }
        let mut stored = self.clone();
        stored.attempts = capture.records();
        capture.complete(Stored::Response(stored));
        self
    }

    fn replay(stored: &Stored) -> Option<Self> {
        match stored {
            Stored::Response(res) => {
                let mut res = res.clone();
                res.idempotent_replayed = true;
                Some(res)
            }
            Stored::Stream { .. } => None,
        }
    }
}

impl IdempotentAnswer for ChatStream {
    fn capture(self, capture: Capture) -> Self {
        let stale = self
            .cache_outcome()
            .is_some_and(|c| c.status == tower_llm_core::CacheStatus::Stale);
        if self.is_degraded() || stale {
            // A degraded or stale answer is never stored (the key is given
            // up).
            drop(capture);
            return self;
        }
        let provider: Arc<str> = Arc::from(self.provider());
        let model = self.model().to_owned();
        let fallback_position = self.fallback_position();
        // The records as they are at the commit point: the call's owner
        // takes the log when the stream starts, long before it ends.
        let attempts = capture.records();
        self.map_chunks(move |inner| {
            Box::pin(Collect {
                inner,
                frames: StreamFrames::builder(),
                meta: Some((provider, model, fallback_position, attempts)),
                capture: Some(capture),
            })
        })
    }

    fn replay(stored: &Stored) -> Option<Self> {
        match stored {
            Stored::Stream {
                provider,
                model,
                fallback_position,
                chunks,
                attempts,
            } => Some(ChatStream::replayed(
                provider.clone(),
                model.clone(),
                chunks.iter(),
                *fallback_position,
                attempts.clone(),
            )),
            Stored::Response(_) => None,
        }
    }
}

type StreamMeta = (Arc<str>, String, u8, Vec<AttemptRecord>);

/// A stream's chunks, appended to one buffer as they pass to the caller.
struct Collect {
    inner: ChunkStream,
    frames: StreamFramesBuilder,
    meta: Option<StreamMeta>,
    capture: Option<Capture>,
}

impl Stream for Collect {
    type Item = Result<ChatChunk, Failure>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        let item = std::task::ready!(this.inner.as_mut().poll_next(cx));
        match &item {
            Some(Ok(chunk)) => {
                if let Some(capture) = &this.capture {
                    this.frames.push(chunk);
                    if this.frames.len_bytes() > capture.max_entry_bytes {
                        // Too big to keep: give the key up now.
                        this.capture = None;
                        this.frames = StreamFrames::builder();
                    }
                }
            }
            // A stream that ends with an error is never stored.
            Some(Err(_)) => this.capture = None,
            None => {
                if let (Some(capture), Some((provider, model, fallback_position, attempts))) =
                    (this.capture.take(), this.meta.take())
                {
                    let frames = std::mem::take(&mut this.frames).finish();
                    capture.complete(Stored::Stream {
                        provider,
                        model,
                        fallback_position,
                        chunks: frames,
                        attempts,
                    });
                }
            }
        }
        Poll::Ready(item)
    }
}

/// The leader's hold on its key while its answer is produced: stores the
/// answer ([`complete`](Capture::complete)) or, dropped unused, gives the
/// key up so a waiter goes ahead.
pub struct Capture {
    pub(crate) store: Arc<dyn IdempotencyStore>,
    pub(crate) key: Arc<str>,
    pub(crate) lease: Lease,
    pub(crate) ttl: Duration,
    pub(crate) max_entry_bytes: usize,
    pub(crate) log: Option<AttemptLog>,
    pub(crate) done: bool,
}

impl std::fmt::Debug for Capture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Capture")
            .field("lease", &self.lease)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

impl Capture {
    /// The records of the call so far (stored with its answer).
    pub fn records(&self) -> Vec<tower_llm_core::AttemptRecord> {
        self.log
            .as_ref()
            .map(AttemptLog::snapshot)
            .unwrap_or_default()
    }

    /// Stores `stored` as the key's answer (unless it is over the
    /// per-answer bound, in which case the key is given up).
    pub fn complete(mut self, stored: Stored) {
        self.done = true;
        let bytes = stored.held_bytes();
        if bytes > self.max_entry_bytes {
            self.store.release(self.key.clone(), self.lease);
            return;
        }
        let fut = self.store.complete(
            self.key.clone(),
            self.lease,
            Arc::new(stored),
            bytes,
            self.ttl,
        );
        // The in-process store is done at once; a shared store's write
        // goes on in the background.
        let mut fut = fut;
        let mut cx = Context::from_waker(std::task::Waker::noop());
        if fut.as_mut().poll(&mut cx).is_pending() {
            match tokio::runtime::Handle::try_current() {
                Ok(handle) => {
                    handle.spawn(fut);
                }
                // Nowhere to finish the write: give the key up rather
                // than leave it held.
                Err(_) => self.store.release(self.key.clone(), self.lease),
            }
        }
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        if !self.done {
            self.store.release(self.key.clone(), self.lease);
        }
    }
}
