//! The shared side of one local circuit: what it reports, and the probe
//! tokens it holds.

use std::fmt::{self, Write as _};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::mpsc;
use tokio::time::Instant;
use tower_llm_breaker::{
    BreakerKey, Circuit, CircuitEvent, CircuitEvents, CircuitState, Transition,
};

use crate::link::{Link, Op, ProbeResult};

/// Probe tokens this replica reserved in Redis for the current half-open
/// period of one circuit.
#[derive(Debug, Default)]
pub(crate) struct Tickets {
    /// Reserved, not yet used.
    pub(crate) free: Vec<String>,
    /// Held by a probe in flight.
    pub(crate) in_use: Vec<String>,
    /// When Redis forgets them (one cooldown after the reservation).
    pub(crate) expires: Option<Instant>,
}

/// An op and the circuit it is about: what the queue to the writer carries.
#[derive(Debug)]
pub(crate) struct Job {
    pub(crate) entry: Arc<Entry>,
    pub(crate) op: Op,
}

/// Attached to each local circuit of a [`RedisBreakerStore`](crate::RedisBreakerStore).
pub(crate) struct Entry {
    pub(crate) key: BreakerKey,
    /// The key's name in Redis, after the prefix.
    pub(crate) id: String,
    pub(crate) hash_key: String,
    pub(crate) probes_key: String,
    pub(crate) link: Arc<Link>,
    /// The queue to the writer.
    tx: mpsc::Sender<Job>,
    /// The latest shared generation adopted.
    pub(crate) generation: AtomicU64,
    /// Failures may be counted in Redis: a success must reset them.
    pub(crate) dirty: AtomicBool,
    /// Successes not yet written (only with a ratio trigger).
    pub(crate) successes: AtomicU32,
    /// A reservation is asked for or scheduled.
    pub(crate) reserving: AtomicBool,
    pub(crate) tickets: Mutex<Tickets>,
}

impl fmt::Debug for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Entry")
            .field("key", &self.key)
            .field("generation", &self.generation.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Entry {
    pub(crate) fn new(key: BreakerKey, link: Arc<Link>, tx: mpsc::Sender<Job>) -> Self {
        let id = encode_key(&key);
        Entry {
            hash_key: link.settings.redis.key(&id),
            probes_key: link.settings.redis.key(&format!("{id}:probes")),
            id,
            key,
            link,
            tx,
            generation: AtomicU64::new(0),
            dirty: AtomicBool::new(false),
            successes: AtomicU32::new(0),
            reserving: AtomicBool::new(false),
            tickets: Mutex::new(Tickets::default()),
        }
    }

    pub(crate) fn tickets(&self) -> MutexGuard<'_, Tickets> {
        self.tickets.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `op` unless Redis is down (then local rules apply and the
    /// resync reconciles later). Never waits: a full queue drops the op
    /// and counts it. `false` if not queued.
    pub(crate) fn send(self: &Arc<Self>, op: Op) -> bool {
        if !self.link.is_up() {
            return false;
        }
        let job = Job {
            entry: self.clone(),
            op,
        };
        match self.tx.try_send(job) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.link.dropped.fetch_add(1, Ordering::Relaxed);
                false
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        }
    }

    /// Queues `op` whether or not Redis is up (a read or a reservation that
    /// the worker itself schedules).
    pub(crate) fn send_always(self: &Arc<Self>, op: Op) -> bool {
        let job = Job {
            entry: self.clone(),
            op,
        };
        self.tx.try_send(job).is_ok()
    }

    /// Asks the worker for probe tokens (as many as the fleet may have:
    /// this replica has calls waiting), once at a time.
    pub(crate) fn kick(self: &Arc<Self>) {
        let want = self.link.settings.breaker.half_open_probes.max(1);
        if !self.reserving.swap(true, Ordering::AcqRel) && !self.send(Op::Reserve { want }) {
            self.reserving.store(false, Ordering::Release);
        }
    }

    fn take_successes(&self) -> u32 {
        if self.successes.load(Ordering::Relaxed) == 0 {
            0
        } else {
            self.successes.swap(0, Ordering::AcqRel)
        }
    }
}

/// `provider/model[/scope]`, each part percent-encoded except
/// `[A-Za-z0-9._-]`, so the name is unambiguous and safe in a key.
fn encode_key(key: &BreakerKey) -> String {
    let mut out = String::new();
    let part = |s: &str, out: &mut String| {
        for b in s.bytes() {
            if b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-') {
                out.push(char::from(b));
            } else {
                let _ = write!(out, "%{b:02X}");
            }
        }
    };
    part(key.provider(), &mut out);
    out.push('/');
    part(key.model(), &mut out);
    if let Some(scope) = key.scope() {
        out.push('/');
        part(scope, &mut out);
    }
    out
}

/// The hook the local circuit calls: it never waits, it queues.
#[derive(Debug)]
pub(crate) struct Events(pub(crate) Arc<Entry>);

impl CircuitEvents for Events {
    fn on_event(&self, _circuit: &Circuit, event: CircuitEvent, transition: Option<&Transition>) {
        let entry = &self.0;
        // A report that is not queued is dropped (and counted): never waited for.
        let send = |op: Op| {
            entry.send(op);
        };
        match event {
            CircuitEvent::Success => {
                if entry.link.settings.breaker.failure_ratio.is_some() {
                    entry.successes.fetch_add(1, Ordering::Relaxed);
                }
                // Nothing to write while nothing fails.
                if entry.dirty.load(Ordering::Relaxed) && entry.dirty.swap(false, Ordering::AcqRel)
                {
                    let successes = entry.take_successes();
                    send(Op::Success {
                        successes,
                        reset: true,
                    });
                }
            }
            CircuitEvent::Failure => {
                entry.dirty.store(true, Ordering::Release);
                match transition {
                    Some(t) if t.to == CircuitState::Open => send(Op::Trip {
                        reason: t.reason.as_metric_label(),
                    }),
                    _ => {
                        let successes = entry.take_successes();
                        send(Op::Failure { successes });
                    }
                }
            }
            CircuitEvent::ProbeSucceeded
            | CircuitEvent::ProbeFailed
            | CircuitEvent::ProbeReleased => {
                let token = entry.tickets().in_use.pop();
                match token {
                    Some(token) => {
                        let result = match event {
                            CircuitEvent::ProbeSucceeded => ProbeResult::Ok,
                            CircuitEvent::ProbeFailed => ProbeResult::Fail,
                            _ => ProbeResult::Release,
                        };
                        send(Op::Probe { token, result });
                    }
                    // A probe admitted by the local rules alone (Redis was
                    // down): its verdict is pushed as a local decision.
                    None => match (event, transition) {
                        (CircuitEvent::ProbeFailed, _) => send(Op::Trip {
                            reason: "probe_failed",
                        }),
                        (CircuitEvent::ProbeSucceeded, Some(_)) => send(Op::Close {
                            reason: "probes_succeeded",
                        }),
                        _ => {}
                    },
                }
            }
            CircuitEvent::Isolated => send(Op::Isolate),
            CircuitEvent::ClosedByHand => send(Op::Close {
                reason: "closed_by_hand",
            }),
            _ => {}
        }
    }

    fn permit_probe(&self, _key: &BreakerKey) -> bool {
        let entry = &self.0;
        if !entry.link.is_up() {
            // Local-only breaking while Redis is away.
            return true;
        }
        let mut tickets = entry.tickets();
        if tickets.expires.is_some_and(|e| Instant::now() >= e) {
            *tickets = Tickets::default();
        }
        if let Some(token) = tickets.free.pop() {
            tickets.in_use.push(token);
            return true;
        }
        drop(tickets);
        entry.kick();
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_names_are_unambiguous_and_safe() {
        assert_eq!(
            encode_key(&BreakerKey::new("openai", "gpt-4o")),
            "openai/gpt-4o"
        );
        assert_eq!(
            encode_key(&BreakerKey::new("p", "a/b").with_scope("t 1|x")),
            "p/a%2Fb/t%201%7Cx"
        );
        // A slash inside a part never reads as a scope.
        assert_ne!(
            encode_key(&BreakerKey::new("p", "m/s")),
            encode_key(&BreakerKey::new("p", "m").with_scope("s"))
        );
    }
}
