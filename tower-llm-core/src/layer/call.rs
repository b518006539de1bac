//! [`CallExt`]: how the layers write the carrier.

use super::owner::CallOwner;
use super::sealed::Sealed;
use crate::telemetry::Metrics;
use crate::{AttemptLog, Call, Deadline, Link, LlmRequest};

/// The layers' side of the carrier: what they write into a [`Call`], each
/// by its rule of the [contract](super#the-cross-layer-contract). (A
/// program that uses the layers only reads it, with `Call`'s own methods.)
///
/// Sealed: implemented for [`Call`] only.
///
/// ```
/// use tower_llm_core::layer::CallExt;
/// use tower_llm_core::{ChatRequest, LlmRequest};
///
/// let mut req = ChatRequest::new("m", vec![]);
/// req.call_mut().set_attempt(3);
/// assert_eq!(req.call().map(|c| c.attempt()), Some(3));
/// ```
pub trait CallExt: Sealed {
    /// Marks this request copy as a hedge (the hedge layer's rule 7).
    fn set_hedge(&mut self, hedge: bool);

    /// Sets the number of the attempt this request copy is for (the retry
    /// layer's rule 4).
    fn set_attempt(&mut self, attempt: u8);

    /// Stores `deadline`, keeping an earlier one already there; returns the
    /// deadline in force (rule 2).
    fn store_deadline(&mut self, deadline: Deadline) -> Deadline;

    /// Stores the link being tried, replacing one stored before (rule 3).
    fn set_link(&mut self, link: Link);

    /// Installs a fresh attempt log unless the call has one. Returns the log
    /// if this call created it (the caller is then the call's owner), `None`
    /// if an outer layer owns the call (rule 1).
    fn install_log(&mut self) -> Option<AttemptLog>;

    /// What the deadline layer does first: stores `deadline` (an earlier
    /// one already there stays in force) and takes ownership of the call
    /// when no outer tower-llm layer has. Returns the deadline in force and
    /// the ownership, if taken.
    fn begin<R: LlmRequest + ?Sized>(
        req: &mut R,
        deadline: Deadline,
        metrics: &Metrics,
    ) -> (Deadline, Option<CallOwner>)
    where
        Self: Sized;
}

impl CallExt for Call {
    fn set_hedge(&mut self, hedge: bool) {
        self.hedge = hedge;
    }

    fn set_attempt(&mut self, attempt: u8) {
        self.attempt = attempt;
    }

    fn store_deadline(&mut self, deadline: Deadline) -> Deadline {
        self.put_deadline(deadline)
    }

    fn set_link(&mut self, link: Link) {
        self.link = Some(link);
    }

    fn install_log(&mut self) -> Option<AttemptLog> {
        self.install_fresh_log()
    }

    fn begin<R: LlmRequest + ?Sized>(
        req: &mut R,
        deadline: Deadline,
        metrics: &Metrics,
    ) -> (Deadline, Option<CallOwner>) {
        let keep = req.keeps_attempts();
        let call = req.call_mut();
        let deadline = call.put_deadline(deadline);
        let owner = call
            .install_fresh_log()
            .map(|log| CallOwner::owning(log, metrics, keep));
        (deadline, owner)
    }
}
