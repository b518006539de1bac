//! [`CallOwner`]: what the layer that owns a logical call holds until the
//! call ends.

use super::log::AttemptLogExt as _;
use super::metrics::MetricsExt as _;
use crate::telemetry::{CallOutcome, Metrics, last_attempt};
use crate::{AttemptLog, AttemptOutcome, AttemptRecord, Failure, FailureClass, RecordsAttempts};

/// What the layer that owns a logical call holds until the call ends: the
/// call's [`AttemptLog`], its [`Metrics`] and its `llm.call` tracing span
/// (fields `provider`, `model`, `outcome`, `attempts`, recorded at the end;
/// attempt spans are its children).
///
/// A call whose owner is dropped before it ends (the caller went away, an
/// outer timeout) is still recorded, as `all_failed` (span outcome
/// `cancelled`), so abandoned calls and their attempts are never missing
/// from the metrics.
#[derive(Debug)]
pub struct CallOwner {
    log: AttemptLog,
    metrics: Metrics,
    span: tracing::Span,
    done: bool,
    /// The request asked for the records on any answer
    /// ([`LlmRequest::keeps_attempts`](crate::LlmRequest::keeps_attempts)).
    keep: bool,
}

impl CallOwner {
    /// Takes ownership of the call `req` carries (rule 1 of the [carrier's
    /// contract](super#the-cross-layer-contract)): a fresh attempt log and
    /// span, or `None` when an outer layer already owns the call.
    pub fn install<R: crate::LlmRequest + ?Sized>(
        req: &mut R,
        metrics: &Metrics,
    ) -> Option<CallOwner> {
        let keep = req.keeps_attempts();
        let log = req.call_mut().install_fresh_log()?;
        Some(CallOwner::owning(log, metrics, keep))
    }

    /// The owner of the call whose freshly installed log is `log`.
    pub(crate) fn owning(log: AttemptLog, metrics: &Metrics, keep: bool) -> CallOwner {
        let span = tracing::info_span!(
            "llm.call",
            provider = tracing::field::Empty,
            model = tracing::field::Empty,
            outcome = tracing::field::Empty,
            attempts = tracing::field::Empty,
        );
        CallOwner {
            log,
            metrics: metrics.clone(),
            span,
            done: false,
            keep,
        }
    }

    /// The call's span (enter it while polling the call).
    pub fn span(&self) -> &tracing::Span {
        &self.span
    }

    /// Ends the call: records its metrics and span fields from the attempt
    /// records, then attaches the records to the error, or to the response
    /// when it carries them at no cost
    /// ([`RecordsAttempts::ATTACHED_BY_DEFAULT`]) or its request asked
    /// ([`KeepAttempts`](crate::KeepAttempts)).
    ///
    /// A call that ends on an authentication failure (an error, or an HTTP
    /// 401/403 answer handed back) is logged once, at `error` with
    /// `severity = "sev-1"`: it is a configuration fault (a wrong or revoked
    /// key) that no retry fixes. Two more are logged once, with
    /// `severity = "sev-2"` (seed 002 §1 items 9 and 13): a call that ends
    /// on a 404 / model not found (`warn`: the configured model name and
    /// the provider's catalogue disagree), and a call that hit the cap of
    /// [`MAX_ATTEMPTS_PER_CALL`](crate::MAX_ATTEMPTS_PER_CALL) attempts
    /// (`error`: a bug in the chain's construction).
    pub fn finish<Res: RecordsAttempts>(mut self, result: &mut Result<Res, Failure>) {
        self.done = true;
        let records = self.log.take();
        let failure = result.as_ref().err();
        let outcome = CallOutcome::of_call(failure, &records);
        self.report(failure, &records, outcome.as_metric_label());
        self.metrics.record_call(failure, &records);
        if records.is_empty() {
            return;
        }
        match result {
            Ok(res) if Res::ATTACHED_BY_DEFAULT || self.keep => res.record_attempts(records),
            Ok(_) => {}
            Err(failure) => failure.set_attempts(records),
        }
    }

    /// The sev-1 event and the span fields.
    fn report(&self, failure: Option<&Failure>, records: &[AttemptRecord], outcome: &str) {
        let last = last_attempt(records);
        if outcome == CallOutcome::AuthError.as_metric_label() {
            tracing::error!(
                parent: &self.span,
                severity = "sev-1",
                provider = last.map_or(failure.and_then(Failure::provider).unwrap_or(""), |r| &*r.provider),
                model = last.map_or(failure.and_then(Failure::model).unwrap_or(""), |r| &*r.model),
                status = last
                    .and_then(|r| r.http_status)
                    .or_else(|| failure.and_then(|f| f.http_status()).map(|s| s.as_u16())),
                "provider rejected our credentials (401/403): check the API key or its permissions"
            );
        }
        let not_found = match failure {
            Some(f) => f.is_not_found(),
            None => {
                last.is_some_and(|r| r.outcome == AttemptOutcome::Failed(FailureClass::NotFound))
            }
        };
        if not_found {
            tracing::warn!(
                parent: &self.span,
                severity = "sev-2",
                provider = last.map_or(failure.and_then(Failure::provider).unwrap_or(""), |r| &*r.provider),
                model = last.map_or(failure.and_then(Failure::model).unwrap_or(""), |r| &*r.model),
                status = last
                    .and_then(|r| r.http_status)
                    .or_else(|| failure.and_then(|f| f.http_status()).map(|s| s.as_u16())),
                "provider does not know the model (404): the configured model name is wrong"
            );
        }
        if failure.is_some_and(Failure::is_attempts_cap_exceeded) {
            tracing::error!(
                parent: &self.span,
                severity = "sev-2",
                attempts = records.len(),
                "attempts cap exceeded: programmer error in the retry or fallback chain"
            );
        }
        if !self.span.is_disabled() {
            self.span.record("outcome", outcome);
            let made = records
                .iter()
                .filter(|r| r.outcome != AttemptOutcome::SkippedByPolicy)
                .count();
            self.span.record("attempts", made);
            if let Some(last) = last {
                self.span.record("provider", &*last.provider);
                self.span.record("model", &*last.model);
            }
        }
    }
}

impl Drop for CallOwner {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let records = self.log.take();
        let cancelled = Failure::new(FailureClass::Cancelled)
            .with_message("the call was dropped before it ended");
        self.report(Some(&cancelled), &records, "cancelled");
        self.metrics.record_call(Some(&cancelled), &records);
    }
}
