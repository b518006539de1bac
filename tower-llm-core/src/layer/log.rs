//! [`AttemptLogExt`] and [`AttemptRecordExt`]: how the layers write the
//! attempt log.

use std::time::Duration;

use super::metrics::MetricsExt as _;
use super::sealed::Sealed;
use crate::telemetry::Metrics;
use crate::{
    AttemptLog, AttemptOutcome, AttemptRecord, Call, Failure, FailureClass, Link, LlmRequest,
    MAX_ATTEMPTS_PER_CALL, NextStep, Outcome, RecordsAttempts,
};

/// The layers' side of the [`AttemptLog`]: installing it, writing records
/// and, for the call's owner, taking them when the call ends (rules 1, 5
/// and 7 of the [contract](super#the-cross-layer-contract)). A program
/// that uses the layers reads the records on the answer or the failure,
/// or the log with [`AttemptLog::of`].
///
/// Who writes which record:
///
/// - the retry layer's per-attempt layer writes one record per attempt
///   (begun as the attempt starts, finished when it ends or is dropped);
/// - a circuit breaker with no retry layer outside it (no record in
///   flight when it is called) writes the record of each attempt itself,
///   its refusals included, so a deadline + breaker stack records every
///   attempt too (a link with neither layer records nothing);
/// - the fallback layer marks the record of the link it leaves
///   [`NextStep::FailedOver`] and records a link its admission rule skips;
/// - the retry policy marks [`NextStep::Retried`] or the
///   [`RetryStop`](crate::RetryStop).
///
/// Sealed: implemented for [`AttemptLog`] only.
///
/// ```
/// use std::time::Duration;
/// use tower_llm_core::layer::AttemptLogExt;
/// use tower_llm_core::{AttemptLog, AttemptOutcome, AttemptRecord, Link};
///
/// let mut ext = http::Request::new(());
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
pub trait AttemptLogExt: Sealed {
    /// Puts a new log into the call `req` carries unless it has one.
    /// Returns the log if this call created it (the caller is then its
    /// owner and must attach it when the call ends), `None` if an outer
    /// layer already owns one.
    fn install<R: LlmRequest + ?Sized>(req: &mut R) -> Option<AttemptLog>
    where
        Self: Sized;

    /// For a breaker that counts one outcome per logical call per link
    /// (`count = "calls"`): marks the link of record `index` as having
    /// counted a failure of this call. `true` the first time for that link,
    /// `false` after (and always `true` for a position past 63, or an index
    /// with no record).
    fn count_failure_once(&self, index: usize) -> bool;

    /// Appends a record. The [`MAX_ATTEMPTS_PER_CALL`]+1-th record is refused
    /// with [`Failure::attempts_cap_exceeded`]; a layer that sees this error
    /// must stop making attempts and return it.
    fn push(&self, record: AttemptRecord) -> Result<(), Failure>;

    /// Reserves the record of an attempt that is about to start, checking
    /// the cap under the same lock: returns the record's index for
    /// [`finish`](Self::finish), or [`Failure::attempts_cap_exceeded`] (then
    /// the attempt must not be made). The record stands as given until
    /// finished, so an attempt cut short still shows in the log.
    fn begin(&self, record: AttemptRecord) -> Result<usize, Failure>;

    /// Completes the record reserved by [`begin`](Self::begin). Does
    /// nothing if the log was taken in between.
    fn finish(&self, index: usize, f: impl FnOnce(&mut AttemptRecord));

    /// Completes the record reserved by [`begin`](Self::begin) from the
    /// attempt's classified `outcome` (its outcome, elapsed time and HTTP
    /// status), and names the record's provider and model in `result`'s
    /// error when the error names none yet. The layer that made the record
    /// calls this once, when the attempt ends.
    fn complete<Res>(
        &self,
        index: usize,
        outcome: &Outcome,
        elapsed: Duration,
        result: &mut Result<Res, Failure>,
    );

    /// `true` once [`MAX_ATTEMPTS_PER_CALL`] records are in: a layer must
    /// not start another attempt.
    fn is_full(&self) -> bool;

    /// Changes the latest record in place (for example, the retry layer
    /// marks it [`NextStep::Retried`], the fallback layer
    /// [`NextStep::FailedOver`]). Returns `false` when the log is empty.
    fn update_last(&self, f: impl FnOnce(&mut AttemptRecord)) -> bool;

    /// Changes what happened after the latest attempt; see [`update_last`](Self::update_last).
    fn set_last_next(&self, next: NextStep) -> bool;

    /// The index of the latest record if its attempt is still in flight:
    /// a layer inside the attempt (a circuit breaker) notes it at call
    /// time to read the attempt's outcome later with [`outcome_at`](Self::outcome_at).
    fn in_flight(&self) -> Option<usize>;

    /// `true` when an attempt recorded at or after `index` (and not a
    /// hedge) has failed: a hedge layer starts no hedge after its first
    /// attempt failed (that is the retry and fallback layers' work).
    fn failed_since(&self, index: usize) -> bool;

    /// Drops the losing branch of a hedged call (`drop_loser` drops its
    /// future) and marks the records it left in flight
    /// [`CancelledByHedge`](AttemptOutcome::CancelledByHedge) (rule 7 of
    /// the [carrier's contract](super#the-cross-layer-contract)). Call it once the winner has
    /// answered: every record still in flight then is the loser's. The
    /// loser's layers see an ordinary cancellation while it is dropped (a
    /// breaker releases its slot and counts nothing); the record says why
    /// afterwards.
    fn drop_hedge_loser(&self, drop_loser: impl FnOnce());

    /// The index of the latest record made by the link at fallback
    /// `position` (skip records excluded).
    fn last_index_for(&self, position: u8) -> Option<usize>;

    /// The outcome of record `index`, if there is one.
    fn outcome_at(&self, index: usize) -> Option<AttemptOutcome>;

    /// Takes the records out, leaving the log empty.
    fn take(&self) -> Vec<AttemptRecord>;

    /// For the log's owner when the call ends: takes the records and
    /// attaches them to the response ([`RecordsAttempts`]) or the error
    /// ([`Failure::attempts`]). Attaches nothing when no attempt was recorded.
    fn attach<Res: RecordsAttempts>(&self, result: &mut Result<Res, Failure>);

    /// As [`attach`](Self::attach), first recording the call's
    /// [`Metrics`] from its records (what the
    /// layer owning the log does when the call ends).
    fn finish_call<Res: RecordsAttempts>(
        &self,
        result: &mut Result<Res, Failure>,
        metrics: &Metrics,
    );
}

impl AttemptLogExt for AttemptLog {
    fn install<R: LlmRequest + ?Sized>(req: &mut R) -> Option<AttemptLog> {
        req.call_mut().install_fresh_log()
    }

    fn count_failure_once(&self, index: usize) -> bool {
        let mut inner = self.lock();
        let Some(position) = inner.records.get(index).map(|r| r.fallback_position) else {
            return true;
        };
        let Some(bit) = 1_u64.checked_shl(u32::from(position)) else {
            return true;
        };
        let first = inner.counted & bit == 0;
        inner.counted |= bit;
        first
    }

    fn push(&self, record: AttemptRecord) -> Result<(), Failure> {
        let mut inner = self.lock();
        let records = &mut inner.records;
        if records.len() >= MAX_ATTEMPTS_PER_CALL {
            return Err(Failure::attempts_cap_exceeded());
        }
        records.push(record);
        Ok(())
    }

    fn begin(&self, record: AttemptRecord) -> Result<usize, Failure> {
        let mut inner = self.lock();
        let records = &mut inner.records;
        if records.len() >= MAX_ATTEMPTS_PER_CALL {
            return Err(Failure::attempts_cap_exceeded());
        }
        records.push(record);
        Ok(records.len() - 1)
    }

    fn finish(&self, index: usize, f: impl FnOnce(&mut AttemptRecord)) {
        if let Some(r) = self.lock().records.get_mut(index) {
            f(r);
        }
    }

    fn complete<Res>(
        &self,
        index: usize,
        outcome: &Outcome,
        elapsed: Duration,
        result: &mut Result<Res, Failure>,
    ) {
        let mut guard = self.lock();
        let Some(r) = guard.records.get_mut(index) else {
            return;
        };
        r.outcome = match outcome {
            Outcome::Success { .. } => AttemptOutcome::Succeeded,
            Outcome::Failure(c) => AttemptOutcome::Failed(c.class),
        };
        r.elapsed = elapsed;
        r.http_status = outcome.http_status().map(|s| s.as_u16());
        if let Err(e) = result {
            e.set_origin_if_unset(&r.provider, &r.model);
        }
    }

    fn is_full(&self) -> bool {
        self.lock().records.len() >= MAX_ATTEMPTS_PER_CALL
    }

    fn update_last(&self, f: impl FnOnce(&mut AttemptRecord)) -> bool {
        match self.lock().records.last_mut() {
            Some(r) => {
                f(r);
                true
            }
            None => false,
        }
    }

    fn set_last_next(&self, next: NextStep) -> bool {
        self.update_last(|r| r.next = next)
    }

    fn in_flight(&self) -> Option<usize> {
        let inner = self.lock();
        let records = &inner.records;
        match records.last() {
            Some(r) if r.outcome == AttemptOutcome::InFlight => Some(records.len() - 1),
            _ => None,
        }
    }

    fn failed_since(&self, index: usize) -> bool {
        self.lock()
            .records
            .iter()
            .skip(index)
            .any(|r| !r.hedge && matches!(r.outcome, AttemptOutcome::Failed(_)))
    }

    fn drop_hedge_loser(&self, drop_loser: impl FnOnce()) {
        let in_flight: Vec<usize> = {
            let inner = self.lock();
            inner
                .records
                .iter()
                .enumerate()
                .filter(|(_, r)| r.outcome == AttemptOutcome::InFlight)
                .map(|(i, _)| i)
                .collect()
        };
        drop_loser();
        let mut inner = self.lock();
        for i in in_flight {
            if let Some(r) = inner.records.get_mut(i) {
                if matches!(
                    r.outcome,
                    AttemptOutcome::InFlight | AttemptOutcome::Failed(FailureClass::Cancelled)
                ) {
                    r.outcome = AttemptOutcome::CancelledByHedge;
                }
            }
        }
    }

    fn last_index_for(&self, position: u8) -> Option<usize> {
        self.lock().records.iter().rposition(|r| {
            r.fallback_position == position && r.outcome != AttemptOutcome::SkippedByPolicy
        })
    }

    fn outcome_at(&self, index: usize) -> Option<AttemptOutcome> {
        self.lock().records.get(index).map(|r| r.outcome)
    }

    fn take(&self) -> Vec<AttemptRecord> {
        std::mem::take(&mut self.lock().records)
    }

    fn attach<Res: RecordsAttempts>(&self, result: &mut Result<Res, Failure>) {
        self.finish_call(result, &Metrics::disabled());
    }

    fn finish_call<Res: RecordsAttempts>(
        &self,
        result: &mut Result<Res, Failure>,
        metrics: &Metrics,
    ) {
        let attempts = self.take();
        metrics.record_call(result.as_ref().err(), &attempts);
        if attempts.is_empty() {
            return;
        }
        match result {
            Ok(res) => res.record_attempts(attempts),
            Err(failure) => failure.set_attempts(attempts),
        }
    }
}

/// The layers' side of an [`AttemptRecord`]: the record of an attempt
/// about to be sent, read from the carrier. Sealed: implemented for
/// [`AttemptRecord`] only.
pub trait AttemptRecordExt: Sealed {
    /// The in-flight record of an attempt about to be sent with `call`:
    /// its link (or `link` when the call names none), attempt number and
    /// whether it is a hedge, read from the carrier.
    fn begun(call: Option<&Call>, link: &Link) -> Self
    where
        Self: Sized;
}

impl AttemptRecordExt for AttemptRecord {
    fn begun(call: Option<&Call>, link: &Link) -> Self {
        let mut record = AttemptRecord::new(
            call.and_then(Call::link).unwrap_or(link),
            call.map_or(1, Call::attempt),
            AttemptOutcome::InFlight,
            Duration::ZERO,
        );
        record.hedge = call.is_some_and(Call::is_hedge);
        record
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Attempts;
    use crate::record::test_record as rec;

    #[test]
    fn complete_fills_the_record_and_names_the_link_in_an_unnamed_error() {
        let log = AttemptLog::new();
        let link = Link::new("openai", "gpt-4o");
        let first = log
            .begin(AttemptRecord::new(
                &link,
                1,
                AttemptOutcome::InFlight,
                Duration::ZERO,
            ))
            .expect("room");
        let failed = crate::Outcome::Failure(crate::Classified {
            http_status: Some(http::StatusCode::SERVICE_UNAVAILABLE),
            ..crate::Classified::new(FailureClass::Transient)
        });
        let mut result: Result<(), Failure> = Err(Failure::new(FailureClass::Transient));
        log.complete(first, &failed, Duration::from_millis(7), &mut result);
        let record = &log.snapshot()[0];
        assert_eq!(
            record.outcome,
            AttemptOutcome::Failed(FailureClass::Transient)
        );
        assert_eq!(record.elapsed, Duration::from_millis(7));
        assert_eq!(record.http_status, Some(503));
        let err = result.expect_err("still the failure");
        assert_eq!(
            (err.provider(), err.model()),
            (Some("openai"), Some("gpt-4o"))
        );

        // An error that already names its origin keeps it.
        let second = log
            .begin(AttemptRecord::new(
                &link,
                2,
                AttemptOutcome::InFlight,
                Duration::ZERO,
            ))
            .expect("room");
        let mut result: Result<(), Failure> =
            Err(Failure::new(FailureClass::Transient).with_provider("anthropic"));
        log.complete(second, &failed, Duration::ZERO, &mut result);
        assert_eq!(result.expect_err("failure").provider(), Some("anthropic"));

        // A success fills the record and leaves the answer alone.
        let third = log
            .begin(AttemptRecord::new(
                &link,
                3,
                AttemptOutcome::InFlight,
                Duration::ZERO,
            ))
            .expect("room");
        let mut ok: Result<(), Failure> = Ok(());
        log.complete(
            third,
            &crate::Outcome::Success { http_status: None },
            Duration::ZERO,
            &mut ok,
        );
        assert_eq!(log.snapshot()[2].outcome, AttemptOutcome::Succeeded);
        assert!(ok.is_ok());
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
    fn begin_reserves_and_finish_completes() {
        let log = AttemptLog::new();
        let i = log.begin(rec(1)).expect("room");
        log.push(rec(2)).expect("room");
        log.finish(i, |r| r.outcome = AttemptOutcome::Succeeded);
        let records = log.snapshot();
        assert_eq!(records[0].outcome, AttemptOutcome::Succeeded);
        assert_eq!(records[1], rec(2));
        for n in 3..=16 {
            log.begin(rec(n)).expect("room");
        }
        assert!(log.is_full());
        assert!(log.begin(rec(17)).expect_err("cap").is_invalid_response());
        log.take();
        log.finish(i, |_| panic!("taken records are gone"));
    }

    #[test]
    fn clones_share_one_log() {
        let mut ext = http::Request::new(());
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
    fn attach_goes_to_response_or_error_and_skips_empty_logs() {
        let log = AttemptLog::new();
        let mut ok: Result<http::Response<()>, Failure> = Ok(http::Response::new(()));
        log.attach(&mut ok);
        assert!(
            ok.as_ref()
                .expect("ok")
                .extensions()
                .get::<Attempts>()
                .is_none()
        );
        log.push(rec(1)).expect("push");
        let mut err: Result<http::Response<()>, Failure> = Err(Failure::deadline_exceeded());
        log.attach(&mut err);
        assert_eq!(err.expect_err("err").attempts(), &[rec(1)]);
        assert!(log.is_empty());
    }
}
