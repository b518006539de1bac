//! What a circuit tells a store that shares its state with other processes.

use std::fmt;

use crate::{BreakerKey, Circuit, Transition};

/// Something a circuit counted, for a store that shares circuit state
/// between processes (see [`CircuitEvents`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CircuitEvent {
    /// A call admitted while closed succeeded (and was counted).
    Success,
    /// A call admitted while closed failed, counted as a tripping failure.
    /// The transition given with it, if any, is the open it caused.
    Failure,
    /// A half-open probe succeeded. The transition, if any, is the close.
    ProbeSucceeded,
    /// A half-open probe failed. The transition is the re-open.
    ProbeFailed,
    /// A half-open probe ended without a verdict (dropped, neutral outcome,
    /// or held by a 429): its slot is free again.
    ProbeReleased,
    /// Opened by hand ([`BreakerHandle::isolate`](crate::BreakerHandle::isolate)).
    Isolated,
    /// Closed by hand ([`BreakerHandle::close`](crate::BreakerHandle::close)),
    /// counts forgotten, even if it was already closed.
    ClosedByHand,
}

/// A listener attached to a circuit with [`Circuit::with_events`], for a
/// [`BreakerStore`](crate::BreakerStore) that shares circuit state between
/// replicas (as `tower-llm-breaker-redis` does). A circuit made with
/// [`Circuit::new`] has none, and pays one branch on a `None` for it.
///
/// Every method runs on the request path: it must not block, wait on I/O
/// or take long (queue the work and do it elsewhere).
///
/// What is reported: the outcomes the circuit counted (an outcome it
/// ignored, such as a call admitted before a trip, is not reported), probe
/// results and releases, and changes by hand through
/// [`BreakerHandle`](crate::BreakerHandle). What is not: changes adopted
/// from elsewhere ([`Circuit::adopt_open`] and friends, so a store never
/// hears its own news back), the move from open to half-open (a matter of
/// time), [`probe_now`](crate::BreakerHandle::probe_now), and rate-limit
/// holds (local to each process).
pub trait CircuitEvents: Send + Sync + fmt::Debug + 'static {
    /// `circuit` counted `event`; `transition` is the state change it
    /// caused, if any. Called after the change, outside the circuit's lock.
    fn on_event(&self, circuit: &Circuit, event: CircuitEvent, transition: Option<&Transition>);

    /// Whether a half-open circuit may admit one more probe, asked only
    /// when it has a free local slot (`half_open_probes`). `true` takes a
    /// permit (returned through [`CircuitEvent::ProbeSucceeded`],
    /// [`ProbeFailed`](CircuitEvent::ProbeFailed) or
    /// [`ProbeReleased`](CircuitEvent::ProbeReleased)); `false` refuses the
    /// call as open. The default admits (local rules only).
    ///
    /// Called with the circuit's lock held: it must not call back into the
    /// circuit.
    fn permit_probe(&self, key: &BreakerKey) -> bool {
        let _ = key;
        true
    }
}
