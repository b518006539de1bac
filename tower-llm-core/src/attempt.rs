//! The per-call attempt log.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use http::Extensions;
use serde::{Deserialize, Serialize};

use crate::{ChatResponse, Failure, FailureClass, Link};

/// The most attempts one logical call may record (seed 002 §1 item 13:
/// 5 providers × 3 attempts = 15, plus one slot of margin). The 17th
/// record is refused with [`Failure::attempts_cap_exceeded`].
pub const MAX_ATTEMPTS_PER_CALL: usize = 16;

/// How one attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttemptOutcome {
    /// The attempt succeeded.
    Succeeded,
    /// The attempt failed with this class.
    Failed(FailureClass),
}

/// What the layers did after an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NextStep {
    /// The result (success or final failure) went back to the caller.
    #[default]
    Returned,
    /// The same link was tried again.
    Retried,
    /// The next link of the fallback chain was tried.
    FailedOver,
}

/// One attempt of a logical call (seed 002 `AttemptRecord`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptRecord {
    /// Provider name (for example `"bedrock"`).
    pub provider: Arc<str>,
    /// Model id sent to the provider.
    pub model: Arc<str>,
    /// 1-based attempt number on this link.
    pub attempt: u8,
    /// Position of the link in the fallback chain (0 = primary).
    pub fallback_position: u8,
    /// How the attempt ended.
    pub outcome: AttemptOutcome,
    /// What happened next.
    pub next: NextStep,
    /// Wall time of the attempt (milliseconds on the wire).
    #[serde(with = "crate::serde_millis")]
    pub elapsed: Duration,
    /// HTTP status of the answer; `None` when no answer came (timeout,
    /// connect error, open circuit).
    pub http_status: Option<u16>,
}

impl AttemptRecord {
    /// A record for attempt `attempt` on `link`.
    pub fn new(link: &Link, attempt: u8, outcome: AttemptOutcome, elapsed: Duration) -> Self {
        AttemptRecord {
            provider: link.provider_arc().clone(),
            model: link.model_arc().clone(),
            attempt,
            fallback_position: link.position(),
            outcome,
            next: NextStep::Returned,
            elapsed,
            http_status: None,
        }
    }

    /// Sets the HTTP status.
    #[must_use]
    pub fn with_http_status(mut self, status: Option<u16>) -> Self {
        self.http_status = status;
        self
    }

    /// Sets what happened next.
    #[must_use]
    pub fn with_next(mut self, next: NextStep) -> Self {
        self.next = next;
        self
    }
}

/// The attempts of one logical call, shared by every layer that works on it.
///
/// Clones share one log (it is an `Arc`), so the copies of a request that a
/// retry or fallback layer sends all append to the same place. The outermost
/// tower-llm layer creates it with [`AttemptLog::install`] and, when the call
/// ends, takes the records and attaches them to the response
/// ([`RecordsAttempts`]) or to the error ([`Failure::attempts`]).
///
/// The lock is a plain mutex that is never held across an `.await`.
///
/// ```
/// use std::time::Duration;
/// use tower_llm_core::{AttemptLog, AttemptOutcome, AttemptRecord, Link};
///
/// let mut ext = http::Extensions::new();
/// let owned = AttemptLog::install(&mut ext).expect("first layer owns the log");
/// assert!(AttemptLog::install(&mut ext).is_none()); // inner layers only append
///
/// let link = Link::new("openai", "gpt-4o-mini");
/// let log = AttemptLog::of(&ext).expect("installed");
/// for n in 1..=16 {
///     log.push(AttemptRecord::new(&link, n, AttemptOutcome::Succeeded, Duration::ZERO))
///         .expect("within the cap");
/// }
/// let err = log
///     .push(AttemptRecord::new(&link, 17, AttemptOutcome::Succeeded, Duration::ZERO))
///     .unwrap_err();
/// assert!(err.is_invalid_response());
/// assert_eq!(owned.take().len(), 16);
/// ```
#[derive(Debug, Clone, Default)]
pub struct AttemptLog {
    records: Arc<Mutex<Vec<AttemptRecord>>>,
}

impl AttemptLog {
    /// An empty log (it allocates its storage on the first record).
    pub fn new() -> Self {
        AttemptLog::default()
    }

    /// Puts a new log into `extensions` unless one is there. Returns the log
    /// if this call created it (the caller is then its owner and must attach
    /// it when the call ends), `None` if an outer layer already owns one.
    pub fn install(extensions: &mut Extensions) -> Option<AttemptLog> {
        let log = AttemptLog::new();
        match extensions.insert(log.clone()) {
            None => Some(log),
            Some(outer) => {
                // An outer layer owns the log: put it back.
                extensions.insert(outer);
                None
            }
        }
    }

    /// The log in `extensions`, if any.
    pub fn of(extensions: &Extensions) -> Option<&AttemptLog> {
        extensions.get::<AttemptLog>()
    }

    fn lock(&self) -> MutexGuard<'_, Vec<AttemptRecord>> {
        // A panic elsewhere while holding the lock leaves a valid Vec.
        self.records.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Appends a record. The [`MAX_ATTEMPTS_PER_CALL`]+1-th record is refused
    /// with [`Failure::attempts_cap_exceeded`]; a layer that sees this error
    /// must stop making attempts and return it.
    pub fn push(&self, record: AttemptRecord) -> Result<(), Failure> {
        let mut records = self.lock();
        if records.len() >= MAX_ATTEMPTS_PER_CALL {
            return Err(Failure::attempts_cap_exceeded());
        }
        if records.capacity() == 0 {
            records.reserve_exact(4);
        }
        records.push(record);
        Ok(())
    }

    /// Changes what happened after the latest attempt (for example, the
    /// fallback layer marks it [`NextStep::FailedOver`]). Returns `false`
    /// when the log is empty.
    pub fn set_last_next(&self, next: NextStep) -> bool {
        match self.lock().last_mut() {
            Some(r) => {
                r.next = next;
                true
            }
            None => false,
        }
    }

    /// Number of records so far.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// `true` when nothing has been recorded.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// A copy of the records so far.
    pub fn snapshot(&self) -> Vec<AttemptRecord> {
        self.lock().clone()
    }

    /// Takes the records out, leaving the log empty.
    pub fn take(&self) -> Vec<AttemptRecord> {
        std::mem::take(&mut *self.lock())
    }
}

/// The attempt records of a finished call, as attached to an
/// [`http::Response`]'s extensions.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Attempts(pub Vec<AttemptRecord>);

/// A response that can carry the call's attempt records.
///
/// The outermost tower-llm layer attaches the log to the response with this
/// trait: [`ChatResponse`] keeps it in its `attempts` field, an
/// [`http::Response`] in its extensions as [`Attempts`]. For your own
/// response type, implement it (or write `impl RecordsAttempts for MyResponse {}`
/// to discard the records).
pub trait RecordsAttempts {
    /// Stores the records of the finished call.
    fn record_attempts(&mut self, attempts: Vec<AttemptRecord>) {
        let _ = attempts;
    }
}

impl<B> RecordsAttempts for http::Response<B> {
    fn record_attempts(&mut self, attempts: Vec<AttemptRecord>) {
        self.extensions_mut().insert(Attempts(attempts));
    }
}

impl RecordsAttempts for ChatResponse {
    fn record_attempts(&mut self, attempts: Vec<AttemptRecord>) {
        self.attempts = attempts;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(n: u8) -> AttemptRecord {
        AttemptRecord::new(
            &Link::new("bedrock", "m").with_position(2),
            n,
            AttemptOutcome::Failed(FailureClass::Transient),
            Duration::from_millis(8),
        )
        .with_http_status(Some(503))
    }

    #[test]
    fn seventeenth_record_is_refused_with_a_clear_error() {
        let log = AttemptLog::new();
        for n in 1..=16 {
            log.push(rec(n)).expect("within cap");
        }
        let err = log.push(rec(17)).expect_err("17th refused");
        assert!(err.is_invalid_response());
        assert_eq!(
            err.message(),
            Some("attempts cap exceeded (16); programmer error in the retry or fallback chain")
        );
        assert_eq!(log.len(), 16);
        assert_eq!(log.snapshot().last().map(|r| r.attempt), Some(16));
    }

    #[test]
    fn clones_share_one_log() {
        let mut ext = Extensions::new();
        let owner = AttemptLog::install(&mut ext).expect("owner");
        let copy = ext.clone();
        AttemptLog::of(&copy)
            .expect("log")
            .push(rec(1))
            .expect("push");
        assert!(owner.set_last_next(NextStep::FailedOver));
        let taken = owner.take();
        assert_eq!(taken.len(), 1);
        assert_eq!(taken[0].next, NextStep::FailedOver);
        assert_eq!(taken[0].fallback_position, 2);
        assert!(owner.is_empty());
        assert!(!owner.set_last_next(NextStep::Retried));
    }

    #[test]
    fn record_serializes_with_millis() {
        let json = serde_json::to_value(rec(1)).expect("json");
        assert_eq!(json["elapsed"], 8);
        assert_eq!(json["outcome"]["failed"], "transient");
        assert_eq!(json["next"], "returned");
        let back: AttemptRecord = serde_json::from_value(json).expect("back");
        assert_eq!(back, rec(1));
    }

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
