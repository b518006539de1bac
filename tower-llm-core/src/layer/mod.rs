//! For authors of layers: how the tower-llm layers write the per-call
//! carrier ([`Call`]) and its attempt log, and the contract they follow.
//!
//! A program that *uses* the layers needs nothing from this module: it
//! builds requests, reads answers and failures, and reads the carrier
//! ([`Call`], [`Deadline::of`], [`Link::of`], [`AttemptLog::of`]) with the
//! items at the crate's root. This module is the other side, what a layer
//! (ours, or one of your own that joins a tower-llm stack) does to the
//! call, in the way `tracing_core::subscriber` is the side of `tracing`
//! that subscribers implement:
//!
//! - [`CallExt`]: writing the carrier (attempt number, hedge mark, link,
//!   deadline, taking ownership of a call);
//! - [`AttemptLogExt`]: writing the attempt log (begin, complete and mark
//!   records; the owner's take and attach), and [`AttemptRecordExt`]:
//!   the in-flight record of an attempt about to be sent;
//! - [`CallOwner`]: what the layer that owns a call holds until it ends;
//! - [`Replay`]: a request copy kept to send later;
//! - [`MetricsExt`] and [`FailureExt`]: recording a call's metrics, and
//!   marking the end of a fallback chain;
//! - [`Bounded`]: a future cut off at an instant, the timer of every
//!   tower-llm timeout; [`serde_millis`]: a config's `Duration` as whole
//!   milliseconds.
//!
//! The traits are sealed: implemented by this crate's types only, so
//! methods can be added to them without breaking anyone. Bring them into
//! scope with `use tower_llm_core::layer::{AttemptLogExt, CallExt};`.
//!
//! # The cross-layer contract
//!
//! The layers never talk to each other except through the carrier, by
//! these rules (each has a test in this crate or in its layer's crate):
//!
//! 1. **One owner.** The outermost tower-llm layer that finds no attempt
//!    log installs one ([`CallOwner::install`]) and is the call's owner:
//!    it attaches the records to the response or the error when the call
//!    ends and records the once-per-call metrics. Every other layer only
//!    appends.
//! 2. **One deadline.** The deadline layer stores its deadline
//!    ([`Deadline::store`]); an earlier deadline already there stays in
//!    force. Everything inside reads it; nothing extends it.
//! 3. **Who is called.** The fallback layer stores the [`Link`] of the
//!    link it tries before calling it ([`Link::store`]). Retry and breaker
//!    read it for their records, metric labels and breaker keys.
//! 4. **Attempt numbers.** The retry layer sets the number of the attempt
//!    a request copy is for ([`CallExt::set_attempt`]); it is 1 when unset.
//! 5. **Who writes a record.** The retry layer writes one record per
//!    attempt, *before* it drops the attempt's inner future, so that the
//!    breaker (inside it) can tell an attempt cut by the retry layer's
//!    timeout (the record is there) from a call abandoned by the caller
//!    (it is not). Without a retry layer, the breaker writes the record of
//!    each attempt it admits or refuses. The layer that wrote a record
//!    completes it with [`AttemptLogExt::complete`], which also names the
//!    record's provider and model in an error that names none (a
//!    [`Failure`]'s origin is set nowhere else). The fallback layer
//!    rewrites the `next` step of the previous link's last record when it
//!    fails over.
//! 6. **Copies for later.** A layer that may send a request again (the
//!    retry layer's next attempt, the fallback layer's next link) keeps a
//!    [`Replay`] copy: the request without its carrier, and the carrier
//!    beside it, put back when the copy is sent. A request that is not
//!    [replayable](crate::LlmRequest::is_replayable) is sent once.
//! 7. **Hedges.** A hedge layer sends a [`Replay`] copy marked
//!    [`CallExt::set_hedge`] while the first attempt still runs; the
//!    records of the hedge's attempts say
//!    [`hedge`](crate::AttemptRecord::hedge). Records are completed by
//!    index, never as "the latest", since two branches append
//!    concurrently. When one branch answers, the hedge layer drops the
//!    other through [`AttemptLogExt::drop_hedge_loser`]: the loser's
//!    layers see an ordinary cancellation, and its in-flight records end
//!    as [`CancelledByHedge`](crate::AttemptOutcome::CancelledByHedge),
//!    which metrics and "the last attempt" of a call skip.
//!
//! ```
//! use std::time::Duration;
//! use tower_llm_core::layer::{AttemptLogExt, AttemptRecordExt, CallExt};
//! use tower_llm_core::{AttemptLog, AttemptOutcome, AttemptRecord, ChatRequest, Link, LlmRequest};
//!
//! let mut req = ChatRequest::new("gpt-4o-mini", vec![]);
//! // Rule 1: the outermost layer owns the call; inner ones find a log.
//! let owned = AttemptLog::install(&mut req).expect("the first layer owns the log");
//! assert!(AttemptLog::install(&mut req).is_none());
//! // Rule 4: the retry layer numbers the copy it sends.
//! req.call_mut().set_attempt(2);
//! // Rule 5: the layer that sends the attempt writes its record.
//! let link = Link::new("openai", "gpt-4o-mini");
//! let log = AttemptLog::of(&req).expect("installed");
//! let index = log.begin(AttemptRecord::begun(req.call(), &link)).expect("room");
//! log.finish(index, |r| r.outcome = AttemptOutcome::Succeeded);
//! let records = owned.take();
//! assert_eq!((records[0].attempt, records[0].outcome), (2, AttemptOutcome::Succeeded));
//! ```
//!
//! [`Call`]: crate::Call
//! [`Deadline::of`]: crate::Deadline::of
//! [`Deadline::store`]: crate::Deadline::store
//! [`Link`]: crate::Link
//! [`Link::of`]: crate::Link::of
//! [`Link::store`]: crate::Link::store
//! [`AttemptLog::of`]: crate::AttemptLog::of
//! [`Failure`]: crate::Failure

mod bounded;
mod call;
mod log;
mod metrics;
mod owner;
mod replay;
mod sealed;
pub mod serde_millis;

pub use self::bounded::Bounded;
pub use self::call::CallExt;
pub use self::log::{AttemptLogExt, AttemptRecordExt};
pub use self::metrics::{FailureExt, MetricsExt};
pub use self::owner::CallOwner;
pub use self::replay::Replay;
