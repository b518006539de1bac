//! Every tower-llm layer's per-call state, kept as **one** entry in the
//! request's [`Extensions`]: the deadline, the attempt log, the link being
//! tried and the attempt number. A request copy (the retry layer's for each
//! attempt, the fallback layer's for the next link) then clones one entry
//! (reference-count bumps) instead of four boxed ones, and each layer finds
//! everything with one map lookup.
//!
//! The public accessors ([`Deadline::of`](crate::Deadline::of),
//! [`AttemptLog::of`](crate::AttemptLog::of), [`Link::of`](crate::Link::of),
//! and their `store`/`install`) read and write it; for compatibility they
//! also read a `Deadline`, `AttemptLog` or `Link` inserted into the
//! extensions directly.

use http::Extensions;

use crate::telemetry::{CallOwner, Metrics};
use crate::{AttemptLog, Deadline, HasExtensions, Link};

/// The per-call state (see the [module docs](self)).
#[derive(Debug, Clone, Default)]
pub(crate) struct CallState {
    pub(crate) deadline: Option<Deadline>,
    pub(crate) log: Option<AttemptLog>,
    pub(crate) link: Option<Link>,
    /// The number of the next attempt on the current link (0: unset).
    pub(crate) attempt: u8,
}

impl CallState {
    pub(crate) fn of(extensions: &Extensions) -> Option<&CallState> {
        extensions.get::<CallState>()
    }

    pub(crate) fn of_mut(extensions: &mut Extensions) -> &mut CallState {
        extensions.get_or_insert_default::<CallState>()
    }

    /// A field of the call state, else (for compatibility) a value of that
    /// type inserted into `extensions` directly; the second lookup is made
    /// only when `extensions` holds entries other than the call state.
    pub(crate) fn read<'a, T: Send + Sync + 'static>(
        extensions: &'a Extensions,
        field: impl FnOnce(&'a CallState) -> Option<&'a T>,
    ) -> Option<&'a T> {
        let state = CallState::of(extensions);
        if let Some(value) = state.and_then(field) {
            return Some(value);
        }
        if extensions.len() > usize::from(state.is_some()) {
            extensions.get::<T>()
        } else {
            None
        }
    }
}

/// The per-call state of a request as the layers read it, found with one
/// map lookup. Not for general use: [`Deadline::of`](crate::Deadline::of),
/// [`AttemptLog::of`] and [`Link::of`] read the same.
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub struct CallView<'a> {
    /// The call's deadline.
    pub deadline: Option<Deadline>,
    /// The call's attempt log.
    pub log: Option<&'a AttemptLog>,
    /// The link being tried.
    pub link: Option<&'a Link>,
    /// The number of the attempt this request copy is for (at least 1).
    pub attempt: u8,
}

impl<'a> CallView<'a> {
    fn of_state(state: &'a CallState) -> Self {
        CallView {
            deadline: state.deadline,
            log: state.log.as_ref(),
            link: state.link.as_ref(),
            attempt: state.attempt.max(1),
        }
    }

    /// The view of `extensions`.
    pub fn of(extensions: &'a Extensions) -> Self {
        let state = CallState::of(extensions);
        // Entries other than the call state: only then can a deadline, log
        // or link have been inserted directly.
        let others = extensions.len() > usize::from(state.is_some());
        CallView {
            deadline: state.and_then(|s| s.deadline).or_else(|| {
                others
                    .then(|| extensions.get::<Deadline>().copied())
                    .flatten()
            }),
            log: state
                .and_then(|s| s.log.as_ref())
                .or_else(|| others.then(|| extensions.get::<AttemptLog>()).flatten()),
            link: state
                .and_then(|s| s.link.as_ref())
                .or_else(|| others.then(|| extensions.get::<Link>()).flatten()),
            attempt: state.map_or(1, |s| s.attempt.max(1)),
        }
    }
}

/// The number of the attempt a request copy is for, as set by the retry
/// layer (1 when unset). Not for general use: the retry layer's policy and
/// attempt layer talk through it.
#[doc(hidden)]
pub fn attempt_number(extensions: &Extensions) -> u8 {
    CallState::of(extensions).map_or(1, |s| s.attempt.max(1))
}

/// Sets the number of the attempt a request copy is for (see
/// [`attempt_number`]).
#[doc(hidden)]
pub fn set_attempt_number(extensions: &mut Extensions, number: u8) {
    CallState::of_mut(extensions).attempt = number;
}

/// A request copy for a later attempt or link, made by [`replay_copy`]:
/// the copy, and the per-call state it must carry once it is used.
///
/// Not for general use: the retry and fallback layers use it.
#[doc(hidden)]
#[derive(Debug)]
pub struct ReplayCopy<Req> {
    /// The copy. Without its per-call state until [`attach`](Self::attach)
    /// (or [`into_request`](Self::into_request)) puts it back.
    pub request: Req,
    detached: Option<CallState>,
}

impl<Req: HasExtensions> ReplayCopy<Req> {
    /// A request that carries all its state already.
    pub fn whole(request: Req) -> Self {
        ReplayCopy {
            request,
            detached: None,
        }
    }

    /// Gives the copy its per-call state, if it was made without it (at
    /// most once; later calls do nothing).
    pub fn attach(&mut self) {
        if let Some(state) = self.detached.take() {
            self.request.extensions_mut().insert(state);
        }
    }

    /// The copy, with its per-call state.
    pub fn into_request(mut self) -> Req {
        self.attach();
        self.request
    }

    /// A copy of the copy, with its per-call state (`self` keeps its own,
    /// still detached if it was).
    pub fn to_request(&self) -> Req
    where
        Req: Clone,
    {
        let mut request = self.request.clone();
        if let Some(state) = &self.detached {
            request.extensions_mut().insert(state.clone());
        }
        request
    }

    /// The per-call state the copy carries, attached or not.
    pub fn view(&self) -> CallView<'_> {
        match &self.detached {
            Some(state) => CallView::of_state(state),
            None => CallView::of(self.request.extensions()),
        }
    }
}

/// Copies `req` to send again later (the retry layer's next attempt, the
/// fallback layer's next link).
///
/// When tower-llm's per-call state is the request's only extension (a
/// request that arrived without extensions), the copy is made without the
/// extension map: in `http` 1.x copying that map costs three allocations
/// (the map, its table, the entry), and on the success path the copy is
/// never used. The state (reference counts, no allocation) is kept beside
/// the copy and put back by [`ReplayCopy::attach`] when the copy is used.
/// Otherwise the copy is a plain `clone`, with every extension.
#[doc(hidden)]
pub fn replay_copy<Req: Clone + HasExtensions>(req: &mut Req) -> ReplayCopy<Req> {
    let extensions = req.extensions_mut();
    if extensions.len() == 1 {
        if let Some(state) = CallState::of(extensions).cloned() {
            return detached_copy(req, state);
        }
    }
    ReplayCopy {
        request: req.clone(),
        detached: None,
    }
}

/// A copy of `req`, whose only extension is the call state `state`, made
/// without its extension map (taken out for the moment of the clone).
fn detached_copy<Req: Clone + HasExtensions>(req: &mut Req, state: CallState) -> ReplayCopy<Req> {
    let map = std::mem::take(req.extensions_mut());
    let request = req.clone();
    *req.extensions_mut() = map;
    ReplayCopy {
        request,
        detached: Some(state),
    }
}

/// What the retry and fallback layers do first in `call`: take ownership
/// of the call when no outer tower-llm layer has
/// ([`CallOwner::install`]), then, when `copy`, make the request's
/// [`replay_copy`] unless it is [`NotReplayable`](crate::NotReplayable).
///
/// A request whose only extension is the per-call state of a call owned
/// outside (the usual case inside a deadline layer) takes one map lookup.
#[doc(hidden)]
pub fn enter_replaying<Req: Clone + HasExtensions>(
    req: &mut Req,
    metrics: &Metrics,
    copy: bool,
) -> (Option<CallOwner>, Option<ReplayCopy<Req>>) {
    let extensions = req.extensions_mut();
    if extensions.len() == 1 {
        if let Some(state) = CallState::of(extensions).filter(|s| s.log.is_some()) {
            if !copy {
                return (None, None);
            }
            let state = state.clone();
            return (None, Some(detached_copy(req, state)));
        }
    }
    let owner = CallOwner::install(req.extensions_mut(), metrics);
    let copy = (copy && !is_not_replayable(req.extensions())).then(|| replay_copy(req));
    (owner, copy)
}

/// What the deadline layer does first in `call`: stores `deadline` (an
/// earlier one already there stays in force) and takes ownership of the
/// call when no outer tower-llm layer has. Returns the deadline in force.
///
/// A request that arrives without extensions takes one insertion.
#[doc(hidden)]
pub fn begin_call(
    extensions: &mut Extensions,
    deadline: Deadline,
    metrics: &Metrics,
) -> (Deadline, Option<CallOwner>) {
    if extensions.is_empty() {
        let log = AttemptLog::new();
        extensions.insert(CallState {
            deadline: Some(deadline),
            log: Some(log.clone()),
            link: None,
            attempt: 0,
        });
        return (deadline, Some(CallOwner::owning(log, metrics)));
    }
    let deadline = deadline.store(extensions);
    (deadline, CallOwner::install(extensions, metrics))
}

/// `true` when the request is marked [`NotReplayable`](crate::NotReplayable).
#[doc(hidden)]
pub fn is_not_replayable(extensions: &Extensions) -> bool {
    // One entry that is the call state: nothing else to look up.
    let ours = usize::from(CallState::of(extensions).is_some());
    extensions.len() > ours && extensions.get::<crate::NotReplayable>().is_some()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn request() -> http::Request<()> {
        let mut req = http::Request::new(());
        Deadline::after(Duration::from_secs(5)).store(req.extensions_mut());
        AttemptLog::install(req.extensions_mut()).expect("owner");
        Link::new("openai", "gpt-4o").store(req.extensions_mut());
        req
    }

    #[tokio::test(start_paused = true)]
    async fn a_copy_of_a_request_with_only_the_call_state_carries_it_once_used() {
        let mut req = request();
        let mut copy = replay_copy(&mut req);
        // The original is untouched; the copy has no map until it is used.
        assert_eq!(req.extensions().len(), 1);
        assert!(Link::of(req.extensions()).is_some());
        assert!(copy.request.extensions().is_empty());
        copy.attach();
        let (a, b) = (
            CallView::of(req.extensions()),
            CallView::of(copy.request.extensions()),
        );
        assert_eq!(a.deadline, b.deadline);
        assert_eq!(a.link, b.link);
        let (Some(la), Some(lb)) = (a.log, b.log) else {
            panic!("both carry the log");
        };
        la.push(crate::AttemptRecord::new(
            &Link::new("openai", "gpt-4o"),
            1,
            crate::AttemptOutcome::Succeeded,
            Duration::ZERO,
        ))
        .expect("room");
        assert_eq!(lb.len(), 1, "one log, shared");
        let link = b.link.cloned();
        // Attaching twice changes nothing; a second copy carries it too.
        copy.attach();
        let again = copy.to_request();
        assert_eq!(CallView::of(again.extensions()).link, link.as_ref());
    }

    #[derive(Clone, Debug, PartialEq)]
    struct Tenant(&'static str);

    #[tokio::test(start_paused = true)]
    async fn a_copy_of_a_request_with_other_extensions_is_a_plain_clone() {
        let mut req = request();
        req.extensions_mut().insert(Tenant("acme"));
        let copy = replay_copy(&mut req);
        assert_eq!(copy.request.extensions().get(), Some(&Tenant("acme")));
        assert!(Link::of(copy.request.extensions()).is_some());
        assert_eq!(req.extensions().len(), 2);
        assert_eq!(copy.into_request().extensions().len(), 2);
    }

    #[test]
    fn not_replayable_is_found_beside_the_call_state() {
        let mut ext = Extensions::new();
        assert!(!is_not_replayable(&ext));
        Link::new("a", "b").store(&mut ext);
        assert!(!is_not_replayable(&ext));
        ext.insert(crate::NotReplayable);
        assert!(is_not_replayable(&ext));
    }

    #[tokio::test(start_paused = true)]
    async fn entering_a_replaying_layer() {
        let metrics = Metrics::disabled();
        // Owned outside, only the call state: no owner, a detached copy.
        let mut req = request();
        let (owner, copy) = enter_replaying(&mut req, &metrics, true);
        assert!(owner.is_none());
        let copy = copy.expect("a copy");
        assert!(copy.request.extensions().is_empty());
        assert!(copy.view().log.is_some());
        assert_eq!(req.extensions().len(), 1);
        // No copy wanted.
        let (owner, copy) = enter_replaying(&mut req, &metrics, false);
        assert!(owner.is_none() && copy.is_none());
        // Marked not replayable: no copy.
        req.extensions_mut().insert(crate::NotReplayable);
        let (owner, copy) = enter_replaying(&mut req, &metrics, true);
        assert!(owner.is_none() && copy.is_none());
        // A fresh request: this layer owns the call, and its copy shares
        // the log it installed.
        let mut fresh = http::Request::new(());
        let (owner, copy) = enter_replaying(&mut fresh, &metrics, true);
        assert!(owner.is_some());
        let copy = copy.expect("a copy");
        assert!(copy.view().log.is_some());
        assert!(AttemptLog::of(fresh.extensions()).is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn beginning_a_call() {
        let metrics = Metrics::disabled();
        let mut fresh = Extensions::new();
        let soon = Deadline::after(std::time::Duration::from_secs(5));
        let (in_force, owner) = begin_call(&mut fresh, soon, &metrics);
        assert_eq!(in_force, soon);
        assert!(owner.is_some());
        assert_eq!(fresh.len(), 1);
        assert_eq!(Deadline::of(&fresh), Some(soon));
        assert!(AttemptLog::of(&fresh).is_some());
        // Inside another deadline layer: the earlier deadline stays, and
        // the outer layer keeps the call.
        let later = Deadline::after(std::time::Duration::from_secs(9));
        let (in_force, owner) = begin_call(&mut fresh, later, &metrics);
        assert_eq!(in_force, soon);
        assert!(owner.is_none());
    }

    #[test]
    fn values_inserted_directly_are_still_read() {
        let mut ext = Extensions::new();
        ext.insert(Link::new("direct", "m"));
        assert_eq!(Link::of(&ext).map(Link::provider), Some("direct"));
        CallState::of_mut(&mut ext).attempt = 2;
        let view = CallView::of(&ext);
        assert_eq!(view.link.map(Link::provider), Some("direct"));
        assert_eq!(view.attempt, 2);
    }
}
