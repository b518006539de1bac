//! Continuing a stream that broke after its commit point: the
//! [`Continuation`] marker a continuation request carries. (The
//! [`Continued`](crate::Continued) handle of a stream that may be
//! continued is with [`ChatStream`](crate::ChatStream).)
//!
//! By default a [`ChatStream`] is never retried after its first content
//! frame (the commit point): a failure after it ends the stream. A layer
//! that opts in to recovery (the `tower-llm-resume` crate's `ResumeLayer`)
//! sends a *continuation request* when such a stream breaks: the original
//! request, marked with a [`Continuation`] carrying the text the client
//! has already received, which each link turns into messages its model
//! understands (an assistant prefill, or the partial answer and an
//! instruction to continue). The new stream's text is spliced into the
//! same client stream, and the stream's [`Continued`](crate::Continued) handle counts the
//! continuations and keeps each piece's attempt records.

use std::fmt;
use std::sync::Arc;

use crate::ChatRequest;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Message;

    #[test]
    fn the_marker_travels_in_the_extensions_and_keeps_the_request_replayable() {
        use crate::LlmRequest;
        let mut req = ChatRequest::new("m", vec![Message::user("hi")]);
        Continuation::new("abc").store(&mut req);
        assert!(req.is_replayable());
        let copy = req.clone();
        assert_eq!(
            Continuation::of(&copy).map(Continuation::partial),
            Some("abc")
        );
        assert_eq!(
            Continuation::take(&mut req).map(|c| c.partial.len()),
            Some(3)
        );
        assert!(Continuation::of(&req).is_none());
    }
}
