//! The per-call carrier: what one logical call carries between the layers.
//!
//! A [`Call`] holds the call's [`Deadline`], the [`Link`] being tried, the
//! number of the attempt a request copy is for, and the shared
//! [`AttemptLog`]. Every request type reaches it through one trait,
//! [`LlmRequest`]:
//!
//! - [`ChatRequest`] and [`EmbeddingRequest`] carry it as a field (`call`),
//!   so a copy of the request clones a few reference counts and nothing
//!   else (their prompt is shared too);
//! - [`http::Request`] carries it in one slot of its [`http::Extensions`].
//!
//! The cross-layer contract is written on [`Call`].
//!
//! [`ChatRequest`]: crate::ChatRequest
//! [`EmbeddingRequest`]: crate::EmbeddingRequest
//! [`CallOwner::install`]: crate::CallOwner::install

use std::sync::Arc;
use std::time::Duration;

use http::{Extensions, HeaderMap};

use crate::telemetry::{CallOwner, Metrics};
use crate::{AttemptLog, ChatRequest, Deadline, EmbeddingRequest, Link, NotReplayable};

/// Everything one logical call carries between the layers: the deadline,
/// the link being tried, the attempt number and the shared attempt log.
/// Cloning it clones reference counts only.
///
/// Every request type reaches it through one trait, [`LlmRequest`]:
/// [`ChatRequest`] and [`EmbeddingRequest`] carry it as a field (`call`),
/// so a copy of the request clones a few reference counts and nothing
/// else (their prompt is shared too); [`http::Request`] carries it in one
/// slot of its [`http::Extensions`].
///
/// # The cross-layer contract
///
/// The layers never talk to each other except through the carrier, by
/// these rules (each has a test in this crate or in its layer's crate):
///
/// 1. **One owner.** The outermost tower-llm layer that finds no attempt
///    log installs one ([`CallOwner::install`]) and is the call's owner:
///    it attaches the records to the response or the error when the call
///    ends and records the once-per-call metrics. Every other layer only
///    appends.
/// 2. **One deadline.** The deadline layer stores its deadline
///    ([`Deadline::store`]); an earlier deadline already there stays in
///    force. Everything inside reads it; nothing extends it.
/// 3. **Who is called.** The fallback layer stores the [`Link`] of the
///    link it tries before calling it ([`Link::store`]). Retry and breaker
///    read it for their records, metric labels and breaker keys.
/// 4. **Attempt numbers.** The retry layer sets the number of the attempt
///    a request copy is for ([`Call::set_attempt`]); it is 1 when unset.
/// 5. **Who writes a record.** The retry layer writes one record per
///    attempt, *before* it drops the attempt's inner future, so that the
///    breaker (inside it) can tell an attempt cut by the retry layer's
///    timeout (the record is there) from a call abandoned by the caller
///    (it is not). Without a retry layer, the breaker writes the record of
///    each attempt it admits or refuses. The layer that wrote a record
///    completes it with [`AttemptLog::complete`], which also names the
///    record's provider and model in an error that names none (a
///    [`Failure`](crate::Failure)'s origin is set nowhere else). The
///    fallback layer rewrites the `next` step of the previous link's last
///    record when it fails over.
/// 6. **Copies for later.** A layer that may send a request again (the
///    retry layer's next attempt, the fallback layer's next link) keeps a
///    [`Replay`] copy: the request without its carrier, and the carrier
///    beside it, put back when the copy is sent. A request that is not
///    [replayable](LlmRequest::is_replayable) is sent once.
/// 7. **Hedges.** A hedge layer sends a [`Replay`] copy marked
///    [`Call::set_hedge`] while the first attempt still runs; the records
///    of the hedge's attempts say [`hedge`](crate::AttemptRecord::hedge).
///    Records are completed by index, never as "the latest", since two
///    branches append concurrently. When one branch answers, the hedge
///    layer drops the other through [`AttemptLog::drop_hedge_loser`]: the
///    loser's layers see an ordinary cancellation, and its in-flight
///    records end as
///    [`CancelledByHedge`](crate::AttemptOutcome::CancelledByHedge), which
///    metrics and "the last attempt" of a call skip.
///
///
/// [`CallOwner::install`]: crate::CallOwner::install
///
/// ```
/// use std::time::Duration;
/// use tower_llm_core::{Call, ChatRequest, Deadline, Link, LlmRequest, Message};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let mut req = ChatRequest::new("gpt-4o-mini", vec![Message::user("hi")]);
/// assert!(req.call().is_none());
/// Deadline::after(Duration::from_secs(5)).store(&mut req);
/// Link::new("openai", "gpt-4o-mini").store(&mut req);
/// let call: &Call = req.call().expect("started");
/// assert_eq!(call.link().map(Link::provider), Some("openai"));
/// assert_eq!(call.attempt(), 1);
/// assert_eq!(Deadline::of(&req).map(Deadline::remaining), Some(Duration::from_secs(5)));
/// # }
/// ```
#[derive(Debug, Clone, Default)]
pub struct Call {
    deadline: Option<Deadline>,
    log: Option<AttemptLog>,
    link: Option<Link>,
    /// The number of the attempt this copy is for (0: unset, read as 1).
    attempt: u8,
    /// This copy is a hedge (rule 7).
    hedge: bool,
    /// The caller's idempotency key, if any.
    idempotency: Option<IdempotencyKey>,
}

/// The idempotency key of a call (the `Idempotency-Key` header's value, or
/// one set by the caller), read by an idempotency layer: a repeated call
/// with the same key gets the stored answer of the first. It travels in
/// the call's [`Call`], so every copy of the request (a retry, a hedge, a
/// failover) carries it.
///
/// ```
/// use std::time::Duration;
/// use tower_llm_core::{ChatRequest, IdempotencyKey, Message};
///
/// let mut req = ChatRequest::new("m", vec![Message::user("hi")]);
/// IdempotencyKey::new("order-42").with_ttl(Duration::from_secs(3600)).store(&mut req);
/// let key = IdempotencyKey::of(&req).unwrap();
/// assert_eq!((key.key(), key.ttl()), ("order-42", Some(Duration::from_secs(3600))));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey {
    key: Arc<str>,
    ttl: Option<Duration>,
}

impl IdempotencyKey {
    /// The key `key`, kept for the layer's default time.
    pub fn new(key: impl Into<Arc<str>>) -> Self {
        IdempotencyKey {
            key: key.into(),
            ttl: None,
        }
    }

    /// Keeps this call's answer for `ttl` instead of the layer's default.
    #[must_use]
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// The key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// How long to keep the answer, when the caller said.
    pub fn ttl(&self) -> Option<Duration> {
        self.ttl
    }

    /// The key `req` carries, if any.
    pub fn of<R: LlmRequest + ?Sized>(req: &R) -> Option<&IdempotencyKey> {
        req.call().and_then(|c| c.idempotency.as_ref())
    }

    /// Stores this key in `req`'s call.
    pub fn store<R: LlmRequest + ?Sized>(self, req: &mut R) {
        req.call_mut().idempotency = Some(self);
    }
}

impl Call {
    /// The call's deadline, if a deadline layer (or the caller) set one.
    pub fn deadline(&self) -> Option<Deadline> {
        self.deadline
    }

    /// The call's attempt log, once the call has an owner.
    pub fn log(&self) -> Option<&AttemptLog> {
        self.log.as_ref()
    }

    /// The link being tried, if a fallback layer (or the caller) stored one.
    pub fn link(&self) -> Option<&Link> {
        self.link.as_ref()
    }

    /// The number of the attempt this request copy is for (1 when unset).
    pub fn attempt(&self) -> u8 {
        self.attempt.max(1)
    }

    /// `true` when this request copy is a hedge: sent by a hedge layer while
    /// an earlier attempt of the call is still running (rule 7). Its
    /// attempt records say so ([`AttemptRecord::hedge`](crate::AttemptRecord::hedge)).
    pub fn is_hedge(&self) -> bool {
        self.hedge
    }

    /// Marks this request copy as a hedge (the hedge layer's rule 7).
    pub fn set_hedge(&mut self, hedge: bool) {
        self.hedge = hedge;
    }

    /// Sets the number of the attempt this request copy is for (the retry
    /// layer's rule 4).
    pub fn set_attempt(&mut self, attempt: u8) {
        self.attempt = attempt;
    }

    /// Stores `deadline`, keeping an earlier one already there; returns the
    /// deadline in force.
    pub fn store_deadline(&mut self, deadline: Deadline) -> Deadline {
        let in_force = match self.deadline {
            Some(existing) if existing < deadline => existing,
            _ => deadline,
        };
        self.deadline = Some(in_force);
        in_force
    }

    /// Stores the link being tried (replacing one stored before).
    pub fn set_link(&mut self, link: Link) {
        self.link = Some(link);
    }

    /// Installs a fresh attempt log unless the call has one. Returns the log
    /// if this call created it (the caller is then the call's owner), `None`
    /// if an outer layer owns the call.
    pub fn install_log(&mut self) -> Option<AttemptLog> {
        if self.log.is_some() {
            return None;
        }
        let log = AttemptLog::new();
        self.log = Some(log.clone());
        Some(log)
    }

    /// What the deadline layer does first: stores `deadline` (an earlier
    /// one already there stays in force) and takes ownership of the call
    /// when no outer tower-llm layer has. Returns the deadline in force and
    /// the ownership, if taken.
    pub fn begin<R: LlmRequest + ?Sized>(
        req: &mut R,
        deadline: Deadline,
        metrics: &Metrics,
    ) -> (Deadline, Option<CallOwner>) {
        let keep = req.keeps_attempts();
        let call = req.call_mut();
        let deadline = call.store_deadline(deadline);
        let owner = call
            .install_log()
            .map(|log| CallOwner::owning(log, metrics, keep));
        (deadline, owner)
    }
}

/// A request tower-llm's layers can work on: it carries a [`Call`].
///
/// Implemented for [`ChatRequest`] and [`EmbeddingRequest`] (a field) and
/// for [`http::Request`] (one slot of its [`Extensions`]).
/// Implement it for a request type of your own to put the layers in front
/// of a service that takes it.
///
/// ```
/// use tower_llm_core::{ChatRequest, Link, LlmRequest, Message};
///
/// fn tag<R: LlmRequest>(req: &mut R) {
///     Link::new("openai", "gpt-4o").store(req);
/// }
///
/// let mut chat = ChatRequest::new("gpt-4o-mini", vec![Message::user("hi")]);
/// tag(&mut chat);
/// assert!(chat.extensions.is_empty(), "a typed request needs no map");
/// let mut req = http::Request::new(());
/// tag(&mut req);
/// assert_eq!(req.extensions().len(), 1);
/// assert!(LlmRequest::headers(&req).is_some());
/// ```
pub trait LlmRequest {
    /// The call this request belongs to, if a layer (or the caller) started
    /// one.
    fn call(&self) -> Option<&Call>;

    /// The call, started empty if there is none yet.
    fn call_mut(&mut self) -> &mut Call;

    /// Takes the call out; the request then has none.
    fn take_call(&mut self) -> Option<Call>;

    /// The request's HTTP headers, for requests that have them (the
    /// deadline layer reads `grpc-timeout` and `x-request-timeout-ms`).
    fn headers(&self) -> Option<&HeaderMap> {
        None
    }

    /// `false` when the request must be sent at most once (marked
    /// [`NotReplayable`]): the retry layer then never retries it and the
    /// fallback layer never sends it to another link.
    fn is_replayable(&self) -> bool {
        true
    }

    /// `true` when the request asks for the call's attempt records on its
    /// answer even where that has a cost (an `http::Request` carrying
    /// [`KeepAttempts`](crate::KeepAttempts)); read by the call's owner.
    fn keeps_attempts(&self) -> bool {
        false
    }

    /// A copy of this request for a later attempt or link, *without* its
    /// call (see [`Replay`]). The default takes the call out for the moment
    /// of the clone.
    fn copy_without_call(&mut self) -> Self
    where
        Self: Clone + Sized,
    {
        let call = self.take_call();
        let copy = self.clone();
        if let Some(call) = call {
            *self.call_mut() = call;
        }
        copy
    }
}

/// The call in one slot of an [`Extensions`] map.
fn call_in(extensions: &Extensions) -> Option<&Call> {
    extensions.get::<Call>()
}

impl<B> LlmRequest for http::Request<B> {
    fn call(&self) -> Option<&Call> {
        call_in(self.extensions())
    }

    fn call_mut(&mut self) -> &mut Call {
        self.extensions_mut().get_or_insert_default::<Call>()
    }

    fn take_call(&mut self) -> Option<Call> {
        self.extensions_mut().remove::<Call>()
    }

    fn headers(&self) -> Option<&HeaderMap> {
        Some(http::Request::headers(self))
    }

    fn is_replayable(&self) -> bool {
        // Only the call in the map: nothing else to look up.
        let extensions = self.extensions();
        let ours = usize::from(call_in(extensions).is_some());
        extensions.len() <= ours || extensions.get::<NotReplayable>().is_none()
    }

    fn keeps_attempts(&self) -> bool {
        let extensions = self.extensions();
        let ours = usize::from(call_in(extensions).is_some());
        extensions.len() > ours && extensions.get::<crate::KeepAttempts>().is_some()
    }

    /// When the call is the request's only extension, the copy is made
    /// without the extension map at all (taken out for the moment of the
    /// clone): in `http` 1.x a map costs three allocations, and on the
    /// success path the copy is never sent.
    fn copy_without_call(&mut self) -> Self
    where
        Self: Clone,
    {
        let extensions = self.extensions_mut();
        if extensions.len() == 1 && call_in(extensions).is_some() {
            let map = std::mem::take(extensions);
            let copy = self.clone();
            *self.extensions_mut() = map;
            return copy;
        }
        let mut copy = self.clone();
        copy.take_call();
        copy
    }
}

/// `LlmRequest` for a typed request that carries its call in a `call`
/// field and its own values in an `extensions` map.
macro_rules! call_field {
    ($request:ty) => {
        impl LlmRequest for $request {
            fn call(&self) -> Option<&Call> {
                self.call.as_ref()
            }

            fn call_mut(&mut self) -> &mut Call {
                self.call.get_or_insert_default()
            }

            fn take_call(&mut self) -> Option<Call> {
                self.call.take()
            }

            fn is_replayable(&self) -> bool {
                self.extensions.is_empty() || self.extensions.get::<NotReplayable>().is_none()
            }
        }
    };
}

call_field!(ChatRequest);
call_field!(EmbeddingRequest);

/// A request copy kept to send later (the retry layer's next attempt, the
/// fallback layer's next link; rule 6 of the contract on [`Call`]): the
/// request without its carrier, and the carrier beside it, put back when
/// the copy is sent. On the success path the copy is never sent, so keeping
/// it costs the request's own clone (reference counts for a
/// [`ChatRequest`]) and nothing for the carrier.
#[derive(Debug)]
pub struct Replay<Req> {
    request: Req,
    call: Option<Call>,
}

impl<Req: LlmRequest + Clone> Replay<Req> {
    /// A copy of `req` for later.
    pub fn of(req: &mut Req) -> Self {
        Replay {
            call: req.call().cloned(),
            request: req.copy_without_call(),
        }
    }

    /// A request kept as it is, carrier included (a request that will be
    /// sent once more, not copied).
    pub fn whole(request: Req) -> Self {
        Replay {
            request,
            call: None,
        }
    }

    /// What the retry and fallback layers do first: take ownership of the
    /// call when no outer tower-llm layer has, then, when `copy`, keep a
    /// copy of `req` unless it is not [replayable](LlmRequest::is_replayable).
    pub fn enter(
        req: &mut Req,
        metrics: &Metrics,
        copy: bool,
    ) -> (Option<CallOwner>, Option<Replay<Req>>) {
        let owner = CallOwner::install(req, metrics);
        let copy = (copy && req.is_replayable()).then(|| Replay::of(req));
        (owner, copy)
    }

    /// The carrier the copy will be sent with.
    pub fn call(&self) -> Option<&Call> {
        self.call.as_ref().or_else(|| self.request.call())
    }

    /// The carrier, to change before the copy is sent (the next attempt's
    /// number, say).
    pub fn call_mut(&mut self) -> &mut Call {
        match &mut self.call {
            Some(call) => call,
            None => self.request.call_mut(),
        }
    }

    /// Puts the carrier into the copy now (for code that must see the copy
    /// as it will be sent, such as a fallback link's admission rule).
    pub fn attach(&mut self) {
        if let Some(call) = self.call.take() {
            *self.request.call_mut() = call;
        }
    }

    /// The copy as it is: without its carrier until
    /// [`attach`](Self::attach)ed.
    pub fn request(&self) -> &Req {
        &self.request
    }

    /// The copy, with its carrier.
    pub fn into_request(self) -> Req {
        let mut request = self.request;
        if let Some(call) = self.call {
            *request.call_mut() = call;
        }
        request
    }

    /// A copy of the copy, with its carrier (`self` stays as it is).
    pub fn to_request(&self) -> Req {
        let mut request = self.request.clone();
        if let Some(call) = &self.call {
            *request.call_mut() = call.clone();
        }
        request
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{AttemptOutcome, AttemptRecord, Message};

    fn started<R: LlmRequest>(mut req: R) -> R {
        Deadline::after(Duration::from_secs(5)).store(&mut req);
        AttemptLog::install(&mut req).expect("owner");
        Link::new("openai", "gpt-4o").store(&mut req);
        req
    }

    #[tokio::test(start_paused = true)]
    async fn a_replay_copy_shares_the_log_and_carries_the_call_once_sent() {
        for_each(started(http::Request::new(())));
        for_each(started(ChatRequest::new("m", vec![Message::user("hi")])));

        fn for_each<R: LlmRequest + Clone>(mut req: R) {
            let copy = Replay::of(&mut req);
            assert!(req.call().is_some(), "the original keeps its call");
            let sent = copy.to_request();
            let (a, b) = (req.call().expect("call"), sent.call().expect("call"));
            assert_eq!(a.deadline(), b.deadline());
            assert_eq!(a.link(), b.link());
            a.log()
                .expect("log")
                .push(AttemptRecord::new(
                    &Link::new("openai", "gpt-4o"),
                    1,
                    AttemptOutcome::Succeeded,
                    Duration::ZERO,
                ))
                .expect("room");
            assert_eq!(b.log().expect("log").len(), 1, "one log, shared");
            assert!(copy.into_request().call().is_some());
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_http_copy_with_only_the_call_has_no_map() {
        let mut req = started(http::Request::new(()));
        let copy = Replay::of(&mut req);
        assert!(copy.request.extensions().is_empty());
        assert_eq!(req.extensions().len(), 1);
        #[derive(Clone, Debug, PartialEq)]
        struct Tenant(&'static str);
        req.extensions_mut().insert(Tenant("acme"));
        let copy = Replay::of(&mut req);
        assert_eq!(copy.request.extensions().get(), Some(&Tenant("acme")));
        assert!(copy.request.call().is_none());
        assert_eq!(copy.into_request().extensions().len(), 2);
    }

    #[test]
    fn a_typed_request_carries_its_call_without_a_map() {
        let mut req = ChatRequest::new("m", vec![Message::user("hi")]);
        Link::new("a", "b").store(&mut req);
        assert!(req.extensions.is_empty());
        assert_eq!(Link::of(&req).map(Link::provider), Some("a"));
    }

    #[test]
    fn not_replayable_is_found_beside_the_call() {
        let mut req = http::Request::new(());
        assert!(req.is_replayable());
        Link::new("a", "b").store(&mut req);
        assert!(req.is_replayable());
        req.extensions_mut().insert(NotReplayable);
        assert!(!req.is_replayable());
        let mut chat = ChatRequest::new("m", vec![]);
        assert!(chat.is_replayable());
        chat.extensions.insert(NotReplayable);
        assert!(!chat.is_replayable());
    }

    #[tokio::test(start_paused = true)]
    async fn entering_a_replaying_layer_and_beginning_a_call() {
        let metrics = Metrics::disabled();
        // Owned outside: no owner, a copy.
        let mut req = started(http::Request::new(()));
        let (owner, copy) = Replay::enter(&mut req, &metrics, true);
        assert!(owner.is_none());
        assert!(copy.expect("a copy").call().and_then(Call::log).is_some());
        // Marked not replayable: no copy.
        req.extensions_mut().insert(NotReplayable);
        let (_, copy) = Replay::enter(&mut req, &metrics, true);
        assert!(copy.is_none());
        // A fresh request: this layer owns the call.
        let mut fresh = ChatRequest::new("m", vec![]);
        let (owner, copy) = Replay::enter(&mut fresh, &metrics, true);
        assert!(owner.is_some());
        assert!(copy.expect("a copy").call().and_then(Call::log).is_some());
        // The deadline layer: an earlier deadline stays; the outer owner
        // keeps the call.
        let mut fresh = http::Request::new(());
        let soon = Deadline::after(Duration::from_secs(5));
        let (in_force, owner) = Call::begin(&mut fresh, soon, &metrics);
        assert_eq!(in_force, soon);
        assert!(owner.is_some());
        let later = Deadline::after(Duration::from_secs(9));
        let (in_force, owner) = Call::begin(&mut fresh, later, &metrics);
        assert_eq!(in_force, soon);
        assert!(owner.is_none());
    }
}
