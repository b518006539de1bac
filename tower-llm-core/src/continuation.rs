//! Continuing a stream that broke after its commit point: the
//! [`Continuation`] marker a continuation request carries, and the
//! [`Continued`] handle of a stream that may be continued.
//!
//! By default a [`ChatStream`] is never retried after its first content
//! frame (the commit point): a failure after it ends the stream. A layer
//! that opts in to recovery (the `tower-llm-resume` crate's `ResumeLayer`)
//! sends a *continuation request* when such a stream breaks: the original
//! request, marked with a [`Continuation`] carrying the text the client
//! has already received, which each link turns into messages its model
//! understands (an assistant prefill, or the partial answer and an
//! instruction to continue). The new stream's text is spliced into the
//! same client stream, and the stream's [`Continued`] handle counts the
//! continuations and keeps each piece's attempt records.

use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::{AttemptRecord, ChatRequest, ChatStream, FailureClass};

/// The marker of a *continuation request*: the original request, sent
/// again after its stream broke, with the text the client has already
/// received (`partial`, the first choice's text).
///
/// It travels in the request's [`extensions`](ChatRequest::extensions),
/// not in the call's carrier ([`Call`](crate::Call)): it is part of *what*
/// is asked (the model must continue this text), not of how the call is
/// run, so every copy of the request (a retry's, the next fallback
/// link's) carries it as the request does, and a per-link layer turns it
/// into messages for that link's model. A request that carries it is
/// still [replayable](crate::LlmRequest::is_replayable).
///
/// Its `Debug` shows the partial text's length, never the text.
///
/// ```
/// use tower_llm_core::{ChatRequest, Continuation, Message};
///
/// let mut req = ChatRequest::new("m", vec![Message::user("Tell me a story")]);
/// assert!(Continuation::of(&req).is_none());
/// Continuation::new("Once upon a ti").store(&mut req);
/// let marker = Continuation::of(&req).unwrap();
/// assert_eq!(marker.partial(), "Once upon a ti");
/// assert_eq!(format!("{marker:?}"), "Continuation { partial_bytes: 14 }");
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Continuation {
    partial: Arc<str>,
}

impl Continuation {
    /// A continuation of an answer whose first `partial` text the client
    /// has received.
    pub fn new(partial: impl Into<Arc<str>>) -> Self {
        Continuation {
            partial: partial.into(),
        }
    }

    /// The text the client has received so far (the first choice's).
    pub fn partial(&self) -> &str {
        &self.partial
    }

    /// The marker `req` carries, if it is a continuation request.
    pub fn of(req: &ChatRequest) -> Option<&Continuation> {
        if req.extensions.is_empty() {
            return None;
        }
        req.extensions.get::<Continuation>()
    }

    /// Marks `req` as a continuation request (replacing a marker it
    /// carried).
    pub fn store(self, req: &mut ChatRequest) {
        req.extensions.insert(self);
    }

    /// Takes the marker out of `req`: the request is then an ordinary one.
    pub fn take(req: &mut ChatRequest) -> Option<Continuation> {
        if req.extensions.is_empty() {
            return None;
        }
        req.extensions.remove::<Continuation>()
    }
}

impl fmt::Debug for Continuation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Continuation")
            .field("partial_bytes", &self.partial.len())
            .finish()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AttemptOutcome, Link, Message, RecordsAttempts};

    #[test]
    fn the_marker_travels_in_the_extensions_and_keeps_the_request_replayable() {
        use crate::LlmRequest;
        let mut req = ChatRequest::new("m", vec![Message::user("hi")]);
        Continuation::new("abc").store(&mut req);
        assert!(req.is_replayable());
        let copy = req.clone();
        assert_eq!(Continuation::of(&copy).map(Continuation::partial), Some("abc"));
        assert_eq!(Continuation::take(&mut req).map(|c| c.partial.len()), Some(3));
        assert!(Continuation::of(&req).is_none());
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
        assert_eq!((pieces[0].model(), pieces[0].fallback_position()), ("claude", 1));
        assert_eq!(format!("{clone:?}"), "Continued { enabled: true, count: 2 }");
    }

    #[test]
    fn the_handle_of_a_stream_nothing_continues_reads_zero() {
        let none = Continued::NONE;
        none.record(ContinuedPiece::of(
            &ChatStream::from_chunks("a", "b", vec![]),
            FailureClass::Transient,
        ));
        assert_eq!((none.count(), none.pieces().len(), none.is_enabled()), (0, 0, false));
    }
}
