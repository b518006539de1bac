//! One circuit: the state machine of one key.

use std::fmt;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

// Model-checked with loom (`tests/loom.rs`, `--cfg tower_llm_loom`): the
// circuit's atomics and its lock are loom's there.
#[cfg(tower_llm_loom)]
use loom::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
#[cfg(tower_llm_loom)]
use loom::sync::{Mutex, MutexGuard};
#[cfg(not(tower_llm_loom))]
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
#[cfg(not(tower_llm_loom))]
use std::sync::{Mutex, MutexGuard};

use tokio::time::Instant;

use crate::state::{
    CLOSED, CircuitSnapshot, CircuitState, HALF_OPEN, ISOLATED, OPEN, Transition, TransitionReason,
};
use crate::{BreakerConfig, BreakerKey, CircuitEvent, CircuitEvents};

/// Why an attempt was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The circuit is open (or half-open with its probes out, or isolated):
    /// fail fast, with the rest of the cooldown if known.
    Open(Option<Duration>),
    /// A closed circuit held by a 429's `Retry-After` for this much longer:
    /// the attempt is only delayed, not a sign the provider is down.
    Held(Duration),
}

/// What a finished call means to the circuit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Success: closes a half-open circuit, resets the failure count.
    Success,
    /// A tripping failure.
    Failure,
    /// A 429 whose `Retry-After` (already capped, at least the threshold)
    /// holds the key: new attempts wait until it ends, nothing is counted
    /// and the state does not change.
    Hold(Duration),
    /// Neither (client errors, cancellation, deadline): changes nothing.
    Neutral,
}

/// A call let through, and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admission {
    /// An ordinary call in the closed state of generation `gen`.
    Normal { generation: u64 },
    /// A half-open probe of generation `gen`, from probe epoch `epoch`.
    Probe { generation: u64, epoch: u64 },
}

/// The state machine of one key.
///
/// Admission in the closed state and fail-fast in the open state are
/// lock-free (atomics); transitions, probes and the failure-ratio window
/// take this circuit's own small mutex, never held across an `.await`.
/// Every transition starts a new *generation*: the outcome of a call
/// admitted in an earlier generation is ignored, so a slow call from
/// before a trip can neither close nor re-open the circuit.
pub struct Circuit {
    key: BreakerKey,
    origin: Instant,
    state: AtomicU8,
    generation: AtomicU64,
    consecutive: AtomicU32,
    /// Nanoseconds after `origin` at which an open circuit may probe.
    open_until: AtomicU64,
    /// Nanoseconds after `origin` of the latest tripping failure.
    last_failure: AtomicU64,
    /// Nanoseconds after `origin` until which a rate-limit hold refuses new
    /// attempts (0: none). Independent of the state: when it ends, the
    /// circuit is as it was (a closed one admits everyone).
    held_until: AtomicU64,
    slow: Mutex<Slow>,
    /// Set when the store forgets the circuit: a service holding a weak
    /// reference to it asks the store again.
    retired: AtomicBool,
    /// A shared store's listener (none for a local circuit).
    events: Option<Arc<dyn CircuitEvents>>,
}

#[derive(Debug, Default)]
struct Slow {
    reopens: u32,
    probes_in_flight: u32,
    probe_successes: u32,
    last_probe_at: Option<Instant>,
    /// Bumped when outstanding probes are presumed lost: a lost probe that
    /// comes back late must not free a slot its replacement holds.
    probe_epoch: u64,
    window: Window,
}

const WINDOW_SLOTS: usize = 10;

/// Calls and failures over a rolling window, in ten slots.
#[derive(Debug, Default)]
struct Window {
    slots: [(u64, u32, u32); WINDOW_SLOTS],
}

impl Window {
    fn record(&mut self, epoch: u64, failed: bool) -> (u32, u32) {
        let slot = &mut self.slots[(epoch % WINDOW_SLOTS as u64) as usize];
        if slot.0 != epoch {
            *slot = (epoch, 0, 0);
        }
        slot.1 = slot.1.saturating_add(1);
        slot.2 = slot.2.saturating_add(u32::from(failed));
        let mut calls = 0u32;
        let mut failures = 0u32;
        for (e, c, f) in &self.slots {
            if epoch.wrapping_sub(*e) < WINDOW_SLOTS as u64 {
                calls = calls.saturating_add(*c);
                failures = failures.saturating_add(*f);
            }
        }
        (calls, failures)
    }
}

impl fmt::Debug for Circuit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Circuit")
            .field("key", &self.key)
            .field("state", &self.state())
            .field(
                "consecutive_failures",
                &self.consecutive.load(Ordering::Relaxed),
            )
            .finish_non_exhaustive()
    }
}

impl Circuit {
    /// A closed circuit for `key`.
    pub fn new(key: BreakerKey) -> Self {
        Circuit {
            key,
            origin: Instant::now(),
            state: AtomicU8::new(CLOSED),
            generation: AtomicU64::new(0),
            consecutive: AtomicU32::new(0),
            open_until: AtomicU64::new(0),
            last_failure: AtomicU64::new(0),
            held_until: AtomicU64::new(0),
            slow: Mutex::new(Slow::default()),
            retired: AtomicBool::new(false),
            events: None,
        }
    }

    /// A closed circuit for `key` that reports what it counts to `events`
    /// and asks it before admitting a half-open probe: the hook of a store
    /// that shares circuits between replicas (see [`CircuitEvents`]).
    pub fn with_events(key: BreakerKey, events: Arc<dyn CircuitEvents>) -> Self {
        Circuit {
            events: Some(events),
            ..Circuit::new(key)
        }
    }

    fn emit(&self, event: CircuitEvent, transition: Option<&Transition>) {
        if let Some(events) = &self.events {
            events.on_event(self, event, transition);
        }
    }

    /// Marks the circuit as forgotten by its store (see
    /// [`BreakerStore::circuits_are_stable`](crate::BreakerStore::circuits_are_stable)).
    pub fn retire(&self) {
        self.retired.store(true, Ordering::Release);
    }

    /// `true` once its store has forgotten it.
    pub fn is_retired(&self) -> bool {
        self.retired.load(Ordering::Acquire)
    }

    /// The circuit's key.
    pub fn key(&self) -> &BreakerKey {
        &self.key
    }

    /// The current state.
    pub fn state(&self) -> CircuitState {
        CircuitState::from_u8(self.state.load(Ordering::Acquire))
    }

    /// `true` when forgetting this circuit loses nothing that matters:
    /// closed with no failure counted, or with its last failure at least
    /// `stale` ago; or open, with its cooldown over for at least `stale`
    /// (nobody came back to probe it). Half-open and isolated circuits, and
    /// a circuit under a rate-limit hold, are never idle.
    pub fn is_idle(&self, stale: Duration) -> bool {
        let now = self.to_nanos(Instant::now());
        let stale = u64::try_from(stale.as_nanos()).unwrap_or(u64::MAX);
        if now < self.held_until.load(Ordering::Acquire) {
            return false;
        }
        match self.state.load(Ordering::Acquire) {
            CLOSED => {
                self.consecutive.load(Ordering::Relaxed) == 0
                    || now.saturating_sub(self.last_failure.load(Ordering::Relaxed)) >= stale
            }
            OPEN => {
                let until = self.open_until.load(Ordering::Acquire);
                now >= until && now - until >= stale
            }
            _ => false,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Slow> {
        self.slow.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn to_nanos(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.origin).as_nanos()).unwrap_or(u64::MAX)
    }

    fn open_until(&self) -> Instant {
        let nanos = self.open_until.load(Ordering::Acquire);
        self.origin
            .checked_add(Duration::from_nanos(nanos))
            .unwrap_or(self.origin)
    }

    /// The rest of a rate-limit hold, if one is on.
    fn held_for(&self, now: Instant) -> Option<Duration> {
        let nanos = self.held_until.load(Ordering::Acquire);
        if nanos == 0 {
            return None;
        }
        let until = self.origin.checked_add(Duration::from_nanos(nanos))?;
        (now < until).then(|| until - now)
    }

    /// Holds new attempts until `hold` from now (only ever extends).
    fn hold(&self, hold: Duration) {
        let until = self.to_nanos(
            Instant::now()
                .checked_add(hold)
                .unwrap_or_else(Instant::now),
        );
        self.held_until.fetch_max(until, Ordering::AcqRel);
    }

    /// A point-in-time view.
    pub fn snapshot(&self) -> CircuitSnapshot {
        let slow = self.lock();
        let state = self.state();
        let now = Instant::now();
        let open = match state {
            CircuitState::Open => Some(self.open_until().saturating_duration_since(now)),
            _ => None,
        };
        let retry_after = match (open, self.held_for(now)) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        CircuitSnapshot {
            key: self.key.clone(),
            state,
            consecutive_failures: self.consecutive.load(Ordering::Relaxed),
            retry_after,
            reopens: slow.reopens,
            probes_in_flight: slow.probes_in_flight,
        }
    }

    /// Lets a call through or refuses it (with the rest of the cooldown or
    /// of a rate-limit hold, when known). May move an open circuit whose
    /// cooldown ended to half-open.
    pub(crate) fn admit(
        &self,
        cfg: &BreakerConfig,
    ) -> (Result<Admission, Refusal>, Option<Transition>) {
        let generation = self.generation.load(Ordering::Acquire);
        let state = self.state.load(Ordering::Acquire);
        if state == ISOLATED {
            return (Err(Refusal::Open(None)), None);
        }
        // A rate-limit hold: no new attempt until it ends, whatever the
        // state (one atomic load when there is none).
        if self.held_until.load(Ordering::Acquire) != 0 {
            let now = Instant::now();
            if let Some(held) = self.held_for(now) {
                let refusal = match state {
                    OPEN => {
                        let open = self.open_until().saturating_duration_since(now);
                        Refusal::Open(Some(held.max(open)))
                    }
                    _ => Refusal::Held(held),
                };
                return (Err(refusal), None);
            }
        }
        match state {
            CLOSED => return (Ok(Admission::Normal { generation }), None),
            OPEN => {
                let until = self.open_until();
                let now = Instant::now();
                if now < until {
                    return (Err(Refusal::Open(Some(until - now))), None);
                }
            }
            _ => {}
        }
        let now = Instant::now();
        let mut slow = self.lock();
        let mut transition = None;
        match self.state.load(Ordering::Acquire) {
            CLOSED => {
                let generation = self.generation.load(Ordering::Acquire);
                return (Ok(Admission::Normal { generation }), None);
            }
            ISOLATED => return (Err(Refusal::Open(None)), None),
            OPEN => {
                let until = self.open_until();
                if now < until {
                    return (Err(Refusal::Open(Some(until - now))), None);
                }
                transition = Some(self.set_half_open(&mut slow, now));
            }
            _ => {}
        }
        // Half-open: a probe slot, or a probe presumed lost after a full
        // cooldown (so a probe whose outcome never arrives cannot wedge it).
        let lost = slow
            .last_probe_at
            .is_some_and(|t| now >= t + cfg.cooldown_after(slow.reopens));
        if lost {
            slow.probes_in_flight = 0;
            slow.probe_epoch = slow.probe_epoch.wrapping_add(1);
        }
        if slow.probes_in_flight < cfg.half_open_probes.max(1)
            && self
                .events
                .as_ref()
                .is_none_or(|events| events.permit_probe(&self.key))
        {
            slow.probes_in_flight += 1;
            slow.last_probe_at = Some(now);
            let generation = self.generation.load(Ordering::Acquire);
            let epoch = slow.probe_epoch;
            (Ok(Admission::Probe { generation, epoch }), transition)
        } else {
            (Err(Refusal::Open(None)), transition)
        }
    }

    /// Records a finished call.
    pub(crate) fn record(
        &self,
        admission: Admission,
        verdict: Verdict,
        cfg: &BreakerConfig,
    ) -> Option<Transition> {
        match admission {
            Admission::Normal { generation } => self.record_normal(generation, verdict, cfg),
            Admission::Probe { generation, epoch } => {
                self.record_probe(generation, epoch, verdict, cfg)
            }
        }
    }

    fn record_normal(
        &self,
        generation: u64,
        verdict: Verdict,
        cfg: &BreakerConfig,
    ) -> Option<Transition> {
        if let Verdict::Hold(h) = verdict {
            // Whatever the generation: the provider asked us to wait.
            self.hold(h);
            return None;
        }
        if self.generation.load(Ordering::Acquire) != generation {
            // A call admitted before a trip: its outcome no longer counts.
            return None;
        }
        match verdict {
            Verdict::Neutral | Verdict::Hold(_) => return None,
            Verdict::Success => {
                if self.consecutive.load(Ordering::Relaxed) != 0 {
                    self.consecutive.store(0, Ordering::Relaxed);
                }
                if let Some(ratio) = cfg.failure_ratio {
                    let epoch = self.epoch(ratio.window);
                    self.lock().window.record(epoch, false);
                }
                self.emit(CircuitEvent::Success, None);
                return None;
            }
            Verdict::Failure => {}
        }
        self.last_failure
            .store(self.to_nanos(Instant::now()), Ordering::Relaxed);
        let n = self
            .consecutive
            .fetch_add(1, Ordering::AcqRel)
            .saturating_add(1);
        let by_count = cfg.consecutive_failures > 0 && n >= cfg.consecutive_failures;
        let mut slow = None;
        let by_ratio = match cfg.failure_ratio {
            Some(ratio) => {
                let epoch = self.epoch(ratio.window);
                let guard = slow.insert(self.lock());
                let (calls, failures) = guard.window.record(epoch, true);
                calls >= ratio.min_calls && f64::from(failures) >= ratio.ratio * f64::from(calls)
            }
            None => false,
        };
        if !(by_count || by_ratio) {
            drop(slow);
            self.emit(CircuitEvent::Failure, None);
            return None;
        }
        let mut slow = match slow {
            Some(guard) => guard,
            None => self.lock(),
        };
        let transition = if self.generation.load(Ordering::Acquire) == generation {
            let now = Instant::now();
            let reason = if by_count {
                TransitionReason::ConsecutiveFailures
            } else {
                TransitionReason::FailureRatio
            };
            let open_for = cfg.cooldown_after(slow.reopens);
            self.set_open(&mut slow, now, open_for, reason)
        } else {
            None
        };
        drop(slow);
        self.emit(CircuitEvent::Failure, transition.as_ref());
        transition
    }

    fn record_probe(
        &self,
        generation: u64,
        epoch: u64,
        verdict: Verdict,
        cfg: &BreakerConfig,
    ) -> Option<Transition> {
        if let Verdict::Hold(h) = verdict {
            // Held, not failed: the slot is freed and the circuit stays
            // half-open; the next probe comes after the hold.
            self.hold(h);
            self.release(Admission::Probe { generation, epoch });
            return None;
        }
        let mut slow = self.lock();
        if self.generation.load(Ordering::Acquire) != generation
            || self.state.load(Ordering::Acquire) != HALF_OPEN
            || slow.probe_epoch != epoch
        {
            return None;
        }
        slow.probes_in_flight = slow.probes_in_flight.saturating_sub(1);
        let now = Instant::now();
        let (event, transition) = match verdict {
            Verdict::Neutral | Verdict::Hold(_) => (CircuitEvent::ProbeReleased, None),
            Verdict::Success => {
                slow.probe_successes += 1;
                let closed = (slow.probe_successes >= cfg.half_open_probes.max(1))
                    .then(|| self.set_closed(&mut slow, now, TransitionReason::ProbesSucceeded));
                (CircuitEvent::ProbeSucceeded, closed)
            }
            Verdict::Failure => {
                slow.reopens = slow.reopens.saturating_add(1);
                let open_for = cfg.cooldown_after(slow.reopens);
                let reopened =
                    self.set_open(&mut slow, now, open_for, TransitionReason::ProbeFailed);
                (CircuitEvent::ProbeFailed, reopened)
            }
        };
        drop(slow);
        self.emit(event, transition.as_ref());
        transition
    }

    /// A probe ended without an outcome (its future was dropped): frees
    /// its slot, changes nothing else.
    pub(crate) fn release(&self, admission: Admission) {
        if let Admission::Probe { generation, epoch } = admission {
            let mut slow = self.lock();
            if self.generation.load(Ordering::Acquire) == generation
                && self.state.load(Ordering::Acquire) == HALF_OPEN
                && slow.probe_epoch == epoch
            {
                slow.probes_in_flight = slow.probes_in_flight.saturating_sub(1);
                drop(slow);
                self.emit(CircuitEvent::ProbeReleased, None);
            }
        }
    }

    /// Opens by hand until closed by hand.
    pub(crate) fn isolate(&self) -> Option<Transition> {
        let transition = self.adopt_isolated();
        if transition.is_some() {
            self.emit(CircuitEvent::Isolated, transition.as_ref());
        }
        transition
    }

    /// Adopts an isolation decided elsewhere (by hand on another replica,
    /// through a shared store): as [`BreakerHandle::isolate`](crate::BreakerHandle::isolate),
    /// but not reported to this circuit's [`CircuitEvents`]. Returns the
    /// transition, if the state changed.
    pub fn adopt_isolated(&self) -> Option<Transition> {
        let mut slow = self.lock();
        let from = self.state();
        if from == CircuitState::Isolated {
            return None;
        }
        slow.probes_in_flight = 0;
        slow.probe_successes = 0;
        // State first: a reader that sees the new generation sees the new
        // state too.
        self.state.store(ISOLATED, Ordering::Release);
        self.generation.fetch_add(1, Ordering::AcqRel);
        Some(self.transition(
            from,
            CircuitState::Isolated,
            Instant::now(),
            TransitionReason::Isolated,
            None,
        ))
    }

    /// Ends an open circuit's cooldown now: the next call probes.
    pub(crate) fn probe_now(&self) {
        let _slow = self.lock();
        if self.state.load(Ordering::Acquire) == OPEN {
            self.open_until
                .store(self.to_nanos(Instant::now()), Ordering::Release);
        }
    }

    /// Closes by hand and forgets all counts (and any rate-limit hold).
    pub(crate) fn close(&self) -> Option<Transition> {
        let transition = self.adopt_closed(TransitionReason::ClosedByHand);
        self.emit(CircuitEvent::ClosedByHand, transition.as_ref());
        transition
    }

    /// Adopts a close decided elsewhere (through a shared store), not
    /// reported to this circuit's [`CircuitEvents`]. With
    /// [`TransitionReason::ClosedByHand`] it is a close by hand (counts
    /// and any rate-limit hold forgotten, even if already closed); with
    /// any other reason (probes succeeded on another replica) an open,
    /// half-open or isolated circuit closes and a closed one is left
    /// alone. Returns the transition, if the state changed.
    pub fn adopt_closed(&self, reason: TransitionReason) -> Option<Transition> {
        let mut slow = self.lock();
        let by_hand = reason == TransitionReason::ClosedByHand;
        if by_hand {
            self.held_until.store(0, Ordering::Release);
        }
        if self.state() == CircuitState::Closed {
            if by_hand {
                self.consecutive.store(0, Ordering::Relaxed);
                slow.window = Window::default();
                slow.reopens = 0;
            }
            return None;
        }
        Some(self.set_closed(&mut slow, Instant::now(), reason))
    }

    /// Adopts an open decided elsewhere (another replica tripped, through
    /// a shared store), not reported to this circuit's [`CircuitEvents`]:
    /// a closed or half-open circuit opens for `open_for`, an open one is
    /// only ever extended, an isolated one is left alone. `reopens` is the
    /// count of consecutive re-opens the other side knows (for cooldown
    /// growth). Returns the transition, if the state changed.
    pub fn adopt_open(
        &self,
        open_for: Duration,
        reopens: u32,
        reason: TransitionReason,
    ) -> Option<Transition> {
        let mut slow = self.lock();
        if self.state.load(Ordering::Acquire) == ISOLATED {
            return None;
        }
        slow.reopens = reopens;
        self.set_open(&mut slow, Instant::now(), open_for, reason)
    }

    fn epoch(&self, window: Duration) -> u64 {
        let slot_ns = (window.as_nanos() / WINDOW_SLOTS as u128).max(1);
        let elapsed = Instant::now()
            .saturating_duration_since(self.origin)
            .as_nanos();
        u64::try_from(elapsed / slot_ns).unwrap_or(u64::MAX)
    }

    fn transition(
        &self,
        from: CircuitState,
        to: CircuitState,
        at: Instant,
        reason: TransitionReason,
        open_for: Option<Duration>,
    ) -> Transition {
        Transition {
            key: self.key.clone(),
            from,
            to,
            at,
            reason,
            open_for,
        }
    }

    /// Opens, or extends an open circuit to the later end (never the earlier).
    fn set_open(
        &self,
        slow: &mut Slow,
        now: Instant,
        open_for: Duration,
        reason: TransitionReason,
    ) -> Option<Transition> {
        let until = now.checked_add(open_for).unwrap_or(now);
        let from = self.state();
        match from {
            CircuitState::Isolated => return None,
            CircuitState::Open => {
                if until > self.open_until() {
                    self.open_until
                        .store(self.to_nanos(until), Ordering::Release);
                }
                return None;
            }
            CircuitState::Closed | CircuitState::HalfOpen => {}
        }
        slow.probes_in_flight = 0;
        slow.probe_successes = 0;
        slow.last_probe_at = None;
        slow.window = Window::default();
        self.consecutive.store(0, Ordering::Relaxed);
        self.open_until
            .store(self.to_nanos(until), Ordering::Release);
        // State first: a reader that sees the new generation sees the new
        // state too.
        self.state.store(OPEN, Ordering::Release);
        self.generation.fetch_add(1, Ordering::AcqRel);
        Some(self.transition(from, CircuitState::Open, now, reason, Some(open_for)))
    }

    fn set_half_open(&self, slow: &mut Slow, now: Instant) -> Transition {
        slow.probes_in_flight = 0;
        slow.probe_successes = 0;
        slow.last_probe_at = None;
        // State first: a reader that sees the new generation sees the new
        // state too.
        self.state.store(HALF_OPEN, Ordering::Release);
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.transition(
            CircuitState::Open,
            CircuitState::HalfOpen,
            now,
            TransitionReason::CooldownElapsed,
            None,
        )
    }

    fn set_closed(&self, slow: &mut Slow, now: Instant, reason: TransitionReason) -> Transition {
        let from = self.state();
        *slow = Slow::default();
        self.consecutive.store(0, Ordering::Relaxed);
        // State first: a reader that sees the new generation sees the new
        // state too.
        self.state.store(CLOSED, Ordering::Release);
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.transition(from, CircuitState::Closed, now, reason, None)
    }
}
