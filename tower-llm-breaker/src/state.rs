//! What a circuit is in, and what it went through: its state, its
//! transitions and their reasons, and its snapshot.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::BreakerKey;

pub(crate) const CLOSED: u8 = 0;

pub(crate) const OPEN: u8 = 1;

pub(crate) const HALF_OPEN: u8 = 2;

pub(crate) const ISOLATED: u8 = 3;

/// The state of one circuit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CircuitState {
    /// Calls flow; failures are counted.
    Closed,
    /// Calls fail fast until the cooldown (or a rate-limit hold) ends.
    Open,
    /// A few probes are let through; the rest fail fast.
    HalfOpen,
    /// Opened by hand ([`BreakerHandle::isolate`](crate::BreakerHandle::isolate)):
    /// fails fast until closed by hand.
    Isolated,
}

impl CircuitState {
    pub(crate) fn from_u8(v: u8) -> Self {
        match v {
            CLOSED => CircuitState::Closed,
            OPEN => CircuitState::Open,
            HALF_OPEN => CircuitState::HalfOpen,
            _ => CircuitState::Isolated,
        }
    }

    /// The value of the `llm_circuit_state` gauge: 0 closed, 1 open (or
    /// isolated), 2 half-open.
    pub const fn as_gauge(self) -> i64 {
        match self {
            CircuitState::Closed => 0,
            CircuitState::Open | CircuitState::Isolated => 1,
            CircuitState::HalfOpen => 2,
        }
    }

    /// A stable label for metrics and logs.
    pub const fn as_metric_label(self) -> &'static str {
        match self {
            CircuitState::Closed => "closed",
            CircuitState::Open => "open",
            CircuitState::HalfOpen => "half_open",
            CircuitState::Isolated => "isolated",
        }
    }
}

/// Why a circuit changed state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TransitionReason {
    /// `consecutive_failures` tripping failures in a row.
    ConsecutiveFailures,
    /// The failure-ratio trigger.
    FailureRatio,
    /// A 429 with `Retry-After` used to open the circuit for that long. No
    /// longer produced: a rate-limit hold is not a state change (see
    /// [`BreakerConfig::min_rate_limit_hold`](crate::BreakerConfig::min_rate_limit_hold));
    /// kept so that code matching on it still compiles.
    RateLimited,
    /// The cooldown ended: probing.
    CooldownElapsed,
    /// Enough probes succeeded.
    ProbesSucceeded,
    /// A probe failed.
    ProbeFailed,
    /// Opened by hand.
    Isolated,
    /// Closed by hand.
    ClosedByHand,
}

impl TransitionReason {
    /// A stable label for logs and metrics (`consecutive_failures`,
    /// `failure_ratio`, `rate_limited`, `cooldown_elapsed`,
    /// `probes_succeeded`, `probe_failed`, `isolated`, `closed_by_hand`).
    pub const fn as_metric_label(self) -> &'static str {
        match self {
            TransitionReason::ConsecutiveFailures => "consecutive_failures",
            TransitionReason::FailureRatio => "failure_ratio",
            TransitionReason::RateLimited => "rate_limited",
            TransitionReason::CooldownElapsed => "cooldown_elapsed",
            TransitionReason::ProbesSucceeded => "probes_succeeded",
            TransitionReason::ProbeFailed => "probe_failed",
            TransitionReason::Isolated => "isolated",
            TransitionReason::ClosedByHand => "closed_by_hand",
        }
    }
}

/// One state change of one circuit, as given to
/// [`BreakerLayer::on_transition`](crate::BreakerLayer::on_transition).
#[derive(Debug, Clone, PartialEq)]
pub struct Transition {
    /// The circuit.
    pub key: BreakerKey,
    /// The state before.
    pub from: CircuitState,
    /// The state after.
    pub to: CircuitState,
    /// When (tokio time).
    pub at: Instant,
    /// Why.
    pub reason: TransitionReason,
    /// For a change to open: how long it stays open.
    pub open_for: Option<Duration>,
}

/// A point-in-time view of one circuit, for health endpoints.
#[derive(Debug, Clone, PartialEq)]
pub struct CircuitSnapshot {
    /// The circuit.
    pub key: BreakerKey,
    /// Its state.
    pub state: CircuitState,
    /// Tripping failures in a row (closed state).
    pub consecutive_failures: u32,
    /// Time left until the circuit admits calls again: the rest of an
    /// open circuit's cooldown, or of a rate-limit hold (in any state), the
    /// later of the two; `None` when nothing holds it.
    pub retry_after: Option<Duration>,
    /// Consecutive re-opens (for cooldown growth).
    pub reopens: u32,
    /// Probes in flight (half-open state).
    pub probes_in_flight: u32,
}
