//! The per-call attempt log.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::AttemptRecord;

/// The most attempts one logical call may record (seed 002 §1 item 13:
/// 5 providers × 3 attempts = 15, plus one slot of margin). The 17th
/// record is refused with
/// [`Failure::attempts_cap_exceeded`](crate::Failure::attempts_cap_exceeded).
pub const MAX_ATTEMPTS_PER_CALL: usize = 16;

/// The attempts of one logical call, shared by every layer that works on it.
///
/// Clones share one log (it is an `Arc`), so the copies of a request that a
/// retry or fallback layer sends all append to the same place. The outermost
/// tower-llm layer creates it and, when the call ends, takes the records and
/// attaches them to the response ([`RecordsAttempts`](crate::RecordsAttempts))
/// or to the error ([`Failure::attempts`](crate::Failure::attempts)); the layers write it through
/// [`layer::AttemptLogExt`](crate::layer::AttemptLogExt), which says who
/// writes which record.
///
/// The lock is a plain mutex that is never held across an `.await`.
///
/// A successful typed attempt records `http_status: Some(200)` (see
/// [`ChatClassifier`](crate::ChatClassifier)).
///
/// ```
/// use tower_llm_core::{AttemptLog, ChatRequest, LlmRequest};
///
/// // What a service of your own, inside tower-llm's layers, can read mid-call.
/// fn attempts_so_far<R: LlmRequest>(req: &R) -> usize {
///     AttemptLog::of(req).map_or(0, AttemptLog::len)
/// }
/// let req = ChatRequest::new("gpt-4o-mini", vec![]);
/// assert_eq!(attempts_so_far(&req), 0);
/// ```
#[derive(Debug, Clone)]
pub struct AttemptLog {
    inner: Arc<Mutex<LogInner>>,
}

#[derive(Debug)]
pub(crate) struct LogInner {
    pub(crate) records: Vec<AttemptRecord>,
    /// Fallback positions (bit n: position n) whose breaker has counted a
    /// failure of this call (see `AttemptLogExt::count_failure_once`).
    pub(crate) counted: u64,
}

impl AttemptLog {
    /// An empty log, with room for [`INITIAL_CAPACITY`](Self::INITIAL_CAPACITY)
    /// records allocated up front, so that recording an ordinary call's
    /// attempts allocates nothing on the request path.
    pub fn new() -> Self {
        AttemptLog {
            inner: Arc::new(Mutex::new(LogInner {
                records: Vec::with_capacity(Self::INITIAL_CAPACITY),
                counted: 0,
            })),
        }
    }

    /// Records allocated up front: a primary with its 3 attempts and one
    /// fallback answer.
    pub const INITIAL_CAPACITY: usize = 4;

    /// The records, locked (never across an `.await`).
    pub(crate) fn lock(&self) -> MutexGuard<'_, LogInner> {
        // A panic elsewhere while holding the lock leaves a valid Vec.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Number of records so far.
    pub fn len(&self) -> usize {
        self.lock().records.len()
    }

    /// `true` when nothing has been recorded.
    pub fn is_empty(&self) -> bool {
        self.lock().records.is_empty()
    }

    /// A copy of the records so far.
    pub fn snapshot(&self) -> Vec<AttemptRecord> {
        self.lock().records.clone()
    }
}

impl Default for AttemptLog {
    fn default() -> Self {
        AttemptLog::new()
    }
}
