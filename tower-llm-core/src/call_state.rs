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

use crate::{AttemptLog, Deadline, Link};

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
