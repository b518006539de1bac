//! The values the layers read from a request's extensions and put into a
//! response's, and [`RecordsAttempts`], how a response takes the call's
//! records.

use crate::{AttemptRecord, Link};

/// A request extension saying "this request cannot be sent twice" (for
/// example, its body is a one-shot stream). The retry layer sends such a
/// request once and never retries it; the fallback layer does not replay it
/// on another link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NotReplayable;

/// A request extension asking for the call's attempt records on its
/// [`http::Response`] (as [`Attempts`] in its extensions).
///
/// Attaching them costs an extension map on every response (three
/// allocations in `http` 1.x), so an `http::Response` gets them only when
/// its request asked. A [`ChatResponse`](crate::ChatResponse) carries them in a field and always
/// has them; a failure always carries them ([`Failure::attempts`](crate::Failure::attempts)).
///
/// ```
/// use tower_llm_core::KeepAttempts;
///
/// let mut req = http::Request::new(());
/// req.extensions_mut().insert(KeepAttempts);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KeepAttempts;

/// The attempt records of a finished call, as attached to an
/// [`http::Response`]'s extensions (when its request carried
/// [`KeepAttempts`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Attempts(pub Vec<AttemptRecord>);

/// Which link served a response, as attached to an [`http::Response`]'s
/// extensions by the fallback layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServedBy(pub Link);

/// A response that can carry the call's attempt records.
///
/// The outermost tower-llm layer attaches the log to the response with this
/// trait: [`ChatResponse`](crate::ChatResponse) keeps it in its `attempts` field, an
/// [`http::Response`] in its extensions as [`Attempts`]. For your own
/// response type, implement it (or write `impl RecordsAttempts for MyResponse {}`
/// to discard the records).
pub trait RecordsAttempts {
    /// `true` when the records are attached to every successful response;
    /// `false` (an `http::Response`) when only to those whose request
    /// carried [`KeepAttempts`], because attaching them has a cost.
    const ATTACHED_BY_DEFAULT: bool = true;

    /// Stores the records of the finished call.
    fn record_attempts(&mut self, attempts: Vec<AttemptRecord>) {
        let _ = attempts;
    }

    /// Notes which link served the response (the fallback layer calls this;
    /// the default ignores it).
    fn record_served_by(&mut self, link: &Link) {
        let _ = link;
    }

    /// Flags a response built by the fallback layer's degraded step
    /// because no provider served (the default ignores it).
    fn mark_degraded(&mut self) {}
}

/// An [`http::Response`] extension flagging a degraded answer (see
/// [`RecordsAttempts::mark_degraded`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Degraded;

impl<B> RecordsAttempts for http::Response<B> {
    const ATTACHED_BY_DEFAULT: bool = false;

    fn record_attempts(&mut self, attempts: Vec<AttemptRecord>) {
        self.extensions_mut().insert(Attempts(attempts));
    }

    fn record_served_by(&mut self, link: &Link) {
        self.extensions_mut().insert(ServedBy(link.clone()));
    }

    fn mark_degraded(&mut self) {
        self.extensions_mut().insert(Degraded);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::test_record as rec;

    #[test]
    fn http_response_carries_attempts() {
        let mut res = http::Response::new(());
        res.record_attempts(vec![rec(1)]);
        assert_eq!(
            res.extensions().get::<Attempts>(),
            Some(&Attempts(vec![rec(1)]))
        );
    }
}
